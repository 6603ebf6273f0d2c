"""GPT-2's decode c_attn and its attention in one launch (CuTe DSL, sm_90a): experimental.

    qkv = LN(x) @ W_attn.T + b;  k, v appended to the cache at row pos;  o = softmax(q K^T) V

over keys 0..pos of one sequence (batch 1), head dimension 64. In the decode chain the
attention kernel between c_attn and the output projection adds ~6 us per layer on the
H100 (NOTES.md, "The decode chain runs ahead"), mostly latency: its PDL wait, q's round
trip, the merge. Here the GEMV's CTAs do the attention themselves: one thread-block
cluster of 6 CTAs per head, each CTA computing 32 of the head's 192 q/k/v outputs (its
weight rows remapped by `row_base`), so the 150 CTAs of the plain c_attn GEMV stay 150.

Warp roles: those of GemvSm90 up to its epilogue; then every warp attends. Pipelines:
GemvSm90's row barriers, and three cluster barriers: an arrive at kernel start (no CTA
stores into another's shared memory before that one runs), after the q/k/v exchange (each
output thread stores its value into every rank's sQKV with st.shared::cluster), and after
the partials (m, l, o of each rank into rank 0). Rank r attends over a contiguous 1/6 of
the keys: the older ones from the cache in global memory, the new one from sQKV; warps
take keys round robin, lanes own 2 of the 64 dimensions, scores are a warp butterfly sum,
online softmax in log2 units, 4 keys' loads in flight per warp. Rank 0 merges the 6
partials and writes o.

Status: compiles for sm_90a (tests/test_gemm_host.py); not yet run on a GPU. Off unless
CUTE_KERNELS_DECODE_FUSED_ATTN=1 (inference/decode.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp as warp_ops

from ..attention.decode import store_f32_cluster
from .gemv_kernel import GemvConfig, GemvSm90
from .kernel import Epilogue


class GemvAttnSm90(GemvSm90):
    """c_attn (LayerNorm prologue, bias, KV append) + decode attention; see the module docstring."""

    def __init__(self, cfg: GemvConfig, head_dim: int = 64, cluster: int = 6):
        super().__init__(cfg, Epilogue(bias=True), ln=True, kv=True)
        assert head_dim == 64, "lanes own 2 of 64 dimensions"
        assert cfg.rows * cluster == 3 * head_dim and head_dim % cfg.rows == 0
        self.head_dim, self.cluster = head_dim, cluster

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mBias, mLnW, mLnB, mKc, mVc, mPos,
                 mAttn: cute.Tensor, eps: cutlass.Float32, attn_scale: cutlass.Float32, stream):
        grid = mW.shape[0] // self.cfg.rows
        tiled_mma = cute.make_tiled_mma(warp_ops.MmaF16BF16Op(mW.element_type, cutlass.Float32, (16, 8, 16)),
                                        (1, 1, 1))
        self.kernel(mX, mW, mO, mBias, None, mLnW, mLnB, mKc, mVc, mPos, None, cutlass.Float32(1.0),
                    cutlass.Float32(1.0), eps, tiled_mma, mAttn, attn_scale).launch(
            grid=(grid, 1, 1), block=(self.num_threads, 1, 1), stream=stream, cluster=(self.cluster, 1, 1),
            use_pdl=True)

    @cute.jit
    def row_base(self, R, N):
        """CTA (head h, rank r): rows part * E + h * D + sub * R of W, part = q/k/v."""
        D, C = self.head_dim, self.cluster
        bid = cute.arch.block_idx()[0]
        h = bid // C
        r = bid - h * C
        per = D // R
        part = r // per
        return part * (N // 3) + h * D + (r - part * per) * R

    def setup(self, smem, ring):
        D, C, W = self.head_dim, self.cluster, self.cfg.warps
        # sQKV receives other ranks' stores while this CTA may still be in its product: its
        # own space. The rest is written only after the second cluster barrier, when every
        # rank's product is done, so it reuses the weight ring (two CTAs per SM still fit).
        sQKV = smem.allocate_tensor(cutlass.Float32, cute.make_layout(3 * D), byte_alignment=16)
        sML = smem.allocate_tensor(cutlass.Float32, cute.make_layout((2, W), stride=(W, 1)), byte_alignment=16)
        f32 = cute.recast_ptr(ring.iterator, dtype=cutlass.Float32)
        sO = cute.make_tensor(f32, cute.make_layout((W, D), stride=(D, 1)))
        sPO = cute.make_tensor(f32 + W * D, cute.make_layout((C, D), stride=(D, 1)))
        sPML = cute.make_tensor(f32 + (W + C) * D, cute.make_layout((C, 2), stride=(2, 1)))
        # Matches the first cluster wait: every CTA of the cluster has started (and owns its
        # shared memory) before any stores into it.
        cute.arch.cluster_arrive_relaxed()
        return sQKV, sML, sO, sPO, sPML

    @cute.jit
    def after_epilogue(self, y, own, tid, extra, N, mKc, mVc, mPos, mAttn, attn_scale):
        sQKV, sML, sO, sPO, sPML = extra
        D, C, W, R = self.head_dim, self.cluster, self.cfg.warps, self.cfg.rows
        bid = cute.arch.block_idx()[0]
        h = bid // C
        rank = bid - h * C
        per = D // R
        part = rank // per
        warp, lane = tid // 32, tid % 32
        neg_inf = -cutlass.Float32.inf

        # ---- q, k, v of this head into every rank's sQKV (rounded as the cache holds them)
        cute.arch.cluster_wait()
        if own:
            yv = y.to(mKc.element_type).to(cutlass.Float32)
            idx = part * D + (rank - part * per) * R + tid
            for c in cutlass.range_constexpr(C):
                store_f32_cluster(sQKV.iterator + idx, c, yv)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        # ---- this rank's keys: a contiguous 1/C of 0..pos (pos: the new row, in sQKV)
        pos = mPos[0].to(cutlass.Int32)
        n_keys = pos + 1
        chunk = (n_keys + C - 1) // C
        k0 = rank * chunk
        k1 = cutlass.min(n_keys, k0 + chunk)
        d0 = 2 * lane
        q0 = sQKV[d0] * attn_scale
        q1 = sQKV[d0 + 1] * attn_scale
        m = cutlass.Float32(neg_inf)
        lsum = cutlass.Float32(0.0)
        o0 = cutlass.Float32(0.0)
        o1 = cutlass.Float32(0.0)
        # U keys per warp and batch: all their loads are issued before any math (a key per
        # iteration would pay one memory round trip per key). Row pos is read from global
        # memory too, whatever it holds there yet, and replaced by the fresh k/v from sQKV.
        U = 4
        kv = cute.make_rmem_tensor((U, 4), cutlass.Float32)
        for jb in cutlass.range(k0 + warp, k1, W * U):
            for u in cutlass.range_constexpr(U):
                jc = cutlass.min(jb + u * W, k1 - 1)
                fresh = jc == pos
                kv[u, 0] = cutlass.select_(fresh, sQKV[D + d0], mKc[0, h, jc, d0].to(cutlass.Float32))
                kv[u, 1] = cutlass.select_(fresh, sQKV[D + d0 + 1], mKc[0, h, jc, d0 + 1].to(cutlass.Float32))
                kv[u, 2] = cutlass.select_(fresh, sQKV[2 * D + d0], mVc[0, h, jc, d0].to(cutlass.Float32))
                kv[u, 3] = cutlass.select_(fresh, sQKV[2 * D + d0 + 1], mVc[0, h, jc, d0 + 1].to(cutlass.Float32))
            for u in cutlass.range_constexpr(U):
                # u = 0 is always a key of this rank (the loop's bound), so m is finite after it.
                s = self.warp_sum(q0 * kv[u, 0] + q1 * kv[u, 1])
                s = cutlass.select_(jb + u * W < k1, s, neg_inf)
                m_new = cute.arch.fmax(m, s)
                corr = cute.arch.exp2(m - m_new)
                p = cute.arch.exp2(s - m_new)
                lsum = lsum * corr + p
                o0 = o0 * corr + p * kv[u, 2]
                o1 = o1 * corr + p * kv[u, 3]
                m = m_new
        if lane == 0:
            sML[0, warp] = m
            sML[1, warp] = lsum
        sO[warp, d0] = o0
        sO[warp, d0 + 1] = o1
        cute.arch.sync_threads()

        # ---- fold the warps (thread t owns dimension t), then the ranks in rank 0
        if tid < D:
            mx = cutlass.Float32(neg_inf)
            for w in cutlass.range_constexpr(W):
                mx = cute.arch.fmax(mx, sML[0, w])
            ref = cutlass.select_(mx == neg_inf, cutlass.Float32(0.0), mx)
            tot = cutlass.Float32(0.0)
            acc = cutlass.Float32(0.0)
            for w in cutlass.range_constexpr(W):
                f = cute.arch.exp2(sML[0, w] - ref)
                tot = tot + sML[1, w] * f
                acc = acc + sO[w, tid] * f
            store_f32_cluster(sPO.iterator + rank * D + tid, 0, acc)
            if tid == 0:
                store_f32_cluster(sPML.iterator + rank * 2, 0, mx)
                store_f32_cluster(sPML.iterator + rank * 2 + 1, 0, tot)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        if rank == 0:
            if tid < D:
                mx = cutlass.Float32(neg_inf)
                for c in cutlass.range_constexpr(C):
                    mx = cute.arch.fmax(mx, sPML[c, 0])
                tot = cutlass.Float32(0.0)
                acc = cutlass.Float32(0.0)
                for c in cutlass.range_constexpr(C):
                    f = cute.arch.exp2(sPML[c, 0] - mx)
                    tot = tot + sPML[c, 1] * f
                    acc = acc + sPO[c, tid] * f
                mAttn[0, h * D + tid] = (acc / tot).to(mAttn.element_type)
