"""PyTorch references for the GEMM ops (fp32 math; used by tests and as CPU fallbacks)."""

from __future__ import annotations

import math

import torch

ACTIVATIONS = (None, "none", "relu", "gelu", "gelu_tanh")


def apply_activation(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation in (None, "none"):
        return x
    if activation == "relu":
        return torch.relu(x)
    if activation == "gelu":
        return torch.nn.functional.gelu(x)
    if activation == "gelu_tanh":  # GPT-2's gelu_new
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def gemm_ref(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a @ b computed in fp32, returned in out_dtype (default a.dtype)."""
    return (a.float() @ b.float()).to(out_dtype or a.dtype)


def linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> torch.Tensor:
    """act(alpha * x @ weight.T + bias) + beta * residual, in fp32, returned in x.dtype."""
    y = alpha * (x.float() @ weight.float().t())
    if bias is not None:
        y = y + bias.float()
    y = apply_activation(y, activation)
    if residual is not None:
        y = y + beta * residual.float()
    return y.to(x.dtype)
