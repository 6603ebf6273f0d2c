"""patch_model's module swaps for the Llama family: LlamaForCausalLM, Qwen2ForCausalLM and
MistralForCausalLM, at every precision patch_model takes.

What changes, and why it is done this way:

- Every nn.Linear of the attention and the MLP, and lm_head, becomes a `CuteLinear` /
  `CuteLMHead` (a `__class__` swap, as for GPT-2's Conv1D). nn.Linear's weight is already
  the [N, K] operand: no re-layout. Qwen2's q/k/v biases go to the op as its bias; a tied
  lm_head keeps sharing the embedding's Parameter. At 8-bit precisions patch_model has
  already swapped them for quant's FP8Linear / Int8Linear (lm_head excepted), which stay:
  they run our 8-bit GEMMs and add the residual in their epilogue too.
- The two residual adds run in the o_proj and down_proj epilogues. The decoder layer and
  its attention are class-swapped to subclasses whose eval-mode forward passes the residual
  down to those projections; training falls back to the stock forward. The attention
  subclass repeats the stock steps (projections, transformers' own RoPE, cache update,
  the AttentionInterface call) and ends in the fused o_proj, binding the stock arguments by
  name (`_stock_arguments`) so that the `past_key_values` -> `cache` rename between
  transformers releases does not matter.
- RMSNorm, RoPE and the SiLU gate stay transformers' modules and functions (the MLP module
  is not swapped; the layer calls its gate/up/act and the fused down_proj), unless the
  prefill switches say otherwise (read when patch_model runs; `set_prefill_fusions` flips
  them on a patched model):
  - CUTE_KERNELS_LLAMA_PREFILL_RMSNORM: the RMSNorm modules' eval-mode forward is
    ops.rms_norm (one launch instead of about five). Every RMSNorm is class-swapped to a
    subclass that checks the flag, so it stays a module with the stock weight and the stock
    forward as its super(), and a tensor-parallel mixin placed before it later
    (tp.SeqParallelNorm) wraps it whether the flag is on or off.
  - CUTE_KERNELS_LLAMA_PREFILL_ROPE: the attention's RoPE is ops.rope_prefill (one launch
    for q and k instead of about eight torch kernels).
  - CUTE_KERNELS_LLAMA_PREFILL_SWIGLU: gate and up become one GEMM over their weights
    concatenated (modules.concat_rows re-points the two Parameters at row blocks of one
    storage, as the decode step does) whose epilogue computes silu(gate) * up
    (ops.swiglu_linear: each tile multiplies matching gate and up rows, so the [M, 2I]
    projection is never written); "launch" writes the projection and runs silu * up as one
    more launch (ops.silu_mul), "split" keeps the two GEMMs before that launch.
  They reproduce transformers' bf16 roundings (the SwiGLU epilogue's silu uses approximate
  exp2 and reciprocal, which can move a rounding by one bf16 step now and then); they are
  separate switches so that each can be measured on its own.
- Attention is patch.py's `register_attention`, whose mask function is transformers' sdpa
  mask: Mistral's sliding window and padding arrive as an explicit mask (SDPA for a prefill,
  our decode kernel with that mask as key mask for one token), and the mask is None only
  where plain causal attention is exact (the sequence fits the window). GQA: k and v reach
  the kernels with their own head count.
- `set_tp_invariant` (patch_model's tp_invariant=) puts the patched model into TP-invariant
  arithmetic (inference/invariant.py): the projections sum K in fixed pieces, attention runs
  unsplit, the SwiGLU GEMM and sequence parallelism stay off.
- Classes are swapped per instance only; nothing in transformers is replaced.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama import modeling_llama as _LLAMA
from transformers.models.mistral import modeling_mistral as _MISTRAL
from transformers.models.qwen2 import modeling_qwen2 as _QWEN2

from cute_kernels.runtime import env

from . import ops
from .modules import (
    CuteLinear,
    CuteLMHead,
    OwnPositionsMixin,
    _positional_names,
    _stock_arguments,
    apply_linear,
    concat_rows,
)


class _CuteAttention:
    """Self-attention whose o_proj also adds the decoder layer's residual. Mixed in before the
    family's stock attention class; `_family` is its modeling module."""

    _family = _LLAMA
    _stock = _LLAMA.LlamaAttention
    fused_rope = False
    backend = "cute"  # of the fused ops (inference.ops); the projections keep their own

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
        if self.fused_rope and _fusable(q, self.backend) and cos.dtype == q.dtype:
            q, k = ops.rope_prefill(q, k, cos, sin, self.backend)
        else:
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
    fused_swiglu = False
    backend = "cute"  # of the fused ops (inference.ops)
    gate_up: tuple | None = None  # (weight, bias) over [gate; up] when the two run as one GEMM
    swiglu_epilogue = False  # silu(gate) * up in that GEMM's epilogue (ops.swiglu_linear)
    tp_invariant = False  # inference/invariant.py: gate and up as their own (invariant) projections

    def forward(self, hidden_states, *args, **kwargs):
        if self.training or not isinstance(self.self_attn, _CuteAttention):
            return super().forward(hidden_states, *args, **kwargs)
        a = _stock_arguments(self._stock.forward, args, kwargs)
        h, _ = self.self_attn(self.input_layernorm(hidden_states), residual=hidden_states, **a)
        return self.mlp_residual(self.post_attention_layernorm(h), h)

    def mlp_residual(self, x, residual):
        """down_proj(silu(gate_proj(x)) * up_proj(x)) + residual, the add in down_proj's
        epilogue: the stock MLP's forward, or its SwiGLU fusion where the switch is on
        (tp.SeqParallelDecoderLayer calls it too, with full rows x and local residual rows)."""
        mlp, h = self.mlp, residual
        if not (self.fused_swiglu and _fusable(x, self.backend)) or self.tp_invariant:
            return apply_linear(mlp.down_proj, mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x), h)
        gate = mlp.gate_proj
        if self.gate_up is not None and self.swiglu_epilogue:
            act = ops.swiglu_linear(x, self.gate_up[0], self.backend)
        elif self.gate_up is not None:
            n = gate.weight.shape[0]
            y = gate._run(x, *self.gate_up, None)
            act = ops.silu_mul(y[..., :n], y[..., n:], self.backend)
        else:  # two GEMMs (also 8-bit modules, whose epilogue has no silu * up)
            act = ops.silu_mul(gate(x), mlp.up_proj(x), self.backend)
        return apply_linear(mlp.down_proj, act, h)


class _CuteRMSNorm:
    """RMSNorm whose eval-mode forward on 16-bit CUDA inputs is ops.rms_norm (transformers'
    two roundings, one launch); the stock forward otherwise."""

    backend = "cute"
    fused = False

    def _runs_op(self, x) -> bool:
        return self.fused and not self.training and _fusable(x, self.backend) and self.weight.dtype == x.dtype

    def forward(self, hidden_states):
        x = hidden_states
        if not self._runs_op(x):
            return super().forward(x)
        return ops.rms_norm(x, self.weight, self.variance_epsilon, self.backend)

    def forward_into(self, x, out) -> bool:
        """forward(x) of rows x [n, hidden] written into `out` by the one-launch kernel, where
        forward would run it (backend cute on the GPU); False, with out untouched, otherwise."""
        if not (self._runs_op(x) and self.backend == "cute" and x.is_cuda and x.dim() == 2 and x.stride(1) == 1):
            return False
        from .llama_kernels import rms_norm_triton

        rms_norm_triton(x, self.weight.contiguous(), self.variance_epsilon, out=out)
        return True


class CuteLlamaModel(OwnPositionsMixin, _LLAMA.LlamaModel):
    _stock = _LLAMA.LlamaModel


class CuteQwen2Model(OwnPositionsMixin, _QWEN2.Qwen2Model):
    _stock = _QWEN2.Qwen2Model


class CuteMistralModel(OwnPositionsMixin, _MISTRAL.MistralModel):
    _stock = _MISTRAL.MistralModel


class CuteLlamaRMSNorm(_CuteRMSNorm, _LLAMA.LlamaRMSNorm):
    pass


class CuteQwen2RMSNorm(_CuteRMSNorm, _QWEN2.Qwen2RMSNorm):
    pass


class CuteMistralRMSNorm(_CuteRMSNorm, _MISTRAL.MistralRMSNorm):
    pass


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
    _LLAMA.LlamaModel: CuteLlamaModel,
    _QWEN2.Qwen2Model: CuteQwen2Model,
    _MISTRAL.MistralModel: CuteMistralModel,
}
NORM_SWAPS = {
    _LLAMA.LlamaRMSNorm: CuteLlamaRMSNorm,
    _QWEN2.Qwen2RMSNorm: CuteQwen2RMSNorm,
    _MISTRAL.MistralRMSNorm: CuteMistralRMSNorm,
}
_MLPS = (_LLAMA.LlamaMLP, _QWEN2.Qwen2MLP, _MISTRAL.MistralMLP)
_HALF = (torch.bfloat16, torch.float16)
RMSNORM_ENV, ROPE_ENV, SWIGLU_ENV = ("CUTE_KERNELS_LLAMA_PREFILL_RMSNORM", "CUTE_KERNELS_LLAMA_PREFILL_ROPE",
                                     "CUTE_KERNELS_LLAMA_PREFILL_SWIGLU")


def _fusable(x, backend: str) -> bool:
    """16-bit activations on the GPU; on the CPU only with the reference backend, whose torch
    forms are transformers' own ops (this is what lets CPU tests reach the fused paths)."""
    return x.dtype in _HALF and (x.is_cuda or backend == "reference")


def patch_llama_modules(model, *, backend: str) -> None:
    """The module swaps (see the module docstring); patch_model validates and sets attention."""
    for module in list(model.modules()):
        cls = SWAPS.get(type(module))
        if cls is not None:
            module.__class__ = cls
            module.backend = backend
        if isinstance(module, (*SWAPS, *_MLPS)):
            for child in module.children():
                if type(child) is nn.Linear:
                    CuteLinear.adopt(child, backend=backend)
    head = getattr(model, "lm_head", None)
    if type(head) in (nn.Linear, CuteLinear):
        CuteLMHead.adopt(head, backend=backend)
    for module in model.modules():
        if type(module) in NORM_SWAPS:
            module.__class__ = NORM_SWAPS[type(module)]
            module.backend = backend
    for stock in {cls._stock.forward for cls in SWAPS.values()}:
        _positional_names(stock)  # resolve the signatures outside any Dynamo trace
    swiglu = env.get(SWIGLU_ENV)
    set_prefill_fusions(model, rmsnorm=env.enabled(RMSNORM_ENV), rope=env.enabled(ROPE_ENV),
                        swiglu=swiglu if swiglu in ("split", "launch") else swiglu != "0")


def _plain_linears(*mods) -> bool:
    """Our plain 16-bit linears on one K, without activation or tensor-parallel reduction, and
    with a bias on all or none: what can run as one GEMM over their concatenated rows."""
    first = mods[0]
    return all(type(m) is CuteLinear and m.tp is None and not m.activation
               and (m.bias is None) == (first.bias is None) and m.weight.shape[1:] == first.weight.shape[1:]
               for m in mods)


def _gate_up_operands(mlp):
    """(weight, bias) of gate and up as one GEMM, their Parameters re-pointed at row blocks of
    one storage; None where the two cannot run as one (not our plain linears, a tensor-parallel
    reduction, bias on one only, an activation other than SiLU)."""
    gate, up = mlp.gate_proj, mlp.up_proj
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if act not in ("silu", "swish") or not _plain_linears(gate, up):
        return None
    with torch.no_grad():
        w = concat_rows([gate.weight, up.weight])
        b = None if gate.bias is None else concat_rows([gate.bias, up.bias])
    return w, b


def set_prefill_fusions(model, *, rmsnorm: bool, rope: bool, swiglu: bool | str) -> None:
    """Turn the prefill fusions of a patched Llama-family model on or off in place (the
    switches RMSNORM_ENV, ROPE_ENV and SWIGLU_ENV set them at patch time; a benchmark A/Bs them
    in one process). swiglu: True (one [gate; up] GEMM with silu * up in its epilogue where
    possible: no bias and I a multiple of 32; else as "launch"), "launch" (the [gate; up] GEMM,
    then ops.silu_mul), "split" (ops.silu_mul after the two GEMMs) or False."""
    one_gemm = swiglu is True or swiglu == "launch"
    for module in model.modules():
        if isinstance(module, _CuteRMSNorm):
            module.fused = rmsnorm
        elif isinstance(module, _CuteAttention):
            module.fused_rope = rope
        elif isinstance(module, _CuteDecoderLayer):
            module.fused_swiglu = bool(swiglu)
            if one_gemm and module.gate_up is None:
                module.gate_up = _gate_up_operands(module.mlp)
            elif not one_gemm:
                module.gate_up = None
            gu = module.gate_up
            module.swiglu_epilogue = (swiglu is True and gu is not None and gu[1] is None
                                      and (gu[0].shape[0] // 2) % 32 == 0)


def set_tp_invariant(model, pieces: int, tp=None) -> None:
    """Put a patched Llama-family model (sharded for `tp` or whole) into invariant mode with
    `pieces` pieces per row-parallel K (inference/invariant.py; patch_model(..., tp_invariant=pieces)
    calls it): the projections' K pieces, unsplit attention, no SwiGLU GEMM fusion, no sequence
    parallelism."""
    size = 1 if tp is None else tp.size
    if not isinstance(pieces, int) or isinstance(pieces, bool) or pieces < 1:
        raise ValueError(f"tp_invariant must be an int >= 1 (pieces of each row-parallel K), got {pieces!r}")
    if pieces % size:
        raise ValueError(f"tp_invariant={pieces} pieces do not split over tp={size} ranks: use a multiple of every "
                         f"TP degree the runs compare (8 covers 1, 2, 4, 8)")
    body = model.model
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not isinstance(attn, _CuteAttention) or not isinstance(layer, _CuteDecoderLayer):
            raise ValueError("tp_invariant needs the patched Llama-family modules")
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            lin.invariant_pieces = 1
        for name, lin in (("o_proj", attn.o_proj), ("down_proj", mlp.down_proj)):
            k_full, n = lin.weight.shape[1] * size, lin.weight.shape[0]
            # 8: each piece's rows stay 16-byte aligned for TMA; N % 4: its fp32 product's rows too
            if k_full % pieces or (k_full // pieces) % 8 or n % 4:
                raise ValueError(f"tp_invariant={pieces}: {name}'s K={k_full} must split into {pieces} pieces of a "
                                 f"multiple of 8 columns, and its N={n} be a multiple of 4")
            lin.invariant_pieces = pieces
        attn.tp_invariant = True
        layer.tp_invariant = True
    model.lm_head.invariant_pieces = 1
    if tp is not None:
        tp.seq_parallel = False
        tp.sp_norms = False
    model.cute_invariant = pieces
