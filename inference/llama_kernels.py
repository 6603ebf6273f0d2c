"""The Llama-family decode step's small kernels: RoPE of q and k with the K/V append, and
RMSNorm (where it is not a GEMV prologue), one launch each.

Unfused, one decode step per layer runs about a dozen small torch kernels between the q/k/v
GEMV and the attention (two rotate_half concatenations, four products and two sums in bf16,
two index_copy appends), none of them in the programmatic-dependent-launch chain. Here one
Triton program per (sequence, head) of q and k reads its head's D values of the fused
[q | k | v] row, rotates them with the cos / sin table row of the current position (read
from the device-side counter, so the launch is the same every step and CUDA-graph
capturable), and writes q to its output and k (and the same head of v) to the caches.

Math and roundings are transformers' apply_rotary_pos_emb in the activations' dtype:
out = round(round(x * cos) + round(rotate_half(x) * sin)), rotate_half pairing i with i + D/2.
`ops.rope_append_ref` is the same in torch.

transformers' RMSNorm module is about seven kernels (pow, mean, add, rsqrt, two products, a
cast); where the GEMV after it cannot take it as its prologue (more than 8 rows) it is one
launch here, with the same two roundings (`ops.rms_norm_ref`).

The prefill (patch_llama's switches) uses the same RMSNorm launch and two elementwise kernels
of its own: RoPE of q and k over all positions (transformers' apply_rotary_pos_emb is about
eight torch kernels) and silu(gate) * up (two). Both round as the torch ops do, so the fused
model's prefill is the unfused one's bit for bit where the GEMMs are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _rope_half(x1, x2, c1, c2, s1, s2, dt: tl.constexpr):
    """Both halves of rope(x) for x = [x1 | x2], rounding like the bf16 torch ops."""
    # Launched with enable_fp_fusion=False: sm_90 has bf16 FMA, and LLVM contracts the second
    # product into the add (fma.rn.bf16), skipping its rounding; where the two products nearly
    # cancel, that moves the result by many ulps from the torch ops' value.
    o1 = (x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)
    o2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
    return o1.to(dt), o2.to(dt)


@triton.jit
def _rope_append_kernel(qkv_ptr, qkv_stride, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr,
                        c_sb, c_sh, c_ss, HQ, HKV, HALF: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)  # 0..HQ-1: query heads; HQ..HQ+HKV-1: key heads (with their value head)
    if PDL:
        # Reads only activations and the position, all written by earlier kernels; the next
        # kernel (the decode attention) reads nothing before its own wait.
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    D: tl.constexpr = 2 * HALF
    d = tl.arange(0, HALF)
    pos = tl.load(pos_ptr).to(tl.int64)
    row = qkv_ptr + b.to(tl.int64) * qkv_stride + h * D
    x1 = tl.load(row + d).to(tl.float32)
    x2 = tl.load(row + HALF + d).to(tl.float32)
    dt = qkv_ptr.dtype.element_ty
    c1 = tl.load(cos_ptr + pos * D + d).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * D + HALF + d).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * D + d).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * D + HALF + d).to(tl.float32)
    o1, o2 = _rope_half(x1, x2, c1, c2, s1, s2, dt)
    if h < HQ:
        out = q_ptr + (b.to(tl.int64) * HQ + h) * D
        tl.store(out + d, o1)
        tl.store(out + HALF + d, o2)
    else:
        kh = h - HQ
        off = b.to(tl.int64) * c_sb + kh * c_sh + pos * c_ss
        tl.store(k_ptr + off + d, o1)
        tl.store(k_ptr + off + HALF + d, o2)
        vrow = row + HKV * D  # the same head of v, HKV heads further along the row
        tl.store(v_ptr + off + d, tl.load(vrow + d))
        tl.store(v_ptr + off + HALF + d, tl.load(vrow + HALF + d))


def check_rope_append(qkv, cos, sin, pos, k_cache, v_cache, n_q_heads: int) -> None:
    """The shapes and layouts rope_append_triton needs (ValueError / TypeError otherwise)."""
    for t, n in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.stride(3) != 1:
            raise ValueError(f"{n} must be a 4-D [B, Hkv, Smax, D] tensor with unit stride on D")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and strides")
    B, Hkv, Smax, D = k_cache.shape
    M = qkv.shape[0]
    if qkv.dim() != 2 or qkv.stride(1) != 1 or qkv.shape[1] != (n_q_heads + 2 * Hkv) * D or M > B:
        raise ValueError(f"qkv must be [M <= {B}, (Hq + 2 Hkv) D = {(n_q_heads + 2 * Hkv) * D}] with unit stride, "
                         f"got {tuple(qkv.shape)}")
    if D % 2 or D & (D - 1):
        raise ValueError(f"head dim {D} must be a power of two")
    if cos.shape != (Smax, D) or sin.shape != (Smax, D) or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"cos / sin must be contiguous [{Smax}, {D}] tables")
    if len({qkv.dtype, cos.dtype, sin.dtype, k_cache.dtype, v_cache.dtype}) != 1:
        raise TypeError("qkv, cos, sin and the caches must share one dtype")
    if not isinstance(pos, torch.Tensor) or pos.numel() != 1 or pos.dtype not in (torch.int32, torch.int64):
        raise ValueError("pos must be a one-element int32/int64 tensor (one position for every row)")


def rope_append_triton(qkv, cos, sin, pos, k_cache, v_cache, n_q_heads: int) -> torch.Tensor:
    """ops.rope_append on the GPU (see the module docstring); returns q [M, Hq, D]."""
    from cute_kernels.matmul.gemv import pdl_enabled, prefer_max_shared

    check_rope_append(qkv, cos, sin, pos, k_cache, v_cache, n_q_heads)
    M = qkv.shape[0]
    _, Hkv, _, D = k_cache.shape
    q = torch.empty((M, n_q_heads, D), dtype=qkv.dtype, device=qkv.device)
    pdl = qkv.is_cuda and pdl_enabled()
    kernel = _rope_append_kernel[(M, n_q_heads + Hkv)](
        qkv, qkv.stride(0), cos, sin, pos, q, k_cache, v_cache, k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), n_q_heads, Hkv, HALF=D // 2, PDL=pdl, num_warps=1, enable_fp_fusion=False,
        **({"launch_pdl": True} if pdl else {}))
    if pdl:
        prefer_max_shared(kernel)
    return q


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, K, stride_x, stride_o, eps, BLOCK: tl.constexpr,
                     PDL: tl.constexpr, LIBDEVICE: tl.constexpr):
    """One row per program: transformers' Llama RMSNorm (fp32 statistics, the normalised value
    rounded to x's dtype, then times the weight, rounded)."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    dt = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_ptr + row * stride_x + k0 + k, mask=k0 + k < K, other=0.0).to(tl.float32)
        acc += x * x
    # torch.rsqrt is CUDA's rsqrtf (libdevice's rsqrt, rsqrt.approx.f32 without FTZ); 1 / sqrt
    # rounds twice and moves rstd by an ulp now and then. Only the order of the fp32 sum of
    # squares then differs from torch's mean.
    var = tl.div_rn(tl.sum(acc, 0), K.to(tl.float32)) + eps
    if LIBDEVICE:
        rstd = libdevice.rsqrt(var)
    else:  # Triton's CPU interpreter has no libdevice
        rstd = 1.0 / tl.sqrt(var)
    for k0 in range(0, K, BLOCK):
        m = k0 + k < K
        x = tl.load(x_ptr + row * stride_x + k0 + k, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + k0 + k, mask=m, other=0.0).to(tl.float32)
        y = (x * rstd).to(dt).to(tl.float32) * w
        tl.store(out_ptr + row * stride_o + k0 + k, y.to(dt), mask=m)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """ops.rms_norm on the GPU: x [M, K] (unit stride on K), weight [K] of x's dtype, one launch;
    into `out` ([M, K] of x's dtype, unit stride on K) when given."""
    from cute_kernels.matmul.gemv import pdl_enabled, prefer_max_shared

    if x.dim() != 2 or x.stride(1) != 1 or weight.shape != (x.shape[1],) or weight.dtype != x.dtype \
            or not weight.is_contiguous():
        raise ValueError(f"rms_norm: x [M, K] with unit stride and weight [K] of its dtype, got {tuple(x.shape)} "
                         f"{x.dtype} and {tuple(weight.shape)} {weight.dtype}")
    M, K = x.shape
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.stride(1) != 1 or out.device != x.device:
        raise ValueError(f"rms_norm: out must be {tuple(x.shape)} {x.dtype} with unit stride on {x.device}, got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()} on {out.device}")
    if M == 0:
        return out
    pdl = x.is_cuda and pdl_enabled()
    block = min(triton.next_power_of_2(K), 4096)
    # No FP contraction: torch rounds each x * x before summing (pow(2)), and no FTZ (rsqrtf's).
    kernel = _rms_norm_kernel[(M,)](x, weight, out, K, x.stride(0), out.stride(0), float(eps), BLOCK=block, PDL=pdl,
                                    LIBDEVICE=x.is_cuda, num_warps=4 if block <= 2048 else 8, enable_fp_fusion=False,
                                    enable_reflect_ftz=False, **({"launch_pdl": True} if pdl else {}))
    if pdl:
        prefer_max_shared(kernel)
    return out


# --------------------------------------------------------------------------- prefill


@triton.jit
def _rope_rows(x_ptr, o_ptr, b, h, s, m, d, c1, c2, s1, s2, sx_b, sx_h, sx_s, so_b, so_h, so_s,
               HALF: tl.constexpr):
    x = x_ptr + b * sx_b + h * sx_h + s * sx_s + d
    x1 = tl.load(x, mask=m).to(tl.float32)
    x2 = tl.load(x + HALF, mask=m).to(tl.float32)
    o1, o2 = _rope_half(x1, x2, c1, c2, s1, s2, o_ptr.dtype.element_ty)
    o = o_ptr + b * so_b + h * so_h + s * so_s + d
    tl.store(o, o1, mask=m)
    tl.store(o + HALF, o2, mask=m)


@triton.jit
def _rope_prefill_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, S, HQ, HK,
                         sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sqo_b, sqo_h, sqo_s, sko_b, sko_h, sko_s, sc_b, sc_s,
                         HALF: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program (s block, b): BLOCK_S positions of every head of q and k, so that each cos / sin
    row is read once rather than once per head."""
    b = tl.program_id(1).to(tl.int64)
    s = (tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S))[:, None].to(tl.int64)
    d = tl.arange(0, HALF)[None, :]
    m = s < S
    c = cos_ptr + b * sc_b + s * sc_s + d
    sn = sin_ptr + b * sc_b + s * sc_s + d
    c1 = tl.load(c, mask=m).to(tl.float32)
    c2 = tl.load(c + HALF, mask=m).to(tl.float32)
    s1 = tl.load(sn, mask=m).to(tl.float32)
    s2 = tl.load(sn + HALF, mask=m).to(tl.float32)
    for h in range(HQ):
        _rope_rows(q_ptr, qo_ptr, b, h, s, m, d, c1, c2, s1, s2, sq_b, sq_h, sq_s, sqo_b, sqo_h, sqo_s, HALF)
    for h in range(HK):
        _rope_rows(k_ptr, ko_ptr, b, h, s, m, d, c1, c2, s1, s2, sk_b, sk_h, sk_s, sko_b, sko_h, sko_s, HALF)


def check_rope_prefill(q, k, cos, sin) -> None:
    """The shapes rope_prefill takes (ValueError otherwise)."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"rope_prefill: q [B, Hq, S, D] and k [B, Hk, S, D], got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    B, _, S, D = q.shape
    if D % 2 or cos.dim() != 3 or cos.shape != sin.shape or tuple(cos.shape[1:]) != (S, D) \
            or cos.shape[0] not in (1, B):
        raise ValueError(f"rope_prefill: cos / sin [B or 1, S, D] = [{B}, {S}, {D}] (D even), got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if len({q.dtype, k.dtype, cos.dtype, sin.dtype}) != 1:
        raise ValueError(f"rope_prefill: q, k, cos and sin must share one dtype, got {q.dtype}, {k.dtype}, "
                         f"{cos.dtype}, {sin.dtype}")


def rope_prefill_triton(q, k, cos, sin):
    """ops.rope_prefill on the GPU: q [B, Hq, S, D], k [B, Hk, S, D] (any strides, unit on D),
    cos / sin [B or 1, S, D]; returns (q, k) rotated, laid out like the inputs. One launch."""
    check_rope_prefill(q, k, cos, sin)
    B, Hq, S, D = q.shape
    Hk = k.shape[1]
    if D & (D - 1):
        raise ValueError(f"rope_prefill: head dim {D} must be a power of two")
    q, k, cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, cos, sin))
    cos, sin = cos.expand(B, S, D), sin.expand(B, S, D)
    if cos.stride() != sin.stride():  # the kernel reads both with cos's strides
        cos, sin = cos.contiguous(), sin.contiguous()
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    if q.numel() == 0:
        return qo, ko
    # 4x2048 tokens of 128-wide heads: 1024 programs of 8 positions x 40 heads
    block_s = max(1, min(triton.next_power_of_2(S), 1024 // D))
    _rope_prefill_kernel[(triton.cdiv(S, block_s), B)](
        q, k, qo, ko, cos, sin, S, Hq, Hk, *q.stride()[:3], *k.stride()[:3], *qo.stride()[:3], *ko.stride()[:3],
        cos.stride(0), cos.stride(1), HALF=D // 2, BLOCK_S=block_s, num_warps=4, enable_fp_fusion=False)
    return qo, ko


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, N, s_g, s_u, s_o, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    """silu(g) * u over one row block, with torch's bf16 roundings: silu as the CUDA kernel
    computes it (x / (1 + expf(-x)) in fp32, IEEE division), rounded, then the product rounded."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = n < N
    dt = o_ptr.dtype.element_ty
    g = tl.load(g_ptr + row * s_g + n, mask=m).to(tl.float32)
    u = tl.load(u_ptr + row * s_u + n, mask=m).to(tl.float32)
    # libdevice expf and div_rn, not tl.exp / `/` (ex2.approx, div.full): torch's silu rounds
    # from the accurate quotient, and an approximate one flips the bf16 rounding now and then.
    if LIBDEVICE:
        e = libdevice.exp(-g)
    else:  # Triton's CPU interpreter has no libdevice
        e = tl.exp(-g)
    silu = tl.div_rn(g, 1.0 + e).to(dt).to(tl.float32)
    tl.store(o_ptr + row * s_o + n, (silu * u).to(dt), mask=m)


def check_silu_mul(gate, up) -> None:
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device or gate.dim() == 0:
        raise ValueError(f"silu_mul: gate and up of one shape, dtype and device, got {tuple(gate.shape)} "
                         f"{gate.dtype} {gate.device} and {tuple(up.shape)} {up.dtype} {up.device}")


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ops.silu_mul on the GPU: gate, up [M, N] (unit stride on N, any row stride: the halves of
    a [gate | up] GEMM output), one launch; returns a contiguous [M, N]."""
    check_silu_mul(gate, up)
    if gate.dim() != 2:
        raise ValueError(f"silu_mul_triton: gate and up [M, N], got {tuple(gate.shape)}")
    gate, up = (t if t.stride(1) == 1 else t.contiguous() for t in (gate, up))
    M, N = gate.shape
    out = torch.empty((M, N), dtype=gate.dtype, device=gate.device)
    if out.numel() == 0:
        return out
    block = min(triton.next_power_of_2(N), 2048)
    _silu_mul_kernel[(M, triton.cdiv(N, block))](gate, up, out, N, gate.stride(0), up.stride(0), out.stride(0),
                                                BLOCK=block, LIBDEVICE=gate.is_cuda, num_warps=4, enable_fp_fusion=False,
                                                enable_reflect_ftz=False)
    return out


@triton.jit
def _sum_pair_add_kernel(a_ptr, b_ptr, r_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    dt = out_ptr.dtype.element_ty
    s = (tl.load(a_ptr + offs, mask=m).to(tl.float32) + tl.load(b_ptr + offs, mask=m).to(tl.float32)).to(dt)
    tl.store(out_ptr + offs, (s.to(tl.float32) + tl.load(r_ptr + offs, mask=m).to(tl.float32)).to(dt), mask=m)


def sum_pair_add(a: torch.Tensor, b: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """(a + b) + residual with each sum rounded to the dtype: torch.add(a, b).add_(residual) in
    one pass instead of two (sm_90 adds bf16 natively, rounding the exact sum once where torch
    rounds it through fp32 first; the two differ only at rare double-rounding ties). All three
    contiguous, of one shape and 16-bit dtype."""
    if not (a.shape == b.shape == residual.shape and a.dtype == b.dtype == residual.dtype
            and a.dtype in (torch.bfloat16, torch.float16)
            and a.is_contiguous() and b.is_contiguous() and residual.is_contiguous()):
        raise ValueError(f"sum_pair_add: three contiguous 16-bit tensors of one shape and dtype, got "
                         f"{[(tuple(t.shape), t.dtype, t.is_contiguous()) for t in (a, b, residual)]}")
    out = torch.empty_like(a)
    n = a.numel()
    if n:
        block = 4096
        _sum_pair_add_kernel[(triton.cdiv(n, block),)](a, b, residual, out, n, BLOCK=block, num_warps=8)
    return out
