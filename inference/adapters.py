"""Model adapters: where a Hugging Face model keeps what our inference path needs.

The static decoder, the bench's FLOP/byte counts and `patch_model`'s model check reach a
model only through its adapter: embeddings, the per-layer modules (norms, the QKV
projection(s), the output projection, the MLP's in/gate/act/out), the final norm, the head,
and the KV layout (heads, KV heads, head dim). A new model family is a new adapter
registered in ADAPTERS (and, for `patch_model`, its module swaps in patch.py or a module of
its own, as patch_llama.py). GPT-2 and the Llama family (Llama, Qwen2, Mistral) have one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def _tp_size(model) -> int:
    """Ranks the model is sharded over (inference/tp.py); head counts, MLP width and the head's
    vocabulary are per rank below, the hidden size and the full vocabulary are not."""
    return getattr(getattr(model, "cute_tp", None), "size", 1)


@dataclass(frozen=True)
class Layer:
    """One transformer block as the decoder runs it: h += out_proj(attn(qkv(attn_norm(h))));
    h += mlp_out(mlp_act(mlp_in(mlp_norm(h)))), or with a gate (SwiGLU),
    h += mlp_out(mlp_act(mlp_gate(x)) * mlp_in(x)) with x = mlp_norm(h).

    The projection to q, k and v is either one module (`qkv`, GPT-2's c_attn) or three
    (`q_proj`, `k_proj`, `v_proj`, with `qkv` None): `qkv_projections` gives whichever
    the model has, so code that needs the fused layout can test for it."""

    attn_norm: nn.Module
    qkv: nn.Module | None  # one projection to [q | k | v], heads contiguous in each; None: separate
    out_proj: nn.Module
    mlp_norm: nn.Module
    mlp_in: nn.Module  # GPT-2's c_fc; the "up" projection of a gated MLP
    mlp_act: nn.Module  # Identity where patch_model fused the activation into mlp_in
    mlp_out: nn.Module
    attn_scale: float
    q_proj: nn.Module | None = None
    k_proj: nn.Module | None = None
    v_proj: nn.Module | None = None
    mlp_gate: nn.Module | None = None  # the gated MLP's gate projection (mlp_act applies to it)

    @property
    def qkv_projections(self) -> tuple[nn.Module, ...]:
        """(qkv,) for a fused projection, (q_proj, k_proj, v_proj) otherwise."""
        return (self.qkv,) if self.qkv is not None else (self.q_proj, self.k_proj, self.v_proj)


class GPT2Adapter:
    """GPT2LMHeadModel: learned absolute positions, LayerNorm, fused c_attn, MHA."""

    model_type = "gpt2"
    static_decode = True  # StaticDecoder's step (fused c_attn, LayerNorm, learned positions) fits

    def __init__(self, model):
        cfg = model.config
        if getattr(cfg, "add_cross_attention", False):
            raise ValueError("only decoder-only GPT-2 is supported (no cross-attention)")
        self.model, self.body = model, model.transformer
        self.tp = _tp_size(model)
        self.n_layers, self.hidden = cfg.n_layer, cfg.n_embd
        self.n_heads = self.n_kv_heads = cfg.n_head // self.tp
        self.head_dim = cfg.n_embd // cfg.n_head
        self.mlp_hidden = (cfg.n_inner or 4 * cfg.n_embd) // self.tp
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
        """Weights that take part in matmuls per token (on this rank): qkv, out, mlp in/out per
        layer, and the head."""
        e, q = self.hidden, self.n_heads * self.head_dim
        kv = 2 * self.n_kv_heads * self.head_dim
        return self.n_layers * (e * (q + kv) + q * e + 2 * e * self.mlp_hidden) + self.head_vocab * e

    @property
    def head_vocab(self) -> int:
        """The lm_head's rows on this rank (the whole vocabulary without tensor parallelism)."""
        return -(-self.vocab // self.tp)


class LlamaAdapter:
    """LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM: RoPE (no learned positions),
    RMSNorm, separate q/k/v projections (Qwen2: with bias), GQA, SwiGLU MLP, a head that may
    be tied to the token embedding."""

    model_types = ("llama", "qwen2", "mistral")
    # StaticDecoder's step is GPT-2's; these models decode with decode_llama.LlamaStaticDecoder.
    static_decode = False

    def __init__(self, model):
        cfg = model.config
        self.model, self.body = model, model.model
        self.model_type = cfg.model_type
        self.tp = _tp_size(model)
        self.n_layers, self.hidden = cfg.num_hidden_layers, cfg.hidden_size
        n_heads = cfg.num_attention_heads
        self.n_heads = n_heads // self.tp
        self.n_kv_heads = (getattr(cfg, "num_key_value_heads", None) or n_heads) // self.tp
        # The attention module's own value: Qwen2Config has no head_dim field, the others default it.
        self.head_dim = self.body.layers[0].self_attn.head_dim if self.n_layers else cfg.hidden_size // n_heads
        self.mlp_hidden = cfg.intermediate_size // self.tp
        self.vocab, self.max_positions = cfg.vocab_size, cfg.max_position_embeddings

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.body.embed_tokens

    @property
    def position_embedding(self) -> None:
        return None  # RoPE: positions enter in the attention, not the embedding

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.body.embed_tokens(tokens)

    @property
    def tied_head(self) -> bool:
        return self.model.lm_head.weight is self.body.embed_tokens.weight

    def layers(self) -> list[Layer]:
        """Looked up on every call: patch_model swaps modules in place."""
        out = []
        for b in self.body.layers:
            a, m = b.self_attn, b.mlp
            out.append(Layer(b.input_layernorm, None, a.o_proj, b.post_attention_layernorm, m.up_proj, m.act_fn,
                             m.down_proj, float(a.scaling), q_proj=a.q_proj, k_proj=a.k_proj, v_proj=a.v_proj,
                             mlp_gate=m.gate_proj))
        return out

    @property
    def final_norm(self) -> nn.Module:
        return self.body.norm

    @property
    def lm_head(self) -> nn.Module:
        return self.model.lm_head

    def matmul_params(self) -> int:
        """Weights that take part in matmuls per token: q, k, v (k and v at the KV heads' width),
        o, gate, up, down per layer, and the head. The head counts whether or not it is tied:
        the embedding is a row lookup, the head a GEMM over all of it."""
        e, q = self.hidden, self.n_heads * self.head_dim
        kv = 2 * self.n_kv_heads * self.head_dim
        return self.n_layers * (e * (q + kv) + q * e + 3 * e * self.mlp_hidden) + self.head_vocab * e

    head_vocab = GPT2Adapter.head_vocab


ADAPTERS = {"gpt2": GPT2Adapter, **{t: LlamaAdapter for t in LlamaAdapter.model_types}}


def adapter_for(model):
    """The adapter for a Hugging Face causal LM; ValueError naming the supported types otherwise."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    cls = ADAPTERS.get(model_type)
    if cls is None:
        raise ValueError(f"no model adapter for model_type={model_type!r}; supported: {', '.join(ADAPTERS)}")
    return cls(model)
