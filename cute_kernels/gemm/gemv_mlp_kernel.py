"""A transformer MLP for one token in one launch (CuTe DSL, sm_90a): decode's c_fc and
mlp c_proj fused, the second as split-K over the hidden units. Experimental: correct, but
slower than the two separate kernels in GPT-2 XL's decode chain (below).

    f = act(LN(x) @ W1.T + b1)          W1 [F, E]  (c_fc)
    out = f @ W2.T + b2 + x             W2 [E, F]  (mlp c_proj), x the residual

Why try: in the decode step the mlp c_proj was its own kernel that could start streaming
its 20 MB of weights only after c_fc's grid had drained (a PDL wait, then a cold start),
and it added 11.1 us per layer for 6.1 us of weights (NOTES.md). Here CTA c owns hidden
units [R c, R c + R): it computes them exactly as GemvSm90 does (LayerNorm prologue, W1's
rows bulk-copied before the PDL wait, the product on the tensor cores, bias, activation),
and as soon as its product is done it TMA-loads the matching [E, R] column strip of W2
(64-row boxes) into the ring W1's rows just left, multiplies it by its R activations (an
outer product: a partial sum for every one of the E outputs) and adds those into an fp32
accumulator in global memory (`red.add.v4.f32`). The CTA that finishes last (an acq_rel
counter) adds the bias and the residual, rounds once (as the separate c_proj's epilogue
does), writes `out`, and leaves the accumulator and the counter at zero for the next
launch. The sum's order depends on arrival: results may differ in the last fp32 bits.

Measured (H100, GPT-2 XL bf16 decode, same runs; separate kernels 1.561 ms/token): 1.661.
The W2 strip, loaded after the product, costs ~9 us per layer on the critical path (1.40
with its load skipped, timing only). Tried and dropped: the last CTA's tail as a loop of
dependent loads (6 us per launch: 1.83), W2 as whole rows of its transpose (1.658, and a
second copy of the weight), W2 prefetched into L2 before the PDL wait (1.74: it competes
with the critical path's loads) or right after it (1.81), clusters of 4 or 8 CTAs summing
their partials through distributed shared memory first (1.80 / 2.01; the reductions
themselves cost ~0.4 us).

Warp roles: GemvSm90's until its epilogue (warp 0 also issues the bulk copies); warp 0
issues W2's TMA boxes; then every warp multiplies (4 lanes per output row, 16 bytes each)
and thread t adds output quads t, t + 256, ... into the accumulator.
Pipelines / barriers: GemvSm90's row barriers; one mbarrier for W2's boxes; the counter in
global memory.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.nvgpu import warp as warp_ops
from cutlass.cutlass_dsl import dsl_user_op

from .gemv_kernel import GemvConfig, GemvSm90
from .kernel import Epilogue

BOX_ROWS = 64  # W2 rows per TMA box; E must be a multiple


@dsl_user_op
def red_add_f32x4(ptr, a, b, c, d, *, loc=None, ip=None):
    """red.relaxed.gpu.global.add.v4.f32: four consecutive fp32 (16-byte aligned) added in L2."""
    llvm.inline_asm(
        None,
        [ptr.toint(loc=loc, ip=ip).ir_value()] + [cutlass.Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c, d)],
        "red.relaxed.gpu.global.add.v4.f32 [$0], {$1, $2, $3, $4};",
        "l,f,f,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def load_f32_relaxed_gpu(ptr, *, loc=None, ip=None):
    """ld.relaxed.gpu.global.f32: a value other CTAs added with red (not the SM's L1 copy)."""
    return cutlass.Float32(llvm.inline_asm(
        cutlass.Float32.mlir_type, [ptr.toint(loc=loc, ip=ip).ir_value()],
        "ld.relaxed.gpu.global.f32 $0, [$1];", "=f,l", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


class GemvMlpSm90(GemvSm90):
    """c_fc (LayerNorm prologue, bias, activation) + mlp c_proj (split-K, bias, residual);
    see the module docstring."""

    def __init__(self, cfg: GemvConfig, activation: str = "gelu_tanh"):
        super().__init__(cfg, Epilogue(bias=True, activation=activation), ln=True, kv=False)
        assert cfg.wbytes == 2
        # The outer product gives each output row 4 lanes x 8 hidden units.
        assert cfg.rows == 32, "the outer product is written for 32 hidden units per CTA"

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW1: cute.Tensor, mF: cute.Tensor, mB1, mLnW, mLnB, mW2: cute.Tensor, mB2,
                 mOut: cute.Tensor, mAcc: cute.Tensor, mCount: cute.Tensor, eps: cutlass.Float32, stream):
        R = self.cfg.rows
        grid = mW1.shape[0] // R
        tiled_mma = cute.make_tiled_mma(warp_ops.MmaF16BF16Op(mW1.element_type, cutlass.Float32, (16, 8, 16)),
                                        (1, 1, 1))
        # One CTA's W2 columns land as [E, R] row-major (64 bytes per row) in the ring.
        box = cute.make_layout((BOX_ROWS, R), stride=(R, 1))
        tma_w2, tW2 = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mW2, box, (BOX_ROWS, R))
        tail = (tma_w2, tW2, mB2, mOut, mAcc, mCount)
        f32 = cutlass.Float32
        self.kernel(mX, mW1, mF, mB1, None, mLnW, mLnB, None, None, None, None, None, f32(1.0), f32(1.0), eps,
                    tiled_mma, tail).launch(
            grid=(grid, 1, 1), block=(self.num_threads, 1, 1), stream=stream, use_pdl=True)

    def setup(self, smem, ring, scratch, mKc, mVc, mPos, tail):
        tma_w2, tW2 = tail[0], tail[1]
        R = self.cfg.rows
        E = tW2.shape[0]
        # W2's strip [E, R] in the ring; the fp32 partials in the (then dead) activation buffers.
        sW2 = cute.make_tensor(ring.iterator, cute.make_layout((E, R), stride=(R, 1)))
        sPart = cute.make_tensor(cute.recast_ptr(scratch.iterator, dtype=cutlass.Float32), cute.make_layout(E))
        sY = smem.allocate_tensor(cutlass.Float32, cute.make_layout(R), byte_alignment=16)
        w2_bar = smem.allocate_array(cutlass.Int64, 1)
        flag = smem.allocate_tensor(cutlass.Int32, cute.make_layout(1), byte_alignment=4)
        self.init_w2_barrier(tma_w2, w2_bar)
        return sY, w2_bar, flag, sW2, sPart

    @cute.jit
    def init_w2_barrier(self, tma_w2, w2_bar):
        # Before GemvSm90's CTA barrier that follows setup; armed after the product.
        if cute.arch.thread_idx()[0] == 0:
            cpasync.prefetch_descriptor(tma_w2)
            cute.arch.mbarrier_init(w2_bar, 1)

    @cute.jit
    def after_product(self, ring, extra, tail):
        """Warp 0: this CTA's [E, R] column strip of W2 as 64-row TMA boxes into the ring."""
        tma_w2, tW2 = tail[0], tail[1]
        w2_bar = extra[1]
        R = self.cfg.rows
        E = tW2.shape[0]
        tid = cute.arch.thread_idx()[0]
        if tid // 32 == 0:
            # The ring was last read through ldmatrix (generic proxy); TMA writes it (async proxy).
            cute.arch.fence_proxy("async.shared", space="cta")
            if tid == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(w2_bar, E * R * (ring.element_type.width // 8))
            cute.arch.sync_warp()
            sW2 = cute.make_tensor(ring.iterator, cute.make_layout(((BOX_ROWS, R), E // BOX_ROWS),
                                                                   stride=((R, 1), BOX_ROWS * R)))
            gW2 = cute.local_tile(tW2, (BOX_ROWS, R), (None, cute.arch.block_idx()[0]))
            tWs, tWg = cpasync.tma_partition(tma_w2, 0, cute.make_layout(1), sW2, cute.group_modes(gW2, 0, 2))
            # The whole warp: cute.copy of a TMA atom elects one lane (elect.sync over the warp;
            # from thread 0 alone it never issued, and the wait below hung).
            for b in cutlass.range(E // BOX_ROWS):
                cute.copy(tma_w2, tWg[(None, b)], tWs[(None, b)], tma_bar_ptr=w2_bar)

    @cute.jit
    def after_epilogue(self, y, own, tid, extra, N, mX, mKc, mVc, mPos, tail):
        _, tW2, mB2, mOut, mAcc, mCount = tail
        sY, w2_bar, flag, sW2, sPart = extra
        W, T = self.cfg.warps, self.num_threads
        E = tW2.shape[0]
        warp, lane = tid // 32, tid % 32
        # The activation as the separate path hands it on: rounded to the model's dtype.
        if own:
            sY[tid] = y.to(mOut.element_type).to(cutlass.Float32)
        cute.arch.sync_threads()

        # ---- outer product: lanes 4g .. 4g + 3 own output row n, 8 hidden units (16 bytes)
        # each; a quarter warp reads 128 contiguous bytes (no bank conflicts)
        g, q = lane // 4, lane % 4
        yq = cute.make_rmem_tensor((8,), cutlass.Float32)
        for i in cutlass.range_constexpr(8):
            yq[i] = sY[8 * q + i]
        wv = cute.make_rmem_tensor((8,), sW2.element_type)
        cute.arch.mbarrier_wait(w2_bar, 0)
        for n in cutlass.range(warp * 8 + g, E, W * 8):
            cute.autovec_copy(cute.local_tile(sW2[n, None], (8,), (q,)), wv)
            s = cutlass.Float32(0.0)
            for i in cutlass.range_constexpr(8):
                s = s + yq[i] * wv[i].to(cutlass.Float32)
            s = s + cute.arch.shuffle_sync_bfly(s, offset=1)
            s = s + cute.arch.shuffle_sync_bfly(s, offset=2)
            if q == 0:
                sPart[n] = s
        cute.arch.sync_threads()

        # ---- the partials into the fp32 accumulator, 4 outputs per red
        v = cute.make_rmem_tensor((4,), cutlass.Float32)
        for i in cutlass.range(tid, E // 4, T):
            for j in cutlass.range_constexpr(4):
                v[j] = sPart[4 * i + j]
            red_add_f32x4(mAcc.iterator + 4 * i, v[0], v[1], v[2], v[3])

        # ---- the last CTA to finish writes out = acc + b2 + x and re-zeroes acc and the counter
        self.finalize(tid, T, E, mX, mB2, mOut, mAcc, mCount, flag)

    @cute.jit
    def finalize(self, tid, T, E, mX, mB2, mOut, mAcc, mCount, flag):
        # Release: the CTA barrier orders every thread's reds before thread 0's acq_rel add
        # (release is cumulative); the last CTA's later loads are ordered after its acquire.
        cute.arch.sync_threads()
        if tid == 0:
            old = cute.arch.atomic_add(mCount.iterator, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            last = old == cute.arch.grid_dim()[0] - 1
            flag[0] = cutlass.select_(last, cutlass.Int32(1), cutlass.Int32(0))
            if last:
                mCount[0] = 0
        cute.arch.sync_threads()
        if flag[0] == 1:
            # Every load first, then the math: one L2 round trip for the CTA, not one per
            # output (a loop of dependent loads made this tail ~6 us per launch).
            KQ = -(-self.cfg.k_max // (4 * T))
            a = cute.make_rmem_tensor((KQ, 4), cutlass.Float32)
            bv = cute.make_rmem_tensor((KQ, 4), mB2.element_type)
            xv = cute.make_rmem_tensor((KQ, 4), mX.element_type)
            for k in cutlass.range_constexpr(KQ):
                q = tid + k * T
                if q < E // 4:
                    for j in cutlass.range_constexpr(4):
                        a[k, j] = load_f32_relaxed_gpu(mAcc.iterator + 4 * q + j)
                        bv[k, j] = mB2[4 * q + j]
                        xv[k, j] = mX[0, 4 * q + j]
            ov = cute.make_rmem_tensor((4,), mOut.element_type)
            for k in cutlass.range_constexpr(KQ):
                q = tid + k * T
                if q < E // 4:
                    for j in cutlass.range_constexpr(4):
                        o = a[k, j] + bv[k, j].to(cutlass.Float32) + xv[k, j].to(cutlass.Float32)
                        ov[j] = o.to(mOut.element_type)
                        mAcc[4 * q + j] = cutlass.Float32(0.0)
                    cute.autovec_copy(ov, cute.local_tile(mOut[0, None], (4,), (q,)))
