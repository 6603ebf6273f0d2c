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


def _dequant(t, descale, rep):
    """e4m3 [B, S, H, D] times its per-(batch, KV head) descale, in float64."""
    d = descale.double() if descale is not None else torch.ones(t.shape[0], t.shape[2] // rep, dtype=torch.float64,
                                                                 device=t.device)
    return t.double() * d.repeat_interleave(rep, dim=1)[:, None, :, None]


def flash_attn_fp8_ref(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, causal=False, softmax_scale=None):
    """flash_attn_fp8's exact math on the dequantized inputs, in float64: O [B, Sq, Hq, D]."""
    rep = q.shape[2] // k.shape[2]
    return flash_attn_ref(_dequant(q, q_descale, rep), _dequant(k, k_descale, 1), _dequant(v, v_descale, 1),
                          causal=causal, softmax_scale=softmax_scale)


E4M3_MAX = 448.0


def quantize_qkv_fp8_ref(q, k, v):
    """What attention.api.quantize_qkv_fp8 computes, in torch ops: each (batch, KV head) of k
    and v, and each (batch, KV head) group of q's heads, scaled so its largest magnitude maps
    to e4m3's 448, rounded to nearest even; float32 [B, Hkv] descales undo it."""
    B, Hkv = k.shape[0], k.shape[2]
    tiny = torch.finfo(torch.float32).tiny

    def one(t):
        g = t.reshape(B, t.shape[1], Hkv, -1)
        descale = (g.abs().amax(dim=(1, 3)).float() / E4M3_MAX).clamp_min(tiny)
        scaled = (g.float() / descale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
        return scaled.to(torch.float8_e4m3fn).view(t.shape), descale

    (q8, qd), (k8, kd), (v8, vd) = one(q), one(k), one(v)
    return q8, k8, v8, qd, kd, vd


def flash_attn_fp8_emulated(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, causal=False,
                            softmax_scale=None):
    """The same quantization as flash_attn_fp8, emulated in fp32: scores in fp32, P = exp(s - max)
    x 256 rounded to e4m3 for P V, the row sum of the unrounded P. (The kernel's max is the
    running one of its key blocks, so its P roundings differ slightly; this is the error
    budget the kernel is judged against.)"""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    qf, kf = _dequant(q, q_descale, rep).float(), _dequant(k, k_descale, 1).float()
    qf = qf.transpose(1, 2)
    kf = kf.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, float("-inf"))
    m = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    p = torch.exp(s - m) * 256.0
    pq = p.to(torch.float8_e4m3fn).float()
    vf = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    vd = (v_descale if v_descale is not None else torch.ones(B, Hkv, device=q.device)).float()
    o = (pq @ vf) * vd.repeat_interleave(rep, dim=1)[:, :, None, None] / p.sum(-1, keepdim=True).clamp_min(1e-30)
    return o.transpose(1, 2)


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


# pi(k) within each 32-key block: the score column that the FP8 kernel's e4m3 P fragment
# holds as key k (FlashAttnFwdSm90._p_fragment_view); its V^T holds key pi(k) there.
FP8_KEY_PERM = tuple(16 * (k // 16) + 8 * ((k % 4) // 2) + 2 * ((k % 16) // 4) + k % 2 for k in range(32))


def vt_fp8_ref(v: torch.Tensor) -> torch.Tensor:
    """What fp8_vt.vt_fp8 computes: V [B, Sk, Hkv, D] -> V^T [B, Hkv, D, 32 ceil(Sk / 32)],
    zeros past Sk, keys permuted by FP8_KEY_PERM within each 32-block."""
    B, Sk, Hkv, D = v.shape
    dtype, sk_pad = v.dtype, -(-Sk // 32) * 32
    v = torch.cat([v.view(torch.uint8), torch.zeros((B, sk_pad - Sk, Hkv, D), dtype=torch.uint8, device=v.device)], 1)
    idx = torch.tensor(FP8_KEY_PERM, device=v.device)
    v = v.view(B, sk_pad // 32, 32, Hkv, D).index_select(2, idx).reshape(B, sk_pad, Hkv, D)
    return v.permute(0, 2, 3, 1).contiguous().view(dtype)
