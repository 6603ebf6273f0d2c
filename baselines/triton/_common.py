"""Pieces shared by the Triton kernels: interpreter switch, dot helper, checks."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Triton decides at decoration time whether @triton.jit builds GPU code or a CPU
# interpreter function, so the kernels follow whatever the environment said when
# this package was first imported.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")
_INTERPRET = tl.constexpr(INTERPRET)

from cute_kernels.activations import ACTIVATIONS  # noqa: E402  (the one list of epilogue activations)

# int32 offsets keep the address arithmetic cheap; larger tensors are rejected up front.
_MAX_OFFSET = 2**31 - 1


@triton.jit
def mma(a, b, acc=None, MAX_IMPRECISE: tl.constexpr = None):
    """tl.dot(a, b, acc) that also gives right answers in the CPU interpreter.

    The interpreter multiplies bfloat16 blocks as their raw uint16 bit patterns
    (Triton 3.x), so there, and only there, bf16 operands are widened to fp32
    first; fp32 products of bf16 values are exact, so the result is unchanged.
    """
    if _INTERPRET:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
        if b.dtype == tl.bfloat16:
            b = b.to(tl.float32)
    if acc is None:
        return tl.dot(a, b, max_num_imprecise_acc=MAX_IMPRECISE)
    else:
        # out_dtype spelled out: Triton 3.6 checks it against acc (int32 for int8)
        return tl.dot(a, b, acc, max_num_imprecise_acc=MAX_IMPRECISE, out_dtype=acc.dtype)


@triton.jit
def cast_to(x, dtype: tl.constexpr):
    """x.to(dtype), rounding to nearest-even in the CPU interpreter too.

    On the GPU fp32 -> bf16 is cvt.rn; the 3.x interpreter truncates instead,
    which would double the rounding error the tests compare against.
    """
    if _INTERPRET:
        if dtype == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """The epilogue activations, in fp32."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * (1 + tanh(u)) == sigmoid(2u): one exp instead of a tanh, and no
        # inf/inf for large |x|.
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x * tl.sigmoid(2.0 * u)
    return x


def check_tensor(t, name: str, *, ndim: int | None = None, dtypes=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {t.dtype}")
    if INTERPRET:
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}; with TRITON_INTERPRET=1 pass CPU tensors")
    elif t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}; these Triton kernels run on CUDA tensors")


def check_same_device(*named) -> None:
    devs = {(n, t.device) for n, t in named if t is not None}
    if len({d for _, d in devs}) > 1:
        raise ValueError("tensors are on different devices: " + ", ".join(f"{n}={d}" for n, d in sorted(devs, key=str)))


def check_offsets(t: torch.Tensor, name: str) -> None:
    """Reject tensors whose largest element offset does not fit in int32."""
    if t.numel() and sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) > _MAX_OFFSET:
        raise ValueError(f"{name} spans more than 2**31 elements; split the problem into smaller pieces")


def check_activation(activation) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation or "none"
