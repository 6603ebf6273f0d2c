"""The linear layers of published models, as (N, K) GEMM shapes: what the autotuner tunes and
what the held-out grid benchmark draws from.

Sizes are those of each model's published Hugging Face config (hidden_size,
intermediate_size, num_attention_heads, num_key_value_heads, head_dim, vocab_size), so
no hub access or transformers import is needed. Projections are listed the way a serving
stack runs them: q, k and v as one fused [q | k | v] GEMM, and a gated MLP's gate and up
as one [gate | up] GEMM; GPT-2 fuses q, k and v itself (c_attn). The grid benchmark draws
from those (`linears`); the autotuner also tunes the separate q and k/v projections that
the Llama family's prefill runs (`tuned_linears`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Linear:
    """One linear layer: y [M, n] = x [M, k] @ W [n, k]^T, with the epilogue class that
    `inference.patch_model` fuses into it (tuning.cache.EPILOGUES)."""

    name: str
    n: int
    k: int
    epilogue: str = "plain"


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    gated: bool = True  # SwiGLU MLP (gate and up); False: GPT-2's fc -> gelu -> proj
    qkv_bias: bool = False

    def linears(self) -> tuple[Linear, ...]:
        h, inter = self.hidden, self.intermediate
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        if not self.gated:
            # GPT-2 as patch_model runs it: biases everywhere, the residual adds fused into
            # the output projections, the lm_head a plain GEMM.
            return (Linear("qkv", qkv, h, "vector"), Linear("o", h, self.heads * self.head_dim, "residual"),
                    Linear("up", inter, h, "vector"), Linear("down", h, inter, "residual"),
                    Linear("lm_head", self.vocab, h))
        # The Llama family as patch_model runs it: o_proj and down_proj add the decoder
        # layer's residual in their epilogues, [gate | up] has the SwiGLU epilogue
        # (matmul.swiglu_linear; the 8-bit linears tune it as a plain GEMM).
        return (Linear("qkv", qkv, h, "vector" if self.qkv_bias else "plain"),
                Linear("o", h, self.heads * self.head_dim, "residual"), Linear("gate_up", 2 * inter, h, "swiglu"),
                Linear("down", h, inter, "residual"), Linear("lm_head", self.vocab, h))

    def tuned_linears(self) -> tuple[Linear, ...]:
        """`linears()` plus the GEMMs the Llama family's prefill runs separately: its
        attention projects q, k and v one linear at a time (k and v share a shape)."""
        if not self.gated:
            return self.linears()
        extra = (Linear("q", self.heads * self.head_dim, self.hidden, "vector" if self.qkv_bias else "plain"),
                 Linear("kv", self.kv_heads * self.head_dim, self.hidden, "vector" if self.qkv_bias else "plain"))
        return self.linears() + extra


def _gpt2(hidden: int, heads: int) -> ModelShape:
    return ModelShape(hidden, 4 * hidden, heads, heads, hidden // heads, 50257, gated=False, qkv_bias=True)


MODELS: dict[str, ModelShape] = {
    "gpt2": _gpt2(768, 12),
    "gpt2-medium": _gpt2(1024, 16),
    "gpt2-large": _gpt2(1280, 20),
    "gpt2-xl": _gpt2(1600, 25),
    "llama-3.2-1b": ModelShape(2048, 8192, 32, 8, 64, 128256),
    "llama-3-8b": ModelShape(4096, 14336, 32, 8, 128, 128256),
    "llama-3-70b": ModelShape(8192, 28672, 64, 8, 128, 128256),
    "qwen2.5-7b": ModelShape(3584, 18944, 28, 4, 128, 152064, qkv_bias=True),
    "qwen2.5-32b": ModelShape(5120, 27648, 40, 8, 128, 152064, qkv_bias=True),
    "mistral-7b": ModelShape(4096, 14336, 32, 8, 128, 32000),  # Mistral-7B-v0.1
}


def model_name(name: str) -> str:
    """'openai-community/gpt2-xl', 'meta-llama/Llama-3-8B' or 'gpt2-xl' -> the table's name."""
    if not isinstance(name, str):
        raise TypeError(f"model must be a str, got {type(name).__name__}")
    base = name.rstrip("/").split("/")[-1].lower()
    aliases = {"meta-llama-3-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b", "mistral-7b-v0.1": "mistral-7b"}
    base = aliases.get(base, base)
    if base not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return base


def linears(name: str) -> tuple[Linear, ...]:
    """The linear layers of model `name` (a MODELS name, or a hub id ending in one)."""
    return MODELS[model_name(name)].linears()


def tuned_linears(name: str) -> tuple[Linear, ...]:
    """The GEMM shapes the autotuner tunes for model `name`: every linear as patch_model runs it."""
    return MODELS[model_name(name)].tuned_linears()
