"""Move a Hugging Face model onto our kernels, in place: `patch_model(model, ...)`.

This module holds the entry point, the shared pieces (linears, the attention and mask
functions) and GPT-2's swaps; the Llama family's swaps are in patch_llama.py.

What changes for GPT-2, and why it is done this way:

- Every `Conv1D` becomes a `CuteConv1D` and `lm_head` a `CuteLMHead` by swapping
  `__class__` to a subclass that only overrides `forward`. The Parameter objects,
  their names (`weight`, `bias`), hooks and `isinstance` checks all survive, so
  `state_dict`, `save_pretrained` and weight tying work unchanged.
- Conv1D stores its weight as [in, out]; the GEMM wants the K-major [out, in]
  operand. Instead of keeping a second copy we re-lay the parameter's storage
  out K-major (`w.data = w.data.t().contiguous().t()`): it still reads as
  [in, out], and `weight.t()` is the contiguous [N, K] matrix, for free.
  `load_state_dict` (`copy_`) and `.to()` (preserve_format) keep that layout.
- `lm_head.weight` is `wte.weight` ([V, E] = [N, K] already), so it needs no copy
  and the tie is untouched.
- The MLP's bias + gelu_tanh run in c_fc's epilogue; `mlp.act` becomes Identity
  so the stock `GPT2MLP.forward` still computes the same function.
- The two residual adds run in the c_proj epilogues. That needs the residual to
  reach c_proj, so GPT2Block/GPT2Attention/GPT2MLP are class-swapped to
  subclasses whose eval-mode forward passes it down (training, cross-attention
  and other unusual configurations fall back to the stock forward).
- Attention goes through transformers' AttentionInterface under our own names,
  with the matching AttentionMaskInterface entry (without it the causal mask
  silently disappears). Names avoid "flash" and "/", which transformers treats
  specially.
- Plain causal batches must reach our attention with mask None, also under CUDA
  graph capture. transformers builds an explicit mask whenever it is tracing or
  capturing (so that an exported graph never hard-codes `is_causal`), and its
  packed-sequence check on GPT-2's own position ids costs a device sync in eager
  mode and an explicit mask under capture. Our mask function (`_mask_function`)
  returns None for the unmodified causal pattern without padding, and the
  GPT2Model swap (`CuteGPT2Model`) tells the mask builder when the position ids
  are its own arange, so nothing can be packed (`_causal_mask`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn
from transformers.masking_utils import causal_mask_function, sdpa_mask
from transformers.models.gpt2 import modeling_gpt2 as _GPT2  # bound here: code Dynamo traces must not import

from cute_kernels.activations import FROM_HF
from cute_kernels.runtime import env

from . import ops
from .adapters import ADAPTERS
from .models import PRECISIONS
from .modules import (  # noqa: F401  (re-exported: decode.py and the tests import the linears from here)
    POSITIONS,
    CuteLinear,
    CuteLMHead,
    OwnPositionsMixin,
    _CuteLinearMixin,
    _positional_names,
    _stock_arguments,
    _stock_kwargs,
    apply_linear,
)

ATTENTIONS = ("sdpa", "cute")
# precision -> quant.quantize_model scheme
QUANT_SCHEMES = {
    "fp8": "fp8-dynamic",
    "fp8-block": "fp8-block",
    "int8": "int8-dynamic",
    "int8-smoothquant": "int8-smoothquant",
}
# transformers activation names we can run in the GEMM epilogue (exactly the same function)
FUSABLE_ACTIVATIONS = FROM_HF
ATTN_NAMES = {"cute": "cute_attn", "reference": "cute_attn_ref"}
SMOOTHQUANT_ALPHA = 0.5
QUANT_BACKENDS = {"cute": "kernels", "reference": "reference"}  # our backend -> quant module `backend`


# --------------------------------------------------------------------------- linears


class CuteConv1D(_CuteLinearMixin, _GPT2.Conv1D):
    """GPT-2 Conv1D (weight [in, out], stored K-major) running on our linear op."""

    @classmethod
    def adopt(cls, module, *, backend: str, activation: str | None = None):
        w = module.weight
        if not w.t().is_contiguous():
            w.data = w.data.t().contiguous().t()
        module.__class__ = cls
        module.backend, module.activation = backend, activation
        return module

    def forward(self, x, residual=None):
        return self._run(x, self.weight.t(), self.bias, residual)

    def __repr__(self):
        act = f", activation={self.activation}" if self.activation else ""
        return f"CuteConv1D(nf={self.nf}, nx={self.nx}{act}, backend={self.backend})"


def apply_layernorm_linear(module, ln, x):
    """module(ln(x)); the quant modules fuse the LayerNorm into their activation quantization,
    and our 16-bit linears take it from our LayerNorm op (ops.layer_norm)."""
    if ln is None:
        return module(x)
    if hasattr(module, "forward_layernorm"):
        return module.forward_layernorm(x, ln)
    if isinstance(module, _CuteLinearMixin) and isinstance(ln, nn.LayerNorm) and ln.weight is not None \
            and ln.bias is not None and len(ln.normalized_shape) == 1:
        return module(ops.layer_norm(x, ln.weight, ln.bias, float(ln.eps), module.backend))
    return module(ln(x))


# --------------------------------------------------------------------------- blocks


def _cache_update_kwargs(bound: dict) -> dict:
    return {"cache_kwargs": {"cache_position": bound["cache_position"]}} if "cache_position" in bound else {}


class CuteGPT2Attention(_GPT2.GPT2Attention):
    """Self-attention whose output projection also adds the block's residual."""

    def forward(self, hidden_states, *args, residual=None, ln=None, **kwargs):
        """ln (optional): the block's ln_1, applied to hidden_states first (fused into
        c_attn's input quantization for the 8-bit linears). Any other call (the stock
        GPT2Block's, cross-attention, eager attention with reorder_and_upcast_attn) runs
        the stock forward."""
        m = _GPT2
        a = _stock_arguments(m.GPT2Attention.forward, args, kwargs)
        cache = a["cache"]
        if (
            a.get("encoder_hidden_states") is not None
            or a.get("output_attentions")
            or isinstance(cache, m.EncoderDecoderCache)
            or (self.config._attn_implementation == "eager" and self.reorder_and_upcast_attn)
            or (residual is None and ln is None)
        ):
            if ln is not None:
                hidden_states = ln(hidden_states)
            out, weights = super().forward(hidden_states, **_stock_kwargs(m.GPT2Attention.forward, a))[:2]
            return (out if residual is None else out + residual), weights

        # Same steps as GPT2Attention.forward (self-attention branch), ending in a fused c_proj.
        attention_mask = a.pop("attention_mask", None)
        for unused in ("cache", "encoder_hidden_states", "encoder_attention_mask", "output_attentions", "head_mask"):
            a.pop(unused, None)
        update_kwargs = _cache_update_kwargs(a)
        query, key, value = apply_layernorm_linear(self.c_attn, ln, hidden_states).split(self.split_size, dim=2)
        shape = (*query.shape[:-1], -1, self.head_dim)
        query, key, value = (t.view(shape).transpose(1, 2) for t in (query, key, value))
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx, **update_kwargs)
        attention = m.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, m.eager_attention_forward)
        out, weights = attention(self, query, key, value, attention_mask,
                                 dropout=self.attn_dropout.p if self.training else 0.0, scaling=self.scaling, **a)
        out = out.reshape(*out.shape[:-2], -1).contiguous()
        if residual is None:
            return self.resid_dropout(self.c_proj(out)), weights
        return apply_linear(self.c_proj, out, residual), weights  # eval only (the block guarantees it)


class CuteGPT2MLP(_GPT2.GPT2MLP):
    def forward(self, hidden_states, residual=None, ln=None):
        h = self.act(apply_layernorm_linear(self.c_fc, ln, hidden_states))
        if residual is None:
            return self.dropout(self.c_proj(h))
        return apply_linear(self.c_proj, h, residual)


class CuteGPT2Block(_GPT2.GPT2Block):
    """GPT2Block with both residual adds moved into the c_proj epilogues (eval mode)."""

    def forward(self, hidden_states, *args, **kwargs):
        a = _stock_arguments(_GPT2.GPT2Block.forward, args, kwargs)
        if self.training or a.get("encoder_hidden_states") is not None or a.get("output_attentions"):
            # Dropout sits between c_proj and the residual add: keep the stock order.
            return super().forward(hidden_states, *args, **kwargs)
        a.pop("encoder_hidden_states", None)
        h, _ = self.attn(hidden_states, residual=hidden_states, ln=self.ln_1, **a)
        return self.mlp(h, residual=h, ln=self.ln_2)


# --------------------------------------------------------------------------- attention


def _attention_forward(backend: str):
    """An AttentionInterface function running our kernels where the mask allows.

    transformers hands q/k/v as [B, H, S, D] and expects [B, S, H, D] back; k and v may
    have fewer heads than q (GQA, not repeated), which both kernels take as they are. With
    the sdpa mask function registered for our name, the mask is None exactly when
    the pattern is plain causal (q_len == kv_len), attend-to-all (q_len == 1), or
    a prefill into an empty static cache (kv_len > q_len, valid keys are the
    first q_len): ops.flash_attn. One query token with an explicit boolean mask
    (static-cache decode: the filled prefix; padding holes) runs our decode kernel
    with that mask as its key mask (ops.attend_cache). Other explicit masks (padded
    prefill) go to SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        B, _, q_len, _ = query.shape
        kv_len = key.shape[2]
        if (attention_mask is not None and dropout == 0.0 and q_len == 1 and attention_mask.dtype == torch.bool
                and attention_mask.dim() == 4 and attention_mask.shape[1:3] == (1, 1)
                and attention_mask.shape[-1] == kv_len and attention_mask.shape[0] in (1, B)):
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            key_mask = attention_mask[:, 0, 0, :].expand(B, kv_len)
            if key_mask.stride(1) != 1:
                key_mask = key_mask.contiguous()
            lens = torch.full((B,), kv_len, dtype=torch.int32, device=query.device)
            out = ops.attend_cache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), lens,
                                   float(scale), backend, key_mask, getattr(module, "tp_invariant", False))
            return out, None
        if attention_mask is not None or dropout > 0.0:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        causal = q_len > 1
        if causal and kv_len > q_len:
            key, value = key[:, :, :q_len], value[:, :, :q_len]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        if getattr(module, "fp8_attention", False) and ops.fp8_attention_takes(q_len, query.shape[-1], causal,
                                                                               query.dtype):
            return ops.flash_attn_fp8_from16(q, k, v, causal, float(scale), backend), None
        out = ops.flash_attn(q, k, v, causal, float(scale), backend, getattr(module, "tp_invariant", False))
        return out, None

    return attention


def _mask_function(*, q_length, kv_length, q_offset=0, mask_function=None, attention_mask=None,
                   allow_is_causal_skip=True, local_size=None, **kwargs):
    """transformers' sdpa_mask, except that the plain causal pattern without padding is
    always None (our attention's "causal"), not only when transformers is not tracing.

    GPT2Model hands transformers its own arange position ids, and without a cache
    transformers checks them for packed sequences: a device sync eagerly, and under CUDA
    graph capture a packed-sequence overlay that forces an explicit mask (and SDPA). When
    CuteGPT2Model (or a Llama-family base model, modules.OwnPositionsMixin) made those
    positions itself (`modules.POSITIONS.own`) nothing can be packed, so the overlay is a
    no-op and the mask is plain causal."""
    # A static cache hands q_offset as a tensor: not known to be 0 without a sync.
    plain = attention_mask is None and local_size is None and isinstance(q_offset, int) and q_offset == 0
    # A sliding window longer than the sequence (Mistral's 4096 at a short prompt) masks nothing.
    windowless = local_size is None or kv_length < local_size
    if (attention_mask is None and windowless and isinstance(q_offset, int) and q_offset == 0 and POSITIONS.own
            and q_length == kv_length):
        return None
    if (plain and allow_is_causal_skip and mask_function is causal_mask_function
            and (q_length == kv_length or q_length == 1)):
        return None
    return sdpa_mask(q_length=q_length, kv_length=kv_length, q_offset=q_offset, mask_function=mask_function,
                     attention_mask=attention_mask, allow_is_causal_skip=allow_is_causal_skip, local_size=local_size,
                     **kwargs)


def register_attention(backend: str) -> str:
    """Register our attention (and its mask function) with transformers; return its name."""
    from transformers import AttentionInterface, AttentionMaskInterface

    name = ATTN_NAMES[backend]
    AttentionInterface.register(name, _attention_forward(backend))
    AttentionMaskInterface.register(name, _mask_function)
    return name


# --------------------------------------------------------------------------- position ids and the mask

class CuteGPT2Model(OwnPositionsMixin, _GPT2.GPT2Model):
    """GPT2Model that marks calls whose position ids it makes itself (modules.POSITIONS)."""

    _stock = _GPT2.GPT2Model


# --------------------------------------------------------------------------- patch_model


def _check_cute_device(model):
    from cute_kernels.runtime import check_device

    p = next(model.parameters())
    check_device(p, "model weights")  # raises a ValueError naming the device otherwise
    if p.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"backend='cute' runs bf16/fp16 models; this one is {p.dtype} (call model.to(torch.bfloat16))")


def _quantize(model, precision: str, calibration, backend: str):
    """Swap the GEMM modules for the `quant` package's FP8Linear/Int8Linear (lm_head stays 16-bit)."""
    try:
        import quant
    except ImportError as e:
        raise NotImplementedError(f"precision={precision!r} needs the `quant` package, which failed to import: {e}")
    if not hasattr(quant, "quantize_model"):
        raise NotImplementedError(f"precision={precision!r} needs quant.quantize_model, which is not available yet")
    if precision == "int8-smoothquant" and calibration is None:
        raise ValueError("precision='int8-smoothquant' needs calibration=<iterable of input_ids batches>")
    kw = {"calibration": calibration, "alpha": SMOOTHQUANT_ALPHA} if precision == "int8-smoothquant" else {}
    quant.quantize_model(model, QUANT_SCHEMES[precision], **kw)
    for module in model.modules():  # pin the quant modules to the backend we were asked for
        if isinstance(module, (quant.FP8Linear, quant.Int8Linear)):
            module.backend = QUANT_BACKENDS[backend]


def _own_config(model) -> None:
    """Give the model a config object of its own: the attention implementation is set on the
    config, and two models built from one config object would otherwise both switch."""
    old = model.config
    new = copy.deepcopy(old)
    for module in model.modules():
        if getattr(module, "config", None) is old:
            module.config = new


def patch_model(model, *, precision: str = "bf16", attention: str = "sdpa", calibration: Iterable | None = None,
                backend: str = "cute", tp=None, tp_invariant: int | None = None):
    """Run `model` on our kernels, in place; returns the same object.

    model: a GPT2LMHeadModel or GPT2Model, or a LlamaForCausalLM / Qwen2ForCausalLM /
      MistralForCausalLM (patch_llama.py).
    precision: "bf16" keeps 16-bit weights (the model's dtype); the others first swap
      every Conv1D / nn.Linear for the `quant` package's FP8Linear/Int8Linear (lm_head
      stays 16-bit on our linear). They fuse what their 8-bit epilogue supports: GPT-2's
      c_fc gelu (via their `activation`) and the residual adds in the c_proj / o_proj /
      down_proj epilogues. With attention="cute", "fp8" also runs long causal prefills in FP8
      attention (ops.flash_attn_fp8_from16; CUTE_KERNELS_FP8_ATTENTION=0: bf16).
    calibration: input_ids batches (or quant.smoothquant.calibrate's dict), for
      int8-smoothquant only.
    attention: "sdpa" (transformers' SDPA) or "cute" (cute_kernels.flash_attn).
    backend: "cute" (Hopper kernels) or "reference" (the PyTorch references; CPU ok).
    tp: tensor parallelism (inference/tp.py; bf16 only): None or 1, the world size of the
      initialized default process group, a tp.TPGroup or a ProcessGroup. The weights are
      sharded for this rank first, unless tp.shard_model / tp.build_random did it with
      this group.
    tp_invariant: P > 0 runs TP-invariant arithmetic (inference/invariant.py; the Llama family,
      bf16, attention="cute"): the same bits at every TP degree dividing P, so that greedy
      tokens do not depend on the degree. 0: off; None: CUTE_KERNELS_TP_INVARIANT.
    """
    from . import invariant as _inv

    if tp_invariant is None:
        tp_invariant = _inv.pieces_from_env()
    if not isinstance(tp_invariant, int) or isinstance(tp_invariant, bool) or tp_invariant < 0:
        raise ValueError(f"tp_invariant must be an int >= 0, got {tp_invariant!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    if backend not in ops.BACKENDS:
        raise ValueError(f"backend must be one of {ops.BACKENDS}, got {backend!r}")
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ADAPTERS:
        raise ValueError(f"patch_model has no adapter for model_type={model_type!r}; supported: {', '.join(ADAPTERS)}")
    family = "gpt2" if model_type == "gpt2" else "llama"
    if tp_invariant and (family != "llama" or precision != "bf16" or attention != "cute"):
        raise ValueError(f"tp_invariant runs the Llama family in bf16 with attention='cute', got "
                         f"model_type={model_type!r}, precision={precision!r}, attention={attention!r}")
    if backend == "cute":
        _check_cute_device(model)
        if attention == "cute":
            ok, why = ops.cute_attention_available()
            if not ok:
                raise NotImplementedError(f"attention='cute' needs cute_kernels.flash_attn: {why}; use attention='sdpa'")
    # Tensor parallelism: shard before the swaps (they re-lay out the weights they see).
    from . import tp as _tp

    group, sharded = _tp.as_group(tp), _tp.tp_of(model)
    if (group or sharded) is not None and precision != "bf16":
        raise ValueError(f"tensor parallelism runs bf16 models; precision={precision!r} is not supported with tp")
    if sharded is not None and group is not None and group.size != sharded.size:
        raise ValueError(f"the model is sharded for tp={sharded.size}, patch_model got tp={group.size}")
    if sharded is None and group is not None:
        _tp.shard_model(model, group)
    _own_config(model)
    if family == "llama":
        from .patch_llama import patch_llama_modules

        if precision != "bf16":
            _quantize(model, precision, calibration, backend)
        patch_llama_modules(model, backend=backend)
    else:
        _patch_gpt2_modules(model, precision, calibration, backend)
    if _tp.tp_of(model) is not None:
        _tp.finish_patch(model)
    if tp_invariant:
        from .patch_llama import set_tp_invariant

        set_tp_invariant(model, tp_invariant, _tp.tp_of(model))
    if attention == "cute":
        model.set_attn_implementation(register_attention(backend))
    elif model.config._attn_implementation != "sdpa":
        model.set_attn_implementation("sdpa")
    fp8_attention = (attention == "cute" and precision == "fp8" and not tp_invariant
                     and env.enabled("CUTE_KERNELS_FP8_ATTENTION"))
    if fp8_attention:
        _mark_fp8_attention(model, family)
    model.cute_patch = {"precision": precision, "attention": attention, "backend": backend,
                        "tp_invariant": tp_invariant, "fp8_attention": fp8_attention}
    return model


def _mark_fp8_attention(model, family: str) -> None:
    """Long causal prefills of the patched attention modules run in FP8 (ops.fp8_attention_takes):
    the fp8 precision's GEMMs already round their inputs to e4m3, and there the quantize-and-FP8
    path ran 1.00x-1.43x our bf16 kernel (ops.FP8_ATTENTION_MIN_SEQLEN)."""
    if family == "llama":
        from .patch_llama import _CuteAttention as attention_class
    else:
        attention_class = CuteGPT2Attention
    for module in model.modules():
        if isinstance(module, attention_class):
            module.fp8_attention = True


def _patch_gpt2_modules(model, precision: str, calibration, backend: str) -> None:
    if precision != "bf16":
        _quantize(model, precision, calibration, backend)

    m = _GPT2
    fused_act = FUSABLE_ACTIVATIONS.get(model.config.activation_function)
    handled = set()
    for module in list(model.modules()):
        if isinstance(module, m.GPT2MLP):
            c_fc = module.c_fc
            can_fuse = fused_act is not None and (isinstance(c_fc, m.Conv1D) or hasattr(c_fc, "activation"))
            if isinstance(c_fc, m.Conv1D):
                CuteConv1D.adopt(c_fc, backend=backend, activation=fused_act if can_fuse else None)
                handled.add(id(c_fc))
            elif can_fuse:
                c_fc.activation = fused_act  # a quant module that honours `activation`
            if can_fuse:
                module.act = nn.Identity()
            module.__class__ = CuteGPT2MLP
        elif isinstance(module, m.GPT2Attention) and not module.is_cross_attention:
            module.__class__ = CuteGPT2Attention
        elif isinstance(module, m.GPT2Block):
            module.__class__ = CuteGPT2Block
        elif type(module) is m.GPT2Model:
            module.__class__ = CuteGPT2Model
    for module in model.modules():
        if isinstance(module, m.Conv1D) and id(module) not in handled:
            CuteConv1D.adopt(module, backend=backend, activation=getattr(module, "activation", None))
    head = getattr(model, "lm_head", None)
    if type(head) in (nn.Linear, CuteLMHead):  # not a quant module that subclasses nn.Linear
        CuteLMHead.adopt(head, backend=backend)

    for stock in (m.GPT2Model.forward, m.GPT2Block.forward, m.GPT2Attention.forward):
        _positional_names(stock)  # resolve the signatures outside any Dynamo trace
