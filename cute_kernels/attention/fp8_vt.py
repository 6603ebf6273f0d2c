"""V^T for the FP8 prefill kernel: [B, Sk, Hkv, D] e4m3 -> [B, Hkv, D, Sk'] with the keys of
each 32-block permuted (the order the e4m3 P fragment holds them in, see
FlashAttnFwdSm90._p_fragment_view) and zeros in the padding to Sk' = 32 ceil(Sk / 32).

wgmma reads 8-bit B operands K-major only, so P V needs V with keys contiguous. torch's
permute + contiguous moves one byte per element through its generic strided copy; this
kernel reads whole D-byte rows and writes whole key runs, one pass at HBM speed. Why Triton:
a transpose is a few lines there, it takes any input strides without a compile per cache
key, launches on torch's stream, and its logic runs on a CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_S = 64  # keys per program: two 32-key permutation blocks


@triton.jit
def _vt_kernel(v_ptr, out_ptr, Sk, Hkv, stride_vb, stride_vs, stride_vh, stride_ob, stride_oh, stride_od,
               D: tl.constexpr, BLOCK_S: tl.constexpr):
    pid_s = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hkv
    h = bh % Hkv
    k = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)  # destination key slots
    r = k % 32
    src = (k - r) + 16 * (r // 16) + 8 * ((r % 4) // 2) + 2 * ((r % 16) // 4) + r % 2  # reference.FP8_KEY_PERM
    d = tl.arange(0, D)
    rows = tl.load(v_ptr + b * stride_vb + h * stride_vh + src[:, None] * stride_vs + d[None, :],
                   mask=(src < Sk)[:, None], other=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d[:, None] * stride_od + k[None, :], tl.trans(rows))


def vt_fp8(v: torch.Tensor) -> torch.Tensor:
    """V [B, Sk, Hkv, D] (D contiguous) -> V^T [B, Hkv, D, 32 ceil(Sk / 32)], same dtype."""
    B, Sk, Hkv, D = v.shape
    if v.stride(3) != 1:
        raise ValueError("v needs unit stride on D")
    sk_pad = -(-Sk // 32) * 32
    out = torch.empty((B, Hkv, D, -(-sk_pad // BLOCK_S) * BLOCK_S), dtype=v.dtype, device=v.device)[..., :sk_pad]
    if out.numel():
        vb, ob = v.view(torch.uint8), out.view(torch.uint8)
        grid = (triton.cdiv(sk_pad, BLOCK_S), B * Hkv)
        _vt_kernel[grid](vb, ob, Sk, Hkv, v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1),
                         out.stride(2), D=D, BLOCK_S=BLOCK_S)
    return out
