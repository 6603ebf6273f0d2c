"""PyTorch references for the GEMM ops (fp32 math; used by tests and as CPU fallbacks)."""

from __future__ import annotations

import torch

from ..activations import ACTIVATIONS  # noqa: F401  (public here)
from ..activations import apply as apply_activation  # noqa: F401


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
