"""cute-kernels: Hopper (sm_90a) kernels written in the CuTe DSL.

Public ops (torch tensors in, torch tensors out, launched on the current stream):

- `gemm(a, b)`, `linear(x, weight, bias, activation=..., residual=...)`: BF16/FP16 GEMM
  with a fused epilogue; `swiglu_linear(x, gate_up)`: silu(x gate^T) * (x up^T) as one GEMM
  whose epilogue writes only the product (Llama-family MLPs).
- `scaled_mm`, `scaled_mm_blockwise`, `int8_mm`: FP8 and INT8 GEMM with fused scaling.
- `flash_attn`, `flash_attn_with_kvcache`, `flash_attn_varlen`: FlashAttention forward;
  `flash_attn_fp8`: the same on FP8 (e4m3) Q, K, V with FlashAttention-3's descale arguments
  (`quantize_qkv_fp8` makes them from 16-bit Q, K, V).
- `tune(shapes, model=..., dtypes=..., ms=...)`: time GEMM configs on this GPU and keep the
  winners in the tuning cache, where every later GEMM of their class finds them
  (`python -m cute_kernels.tune` is its command line).

Every op has a PyTorch reference beside it (`*_ref`). Importing this package does
not import cutlass or touch the GPU; kernels compile on first use (and are cached).
"""

# isort: off
from .runtime import arch as _arch  # noqa: F401  (pins CUTE_DSL_ARCH=sm_90a before anything else)

# The 16-bit GEMM family lives in `matmul/` so that `cute_kernels.gemm` is the op and every
# family folder stays importable as a package (the api modules import torch only, not cutlass).
from .matmul.api import (
    ACTIVATIONS,
    gemm,
    gemm_ref,
    layernorm_linear,
    layernorm_linear_ref,
    linear,
    linear_ref,
    swiglu_linear,
    swiglu_linear_ref,
)
# isort: on

__version__ = "0.1.0"

_LAZY = {
    "scaled_mm": "cute_kernels.quantized.api",
    "scaled_mm_ref": "cute_kernels.quantized.api",
    "scaled_mm_blockwise": "cute_kernels.quantized.api",
    "scaled_mm_blockwise_ref": "cute_kernels.quantized.api",
    "int8_mm": "cute_kernels.quantized.api",
    "int8_mm_ref": "cute_kernels.quantized.api",
    "flash_attn": "cute_kernels.attention.api",
    "flash_attn_ref": "cute_kernels.attention.api",
    "flash_attn_fp8": "cute_kernels.attention.api",
    "flash_attn_fp8_ref": "cute_kernels.attention.api",
    "quantize_qkv_fp8": "cute_kernels.attention.api",
    "flash_attn_with_kvcache": "cute_kernels.attention.api",
    "flash_attn_varlen": "cute_kernels.attention.api",
}

__all__ = [
    "ACTIVATIONS", "gemm", "gemm_ref", "layernorm_linear", "layernorm_linear_ref", "linear", "linear_ref",
    "swiglu_linear", "swiglu_linear_ref", "tune",
    *_LAZY,
]


def __getattr__(name):
    import importlib

    if name == "tune":
        # The module is the command line and is callable as the function: importing it
        # binds it here, so `cute_kernels.tune` is that one object however it was reached.
        return importlib.import_module("cute_kernels.tune")
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'cute_kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
