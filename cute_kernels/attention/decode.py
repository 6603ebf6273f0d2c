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
  answer. With 2-8 splits (`cluster`), the splits of a (batch, head group) are one
  thread-block cluster: each CTA stores its fp32 partial (O normalised, LSE in log2 units)
  into rank 0's shared memory (st.shared::cluster), one cluster barrier, and rank 0 folds
  them. Otherwise each CTA writes its partial to global memory and bumps a per-(batch, head
  group) counter; the CTA that arrives last merges all splits and resets the counter to
  zero, so there is no second launch and the counters are ready for the next call (and for
  CUDA-graph replay). The global path's fence, counter and read-back are dependent round
  trips, most of a batch-1 launch at short caches, so the last CTA folds the splits in one
  online pass with a chunk's loads in flight (merge_splits); the cluster's barrier costs
  far less (B = 1, 1k keys, 12 heads: 6.0 -> 4.1 us at 8 splits).

Rows with no keys give O = 0 and LSE = -inf. A NaN in K or V reaches only the heads whose
row it is in.

Programmatic dependent launch: with `early_trigger` both kernels let the next kernel launch
before their own griddepcontrol.wait (the decode chain runs ahead, see matmul/gemv.py; the
next kernel must read only constants before its own wait). inference/ asks for it: GPT-2 XL
decode 1.661 -> 1.610 ms/token, same run. Without it the wait comes first: back-to-back
attention calls ran 2-29% slower with the early trigger (B = 1 / 8k keys 8.0 -> 10.3 us,
same run), the next grid's CTAs taking SM slots while they wait. With cache_seqlens the SIMT
kernel copies its first K/V steps before the wait from the lengths it reads then, which the
kernel ahead may not have written yet (the decode loop's next-token kernel writes them);
after the wait it recomputes its key range and copies again every early slot whose row
changed, and the newest row (tests/test_attention.py:
test_decode_lengths_written_by_the_kernel_ahead; without the recheck, a CUDA graph attended
to the old lengths).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cutlass_dsl import dsl_user_op

from .config import MAX_CLUSTER_SPLITS, SM90_SMEM_BYTES, DecodeConfig, DecodeMmaConfig

_LN_2 = math.log(2.0)
# Partial loads in flight per thread in the global split merge (merge_splits), 16 bytes each.
# 32 (no spills either) ran 6% slower (0-13%) at batch 1-4 on the H200 (docs/tried-and-not-kept.md).
_MERGE_LOADS = 16


def _merge_shape(groups: int, threads: int) -> tuple[int, int, int]:
    """merge_splits' split of `groups` 4-column output groups over `threads` threads: (lanes
    per group L, the threads the groups leave spare up to a warp, a power of two; groups per
    thread P; each thread's splits per chunk CH, so that P x CH loads are in flight)."""
    lanes = 1
    while lanes < 32 and 2 * lanes * groups <= threads:
        lanes *= 2
    per_thread = -(-groups // (threads // lanes))
    return lanes, per_thread, max(1, _MERGE_LOADS // per_thread // lanes)


@dsl_user_op
def store_f32_cluster(smem_ptr, rank, value, *, loc=None, ip=None):
    """st.shared::cluster of one fp32 at `smem_ptr`'s offset in the shared memory of CTA `rank`
    of this cluster (the DSL's distributed-shared-memory tensors allow no element stores)."""
    addr = cute.arch.map_dsmem_ptr(smem_ptr, rank, loc=loc, ip=ip).toint(loc=loc, ip=ip)
    llvm.inline_asm(None, [addr.ir_value(loc=loc, ip=ip), cutlass.Float32(value).ir_value(loc=loc, ip=ip)],
                    "st.shared::cluster.f32 [$0], $1;", "r,f", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


class FlashDecodeSm90:
    """Split-KV decode attention, SIMT, one launch.

    Warp roles: none; all `num_threads` threads both copy and compute (no producer warp: at
    one query row there is too little math per byte for a consumer to wait on).
    Pipeline: a per-thread cp.async ring (`stages` slots of block_n keys, commit/wait groups;
    a thread only reads slots it filled itself, so no barriers). Synchronisation: one CTA
    barrier for the row-group merge; for the cross-CTA split merge either a cluster barrier
    (arrive.relaxed at the start so remote shared memory is live before anyone writes it,
    arrive/wait around the partials' stores) or an acq_rel atomic counter in global memory.
    """

    def __init__(self, cfg: DecodeConfig, heads: int, split: bool, seqlens: bool, masked: bool = False,
                 cluster: int = 1, early_trigger: bool = False):
        head_dim, vec, num_threads = cfg.head_dim, cfg.vec, cfg.threads
        assert head_dim % (8 * vec) == 0 and 32 % (head_dim // (8 * vec)) == 0
        assert num_threads // 32 >= heads  # the split merge gives each head one warp
        # cluster > 1: exactly `cluster` splits, one thread-block cluster per (batch, head
        # group), merged through distributed shared memory (see merge_cluster).
        assert 1 <= cluster <= MAX_CLUSTER_SPLITS and (cluster == 1 or split)
        self.cluster = cluster
        self.early_trigger = early_trigger  # see the module docstring (programmatic dependent launch)
        self.head_dim = head_dim
        self.vec = vec  # 16-byte chunks per thread and row: fewer threads per row, fewer shuffles
        self.cols = 8 * vec
        self.heads = heads  # query heads per CTA (a divisor of the GQA ratio)
        self.split = split
        self.seqlens = seqlens
        self.masked = masked  # a [B, Sk] byte mask of the keys each sequence may attend to
        self.num_threads = num_threads
        self.unroll = cfg.unroll
        # K/V rows go through a cp.async ring in shared memory, stages - 1 steps ahead, so the
        # bytes in flight cost no registers. (Loading straight into registers, `unroll` rows
        # ahead, measured 48-78% of HBM bandwidth at D = 128 with 4 GQA heads per CTA, the
        # ring 84-92%: the softmax state left too few registers for loads in flight.)
        assert cfg.stages >= 2
        self.stages = cfg.stages
        self.tpr = head_dim // self.cols  # threads per key row and head
        # kv_pack adjacent KV heads (MHA) share a CTA: a key row's tpr x kv_pack threads read
        # kv_pack x D contiguous elements, each thread's softmax is its own head's.
        self.kv_pack = cfg.kv_pack
        assert self.kv_pack == 1 or (heads == 1 and not split and cluster == 1)
        self.out_heads = heads * self.kv_pack  # heads the row-group merge folds
        self.rows = num_threads // (self.tpr * self.kv_pack)  # key rows in flight per unrolled step
        self.block_n = self.rows * self.unroll

    @cute.jit
    def pdl_wait(self):
        """Wait for the kernel ahead (programmatic dependent launch) and let the next one
        launch: trigger first with early_trigger (module docstring), else wait first."""
        if cutlass.const_expr(self.early_trigger):
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()
        else:
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

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
        # With a cluster merge the grid's x extent is the cluster: num_splits must equal it.
        self.kernel(mQ, mK, mV, mO, mLSE, mOpart, mLpart, mSem, mSeqlens, mMask, scale_log2, qheads_per_kvhead,
                    num_splits).launch(
            grid=(num_splits, Hq // self.out_heads, B), block=(self.num_threads, 1, 1), stream=stream,
            cluster=(self.cluster, 1, 1) if cutlass.const_expr(self.cluster > 1) else None, use_pdl=True)

    @cute.kernel
    def kernel(self, mQ, mK, mV, mO, mLSE, mOpart, mLpart, mSem, mSeqlens, mMask, scale_log2, qheads_per_kvhead,
               num_splits):
        tid, _, _ = cute.arch.thread_idx()
        split, hg, b = cute.arch.block_idx()
        H, D, R, TPR, C = self.heads, self.head_dim, self.rows, self.tpr, self.cols
        HO = self.out_heads
        # This thread's place in its key row's TPR-thread group: its j-th 16-byte chunk of a
        # row is chunk j * TPR + col of it (see `chunk`), so the group's copies of one j are
        # contiguous (whole 32-byte sectors when vec > 1).
        col = tid % TPR
        grp = tid // (TPR * self.kv_pack)
        hk = (tid // TPR) % self.kv_pack  # this thread's head among the CTA's kv_pack (MHA)
        hq0 = hg * HO  # the CTA's first query head (its merge's outputs: HO heads from here)
        h_kv = hq0 // qheads_per_kvhead + hk
        hq = hq0 + hk  # this thread's first query head

        smem = cutlass.memory.SmemAllocator()
        sM = smem.allocate_tensor(cutlass.Float32, cute.make_layout((R, HO)), byte_alignment=16)
        sL = smem.allocate_tensor(cutlass.Float32, cute.make_layout((R, HO)), byte_alignment=16)
        sO = smem.allocate_tensor(cutlass.Float32, cute.make_layout((R, HO, D), stride=(HO * D, D, 1)),
                                  byte_alignment=16)
        sFlag = smem.allocate_tensor(cutlass.Int32, cute.make_layout((4,)), byte_alignment=16)
        sPart, sLp = self.cluster_partials(smem)
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
        # it (the q projection with the KV append, or the decode loop's next-token kernel) has
        # finished. That kernel writes at most the newest key row (seqlen - 1), q and the
        # lengths; the older rows were written by kernels that have completed. So the first
        # stages - 1 steps of K/V are copied *before* the wait from the lengths as read then
        # (possibly last step's), and after it the range is recomputed from the fresh lengths:
        # every early slot whose row changed, and the newest row, is copied again.
        # With early_trigger the next kernel (the output projection) may launch at once: it
        # reads only constants (its weights) before its own wait, so its CTAs start loading
        # them while this grid still waits (the decode chain runs ahead; see matmul/gemv_kernel.py).
        early = cutlass.const_expr(self.seqlens)
        gK = mK[b, None, h_kv, None]  # [Sk, D]
        gV = mV[b, None, h_kv, None]
        # 16-byte cp.async.cg (bypassing L1: every byte is read once).
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), mK.element_type,
                                  num_bits_per_copy=128)
        start, end, n_steps = self.key_range(mK, mSeqlens, b, split, num_splits)
        if cutlass.const_expr(early):
            self.prefetch(g2s, gK, gV, ring, start, end, n_steps, grp, col, tid)
        self.pdl_wait()
        if cutlass.const_expr(early):
            start0, end0, n_steps0 = start, end, n_steps
            start, end, n_steps = self.key_range(mK, mSeqlens, b, split, num_splits)
            # The early copies are done before the same slots are written again; the fresh
            # rows land with the q load below (their own group, waited for there).
            cute.arch.cp_async_wait_group(0)
            new_row = mSeqlens[b] - 1
            for p in cutlass.range_constexpr(self.stages - 1):
                if p < n_steps:
                    for u in cutlass.range_constexpr(self.unroll):
                        off = p * self.block_n + u * self.rows + grp
                        row = cutlass.min(start + off, end - 1)
                        row0 = cutlass.min(start0 + off, end0 - 1)
                        if row == new_row or row != row0 or p >= n_steps0:
                            for j in cutlass.range_constexpr(self.vec):
                                cute.copy(g2s, cute.local_tile(gK[row, None], (8,), (self.chunk(col, j),)),
                                          ring[None, tid, j, u, p, 0])
                                cute.copy(g2s, cute.local_tile(gV[row, None], (8,), (self.chunk(col, j),)),
                                          ring[None, tid, j, u, p, 1])
            cute.arch.cp_async_commit_group()

        # q with the softmax scale folded in (log2 units), fp32: [H, C] per thread.
        q = cute.make_rmem_tensor((H, C), cutlass.Float32)
        qv = cute.make_rmem_tensor((8,), mQ.element_type)
        for h in cutlass.range_constexpr(H):
            for j in cutlass.range_constexpr(self.vec):
                cute.autovec_copy(cute.local_tile(mQ[b, 0, hq + h, None], (8,), (self.chunk(col, j),)), qv)
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

        kv_layout = cute.make_layout((self.unroll, self.vec, 8), stride=(C, 8, 1))
        kf = cute.make_rmem_tensor(kv_layout, mK.element_type)
        vf = cute.make_rmem_tensor(kv_layout, mV.element_type)
        s = cute.make_rmem_tensor((self.unroll, H), cutlass.Float32)
        if cutlass.const_expr(early):
            cute.arch.cp_async_wait_group(0)  # the newest row's copy
        else:
            self.prefetch(g2s, gK, gV, ring, start, end, n_steps, grp, col, tid)
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
                sM[grp, hk + h] = m[h]
                sL[grp, hk + h] = lsum[h]
        for h in cutlass.range_constexpr(H):
            for j in cutlass.range_constexpr(self.vec):
                for i in cutlass.range_constexpr(8):
                    sO[grp, hk + h, self.chunk(col, j) * 8 + i] = acc[h, j * 8 + i]
        cute.arch.sync_threads()
        self.finish(sM, sL, sO, sPart, sLp, sFlag, mO, mLSE, mOpart, mLpart, mSem, num_splits, b, hg, hq0,
                    split, tid)

    @cute.jit
    def finish(self, sM, sL, sO, sPart, sLp, sFlag, mO, mLSE, mOpart, mLpart, mSem, num_splits, b, hg, hq0,
               split, tid):
        """After the key loop (row groups' states in sM, sL, sO): O and LSE, through the
        split merge of this kernel's kind when there are several splits."""
        if cutlass.const_expr(self.cluster > 1):
            cute.arch.cluster_wait()
            self.merge_groups(sM, sL, sO, mO, mLSE, sPart, sLp, b, hq0, split, tid)
            # Release this CTA's remote stores; rank 0 acquires them all.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            if split == 0:
                self.merge_cluster(sPart, sLp, mO, mLSE, b, hq0, tid)
        else:
            self.merge_groups(sM, sL, sO, mO, mLSE, mOpart, mLpart, b, hq0, split, tid)
            if cutlass.const_expr(self.split):
                self.merge_splits(mO, mLSE, mOpart, mLpart, mSem, sFlag, num_splits, b, hg, hq0, tid)

    @cute.jit
    def cluster_partials(self, smem):
        """Rank 0's landing buffers for the cluster merge (every CTA allocates them, only
        rank 0's are written), and the cluster arrive that the merge's first wait matches."""
        sPart = sLp = None
        if cutlass.const_expr(self.cluster > 1):
            H, D = self.heads, self.head_dim
            sPart = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.cluster, H, D), stride=(H * D, D, 1)),
                                         byte_alignment=16)
            sLp = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.cluster, H)), byte_alignment=16)
            # Remote shared memory may be written only once its CTA runs: the matching wait
            # comes just before the writes, long after every CTA has arrived here.
            cute.arch.cluster_arrive_relaxed()
        return sPart, sLp

    @cute.jit
    def key_range(self, mK, mSeqlens, b, split, num_splits):
        """This split's keys [start, end) of sequence b and the block_n steps covering them:
        contiguous, block-aligned ranges; trailing splits may be empty."""
        seqlen = mK.shape[1]
        if cutlass.const_expr(self.seqlens):
            seqlen = mSeqlens[b]
        n_blocks = (seqlen + self.block_n - 1) // self.block_n
        per_split = (n_blocks + num_splits - 1) // num_splits
        start = split * per_split * self.block_n
        end = cutlass.min(seqlen, start + per_split * self.block_n)
        return start, end, (end - start + self.block_n - 1) // self.block_n

    @cute.jit
    def merge_groups(self, sM, sL, sO, mO, mLSE, mOpart, mLpart, b, hq0, split, tid):
        """Fold the R row groups' softmax states (sM, sL in log2 units, sO unnormalised) into
        this CTA's answer: O and LSE, or with several splits this split's fp32 partial."""
        H, D, R = self.out_heads, self.head_dim, self.rows
        neg_inf = -cutlass.Float32.inf
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
            lse2 = self.folded_lse2(ref, tot)
            o = self.folded_o(o, tot)
            if cutlass.const_expr(self.cluster > 1):  # mOpart / mLpart: sPart / sLp, of rank 0
                store_f32_cluster(mOpart.iterator + cute.crd2idx((split, h, d), mOpart.layout), 0, o)
                if d == 0:
                    store_f32_cluster(mLpart.iterator + cute.crd2idx((split, h), mLpart.layout), 0, lse2)
            elif cutlass.const_expr(self.split):
                mOpart[b, hq0 + h, split, d] = o
                if d == 0:
                    mLpart[b, hq0 + h, split] = lse2
            else:
                mO[b, 0, hq0 + h, d] = o.to(mO.element_type)
                if d == 0:
                    mLSE[b, hq0 + h, 0] = lse2 * _LN_2

    @cute.jit
    def prefetch(self, g2s, gK, gV, ring, start, end, n_steps, grp, col, tid):
        """The first stages - 1 steps of this thread's K/V copies, one commit group each."""
        for p in cutlass.range_constexpr(self.stages - 1):
            if p < n_steps:
                self.issue_rows(g2s, gK, gV, ring, p, start + p * self.block_n, end, grp, col, tid)
            cute.arch.cp_async_commit_group()  # empty groups keep the wait count uniform

    def chunk(self, col, j):
        """The 16-byte chunk of a D-wide row that thread `col` of its row group copies j-th
        (and whose 8 columns are its registers [8j, 8j + 8) of q, K, V and the output)."""
        return j * self.tpr + col

    @cute.jit
    def issue_rows(self, g2s, gK, gV, ring, slot, n0, end, grp, col, tid):
        """This thread's K/V chunks of one block_n step, as cp.async copies into its ring slots.
        Rows past the range are clamped to its last row, so they stay in bounds and hold
        finite data; softmax_step masks their scores."""
        for u in cutlass.range_constexpr(self.unroll):
            row = cutlass.min(n0 + u * self.rows + grp, end - 1)
            for j in cutlass.range_constexpr(self.vec):
                cute.copy(g2s, cute.local_tile(gK[row, None], (8,), (self.chunk(col, j),)), ring[None, tid, j, u, slot, 0])
                cute.copy(g2s, cute.local_tile(gV[row, None], (8,), (self.chunk(col, j),)), ring[None, tid, j, u, slot, 1])

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
    def merge_cluster(self, sPart, sLp, mO, mLSE, b, hq0, tid):
        """Rank 0 of a cluster folds the splits' partials (normalised O, LSE in log2 units),
        which every CTA stored into its shared memory: no global round trip, no counter."""
        H, D, C = self.heads, self.head_dim, self.cluster
        neg_inf = -cutlass.Float32.inf
        for idx in cutlass.range(tid, H * D, self.num_threads):
            h = idx // D
            d = idx - h * D
            mx = neg_inf
            for sp in cutlass.range_constexpr(C):
                mx = cutlass.max(mx, sLp[sp, h])
            ref = cutlass.select_(mx == neg_inf, cutlass.Float32(0.0), mx)
            tot = cutlass.Float32(0.0)
            o = cutlass.Float32(0.0)
            for sp in cutlass.range_constexpr(C):
                w = cute.math.exp2(sLp[sp, h] - ref, fastmath=True)
                tot += w
                o += w * sPart[sp, h, d]
            mO[b, 0, hq0 + h, d] = self.folded_o(o, tot).to(mO.element_type)
            if d == 0:
                mLSE[b, hq0 + h, 0] = self.folded_lse2(ref, tot) * _LN_2

    @cute.jit
    def folded_o(self, o, tot):
        """o / tot for a folded softmax state, 0 where nothing was attended (tot = 0); a NaN
        tot counts as attended, so it reaches the output."""
        has = tot != 0.0
        return cutlass.Float32(cutlass.select_(has, o / cutlass.select_(has, tot, cutlass.Float32(1.0)),
                                               cutlass.Float32(0.0)))

    @cute.jit
    def folded_lse2(self, ref, tot):
        """The folded state's log-sum-exp in log2 units (ref + log2 tot), -inf with tot = 0."""
        has = tot != 0.0
        return cutlass.select_(has, ref + cute.math.log2(cutlass.select_(has, tot, cutlass.Float32(1.0)),
                                                         fastmath=True), -cutlass.Float32.inf)

    @cute.jit
    def merge_splits(self, mO, mLSE, mOpart, mLpart, mSem, sFlag, num_splits, b, hg, hq0, tid):
        """The last CTA of a (batch, head group) folds all splits' partials into O and LSE.

        This tail runs on one CTA after all the others, so its dependent L2 round trips are
        serial time: after the counter, one round trip per chunk of splits. The output is
        cut into 4-column groups (16-byte loads); L lanes of a warp share a group, each
        folding every L-th split online (running max and sum, rescaled per chunk of CH of
        its splits, all loads of a chunk issued before its math), and the L lanes' states
        merge with butterfly shuffles at the end. Every thread loads the LSEs of its own
        splits: no shared memory, no barrier, no separate pass for the split weights."""
        H = self.heads
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
            # Trace-time sizes, set inside the branch so they stay Python ints.
            D, T = self.head_dim, self.num_threads
            groups = H * D // 4
            L, P, CH = _merge_shape(groups, T)
            j0 = tid % L
            part = cute.make_rmem_tensor(cute.make_layout((P, CH, 4), stride=(4 * CH, 4, 1)), cutlass.Float32)
            lp = cute.make_rmem_tensor(cute.make_layout((P, CH), stride=(CH, 1)), cutlass.Float32)
            o = cute.make_rmem_tensor(cute.make_layout((P, 4), stride=(4, 1)), cutlass.Float32)
            run_m = cute.make_rmem_tensor((P,), cutlass.Float32)
            run_l = cute.make_rmem_tensor((P,), cutlass.Float32)
            o.fill(0.0)
            run_m.fill(neg_inf)
            run_l.fill(0.0)
            for sp0 in cutlass.range(0, num_splits, L * CH):
                # Every load of the chunk first (indices clamped, so no branch splits them).
                for p in cutlass.range_constexpr(P):
                    g = cutlass.min(tid // L + p * (T // L), groups - 1)
                    h = g // (D // 4)
                    d4 = g - h * (D // 4)
                    for c in cutlass.range_constexpr(CH):
                        sp = cutlass.min(sp0 + j0 + c * L, num_splits - 1)
                        cute.autovec_copy(cute.local_tile(mOpart[b, hq0 + h, sp, None], (4,), (d4,)), part[p, c, None])
                        lp[p, c] = mLpart[b, hq0 + h, sp]
                for p in cutlass.range_constexpr(P):
                    for c in cutlass.range_constexpr(CH):
                        lp[p, c] = cutlass.select_(sp0 + j0 + c * L < num_splits, lp[p, c], neg_inf)
                    mx = run_m[p]
                    for c in cutlass.range_constexpr(CH):
                        mx = cutlass.max(mx, lp[p, c])
                    # exp2(-inf - 0) = 0 rather than NaN while no split has seen a key.
                    ref = cutlass.select_(mx == neg_inf, cutlass.Float32(0.0), mx)
                    scale = cute.math.exp2(run_m[p] - ref, fastmath=True)
                    run_m[p] = mx
                    tot = run_l[p] * scale
                    for i in cutlass.range_constexpr(4):
                        o[p, i] = o[p, i] * scale
                    for c in cutlass.range_constexpr(CH):
                        w = cute.math.exp2(lp[p, c] - ref, fastmath=True)
                        tot += w
                        for i in cutlass.range_constexpr(4):
                            o[p, i] += w * part[p, c, i]
                    run_l[p] = tot
            ov = cute.make_rmem_tensor((4,), mO.element_type)
            for p in cutlass.range_constexpr(P):
                for k in cutlass.range_constexpr(L.bit_length() - 1):
                    om = cute.arch.shuffle_sync_bfly(run_m[p], offset=1 << k)
                    mx = cutlass.max(run_m[p], om)
                    ref = cutlass.select_(mx == neg_inf, cutlass.Float32(0.0), mx)
                    mine = cute.math.exp2(run_m[p] - ref, fastmath=True)
                    theirs = cute.math.exp2(om - ref, fastmath=True)
                    run_l[p] = run_l[p] * mine + cute.arch.shuffle_sync_bfly(run_l[p], offset=1 << k) * theirs
                    for i in cutlass.range_constexpr(4):
                        o[p, i] = o[p, i] * mine + cute.arch.shuffle_sync_bfly(o[p, i], offset=1 << k) * theirs
                    run_m[p] = mx
                g = tid // L + p * (T // L)
                if g < groups and j0 == 0:
                    h = g // (D // 4)
                    d4 = g - h * (D // 4)
                    for i in cutlass.range_constexpr(4):
                        ov[i] = self.folded_o(o[p, i], run_l[p]).to(mO.element_type)
                    cute.autovec_copy(ov, cute.local_tile(mO[b, 0, hq0 + h, None], (4,), (d4,)))
                    if d4 == 0:
                        top = cutlass.select_(run_m[p] == neg_inf, cutlass.Float32(0.0), run_m[p])
                        mLSE[b, hq0 + h, 0] = self.folded_lse2(top, run_l[p]) * _LN_2


class FlashDecodeMmaSm90(FlashDecodeSm90):
    """Split-KV decode attention for GQA on the tensor cores (mma.sync m16n8k16), one launch.

    Why: with G query heads per KV head the SIMT kernel does G dot products per key and
    reduces each across the 16 threads of a D = 128 row with shuffles; at G = 4 that math,
    not HBM, bounded it (62% of HBM at batch 1 and 8k keys, 0.72x cuDNN at batch 8 and 1k).
    Here the packed query heads are the M rows of an FA2-style warp tile (padded to 16; the
    tensor cores have room to waste), so Q K^T and P V are two small warp GEMMs and the row
    statistics need two quad shuffles per row.

    Warp roles: none; every warp copies and computes its own keys. Warp w of a CTA step
    owns keys [w * bn, (w + 1) * bn) of it and keeps its own online softmax (rows = heads);
    the warps merge through shared memory at the end exactly like the SIMT kernel's row
    groups, and split partials merge in-launch through the same counter protocol.
    Pipeline: per warp a `stages`-deep ring of swizzled [bn, D] K and V tiles in shared
    memory, filled by the warp's own cp.async copies stages - 1 steps ahead (commit/wait
    groups, then a warp barrier so each lane sees the others' copies: no CTA barrier in the
    loop). Q goes through shared memory once and stays in registers as A fragments; K is
    read with ldmatrix, V with ldmatrix.trans (the B operand of P V is V^T's K-major view).
    """

    def __init__(self, cfg: DecodeMmaConfig, heads: int, split: bool, seqlens: bool, masked: bool = False,
                 cluster: int = 1, early_trigger: bool = False):
        head_dim, num_warps, bn, stages = cfg.head_dim, cfg.warps, cfg.bn, cfg.stages
        assert heads <= 16 and bn % 16 == 0 and stages >= 2 and head_dim % 64 == 0
        assert 1 <= cluster <= MAX_CLUSTER_SPLITS and (cluster == 1 or split)
        self.cfg = cfg
        self.early_trigger = early_trigger
        self.head_dim = head_dim
        self.heads = heads
        self.out_heads = heads  # no kv_pack: FlashDecodeSm90.merge_groups folds these
        self.split = split
        self.seqlens = seqlens
        self.masked = masked
        self.cluster = cluster  # as in FlashDecodeSm90
        self.num_threads = 32 * num_warps
        self.num_warps = num_warps
        self.rows = num_warps  # the row groups merge_groups folds
        self.bn = bn  # keys per warp and step
        self.stages = stages
        self.block_n = num_warps * bn  # keys per CTA step (the split heuristic's unit)
        # The warps' fp32 partial O overlays the K/V ring after the key loop.
        assert num_warps * heads * head_dim * 4 <= self.ring_bytes(), "partial O does not fit in the ring"
        assert self.smem_bytes() <= SM90_SMEM_BYTES, f"{self.smem_bytes()} bytes of smem"

    def ring_bytes(self, dtype_bytes: int = 2) -> int:
        return self.cfg.ring_bytes(dtype_bytes)

    def smem_bytes(self, dtype_bytes: int = 2) -> int:
        return self.cfg.smem_bytes(self.heads, self.cluster, dtype_bytes)

    @cute.jit
    def __call__(self, mQ, mK, mV, mO, mLSE, mOpart, mLpart, mSem, mSeqlens, mMask,
                 scale_log2: cutlass.Float32, qheads_per_kvhead: cutlass.Int32, num_splits: cutlass.Int32, stream):
        dt = mK.element_type
        tiled_mma = cute.make_tiled_mma(warp.MmaF16BF16Op(dt, cutlass.Float32, (16, 8, 16)), (1, 1, 1))
        # 128-byte rows of 64 elements, XOR-swizzled in 16-byte chunks: the 8 rows an
        # ldmatrix reads per matrix land in 8 different bank groups.
        atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
        ring_layout = cute.tile_to_shape(atom, (self.bn, self.head_dim, self.num_warps * self.stages * 2), (0, 1, 2))
        q_layout = cute.tile_to_shape(atom, (16, self.head_dim), (0, 1))
        B, Hq = mQ.shape[0], mQ.shape[2]
        self.kernel(mQ, mK, mV, mO, mLSE, mOpart, mLpart, mSem, mSeqlens, mMask, scale_log2, qheads_per_kvhead,
                    num_splits, tiled_mma, ring_layout, q_layout).launch(
            grid=(num_splits, Hq // self.heads, B), block=(self.num_threads, 1, 1), stream=stream,
            cluster=(self.cluster, 1, 1) if cutlass.const_expr(self.cluster > 1) else None, use_pdl=True)

    @cute.kernel
    def kernel(self, mQ, mK, mV, mO, mLSE, mOpart, mLpart, mSem, mSeqlens, mMask, scale_log2, qheads_per_kvhead,
               num_splits, tiled_mma: cute.TiledMma, ring_layout: cute.ComposedLayout, q_layout: cute.ComposedLayout):
        tid, _, _ = cute.arch.thread_idx()
        split, hg, b = cute.arch.block_idx()
        H, D, W, BN, T = self.heads, self.head_dim, self.num_warps, self.bn, self.num_threads
        wid = cute.arch.make_warp_uniform(tid // 32)
        lane = tid % 32
        hq0 = hg * H
        h_kv = hq0 // qheads_per_kvhead
        dt = mK.element_type

        smem = cutlass.memory.SmemAllocator()
        ring = smem.allocate_tensor(dt, ring_layout, byte_alignment=1024)
        sQ = smem.allocate_tensor(dt, q_layout, byte_alignment=1024)
        sM = smem.allocate_tensor(cutlass.Float32, cute.make_layout((W, H)), byte_alignment=16)
        sL = smem.allocate_tensor(cutlass.Float32, cute.make_layout((W, H)), byte_alignment=16)
        # The warps' partial O reuses the ring once the key loop is done (see the barrier below).
        sO = cute.make_tensor(cute.recast_ptr(ring.iterator, dtype=cutlass.Float32),
                              cute.make_layout((W, H, D), stride=(H * D, D, 1)))
        sFlag = smem.allocate_tensor(cutlass.Int32, cute.make_layout((4,)), byte_alignment=16)
        sPart, sLp = self.cluster_partials(smem)

        # With early_trigger the output projection after this may launch now and load its
        # weights (constants) while this grid waits for q and the newest K/V row.
        self.pdl_wait()
        step_n = self.block_n  # W * BN keys per CTA step
        start, end, n_steps = self.key_range(mK, mSeqlens, b, split, num_splits)

        gK = mK[b, None, h_kv, None]  # [Sk, D]
        gV = mV[b, None, h_kv, None]
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt,
                                  num_bits_per_copy=128)
        # Start the first stages - 1 steps before anything else: Q's trip through smem overlaps them.
        for p in cutlass.range_constexpr(self.stages - 1):
            if p < n_steps:
                self.issue_tile(g2s, gK, gV, ring, wid * self.stages + p, start + p * step_n + wid * BN, end, lane)
            cute.arch.cp_async_commit_group()

        # Q (heads x D) into rows 0..H-1 of a 16-row tile, zeros below.
        qv = cute.make_rmem_tensor((8,), dt)
        for idx in cutlass.range(tid, 16 * (D // 8), T):
            r = idx // (D // 8)
            c = idx - r * (D // 8)
            if r < H:
                cute.autovec_copy(cute.local_tile(mQ[b, 0, hq0 + r, None], (8,), (c,)), qv)
            else:
                qv.fill(0.0)
            cute.autovec_copy(qv, cute.local_tile(sQ[r, None], (8,), (c,)))
        cute.arch.sync_threads()

        thr_mma = tiled_mma.get_slice(lane)
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dt)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dt)
        copy_q = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(lane)
        copy_k = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(lane)
        copy_v = cute.make_tiled_copy_B(ldsm_t, tiled_mma).get_slice(lane)
        transpose = cute.make_layout((D, BN), stride=(BN, 1))
        sK0 = ring[None, None, 0]
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK0))
        tOrV = thr_mma.make_fragment_B(thr_mma.partition_B(cute.composition(sK0, transpose)))
        cute.copy(copy_q, copy_q.partition_S(sQ), copy_q.retile(tSrQ))
        acc_s = cute.make_rmem_tensor(thr_mma.partition_shape_C((16, BN)), cutlass.Float32)
        acc_o = cute.make_rmem_tensor(thr_mma.partition_shape_C((16, D)), cutlass.Float32)
        acc_o.fill(0.0)
        tScS = thr_mma.partition_C(cute.make_identity_tensor((16, BN)))
        tOcO = thr_mma.partition_C(cute.make_identity_tensor((16, D)))
        rP = cute.make_rmem_tensor(acc_s.layout, dt)
        tOrP = cute.make_tensor(rP.iterator, self._acc_to_a_layout(rP.layout))

        neg_inf = -cutlass.Float32.inf
        # Thread rows r (quad row) and r + 8; with H <= 8 the second half never holds a head.
        m0, m1 = cutlass.Float32(neg_inf), cutlass.Float32(neg_inf)
        l0, l1 = cutlass.Float32(0.0), cutlass.Float32(0.0)
        two_halves = H > 8
        for it in cutlass.range(n_steps):
            cute.arch.cp_async_wait_group(self.stages - 2)
            cute.arch.sync_warp()  # the other lanes' copies of this slot are visible now
            slot = wid * self.stages + it % self.stages
            nxt = it + self.stages - 1
            if nxt < n_steps:
                self.issue_tile(g2s, gK, gV, ring, wid * self.stages + nxt % self.stages,
                                start + nxt * step_n + wid * BN, end, lane)
            cute.arch.cp_async_commit_group()

            sK = ring[None, None, 2 * slot]
            sVt = cute.composition(ring[None, None, 2 * slot + 1], transpose)
            acc_s.fill(0.0)
            tSsK = copy_k.partition_S(sK)
            tSrK_v = copy_k.retile(tSrK)
            for kb in cutlass.range_constexpr(cute.size(tSrK.shape[2])):
                cute.copy(copy_k, tSsK[None, None, kb], tSrK_v[None, None, kb])
                cute.gemm(tiled_mma, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb], acc_s)

            n0 = start + it * step_n + wid * BN
            mx0, mx1 = m0, m1
            for v in cutlass.range_constexpr(cute.size(acc_s)):
                n = n0 + tScS[v][1]
                s = acc_s[v] * scale_log2
                if n >= end:
                    s = neg_inf
                if cutlass.const_expr(self.masked):
                    if mMask[b, cutlass.min(n, end - 1)] == 0:
                        s = neg_inf
                acc_s[v] = s
                if cutlass.const_expr((v // 2) % 2 == 0):
                    mx0 = cute.arch.fmax(mx0, s)
                elif cutlass.const_expr(two_halves):
                    mx1 = cute.arch.fmax(mx1, s)
            mx0 = cute.arch.fmax(mx0, cute.arch.shuffle_sync_bfly(mx0, offset=1))
            mx0 = cute.arch.fmax(mx0, cute.arch.shuffle_sync_bfly(mx0, offset=2))
            if cutlass.const_expr(two_halves):
                mx1 = cute.arch.fmax(mx1, cute.arch.shuffle_sync_bfly(mx1, offset=1))
                mx1 = cute.arch.fmax(mx1, cute.arch.shuffle_sync_bfly(mx1, offset=2))
            # exp2(-inf - 0) = 0 rather than NaN while a row has seen no key.
            ref0 = cutlass.select_(mx0 == neg_inf, cutlass.Float32(0.0), mx0)
            ref1 = cutlass.select_(mx1 == neg_inf, cutlass.Float32(0.0), mx1)
            c0 = cute.math.exp2(m0 - ref0, fastmath=True)
            c1 = cute.math.exp2(m1 - ref1, fastmath=True)
            m0, m1 = mx0, mx1
            l0, l1 = l0 * c0, l1 * c1
            for v in cutlass.range_constexpr(cute.size(acc_s)):
                if cutlass.const_expr((v // 2) % 2 == 0):
                    p = cute.math.exp2(acc_s[v] - ref0, fastmath=True)
                    l0 += p
                    acc_s[v] = p
                elif cutlass.const_expr(two_halves):
                    p = cute.math.exp2(acc_s[v] - ref1, fastmath=True)
                    l1 += p
                    acc_s[v] = p
                else:
                    acc_s[v] = 0.0
            # Flat accumulator index v = 4 * n8_tile + 2 * row_half + column (nested loops
            # keep each unrolled loop short).
            for j in cutlass.range_constexpr(cute.size(acc_o) // 4):
                for i in cutlass.range_constexpr(2):
                    acc_o[4 * j + i] = acc_o[4 * j + i] * c0
                    if cutlass.const_expr(two_halves):
                        acc_o[4 * j + 2 + i] = acc_o[4 * j + 2 + i] * c1
            rP.store(acc_s.load().to(dt))
            tOsV = copy_v.partition_S(sVt)
            tOrV_v = copy_v.retile(tOrV)
            for kb in cutlass.range_constexpr(cute.size(tOrP.shape[2])):
                cute.copy(copy_v, tOsV[None, None, kb], tOrV_v[None, None, kb])
                cute.gemm(tiled_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb], acc_o)

        # Each warp's row sums are spread over its quad: total them, then publish the warp's state.
        l0 = l0 + cute.arch.shuffle_sync_bfly(l0, offset=1)
        l0 = l0 + cute.arch.shuffle_sync_bfly(l0, offset=2)
        l1 = l1 + cute.arch.shuffle_sync_bfly(l1, offset=1)
        l1 = l1 + cute.arch.shuffle_sync_bfly(l1, offset=2)
        r0 = lane // 4
        # sO overlays the ring: every warp must be done reading its tiles (and no copy may be
        # in flight: the trailing commit groups are empty) before any warp writes.
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        if lane % 4 == 0:
            if r0 < H:
                sM[wid, r0] = m0
                sL[wid, r0] = l0
            if cutlass.const_expr(two_halves):
                if r0 + 8 < H:
                    sM[wid, r0 + 8] = m1
                    sL[wid, r0 + 8] = l1
        for j in cutlass.range_constexpr(cute.size(acc_o) // 4):
            for i in cutlass.range_constexpr(4):
                r, c = tOcO[4 * j + i]
                if r < H:
                    sO[wid, r, c] = acc_o[4 * j + i]
        cute.arch.sync_threads()
        self.finish(sM, sL, sO, sPart, sLp, sFlag, mO, mLSE, mOpart, mLpart, mSem, num_splits, b, hg, hq0,
                    split, tid)

    @cute.jit
    def issue_tile(self, g2s, gK, gV, ring, slot, n0, end, lane):
        """cp.async this warp's bn x D tiles of K and V (keys n0...) into ring slot `slot`.
        Rows past the range are clamped to its last row: in bounds and finite; the scores of
        those keys are masked."""
        chunks = self.head_dim // 8
        sK = ring[None, None, 2 * slot]
        sV = ring[None, None, 2 * slot + 1]
        for i in cutlass.range_constexpr(self.bn * chunks // 32):
            idx = lane + 32 * i
            r = idx // chunks
            c = idx - r * chunks
            row = cutlass.min(n0 + r, end - 1)
            cute.copy(g2s, cute.local_tile(gK[row, None], (8,), (c,)), cute.local_tile(sK[r, None], (8,), (c,)))
            cute.copy(g2s, cute.local_tile(gV[row, None], (8,), (c,)), cute.local_tile(sV[r, None], (8,), (c,)))

    @staticmethod
    def _acc_to_a_layout(layout):
        """((2, 2), 1, N/8) m16n8 accumulator -> ((2, 2, 2), 1, N/16) m16n8k16 A fragment: two
        adjacent n8 tiles of C are one k16 slice of A (FA2's register reuse of P)."""
        n8 = layout.shape[2]
        return cute.make_layout(((2, 2, 2), 1, n8 // 2), stride=((1, 2, 4), 0, 8))
