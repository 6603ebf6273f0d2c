"""A CUDA C++ GEMM ladder: each rung adds one optimisation to the one before.

- `naive`:   one thread per output, operands straight from global memory.
- `smem`:    32x32 shared-memory tiles, one output per thread.
- `regtile`: 128x128 block tile, 8x8 outputs per thread in registers, 128-bit loads.
- `wmma`:    tensor cores via nvcuda::wmma, 128x256 block tile, 3-stage cp.async ring of
             BK=64 K-tiles, double-buffered fragments.

All take bf16 row-major A [M, K] and B [K, N], accumulate in fp32 and return
bf16 (or fp32) C. The sources in csrc/ are compiled for sm_90a on first use with
torch.utils.cpp_extension.load (cached in the torch extensions directory; it
needs nvcc and ninja). The kernels never include torch headers, so they also
compile standalone (see tests/test_baselines_wmma.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

RUNGS = ("naive", "smem", "regtile", "wmma")

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("binding.cpp", "naive.cu", "smem.cu", "regtile.cu", "wmma.cu")
# No -std: torch picks the C++ standard its headers need (c++17 or c++20 by
# version); the kernels compile under either.
NVCC_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "-O3")

# (M, N, K) each dimension must be a multiple of, per rung (block tile / K step).
_MULTIPLE_OF = {"naive": (1, 1, 1), "smem": (1, 1, 1), "regtile": (128, 128, 16), "wmma": (128, 256, 64)}


@functools.lru_cache(maxsize=1)
def _extension():
    from torch.utils.cpp_extension import load

    return load(
        name="cute_kernels_wmma_ladder",
        sources=[str(CSRC / s) for s in SOURCES],
        extra_include_paths=[str(CSRC)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=list(NVCC_FLAGS),
        verbose=False,
    )


def build() -> None:
    """Compile (or load from the cache) the extension now, e.g. before timing."""
    _extension()


def gemm(a: torch.Tensor, b: torch.Tensor, *, rung: str = "wmma", out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """C = a @ b with one rung of the ladder. a [M, K], b [K, N]: contiguous bf16 CUDA tensors.

    out_dtype: torch.bfloat16 (default) or torch.float32.
    """
    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {RUNGS}, got {rung!r}")
    for t, n in ((a, "a"), (b, "b")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor, got {type(t).__name__}")
    for t, n in ((a, "a"), (b, "b")):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{n} must be bfloat16, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{n} must be 2-D, got shape {tuple(t.shape)}")
        if t.device.type != "cuda":
            raise ValueError(f"{n} is on {t.device}; the ladder runs on CUDA tensors")
        if not t.is_contiguous():
            raise ValueError(f"{n} must be row-major contiguous (strides {t.stride()}); call .contiguous() first")
        if t.data_ptr() % 16:
            raise ValueError(f"{n}'s data must be 16-byte aligned (vector loads)")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    N = b.shape[1]
    if max(M, N, K) >= 2**31:
        raise ValueError("dimensions must fit in int32")
    mm, mn, mk = _MULTIPLE_OF[rung]
    if M % mm or N % mn or K % mk:
        raise ValueError(
            f"rung {rung!r} needs M % {mm} == 0, N % {mn} == 0, K % {mk} == 0 (its tile); got M={M}, N={N}, K={K}"
        )
    out_dtype = out_dtype or torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")
    return _extension().gemm(a, b, rung, out_dtype == torch.float32)


__all__ = ["RUNGS", "gemm", "build", "SOURCES", "NVCC_FLAGS", "CSRC"]
