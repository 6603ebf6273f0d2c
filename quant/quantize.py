"""Public quantize / dequantize entry points.

Activations (`quantize_fp8`, `quantize_int8`) are quantized on every forward, so
on CUDA they run the fused Triton kernel; on CPU (or when asked) they run the
PyTorch reference, which defines the numerics (see `_reference.py`). Weights are
quantized once, offline, so their helpers are plain PyTorch on any device.

Scale shapes (all float32):

=====================================  ===========================================
call                                   scale shape
=====================================  ===========================================
quantize_*(x, "tensor")                ()            one scale for the tensor
quantize_*(x, "row")                   [..., 1]      one per row (per token)
quantize_*(x, "block")                 [..., ceil(K/128)]  one per 1x128 group
quantize_weight(w, dt)                 [N, 1]        one per output channel
quantize_weight(w, dt, per_channel=0)  ()
quantize_weight_fp8_block(w)           [ceil(N/128), ceil(K/128)]  128x128 blocks
=====================================  ===========================================

x is [..., K] (quantized along the last dim), w is [N, K] (nn.Linear layout);
q always has the input's shape and is contiguous.
"""

from __future__ import annotations

import functools

import torch

from ._reference import (
    BLOCK,
    GRANULARITIES,
    dequantize_ref,
    qmax_of,
    quantize_ref,
    quantize_weight_block_ref,
)

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
BACKENDS = ("auto", "triton", "torch")
_FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)

__all__ = [
    "BLOCK",
    "FP8_DTYPES",
    "quantize",
    "quantize_fp8",
    "quantize_int8",
    "quantize_weight",
    "quantize_weight_fp8_block",
    "dequantize",
]


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _triton_supports(x: torch.Tensor, dtype: torch.dtype) -> bool:
    if x.device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    # Triton converts to fp8 in hardware from sm_89; older GPUs take the reference.
    return dtype == torch.int8 or _capability(x.device.index or 0) >= (8, 9)


def _check(x, dtype, granularity, multiplier, backend):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_INPUTS:
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have at least one dim and a non-empty last dim, got shape {tuple(x.shape)}")
    qmax_of(dtype)
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if multiplier is not None:
        if multiplier.shape != (x.shape[-1],):
            raise ValueError(
                f"multiplier must have shape [K] = [{x.shape[-1]}], got {tuple(multiplier.shape)}"
            )
        if multiplier.device != x.device:
            raise ValueError(f"multiplier is on {multiplier.device} but x is on {x.device}")


def quantize(
    x: torch.Tensor,
    dtype: torch.dtype,
    granularity: str = "row",
    *,
    multiplier: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [..., K] to fp8 or int8 with one fused amax/scale/cast pass.

    `multiplier` [K] (float32) multiplies the columns first (SmoothQuant's 1/s).
    backend: "auto" (Triton on CUDA, reference elsewhere), "triton" (force it; on
    CPU only under TRITON_INTERPRET=1), "torch" (the reference).
    """
    # A call signature validated once (dtypes, shape, strides, device, options) skips the
    # checks afterwards: they cost as much CPU as the launch itself.
    try:
        key = (x.dtype, x.shape, x.stride(), x.device, dtype, granularity, backend,
               None if multiplier is None else (multiplier.dtype, multiplier.shape, multiplier.device))
        use_triton = _CHECKED.get(key)
    except AttributeError:  # not tensors: _check raises the right error
        key, use_triton = None, None
    if use_triton is None:
        _check(x, dtype, granularity, multiplier, backend)
        use_triton = backend == "triton" or (backend == "auto" and _triton_supports(x, dtype))
        if key is not None:
            _CHECKED[key] = use_triton
    if use_triton:
        from ._triton import quantize_triton

        return quantize_triton(x, dtype, granularity, multiplier, _key=key)
    return quantize_ref(x, dtype, granularity, multiplier)


_CHECKED: dict = {}  # validated quantize() signature -> whether it runs the Triton kernel


def layernorm_quantize(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    dtype: torch.dtype,
    *,
    multiplier: torch.Tensor | None = None,
    backend: str = "auto",
    granularity: str = "row",
) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize(layer_norm(x, weight, bias, eps), dtype, granularity, multiplier=...) in one
    pass; granularity "row" (per token) or "block" (1 x 128 groups).

    x [M, K] (K <= 8192 on the Triton path), weight and bias [K]. The LayerNorm output
    is rounded to x.dtype before it is quantized, as the unfused pair would do, so
    the two paths differ only in the LayerNorm's own last-bit rounding.
    """
    _check(x, dtype, granularity, multiplier, backend)
    if granularity not in ("row", "block"):
        raise ValueError(f"layernorm_quantize: granularity must be 'row' or 'block', got {granularity!r}")
    if x.dim() != 2 or weight.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
        raise ValueError(f"x must be [M, K] with weight and bias [K]; got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(bias.shape)}")
    use_triton = backend == "triton" or (backend == "auto" and _triton_supports(x, dtype) and x.shape[1] <= 8192)
    if use_triton:
        from ._triton import layernorm_quantize_triton

        x = x if x.stride(1) == 1 else x.contiguous()
        return layernorm_quantize_triton(x, weight.contiguous(), bias.contiguous(), eps, dtype, multiplier,
                                         granularity=granularity)
    h = torch.nn.functional.layer_norm(x, (x.shape[1],), weight, bias, eps)
    return quantize_ref(h, dtype, granularity, multiplier)


def quantize_fp8(
    x: torch.Tensor,
    granularity: str = "row",
    dtype: torch.dtype = torch.float8_e4m3fn,
    *,
    multiplier: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q in e4m3fn (saturates at +-448) or e5m2 (+-57344)."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"quantize_fp8 dtype must be one of {FP8_DTYPES}, got {dtype}")
    return quantize(x, dtype, granularity, multiplier=multiplier, backend=backend)


def quantize_int8(
    x: torch.Tensor,
    granularity: str = "row",
    *,
    multiplier: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with symmetric int8 in [-127, 127], round half to even."""
    return quantize(x, torch.int8, granularity, multiplier=multiplier, backend=backend)


def _check_weight(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"weight must be a 2-D [N, K] tensor, got {getattr(w, 'shape', type(w))}")
    if not w.is_floating_point():
        raise ValueError(f"weight must be floating point, got {w.dtype}")


@torch.no_grad()
def quantize_weight(
    w: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn, per_channel: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (out, in) -> (q [N, K], scale [N, 1] per output channel, or () per tensor)."""
    _check_weight(w)
    return quantize_ref(w.detach(), dtype, "row" if per_channel else "tensor")


@torch.no_grad()
def quantize_weight_fp8_block(
    w: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K], scale [ceil(N/128), ceil(K/128)]) for 128x128 weight blocks."""
    _check_weight(w)
    if dtype not in FP8_DTYPES:
        raise ValueError(f"dtype must be one of {FP8_DTYPES}, got {dtype}")
    return quantize_weight_block_ref(w.detach(), dtype)


def dequantize(
    q: torch.Tensor,
    scale: torch.Tensor,
    granularity: str = "row",
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """q * scale in `out_dtype`. granularity: "tensor", "row" (also [N, 1] weight
    scales), "block" (1x128 groups) or "block2d" (128x128 weight blocks)."""
    return dequantize_ref(q, scale, granularity, out_dtype)
