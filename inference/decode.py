"""Greedy decoding with a static KV cache, one CUDA graph per token, no host sync.

Why our own loop: HF `generate` re-enters Python for every token (logits
processors, stopping criteria, cache bookkeeping, a host sync to test for EOS),
which at GPT-2 sizes costs more than the GPU work. Here the whole decode step -
embedding, all blocks with an in-place KV-cache write, lm_head, argmax, and
moving the token/position/step counters - lives in device tensors at fixed
addresses, so it is captured once in a CUDA graph and replayed N times; the
host only reads the tokens back at the end.

The step calls the model's own submodules (ln, c_attn, c_proj, c_fc, lm_head),
so the same loop runs a patched model (our kernels, fused epilogues) or an
unpatched one (cuBLAS baseline, optionally torch.compile'd): the comparison
only changes the kernels. Prompts in a batch must share one length (no padding),
and generation runs for exactly max_new_tokens (no EOS stop).

The step is GPT-2's (fused c_attn, LayerNorm prologue, learned positions in the glue); the
Llama family's step is `decode_llama.LlamaStaticDecoder` (same loop); `decoders.decoder_for` picks.
`EagerDecoder` is a plain greedy loop over the (patched) model with transformers' cache. `hf_generate` runs
transformers' generate with a dynamic or static cache for comparison.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from cute_kernels.matmul.gemv import GEMV_MAX_M, LN_MAX_K, gemv_enabled
from cute_kernels.runtime import env
from quant.nn import weight_only_eligible

from . import ops
from .adapters import adapter_for
from .next_token import next_token, next_token_buffers, next_token_reference
from .patch import CuteConv1D, CuteLinear, apply_linear
from .tp import greedy_tokens, tp_of

# CUTE_KERNELS_DECODE_GLUE=0 runs the step's glue as the plain torch ops (A/B runs).
GLUE_ENV = "CUTE_KERNELS_DECODE_GLUE"


class _Greedy:
    """generate() in terms of a decoder's prefill / decode / tokens."""

    def _check_prompt(self, input_ids: torch.Tensor) -> tuple[int, int]:
        B, S = input_ids.shape
        if B != self.batch_size:
            raise ValueError(f"batch {B} != decoder batch_size {self.batch_size}")
        if S >= self.max_len:
            raise ValueError(f"prompt length {S} leaves no room in max_len {self.max_len}")
        return B, S

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy tokens [B, max_new_tokens] after the prompt (exactly that many; no EOS stop)."""
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if input_ids.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(f"prompt {input_ids.shape[1]} + {max_new_tokens} new tokens > max_len {self.max_len}")
        self.prefill(input_ids)
        self.decode(max_new_tokens - 1)
        return self.tokens(max_new_tokens)


def capture_graph(fn, warmup: int) -> torch.cuda.CUDAGraph:
    """fn run `warmup` times on a side stream (compiles, autotunes, loads kernels), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


class StaticDecoder(_Greedy):
    """Greedy decoder over a causal LM (through its model adapter, adapters.py) with a
    preallocated [B, H_kv, max_len, D] cache per layer."""

    def __init__(self, model, *, batch_size: int, max_len: int, cuda_graph: bool | None = None,
                 compile: bool | str = False):
        """compile: False, True (Inductor) or a torch.compile backend name; the step is compiled
        with fullgraph=True and then, on CUDA, captured in a CUDA graph like the eager one."""
        self.adapter = ad = adapter_for(model)
        self._check_adapter(ad)
        if max_len > ad.max_positions:
            raise ValueError(f"max_len {max_len} exceeds the model's {ad.max_positions} positions")
        self.model = model
        self.batch_size, self.max_len = batch_size, max_len
        self.head_dim = ad.head_dim
        self.n_head, n_kv_heads = self._local_heads(ad)
        w = ad.token_embedding.weight
        dev, dt = w.device, w.dtype
        shape = (batch_size, n_kv_heads, max_len, self.head_dim)
        # One tensor per layer (not slices of one big tensor): simpler aliasing for torch.compile.
        self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(ad.n_layers)]
        self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(ad.n_layers)]
        self._arange = torch.arange(max_len, device=dev)
        # Decode-step state, all on device at fixed addresses (what the CUDA graph reads/writes).
        self._tok = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)
        self._pos = torch.zeros(1, dtype=torch.long, device=dev)
        self._step = torch.zeros(1, dtype=torch.long, device=dev)
        self._out = torch.zeros(batch_size, max_len, dtype=torch.long, device=dev)
        patch = getattr(model, "cute_patch", None) or {}
        self._flash_backend = patch.get("backend") if patch.get("attention") == "cute" else None
        # TP-invariant arithmetic (inference/invariant.py): K pieces of each row-parallel sum, 0 off.
        self._invariant = getattr(model, "cute_invariant", 0) if self._flash_backend is not None else 0
        # patch_model's fp8 precision: long prompts' attention in FP8 (ops.fp8_attention_takes).
        self._fp8_attention = self._flash_backend is not None and bool(patch.get("fp8_attention"))
        if self._invariant and compile:
            raise ValueError("a tp_invariant model's decoder runs without torch.compile")
        # On our kernels (not under torch.compile) the step's glue - argmax, token and counter
        # bookkeeping, the next step's embedding and attention lengths - is one launch
        # (next_token.py) writing _h and _seqlens, which the next step starts from.
        # Tensor parallelism: the glue's argmax and embedding would see one vocabulary slice.
        self._glue = (self._flash_backend is not None and not compile and env.enabled(GLUE_ENV)
                      and tp_of(model) is None)
        self._h = torch.zeros(batch_size, 1, ad.hidden, device=dev, dtype=dt)
        self._seqlens = torch.zeros(batch_size, dtype=torch.int32, device=dev)
        self._glue_buffers = next_token_buffers(batch_size, dev) if self._glue else None
        self.cuda_graph = (dev.type == "cuda" and max_len >= 3) if cuda_graph is None else cuda_graph
        self._step_fn = self._decode_step
        if compile:
            backend = compile if isinstance(compile, str) else "inductor"
            self._step_fn = torch.compile(self._decode_step, fullgraph=True, dynamic=False, backend=backend)
        self._graph = None

    def _check_adapter(self, ad) -> None:
        if not ad.static_decode:
            raise ValueError(f"StaticDecoder's step is GPT-2's (fused c_attn, LayerNorm, learned positions); "
                             f"a {ad.model.config.model_type} model decodes with LlamaStaticDecoder "
                             f"(decoder_for picks)")

    def _local_heads(self, ad) -> tuple[int, int]:
        """(query heads, KV heads) this decoder's cache and step hold."""
        return ad.n_heads, ad.n_kv_heads

    # ------------------------------------------------------------------ model math

    def _attend_prefill(self, q, k, v, scale):
        """Causal attention over the prompt itself; q/k/v [B, S, H, D] -> [B, S, H, D]."""
        if self._fp8_attention and ops.fp8_attention_takes(q.shape[1], q.shape[-1], True, q.dtype):
            return ops.flash_attn_fp8_from16(q, k, v, True, float(scale), self._flash_backend)
        if self._flash_backend is not None:
            return ops.flash_attn(q, k, v, True, float(scale), self._flash_backend, self._invariant > 0)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=scale, enable_gqa=q.shape[2] != k.shape[2])
        return o.transpose(1, 2)

    @staticmethod
    def _ln_linear_args(lin, x2: torch.Tensor):
        """(weight [N, K], bias, activation, backend, weight_scale, x_scale) of lin for the
        fused LayerNorm + linear op, or None where lin runs as its own module: our bf16
        linears, and 8-bit ones on the GPU at <= 8 rows (weight-only, as their own forward
        does there)."""
        if isinstance(lin, (CuteConv1D, CuteLinear)):
            w = lin.weight.t() if isinstance(lin, CuteConv1D) else lin.weight
            return w, lin.bias, lin.activation or "", lin.backend, None, None
        if weight_only_eligible(lin, x2):
            bias = lin.bias if lin.bias is None or lin.bias.dtype == x2.dtype else lin.bias.to(x2.dtype)
            return lin.weight, bias, lin.activation or "", "cute", lin.weight_scale.view(-1), lin.inv_smooth
        return None

    def _ln_linear(self, ln, lin, x: torch.Tensor) -> torch.Tensor:
        """lin(ln(x)) as one op (LayerNorm in the skinny GEMM's prologue at decode sizes) where
        _ln_linear_args allows it; the two modules otherwise."""
        x2 = x.reshape(-1, x.shape[-1])
        args = self._ln_linear_args(lin, x2)
        if args is None:
            return lin(ln(x))
        w, bias, act, backend, ws, xs = args
        y = ops.ln_linear(x2.contiguous(), ln.weight, ln.bias, float(ln.eps), w, bias, act, backend, ws, xs)
        return y.view(*x.shape[:-1], w.shape[0])

    def _qkv_append(self, ln, lin, x: torch.Tensor, i: int, positions: torch.Tensor):
        """c_attn(ln_1(x)) for one token per sequence, with the new k/v rows written into layer
        i's cache by the same launch (the skinny GEMM's epilogue); None where that path does
        not apply (then the caller appends with index_copy)."""
        x2 = x.reshape(-1, x.shape[-1])
        args = self._ln_linear_args(lin, x2)
        if args is None or args[2] or x.shape[1] != 1 or x2.shape[0] > GEMV_MAX_M:
            return None
        w, bias, _, backend, ws, xs = args
        if backend != "reference" and not (x2.is_cuda and gemv_enabled() and x2.shape[-1] <= LN_MAX_K):
            return None
        return ops.ln_linear_kv(x2.contiguous(), ln.weight, ln.bias, float(ln.eps), w, bias, self.k[i], self.v[i],
                                positions, backend, ws, xs).view(*x.shape[:-1], w.shape[0])

    def _mlp(self, layer, h: torch.Tensor) -> torch.Tensor:
        """h + mlp(norm(h)): mlp_in with the norm in its prologue (at decode sizes), then mlp_out
        with the residual in its epilogue."""
        return apply_linear(layer.mlp_out, layer.mlp_act(self._ln_linear(layer.mlp_norm, layer.mlp_in, h)), h)

    def _step_inputs(self, tokens: torch.Tensor, positions: torch.Tensor, decode: bool):
        """(glued, h, seqlens) at the start of a forward: a glued decode step starts from what the
        previous step's glue left (h and the attention lengths); otherwise the embedding, and for
        decode the lengths pos + 1 (keys 0..pos are valid; everything after is stale or zero)."""
        glued = decode and self._glue
        if glued:
            return True, self._h, self._seqlens
        h = self.adapter.embed(tokens, positions)
        seqlens = (positions[-1:] + 1).to(torch.int32).expand(tokens.shape[0]).contiguous() if decode else None
        return False, h, seqlens

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, decode: bool) -> torch.Tensor:
        """Run tokens [B, S] at positions [S]; write the cache; return the greedy next token [B, 1]
        (None for a glued decode step, whose glue launch stored it and moved the counters on)."""
        ad = self.adapter
        B, S = tokens.shape
        glued, h, seqlens = self._step_inputs(tokens, positions, decode)
        if decode and not glued:
            mask = (self._arange <= positions[-1]).view(1, 1, 1, -1)
        for i, layer in enumerate(ad.layers()):
            qkv = self._qkv_append(layer.attn_norm, layer.qkv, h, i, positions) if decode else None
            if qkv is not None:
                q = qkv.view(B, S, 3, self.n_head, self.head_dim)[:, :, 0]
            else:
                q, k, v = self._ln_linear(layer.attn_norm, layer.qkv, h).view(B, S, 3, self.n_head,
                                                                               self.head_dim).unbind(2)
                self.k[i].index_copy_(2, positions, k.transpose(1, 2))
                self.v[i].index_copy_(2, positions, v.transpose(1, 2))
            if decode and self._flash_backend is not None:  # our decode kernel on the first pos+1 keys
                o = ops.attend_cache(q, self.k[i].transpose(1, 2), self.v[i].transpose(1, 2), seqlens,
                                     layer.attn_scale, self._flash_backend)
            elif decode:  # masked SDPA over the whole buffer
                o = F.scaled_dot_product_attention(q.transpose(1, 2), self.k[i], self.v[i], attn_mask=mask,
                                                   scale=layer.attn_scale).transpose(1, 2)
            else:
                o = self._attend_prefill(q, k, v, layer.attn_scale)
            h = apply_linear(layer.out_proj, o.reshape(B, S, -1), h)
            h = self._mlp(layer, h)
        logits = self._ln_linear(ad.final_norm, ad.lm_head, h[:, -1:])
        if glued:
            self._next_token(logits[:, 0])
            return None
        return greedy_tokens(ad.lm_head, logits)  # a distributed argmax over a vocabulary-parallel head

    def _next_token(self, logits: torch.Tensor) -> None:
        """The glue after the lm_head (next_token.py): token, counters, next h and lengths."""
        wpe = self.adapter.position_embedding
        wte, wpe = self.adapter.token_embedding.weight, None if wpe is None else wpe.weight
        args = (logits, wte, wpe, self._tok, self._out, self._pos, self._step, self._h, self._seqlens)
        if self._flash_backend == "cute" and logits.is_cuda:
            next_token(*args, self._glue_buffers)
        else:
            next_token_reference(*args)

    def _prime_glue(self, first: torch.Tensor, pos: int) -> None:
        """What the glue would have left after the prompt: h and lengths for position pos."""
        if self._glue:
            self._h.copy_(self.adapter.embed(first, self._arange[pos:pos + 1]))
            self._seqlens.fill_(pos + 1)

    def _decode_step(self):
        nxt = self._forward(self._tok, self._pos, decode=True)
        if nxt is None:  # the glue launch (next_token.py) did the bookkeeping below
            return
        self._out.index_copy_(1, self._step, nxt)
        self._tok.copy_(nxt)
        self._pos.add_(1)
        self._step.add_(1)

    # ------------------------------------------------------------------ driving

    def _capture(self):
        """Warm up (compiles, autotunes, JIT-builds kernels) on a side stream, then capture one step.

        The warm-up really runs three steps. Run them at positions 0..2 and put
        back everything they touch (counters, token, output and cache rows 0..2),
        so capturing has no effect on a generation in progress.
        """
        state = [self._tok, self._pos, self._step, self._out[:, :3], self._h, self._seqlens]
        state += [t[:, :, :3] for t in self.k + self.v]
        saved = [t.clone() for t in state]
        self._pos.zero_()
        self._step.zero_()
        self._graph = capture_graph(self._step_fn, warmup=3)
        for dst, src in zip(state, saved):
            dst.copy_(src)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> None:
        """Fill the cache with the prompt and set up the first decode step."""
        S = self._check_prompt(input_ids)[1]
        first = self._forward(input_ids, torch.arange(S, device=input_ids.device), decode=False)
        self._out[:, :1].copy_(first)
        self._tok.copy_(first)
        self._pos.fill_(S)
        self._step.fill_(1)
        self._prime_glue(first, S)

    @torch.no_grad()
    def decode(self, n_steps: int) -> None:
        """n_steps more greedy tokens, queued without waiting for any of them."""
        if self.cuda_graph and self._graph is None and n_steps > 0:
            self._capture()
        for _ in range(n_steps):
            if self._graph is not None:
                self._graph.replay()
            else:
                self._step_fn()

    @torch.no_grad()
    def step(self) -> None:
        """One decode step run directly (not replayed): what a profiler should look at."""
        self._step_fn()

    def tokens(self, n: int) -> torch.Tensor:
        """The first n generated tokens [B, n] of the current generation."""
        return self._out[:, :n].clone()


class EagerDecoder(_Greedy):
    """Greedy decoding through the model's own forward with transformers' dynamic cache, one
    eager forward per token (no CUDA graph): the plain loop the static decoders are checked
    against. Same interface as StaticDecoder; prompts in a batch share one length, and it
    runs for exactly max_new_tokens."""

    cuda_graph = False

    def __init__(self, model, *, batch_size: int, max_len: int):
        ad = adapter_for(model)
        if max_len > ad.max_positions:
            raise ValueError(f"max_len {max_len} exceeds the model's {ad.max_positions} positions")
        self.model, self.batch_size, self.max_len = model, batch_size, max_len
        self._out: list[torch.Tensor] = []
        self._cache = None
        self._len = 0
        # transformers renamed past_key_values to cache within the supported range.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def _step(self, tokens: torch.Tensor) -> None:
        from transformers import DynamicCache

        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=tokens, use_cache=True, **{self._cache_arg: self._cache}).logits
        self._len += tokens.shape[1]
        self._out.append(logits[:, -1:].argmax(-1))

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> None:
        self._check_prompt(input_ids)
        self._out, self._cache, self._len = [], None, 0
        self._step(input_ids)

    @torch.no_grad()
    def decode(self, n_steps: int) -> None:
        if self._len + n_steps > self.max_len:
            raise ValueError(f"{n_steps} more steps pass max_len {self.max_len}")
        for _ in range(n_steps):
            self._step(self._out[-1])

    def tokens(self, n: int) -> torch.Tensor:
        return torch.cat(self._out[:n], dim=1)



@torch.no_grad()
def hf_generate(model, input_ids: torch.Tensor, max_new_tokens: int, cache: str = "dynamic") -> torch.Tensor:
    """transformers' greedy generate (exactly max_new_tokens); returns only the new tokens [B, N].

    cache="static" preallocates the KV cache; on CUDA transformers then compiles
    the decode step (mode="reduce-overhead", i.e. CUDA graphs) by itself.
    """
    if cache not in ("dynamic", "static"):
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    # eos_token_id=None: never stop early, so the result is comparable with StaticDecoder
    # (min_new_tokens would instead suppress EOS logits and change the greedy choice).
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                         do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=0, **kw)
    return out[:, input_ids.shape[1]:]
