"""The kernels the patched model calls, registered as torch custom ops.

Each op is a `torch.library.custom_op` with a `register_fake`, so Dynamo treats it
as one opaque node (no graph break, no tracing into CuTe host code) and CUDA
graphs capture the launch like any aten kernel. The `backend` argument picks the
CuTe kernel ("cute") or the pure-PyTorch reference ("reference", used on CPU
and in tests); it is a plain string so it is part of the op call, not of global
state that a compiled graph could bake in silently.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

BACKENDS = ("cute", "reference")


def _cute():
    import cute_kernels

    return cute_kernels


def row_padded(n: int, dtype: torch.dtype) -> int:
    """The kernel's padded row length for n columns (16-byte rows): the width `linear` returns."""
    from cute_kernels.matmul.api import padded_n

    return padded_n(n, dtype)


@torch.library.custom_op("cute_inference::linear", mutates_args=())
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045  (custom_op schema inference: keep typing.Optional)
    residual: Optional[torch.Tensor],  # noqa: UP045
    activation: str,
    alpha: float,
    beta: float,
    backend: str,
) -> torch.Tensor:
    """act(alpha * x @ weight.T + bias) + beta * residual; x [M, K], weight [N, K].

    Returns [M, row_padded(N)]: the kernel writes N columns into rows padded to 16
    bytes (GPT-2's vocabulary, 50257 -> 50264), and the op hands back the whole
    buffer so that callers take `[:, :N]` as a view. The padding columns hold
    unspecified values. Returning the N-wide tensor instead would cost a copy of
    the logits (1 ms of GPT-2 XL's 8 x 1024 prefill), since a custom op's result
    must have the strides its fake promises.
    """
    act = activation or None
    if backend == "reference":
        from cute_kernels.matmul.reference import linear_ref

        y = linear_ref(x, weight, bias, activation=act, residual=residual, alpha=alpha, beta=beta)
        n_p = row_padded(y.shape[1], y.dtype)
        return y if n_p == y.shape[1] else F.pad(y, (0, n_p - y.shape[1]))
    out = _cute().linear(x, weight, bias, activation=act, residual=residual, alpha=alpha, beta=beta)
    if out.is_contiguous():
        return out
    # A view of the kernel's row-padded buffer: widen it back to the whole rows.
    return out.as_strided((out.shape[0], out.stride(0)), (out.stride(0), 1))


@linear.register_fake
def _(x, weight, bias, residual, activation, alpha, beta, backend):
    return x.new_empty((x.shape[0], row_padded(weight.shape[0], x.dtype)))


@torch.library.custom_op("cute_inference::ln_linear", mutates_args=())
def ln_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045
    activation: str,
    backend: str,
    weight_scale: Optional[torch.Tensor] = None,  # noqa: UP045
    x_scale: Optional[torch.Tensor] = None,  # noqa: UP045
) -> torch.Tensor:
    """linear(LayerNorm(x)); x [M, K], weight [N, K]. One launch at decode sizes (gemv prologue).

    With weight_scale [N] (fp32), weight is fp8/int8 and the product is weight-only
    quantized: (LN(x) * x_scale) @ (weight * weight_scale).T, for <= 8 rows only."""
    if weight_scale is not None:
        if backend == "reference":
            h = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps).float()
            h = h * (x_scale if x_scale is not None else 1.0)
            y = h @ (weight.float() * weight_scale[:, None]).t() + (bias.float() if bias is not None else 0.0)
            from cute_kernels.matmul.reference import apply_activation

            return apply_activation(y, activation or None).to(x.dtype)
        from cute_kernels.matmul.gemv import skinny_gemm

        return skinny_gemm(x.contiguous(), weight, bias, activation or None, ln=(ln_weight, ln_bias, eps),
                           w_scale=weight_scale, x_scale=x_scale)
    if backend == "reference":
        h = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps)
        return linear(h, weight, bias, None, activation, 1.0, 1.0, backend)[:, : weight.shape[0]].contiguous()
    out = _cute().layernorm_linear(x, ln_weight, ln_bias, weight, bias, eps=eps, activation=activation or None)
    return out if out.is_contiguous() else out.contiguous()


@ln_linear.register_fake
def _(x, ln_weight, ln_bias, eps, weight, bias, activation, backend, weight_scale=None, x_scale=None):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("cute_inference::ln_linear_kv", mutates_args=("k_cache", "v_cache"))
def ln_linear_kv(
    x: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    backend: str,
    weight_scale: Optional[torch.Tensor] = None,  # noqa: UP045
    x_scale: Optional[torch.Tensor] = None,  # noqa: UP045
) -> torch.Tensor:
    """GPT-2's ln_1 -> c_attn for one decode token per sequence (x [M <= 8, K]), which also
    appends the new keys and values (columns [C, 2C) and [2C, 3C) of the result, C = N / 3)
    to k_cache/v_cache [B, H, Smax, D] at row pos (one position for every row). On the GPU
    the append is the skinny GEMM's epilogue: no copy launches."""
    if backend == "reference":
        y = ln_linear(x, ln_weight, ln_bias, eps, weight, bias, "", backend, weight_scale, x_scale)
        M, C = y.shape[0], y.shape[1] // 3
        H, D = k_cache.shape[1], k_cache.shape[3]
        rows, at = torch.arange(M, device=y.device), pos.long().expand(M)
        k_cache[rows, :, at] = y[:, C:2 * C].reshape(M, H, D)
        v_cache[rows, :, at] = y[:, 2 * C:].reshape(M, H, D)
        return y
    from cute_kernels.matmul.gemv import skinny_gemm

    return skinny_gemm(x.contiguous(), weight, bias, None, ln=(ln_weight, ln_bias, eps), w_scale=weight_scale,
                       x_scale=x_scale, kv=(k_cache, v_cache, pos))


@ln_linear_kv.register_fake
def _(x, ln_weight, ln_bias, eps, weight, bias, k_cache, v_cache, pos, backend, weight_scale=None, x_scale=None):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("cute_inference::layer_norm", mutates_args=())
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, backend: str) -> torch.Tensor:
    """LayerNorm over the last dim, in x's dtype. backend "cute": the Triton kernel shared
    with the fused LayerNorm-quantize (one read, one write; on the H100 it replaces torch's
    kernel in the 16-bit prefill) for 16-bit x with rows of <= 8192; torch's otherwise."""
    K = x.shape[-1]
    if backend == "cute" and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and 0 < K <= 8192 \
            and x.numel():
        from quant._triton import layernorm_triton

        return layernorm_triton(x.reshape(-1, K).contiguous(), weight.contiguous(), bias.contiguous(),
                                eps).view(x.shape)
    return F.layer_norm(x, (K,), weight, bias, eps)


@layer_norm.register_fake
def _(x, weight, bias, eps, backend):
    return x.new_empty(x.shape)


def flash_attn_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float) -> torch.Tensor:
    """Reference for cute_kernels.flash_attn: q [B, S, Hq, D], k/v [B, L, Hkv, D] -> [B, S, Hq, D]
    (GQA: Hq a multiple of Hkv, query head h reads kv head h // (Hq // Hkv)).

    Causal masking is top-left aligned (query i sees keys 0..i), as in SDPA's is_causal.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2).contiguous()


@torch.library.custom_op("cute_inference::flash_attn", mutates_args=())
def flash_attn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float, backend: str,
    invariant: bool = False,
) -> torch.Tensor:
    """Attention on [B, S, H, D] tensors (the layout HF hands back to c_proj). invariant: each
    head's result independent of the batch and head counts (cute_kernels.flash_attn's
    invariant=; the reference is per head already)."""
    if backend == "reference":
        return flash_attn_ref(q, k, v, causal, softmax_scale)
    out = _cute().flash_attn(q, k, v, causal=causal, softmax_scale=softmax_scale, invariant=invariant)
    return out if out.is_contiguous() else out.contiguous()


@flash_attn.register_fake
def _(q, k, v, causal, softmax_scale, backend, invariant=False):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


# Where the FP8 prefill path (quantize_qkv_fp8, then flash_attn_fp8) ran faster than our bf16
# kernel on bf16 Q, K, V: H200, `python -m benchmarks.attention --fp8` (`cute_fp8_quant` rows of
# attention_fp8_h200.md), ~16k tokens a call, causal and not, 32 query heads on 32 or 4 KV heads.
# Head dim 128 from 4096 tokens: 1.00x-1.43x (11 shapes of 12 above 1.15x); head dim 64 from 8192:
# 1.06x-1.20x; at 4096 with head dim 64 the two quantization passes cost more than the fp8
# products save (0.88x-1.05x).
FP8_ATTENTION_MIN_SEQLEN = {64: 8192, 128: 4096}


def fp8_attention_takes(seqlen: int, head_dim: int, causal: bool, dtype: torch.dtype) -> bool:
    """Whether a bf16 prefill of `seqlen` queries and keys runs flash_attn_fp8_from16."""
    return (causal and dtype == torch.bfloat16 and head_dim in FP8_ATTENTION_MIN_SEQLEN
            and seqlen >= FP8_ATTENTION_MIN_SEQLEN[head_dim])


def flash_attn_fp8_from16_ref(q, k, v, causal: bool, softmax_scale: float) -> torch.Tensor:
    """Reference for flash_attn_fp8_from16: the same quantization, then attention in fp64 on
    the dequantized values, in q's dtype."""
    from cute_kernels.attention.reference import flash_attn_fp8_ref, quantize_qkv_fp8_ref

    q8, k8, v8, qd, kd, vd = quantize_qkv_fp8_ref(q, k, v)
    out = flash_attn_fp8_ref(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal,
                             softmax_scale=softmax_scale)
    return out.to(q.dtype).contiguous()


@torch.library.custom_op("cute_inference::flash_attn_fp8_from16", mutates_args=())
def flash_attn_fp8_from16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
                          backend: str) -> torch.Tensor:
    """flash_attn's call on bf16 [B, S, H, D] tensors run in FP8: Q, K and V quantized with one
    scale per (batch, KV head) (cute_kernels.quantize_qkv_fp8), then cute_kernels.flash_attn_fp8."""
    if backend == "reference":
        return flash_attn_fp8_from16_ref(q, k, v, causal, softmax_scale)
    ck = _cute()
    q8, k8, v8, qd, kd, vd = ck.quantize_qkv_fp8(q, k, v)
    out = ck.flash_attn_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal,
                            softmax_scale=softmax_scale)
    return out if out.is_contiguous() else out.contiguous()


@flash_attn_fp8_from16.register_fake
def _(q, k, v, causal, softmax_scale, backend):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def attend_cache_ref(q, k_cache, v_cache, seqlens, softmax_scale, key_mask=None):
    """Reference for attend_cache: q [B, 1, Hq, D] against the first seqlens[b] rows of
    k/v_cache [B, L, Hkv, D] (masked SDPA over the whole buffer; GQA as in flash_attn_ref),
    those where key_mask is True."""
    L = k_cache.shape[1]
    mask = torch.arange(L, device=q.device)[None, :] < seqlens.long()[:, None]
    if key_mask is not None:
        mask = mask & key_mask.bool()
    mask = mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                         attn_mask=mask, scale=softmax_scale, enable_gqa=q.shape[2] != k_cache.shape[2])
    return out.transpose(1, 2).contiguous()


@torch.library.custom_op("cute_inference::attend_cache", mutates_args=())
def attend_cache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor, softmax_scale: float,
    backend: str, key_mask: Optional[torch.Tensor] = None,  # noqa: UP045
    invariant: bool = False,
) -> torch.Tensor:
    """One decode step's attention against a KV cache (cute_kernels.flash_attn_with_kvcache,
    the cache already written): q [B, 1, Hq, D], caches [B, L, Hkv, D] (any strides, unit D;
    Hq a multiple of Hkv);
    key_mask [B, L] bool (True = attend) on top of the lengths. invariant: as in flash_attn."""
    if backend == "reference":
        out = attend_cache_ref(q, k_cache, v_cache, seqlens, softmax_scale, key_mask)
        # Rows with nothing to attend to: zeros, as the kernel gives (SDPA gives NaN).
        return out if key_mask is None else out.nan_to_num(0.0)
    # The next kernel is the output projection's GEMV, which loads only its weights before its
    # own PDL wait: the attention may let it launch first (the decode chain runs ahead).
    return _cute().flash_attn_with_kvcache(q, k_cache, v_cache, seqlens, softmax_scale=softmax_scale,
                                           key_mask=key_mask, early_trigger=True, invariant=invariant)


@attend_cache.register_fake
def _(q, k_cache, v_cache, seqlens, softmax_scale, backend, key_mask=None, invariant=False):
    return q.new_empty(q.shape)


def cute_attention_available() -> tuple[bool, str]:
    """Whether cute_kernels.flash_attn can be imported here (and why not)."""
    try:
        fn = _cute().flash_attn
    except (AttributeError, ImportError) as e:
        return False, f"cute_kernels.flash_attn is not available ({type(e).__name__}: {e})"
    return callable(fn), "ok"


# --------------------------------------------------------------------------- Llama-family decode ops


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama / Qwen2 / Mistral RMSNorm with its two roundings: fp32 statistics,
    the normalised value rounded to x's dtype, then multiplied by the weight."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half_ref(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: half-split (NeoX) pairs (i, i + D/2)."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor, in its dtype: x * cos + rotate_half(x) * sin
    (cos, sin broadcast against x)."""
    return (x * cos) + (rotate_half_ref(x) * sin)


@torch.library.custom_op("cute_inference::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str) -> torch.Tensor:
    """transformers' Llama RMSNorm over the last dim (rms_norm_ref); backend "cute": one Triton
    launch for 16-bit x on CUDA with a weight of its dtype, the reference otherwise."""
    K = x.shape[-1]
    if backend == "cute" and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype \
            and x.numel():
        from .llama_kernels import rms_norm_triton

        return rms_norm_triton(x.reshape(-1, K).contiguous(), weight.contiguous(), eps).view(x.shape)
    return rms_norm_ref(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps, backend):
    return x.new_empty(x.shape)


@torch.library.custom_op("cute_inference::rms_linear", mutates_args=())
def rms_linear(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
    bias: Optional[torch.Tensor], backend: str,  # noqa: UP045
) -> torch.Tensor:
    """linear(RMSNorm(x)) for x [M, K] (transformers' rounding, rms_norm_ref); on the GPU one
    launch of the skinny GEMV with the norm in its prologue (M <= 8, K <= 8192)."""
    if backend == "reference":
        h = rms_norm_ref(x, norm_weight, eps)
        return linear(h, weight, bias, None, "", 1.0, 1.0, backend)[:, : weight.shape[0]].contiguous()
    from cute_kernels.matmul.gemv import skinny_gemm

    return skinny_gemm(x.contiguous(), weight, bias, rms=(norm_weight, eps))


@rms_linear.register_fake
def _(x, norm_weight, eps, weight, bias, backend):
    return x.new_empty((x.shape[0], weight.shape[0]))


def swiglu_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of [M, 2I] = [gate | up], in its dtype (silu rounded before the product, as
    transformers' LlamaMLP)."""
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


@torch.library.custom_op("cute_inference::rms_swiglu", mutates_args=())
def rms_swiglu(
    x: torch.Tensor, norm_weight: Optional[torch.Tensor], eps: float, gate_up: torch.Tensor,  # noqa: UP045
    backend: str,
) -> torch.Tensor:
    """silu(RMSNorm(x) @ gate.T) * (RMSNorm(x) @ up.T) with gate_up = [gate; up] ([2I, K]); without
    norm_weight, x itself. On the GPU one launch of the skinny GEMV (M <= 8): each program
    holds matching gate and up rows and writes only the [M, I] product."""
    if backend == "reference":
        h = x if norm_weight is None else rms_norm_ref(x, norm_weight, eps)
        y = linear(h, gate_up, None, None, "", 1.0, 1.0, backend)[:, : gate_up.shape[0]]
        return swiglu_ref(y).contiguous()
    from cute_kernels.matmul.gemv import skinny_gemm

    return skinny_gemm(x.contiguous(), gate_up, rms=None if norm_weight is None else (norm_weight, eps), swiglu=True)


@rms_swiglu.register_fake
def _(x, norm_weight, eps, gate_up, backend):
    return x.new_empty((x.shape[0], gate_up.shape[0] // 2))


def rope_append_ref(qkv, cos, sin, pos, k_cache, v_cache, n_q_heads: int) -> torch.Tensor:
    """Reference for rope_append (in place on the caches; returns q)."""
    M = qkv.shape[0]
    Hkv, D = k_cache.shape[1], k_cache.shape[3]
    qd, kd = n_q_heads * D, Hkv * D
    c, s = cos[pos.long()].view(-1, 1, D), sin[pos.long()].view(-1, 1, D)
    q = rope_ref(qkv[:, :qd].reshape(M, n_q_heads, D), c, s)
    k = rope_ref(qkv[:, qd:qd + kd].reshape(M, Hkv, D), c, s)
    rows, at = torch.arange(M, device=qkv.device), pos.long().expand(M)
    k_cache[rows, :, at] = k
    v_cache[rows, :, at] = qkv[:, qd + kd:qd + 2 * kd].reshape(M, Hkv, D)
    return q.contiguous()


@torch.library.custom_op("cute_inference::rope_append", mutates_args=("k_cache", "v_cache"))
def rope_append(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
    v_cache: torch.Tensor, n_q_heads: int, backend: str,
) -> torch.Tensor:
    """One decode token per sequence: qkv [M, (Hq + 2 Hkv) D] ([q | k | v], head-major) ->
    RoPE'd q [M, Hq, D], with RoPE'd k and v written to k_cache / v_cache [B >= M, Hkv, Smax, D]
    at row pos (pos: one int64 position for every row; cos / sin [Smax, D] tables in qkv's
    dtype, transformers' roundings: rope_ref). One launch on the GPU."""
    if backend == "reference":
        return rope_append_ref(qkv, cos, sin, pos, k_cache, v_cache, n_q_heads)
    from .llama_kernels import rope_append_triton

    return rope_append_triton(qkv, cos, sin, pos, k_cache, v_cache, n_q_heads)


@rope_append.register_fake
def _(qkv, cos, sin, pos, k_cache, v_cache, n_q_heads, backend):
    return qkv.new_empty((qkv.shape[0], n_q_heads, k_cache.shape[3]))


# --------------------------------------------------------------------------- Llama-family prefill ops

_HALF = (torch.bfloat16, torch.float16)


@torch.library.custom_op("cute_inference::rope_prefill", mutates_args=())
def rope_prefill(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb for q [B, Hq, S, D] and k [B, Hk, S, D] with the
    rotary embedding's cos / sin [B, S, D], in their dtype (rope_ref's roundings). Backend
    "cute": one Triton launch for 16-bit CUDA tensors (power-of-two D), the reference otherwise."""
    from .llama_kernels import check_rope_prefill

    check_rope_prefill(q, k, cos, sin)
    D = q.shape[-1]
    if backend == "cute" and q.is_cuda and q.dtype in _HALF and not D & (D - 1):
        from .llama_kernels import rope_prefill_triton

        return rope_prefill_triton(q, k, cos, sin)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return rope_ref(q, c, s), rope_ref(k, c, s)


@rope_prefill.register_fake
def _(q, k, cos, sin, backend):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("cute_inference::swiglu_linear", mutates_args=())
def swiglu_linear(x: torch.Tensor, gate_up: torch.Tensor, backend: str) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for gate_up = [gate; up] ([2I, K]) with transformers'
    roundings. Backend "cute": one GEMM whose epilogue writes only the [..., I] product
    (cute_kernels.swiglu_linear, silu from approximate exp2 / reciprocal); the reference runs
    the linear op and transformers' torch ops."""
    if backend == "cute":
        return _cute().swiglu_linear(x, gate_up)
    # The linear op takes x [M, K] (its output rows are padded to 16 bytes: keep 2I columns).
    y = linear(x.reshape(-1, x.shape[-1]), gate_up, None, None, "", 1.0, 1.0, backend)[:, : gate_up.shape[0]]
    return swiglu_ref(y).reshape(*x.shape[:-1], -1)


@swiglu_linear.register_fake
def _(x, gate_up, backend):
    return x.new_empty((*x.shape[:-1], gate_up.shape[0] // 2))


@torch.library.custom_op("cute_inference::silu_mul", mutates_args=())
def silu_mul(gate: torch.Tensor, up: torch.Tensor, backend: str) -> torch.Tensor:
    """F.silu(gate) * up in their dtype (silu rounded before the product, as transformers'
    LlamaMLP), contiguous. Backend "cute": one Triton launch for 16-bit CUDA tensors; gate and
    up may be strided views (the halves of one [gate | up] GEMM output)."""
    from .llama_kernels import check_silu_mul

    check_silu_mul(gate, up)
    if backend == "cute" and gate.is_cuda and gate.dtype in _HALF and gate.numel():
        from .llama_kernels import silu_mul_triton

        N = gate.shape[-1]
        g, u = gate.reshape(-1, N), up.reshape(-1, N)
        g, u = (t if t.stride(-1) == 1 else t.contiguous() for t in (g, u))
        return silu_mul_triton(g, u).view(gate.shape)
    return (F.silu(gate) * up).contiguous()


@silu_mul.register_fake
def _(gate, up, backend):
    return gate.new_empty(gate.shape)
