"""PyTorch reference for flash_attn: fp32 math, GQA, bottom-right causal alignment."""

from __future__ import annotations

import math

import torch


def flash_attn_ref(q, k, v, *, causal=False, softmax_scale=None, return_lse=False):
    """q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] -> O [B, Sq, Hq, D] (and LSE [B, Hq, Sq] in fp32).

    Causal: query i sees keys j <= i + Sk - Sq. Rows with nothing to attend to give
    zeros and an LSE of -inf.
    """
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    rep = Hq // Hkv
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # fully masked rows: exp(-inf - -inf)
    o = (p @ vf).transpose(1, 2).to(q.dtype)
    return (o, lse) if return_lse else o


def flash_attn_with_kvcache_ref(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None, causal=True,
                                softmax_scale=None):
    """Reference: per sequence, attend to the filled cache (plus k_new/v_new, appended in place)."""
    if k_new is not None:
        append_kv(k_cache, v_cache, cache_seqlens, k_new, v_new)
    s_new = 0 if k_new is None else k_new.shape[1]
    outs = []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b]) + s_new
        outs.append(flash_attn_ref(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], causal=causal,
                                   softmax_scale=softmax_scale))
    return torch.cat(outs)


def flash_attn_varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, softmax_scale=None):
    """Reference for packed sequences: each sequence attended on its own."""
    outs = []
    for b in range(cu_seqlens_q.numel() - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        ks, ke = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if qe == qs:
            continue
        outs.append(flash_attn_ref(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], causal=causal,
                                   softmax_scale=softmax_scale)[0])
    return torch.cat(outs) if outs else q.new_zeros((0, *q.shape[1:]))


def append_kv(k_cache, v_cache, cache_seqlens, k_new, v_new) -> None:
    """Write k_new/v_new [B, S_new, Hkv, D] into the caches at rows cache_seqlens[b] + (0..S_new-1).

    Pure device indexing (no host sync), so it can sit inside a captured CUDA graph.
    """
    B, S_new = k_new.shape[:2]
    rows = cache_seqlens.long()[:, None] + torch.arange(S_new, device=k_new.device)[None, :]
    bidx = torch.arange(B, device=k_new.device)[:, None].expand(B, S_new)
    k_cache[bidx, rows] = k_new
    v_cache[bidx, rows] = v_new
