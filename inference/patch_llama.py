"""patch_model's module swaps for the Llama family: LlamaForCausalLM, Qwen2ForCausalLM and
MistralForCausalLM (bf16).

What changes, and why it is done this way:

- Every nn.Linear of the attention and the MLP, and lm_head, becomes a `CuteLinear` /
  `CuteLMHead` (a `__class__` swap, as for GPT-2's Conv1D). nn.Linear's weight is already
  the [N, K] operand: no re-layout. Qwen2's q/k/v biases go to the op as its bias; a tied
  lm_head keeps sharing the embedding's Parameter.
- The two residual adds run in the o_proj and down_proj epilogues. The decoder layer and
  its attention are class-swapped to subclasses whose eval-mode forward passes the residual
  down to those projections; training falls back to the stock forward. The attention
  subclass repeats the stock steps (projections, transformers' own RoPE, cache update,
  the AttentionInterface call) and ends in the fused o_proj, binding the stock arguments by
  name (`_stock_arguments`) so that the `past_key_values` -> `cache` rename between
  transformers releases does not matter.
- RMSNorm, RoPE and the SiLU gate stay transformers' modules and functions (the MLP module
  is not swapped; the layer calls its gate/up/act and the fused down_proj).
- Attention is patch.py's `register_attention`, whose mask function is transformers' sdpa
  mask: Mistral's sliding window and padding arrive as an explicit mask (SDPA for a prefill,
  our decode kernel with that mask as key mask for one token), and the mask is None only
  where plain causal attention is exact (the sequence fits the window). GQA: k and v reach
  the kernels with their own head count.
- Classes are swapped per instance only; nothing in transformers is replaced.
"""

from __future__ import annotations

from torch import nn
from transformers.models.llama import modeling_llama as _LLAMA
from transformers.models.mistral import modeling_mistral as _MISTRAL
from transformers.models.qwen2 import modeling_qwen2 as _QWEN2

from .modules import CuteLinear, CuteLMHead, _positional_names, _stock_arguments, apply_linear


class _CuteAttention:
    """Self-attention whose o_proj also adds the decoder layer's residual. Mixed in before the
    family's stock attention class; `_family` is its modeling module."""

    _family = _LLAMA
    _stock = _LLAMA.LlamaAttention

    def _interface_kwargs(self) -> dict:
        """What the stock forward passes the attention function beyond the layer's kwargs."""
        return {}

    def forward(self, hidden_states, *args, residual=None, **kwargs):
        if residual is None:  # not called by our decoder layer: the stock forward
            return super().forward(hidden_states, *args, **kwargs)
        fam = self._family
        a = _stock_arguments(self._stock.forward, args, kwargs)
        cache = a.pop("cache")
        attention_mask = a.pop("attention_mask", None)
        cos, sin = a.pop("position_embeddings")
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        q, k = fam.apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        attention = fam.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                              fam.eager_attention_forward)
        out, weights = attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling,
                                 **self._interface_kwargs(), **a)
        out = out.reshape(*hidden_states.shape[:-1], -1).contiguous()
        return apply_linear(self.o_proj, out, residual), weights


class _CuteDecoderLayer:
    """Decoder layer with both residual adds in the o_proj / down_proj epilogues (eval mode)."""

    _stock = _LLAMA.LlamaDecoderLayer

    def forward(self, hidden_states, *args, **kwargs):
        if self.training or not isinstance(self.self_attn, _CuteAttention):
            return super().forward(hidden_states, *args, **kwargs)
        a = _stock_arguments(self._stock.forward, args, kwargs)
        h, _ = self.self_attn(self.input_layernorm(hidden_states), residual=hidden_states, **a)
        mlp, x = self.mlp, self.post_attention_layernorm(h)
        # The stock MLP's forward, down_proj taking the residual.
        return apply_linear(mlp.down_proj, mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x), h)


class CuteLlamaAttention(_CuteAttention, _LLAMA.LlamaAttention):
    _family, _stock = _LLAMA, _LLAMA.LlamaAttention


class CuteLlamaDecoderLayer(_CuteDecoderLayer, _LLAMA.LlamaDecoderLayer):
    _stock = _LLAMA.LlamaDecoderLayer


class CuteQwen2Attention(_CuteAttention, _QWEN2.Qwen2Attention):
    _family, _stock = _QWEN2, _QWEN2.Qwen2Attention

    def _interface_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window}  # per layer type (None for full attention)


class CuteQwen2DecoderLayer(_CuteDecoderLayer, _QWEN2.Qwen2DecoderLayer):
    _stock = _QWEN2.Qwen2DecoderLayer


class CuteMistralAttention(_CuteAttention, _MISTRAL.MistralAttention):
    _family, _stock = _MISTRAL, _MISTRAL.MistralAttention

    def _interface_kwargs(self) -> dict:
        return {"sliding_window": getattr(self.config, "sliding_window", None)}


class CuteMistralDecoderLayer(_CuteDecoderLayer, _MISTRAL.MistralDecoderLayer):
    _stock = _MISTRAL.MistralDecoderLayer


SWAPS = {
    _LLAMA.LlamaAttention: CuteLlamaAttention,
    _LLAMA.LlamaDecoderLayer: CuteLlamaDecoderLayer,
    _QWEN2.Qwen2Attention: CuteQwen2Attention,
    _QWEN2.Qwen2DecoderLayer: CuteQwen2DecoderLayer,
    _MISTRAL.MistralAttention: CuteMistralAttention,
    _MISTRAL.MistralDecoderLayer: CuteMistralDecoderLayer,
}
_MLPS = (_LLAMA.LlamaMLP, _QWEN2.Qwen2MLP, _MISTRAL.MistralMLP)


def patch_llama_modules(model, *, backend: str) -> None:
    """The module swaps (see the module docstring); patch_model validates and sets attention."""
    for module in list(model.modules()):
        cls = SWAPS.get(type(module))
        if cls is not None:
            module.__class__ = cls
        if isinstance(module, (*SWAPS, *_MLPS)):
            for child in module.children():
                if type(child) is nn.Linear:
                    CuteLinear.adopt(child, backend=backend)
    head = getattr(model, "lm_head", None)
    if type(head) in (nn.Linear, CuteLinear):
        CuteLMHead.adopt(head, backend=backend)
    for stock in {cls._stock.forward for cls in SWAPS.values()}:
        _positional_names(stock)  # resolve the signatures outside any Dynamo trace
