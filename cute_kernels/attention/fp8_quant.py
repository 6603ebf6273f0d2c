"""16-bit Q, K, V -> e4m3 with one scale per (batch, KV head): the inputs of flash_attn_fp8.

Two launches a tensor: the first reduces each (batch, KV head)'s largest magnitude into a
float32 [B, Hkv] buffer (atomic max over blocks of rows), the second scales each value so that
largest magnitude lands on e4m3's 448 and rounds it (round to nearest even). Each reads the
16-bit tensor once, the second writes one byte a value: the data moves as little as a
per-tensor-group scale allows, where the same math in torch ops (abs, amax, an fp32 copy, a
divide, a cast) moved several times as much (docs/attention.md). Triton for the same reasons
as fp8_vt.py: a few lines, any strides, torch's stream.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import E4M3_MAX

BLOCK_S = 32  # rows of one head per program
_TINY = torch.finfo(torch.float32).tiny  # the smallest descale: an all-zero group stays zero


@triton.jit
def _rows(x_ptr, S, H, stride_b, stride_s, stride_h, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """This program's BLOCK_S rows of one (batch, head) as fp32, with their indices."""
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    x = tl.load(x_ptr + b * stride_b + h * stride_h + s[:, None] * stride_s + d[None, :], mask=(s < S)[:, None],
                other=0.0)
    return x.to(tl.float32), b, h, s, d


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, S, H, REP, stride_b, stride_s, stride_h, D: tl.constexpr, BLOCK_S: tl.constexpr):
    x, b, h, s, d = _rows(x_ptr, S, H, stride_b, stride_s, stride_h, D, BLOCK_S)
    tl.atomic_max(amax_ptr + b * (H // REP) + h // REP, tl.max(tl.max(tl.abs(x), axis=1), axis=0))


@triton.jit
def _scale_kernel(x_ptr, out_ptr, amax_ptr, S, H, REP, stride_b, stride_s, stride_h, TINY: tl.constexpr,
                  FMAX: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    x, b, h, s, d = _rows(x_ptr, S, H, stride_b, stride_s, stride_h, D, BLOCK_S)
    descale = tl.maximum(tl.load(amax_ptr + b * (H // REP) + h // REP) / FMAX, TINY)
    y = tl.minimum(tl.maximum(x / descale, -FMAX), FMAX)
    tl.store(out_ptr + ((b * S + s[:, None]) * H + h) * D + d[None, :], y.to(tl.float8e4nv), mask=(s < S)[:, None])


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """16-bit q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] on a GPU, unit stride on D, D a power of two
    -> (q8, k8, v8, q_descale, k_descale, v_descale): e4m3 tensors, contiguous, and float32
    [B, Hkv] descales (reference.quantize_qkv_fp8_ref's values)."""
    B, Hkv = k.shape[0], k.shape[2]
    amax = torch.zeros((3, B, Hkv), dtype=torch.float32, device=q.device)
    outs = []
    for i, x in enumerate((q, k, v)):
        _, S, H, D = x.shape
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        if x.numel():
            grid = (triton.cdiv(S, BLOCK_S), B * H)
            args = (S, H, H // Hkv, x.stride(0), x.stride(1), x.stride(2))
            _amax_kernel[grid](x, amax[i], *args, D=D, BLOCK_S=BLOCK_S)
            _scale_kernel[grid](x, out, amax[i], *args, TINY=_TINY, FMAX=E4M3_MAX, D=D, BLOCK_S=BLOCK_S)
        outs.append(out)
    descale = (amax / E4M3_MAX).clamp_min(_TINY)
    return (*outs, descale[0], descale[1], descale[2])
