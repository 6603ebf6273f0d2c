"""Skinny GEMM for decode (M <= GEMV_MAX_M rows): out = epilogue(x @ w.T), weight-bandwidth bound.

At M = 1..8 the product reads N*K weights once and does almost no math, so what matters
is how many bytes per second reach the SMs. The persistent wgmma GEMM spends most of a
decode call on per-tile latency (pipeline fill, 64-row MMA tiles that are 1/64 used,
the epilogue's smem round trip): on the H100 it runs 1x1600x1600 in 7.3 us against
cuBLAS's 6.1 us, both far from the 1.5 us that 5 MB at 3.35 TB/s allows.

This kernel is the plain streaming shape instead: one program per BLOCK_N weight rows,
a loop over K that loads [BLOCK_K, BLOCK_N] weight tiles (each row's K run is
contiguous: full 128-byte lines), the M <= 16 activation rows padded to one tl.dot
operand, fp32 accumulation, and the same fused epilogue as the GEMM (`epilogue_math` below).
Why Triton: a bandwidth-bound streaming loop is a few lines there, it takes any stride
without a compile per cache key of ours, launches on torch's stream (CUDA-graph
capturable), and its logic runs on a CPU under TRITON_INTERPRET=1 for tests.

At M = 1 the row is not padded to a tl.dot tile: the one-row form does FMAs into a
[BLOCK_K, BLOCK_N] fp32 tile with tiles as narrow as 4 output columns, so even N = 1600
gives 400 programs. Decode runs one small GEMV after another, so each launch is a
programmatic dependent launch (PDL): the next kernel's CTAs are resident, with their first
weight tiles already loading (weights do not depend on the previous kernel), and waiting
(griddepcontrol.wait) when this one ends, instead of paying launch latency and ramp-up.
The KV-cache append of c_attn can ride in the epilogue (`kv=`).

Every kernel of the decode chain (these GEMVs, the decode attention, the next-token kernel)
triggers its dependents *before* its own wait, so the chain runs ahead: kernel N + 1 launches
as soon as all of kernel N's CTAs are resident, even while N still waits for N - 1, and its
weight loads fill HBM time that used to idle through the attention and the small output
projection. That is safe because before its wait a kernel reads only constants (weights,
bias, LayerNorm parameters) and writes nothing: its wait returns only when N has finished,
and N finishes only after its own wait, so every earlier kernel has too. GPT-2 XL decode
(bf16, batch 1, H100, same run): 1.657 -> 1.573 ms/token when the attention, this kernel and
the next-token kernel moved their trigger ahead of the wait (the DSL GEMV already had).

One activation row with 16-bit weights (M = 1, K a multiple of 16 up to GEMV_K_MAX, not both
N and K >= GEMV_LONG_ROWS: the Llama family's rows measured faster here, see _long_row_blocks)
runs on the CuTe DSL kernel of gemv_kernel.py instead (`gemv_sm90_applies`): whole weight rows
bulk-copied into shared memory before the PDL wait, the product on the tensor cores. In the
same GPT-2 XL chain on the H100 it took 1.50 -> 1.35 ms, and the decode step 1.82 -> 1.72 ms
(CUTE_KERNELS_GEMV_SM90=0 turns it off). K = 6400 stays here: 8 rows of it (102 KB) leave
no room for a second CTA per SM, and the chain was slower with it (1.45 ms). Weight-only
8-bit decode (fp8 e4m3 or int8 weights with a per-channel scale, `w_scale`) runs there too,
K up to 8192 (rows are K bytes): the weights become f16 in registers for an f16 MMA. Same
chain with 8-bit weights: fp8 1.18 -> 1.09-1.12 ms, int8 1.36 -> 1.17 ms (K = 6400 on the
kernel included; keeping it here measured 1.17 / 1.30).

On the H100 (2026-11-22) it is correct (tests/test_gemm.py -k gemv) and runs GPT-2 XL's
decode linears at 1.11-1.43x cuBLAS at M = 1 and the 1x50257x1600 lm_head at 1.7x
(`gemm_decode_h100.md`), where the wgmma path ran 0.75-0.92x; so `kernel_for` routes eligible
M <= 8 products here, except plain ones on weights of more than 4096 rows, which 64 x 16
swap_ab tiles stream faster (heuristics.skinny_gemv, docs/quant-and-decode.md).
CUTE_KERNELS_GEMV=0 turns it off (the wgmma path, for comparison). In the GPT-2 XL decode step (48 layers x 4 GEMVs in one CUDA graph) PDL took
2.24 to 2.09 ms per token, and loading weights ahead of the wait 2.09 to 1.81.

The Llama family's decode step (inference/decode_llama.py) runs three launches per layer
here besides o_proj / down: q/k/v with the RMSNorm prologue and RoPE + the K/V append in the
epilogue (`rope=`: each program takes whole RoPE pairs of one head), gate/up with the prologue
and silu(gate) * up in the epilogue (`swiglu=`), all in 16-bit or 8-bit weight-only form. Where
registers run short (two weight tiles per step, 8-bit weights converted twice per element) the
tl.dot form with the row padded to 16 wins even at M = 1; _long_row_blocks holds the measured
picks (docs/quant-and-decode.md).
"""

from __future__ import annotations

import ctypes
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..activations import code as activation_code
from ..runtime import env
from ..runtime.triton_launch import TritonLaunch

GEMV_ENV = "CUTE_KERNELS_GEMV"
GEMV_MAX_M = 8


def gemv_enabled() -> bool:
    return env.enabled(GEMV_ENV)


def gemv_applies(a: torch.Tensor, b_nk: torch.Tensor, out_dtype, epi) -> bool:
    """Whether a (M, K) x (N, K)^T product with this epilogue takes the skinny path."""
    return (
        gemv_enabled()
        and a.shape[0] <= GEMV_MAX_M
        and a.element_size() == 2
        and out_dtype in (torch.bfloat16, torch.float16, torch.float32)
        and (a.stride(1) == 1 or a.shape[1] == 1)
        and (b_nk.stride(1) == 1 or b_nk.shape[1] == 1)
        and epi.row_scale == "none"
        and epi.col_scale == "none"
    )


@triton.jit
def epilogue_math(x, rows, cols, rmask, cmask, bias_ptr, res_ptr, row_ptr, col_ptr, alpha, beta, stride_res_m,
                  ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ROW_SCALE: tl.constexpr,
                  COL_SCALE: tl.constexpr, USE_ALPHA: tl.constexpr, USE_BETA: tl.constexpr):
    """The GEMM epilogue on an fp32 [rows, cols] tile, in GemmSm90._epilogue_value's order."""
    if USE_ALPHA:
        x = x * alpha
    if ROW_SCALE == 1:
        x = x * tl.load(row_ptr)
    if ROW_SCALE == 2:
        x = x * tl.load(row_ptr + rows, mask=rmask, other=0.0)[:, None]
    if COL_SCALE == 1:
        x = x * tl.load(col_ptr)
    if COL_SCALE == 2:
        x = x * tl.load(col_ptr + cols, mask=cmask, other=0.0)[None, :]
    if HAS_BIAS:
        x = x + tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        x = tl.where(x < 0.0, 0.0, x)  # relu that keeps NaN (torch.relu does)
    if ACT == 2:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    if ACT == 3:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x / (1.0 + tl.exp(-2.0 * u))  # == 0.5 x (1 + tanh(u))
    if HAS_RES:
        mask = rmask[:, None] & cmask[None, :]
        r = tl.load(res_ptr + rows[:, None] * stride_res_m + cols[None, :], mask=mask, other=0.0)
        r = r.to(tl.float32)
        if USE_BETA:
            r = r * beta
        x = x + r
    return x


@triton.jit
def _x_tile(x_ptrs, k0, K, rmask, ks, mean, rstd, ln_w_ptr, ln_b_ptr, xs_ptr, LN: tl.constexpr,
            XSCALE: tl.constexpr, RMS: tl.constexpr = False):
    """The activation tile for K columns [k0, k0 + BLOCK_K), LayerNorm (or RMSNorm) and
    SmoothQuant applied."""
    kmask = (k0 + ks) < K
    x = tl.load(x_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
    if RMS:
        # transformers' Llama RMSNorm rounds twice: the normalised value to the activation
        # dtype, then its product with the weight (rounding once in fp32 differs in ~25% of
        # elements). Masked columns load 0 and stay 0.
        g = tl.load(ln_w_ptr + k0 + ks, mask=kmask, other=0.0).to(tl.float32)
        xn = (x.to(tl.float32) * rstd[:, None]).to(x_ptrs.dtype.element_ty).to(tl.float32)
        x = (xn * g[None, :]).to(x_ptrs.dtype.element_ty)
    if LN:
        g = tl.load(ln_w_ptr + k0 + ks, mask=kmask, other=0.0).to(tl.float32)
        bb = tl.load(ln_b_ptr + k0 + ks, mask=kmask, other=0.0).to(tl.float32)
        xn = (x.to(tl.float32) - mean[:, None]) * rstd[:, None] * g[None, :] + bb[None, :]
        # Padding columns must stay 0 (they meet masked-to-0 weights, but 0 * NaN = NaN).
        x = tl.where(kmask[None, :], xn, 0.0).to(x_ptrs.dtype.element_ty)
    if XSCALE:  # SmoothQuant: the activation side of the smoothing (x / s), per K column
        xs = tl.load(xs_ptr + k0 + ks, mask=kmask, other=0.0)
        x = (x.to(tl.float32) * xs[None, :]).to(x_ptrs.dtype.element_ty)
    return x


@triton.jit
def _mac(acc, acc2, x, w, BLOCK_M: tl.constexpr, DOT_F16: tl.constexpr = False):
    """acc += x @ w for one K step. 8-bit weights (weight-only decode) widen here; their
    per-channel scale is applied to the fp32 sums in the epilogue. One row (BLOCK_M = 1)
    takes FMAs into a [BLOCK_K, BLOCK_N] fp32 tile (acc2), reduced over K once at the end:
    tl.dot would pad the row to 16 and needs BLOCK_N >= 16, this allows narrower tiles and
    so more programs."""
    if BLOCK_M == 1:
        acc2 += tl.trans(x.to(tl.float32)) * w.to(tl.float32)
    elif DOT_F16:
        # 8-bit weights on the tensor cores in f16: e4m3 (and int8) values are exact in f16 and
        # e4m3 -> f16 is one conversion per two weights (bf16 takes three); |x| beyond f16's
        # 65504 becomes inf, as on the DSL one-row kernel.
        acc = tl.dot(x.to(tl.float16), w.to(tl.float16), acc)
    else:
        acc = tl.dot(x, w.to(x.dtype), acc)
    return acc, acc2


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, res_ptr, alpha, beta,
    M, N, K, stride_xm, stride_wn, stride_om, stride_rm,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, USE_ALPHA: tl.constexpr,
    USE_BETA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ln_w_ptr=None, ln_b_ptr=None, eps=1e-5, LN: tl.constexpr = False, K_PAD: tl.constexpr = 16,
    col_scale_ptr=None, xs_ptr=None, COL_SCALE: tl.constexpr = 0, XSCALE: tl.constexpr = False,
    PDL: tl.constexpr = False, FIRST_STEPS: tl.constexpr = 1,
    KV: tl.constexpr = False, k_cache_ptr=None, v_cache_ptr=None, pos_ptr=None, pos_stride=0,
    kv_c=1, kv_sb=0, kv_sh=0, kv_ss=0, KV_D: tl.constexpr = 64, RMS: tl.constexpr = False,
    SWIGLU: tl.constexpr = False, DOT_F16: tl.constexpr = False,
    ROPE: tl.constexpr = False, cos_ptr=None, sin_ptr=None, q_ptr=None, stride_q=0, QD=0, KD=0,
    ROPE_EXACT: tl.constexpr = True,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    if ROPE:
        # RoPE pairs dims (p, p + D/2) of a head: this program's columns are BLOCK_N / 2 such
        # pairs of one head, interleaved (first half, second half, ...), so the epilogue holds
        # both members of every pair. Weight rows load in any order (each is its own K run).
        HB: tl.constexpr = BLOCK_N // 2
        PER_HEAD: tl.constexpr = KV_D // BLOCK_N
        i = tl.arange(0, BLOCK_N)
        cols = (pid // PER_HEAD) * KV_D + (pid % PER_HEAD) * HB + i // 2 + (i % 2) * (KV_D // 2)
    else:
        cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    rmask = rows < M
    cmask = cols < N
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]  # [BLOCK_K, BLOCK_N]
    # The weights of the first FIRST_STEPS K steps are loaded before anything else: they are
    # constant, so with PDL the loads are in flight while the previous kernel still runs.
    w0 = tl.load(w_ptrs, mask=(ks < K)[:, None] & cmask[None, :], other=0.0)
    if FIRST_STEPS == 2:
        w1 = tl.load(w_ptrs + BLOCK_K, mask=((BLOCK_K + ks) < K)[:, None] & cmask[None, :], other=0.0)
    if SWIGLU:
        # gate_up = [gate; up] ([2N, K]): this program's output columns need gate rows cols
        # and up rows N + cols; both stream in the same K loop.
        u_ptrs = w_ptrs + N.to(tl.int64) * stride_wn
        u0 = tl.load(u_ptrs, mask=(ks < K)[:, None] & cmask[None, :], other=0.0)
        if FIRST_STEPS == 2:
            u1 = tl.load(u_ptrs + BLOCK_K, mask=((BLOCK_K + ks) < K)[:, None] & cmask[None, :], other=0.0)
    if PDL:
        # Programmatic dependent launch: this grid may be resident before the previous
        # kernel has finished. Nothing before gdc_wait may read what an earlier kernel
        # writes, or write anything. The wait costs ~1.4 us per kernel (a chain of empty
        # PDL kernels), and HBM idles through it unless loads are already in flight, hence
        # w0/w1: GPT-2 XL's 192 decode GEMVs in one graph took 1.49 ms without them, 1.36
        # with, and 1.12 with no wait at all (unsafe; the bound for this structure).
        # The next kernel may launch as soon as every program of this grid is resident: it
        # reads only constants before its own wait, so its weight loads overlap this one.
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    rstd = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if LN:
        # LayerNorm prologue: every program recomputes its rows' mean and rstd (a row is a
        # few KB, read from L2), cheaper than a separate LayerNorm launch per layer. Each row
        # is loaded whole (K_PAD = next power of two >= K) so the statistics cost one memory
        # round trip per row, not one per K step; two passes over the registers, since
        # GPT-2's residual stream has large means.
        kk = tl.arange(0, K_PAD)
        kkmask = kk < K
        for m in range(0, M):
            xr = tl.load(x_ptr + m * stride_xm + kk, mask=kkmask, other=0.0).to(tl.float32)
            mu = tl.sum(xr, 0) / K
            d = tl.where(kkmask, xr - mu, 0.0)
            r = 1.0 / tl.sqrt(tl.sum(d * d, 0) / K + eps)
            mean = tl.where(rows == m, mu, mean)
            rstd = tl.where(rows == m, r, rstd)
    if RMS:
        # RMSNorm prologue (transformers' Llama family): rstd = rsqrt(mean(x^2) + eps) in fp32,
        # recomputed per program like the LayerNorm statistics above.
        kk = tl.arange(0, K_PAD)
        kkmask = kk < K
        for m in range(0, M):
            xr = tl.load(x_ptr + m * stride_xm + kk, mask=kkmask, other=0.0).to(tl.float32)
            r = 1.0 / tl.sqrt(tl.sum(xr * xr, 0) / K + eps)
            rstd = tl.where(rows == m, r, rstd)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_K if BLOCK_M == 1 else 1, BLOCK_N), dtype=tl.float32)
    if SWIGLU:
        accu = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        accu2 = tl.zeros((BLOCK_K if BLOCK_M == 1 else 1, BLOCK_N), dtype=tl.float32)
    x = _x_tile(x_ptrs, 0, K, rmask, ks, mean, rstd, ln_w_ptr, ln_b_ptr, xs_ptr, LN, XSCALE, RMS)
    acc, acc2 = _mac(acc, acc2, x, w0, BLOCK_M, DOT_F16)
    if SWIGLU:
        accu, accu2 = _mac(accu, accu2, x, u0, BLOCK_M, DOT_F16)
    if FIRST_STEPS == 2:
        x = _x_tile(x_ptrs + BLOCK_K, BLOCK_K, K, rmask, ks, mean, rstd, ln_w_ptr, ln_b_ptr, xs_ptr, LN, XSCALE,
                    RMS)
        acc, acc2 = _mac(acc, acc2, x, w1, BLOCK_M, DOT_F16)
        if SWIGLU:
            accu, accu2 = _mac(accu, accu2, x, u1, BLOCK_M, DOT_F16)
    for k0 in range(FIRST_STEPS * BLOCK_K, K, BLOCK_K):
        x = _x_tile(x_ptrs + k0, k0, K, rmask, ks, mean, rstd, ln_w_ptr, ln_b_ptr, xs_ptr, LN, XSCALE, RMS)
        w = tl.load(w_ptrs + k0, mask=((k0 + ks) < K)[:, None] & cmask[None, :], other=0.0)
        acc, acc2 = _mac(acc, acc2, x, w, BLOCK_M, DOT_F16)
        if SWIGLU:
            u = tl.load(u_ptrs + k0, mask=((k0 + ks) < K)[:, None] & cmask[None, :], other=0.0)
            accu, accu2 = _mac(accu, accu2, x, u, BLOCK_M, DOT_F16)
    if BLOCK_M == 1:
        acc = tl.sum(acc2, 0)[None, :]
        if SWIGLU:
            accu = tl.sum(accu2, 0)[None, :]
    if SWIGLU:
        if COL_SCALE == 2:  # 8-bit [gate; up]: the scales of gate rows cols and of up rows N + cols
            acc = acc * tl.load(col_scale_ptr + cols, mask=cmask, other=0.0)[None, :]
            accu = accu * tl.load(col_scale_ptr + N + cols, mask=cmask, other=0.0)[None, :]
        # silu(gate) * up with transformers' roundings: gate and up projections to the output
        # dtype, silu rounded, the product rounded by the store.
        g = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        sg = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = sg * accu.to(out_ptr.dtype.element_ty).to(tl.float32)
    else:
        y = epilogue_math(acc, rows, cols, rmask, cmask, bias_ptr, res_ptr, bias_ptr, col_scale_ptr, alpha, beta,
                          stride_rm, ACT, HAS_BIAS, HAS_RES, 0, COL_SCALE, USE_ALPHA, USE_BETA)
    if ROPE:
        _rope_epilogue(y, rows, cols, rmask, cos_ptr, sin_ptr, q_ptr, stride_q, k_cache_ptr, v_cache_ptr, pos_ptr,
                       pos_stride, kv_sb, kv_sh, kv_ss, QD, KD, BLOCK_M, BLOCK_N, KV_D, ROPE_EXACT)
    else:
        out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
    if KV:
        # KV-cache append fused into c_attn: columns [C, 2C) are the new key, [2C, 3C) the
        # new value, head-major (head = (col % C) // D). Row m (one sequence) goes to cache
        # row pos[m]; this saves the decode step two copy launches per layer.
        part = cols // kv_c
        within = cols - part * kv_c
        pos = tl.load(pos_ptr + rows * pos_stride, mask=rmask, other=0).to(tl.int64)
        off = (rows[:, None].to(tl.int64) * kv_sb + pos[:, None] * kv_ss
               + ((within // KV_D) * kv_sh + within % KV_D)[None, :])
        yk = y.to(k_cache_ptr.dtype.element_ty)
        live = rmask[:, None] & cmask[None, :]
        tl.store(k_cache_ptr + off, yk, mask=live & (part == 1)[None, :])
        tl.store(v_cache_ptr + off, yk, mask=live & (part == 2)[None, :])



@triton.jit
def _rope_epilogue(y, rows, cols, rmask, cos_ptr, sin_ptr, q_ptr, stride_q, k_ptr, v_ptr, pos_ptr, pos_stride,
                   c_sb, c_sh, c_ss, QD, KD, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                   EXACT: tl.constexpr):
    """The Llama decode step's q/k/v epilogue: columns [0, QD) are q, [QD, QD + KD) k, then v,
    head-major with head dim D, in the interleaved pair order of the kernel's ROPE columns.
    RoPE of q and k at row m's position pos[m] with transformers' roundings (the projection
    rounded to the activations' dtype, then round(round(x * cos) + round(rotate_half(x) * sin)),
    the products as mul.rn so that none skips its rounding in an FMA); q to q_ptr [M, QD],
    k and v to the caches [B, Hkv, Smax, D] at row pos[m]. This replaces a launch of
    rope_append after the GEMV."""
    dt = k_ptr.dtype.element_ty
    HB: tl.constexpr = BLOCK_N // 2
    HALF: tl.constexpr = D // 2
    yb = y.to(dt).to(tl.float32)
    a, b = tl.split(tl.reshape(yb, (BLOCK_M, HB, 2)))  # dims p and p + D/2
    ca, _ = tl.split(tl.reshape(cols, (HB, 2)))
    d1 = ca % D
    pos = tl.load(pos_ptr + rows * pos_stride, mask=rmask, other=0).to(tl.int64)
    tab = pos[:, None] * D + d1[None, :]
    c1 = tl.load(cos_ptr + tab).to(tl.float32)
    c2 = tl.load(cos_ptr + tab + HALF).to(tl.float32)
    s1 = tl.load(sin_ptr + tab).to(tl.float32)
    s2 = tl.load(sin_ptr + tab + HALF).to(tl.float32)
    if EXACT:  # mul.rn: never contracted into an FMA with the add that follows
        p1, p2, p3, p4 = libdevice.mul_rn(a, c1), libdevice.mul_rn(-b, s1), libdevice.mul_rn(b, c2), libdevice.mul_rn(a, s2)
    else:  # Triton's CPU interpreter has no libdevice (and does not contract)
        p1, p2, p3, p4 = a * c1, -b * s1, b * c2, a * s2
    o1 = (p1.to(dt).to(tl.float32) + p2.to(dt).to(tl.float32)).to(dt)
    o2 = (p3.to(dt).to(tl.float32) + p4.to(dt).to(tl.float32)).to(dt)
    live = rmask[:, None]
    is_q = (ca < QD)[None, :]
    is_k = ((ca >= QD) & (ca < QD + KD))[None, :]
    is_v = (ca >= QD + KD)[None, :]
    q_off = rows[:, None].to(tl.int64) * stride_q + ca[None, :]
    tl.store(q_ptr + q_off, o1, mask=live & is_q)
    tl.store(q_ptr + q_off + HALF, o2, mask=live & is_q)
    head = tl.where(ca < QD + KD, ca - QD, ca - QD - KD) // D
    c_off = rows[:, None].to(tl.int64) * c_sb + pos[:, None] * c_ss + (head * c_sh + d1)[None, :]
    tl.store(k_ptr + c_off, o1, mask=live & is_k)
    tl.store(k_ptr + c_off + HALF, o2, mask=live & is_k)
    tl.store(v_ptr + c_off, a.to(dt), mask=live & is_v)
    tl.store(v_ptr + c_off + HALF, b.to(dt), mask=live & is_v)


# K steps of weights (1 or 2) loaded before the PDL wait. Same-run A/B on the H100: 2 took
# the GPT-2 XL decode step from 1.84 to 1.81 ms; one tile of the whole row (up to 16 steps)
# was slower (more registers, fewer resident CTAs).
FIRST_STEPS = 2

# M = 1 with N up to this uses 4-row tiles (see _launch_blocks).
ONE_ROW_MAX_N = 2048


def _launch_blocks(M: int, N: int, K: int, wbytes: int = 2, swiglu: bool = False,
                   rms: bool = False) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for the output width N (swiglu: each
    program streams BLOCK_N gate rows and BLOCK_N up rows), weights of wbytes bytes, with or
    without the RMSNorm prologue."""
    if M == 1 and K >= 2048:
        return _long_row_blocks(N, K, wbytes, swiglu, rms)
    if M > 1 and wbytes == 2:
        return _batch_blocks(N, K) if K >= 2048 or N <= 2048 else _short_batch_blocks(N, K)
    return _short_row_blocks(M, N, K)


def _batch_blocks(N: int, K: int) -> tuple[int, int, int, int, int]:
    """_launch_blocks for 2-8 rows of 16-bit weights (the tl.dot form, rows padded to 16) with
    K >= 2048 or N <= 2048 (GPT-2's wider short rows keep `_short_row_blocks`' 64-row tiles:
    8x4800x1600 0.94x cuBLAS with them, 0.70x with these; 8x6400x1600 1.02x vs 0.88x): 32
    weight rows a program, 1024-element K steps while N and K are at most 5120 / 4096 wide,
    512 past that K, 256 from N = 5120 on (many programs, each with a short row). From a
    14-shape sweep on the H100 against cuBLAS (`F.linear`, 2026-11-26, same run), the GPT-2-fitted
    picks (16 rows up to N = 2048, then 64) -> these: 8x1600x1600 0.69x -> 1.23x, 4x2048x2048
    0.72x -> 1.19x, 3x4096x4096 0.91x -> 1.18x, 3x4096x14336 0.78x -> 1.07x, 3x3584x18944
    0.75x -> 1.09x, 6x5120x27648 0.91x -> 0.99x, 8x28672x4096 0.94x -> 0.99x, 2x128256x4096
    1.03x -> 1.08x; 8x6144x4096 1.00x -> 0.97x (docs/quant-and-decode.md)."""
    if N >= 5120:
        return 16, 32, 256, 4, 4
    return (16, 32, 1024, 4, 3) if K <= 4096 else (16, 32, 512, 4, 4)


def _short_batch_blocks(N: int, K: int) -> tuple[int, int, int, int, int]:
    """_launch_blocks for 2-8 rows of 16-bit weights with K < 2048 wider than 2048 (GPT-2's
    c_attn, c_fc and vocabulary head), from in-chain sweeps on the H100 at 2 and 7 rows with
    cuBLAS in the same run (`python -m benchmarks.gemv_sweep --m 2 --sets gpt2-heads`, and
    `--sets gpt2-short`, `--m 7`: `gemv_sweep_heads_m2_h100.md`, `gemv_sweep_short_m2_h100.md`,
    and their `_m7` twins). The 50257-row heads take 128 rows of
    128-element steps, 3 stages (the 64 x 256 x 4-stage tiles ran 2.20-2.56 TB/s, behind
    cuBLAS's padded-N kernels: 2x50257x768 34.1 us vs 31.0; now 26.6, and 34.5 / 43.5 / 55.9 us
    at K = 1024 / 1280 / 1600 against 40.0 / 49.3 / 60.6); rows up to K = 1024 take 512-element
    steps over 8 warps (2x3072x1024 4.6 -> 4.0 us, 2x2304x768 3.7 -> 3.3); GPT-2 large's c_attn
    (3840 x 1280) 32 rows of 512 (5.6 -> 5.3 us); the 4800-6400-row ones at K = 1280 / 1600 keep
    `_blocks`' 64 x 256 (fastest there)."""
    if N >= 32768:
        return 16, 128, 128, 8, 3
    if K <= 1024:
        return 16, 64, 512, 8, 4
    if N < 4800:
        return 16, 32, 512, 4, 3
    return (16, *_blocks(N, K), 4, 4)


def _short_row_blocks(M: int, N: int, K: int) -> tuple[int, int, int, int, int]:
    """_launch_blocks for M = 1 with K < 2048 and 8-bit weights at M > 1.

    M = 1 always takes the one-row form. From an in-chain sweep on the H100 (48 launches of
    one GPT-2 XL shape on distinct weights in one CUDA graph, PDL on, 2026-11-22): narrow
    tiles with long K steps while N is small (1600 wide: 4 rows, 400 programs), wider tiles
    as N grows; a persistent grid (a few programs per SM looping over tiles, so that all
    are resident and trigger the next launch at once) was slower at every shape. Versus the tl.dot form: 9.2 -> 7.3 us at 1x4800x1600, 4.2 -> 3.6 at 1x1600x1600,
    11.0 -> 9.3 at 1x6400x1600, 13.5 -> 9.2 at 1x1600x6400 (one 12.8 KB weight row per
    program, 1024-element steps: 10.6 us with 4 rows of 512), 65 -> 61 at the lm_head.
    """
    if M == 1:
        if N <= ONE_ROW_MAX_N:
            return (1, 1, 1024, 4, 2) if K >= 4096 else (1, 4, 512, 4, 3)
        if N < 6144:
            return 1, 8, 512, 4, 3
        return 1, 16, 256, 8, 4
    return (16, *_blocks(N, K), 4, 4)


def _long_row_blocks(N: int, K: int, wbytes: int = 2, swiglu: bool = False,
                     rms: bool = False) -> tuple[int, int, int, int, int]:
    """M = 1, K >= 2048 (the Llama family's rows): 512- to 2048-element K steps over 4 warps, from
    in-chain sweeps on the H100 (distinct weights, one CUDA graph, PDL).

    16-bit weights, `gemv_sweep_h100.md` (108 configs per shape): against the GPT-2-fitted picks,
    Llama-3-8B's q/k/v 20.9 -> 18.2 us, gate/up 83.4 -> 79.6, down 44.7 -> 39.8, Llama-3.2-1B's
    q/k/v 6.6 -> 5.5 and down 12.4 -> 11.5, the 128256-row heads 1-4% faster. With the decode
    step's fusions (`gemv_sweep_step_h100.md`): gate/up with the SwiGLU epilogue streams as fast
    as without it at half the rows per program (8B 79.5 us, 2.95 TB/s), and o_proj with its
    residual takes 16 rows (8B 11.4 us, where the DSL kernel took 13.9) or, 2048 wide, 4 rows of
    2048-element steps (1B 3.5 us, DSL 4.5).

    8-bit weights (weight-only, `gemv_sweep_fp8_h100.md`): shorter steps with the prologue
    (8B q/k/v 11.5 us vs 12.9 at 1024), 2048-element steps at 2048 rows wide (1B down 7.4,
    o_proj 2.6: the DSL kernel took 8.0 and 3.6). Gate/up with SwiGLU takes the tl.dot form
    (x padded to 16 rows, the weights in f16 on the tensor cores, `gemv_sweep_fp8_dot_h100.md`):
    two FMA tiles per step leave few registers, and per weight the FMA form pays two
    conversions (e4m3 -> f16 -> f32) where the dot form pays half of one; everywhere else the
    dot form lost (8B q/k/v 15.0 us, o_proj 11.4, down 27.9)."""
    if wbytes == 1:
        if swiglu:  # the tl.dot form in f16 (see _mac): 8B 42.1 us vs 48.3, 1B 14.6 vs 15.8
            return (16, 64, 256, 4, 3) if N > 8192 else (16, 32, 256, 4, 4)
        if N <= ONE_ROW_MAX_N:
            return 1, 4, 2048, 4, 3
        if rms and 4096 <= K < 8192:
            return 1, 8, 512, 4, 3
        return 1, 8, 1024, 4, 3
    if swiglu:  # two row tiles per step (gate and up) hold twice the fp32 products: half the rows
        if N <= 8192:  # the tl.dot form (`gemv_sweep_bf16_dot_h100.md`): 1B 23.3 us vs 25.1; 8B 81.1 vs 79.4
            return 16, 32, 256, 4, 3
        _, bn, bk, w, st = _long_row_blocks(N, K, rms=True)
        return 1, max(1, bn // 2), bk, w, st
    if N <= ONE_ROW_MAX_N:
        if K >= 8192:  # few programs: 8 rows, 2048-element steps
            return 1, 8, 2048, 4, 3
        return (1, 1, 1024, 4, 2) if K >= 4096 else (1, 4, 2048, 4, 4)
    if N <= 8192 and K < 12288:  # q/k/v; o_proj (no prologue) 16 rows
        return (1, 8, 1024, 4, 3) if rms else (1, 16, 1024, 4, 2)
    if N >= 65536 or K < 4096:  # vocabulary heads; Llama-3.2-1B's gate/up (16 rows: 26.2 us, 4: 24.5)
        return 1, 4, 1024, 4, 3
    return 1, 16, 1024, 4, 3


def _blocks(N: int, K: int) -> tuple[int, int]:
    # From a 54-config sweep on the H100 at GPT-2 XL's decode shapes: narrow tiles while N
    # alone gives few programs (N = 1600: 100 programs of 16 rows), 64 rows beyond; long K
    # rows stream in 512-element steps (8-bit weights: the same steps; at these sizes the
    # kernel is latency-bound, and 1-byte weights measured no faster than 2-byte ones.)
    return (16 if N <= 2048 else 64), (512 if K >= 4096 else 256)


_GEMV_LAUNCH = TritonLaunch(_gemv_kernel)


class GemvLaunch:
    """The skinny path with the compiled GEMM's call signature (see api.kernel_for)."""

    __slots__ = ("epi", "b_kn")

    def __init__(self, epi, b_kn=False):
        self.epi, self.b_kn = epi, b_kn  # b_kn: b arrives as b_nk.t()

    def __call__(self, a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta):
        if self.b_kn:
            b_nk = b_nk.t()
        e = self.epi
        assert a.shape[0] <= GEMV_MAX_M and out.stride(1) == 1 and (residual is None or residual.stride(1) == 1)
        return skinny_gemm(a, b_nk, bias if e.bias else None, e.activation, residual if e.residual else None,
                           out=out, alpha=alpha if e.alpha else 1.0, beta=beta if e.beta else 1.0)


SMEM_TILE_BUDGET = 200 * 1024  # pipelined tiles; the rest of the 227 KB for the prologue's row and the epilogue
LN_MAX_K = 8192  # the LayerNorm prologue holds a whole row in registers (K_PAD / 128 fp32 per thread)


def skinny_gemm(x, w_nk, bias=None, activation=None, residual=None, *, out=None, alpha=1.0, beta=1.0, ln=None,
                w_scale=None, x_scale=None, kv=None, rms=None, swiglu=False, rope=None):
    """One launch of the skinny kernel for x [M <= GEMV_MAX_M, K] (unit stride on K):

        act(alpha * ((LN(x) if ln else x) * x_scale) @ (w_nk * w_scale).T + bias) + beta * residual

    into `out` (allocated when None; its rows must be dense).
    ln = (weight, bias, eps) runs LayerNorm as the prologue (K <= LN_MAX_K). w_nk is 16-bit
    like x, or fp8/int8 with w_scale [N] fp32 per output channel (weight-only decode: the
    activations stay unquantized, more accurate than W8A8 and one quantize launch fewer; at
    M = 1 fp8 e4m3 and int8 run on the one-row CuTe DSL kernel where gemv_sm90_applies).
    x_scale [K] fp32 is SmoothQuant's activation factor (Triton only).
    kv = (k_cache, v_cache, pos) also writes columns [C, 2C) / [2C, 3C) of the result (C = N/3,
    c_attn's k and v) into the caches [B >= M, H, Smax, D] (any strides but unit D) at row
    pos[m] (pos: int tensor of M elements, or one for every row). See _check_kv.
    rms = (weight, eps) runs transformers' Llama RMSNorm as the prologue instead (K <= LN_MAX_K;
    both of its roundings). swiglu: w_nk is [gate; up] ([2N, K], 16-bit, or 8-bit with w_scale
    [2N]) and the result is silu(gate) * up [M, N] (transformers' roundings), with no bias,
    activation, residual, x_scale or kv. These two run on the Triton kernel only.
    rope = (cos, sin, pos, k_cache, v_cache, n_q_heads): w_nk is the Llama family's [q; k; v]
    (head dim D = k_cache.shape[3], a power of two) and the epilogue is rope_append's: the result
    is q after RoPE [M, n_q_heads * D] (into `out` if given), with k after RoPE and v written to
    the caches [B >= M, Hkv, Smax, D] at row pos (one position for every row); cos / sin [Smax, D]
    in x's dtype. Bias, rms and w_scale combine with it; no activation, residual, kv, swiglu,
    alpha or beta (Triton kernel only).
    On CUDA the launch is a programmatic dependent launch (see PDL_ENV).
    """
    M, K = x.shape
    N = w_nk.shape[0]
    if rms is not None or swiglu:
        N = _check_llama_prologue(x, w_nk, bias, activation, residual, ln, w_scale, x_scale, kv, rms, swiglu)
    rope_args = (False, None, None, None, 0, 0, 0, True)
    if rope is not None:
        cos, sin, pos, k_cache, v_cache, n_q = rope
        D = _check_rope(x, w_nk, out, activation, residual, kv, swiglu, alpha, beta, rope)
        if out is None:
            out = torch.empty((M, n_q * D), dtype=x.dtype, device=x.device)
        rope_args = (True, cos, sin, out, out.stride(0), n_q * D, k_cache.shape[1] * D,
                     os.environ.get("TRITON_INTERPRET", "0") != "1")
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if rms is None and not swiglu and rope is None and gemv_sm90_applies(x, w_nk, out, bias, residual, ln, w_scale, x_scale, kv):
        return gemv_sm90(x, w_nk, out, bias, activation, residual, alpha, beta, ln, kv, w_scale)
    block_m, block_n, block_k, warps, stages = _launch_blocks(M, N, K, w_nk.element_size(), bool(swiglu),
                                                              rms is not None)
    if block_m > 1:  # the tl.dot form stages x and weight tiles in shared memory: keep them under the H100's 227 KB
        if swiglu:  # two weight tiles (gate and up) per step
            block_k = min(block_k, 256)
        per_stage = (block_n * w_nk.element_size() * (2 if swiglu else 1) + block_m * x.element_size()) * block_k
        stages = max(2, min(stages, SMEM_TILE_BUDGET // per_stage))
    ln_w, ln_b, eps = ln if ln is not None else (rms[0], None, rms[1]) if rms is not None else (None, None, 1e-5)
    pdl = x.is_cuda and pdl_enabled()
    kv_args = (False, None, None, None, 0, 1, 0, 0, 0, 64)
    if rope is not None:  # whole RoPE pairs per program: an even tile that divides the head dim
        block_n = min(max(block_n, 2), D)
        kv_args = (False, k_cache, v_cache, pos, 0, 1, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), D)
    if kv is not None:
        k_cache, v_cache, pos = kv
        _check_kv(k_cache, v_cache, pos, M, N)
        kv_args = (True, k_cache, v_cache, pos, 1 if pos.numel() > 1 else 0, N // 3, k_cache.stride(0),
                   k_cache.stride(1), k_cache.stride(2), k_cache.shape[3])
    # Every parameter in order (TritonLaunch.all_args: after the first call of a signature the
    # compiled kernel is launched directly, without the JIT's ~40 arguments of dispatch work).
    kernel = _GEMV_LAUNCH.all_args(
        (triton.cdiv(N, block_n), 1, 1),
        (x, w_nk, out, bias if bias is not None else out, residual if residual is not None else out,
         float(alpha), float(beta), M, N, K, x.stride(0), w_nk.stride(0), out.stride(0),
         residual.stride(0) if residual is not None else 0,
         activation_code(activation), bias is not None, residual is not None,
         alpha != 1.0, residual is not None and beta != 1.0, block_m, block_n, block_k,
         ln_w, ln_b, float(eps), ln is not None, triton.next_power_of_2(K) if ln is not None or rms is not None else 16,
         w_scale, x_scale, 2 if w_scale is not None else 0, x_scale is not None,
         pdl, FIRST_STEPS if K > block_k else 1, *kv_args, rms is not None, bool(swiglu),
         M == 1 and block_m > 1 and w_nk.element_size() == 1, *rope_args),
        num_warps=warps, num_stages=stages, **({"launch_pdl": True} if pdl else {}),
    )
    if pdl and kernel is not None:  # a launch through the JIT: the kernel may be new
        prefer_max_shared(kernel)
    return out


def _check_llama_prologue(x, w_nk, bias, activation, residual, ln, w_scale, x_scale, kv, rms, swiglu) -> int:
    """Validate skinny_gemm's rms / swiglu arguments; the output width."""
    M, K = x.shape
    if M > GEMV_MAX_M or x.stride(1) != 1 or w_nk.stride(1) != 1 or w_nk.shape[1] != K:
        raise ValueError(f"rms/swiglu: x [M <= {GEMV_MAX_M}, K] and w [N, K] with unit stride on K, got "
                         f"{tuple(x.shape)} and {tuple(w_nk.shape)}")
    if ln is not None or x_scale is not None or kv is not None:
        raise ValueError("rms/swiglu take no LayerNorm, SmoothQuant x_scale or kv append")
    w8 = w_nk.dtype in GEMV_SM90_8BIT
    if (w_scale is not None) != w8 or (w8 and (
            not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32
            or w_scale.numel() != w_nk.shape[0] or not w_scale.is_contiguous() or w_scale.device != w_nk.device)):
        raise ValueError(f"rms/swiglu: w in x's dtype, or fp8 e4m3 / int8 with w_scale [{w_nk.shape[0]}] contiguous "
                         f"fp32 on its device (got w {w_nk.dtype}, w_scale "
                         f"{None if w_scale is None else (tuple(w_scale.shape), w_scale.dtype)})")
    if not w8 and w_nk.dtype != x.dtype:
        raise ValueError(f"rms/swiglu: 16-bit w must be in x's dtype {x.dtype}, got {w_nk.dtype}")
    if rms is not None:
        w, eps = rms
        if not isinstance(w, torch.Tensor) or w.shape != (K,) or w.dtype != x.dtype or not w.is_contiguous() \
                or not isinstance(eps, float) or K > LN_MAX_K:
            raise ValueError(f"rms = (weight [K={K}] contiguous in {x.dtype}, float eps) with K <= {LN_MAX_K}")
    N = w_nk.shape[0]
    if swiglu:
        if N % 2 or bias is not None or activation or residual is not None:
            raise ValueError("swiglu: w = [gate; up] with an even row count; no bias, activation or residual")
        N //= 2
    return N


def _check_cache_pair(k_cache, v_cache) -> None:
    """The K and V caches the kv and rope epilogues write: 4-D [B, H, Smax, D], unit stride on D,
    one shape, strides and dtype."""
    for t, n in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.stride(3) != 1:
            raise ValueError(f"{n} must be a 4-D [B, H, Smax, D] tensor with unit stride on D")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.dtype != v_cache.dtype:
        raise ValueError("k_cache and v_cache must have the same shape, strides and dtype")


def _check_rope(x, w_nk, out, activation, residual, kv, swiglu, alpha, beta, rope) -> int:
    """Validate skinny_gemm's rope argument; the head dim."""
    if not (isinstance(rope, tuple) and len(rope) == 6):
        raise TypeError("rope = (cos, sin, pos, k_cache, v_cache, n_q_heads)")
    cos, sin, pos, k_cache, v_cache, n_q = rope
    if activation or residual is not None or kv is not None or swiglu or alpha != 1.0 or beta != 1.0:
        raise ValueError("rope takes no activation, residual, kv append, swiglu, alpha or beta")
    _check_cache_pair(k_cache, v_cache)
    if k_cache.dtype != x.dtype:
        raise ValueError(f"rope: the caches must be in x's dtype {x.dtype}, got {k_cache.dtype}")
    B, Hkv, Smax, D = k_cache.shape
    M = x.shape[0]
    if not isinstance(n_q, int) or n_q <= 0 or D < 2 or D & (D - 1) or w_nk.shape[0] != (n_q + 2 * Hkv) * D or M > B:
        raise ValueError(f"rope: w must be [(n_q_heads + 2 Hkv) D, K] = [{(n_q + 2 * Hkv) * D}, K] with D a power of "
                         f"two and M <= {B}, got w {tuple(w_nk.shape)}, D = {D}, M = {M}")
    for t, n in ((cos, "cos"), (sin, "sin")):
        if not isinstance(t, torch.Tensor) or t.shape != (Smax, D) or not t.is_contiguous() or t.dtype != x.dtype:
            raise ValueError(f"{n} must be a contiguous [{Smax}, {D}] table in {x.dtype}")
    if not isinstance(pos, torch.Tensor) or pos.dtype not in (torch.int32, torch.int64) or pos.numel() != 1 \
            or pos.device != x.device:
        raise ValueError(f"pos must be one int32/int64 position on {x.device}")
    if out is not None and (out.shape != (M, n_q * D) or out.stride(1) != 1 or out.dtype != x.dtype):
        raise ValueError(f"out must be [{M}, {n_q * D}] in {x.dtype} with unit stride")
    return D


def _check_kv(k_cache, v_cache, pos, M, N):
    if N % 3:
        raise ValueError(f"kv append needs the fused qkv width N = 3 * C, got N = {N}")
    _check_cache_pair(k_cache, v_cache)
    B, H, _, D = k_cache.shape
    if H * D != N // 3 or B < M:
        raise ValueError(f"caches {tuple(k_cache.shape)} do not hold {M} rows of {N // 3} = H * D columns")
    if not isinstance(pos, torch.Tensor) or pos.dtype not in (torch.int32, torch.int64) or pos.numel() not in (1, M) \
            or not pos.is_contiguous() or pos.device != k_cache.device:
        raise ValueError(f"pos must be a contiguous int32/int64 tensor of 1 or {M} elements on {k_cache.device}")


# Programmatic dependent launch (on by default on CUDA; CUTE_KERNELS_PDL=0 turns it off).
PDL_ENV = "CUTE_KERNELS_PDL"
_PDL_SUPPORTED = None


_MAX_SHARED_SET: set = set()
_LIBCUDA = None
_CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9


def prefer_max_shared(kernel) -> None:
    """Give a compiled Triton kernel of the decode chain the max-shared-memory carveout
    preference (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 100), once per kernel.

    The chain runs ahead: this kernel's CTAs share SMs with the CuTe DSL kernels around it,
    which need most of the 228 KB of shared memory. A kernel that needs little shared memory
    may otherwise be given a carveout with more L1, and an SM whose configuration must change
    first drains its resident CTAs. In GPT-2 XL's decode after a CUDA-graph-timed prefill
    (what `python -m inference bench` runs first) this took 1.634 -> 1.609 ms/token (H100,
    same run; a fresh process measured 1.565 either way). Best effort: nothing happens where
    the driver library or the handle is not there."""
    global _LIBCUDA
    fn = getattr(kernel, "function", None)
    if not fn or fn in _MAX_SHARED_SET:
        return
    _MAX_SHARED_SET.add(fn)
    try:
        if _LIBCUDA is None:
            _LIBCUDA = ctypes.CDLL("libcuda.so.1")
        _LIBCUDA.cuFuncSetAttribute(ctypes.c_void_p(fn), _CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
    except (OSError, AttributeError, TypeError):
        pass


def pdl_enabled() -> bool:
    """Whether skinny launches use programmatic dependent launch: needs Triton's launch_pdl
    option and griddepcontrol (sm_90: every GPU our kernels run on), not the interpreter."""
    global _PDL_SUPPORTED
    if not env.enabled(PDL_ENV) or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if _PDL_SUPPORTED is None:
        try:
            from triton.backends.nvidia.compiler import CUDAOptions

            _PDL_SUPPORTED = "launch_pdl" in CUDAOptions.__dataclass_fields__
        except (ImportError, AttributeError):
            _PDL_SUPPORTED = False
    return _PDL_SUPPORTED


def layernorm_gemv(x, ln_weight, ln_bias, eps: float, w_nk, bias, activation):
    """out = act(LayerNorm(x) @ w_nk.T + bias) for x [M <= GEMV_MAX_M, K <= LN_MAX_K], one launch."""
    return skinny_gemm(x, w_nk, bias, activation, ln=(ln_weight, ln_bias, eps))


def weight_only_gemv(x, w_q, w_scale, bias=None, activation=None, residual=None, x_scale=None):
    """Decode with 8-bit weights and 16-bit activations (see skinny_gemm)."""
    return skinny_gemm(x, w_q, bias, activation, residual, w_scale=w_scale, x_scale=x_scale)


# --------------------------------------------------------------------------- CuTe DSL one-row GEMV

GEMV_SM90_ENV = "CUTE_KERNELS_GEMV_SM90"
GEMV_SLICE_BYTES = 96 * 1024  # weight bytes per CTA (see gemv_sm90_config)
# Vocabulary-sized weights (16-bit, N >= GEMV_VOCAB_N: many waves of CTAs) take the most rows
# (a multiple of 8) within GEMV_VOCAB_SLICE_BYTES, 8-16 rows: a CTA copies its whole slice
# before it computes, and with 96 KB slices two CTAs an SM left HBM idle between waves.
# Standalone on the H200 (same run, CUDA graphs, vs cuBLAS on N padded to 16), 96 KB -> this:
# GPT-2's lm_head 1x50257x768 0.68x -> 0.92x (64 -> 16 rows), 1x50257x1280 0.89x -> 1.05x (40 ->
# 8), 1x50257x1600 0.92x -> 1.06x (32 -> 8) (`ab_gemv_slices_h200.md`); at K = 1024, 16 -> 8 rows:
# 50257 0.98x -> 1.03x / 0.99x -> 1.04x, 65536 0.99x -> 1.03x, 32768 0.92x -> 0.97x; at K = 896,
# 16 rows ran 0.997x where 8 ran 0.947x (151936 rows) (`ab_gemv_slices2_h200.md`,
# `ab_gemv_slices_held_h200.md`). Narrower weights keep 96 KB: the decode chain's next GEMV
# starts its copies in the room they leave (the module docstring).
GEMV_VOCAB_N = 16384
GEMV_VOCAB_SLICE_BYTES = 28 * 1024
GEMV_MAX_ROWS = 64
GEMV_K_MAX = 4096  # K = 6400 lost on this kernel (see the module docstring)
GEMV_WARPS = 8
GEMV_LONG_ROWS = 2048  # N and K from here take the Triton kernel (gemv_sm90_applies)
# 8-bit weight-only decode on the one-row kernel (format names of gemv_kernel.cvt_8bit_pair_f16x2)
GEMV_SM90_8BIT = {torch.float8_e4m3fn: "e4m3", torch.int8: "s8"}


def _aligned16(t: torch.Tensor | None) -> bool:
    return t is None or t.data_ptr() % 16 == 0


def gemv_sm90_applies(x, w_nk, out, bias, residual, ln, w_scale, x_scale, kv) -> bool:
    """Whether the CuTe DSL one-row GEMV (gemv_kernel.py) runs this product: one 16-bit
    activation row, and weights either of its dtype or 8-bit weight-only (fp8 e4m3 / int8
    with an fp32 per-channel w_scale, no SmoothQuant x_scale), with 16-byte aligned rows (they
    are bulk copied) of at most 2 * GEMV_K_MAX bytes, K a multiple of 16, on CUDA, and not both
    N and K of at least GEMV_LONG_ROWS (the Llama family's shapes, where the Triton kernel's
    long-row picks measured faster: see _long_row_blocks). Everything else stays on the Triton
    kernel."""
    if not env.enabled(GEMV_SM90_ENV) or not x.is_cuda or x.shape[0] != 1:
        return False
    K = x.shape[1]
    if K >= GEMV_LONG_ROWS and w_nk.shape[0] >= GEMV_LONG_ROWS:
        return False
    es = w_nk.element_size()
    if x.dtype not in (torch.bfloat16, torch.float16) or x_scale is not None:
        return False
    if w_scale is None:
        if w_nk.dtype != x.dtype:
            return False
    elif w_nk.dtype not in GEMV_SM90_8BIT or w_scale.dtype != torch.float32 or w_scale.numel() != w_nk.shape[0] \
            or not w_scale.is_contiguous():
        return False
    if K % 16 or K * es > GEMV_K_MAX * 2 or K == 0 or w_nk.shape[0] == 0 or x.stride(1) != 1 or w_nk.stride(1) != 1:
        return False
    if (w_nk.stride(0) * es) % 16 or not (_aligned16(x) and _aligned16(w_nk)):
        return False
    if out.dtype not in (torch.bfloat16, torch.float16, torch.float32) or out.stride(1) != 1:
        return False
    if residual is not None and (residual.dtype != out.dtype or residual.stride(1) != 1):
        return False
    if bias is not None and (bias.dtype != out.dtype or bias.stride(0) != 1):
        return False
    return ln is None or _ln_params_ok(x, ln[0], ln[1])


def _ln_params_ok(x, lw, lb) -> bool:
    """LayerNorm weight and bias as the one-row kernels bulk-copy them: [K] of x's dtype,
    contiguous, 16-byte aligned."""
    K = x.shape[-1]
    return (lw.dtype == x.dtype and lb.dtype == x.dtype and lw.numel() == K and lb.numel() == K
            and lw.is_contiguous() and lb.is_contiguous() and _aligned16(lw) and _aligned16(lb))


def gemv_sm90_config(N: int, K: int, ln: bool, slice_bytes: int | None = None, wbytes: int = 2):
    """The GemvConfig for an N x K one-row product.

    Each CTA holds its rows whole in shared memory, all copied before the PDL wait, so a
    CTA's share is what it keeps in flight. Slices of about `slice_bytes` leave room for
    several CTAs per SM, of this GEMV and of the next one (whose copies then start while
    this one finishes); at least one CTA per SM where N allows. Rows come in multiples of 8
    (the MMA's n) and k_max in multiples of 64, so a handful of variants serve all shapes."""
    from .config import H100_SMS, GemvConfig

    if N >= GEMV_VOCAB_N and wbytes == 2:
        rows = (slice_bytes or GEMV_VOCAB_SLICE_BYTES) // (wbytes * K) // 8 * 8
    else:
        rows = round((slice_bytes or GEMV_SLICE_BYTES) / (wbytes * K) / 8) * 8
    rows = max(8, min(GEMV_MAX_ROWS, rows, N // H100_SMS // 8 * 8))
    return GemvConfig(rows=rows, k_max=-(-K // 64) * 64, warps=GEMV_WARPS, wbytes=wbytes)


# Decode plans: the per-call values of a one-row GEMV -> its compiled kernel (config and
# epilogue built once per shape; the JIT cache below it is KERNELS.compiled).
_FAST_GEMV: dict = {}


def _gemv_sm90_kernel(x_dt, w_dt, out_dt, N, K, activation, bias, residual, alpha, beta, ln, kv_key):
    """The compiled one-row GEMV for a _FAST_GEMV key (memory / disk cache, compile on a miss)."""
    from ..runtime import KERNELS
    from .config import Epilogue

    w8 = w_dt in GEMV_SM90_8BIT
    cfg = gemv_sm90_config(N, K, ln, wbytes=1 if w8 else 2)
    epi = Epilogue(activation=activation or "none", bias=bias, residual=residual, alpha=alpha, beta=beta,
                   col_scale="vector" if w8 else "none")
    return KERNELS.compiled("gemv_sm90", _compile_gemv_sm90, x_dt, out_dt, epi, ln, kv_key, cfg, w_dt=w_dt)


def _compile_gemv_sm90(x_dt, out_dt, epi, ln: bool, kv, cfg, keep_dir: str | None = None, w_dt=None):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from ..runtime import TARGET_ARCH
    from ..runtime.dtypes import to_cutlass
    from .gemv_kernel import GemvSm90

    w_dt = w_dt or x_dt
    xt, ot, wt = to_cutlass(x_dt), to_cutlass(out_dt), to_cutlass(w_dt)
    n, k = cute.sym_int32(), cute.sym_int32(divisibility=16)
    fx = make_fake_tensor(xt, (1, k), (cute.sym_int64(), 1), assumed_align=16)
    fw = make_fake_tensor(wt, (n, k), (cute.sym_int64(divisibility=16 // cfg.wbytes), 1), assumed_align=16)
    fws = make_fake_tensor(cutlass.Float32, (n,), (1,), assumed_align=4) if w_dt in GEMV_SM90_8BIT else None
    fo = make_fake_tensor(ot, (1, n), (cute.sym_int64(), 1), assumed_align=4 if out_dt == torch.float32 else 2)
    fbias = make_fake_tensor(ot, (n,), (1,), assumed_align=2) if epi.bias else None
    fres = make_fake_tensor(ot, (1, n), (cute.sym_int64(), 1), assumed_align=2) if epi.residual else None
    fln = [make_fake_tensor(xt, (k,), (1,), assumed_align=16) for _ in range(2)] if ln else [None, None]
    fkc = fvc = fpos = None
    if kv is not None:
        cache_dt, pos_dt = kv
        b, h, smax, d = cute.sym_int32(), cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
        fkc, fvc = (make_fake_tensor(to_cutlass(cache_dt), (b, h, smax, d),
                                     (cute.sym_int64(), cute.sym_int64(), cute.sym_int64(), 1), assumed_align=2)
                    for _ in range(2))
        fpos = make_fake_tensor(to_cutlass(pos_dt), (cute.sym_int32(),), (1,), assumed_align=4)
    f32 = cutlass.Float32
    kernel = GemvSm90(cfg, epi, ln, kv is not None, GEMV_SM90_8BIT.get(w_dt))
    return cute.compile(kernel, fx, fw, fo, fbias, fres, *fln, fkc, fvc, fpos, fws, f32(1.0), f32(1.0), f32(1e-5),
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}"
                        + (f" --keep-ptx --dump-dir {keep_dir}" if keep_dir else ""))


def gemv_sm90(x, w_nk, out, bias=None, activation=None, residual=None, alpha=1.0, beta=1.0, ln=None, kv=None,
              w_scale=None):
    """out[0] = epilogue(LN(x) @ w_nk.T) on the CuTe DSL one-row kernel (see gemv_sm90_applies)."""
    N, K = w_nk.shape
    kv_key = None
    if kv is not None:
        k_cache, v_cache, pos = kv
        _check_kv(k_cache, v_cache, pos, 1, N)
        kv_key = (k_cache.dtype, pos.dtype)
    # Decode calls this once per linear per token: one dict lookup on plain values, the
    # config, epilogue and compile key are built on a miss only.
    fkey = (x.dtype, w_nk.dtype, out.dtype, N, K, activation, bias is not None, residual is not None, alpha != 1.0,
            residual is not None and beta != 1.0, ln is not None, kv_key)
    fn = _FAST_GEMV.get(fkey)
    if fn is None:
        fn = _FAST_GEMV[fkey] = _gemv_sm90_kernel(*fkey)
    lw, lb, eps = ln if ln is not None else (None, None, 1e-5)
    kc = vc = pos = None
    if kv is not None:
        kc, vc, pos = kv
    fn(x, w_nk, out, bias, residual, lw, lb, kc, vc, pos, w_scale, float(alpha), float(beta), float(eps))
    return out
