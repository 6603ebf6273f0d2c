"""The one map between torch dtypes and CuTe DSL numeric types."""

from __future__ import annotations

import torch

# Names, not cutlass classes, so that importing this module does not import cutlass.
_TORCH_TO_CUTLASS_NAME = {
    torch.bfloat16: "BFloat16",
    torch.float16: "Float16",
    torch.float32: "Float32",
    torch.float8_e4m3fn: "Float8E4M3FN",
    torch.float8_e5m2: "Float8E5M2",
    torch.int8: "Int8",
    torch.uint8: "Uint8",
    torch.int32: "Int32",
    torch.int64: "Int64",
}

SIXTEEN_BIT = (torch.bfloat16, torch.float16)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def to_cutlass(dtype: torch.dtype):
    """torch dtype -> cutlass numeric class (e.g. torch.bfloat16 -> cutlass.BFloat16)."""
    import cutlass

    try:
        return getattr(cutlass, _TORCH_TO_CUTLASS_NAME[dtype])
    except KeyError:
        raise TypeError(f"no CuTe DSL type for torch dtype {dtype}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return _TORCH_TO_CUTLASS_NAME[dtype]


def elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def dlpack_view(t: torch.Tensor) -> torch.Tensor:
    """A view DLPack can carry: fp8 crosses as uint8 on torch builds that cannot export it.

    Kernels compiled against fp8 fake tensors declare the element type themselves, so
    the uint8 bytes are reinterpreted on the device side.
    """
    if t.dtype in FP8 and not _fp8_dlpack_ok():
        return t.view(torch.uint8)
    return t


_FP8_DLPACK: bool | None = None


def _fp8_dlpack_ok() -> bool:
    global _FP8_DLPACK
    if _FP8_DLPACK is None:
        try:
            torch.utils.dlpack.to_dlpack(torch.empty(1, dtype=torch.float8_e4m3fn))
            _FP8_DLPACK = True
        except Exception:
            _FP8_DLPACK = False
    return _FP8_DLPACK
