"""The epilogue activations, declared once: the ops accept these names, the CuTe DSL and
Triton kernels implement them (by name and by `code`), the references compute them here,
and `inference` maps transformers' activation names onto them (`hf_names`: functions that
are exactly the same math)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Activation:
    name: str
    code: int  # the Triton kernels' ACT constexpr
    hf_names: tuple[str, ...]  # transformers ACT2FN keys computing the same function


REGISTRY: dict[str, Activation] = {
    "none": Activation("none", 0, ()),
    "relu": Activation("relu", 1, ("relu",)),
    "gelu": Activation("gelu", 2, ("gelu",)),  # erf form
    "gelu_tanh": Activation("gelu_tanh", 3, ("gelu_new", "gelu_pytorch_tanh")),  # GPT-2's gelu_new
}
# What the ops accept as `activation` (None and "none" both mean no activation).
ACTIVATIONS = (None, *REGISTRY)
# transformers activation name -> ours, for the activations a GEMM epilogue can run exactly.
FROM_HF = {hf: a.name for a in REGISTRY.values() for hf in a.hf_names}


def code(name: str | None) -> int:
    return REGISTRY[name or "none"].code


def apply(x: torch.Tensor, name: str | None) -> torch.Tensor:
    """The reference math, in x's dtype (callers pass fp32)."""
    if name in (None, "none"):
        return x
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return torch.nn.functional.gelu(x)
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")
