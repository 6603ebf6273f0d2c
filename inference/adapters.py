"""Model adapters: where a Hugging Face model keeps what our inference path needs.

The static decoder, the bench's FLOP/byte counts and `patch_model`'s model check reach a
model only through its adapter: embeddings, the per-layer modules (norms, the fused QKV
projection, the output projection, the MLP's in/act/out), the final norm, the head, and
the KV layout (heads, KV heads, head dim). A new model family is a new adapter registered
in ADAPTERS (and, for `patch_model`, its module swaps in patch.py). GPT-2 is the first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Layer:
    """One transformer block as the decoder runs it: h += out_proj(attn(qkv(attn_norm(h))));
    h += mlp_out(mlp_act(mlp_in(mlp_norm(h))))."""

    attn_norm: nn.Module
    qkv: nn.Module  # one projection to [q | k | v], heads contiguous in each
    out_proj: nn.Module
    mlp_norm: nn.Module
    mlp_in: nn.Module
    mlp_act: nn.Module  # Identity where patch_model fused the activation into mlp_in
    mlp_out: nn.Module
    attn_scale: float


class GPT2Adapter:
    """GPT2LMHeadModel: learned absolute positions, LayerNorm, fused c_attn, MHA."""

    model_type = "gpt2"

    def __init__(self, model):
        cfg = model.config
        if getattr(cfg, "add_cross_attention", False):
            raise ValueError("only decoder-only GPT-2 is supported (no cross-attention)")
        self.model, self.body = model, model.transformer
        self.n_layers, self.hidden = cfg.n_layer, cfg.n_embd
        self.n_heads = self.n_kv_heads = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.mlp_hidden = cfg.n_inner or 4 * cfg.n_embd
        self.vocab, self.max_positions = cfg.vocab_size, cfg.n_positions

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.body.wte

    @property
    def position_embedding(self) -> nn.Embedding:
        return self.body.wpe

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.body.wte(tokens) + self.body.wpe(positions)

    def layers(self) -> list[Layer]:
        """Looked up on every call: patch_model and quantize_model swap modules in place."""
        return [Layer(b.ln_1, b.attn.c_attn, b.attn.c_proj, b.ln_2, b.mlp.c_fc, b.mlp.act, b.mlp.c_proj,
                      float(b.attn.scaling)) for b in self.body.h]

    @property
    def final_norm(self) -> nn.Module:
        return self.body.ln_f

    @property
    def lm_head(self) -> nn.Module:
        return self.model.lm_head

    def matmul_params(self) -> int:
        """Weights that take part in matmuls per token: qkv, out, mlp in/out per layer, and the head."""
        e = self.hidden
        kv = 2 * self.n_kv_heads * self.head_dim
        return self.n_layers * (e * (e + kv) + e * e + 2 * e * self.mlp_hidden) + self.vocab * e


ADAPTERS = {"gpt2": GPT2Adapter}


def adapter_for(model):
    """The adapter for a Hugging Face causal LM; ValueError naming the supported types otherwise."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    cls = ADAPTERS.get(model_type)
    if cls is None:
        raise ValueError(f"no model adapter for model_type={model_type!r}; supported: {', '.join(ADAPTERS)}")
    return cls(model)
