"""Skinny GEMM for decode (M <= GEMV_MAX_M rows): out = epilogue(x @ w.T), weight-bandwidth bound.

At M = 1..8 the product reads N*K weights once and does almost no math, so what matters
is how many bytes per second reach the SMs. The persistent wgmma GEMM spends most of a
decode call on per-tile latency (pipeline fill, 64-row MMA tiles that are 1/64 used,
the epilogue's smem round trip): on the H100 it runs 1x1600x1600 in 7.3 us against
cuBLAS's 6.1 us, both far from the 1.5 us that 5 MB at 3.35 TB/s allows.

This kernel is the plain streaming shape instead: one program per BLOCK_N weight rows,
a loop over K that loads [BLOCK_K, BLOCK_N] weight tiles (each row's K run is
contiguous: full 128-byte lines), the M <= 16 activation rows padded to one tl.dot
operand, fp32 accumulation, and the same fused epilogue as the GEMM (splitk.epilogue_math).
Why Triton: see splitk.py (bandwidth-bound, any stride, CUDA-graph capturable, and its
logic runs on a CPU under TRITON_INTERPRET=1 for tests).

On the H100 (2026-11-22) it is correct (tests/test_gemm.py -k gemv) and runs GPT-2 XL's
decode linears at 0.94-1.03x cuBLAS and the 1x50257x1600 lm_head at 1.6x, where the wgmma
path ran 0.75-0.92x; so `kernel_for` routes every eligible M <= 8 product here.
CUTE_KERNELS_GEMV=0 turns it off (the wgmma path, for comparison).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .splitk import _ACT_CODE, epilogue_math

GEMV_ENV = "CUTE_KERNELS_GEMV"
GEMV_MAX_M = 8


def gemv_enabled() -> bool:
    return os.environ.get(GEMV_ENV, "1") != "0"


def gemv_applies(a: torch.Tensor, b_nk: torch.Tensor, out_dtype, epi) -> bool:
    """Whether a (M, K) x (N, K)^T product with this epilogue takes the skinny path."""
    return (
        gemv_enabled()
        and a.shape[0] <= GEMV_MAX_M
        and a.element_size() == 2
        and out_dtype in (torch.bfloat16, torch.float16, torch.float32)
        and (a.stride(1) == 1 or a.shape[1] == 1)
        and (b_nk.stride(1) == 1 or b_nk.shape[1] == 1)
        and epi.row_scale == "none"
        and epi.col_scale == "none"
    )


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, res_ptr, alpha, beta,
    M, N, K, stride_xm, stride_wn, stride_om, stride_rm,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, USE_ALPHA: tl.constexpr,
    USE_BETA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ln_w_ptr=None, ln_b_ptr=None, eps=1e-5, LN: tl.constexpr = False, K_PAD: tl.constexpr = 16,
    col_scale_ptr=None, xs_ptr=None, COL_SCALE: tl.constexpr = 0, XSCALE: tl.constexpr = False,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    rmask = rows < M
    cmask = cols < N
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]  # [BLOCK_K, BLOCK_N]
    if LN:
        # LayerNorm prologue: every program recomputes its rows' mean and rstd (a row is a
        # few KB, read from L2), cheaper than a separate LayerNorm launch per layer. Each row
        # is loaded whole (K_PAD = next power of two >= K) so the statistics cost one memory
        # round trip per row, not one per K step; two passes over the registers, since
        # GPT-2's residual stream has large means.
        kk = tl.arange(0, K_PAD)
        kkmask = kk < K
        mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
        rstd = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for m in range(0, M):
            xr = tl.load(x_ptr + m * stride_xm + kk, mask=kkmask, other=0.0).to(tl.float32)
            mu = tl.sum(xr, 0) / K
            d = tl.where(kkmask, xr - mu, 0.0)
            r = 1.0 / tl.sqrt(tl.sum(d * d, 0) / K + eps)
            mean = tl.where(rows == m, mu, mean)
            rstd = tl.where(rows == m, r, rstd)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BLOCK_M == 1:
        # One row: FMAs into a [BLOCK_K, BLOCK_N] fp32 tile, reduced over K once at the end.
        # tl.dot would pad the row to 16 and needs BLOCK_N >= 16; this allows narrower tiles
        # and so more programs when N is small.
        acc2 = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + ks) < K
        x = tl.load(x_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
        if LN:
            g = tl.load(ln_w_ptr + k0 + ks, mask=kmask, other=0.0).to(tl.float32)
            bb = tl.load(ln_b_ptr + k0 + ks, mask=kmask, other=0.0).to(tl.float32)
            xn = (x.to(tl.float32) - mean[:, None]) * rstd[:, None] * g[None, :] + bb[None, :]
            # Padding columns must stay 0 (they meet masked-to-0 weights, but 0 * NaN = NaN).
            x = tl.where(kmask[None, :], xn, 0.0).to(x_ptr.dtype.element_ty)
        if XSCALE:  # SmoothQuant: the activation side of the smoothing (x / s), per K column
            xs = tl.load(xs_ptr + k0 + ks, mask=kmask, other=0.0)
            x = (x.to(tl.float32) * xs[None, :]).to(x_ptr.dtype.element_ty)
        w = tl.load(w_ptrs, mask=kmask[:, None] & cmask[None, :], other=0.0)
        # 8-bit weights (weight-only decode path) widen to the activation dtype here; the
        # per-channel scale is applied to the fp32 sums in the epilogue.
        if BLOCK_M == 1:
            acc2 += tl.trans(x.to(tl.float32)) * w.to(tl.float32)
        else:
            acc = tl.dot(x, w.to(x_ptr.dtype.element_ty), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if BLOCK_M == 1:
        acc = tl.sum(acc2, 0)[None, :]
    y = epilogue_math(acc, rows, cols, rmask, cmask, bias_ptr, res_ptr, bias_ptr, col_scale_ptr, alpha, beta,
                      stride_rm, ACT, HAS_BIAS, HAS_RES, 0, COL_SCALE, USE_ALPHA, USE_BETA)
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


# M = 1 with N up to this takes the one-row FMA form (BLOCK_M = 1, BLOCK_N = 8): 4x the
# programs of the 16-wide tl.dot tiles at N = 1600. 0 turns it off.
ONE_ROW_MAX_N = 2048


def _launch_blocks(M: int, N: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for one launch."""
    if M == 1 and N <= ONE_ROW_MAX_N:
        return 1, 8, 512 if K >= 4096 else 256
    return (16, *_blocks(N, K))


def _blocks(N: int, K: int) -> tuple[int, int]:
    # From a 54-config sweep on the H100 at GPT-2 XL's decode shapes: narrow tiles while N
    # alone gives few programs (N = 1600: 100 programs of 16 rows), 64 rows beyond; long K
    # rows stream in 512-element steps (8-bit weights: the same steps; at these sizes the
    # kernel is latency-bound, and 1-byte weights measured no faster than 2-byte ones.)
    return (16 if N <= 2048 else 64), (512 if K >= 4096 else 256)


class GemvLaunch:
    """The skinny path with the compiled GEMM's call signature (see api.kernel_for)."""

    __slots__ = ("epi",)

    def __init__(self, epi):
        self.epi = epi

    def __call__(self, a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta):
        e = self.epi
        assert a.shape[0] <= GEMV_MAX_M and out.stride(1) == 1 and (residual is None or residual.stride(1) == 1)
        return skinny_gemm(a, b_nk, bias if e.bias else None, e.activation, residual if e.residual else None,
                           out=out, alpha=alpha if e.alpha else 1.0, beta=beta if e.beta else 1.0)


LN_MAX_K = 8192  # the LayerNorm prologue holds a whole row in registers (K_PAD / 128 fp32 per thread)


def skinny_gemm(x, w_nk, bias=None, activation=None, residual=None, *, out=None, alpha=1.0, beta=1.0, ln=None,
                w_scale=None, x_scale=None):
    """One launch of the skinny kernel for x [M <= GEMV_MAX_M, K] (unit stride on K):

        act(alpha * ((LN(x) if ln else x) * x_scale) @ (w_nk * w_scale).T + bias) + beta * residual

    into `out` (allocated when None; its rows must be dense).
    ln = (weight, bias, eps) runs LayerNorm as the prologue (K <= LN_MAX_K). w_nk is 16-bit
    like x, or fp8/int8 with w_scale [N] fp32 per output channel (weight-only decode: the
    activations stay unquantized, more accurate than W8A8 and one quantize launch fewer; it
    reads half the weight bytes, though at GPT-2 XL's decode sizes the kernel is bound by
    latency, not bytes, and measured as fast as with bf16 weights, no faster). x_scale [K]
    fp32 is SmoothQuant's activation factor.
    """
    M, K = x.shape
    N = w_nk.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = _launch_blocks(M, N, K)
    ln_w, ln_b, eps = ln if ln is not None else (None, None, 1e-5)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, w_nk, out, bias if bias is not None else out, residual if residual is not None else out,
        float(alpha), float(beta), M, N, K, x.stride(0), w_nk.stride(0), out.stride(0),
        residual.stride(0) if residual is not None else 0,
        ACT=_ACT_CODE[activation or "none"], HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        USE_ALPHA=alpha != 1.0, USE_BETA=residual is not None and beta != 1.0,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        ln_w_ptr=ln_w, ln_b_ptr=ln_b, eps=float(eps), LN=ln is not None,
        K_PAD=triton.next_power_of_2(K) if ln is not None else 16,
        col_scale_ptr=w_scale, xs_ptr=x_scale, COL_SCALE=2 if w_scale is not None else 0, XSCALE=x_scale is not None,
        num_warps=4, num_stages=4,
    )
    return out


def layernorm_gemv(x, ln_weight, ln_bias, eps: float, w_nk, bias, activation):
    """out = act(LayerNorm(x) @ w_nk.T + bias) for x [M <= GEMV_MAX_M, K <= LN_MAX_K], one launch."""
    return skinny_gemm(x, w_nk, bias, activation, ln=(ln_weight, ln_bias, eps))


def weight_only_gemv(x, w_q, w_scale, bias=None, activation=None, residual=None, x_scale=None):
    """Decode with 8-bit weights and 16-bit activations (see skinny_gemm)."""
    return skinny_gemm(x, w_q, bias, activation, residual, w_scale=w_scale, x_scale=x_scale)
