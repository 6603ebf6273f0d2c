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
online softmax in log2 units, 4 keys' loads in flight per warp (the first 4 issued before
the PDL wait, from the position as read then, and loaded again where the fresh position moved
them). Rank 0 merges the 6 partials and writes o.

Status: correct on the H100 (tests/test_gemm_host.py, tests/test_inference_gpu.py) and no
faster: GPT-2 XL bf16 decode 1.562 ms/token with it and without it (same run, two runs
each). In the step's timeline the fused kernel ends ~13 us after its predecessor, about what
c_attn and the attention kernel added together (5.8 + 6.0 us): the attention's latency
(two cluster barriers, the K/V round trips behind the weight streams of the kernels running
ahead, the merge) moved into this kernel rather than away. Off unless
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
        self.kernel(mX, mW, mO, mBias, None, mLnW, mLnB, mKc, mVc, mPos, None, None, cutlass.Float32(1.0),
                    cutlass.Float32(1.0), eps, tiled_mma, (mAttn, attn_scale)).launch(
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

    def setup(self, smem, ring, scratch, mKc, mVc, mPos, tail):
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
        # Before the PDL wait: this warp's first batch of keys from the position as read now
        # (the next-token kernel ahead may not have written the new one yet); after_epilogue
        # reuses each of those rows that the fresh position still assigns to the same slot.
        kv = cute.make_rmem_tensor((self.U, 4), cutlass.Float32)
        k0, k1 = self.prefetch_first(kv, mKc, mVc, mPos)
        return sQKV, sML, sO, sPO, sPML, (k0, k1, kv)

    @cute.jit
    def prefetch_first(self, kv, mKc, mVc, mPos):
        tid = cute.arch.thread_idx()[0]
        warp = tid // 32
        h, rank = self.head_rank()
        _, k0, k1 = self.key_range(mPos, rank)
        kv.fill(0.0)
        if k0 + warp < k1:
            self.load_batch(kv, mKc, mVc, h, k0 + warp, k1, 2 * (tid % 32))
        return k0, k1

    U = 4  # keys per warp and batch whose loads are in flight together

    @cute.jit
    def head_rank(self):
        bid = cute.arch.block_idx()[0]
        h = bid // self.cluster
        return h, bid - h * self.cluster

    @cute.jit
    def key_range(self, mPos, rank):
        """(pos, first, end) of this rank's keys: a contiguous 1/C of 0..pos."""
        pos = mPos[0].to(cutlass.Int32)
        n_keys = pos + 1
        chunk = (n_keys + self.cluster - 1) // self.cluster
        k0 = rank * chunk
        return pos, k0, cutlass.min(n_keys, k0 + chunk)

    @cute.jit
    def load_batch(self, kv, mKc, mVc, h, jb, k1, d0):
        """kv[u] <- this lane's 2 dimensions of K and V at row min(jb + u * W, k1 - 1)."""
        W = self.cfg.warps
        for u in cutlass.range_constexpr(self.U):
            jc = cutlass.min(jb + u * W, k1 - 1)
            kv[u, 0] = mKc[0, h, jc, d0].to(cutlass.Float32)
            kv[u, 1] = mKc[0, h, jc, d0 + 1].to(cutlass.Float32)
            kv[u, 2] = mVc[0, h, jc, d0].to(cutlass.Float32)
            kv[u, 3] = mVc[0, h, jc, d0 + 1].to(cutlass.Float32)

    @cute.jit
    def attend_batch(self, kv, sQKV, jb, k1, pos, q0, q1, m, lsum, o0, o1, d0):
        """Online softmax over one batch (row pos taken from sQKV, slots past k1 masked)."""
        D, W = self.head_dim, self.cfg.warps
        for u in cutlass.range_constexpr(self.U):
            fresh = cutlass.min(jb + u * W, k1 - 1) == pos
            ka = cutlass.select_(fresh, sQKV[D + d0], kv[u, 0])
            kb = cutlass.select_(fresh, sQKV[D + d0 + 1], kv[u, 1])
            va = cutlass.select_(fresh, sQKV[2 * D + d0], kv[u, 2])
            vb = cutlass.select_(fresh, sQKV[2 * D + d0 + 1], kv[u, 3])
            # u = 0 is always a key of this rank (jb < k1), so m is finite after it.
            s = self.warp_sum(q0 * ka + q1 * kb)
            s = cutlass.select_(jb + u * W < k1, s, -cutlass.Float32.inf)
            m_new = cute.arch.fmax(m, s)
            corr = cute.arch.exp2(m - m_new)
            p = cute.arch.exp2(s - m_new)
            lsum = lsum * corr + p
            o0 = o0 * corr + p * va
            o1 = o1 * corr + p * vb
            m = m_new
        return m, lsum, o0, o1

    @cute.jit
    def after_epilogue(self, y, own, tid, extra, N, mX, mKc, mVc, mPos, tail):
        mAttn, attn_scale = tail
        sQKV, sML, sO, sPO, sPML, (k0_early, k1_early, kv_early) = extra
        D, C, W, R = self.head_dim, self.cluster, self.cfg.warps, self.cfg.rows
        h, rank = self.head_rank()
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
        pos, k0, k1 = self.key_range(mPos, rank)
        d0 = 2 * lane
        q0 = sQKV[d0] * attn_scale
        q1 = sQKV[d0 + 1] * attn_scale
        m = cutlass.Float32(neg_inf)
        lsum = cutlass.Float32(0.0)
        o0 = cutlass.Float32(0.0)
        o1 = cutlass.Float32(0.0)
        # Batches of U keys per warp: all their loads are issued before any math (a key per
        # iteration would pay one memory round trip per key). The first batch was loaded
        # before the PDL wait (setup): a slot is loaded again if the fresh position moved
        # its row. Row pos itself always comes from sQKV (attend_batch).
        jb = k0 + warp
        if jb < k1:
            kv = cute.make_rmem_tensor((self.U, 4), cutlass.Float32)
            for u in cutlass.range_constexpr(self.U):
                row = cutlass.min(jb + u * W, k1 - 1)
                row_early = cutlass.min(k0_early + warp + u * W, k1_early - 1)
                for e in cutlass.range_constexpr(4):
                    kv[u, e] = kv_early[u, e]
                if row != row_early or k0_early + warp >= k1_early:
                    kv[u, 0] = mKc[0, h, row, d0].to(cutlass.Float32)
                    kv[u, 1] = mKc[0, h, row, d0 + 1].to(cutlass.Float32)
                    kv[u, 2] = mVc[0, h, row, d0].to(cutlass.Float32)
                    kv[u, 3] = mVc[0, h, row, d0 + 1].to(cutlass.Float32)
            m, lsum, o0, o1 = self.attend_batch(kv, sQKV, jb, k1, pos, q0, q1, m, lsum, o0, o1, d0)
        kvb = cute.make_rmem_tensor((self.U, 4), cutlass.Float32)
        for jn in cutlass.range(k0 + warp + W * self.U, k1, W * self.U):
            self.load_batch(kvb, mKc, mVc, h, jn, k1, d0)
            m, lsum, o0, o1 = self.attend_batch(kvb, sQKV, jn, k1, pos, q0, q1, m, lsum, o0, o1, d0)
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
