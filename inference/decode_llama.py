"""The Llama family's static decoder: StaticDecoder's loop (static KV cache, the whole step in
one CUDA graph, device-side counters, the one-launch glue) with the Llama step.

Per layer: h += o_proj(attn(rope(qkv(rmsnorm(h))))), h += down(silu(gate(x)) * up(x)) with
x = rmsnorm(h). RoPE comes from tables built once from the model's own `rotary_emb` for
every position (so Llama-3's rope scaling and Qwen2's theta are whatever the config says,
with transformers' dtype rounding), indexed by the device-side position. Mistral's (and
Qwen2's per-layer) sliding window is a key mask in decode and a band mask in prefill.

On a patched model (our linears) the step takes these shortcuts, each with its switch
(cute_kernels.runtime.env; read when the decoder is built):

- CUTE_KERNELS_LLAMA_QKV: q, k, v as one GEMV over [q; k; v] (bias too, Qwen2), and gate / up
  as one over [gate; up]. The concatenated weights are built once here and the modules'
  parameters re-pointed at their row blocks, so the weights are not held twice.
- CUTE_KERNELS_LLAMA_RMS_PROLOGUE: each RMSNorm in the prologue of the GEMV after it (q/k/v,
  gate/up, the head) at <= 8 rows, else one launch of our RMSNorm (llama_kernels.py) instead
  of transformers' module (about seven kernels).
- CUTE_KERNELS_LLAMA_SWIGLU: gate/up as one GEMV whose epilogue writes silu(gate) * up.
- CUTE_KERNELS_LLAMA_ROPE_APPEND: RoPE of q and k and the K/V append in one launch;
  CUTE_KERNELS_LLAMA_QKV_ROPE: in the epilogue of the q/k/v GEMV instead, where it takes the
  RMSNorm prologue (each program holds whole RoPE pairs: skinny_gemm's rope=).
- CUTE_KERNELS_DECODE_GLUE: argmax, bookkeeping and the next embedding in one launch
  (next_token.py, without position embeddings).

The unpatched model runs the same loop on its own modules (cuBLAS, or under torch.compile):
the bench's baselines. Head counts come from the projections' weight shapes, and o_proj /
down_proj are called through `_row_parallel_out`, so a tensor-parallel shard of the model
(smaller q/k/v, gate/up, an all-reducing output projection) needs no change here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cute_kernels.matmul.api import norm_prologue_fits
from cute_kernels.matmul.gemv import GEMV_MAX_M, LN_MAX_K
from cute_kernels.runtime import env

from . import ops
from .adapters import LlamaAdapter
from .decode import StaticDecoder
from .modules import CuteLinear, apply_linear, concat_rows
from .tp import greedy_tokens

QKV_ENV = "CUTE_KERNELS_LLAMA_QKV"
RMS_ENV = "CUTE_KERNELS_LLAMA_RMS_PROLOGUE"
SWIGLU_ENV = "CUTE_KERNELS_LLAMA_SWIGLU"
ROPE_ENV = "CUTE_KERNELS_LLAMA_ROPE_APPEND"
QKV_ROPE_ENV = "CUTE_KERNELS_LLAMA_QKV_ROPE"
QUANT8_ENV = "CUTE_KERNELS_LLAMA_8BIT_DECODE"


@dataclass
class _Fused:
    """One layer's build-time pieces: concatenated weights (None: the modules run), its window."""

    window: int | None
    qkv_w: torch.Tensor | None = None
    qkv_b: torch.Tensor | None = None
    gate_up_w: torch.Tensor | None = None
    # 8-bit weights (qkv_w / gate_up_w fp8 or int8): their per-channel scales, [N] fp32
    qkv_s: torch.Tensor | None = None
    gate_up_s: torch.Tensor | None = None


def _weight_only_8bit(layers) -> str | None:
    """The fused ops' backend when every projection of every layer is one of quant's 8-bit
    modules that decode weight-only (per-channel fp8 or int8, no SmoothQuant factor), else None."""
    try:
        from quant.nn import FP8Linear, Int8Linear
    except ImportError:
        return None
    mods = [m for layer in layers for m in (*layer.qkv_projections, layer.out_proj, layer.mlp_gate, layer.mlp_in,
                                              layer.mlp_out)]
    ok = mods and all((isinstance(m, Int8Linear) or (isinstance(m, FP8Linear) and m.mode == "row"))
                      and getattr(m, "inv_smooth", None) is None for m in mods)
    return mods[0].backend if ok else None


class LlamaStaticDecoder(StaticDecoder):
    """Greedy decoder for LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM: a
    [B, Hkv, max_len, D] cache per layer and the step in one CUDA graph (see the module
    docstring). Same interface as StaticDecoder."""

    def __init__(self, model, *, batch_size: int, max_len: int, cuda_graph: bool | None = None,
                 compile: bool | str = False):
        super().__init__(model, batch_size=batch_size, max_len=max_len, cuda_graph=cuda_graph, compile=compile)
        ad = self.adapter
        with torch.no_grad():  # RoPE tables from the model's own module, in the activations' dtype
            cos, sin = ad.body.rotary_emb(self._h, self._arange[None])
        self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()
        patched = isinstance(ad.layers()[0].q_proj, CuteLinear) if ad.n_layers else False
        # An 8-bit patched model (quant's modules, weight-only at decode sizes) takes the same
        # shortcuts: q/k/v and gate/up concatenated with their per-channel scales.
        q8 = None if patched or compile or not env.enabled(QUANT8_ENV) else _weight_only_8bit(ad.layers())
        self._q8 = q8 is not None
        self._backend = ad.layers()[0].q_proj.backend if patched else q8
        fuse = (patched or self._q8) and not compile
        self._rms = fuse and env.enabled(RMS_ENV)
        # TP-invariant arithmetic: every projection through invariant.linear, so no GEMV
        # epilogue fusions (the RMSNorm prologue is off in _prologue_fits).
        self._swiglu = fuse and env.enabled(SWIGLU_ENV) and not self._invariant
        self._rope_append = fuse and env.enabled(ROPE_ENV)
        self._qkv_rope = self._rope_append and self._rms and env.enabled(QKV_ROPE_ENV) and not self._invariant
        concat = fuse and (env.enabled(QKV_ENV) or self._swiglu)
        self._layers = []
        with torch.no_grad():
            for layer, block in zip(ad.layers(), ad.body.layers):
                window = getattr(block.self_attn, "sliding_window", getattr(model.config, "sliding_window", None))
                f = _Fused(window if window is not None and window < max_len else None)
                if concat:
                    projections = layer.qkv_projections
                    f.qkv_w = concat_rows([p.weight for p in projections])
                    biases = [p.bias for p in projections]
                    if all(b is not None for b in biases):
                        f.qkv_b = concat_rows(biases)
                    elif any(b is not None for b in biases):
                        f.qkv_b = torch.cat([p.weight.new_zeros(p.weight.shape[0]) if p.bias is None else p.bias.data
                                             for p in projections])
                    f.gate_up_w = concat_rows([layer.mlp_gate.weight, layer.mlp_in.weight])
                    if self._q8:
                        f.qkv_s = concat_rows([p.weight_scale for p in projections]).view(-1)
                        f.gate_up_s = concat_rows([layer.mlp_gate.weight_scale, layer.mlp_in.weight_scale]).view(-1)
                self._layers.append(f)

    def _check_adapter(self, ad) -> None:
        if not isinstance(ad, LlamaAdapter):
            raise ValueError(f"LlamaStaticDecoder runs {', '.join(LlamaAdapter.model_types)} models, "
                             f"not {ad.model_type}")

    def _local_heads(self, ad) -> tuple[int, int]:
        """From the weights, not the config: a tensor-parallel shard holds fewer heads."""
        if not ad.n_layers:
            return ad.n_heads, ad.n_kv_heads
        a = ad.body.layers[0].self_attn
        return a.q_proj.weight.shape[0] // ad.head_dim, a.k_proj.weight.shape[0] // ad.head_dim

    # ------------------------------------------------------------------ model math

    def _row_parallel_out(self, module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """o_proj / down_proj with the residual added (in the epilogue where the module can):
        the one place a tensor-parallel all-reduce goes."""
        return apply_linear(module, x, residual)

    def _norm(self, norm, x: torch.Tensor) -> torch.Tensor:
        """norm(x) as one launch of our RMSNorm (switch on, patched model), the module otherwise."""
        if self._rms:
            return ops.rms_norm(x, norm.weight, float(norm.variance_epsilon), self._backend)
        return norm(x)

    def _prologue_fits(self, x2: torch.Tensor) -> bool:
        return self._rms and not self._invariant and x2.shape[0] <= GEMV_MAX_M and (
            self._backend == "reference" or (x2.is_cuda and x2.shape[1] <= LN_MAX_K))

    def _norm_linear(self, norm, x: torch.Tensor, weight, bias, module=None, scale=None, parts=()) -> torch.Tensor:
        """linear(norm(x)) over weight/bias (the RMSNorm in the GEMV's prologue where it fits),
        or module(norm(x)) for an unpatched model (weight None). scale: weight is 8-bit with this
        per-channel scale, the concatenation of the modules `parts` (decode sizes: one RMSNorm
        launch, then the weight-only GEMV on the GPU; the modules themselves elsewhere)."""
        if weight is None:
            return module(norm(x))
        x2 = x.reshape(-1, x.shape[-1])
        N = weight.shape[0]
        if scale is not None:
            from quant.nn import weight_only_eligible

            if self._q8_fits(parts[0], x2):  # one launch, the norm in the prologue
                from cute_kernels.matmul.gemv import skinny_gemm

                y = skinny_gemm(x2.contiguous(), weight, bias, rms=(norm.weight, float(norm.variance_epsilon)),
                                w_scale=scale)
                return y.view(*x.shape[:-1], N)
            xn = self._norm(norm, x2).contiguous()
            if weight_only_eligible(parts[0], xn):  # where each module would run weight-only
                from cute_kernels.matmul.gemv import weight_only_gemv

                y = weight_only_gemv(xn, weight, scale, bias)
            else:  # what the modules compute here (on the CPU: their W8A8 reference)
                y = torch.cat([m(xn) for m in parts], -1)
        elif self._invariant:
            from .invariant import linear

            return linear(self._norm(norm, x2).contiguous(), weight, bias, backend=self._backend).view(
                *x.shape[:-1], N)
        elif self._prologue_fits(x2) and norm_prologue_fits(x2.shape[0], N, x2.shape[1], x2.dtype,
                                                             bias=bias is not None):
            y = ops.rms_linear(x2.contiguous(), norm.weight, float(norm.variance_epsilon), weight, bias,
                               self._backend)
        else:
            y = ops.linear(self._norm(norm, x2).contiguous(), weight, bias, None, "", 1.0, 1.0, self._backend)[:, :N]
        return y.view(*x.shape[:-1], N)

    def _q8_fits(self, module, h: torch.Tensor) -> bool:
        """An 8-bit step's fused launch (RMSNorm prologue, weight-only GEMV) serves h's rows."""
        from quant.nn import weight_only_eligible

        h2 = h.reshape(-1, h.shape[-1])
        return weight_only_eligible(module, h2) and self._prologue_fits(h2)

    def _epilogue_rope_fits(self, layer, f: _Fused, h: torch.Tensor) -> bool:
        """The decode step's q/k/v GEMV can take RoPE and the append in its epilogue (Triton
        skinny GEMV with the RMSNorm prologue; 8-bit: weight-only)."""
        h2 = h.reshape(-1, h.shape[-1])
        if f.qkv_s is not None:
            return self._q8_fits(layer.qkv_projections[0], h)
        return self._backend == "cute" and h2.is_cuda and self._prologue_fits(h2)

    def _qkv(self, layer, f: _Fused, h: torch.Tensor, i: int, positions, cos, sin, decode: bool):
        """q [B, S, Hq, D] after RoPE, with k and v written to layer i's cache at positions;
        also k, v [B, S, Hkv, D] for a prefill (None in decode)."""
        B, S, _ = h.shape
        Hq, D = self.n_head, self.head_dim
        if decode and self._qkv_rope and f.qkv_w is not None and self._epilogue_rope_fits(layer, f, h):
            from cute_kernels.matmul.gemv import skinny_gemm

            norm = layer.attn_norm
            q = skinny_gemm(h.reshape(-1, h.shape[-1]).contiguous(), f.qkv_w, f.qkv_b,
                            rms=(norm.weight, float(norm.variance_epsilon)), w_scale=f.qkv_s,
                            rope=(self._cos, self._sin, positions, self.k[i], self.v[i], Hq))
            return q.view(B, 1, Hq, D), None, None
        if f.qkv_w is not None and (f.qkv_s is None or B * S <= GEMV_MAX_M):
            qkv = self._norm_linear(layer.attn_norm, h, f.qkv_w, f.qkv_b, scale=f.qkv_s,
                                    parts=layer.qkv_projections)
            if decode and self._rope_append:
                q = ops.rope_append(qkv.view(B, -1), self._cos, self._sin, positions, self.k[i], self.v[i], Hq,
                                    self._backend)
                return q.view(B, 1, Hq, D), None, None
            q, k, v = qkv.split([Hq * D, self.k[i].shape[1] * D, self.k[i].shape[1] * D], -1)
        else:
            x = self._norm(layer.attn_norm, h)
            q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
        c, s = cos[None, :, None], sin[None, :, None]
        q = ops.rope_ref(q.reshape(B, S, Hq, D), c, s)
        k = ops.rope_ref(k.reshape(B, S, -1, D), c, s)
        v = v.reshape(B, S, -1, D)
        self.k[i].index_copy_(2, positions, k.transpose(1, 2))
        self.v[i].index_copy_(2, positions, v.transpose(1, 2))
        return q, k, v

    def _attend(self, q, k, v, i: int, f: _Fused, positions, seqlens, scale: float, key_masks: dict, decode: bool):
        """Attention of q [B, S, Hq, D] -> [B, S, Hq, D]: causal over the prompt (prefill), or
        one token against layer i's cache, within the layer's window."""
        B, S = q.shape[:2]
        gqa = q.shape[2] != self.k[i].shape[1]
        w = f.window
        if not decode:
            if w is None or S <= w:
                return self._attend_prefill(q, k, v, scale)
            r = torch.arange(S, device=q.device)
            band = (r[None, :] <= r[:, None]) & (r[None, :] > r[:, None] - w)
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  attn_mask=band, scale=scale, enable_gqa=gqa).transpose(1, 2)
        km = None
        if w is not None:  # keys j with pos - w < j, one mask per window per step
            km = key_masks.get(w)
            if km is None:
                km = key_masks[w] = (self._arange > positions[-1] - w).expand(B, self.max_len).contiguous()
        if self._flash_backend is not None:
            return ops.attend_cache(q, self.k[i].transpose(1, 2), self.v[i].transpose(1, 2), seqlens, scale,
                                    self._flash_backend, km, self._invariant > 0)
        mask = self._arange <= positions[-1]
        if km is not None:
            mask = mask & km[0]
        return F.scaled_dot_product_attention(q.transpose(1, 2), self.k[i], self.v[i], attn_mask=mask.view(1, 1, 1, -1),
                                              scale=scale, enable_gqa=gqa).transpose(1, 2)

    def _mlp_llama(self, layer, f: _Fused, h: torch.Tensor) -> torch.Tensor:
        """h + down(silu(gate(x)) * up(x)), x = RMSNorm(h)."""
        if f.gate_up_w is None or (f.gate_up_s is not None and h.shape[0] * h.shape[1] > GEMV_MAX_M):
            x = self._norm(layer.mlp_norm, h)
            a = layer.mlp_act(layer.mlp_gate(x)) * layer.mlp_in(x)
        elif f.gate_up_s is not None and self._swiglu and self._q8_fits(layer.mlp_gate, h):
            from cute_kernels.matmul.gemv import skinny_gemm

            h2 = h.reshape(-1, h.shape[-1]).contiguous()
            norm = layer.mlp_norm
            a = skinny_gemm(h2, f.gate_up_w, rms=(norm.weight, float(norm.variance_epsilon)), swiglu=True,
                            w_scale=f.gate_up_s).view(*h.shape[:-1], -1)
        elif f.gate_up_s is None and self._swiglu and h.shape[0] * h.shape[1] <= GEMV_MAX_M and (self._backend == "reference" or h.is_cuda):
            h2 = h.reshape(-1, h.shape[-1]).contiguous()
            if self._prologue_fits(h2):
                a = ops.rms_swiglu(h2, layer.mlp_norm.weight, float(layer.mlp_norm.variance_epsilon), f.gate_up_w,
                                   self._backend)
            else:
                a = ops.rms_swiglu(self._norm(layer.mlp_norm, h2).contiguous(), None, 0.0, f.gate_up_w,
                                   self._backend)
            a = a.view(*h.shape[:-1], -1)
        else:
            gu = self._norm_linear(layer.mlp_norm, h, f.gate_up_w, None, scale=f.gate_up_s,
                                   parts=(layer.mlp_gate, layer.mlp_in))
            g, u = gu.chunk(2, dim=-1)
            a = layer.mlp_act(g) * u
        return self._row_parallel_out(layer.mlp_out, a, h)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, decode: bool) -> torch.Tensor:
        """Run tokens [B, S] at positions [S]; write the cache; return the greedy next token [B, 1]
        (None for a glued decode step, whose glue launch stored it and moved the counters on)."""
        ad = self.adapter
        B, S = tokens.shape
        glued, h, seqlens = self._step_inputs(tokens, positions, decode)
        cos, sin = self._cos[positions], self._sin[positions]
        key_masks: dict = {}
        for i, (layer, f) in enumerate(zip(ad.layers(), self._layers)):
            q, k, v = self._qkv(layer, f, h, i, positions, cos, sin, decode)
            o = self._attend(q, k, v, i, f, positions, seqlens, layer.attn_scale, key_masks, decode)
            h = self._row_parallel_out(layer.out_proj, o.reshape(B, S, -1), h)
            h = self._mlp_llama(layer, f, h)
        last = h[:, -1:]
        head = ad.lm_head
        if self._backend is not None and isinstance(head, CuteLinear):
            logits = self._norm_linear(ad.final_norm, last, head.weight, head.bias)
        else:
            logits = head(self._norm(ad.final_norm, last))
        if glued:
            self._next_token(logits[:, 0])
            return None
        return greedy_tokens(head, logits)  # a distributed argmax over a vocabulary-parallel head
