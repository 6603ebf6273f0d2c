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

STATUS: correct under the Triton interpreter (tests/test_gemm_host.py); not yet run on
a GPU, so `kernel_for` only routes to it when CUTE_KERNELS_GEMV=1.
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
    return os.environ.get(GEMV_ENV) == "1"


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
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    rmask = rows < M
    cmask = cols < N
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + ks) < K
        x = tl.load(x_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=kmask[:, None] & cmask[None, :], other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y = epilogue_math(acc, rows, cols, rmask, cmask, bias_ptr, res_ptr, bias_ptr, bias_ptr, alpha, beta, stride_rm,
                      ACT, HAS_BIAS, HAS_RES, 0, 0, USE_ALPHA, USE_BETA)
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def _block_n(N: int) -> int:
    # Enough programs to cover 132 SMs a few times over at GPT-2 widths (N = 1600: 100
    # programs of 16 rows), wider tiles once N alone gives thousands of programs.
    return 16 if N <= 16384 else 64


class GemvLaunch:
    """The skinny path with the compiled GEMM's call signature (see api.kernel_for)."""

    __slots__ = ("epi",)

    def __init__(self, epi):
        self.epi = epi

    def __call__(self, a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta):
        M, K = a.shape
        N = out.shape[1]
        assert M <= GEMV_MAX_M and out.stride(1) == 1 and (residual is None or residual.stride(1) == 1)
        block_n = _block_n(N)
        dummy = out
        _gemv_kernel[(triton.cdiv(N, block_n),)](
            a, b_nk, out,
            bias if bias is not None else dummy,
            residual if residual is not None else dummy,
            float(alpha), float(beta), M, N, K, a.stride(0), b_nk.stride(0), out.stride(0),
            residual.stride(0) if residual is not None else 0,
            ACT=_ACT_CODE[self.epi.activation], HAS_BIAS=bool(self.epi.bias), HAS_RES=bool(self.epi.residual),
            USE_ALPHA=bool(self.epi.alpha), USE_BETA=bool(self.epi.beta),
            BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=256, num_warps=4, num_stages=4,
        )
        return out
