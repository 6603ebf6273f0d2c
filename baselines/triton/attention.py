"""FlashAttention-style forward pass in Triton ([B, S, H, D] layout, GQA, causal).

One program computes a BLOCK_M slice of query rows for one (batch, head),
streaming over keys in BLOCK_N blocks with the online softmax in base 2
(scores are pre-multiplied by log2(e) so each exponential is a single exp2).

The key loop is split in two: blocks that no mask touches run without any
masking arithmetic, and only the blocks on the causal diagonal or the ragged
end of the sequence pay for the mask. The causal mask is aligned to the
bottom-right corner (query i sees keys j <= i + Sk - Sq), as FlashAttention
does, so a decode step (Sq = 1) sees the whole cache.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, cast_to, check_same_device, check_tensor, mma

_LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)


def _cfg(bm, bn, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


if INTERPRET:
    _CONFIGS = [_cfg(16, 16, 4, 1)]
else:
    _CONFIGS = [
        _cfg(128, 128, 8, 3),
        _cfg(128, 128, 8, 2),
        _cfg(128, 64, 8, 3),
        _cfg(128, 64, 4, 3),
        _cfg(128, 64, 4, 4),
        _cfg(64, 128, 4, 3),
        _cfg(64, 64, 4, 3),
        _cfg(64, 64, 4, 4),
        _cfg(64, 32, 4, 4),
    ]


@triton.jit
def _attend_block(
    acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, offs_m, offs_n,
    seqlen_k, causal_shift, qk_scale,
    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
):
    cols = start_n + offs_n
    if MASKED:
        k = tl.load(k_ptrs, mask=cols[:, None] < seqlen_k, other=0.0)
    else:
        k = tl.load(k_ptrs)
    s = mma(q, tl.trans(k)) * qk_scale
    if MASKED:
        keep = cols[None, :] < seqlen_k
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + causal_shift)
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_sub = m_new
    if MASKED:
        # A row that has seen no key yet has m = -inf; subtract 0 instead so
        # exp2(-inf - -inf) does not give NaN (m itself stays -inf).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_sub[:, None])
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_ptrs, mask=cols[:, None] < seqlen_k, other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = mma(cast_to(p, v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    n_heads, kv_group, seqlen_q, seqlen_k, qk_scale,
    SQ_BUCKET: tl.constexpr, SK_BUCKET: tl.constexpr,  # autotune key only
    HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    h_kv = h // kv_group  # GQA: kv_group query heads share one K/V head

    # (batch, head) bases in int64: B * S * H * D can pass 2**31
    q_ptr += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_ptr += b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_ptr += b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    o_ptr += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * stride_qs + offs_d[None, :], mask=offs_m[:, None] < seqlen_q, other=0.0)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    # Key range [0, hi) this block of rows can see, and the prefix [0, lo) of
    # whole blocks that every row sees in full (no mask needed).
    causal_shift = seqlen_k - seqlen_q
    if IS_CAUSAL:
        hi = tl.minimum(seqlen_k, start_m + BLOCK_M + causal_shift)
        lo = tl.minimum(seqlen_k, start_m + causal_shift + 1)
    else:
        hi = seqlen_k
        lo = seqlen_k
    hi = tl.maximum(hi, 0)
    lo = (tl.maximum(lo, 0) // BLOCK_N) * BLOCK_N

    k_ptrs = k_ptr + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = v_ptr + offs_n[:, None] * stride_vs + offs_d[None, :]
    for start_n in range(0, lo, BLOCK_N):
        acc, l_i, m_i = _attend_block(
            acc, l_i, m_i, q, k_ptrs + start_n * stride_ks, v_ptrs + start_n * stride_vs, start_n, offs_m, offs_n,
            seqlen_k, causal_shift, qk_scale, MASKED=False, IS_CAUSAL=IS_CAUSAL,
        )
    for start_n in range(lo, hi, BLOCK_N):
        acc, l_i, m_i = _attend_block(
            acc, l_i, m_i, q, k_ptrs + start_n * stride_ks, v_ptrs + start_n * stride_vs, start_n, offs_m, offs_n,
            seqlen_k, causal_shift, qk_scale, MASKED=True, IS_CAUSAL=IS_CAUSAL,
        )

    # Rows that saw no key (causal with Sq > Sk) have l = 0: emit zeros.
    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    row_ok = offs_m < seqlen_q
    tl.store(
        o_ptr + offs_m[:, None] * stride_os + offs_d[None, :],
        cast_to(acc, o_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    if STORE_LSE:
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * _LN2)
        tl.store(lse_ptr + bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)


_attn_fwd = triton.autotune(configs=_CONFIGS, key=["SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "IS_CAUSAL"])(
    _attn_fwd_kernel
)


def _bucket(n: int) -> int:
    """Sequence lengths rounded up to a power of two (>= 16) for the autotune key,
    so a growing KV cache does not re-tune at every step."""
    return max(16, triton.next_power_of_2(n))


def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
):
    """softmax(q k^T * scale [+ causal mask]) v for q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D].

    Hq must be a multiple of Hkv (grouped-query attention). D in {64, 128};
    bf16 or fp16; any strides as long as D is contiguous. The causal mask is
    bottom-right aligned. Rows with no key to attend to give zeros (LSE -inf).
    Returns O [B, Sq, Hq, D] in q's dtype, and with return_lse also the fp32
    log-sum-exp of the scaled scores, [B, Hq, Sq].
    """
    dtypes = (torch.bfloat16, torch.float16)
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        check_tensor(t, n, ndim=4, dtypes=dtypes)
    check_same_device(("q", q), ("k", k), ("v", v))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Sq, Hq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    Bk, Sk, Hkv, Dk = k.shape
    if Bk != B or Dk != D:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch and head dim ([B, S, H, D])")
    if D not in (64, 128):
        raise ValueError(f"head dim must be 64 or 128, got {D}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    out = torch.empty((B, Sq, Hq, D), device=q.device, dtype=q.dtype)
    for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
        if t.stride(-1) != 1:
            raise ValueError(f"{n} must be contiguous in its last (head) dimension, got strides {t.stride()}")
        # offsets inside one (batch, head) are int32 in the kernel
        if t.shape[1] and t.stride(1) * (t.shape[1] - 1) + D > 2**31 - 1:
            raise ValueError(f"{n}: one head spans more than 2**31 elements; split the sequence")
    if B * Hq > 65535:
        raise ValueError(f"batch * heads must be <= 65535 (grid limit), got {B * Hq}")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)

    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32) if return_lse else None
    if out.numel():
        if Sk == 0:
            out.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
        else:
            grid = lambda meta: (triton.cdiv(Sq, meta["BLOCK_M"]), B * Hq)
            _attn_fwd[grid](
                q, k, v, out, lse,
                q.stride(0), q.stride(1), q.stride(2),
                k.stride(0), k.stride(1), k.stride(2),
                v.stride(0), v.stride(1), v.stride(2),
                out.stride(0), out.stride(1), out.stride(2),
                Hq, Hq // Hkv, Sq, Sk, scale * _LOG2E,
                SQ_BUCKET=_bucket(Sq), SK_BUCKET=_bucket(Sk),
                HEAD_DIM=D, IS_CAUSAL=bool(causal), STORE_LSE=return_lse,
            )
    return (out, lse) if return_lse else out
