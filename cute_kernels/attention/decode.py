"""Decode attention (one query token per sequence) against a KV cache: split-KV, GQA-packed.

Why a second kernel: at S_q = 1 the prefill kernel (kernel.py) runs a 128-row wgmma tile
with one useful row, one CTA per (head, batch), and its split-KV partials are merged by
five torch ops. It reached 7-10% of HBM bandwidth. Decode is a stream over the cache: the
work per key is a D-long dot product per query head, so the tensor cores buy nothing and
what matters is bytes in flight per SM. This kernel is the FlashDecoding shape, SIMT:

- grid (splits, kv_heads x head_groups, batch). A CTA owns one KV head, `heads` of its query
  heads (GQA packing: the K/V rows are read once for all of them) and one contiguous key
  range of the sequence (`cache_seqlens[b]` keys, or all of S_k).
- D/C consecutive threads share a key row, each owning C = 8 x vec columns (vec 16-byte
  chunks of K and of V per row); the CTA's threads cover `rows` key rows at once, `unroll`
  times per step, so a CTA streams block_n = rows x unroll keys per step. Each thread
  cp.asyncs its own chunks into a `stages`-deep shared-memory ring, stages - 1 steps ahead.
- Each row group keeps its own online softmax (running max, sum and C output columns per
  head, all fp32, exp2 with the softmax scale folded into q). Q K^T partial sums are
  reduced across the D/C threads with butterfly shuffles.
- At the end the row groups merge through shared memory. With one split that is the
  answer. With several, each CTA writes an fp32 partial (O normalised, LSE in log2 units)
  and bumps a per-(batch, head group) counter; the CTA that arrives last merges all splits
  and resets the counter to zero, so there is no second launch and the counters are ready
  for the next call (and for CUDA-graph replay).

Rows with no keys give O = 0 and LSE = -inf. A NaN in K or V reaches only the heads whose
row it is in.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

_LN_2 = math.log(2.0)
# Splits per (batch, head group) at most: the merge keeps one weight per split and head in smem.
MAX_DECODE_SPLITS = 64


class FlashDecodeSm90:
    """Split-KV decode attention, SIMT, one launch.

    Warp roles: none; all `num_threads` threads both copy and compute (no producer warp: at
    one query row there is too little math per byte for a consumer to wait on).
    Pipeline: a per-thread cp.async ring (`stages` slots of block_n keys, commit/wait groups;
    a thread only reads slots it filled itself, so no barriers). Synchronisation: one CTA
    barrier for the row-group merge, and an acq_rel atomic counter in global memory for the
    cross-CTA split merge.
    """

    def __init__(self, head_dim: int, heads: int, split: bool, seqlens: bool, num_threads: int = 256,
                 unroll: int = 2, vec: int = 1, stages: int = 4, masked: bool = False):
        assert head_dim % (8 * vec) == 0 and 32 % (head_dim // (8 * vec)) == 0
        assert num_threads // 32 >= heads  # the split merge gives each head one warp
        self.head_dim = head_dim
        self.vec = vec  # 16-byte chunks per thread and row: fewer threads per row, fewer shuffles
        self.cols = 8 * vec
        self.heads = heads  # query heads per CTA (a divisor of the GQA ratio)
        self.split = split
        self.seqlens = seqlens
        self.masked = masked  # a [B, Sk] byte mask of the keys each sequence may attend to
        self.num_threads = num_threads
        self.unroll = unroll
        # K/V rows go through a cp.async ring in shared memory, stages - 1 steps ahead, so the
        # bytes in flight cost no registers. (Loading straight into registers, `unroll` rows
        # ahead, measured 48-78% of HBM bandwidth at D = 128 with 4 GQA heads per CTA, the
        # ring 84-92%: the softmax state left too few registers for loads in flight.)
        assert stages >= 2
        self.stages = stages
        self.tpr = head_dim // self.cols  # threads per key row
        self.rows = num_threads // self.tpr  # key rows in flight per unrolled step
        self.block_n = self.rows * unroll

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # [B, 1, Hq, D]
        mK: cute.Tensor,  # [B, Sk, Hkv, D]
        mV: cute.Tensor,
        mO: cute.Tensor,  # [B, 1, Hq, D]
        mLSE: cute.Tensor,  # [B, Hq, 1] fp32
        mOpart: cute.Tensor,  # [B, Hq, splits, D] fp32 (split only)
        mLpart: cute.Tensor,  # [B, Hq, splits] fp32, log2 units (split only)
        mSem: cute.Tensor,  # [B * Hkv * head_groups] int32, zero between calls (split only)
        mSeqlens: cute.Tensor,  # [B] int32 or None
        mMask: cute.Tensor,  # [B, Sk] uint8 (nonzero: attend) or None
        scale_log2: cutlass.Float32,
        qheads_per_kvhead: cutlass.Int32,
        num_splits: cutlass.Int32,
        stream,
    ):
        B, Hq = mQ.shape[0], mQ.shape[2]
        self.kernel(mQ, mK, mV, mO, mLSE, mOpart, mLpart, mSem, mSeqlens, mMask, scale_log2, qheads_per_kvhead,
                    num_splits).launch(
            grid=(num_splits, Hq // self.heads, B), block=(self.num_threads, 1, 1), stream=stream,
            use_pdl=True)

    @cute.kernel
    def kernel(self, mQ, mK, mV, mO, mLSE, mOpart, mLpart, mSem, mSeqlens, mMask, scale_log2, qheads_per_kvhead,
               num_splits):
        tid, _, _ = cute.arch.thread_idx()
        split, hg, b = cute.arch.block_idx()
        H, D, R, TPR, C = self.heads, self.head_dim, self.rows, self.tpr, self.cols
        col = (tid % TPR) * C
        grp = tid // TPR
        hq0 = hg * H
        h_kv = hq0 // qheads_per_kvhead

        smem = cutlass.memory.SmemAllocator()
        sM = smem.allocate_tensor(cutlass.Float32, cute.make_layout((R, H)), byte_alignment=16)
        sL = smem.allocate_tensor(cutlass.Float32, cute.make_layout((R, H)), byte_alignment=16)
        sO = smem.allocate_tensor(cutlass.Float32, cute.make_layout((R, H, D), stride=(H * D, D, 1)),
                                  byte_alignment=16)
        sW = smem.allocate_tensor(cutlass.Float32, cute.make_layout((H, MAX_DECODE_SPLITS)), byte_alignment=16)
        sFlag = smem.allocate_tensor(cutlass.Int32, cute.make_layout((4,)), byte_alignment=16)
        # Per (K|V, stage, row u, chunk j) one 16-byte slot per thread, threads adjacent: each
        # thread reads back only what it copied itself, so the ring needs no CTA barrier.
        T = self.num_threads
        ring = smem.allocate_tensor(
            mK.element_type,
            cute.make_layout((8, T, self.vec, self.unroll, self.stages, 2),
                             stride=(1, 8, 8 * T, 8 * T * self.vec, 8 * T * self.vec * self.unroll,
                                     8 * T * self.vec * self.unroll * self.stages)),
            byte_alignment=128)

        # Programmatic dependent launch: this grid may be resident before the kernel ahead of
        # it (the q projection, the KV append) has finished; wait for it before the first
        # global read, then let the next kernel (the output projection) launch and start
        # loading its weights while this one streams the cache. Without the PDL launch
        # attribute the wait returns at once.
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        seqlen = mK.shape[1]
        if cutlass.const_expr(self.seqlens):
            seqlen = mSeqlens[b]
        # Contiguous, block-aligned key ranges; trailing splits may be empty.
        n_blocks = (seqlen + self.block_n - 1) // self.block_n
        per_split = (n_blocks + num_splits - 1) // num_splits
        start = split * per_split * self.block_n
        end = cutlass.min(seqlen, start + per_split * self.block_n)

        # q with the softmax scale folded in (log2 units), fp32: [H, C] per thread.
        q = cute.make_rmem_tensor((H, C), cutlass.Float32)
        qv = cute.make_rmem_tensor((8,), mQ.element_type)
        for h in cutlass.range_constexpr(H):
            for j in cutlass.range_constexpr(self.vec):
                cute.autovec_copy(cute.local_tile(mQ[b, 0, hq0 + h, None], (8,), (col // 8 + j,)), qv)
                for i in cutlass.range_constexpr(8):
                    q[h, j * 8 + i] = qv[i].to(cutlass.Float32) * scale_log2

        neg_inf = -cutlass.Float32.inf
        m = cute.make_rmem_tensor((H,), cutlass.Float32)
        lsum = cute.make_rmem_tensor((H,), cutlass.Float32)
        acc = cute.make_rmem_tensor((H, C), cutlass.Float32)
        for h in cutlass.range_constexpr(H):
            m[h] = neg_inf
            lsum[h] = 0.0
            for i in cutlass.range_constexpr(C):
                acc[h, i] = 0.0

        gK = mK[b, None, h_kv, None]  # [Sk, D]
        gV = mV[b, None, h_kv, None]
        kv_layout = cute.make_layout((self.unroll, self.vec, 8), stride=(C, 8, 1))
        kf = cute.make_rmem_tensor(kv_layout, mK.element_type)
        vf = cute.make_rmem_tensor(kv_layout, mV.element_type)
        s = cute.make_rmem_tensor((self.unroll, H), cutlass.Float32)
        # 16-byte cp.async.cg (bypassing L1: every byte is read once).
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), mK.element_type,
                                  num_bits_per_copy=128)
        n_steps = (end - start + self.block_n - 1) // self.block_n
        for p in cutlass.range_constexpr(self.stages - 1):
            if p < n_steps:
                self.issue_rows(g2s, gK, gV, ring, p, start + p * self.block_n, end, grp, col, tid)
            cute.arch.cp_async_commit_group()  # empty groups keep the wait count uniform
        for it in cutlass.range(n_steps):
            cute.arch.cp_async_wait_group(self.stages - 2)
            slot = it % self.stages
            for u in cutlass.range_constexpr(self.unroll):
                for j in cutlass.range_constexpr(self.vec):
                    cute.autovec_copy(ring[None, tid, j, u, slot, 0], kf[u, j, None])
                    cute.autovec_copy(ring[None, tid, j, u, slot, 1], vf[u, j, None])
            # The slot refilled now was read into registers (and used) one iteration ago.
            nxt = it + self.stages - 1
            if nxt < n_steps:
                self.issue_rows(g2s, gK, gV, ring, nxt % self.stages, start + nxt * self.block_n, end, grp, col, tid)
            cute.arch.cp_async_commit_group()
            self.softmax_step(kf, vf, s, q, m, lsum, acc, start + it * self.block_n, end, grp, mMask, b)

        # Merge the row groups: publish each group's state, then every thread owns some
        # (head, column) outputs and folds the R groups into them.
        if tid % TPR == 0:
            for h in cutlass.range_constexpr(H):
                sM[grp, h] = m[h]
                sL[grp, h] = lsum[h]
        for h in cutlass.range_constexpr(H):
            for i in cutlass.range_constexpr(C):
                sO[grp, h, col + i] = acc[h, i]
        cute.arch.sync_threads()

        for idx in cutlass.range(tid, H * D, self.num_threads):
            h = idx // D
            d = idx - h * D
            mx = neg_inf
            for g in cutlass.range(R, unroll=8):
                mx = cutlass.max(mx, sM[g, h])
            ref = cutlass.select_(mx == neg_inf, cutlass.Float32(0.0), mx)
            tot = cutlass.Float32(0.0)
            o = cutlass.Float32(0.0)
            for g in cutlass.range(R, unroll=8):
                w = cute.math.exp2(sM[g, h] - ref, fastmath=True)
                tot += sL[g, h] * w
                o += sO[g, h, d] * w
            has = tot != 0.0  # NaN counts as "has": it must reach the output
            o = cutlass.Float32(cutlass.select_(has, o / cutlass.select_(has, tot, cutlass.Float32(1.0)),
                                                cutlass.Float32(0.0)))
            lse2 = cutlass.select_(has, ref + cute.math.log2(cutlass.select_(has, tot, cutlass.Float32(1.0)),
                                                               fastmath=True), neg_inf)
            if cutlass.const_expr(self.split):
                mOpart[b, hq0 + h, split, d] = o
                if d == 0:
                    mLpart[b, hq0 + h, split] = lse2
            else:
                mO[b, 0, hq0 + h, d] = o.to(mO.element_type)
                if d == 0:
                    mLSE[b, hq0 + h, 0] = lse2 * _LN_2

        if cutlass.const_expr(self.split):
            self.merge_splits(mO, mLSE, mOpart, mLpart, mSem, sW, sFlag, num_splits, b, hg, hq0, tid)

    @cute.jit
    def issue_rows(self, g2s, gK, gV, ring, slot, n0, end, grp, col, tid):
        """This thread's K/V chunks of one block_n step, as cp.async copies into its ring slots.
        Rows past the range are clamped to its last row, so they stay in bounds and hold
        finite data; softmax_step masks their scores."""
        for u in cutlass.range_constexpr(self.unroll):
            row = cutlass.min(n0 + u * self.rows + grp, end - 1)
            for j in cutlass.range_constexpr(self.vec):
                cute.copy(g2s, cute.local_tile(gK[row, None], (8,), (col // 8 + j,)), ring[None, tid, j, u, slot, 0])
                cute.copy(g2s, cute.local_tile(gV[row, None], (8,), (col // 8 + j,)), ring[None, tid, j, u, slot, 1])

    @cute.jit
    def softmax_step(self, kf, vf, s, q, m, lsum, acc, n0, end, grp, mMask, b):
        """One block_n-key step of one row group on loaded K/V: Q K^T, online softmax, P V."""
        H = self.heads
        neg_inf = -cutlass.Float32.inf
        for u in cutlass.range_constexpr(self.unroll):
            for h in cutlass.range_constexpr(H):
                t = cutlass.Float32(0.0)
                for j in cutlass.range_constexpr(self.vec):
                    for i in cutlass.range_constexpr(8):
                        t += q[h, j * 8 + i] * kf[u, j, i].to(cutlass.Float32)
                s[u, h] = t
        # Butterfly sum over the TPR threads of a row (consecutive lanes).
        for j in cutlass.range_constexpr(self.tpr.bit_length() - 1):
            for u in cutlass.range_constexpr(self.unroll):
                for h in cutlass.range_constexpr(H):
                    s[u, h] = s[u, h] + cute.arch.shuffle_sync_bfly(s[u, h], offset=1 << j)
        for u in cutlass.range_constexpr(self.unroll):
            n = n0 + u * self.rows + grp
            if n >= end:
                for h in cutlass.range_constexpr(H):
                    s[u, h] = neg_inf
            if cutlass.const_expr(self.masked):
                # A masked-out key scores -inf (its V still meets p = 0: the cache must hold
                # finite values there, as for rows past the length).
                if mMask[b, cutlass.min(n, end - 1)] == 0:
                    for h in cutlass.range_constexpr(H):
                        s[u, h] = neg_inf
        for h in cutlass.range_constexpr(H):
            mx = m[h]
            for u in cutlass.range_constexpr(self.unroll):
                mx = cutlass.max(mx, s[u, h])
            # exp2(-inf - 0) = 0 rather than NaN while nothing has been seen.
            ref = cutlass.select_(mx == neg_inf, cutlass.Float32(0.0), mx)
            corr = cute.math.exp2(m[h] - ref, fastmath=True)
            m[h] = mx
            tot = lsum[h] * corr
            for i in cutlass.range_constexpr(self.cols):
                acc[h, i] = acc[h, i] * corr
            for u in cutlass.range_constexpr(self.unroll):
                p = cute.math.exp2(s[u, h] - ref, fastmath=True)
                tot += p
                for j in cutlass.range_constexpr(self.vec):
                    for i in cutlass.range_constexpr(8):
                        acc[h, j * 8 + i] += p * vf[u, j, i].to(cutlass.Float32)
            lsum[h] = tot

    @cute.jit
    def merge_splits(self, mO, mLSE, mOpart, mLpart, mSem, sW, sFlag, num_splits, b, hg, hq0, tid):
        """The last CTA of a (batch, head group) folds all splits' partials into O and LSE."""
        H, D = self.heads, self.head_dim
        neg_inf = -cutlass.Float32.inf
        # Release this CTA's partials before counting it in; the last arriver acquires all.
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_threads()
        slot = b * (mO.shape[2] // H) + hg
        if tid == 0:
            old = cute.arch.atomic_add(mSem.iterator + slot, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            last = old == num_splits - 1
            sFlag[0] = cutlass.select_(last, cutlass.Int32(1), cutlass.Int32(0))
            if last:
                mSem[slot] = 0  # nobody else touches it this launch: ready for the next one
        cute.arch.sync_threads()
        if sFlag[0] == 1:
            cute.arch.fence_acq_rel_gpu()
            # Split weights per head: warp w folds head w (heads <= warps), lanes over splits.
            warp = tid // 32
            lane = tid % 32
            if warp < H:
                h = warp
                mx = neg_inf
                for sp in cutlass.range(lane, num_splits, 32):
                    mx = cutlass.max(mx, mLpart[b, hq0 + h, sp])
                for off in cutlass.range_constexpr(5):
                    mx = cutlass.max(mx, cute.arch.shuffle_sync_bfly(mx, offset=1 << off))
                ref = cutlass.select_(mx == neg_inf, cutlass.Float32(0.0), mx)
                tot = cutlass.Float32(0.0)
                for sp in cutlass.range(lane, num_splits, 32):
                    w = cute.math.exp2(mLpart[b, hq0 + h, sp] - ref, fastmath=True)
                    sW[h, sp] = w
                    tot += w
                for off in cutlass.range_constexpr(5):
                    tot = tot + cute.arch.shuffle_sync_bfly(tot, offset=1 << off)
                has = tot != 0.0  # NaN counts as "has": it must reach the output
                inv = cutlass.select_(has, 1.0 / cutlass.select_(has, tot, cutlass.Float32(1.0)), cutlass.Float32(0.0))
                for sp in cutlass.range(lane, num_splits, 32):
                    sW[h, sp] = sW[h, sp] * inv
                if lane == 0:
                    lse2 = cutlass.select_(has, ref + cute.math.log2(cutlass.select_(has, tot, cutlass.Float32(1.0)),
                                                                       fastmath=True), neg_inf)
                    mLSE[b, hq0 + h, 0] = lse2 * _LN_2
            cute.arch.sync_threads()
            for idx in cutlass.range(tid, H * D, self.num_threads):
                h = idx // D
                d = idx - h * D
                o = cutlass.Float32(0.0)
                for sp in cutlass.range(num_splits, unroll=8):
                    o += sW[h, sp] * mOpart[b, hq0 + h, sp, d]
                mO[b, 0, hq0 + h, d] = o.to(mO.element_type)
