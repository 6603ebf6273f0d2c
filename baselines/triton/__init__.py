"""Autotuned Triton baselines (torch tensors in, torch tensors out).

Ops and the torch op whose semantics they follow:

- `gemm(a, b)`: `torch.mm` (bf16/fp16, fp32 accumulation, any strides).
- `linear(x, weight, bias, activation=, residual=, alpha=, beta=)`: `F.linear`
  with a fused epilogue `act(alpha * x @ W.T + bias) + beta * residual`.
- `scaled_mm(a, b, scale_a, scale_b)`: `torch._scaled_mm` (FP8 e4m3).
- `int8_mm(a, b[, scale_a, scale_b])`: `torch._int_mm`, optionally dequantized.
- `flash_attn(q, k, v, causal=)`: FlashAttention forward, [B, S, H, D] layout, GQA.

With TRITON_INTERPRET=1 set before this package is first imported the kernels run
in Triton's CPU interpreter (on CPU tensors), which is how the tests check them
on machines without a GPU.
"""

from .attention import flash_attn
from .gemm import gemm, int8_mm, linear, scaled_mm

__all__ = ["gemm", "linear", "scaled_mm", "int8_mm", "flash_attn"]
