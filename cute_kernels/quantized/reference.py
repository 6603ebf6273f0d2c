"""PyTorch references for the FP8/INT8 GEMM ops (exact or fp32 math)."""

from __future__ import annotations

import torch

from ..matmul.reference import apply_activation


def scaled_mm_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """act((a * scale_a) @ (b * scale_b) + bias) + residual, dequantized inputs in fp32.

    a [M, K] fp8, b [K, N] fp8, scale_a () or [M, 1], scale_b () or [1, N].
    """
    y = (a.float() * scale_a.float()) @ (b.float() * scale_b.float())
    if bias is not None:
        y = y + bias.float()
    y = apply_activation(y, activation)
    if residual is not None:
        y = y + residual.float()
    return y.to(out_dtype)


def scaled_mm_blockwise_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    block: int = 128,
) -> torch.Tensor:
    """a [M, K] with scale_a [M, ceil(K/128)]; b [N, K] with scale_b [ceil(N/128), ceil(K/128)]."""
    M, K = a.shape
    N = b.shape[0]
    sa = scale_a.float().repeat_interleave(block, dim=1)[:, :K]
    sb = scale_b.float().repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)[:N, :K]
    y = (a.float() * sa) @ (b.float() * sb).t()
    if bias is not None:
        y = y + bias.float()
    y = apply_activation(y, activation)
    if residual is not None:
        y = y + residual.float()
    return y.to(out_dtype)


def int8_mm_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Without scales: exact int32 a @ b (a [M, K] int8, b [K, N] int8), like torch._int_mm.

    With scales (scale_a [M, 1] or (), scale_b [1, N] or ()): act(the dequantized
    product + bias) + residual in out_dtype (default bfloat16).
    """
    acc = (a.double() @ b.double())  # exact: |sum| < 2^53 for any realistic K
    if scale_a is None and scale_b is None and bias is None and not activation and residual is None:
        return acc.to(torch.int32)
    y = acc.float()
    if scale_a is not None:
        y = y * scale_a.float()
    if scale_b is not None:
        y = y * scale_b.float()
    if bias is not None:
        y = y + bias.float()
    y = apply_activation(y, activation)
    if residual is not None:
        y = y + residual.float()
    return y.to(out_dtype or torch.bfloat16)
