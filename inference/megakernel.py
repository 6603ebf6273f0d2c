"""GPT-2's whole decode step (batch 1) as one persistent kernel: experimental, opt-in.

Status (H100, 2026-11-22, GPT-2 XL, prompt 128, 128 new tokens): correct (greedy tokens
equal to the separate kernels', logits within bf16 rounding) but *slower*: 2.23-2.41 ms
per token against 1.82 for the separate kernels, so StaticDecoder uses it only with
CUTE_KERNELS_MEGAKERNEL=1. Kept as the base for the next attempt; NOTES.md has the sweep.

Why try: at batch 1 a decode step reads every weight once (GPT-2 XL: 3.1 GB of bf16,
0.93 ms at 3.35 TB/s) and does almost no math, so its time is bytes / bandwidth plus
every moment HBM sits idle. As separate kernels (four GEMVs and an attention per layer,
241 launches) HBM idles at each boundary: the next kernel waits for the previous one to
drain (griddepcontrol.wait, ~1.4 us each even with PDL) and starts cold.

Here one launch of G = #SMs programs (a cooperative launch: all resident, or the launch
fails; it never hangs) runs the step as a sequence of phases separated by grid barriers:

    P0  embedding          h = wte[tok] + wpe[pos]
    per layer:
    P1  ln_1 + c_attn      qkv = LN1(h) @ Wqkv + b; k, v appended to the layer's cache
    P2  attention          (head, split) units over key ranges; the last unit of a head
                           merges the partial softmax states
    P3  attn c_proj        h += o @ Wproj + b
    P4  ln_2 + c_fc        f = gelu_tanh(LN2(h) @ Wfc + b)
    P5  mlp c_proj         h += f @ Wmproj + b
    P6  ln_f + lm_head     logits slice, per-program argmax; program 0 reduces it, writes
                           the token and advances the device-side counters.

Each program owns a fixed slice of every GEMV's output columns (ceil(N / G) rows of the
weight, contiguous in memory), so the weights stream exactly once and evenly, and it
requests the first two weight tiles of the *next* phase before it enters each barrier
(weights do not depend on the previous phase).

What the sweep showed: without the barriers (SYNC=False, wrong results) the step still
takes 1.8 ms, so streaming inside the phases, not only the barriers (~2 us each), is
the problem: every phase pays a serial chain (barrier, an L2 round trip for the
activation row and LayerNorm statistics, the pipeline ramp, a cross-warp reduction and
the epilogue) of a few microseconds, 241 times, while one program per SM keeps too few
bytes in flight to hide it. Deeper register prefetch (3-4 tiles), whole-row steps,
bulk L2 prefetch of the next phase (cp.async.bulk.prefetch.L2) and Triton's own loop
pipelining all measured the same or slower. The way forward is fewer dependent phases
(split-K so that attention feeds c_proj and c_fc feeds the mlp c_proj without a barrier)
and weights streamed into shared memory by a producer warp (TMA) across phases.

Rounding follows the separate-kernel path (tests compare against it): every activation
that is a bf16 tensor there (LayerNorm outputs, qkv, attention output, f, h) is rounded to
the model dtype here at the same point, with fp32 accumulation in between.

Why Triton, like the skinny GEMM (cute_kernels/gemm/gemv.py): the step is bandwidth- and
latency-bound streaming with no tensor-core math, and its logic runs on the CPU under
TRITON_INTERPRET=1 with one program (the grid barrier then passes at once), which is how
CI checks it against the separate-kernel step.

Data written inside the kernel and read by other programs (h, qkv, o, f, the partials,
the new cache row) is read with `.cg` (L2, not the SM's L1, which is not coherent
across SMs).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from cute_kernels.runtime import num_sms

MEGAKERNEL_ENV = "CUTE_KERNELS_MEGAKERNEL"

# Per-layer pointer table columns (int64 data pointers).
_NAMES = ("LN1_W", "LN1_B", "QKV_W", "QKV_B", "PROJ_W", "PROJ_B", "LN2_W", "LN2_B", "FC_W", "FC_B", "MPROJ_W",
          "MPROJ_B", "K_CACHE", "V_CACHE")
(LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, MPROJ_W, MPROJ_B, K_CACHE,
 V_CACHE) = (tl.constexpr(i) for i in range(len(_NAMES)))
NPTR = tl.constexpr(len(_NAMES))

# Elements per weight tile (a program's rows x BK = TILE / rows): 64 B of bf16 per thread
# at 8 warps; two tiles in flight per program, also across each barrier. 4096 and 16384
# measured slower (fewer bytes in flight; spills).
TILE = 8192


def megakernel_enabled() -> bool:
    """Opt-in (CUTE_KERNELS_MEGAKERNEL=1): on the H100 it is correct but slower than the
    separate kernels (see the module docstring)."""
    return os.environ.get(MEGAKERNEL_ENV, "0") == "1"


# --------------------------------------------------------------------------- device helpers


@triton.jit
def _layer_ptr(tab_ptr, layer, IDX: tl.constexpr, DT: tl.constexpr):
    p = tl.load(tab_ptr + layer * NPTR + IDX).to(tl.pointer_type(DT))
    return tl.multiple_of(p, 16)  # every table entry is a 16-byte aligned tensor start


@triton.jit
def _grid_barrier(bar_ptr, target, SYNC: tl.constexpr):
    """All G programs reach this point (the counter reaches `target` = G * barrier index).
    SYNC=False skips it (wrong results; only to time the kernel without its barriers)."""
    tl.debug_barrier()  # this program's stores happen before its release below
    if SYNC:
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


@triton.jit
def _rows(N, pid, G):
    """This program's output columns (weight rows) [r0, r1) of an N-wide GEMV."""
    return (pid * N) // G, ((pid + 1) * N) // G


@triton.jit
def _w_tile(w_ptr, r0, r1, K, kstep, BN: tl.constexpr, BK: tl.constexpr):
    """Weight rows [r0, r0 + BN) (masked to r1), K columns [kstep * BK, +BK). Fully masked
    tiles (past the end) issue no memory traffic."""
    rows = r0 + tl.arange(0, BN)
    ks = kstep * BK + tl.arange(0, BK)
    ptrs = w_ptr + rows[:, None].to(tl.int64) * K + ks[None, :]
    return tl.load(ptrs, mask=(rows < r1)[:, None] & (ks < K)[None, :], other=0.0)


@triton.jit
def _first_tiles(w_ptr, r0, r1, K, BN: tl.constexpr, BK: tl.constexpr):
    """K-steps 0 and 1 of a program's weight rows: what it requests before a grid barrier."""
    return _w_tile(w_ptr, r0, r1, K, 0, BN, BK), _w_tile(w_ptr, r0, r1, K, 1, BN, BK)


@triton.jit
def _vec(ptr, kstep, K, BK: tl.constexpr, CG: tl.constexpr):
    """Elements [kstep * BK, +BK) of a row (0 past K); CG: written in this kernel."""
    ks = kstep * BK + tl.arange(0, BK)
    if CG:
        return tl.load(ptr + ks, mask=ks < K, other=0.0, cache_modifier=".cg")
    return tl.load(ptr + ks, mask=ks < K, other=0.0)


@triton.jit
def _gelu_tanh(x):
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))  # == 0.5 x (1 + tanh(u))


@triton.jit
def _gemv(w2, w_ptr, r0, r1, K, x_ptr, LN: tl.constexpr, g_ptr, b_ptr, eps, EPI: tl.constexpr, bias_ptr, out_ptr,
          kc_ptr, vc_ptr, E, stride_h, stride_s, pos, D: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          K_PAD: tl.constexpr):
    """One phase's GEMV for this program's weight rows [r0, r1) (<= BN of them):
    y = w[rows] . x, x the activation row (LN: LayerNorm(x) with g, b, rounded to x's dtype
    as the LayerNorm's output tensor is), then the epilogue, in fp32 and rounded once to the
    output dtype where the separate kernels round:
      EPI 0: c_attn: out = y + bias; columns [E, 3E) also go to the caches at row pos
      EPI 1: residual: out += y + bias            (out = h, this program's own rows)
      EPI 2: c_fc: out = gelu_tanh(y + bias)
      EPI 3: logits: returns y (fp32 of the model dtype) for the caller's argmax
    w2 holds k-steps 0 and 1, already loading. Each step requests the weights two steps
    ahead and the activation slices two steps ahead, and only multiplies into a
    [BN, BK] accumulator (no per-step reduction: a step's only serial latency is its own
    loads); everything the epilogue reads is requested before the loop."""
    rows = r0 + tl.arange(0, BN)
    rm = rows < r1
    if EPI != 3:
        bias = tl.load(bias_ptr + rows, mask=rm, other=0.0).to(tl.float32)
    if EPI == 1:
        res = tl.load(out_ptr + rows, mask=rm, other=0.0, cache_modifier=".cg").to(tl.float32)
    xa = _vec(x_ptr, 0, K, BK, True)
    xb = _vec(x_ptr, 1, K, BK, True)
    mean = 0.0
    rstd = 1.0
    if LN:
        ga = _vec(g_ptr, 0, K, BK, False)
        gb = _vec(g_ptr, 1, K, BK, False)
        ba = _vec(b_ptr, 0, K, BK, False)
        bb = _vec(b_ptr, 1, K, BK, False)
        kk = tl.arange(0, K_PAD)
        hrow = tl.load(x_ptr + kk, mask=kk < K, other=0.0, cache_modifier=".cg").to(tl.float32)
        mean = tl.sum(hrow, 0) / K
        dev = tl.where(kk < K, hrow - mean, 0.0)  # two passes: GPT-2's residual stream has large means
        rstd = 1.0 / tl.sqrt(tl.sum(dev * dev, 0) / K + eps)
    else:
        ga, gb, ba, bb = xa, xb, xa, xb
    wa, wb = w2
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for s in range(tl.cdiv(K, BK)):
        wn = _w_tile(w_ptr, r0, r1, K, s + 2, BN, BK)
        xn = _vec(x_ptr, s + 2, K, BK, True)
        x = xa.to(tl.float32)
        if LN:
            gn = _vec(g_ptr, s + 2, K, BK, False)
            bn = _vec(b_ptr, s + 2, K, BK, False)
            # past K: x, g, b are all 0, so the value is 0 (it meets masked weights too)
            x = ((x - mean) * rstd * ga.to(tl.float32) + ba.to(tl.float32)).to(x_ptr.dtype.element_ty)
            x = x.to(tl.float32)
        else:
            gn, bn = xn, xn
        acc += wa.to(tl.float32) * x[None, :]
        wa, wb, xa, xb, ga, gb, ba, bb = wb, wn, xb, xn, gb, gn, bb, bn
    y = tl.sum(acc, 1)
    if EPI == 3:
        y = y.to(w_ptr.dtype.element_ty)  # the logits tensor's dtype, as argmax sees it
    else:
        y += bias
        if EPI == 1:
            y += res
        if EPI == 2:
            y = _gelu_tanh(y)
        y = y.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows, y, mask=rm)
        if EPI == 0:
            part = rows // E
            within = rows - part * E
            off = (within // D) * stride_h + pos * stride_s + within % D
            tl.store(kc_ptr + off, y, mask=rm & (part == 1))
            tl.store(vc_ptr + off, y, mask=rm & (part == 2))
    return y.to(tl.float32)


@triton.jit
def _attention(qkv_ptr, kc_ptr, vc_ptr, o_ptr, part_o_ptr, part_ml_ptr, cnt_ptr, L, H, stride_h, stride_s, qk_scale,
               pid, G, D: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_L: tl.constexpr):
    """o[head] = softmax(q k^T) v over the first L cache rows, as (head, split) units over
    key ranges. With NSPLIT > 1 each unit leaves its unnormalized state (m in log2 units,
    l, o[D]) and the last unit of a head to finish (an acq_rel counter) merges them, so
    the next phase reads a plain row."""
    chunk = tl.cdiv(L, NSPLIT)
    d = tl.arange(0, D)
    for u in range(pid, H * NSPLIT, G):
        head = u // NSPLIT
        split = u % NSPLIT
        q = tl.load(qkv_ptr + head * D + d, cache_modifier=".cg").to(tl.float32) * qk_scale
        lo = split * chunk
        hi = tl.minimum(lo + chunk, L)
        m = tl.max(tl.full((BLOCK_L,), float("-inf"), tl.float32), 0)
        l = tl.sum(tl.zeros((BLOCK_L,), tl.float32), 0)
        o = tl.zeros((D,), tl.float32)
        for j in range(lo, hi, BLOCK_L):
            rows = j + tl.arange(0, BLOCK_L)
            rm = rows < hi
            off = head * stride_h + rows[:, None].to(tl.int64) * stride_s + d[None, :]
            k = tl.load(kc_ptr + off, mask=rm[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
            v = tl.load(vc_ptr + off, mask=rm[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
            sc = tl.where(rm, tl.sum(k * q[None, :], 1), float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 0))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(sc - m_new)
            l = l * alpha + tl.sum(p, 0)
            o = o * alpha + tl.sum(p[:, None] * v, 0)
            m = m_new
        if NSPLIT == 1:
            tl.store(o_ptr + head * D + d, (o / l).to(o_ptr.dtype.element_ty))
        else:
            tl.store(part_o_ptr + u * D + d, o)
            tl.store(part_ml_ptr + u * 2, m)
            tl.store(part_ml_ptr + u * 2 + 1, l)
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + head, 1, sem="acq_rel", scope="gpu")
            if done == NSPLIT - 1:
                sp = head * NSPLIT + tl.arange(0, NSPLIT)
                ms = tl.load(part_ml_ptr + sp * 2, cache_modifier=".cg")
                ls = tl.load(part_ml_ptr + sp * 2 + 1, cache_modifier=".cg")
                os_ = tl.load(part_o_ptr + sp[:, None] * D + d[None, :], cache_modifier=".cg")
                w = tl.exp2(ms - tl.max(ms, 0))  # empty splits: m = -inf, weight 0
                out = tl.sum(w[:, None] * os_, 0) / tl.sum(w * ls, 0)
                tl.store(o_ptr + head * D + d, out.to(o_ptr.dtype.element_ty))
                tl.atomic_xchg(cnt_ptr + head, 0, sem="relaxed", scope="gpu")


# --------------------------------------------------------------------------- the kernel


@triton.jit
def _decode_step_kernel(
    tab_ptr, wte_ptr, wpe_ptr, lnf_w_ptr, lnf_b_ptr, lm_w_ptr,
    h_ptr, qkv_ptr, o_ptr, f_ptr, part_o_ptr, part_ml_ptr, cnt_ptr, best_v_ptr, best_i_ptr, logits_ptr,
    tok_ptr, pos_ptr, step_ptr, out_ptr, bar_ptr,
    n_layer, E, H, V, stride_h, stride_s, eps, qk_scale,
    DT: tl.constexpr, D: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_L: tl.constexpr, TILE: tl.constexpr,
    E_PAD: tl.constexpr, F_PAD: tl.constexpr, G_PAD: tl.constexpr,
    BN_QKV: tl.constexpr, BN_E: tl.constexpr, BN_FC: tl.constexpr, BN_LM: tl.constexpr,
    SYNC: tl.constexpr = True,
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    BK_QKV: tl.constexpr = TILE // BN_QKV
    BK_E: tl.constexpr = TILE // BN_E
    BK_FC: tl.constexpr = TILE // BN_FC
    BK_LM: tl.constexpr = TILE // BN_LM
    tok = tl.load(tok_ptr)
    pos = tl.load(pos_ptr)
    nbar = 0
    q0, q1 = _rows(3 * E, pid, G)
    p0, p1 = _rows(E, pid, G)
    f0, f1 = _rows(4 * E, pid, G)
    l0, l1 = _rows(V, pid, G)

    # Layer 0's c_attn weights start loading first: they do not depend on the embedding.
    wq = _layer_ptr(tab_ptr, 0, QKV_W, DT)
    wq2 = _first_tiles(wq, q0, q1, E, BN_QKV, BK_QKV)

    # P0: h = wte[tok] + wpe[pos], this program's slice.
    ce = p0 + tl.arange(0, BN_E)
    cm = ce < p1
    emb = tl.load(wte_ptr + tok * E + ce, mask=cm, other=0.0).to(tl.float32)
    emb += tl.load(wpe_ptr + pos * E + ce, mask=cm, other=0.0).to(tl.float32)
    tl.store(h_ptr + ce, emb.to(DT), mask=cm)
    nbar += 1
    _grid_barrier(bar_ptr, nbar * G, SYNC)

    for layer in range(n_layer):
        kc = _layer_ptr(tab_ptr, layer, K_CACHE, DT)
        vc = _layer_ptr(tab_ptr, layer, V_CACHE, DT)
        # ---- P1: ln_1 + c_attn (+ the new k, v cache rows)
        _gemv(wq2, wq, q0, q1, E, h_ptr, True, _layer_ptr(tab_ptr, layer, LN1_W, DT),
              _layer_ptr(tab_ptr, layer, LN1_B, DT), eps, 0, _layer_ptr(tab_ptr, layer, QKV_B, DT), qkv_ptr, kc, vc,
              E, stride_h, stride_s, pos, D, BN_QKV, BK_QKV, E_PAD)
        wp = _layer_ptr(tab_ptr, layer, PROJ_W, DT)
        wp2 = _first_tiles(wp, p0, p1, E, BN_E, BK_E)
        nbar += 1
        _grid_barrier(bar_ptr, nbar * G, SYNC)

        # ---- P2: attention over the first pos + 1 cache rows
        _attention(qkv_ptr, kc, vc, o_ptr, part_o_ptr, part_ml_ptr, cnt_ptr, pos + 1, H, stride_h, stride_s,
                   qk_scale, pid, G, D, NSPLIT, BLOCK_L)
        wf = _layer_ptr(tab_ptr, layer, FC_W, DT)
        nbar += 1
        _grid_barrier(bar_ptr, nbar * G, SYNC)

        # ---- P3: attention c_proj + residual
        _gemv(wp2, wp, p0, p1, E, o_ptr, False, o_ptr, o_ptr, eps, 1, _layer_ptr(tab_ptr, layer, PROJ_B, DT), h_ptr,
              kc, vc, E, stride_h, stride_s, pos, D, BN_E, BK_E, E_PAD)
        wf2 = _first_tiles(wf, f0, f1, E, BN_FC, BK_FC)
        wm = _layer_ptr(tab_ptr, layer, MPROJ_W, DT)
        nbar += 1
        _grid_barrier(bar_ptr, nbar * G, SYNC)

        # ---- P4: ln_2 + c_fc + gelu_tanh
        _gemv(wf2, wf, f0, f1, E, h_ptr, True, _layer_ptr(tab_ptr, layer, LN2_W, DT),
              _layer_ptr(tab_ptr, layer, LN2_B, DT), eps, 2, _layer_ptr(tab_ptr, layer, FC_B, DT), f_ptr, kc, vc, E,
              stride_h, stride_s, pos, D, BN_FC, BK_FC, E_PAD)
        wm2 = _first_tiles(wm, p0, p1, 4 * E, BN_E, BK_E)
        nbar += 1
        _grid_barrier(bar_ptr, nbar * G, SYNC)

        # ---- P5: mlp c_proj + residual
        _gemv(wm2, wm, p0, p1, 4 * E, f_ptr, False, f_ptr, f_ptr, eps, 1, _layer_ptr(tab_ptr, layer, MPROJ_B, DT),
              h_ptr, kc, vc, E, stride_h, stride_s, pos, D, BN_E, BK_E, F_PAD)
        # The next layer's c_attn weights (past the last layer: none, fully masked).
        wq = _layer_ptr(tab_ptr, tl.minimum(layer + 1, n_layer - 1), QKV_W, DT)
        wq2 = _first_tiles(wq, q0, tl.where(layer + 1 < n_layer, q1, q0), E, BN_QKV, BK_QKV)
        nbar += 1
        _grid_barrier(bar_ptr, nbar * G, SYNC)

    # ---- P6: ln_f + lm_head, argmax over this program's rows in chunks of BN_LM
    best_v = tl.max(tl.full((BN_LM,), float("-inf"), tl.float32), 0)
    best_i = tl.min(tl.full((BN_LM,), 2147483647, tl.int32), 0)
    for c in range(l0, l1, BN_LM):
        c_end = tl.minimum(c + BN_LM, l1)
        y = _gemv(_first_tiles(lm_w_ptr, c, c_end, E, BN_LM, BK_LM), lm_w_ptr, c, c_end, E, h_ptr, True, lnf_w_ptr,
                  lnf_b_ptr, eps, 3, lnf_b_ptr, lnf_b_ptr, lnf_b_ptr, lnf_b_ptr, E, stride_h, stride_s, pos, D, BN_LM,
                  BK_LM, E_PAD)
        cols = c + tl.arange(0, BN_LM)
        cmask = cols < c_end
        if logits_ptr is not None:
            tl.store(logits_ptr + cols, y, mask=cmask)
        y = tl.where(cmask, y, float("-inf"))
        cmax = tl.max(y, 0)
        cidx = tl.min(tl.where(y == cmax, cols, 2147483647), 0)
        better = cmax > best_v  # strictly: earlier columns win ties, as in torch.argmax
        best_i = tl.where(better, cidx, best_i)
        best_v = tl.where(better, cmax, best_v)
    tl.store(best_v_ptr + pid, best_v)
    tl.store(best_i_ptr + pid, best_i)
    # Last barrier: every program arrives, only program 0 waits (the others are done), then
    # it resets the counter for the next step; nobody reads it after arriving.
    nbar += 1
    if not SYNC:
        nbar = 1
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    if pid == 0:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        while seen < nbar * G:
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        gi = tl.arange(0, G_PAD)
        vals = tl.load(best_v_ptr + gi, mask=gi < G, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(best_i_ptr + gi, mask=gi < G, other=2147483647, cache_modifier=".cg")
        vmax = tl.max(vals, 0)
        token = tl.min(tl.where(vals == vmax, idxs, 2147483647), 0).to(tl.int64)
        step = tl.load(step_ptr)
        tl.store(out_ptr + step, token)
        tl.store(tok_ptr, token)
        tl.store(pos_ptr, pos + 1)
        tl.store(step_ptr, step + 1)
        tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")


# --------------------------------------------------------------------------- host side


MAX_ROWS = 1024  # widest slice of one weight a program takes in one [rows, TILE / rows] tile


def _rows_per_program(n: int, g: int) -> int:
    return max(16, triton.next_power_of_2(triton.cdiv(n, g)))


def megakernel_plan(model, batch_size: int, k_caches, v_caches) -> str | None:
    """Why the fused decode step cannot run this model/cache (None: it can)."""
    from .patch import CuteConv1D, CuteLMHead

    if not megakernel_enabled():
        return f"off (set {MEGAKERNEL_ENV}=1)"
    if batch_size != 1:
        return "batch > 1"
    cfg = model.config
    gpt = model.transformer
    E, H = cfg.n_embd, cfg.n_head
    D = E // H
    dt = gpt.wte.weight.dtype
    if dt not in (torch.bfloat16, torch.float16):
        return f"dtype {dt}"
    if D * H != E or D & (D - 1) or not 16 <= D <= 256 or E % 16:
        return f"head_dim {D} / n_embd {E}"
    if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh") or getattr(cfg, "scale_attn_by_inverse_layer_idx",
                                                                                   False):
        return "activation or attention scaling other than GPT-2's"
    lm = model.lm_head
    if not isinstance(lm, CuteLMHead) or lm.bias is not None or not lm.weight.is_contiguous() or lm.weight.dtype != dt:
        return "lm_head is not our bf16/fp16 linear"
    for blk in gpt.h:
        for lin in (blk.attn.c_attn, blk.attn.c_proj, blk.mlp.c_fc, blk.mlp.c_proj):
            if not isinstance(lin, CuteConv1D) or lin.weight.dtype != dt or not lin.weight.t().is_contiguous() \
                    or lin.bias is None:
                return "a linear is not our bf16/fp16 Conv1D (quantized?)"
        if blk.mlp.c_fc.activation != "gelu_tanh" or blk.mlp.c_proj.activation or blk.attn.c_proj.activation \
                or blk.attn.c_attn.activation:
            return "unexpected fused activations"
    if len(gpt.h) < 1 or triton.next_power_of_2(4 * E) > TILE:
        return f"n_embd {E}: 4 * n_embd must fit one {TILE}-element weight step"
    kc = k_caches[0]
    if any(t.stride() != kc.stride() or t.shape != kc.shape or t.dtype != dt for t in (*k_caches, *v_caches)) \
            or kc.stride(3) != 1 or not kc.is_cuda:
        return "caches differ in layout"
    return None


class DecodeMegakernel:
    """The fused decode step for a patched GPT-2 (see the module docstring) at batch 1.

    Reads the token at tok[0] and its position pos[0]; writes the greedy next token to
    out[step[0]] and tok[0] and advances pos and step: the same device-side contract as
    StaticDecoder's decode step, so it replays in a CUDA graph with no host work. Pointers
    to the weights and caches are taken once, here: rebuild after moving the model.
    """

    def __init__(self, model, k_caches, v_caches, tok, pos, step, out, *, programs: int | None = None,
                 keep_logits: bool = False, nsplit: int | None = None):
        cfg = model.config
        gpt = model.transformer
        self.E, self.H = cfg.n_embd, cfg.n_head
        self.D = self.E // self.H
        self.V = model.lm_head.weight.shape[0]
        self.n_layer = len(gpt.h)
        self.eps = float(gpt.h[0].ln_1.eps)
        self.dtype = gpt.wte.weight.dtype
        dev = gpt.wte.weight.device
        if programs is None:
            programs = num_sms(dev.index or 0) if dev.type == "cuda" else 1
        self.G = G = programs
        if G > 256:
            raise ValueError("at most 256 programs (the final argmax reduction's width)")
        self.model, self.k_caches, self.v_caches = model, k_caches, v_caches  # keep the pointers alive
        rows = []
        for i, blk in enumerate(gpt.h):
            ts = [blk.ln_1.weight, blk.ln_1.bias, blk.attn.c_attn.weight, blk.attn.c_attn.bias,
                  blk.attn.c_proj.weight, blk.attn.c_proj.bias, blk.ln_2.weight, blk.ln_2.bias,
                  blk.mlp.c_fc.weight, blk.mlp.c_fc.bias, blk.mlp.c_proj.weight, blk.mlp.c_proj.bias,
                  k_caches[i], v_caches[i]]
            for t in ts:
                if t.data_ptr() % 16:
                    raise ValueError("every weight and cache must start 16-byte aligned")
            rows.append([t.data_ptr() for t in ts])
        self.table = torch.tensor(rows, dtype=torch.int64, device=dev)
        E, H, D = self.E, self.H, self.D
        if nsplit is None:  # key-range splits per head: fill the programs, at most 8
            nsplit = 1
            while nsplit < 8 and H * nsplit * 2 <= G:
                nsplit *= 2
        if nsplit & (nsplit - 1):
            raise ValueError("nsplit must be a power of two")
        self.nsplit = nsplit
        self.sync = True  # False: time without grid barriers (wrong results)
        self.cooperative = dev.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1"
        self.tile, self.num_warps = TILE, 8
        self.blocks = {"BN_QKV": _rows_per_program(3 * E, G), "BN_E": _rows_per_program(E, G),
                       "BN_FC": _rows_per_program(4 * E, G), "BN_LM": min(64, _rows_per_program(self.V, G))}
        if max(self.blocks.values()) > MAX_ROWS:
            raise ValueError(f"{G} programs leave a program more than {MAX_ROWS} rows of one weight")
        f32 = {"device": dev, "dtype": torch.float32}
        self.h = torch.empty(E, device=dev, dtype=self.dtype)
        self.qkv = torch.empty(3 * E, device=dev, dtype=self.dtype)
        self.o = torch.empty(E, device=dev, dtype=self.dtype)
        self.counts = torch.zeros(H, device=dev, dtype=torch.int32)
        self.f = torch.empty(4 * E, device=dev, dtype=self.dtype)
        self.part_o = torch.empty(H * nsplit * D, **f32)
        self.part_ml = torch.empty(H * nsplit * 2, **f32)
        self.best_v = torch.empty(G, **f32)
        self.best_i = torch.empty(G, device=dev, dtype=torch.int32)
        self.logits = torch.empty(self.V, **f32) if keep_logits else None
        self.barrier = torch.zeros(1, device=dev, dtype=torch.int32)
        self.tok, self.pos, self.step, self.out = tok, pos, step, out
        self.keep_logits = keep_logits
        self.scale = float(model.transformer.h[0].attn.scaling) * 1.4426950408889634  # log2 units

    def __call__(self):
        kc = self.k_caches[0]
        gpt = self.model.transformer
        kw = {"launch_cooperative_grid": True} if self.cooperative else {}
        _decode_step_kernel[(self.G,)](
            self.table, gpt.wte.weight, gpt.wpe.weight, gpt.ln_f.weight, gpt.ln_f.bias, self.model.lm_head.weight,
            self.h, self.qkv, self.o, self.f, self.part_o, self.part_ml, self.counts, self.best_v, self.best_i,
            self.logits, self.tok, self.pos, self.step, self.out, self.barrier,
            self.n_layer, self.E, self.H, self.V, kc.stride(1), kc.stride(2), self.eps, self.scale,
            DT=tl.bfloat16 if self.dtype == torch.bfloat16 else tl.float16, D=self.D, NSPLIT=self.nsplit,
            BLOCK_L=64, TILE=self.tile, E_PAD=triton.next_power_of_2(self.E),
            F_PAD=triton.next_power_of_2(4 * self.E), G_PAD=triton.next_power_of_2(self.G), SYNC=self.sync,
            **self.blocks,
            num_warps=self.num_warps, **kw,
        )
