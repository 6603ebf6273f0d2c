"""Decode GEMV for one activation row (CuTe DSL, sm_90a): every weight byte in flight early.

    out[n] = act(alpha * sum_k LN(x)[k] * W[n, k] + bias[n]) + beta * residual[n]

A decode step is a chain of GEMVs, each reading its weights once (GPT-2 XL: 193 of them,
3 GB per token). The Triton skinny kernel (gemv.py) loads two K steps of weights ahead of
the programmatic-dependent-launch wait and streams the rest through registers. Here each
CTA owns `rows` whole weight rows and copies all of them into shared memory with one bulk
copy (`cp.async.bulk`, the non-tensor TMA) per row *before* waiting for the previous
kernel: weights never depend on it, so this GEMV's HBM reads overlap the previous one's
tail, and a CTA's whole share is in flight at once. Rows land 16 bytes apart beyond K
(k_max + 8 elements), so ldmatrix reads them without bank conflicts.

After the wait, the CTA stages x (LayerNorm applied: two CTA-wide reductions) in shared
memory and multiplies on the tensor cores: x broadcast into the 16 rows of an m16n8k16
A operand, 8 weight rows per B operand, the warps splitting K; row 0 of C is the answer.
One CTA barrier later, thread t runs the epilogue of row t (the bias was loaded before the
wait, the residual right after it): activation, residual, and for c_attn
the KV-cache append of the new key/value.

8-bit weights (fp8 e4m3 or int8, weight-only decode): rows are K bytes, each lane reads 4
weights per k-step as one 32-bit word and converts them to two f16x2 registers (e4m3 by
cvt.rn.f16x2.e4m3x2, int8 exactly by a byte permute into 1024 + u and one subtraction);
the MMA is f16 with x converted to f16 once after staging, and the per-channel weight scale
is the epilogue's column scale.

Warp roles: none are specialised; warp 0's lanes initialise the row barriers and issue the
bulk copies (lane r % 32 for row r, lane 31 also LayerNorm's gamma and beta). Pipelines:
none; each row barrier completes once (phase 0) and nothing is refilled, which is why a
CTA's rows must fit its shared memory (the host picks `rows`, see gemv.gemv_sm90_config).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warp as warp_ops
from cutlass.cutlass_dsl import dsl_user_op

from .config import Epilogue, GemvConfig
from .kernel import epilogue_activation


@dsl_user_op
def bulk_copy_g2s(dst, src, nbytes, bar, *, loc=None, ip=None):
    """cp.async.bulk of `nbytes` (a multiple of 16, both addresses 16-byte aligned) from
    global to shared memory, completing `nbytes` transaction bytes on mbarrier `bar`.
    Inline PTX because the DSL's CopyBulkG2SOp needs a static size and K is dynamic."""
    llvm.inline_asm(
        None,
        [dst.toint(loc=loc, ip=ip).ir_value(), src.toint(loc=loc, ip=ip).ir_value(),
         cutlass.Int32(nbytes).ir_value(loc=loc, ip=ip), bar.toint(loc=loc, ip=ip).ir_value()],
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
        "r,l,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def cvt_8bit_pair_f16x2(w, hi: bool, fmt: str, *, loc=None, ip=None):
    """Two 8-bit weights of the 32-bit word w (bytes 0-1, or 2-3 when hi) as an f16x2 word:
    e4m3 by the hardware conversion, int8 exactly by the 1024 + u magic (u = s + 128)."""
    if fmt == "e4m3":
        half = "hi" if hi else "lo"
        asm = "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 $0, " + half + "; }"
    else:
        sel = "0x5352" if hi else "0x5150"
        asm = ("{ .reg .b32 t, m; xor.b32 t, $1, 0x80808080; prmt.b32 t, t, 0x64646464, " + sel + ";"
               " mov.b32 m, 0x64806480; sub.f16x2 $0, t, m; }")
    return cutlass.Int32(llvm.inline_asm(cutlass.Int32.mlir_type, [cutlass.Int32(w).ir_value(loc=loc, ip=ip)], asm,
                                         "=r,r", has_side_effects=False, is_align_stack=False,
                                         asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


class GemvSm90:
    """One-row GEMV with all of a CTA's weight rows bulk-copied ahead of the PDL wait.

    Warp roles: warp 0 also issues the bulk copies (one lane per row); every warp stages
    the activation row and then reduces whole weight rows. Pipelines: one single-use
    mbarrier per weight row (see the module docstring).
    """

    def __init__(self, cfg: GemvConfig, epi: Epilogue, ln: bool, kv: bool, w_fmt: str | None = None):
        # w_fmt "e4m3" / "s8": 8-bit weights with a per-output-channel scale (col_scale
        # "vector"), converted to f16 in registers; x is staged as f16 for the f16 MMA.
        assert epi.row_scale == "none" and (epi.col_scale == "vector") == (w_fmt is not None)
        assert w_fmt in (None, "e4m3", "s8") and cfg.wbytes == (1 if w_fmt else 2)
        assert cfg.rows % 8 == 0 and cfg.k_max % 64 == 0
        self.cfg, self.epi, self.ln, self.kv, self.w_fmt = cfg, epi, ln, kv, w_fmt
        self.num_threads = cfg.warps * 32
        assert cfg.rows <= self.num_threads  # the epilogue runs one row per thread

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mBias, mRes, mLnW, mLnB,
                 mKc, mVc, mPos, mWs, alpha: cutlass.Float32, beta: cutlass.Float32, eps: cutlass.Float32,
                 stream):
        grid = (mW.shape[0] + self.cfg.rows - 1) // self.cfg.rows
        mma_dt = cutlass.Float16 if cutlass.const_expr(self.w_fmt is not None) else mW.element_type
        tiled_mma = cute.make_tiled_mma(warp_ops.MmaF16BF16Op(mma_dt, cutlass.Float32, (16, 8, 16)), (1, 1, 1))
        self.kernel(mX, mW, mO, mBias, mRes, mLnW, mLnB, mKc, mVc, mPos, mWs, alpha, beta, eps,
                    tiled_mma).launch(
            grid=(grid, 1, 1), block=(self.num_threads, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mX, mW, mO, mBias, mRes, mLnW, mLnB, mKc, mVc, mPos, mWs, alpha, beta, eps,
               tiled_mma: cute.TiledMma):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        warp, lane = tid // 32, tid % 32
        N, K = mW.shape[0], mW.shape[1]
        R = cfg.rows
        row0 = cute.arch.block_idx()[0] * R
        nrows = cutlass.min(R, N - row0)
        w_bytes = mW.element_type.width // 8
        row_bytes = K * w_bytes

        smem = cutlass.memory.SmemAllocator()
        bars = smem.allocate_array(cutlass.Int64, R + 1)  # one per row, one for LN's gamma/beta
        partial = smem.allocate_tensor(cutlass.Float32, cute.make_layout((cfg.warps, R), stride=(R, 1)),
                                       byte_alignment=16)
        red = smem.allocate_tensor(cutlass.Float32, cute.make_layout(2 * cfg.warps), byte_alignment=16)
        xs = smem.allocate_tensor(mX.element_type, cute.make_layout((cfg.k_max // 8, 8), stride=(8, 1)),
                                  byte_alignment=16)
        # 8-bit weights multiply in f16: x (LayerNorm applied) is staged in x's dtype first,
        # then converted once into xh (|x| beyond f16's 65504 becomes inf, not a silent clamp).
        xh = xs
        if cutlass.const_expr(self.w_fmt is not None):
            xh = smem.allocate_tensor(cutlass.Float16, cute.make_layout((cfg.k_max // 8, 8), stride=(8, 1)),
                                      byte_alignment=16)
        gs = bs = None
        if cutlass.const_expr(self.ln):
            gs = smem.allocate_tensor(mX.element_type, cute.make_layout(cfg.k_max), byte_alignment=16)
            bs = smem.allocate_tensor(mX.element_type, cute.make_layout(cfg.k_max), byte_alignment=16)
        KS = cfg.row_stride
        ring = smem.allocate_tensor(mW.element_type, cute.make_layout((R, cfg.k_max), stride=(KS, 1)),
                                    byte_alignment=128)

        # Issue every weight row of this CTA first (lane r % 32 owns row r's barrier and copy,
        # so its init and its copy are in program order on one thread); LayerNorm's gamma and
        # beta ride along on the last barrier (constants too).
        ln_bar = bars + R
        if warp == 0:
            for r in cutlass.range(lane, nrows, 32):
                cute.arch.mbarrier_init(bars + r, 1)
            if cutlass.const_expr(self.ln):
                if lane == 31:
                    cute.arch.mbarrier_init(ln_bar, 1)
            cute.arch.mbarrier_init_fence()
            for r in cutlass.range(lane, nrows, 32):
                cute.arch.mbarrier_arrive_and_expect_tx(bars + r, row_bytes)
                bulk_copy_g2s(ring.iterator + r * KS, mW[row0 + r, None].iterator, row_bytes, bars + r)
            if cutlass.const_expr(self.ln):
                if lane == 31:
                    cute.arch.mbarrier_arrive_and_expect_tx(ln_bar, 2 * K * (mX.element_type.width // 8))
                    bulk_copy_g2s(gs.iterator, mLnW.iterator, K * (mX.element_type.width // 8), ln_bar)
                    bulk_copy_g2s(bs.iterator, mLnB.iterator, K * (mX.element_type.width // 8), ln_bar)
        # No warp may wait on a row barrier before warp 0 has initialised it: shared memory
        # still holds the barriers of the CTA that ran here before, whose phase 0 completed
        # (without this, multi-wave grids read rows before they landed, and faulted).
        cute.arch.sync_threads()
        # All of this grid's CTAs are resident once every CTA got here: let the next kernel
        # launch now, so its CTAs take the free shared memory and start their own weight
        # copies while this one computes (same-run A/Bs, triggering after the wait instead: 1.72 ->
        # 1.81 ms for the GPT-2 XL GEMV chain in an early form of this kernel, within 2% later).
        cute.arch.griddepcontrol_launch_dependents()
        # The epilogue's constant operand (thread t finishes row t) loads before the wait too.
        n_own = row0 + tid
        own = tid < nrows
        bias = cutlass.Float32(0.0)
        cs = cutlass.Float32(1.0)
        if own:
            if cutlass.const_expr(self.epi.bias):
                bias = mBias[n_own].to(cutlass.Float32)
            if cutlass.const_expr(self.w_fmt is not None):
                cs = mWs[n_own]
        # x, the residual and the cache position may be written by the kernel ahead of this one.
        cute.arch.griddepcontrol_wait()
        res = cutlass.Float32(0.0)
        if own:
            if cutlass.const_expr(self.epi.residual):
                res = mRes[0, n_own].to(cutlass.Float32)

        self.stage_activation(mX, gs, bs, ln_bar, eps, xs, red, K, tid)
        if cutlass.const_expr(self.w_fmt is not None):
            # Each thread converts the chunks it wrote itself: no barrier in between.
            vx = cute.make_rmem_tensor((8,), mX.element_type)
            vh = cute.make_rmem_tensor((8,), cutlass.Float16)
            for c in cutlass.range(tid, K // 8, self.num_threads):
                cute.autovec_copy(xs[c, None], vx)
                for i in cutlass.range_constexpr(8):
                    vh[i] = vx[i].to(cutlass.Float16)
                cute.autovec_copy(vh, xh[c, None])
        cute.arch.sync_threads()

        # The product on the tensor cores: x broadcast into all 16 rows of the A operand, 8
        # weight rows per B operand (ldmatrix from the padded rows), warps split K; every row
        # of C is the same dot product, row 0 is kept. A CUDA-core loop (convert, FMA, warp
        # reduce per row) took ~26 instructions per 16 bytes of weights, on the critical path
        # after the wait; so did staging x through shared memory (three CTA barriers): each
        # warp reads its A operands straight from x (L1 after the first touch) instead.
        thr_mma = tiled_mma.get_slice(lane)
        for r in cutlass.range(nrows):
            cute.arch.mbarrier_wait(bars + r, 0)
        if cutlass.const_expr(self.w_fmt is not None):
            self.product_8bit(ring, xh, partial, K, warp, lane, thr_mma, tiled_mma)
        else:
            self.product_16bit(ring, xs, partial, K, warp, lane, thr_mma, tiled_mma, mX.element_type)
        cute.arch.sync_threads()
        total = cutlass.Float32(0.0)
        if own:
            for w in cutlass.range_constexpr(cfg.warps):
                total = total + partial[w, tid]
        # One thread per output column: the epilogue's loads were issued long ago.
        if own:
            self.epilogue(total, bias, cs, res, n_own, N, mO, mKc, mVc, mPos, alpha, beta)

    @cute.jit
    def product_16bit(self, ring, xs, partial, K, warp, lane, thr_mma, tiled_mma, x_dt):
        """partial[warp, r] <- this warp's share of K of weight row r dot x (16-bit weights)."""
        dt = ring.element_type
        cfg = self.cfg
        R = cfg.rows
        ldsm = cute.make_copy_atom(warp_ops.LdMatrix8x8x16bOp(transpose=False, num_matrices=2), dt)
        copy_b = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(lane)
        tCsB = copy_b.partition_S(ring)  # (copy, n tiles, k blocks)
        tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(cute.local_tile(ring, (R, 16), (0, 0))))
        tCrB_v = copy_b.retile(tCrB)
        tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(cute.local_tile(ring, (16, 16), (0, 0))))
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((16, R)), cutlass.Float32)
        acc.fill(0.0)
        # SM80 A fragment (m16 x k16, 8 values): value bit 0 is k + 1, bit 1 is m + 8, bit 2
        # is k + 8, from k = 2 * (lane % 4). The rows are all x, so m does not matter.
        xs_pairs = cute.make_tensor(xs.iterator, cute.make_layout((cfg.k_max // 2, 2), stride=(2, 1)))
        xp = cute.make_rmem_tensor((2, 2), x_dt)
        for j in cutlass.range(warp, K // 16, cfg.warps, unroll=2):
            for h in cutlass.range_constexpr(2):
                cute.autovec_copy(xs_pairs[j * 8 + lane % 4 + 4 * h, None], xp[None, h])
            for v in cutlass.range_constexpr(8):
                tCrA[v] = xp[v % 2, v // 4]
            cute.copy(copy_b, tCsB[None, None, j], tCrB_v[None, None, 0])
            cute.gemm(tiled_mma, acc, tCrA, tCrB, acc)
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((16, R)))
        for v in cutlass.range_constexpr(cute.size(acc)):
            if tCcC[v][0] == 0:
                partial[warp, tCcC[v][1]] = acc[v]

    @cute.jit
    def product_8bit(self, ring, xs, partial, K, warp, lane, thr_mma, tiled_mma):
        """The 8-bit form: lane (n, kq) reads 4 weights (one 32-bit word) of row n per k-step
        and converts them to two f16x2 B registers; the MMA's k slots (2kq, 2kq+1, 2kq+8,
        2kq+9) then hold weights k0 + 4kq .. + 3, so A carries x at those same positions.
        One n8 accumulator per 8 rows."""
        cfg = self.cfg
        R = cfg.rows
        NG = R // 8
        n_l = lane // 4
        kq = lane % 4
        dummy_a = cute.make_tensor(xs.iterator, cute.make_layout((16, 16), stride=(16, 1)))
        dummy_b = cute.make_tensor(xs.iterator, cute.make_layout((8, 16), stride=(16, 1)))
        tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(dummy_a))
        tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(dummy_b))
        tA = cute.recast_tensor(tCrA, cutlass.Int32)
        tB = cute.recast_tensor(tCrB, cutlass.Int32)
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((16, 8)))
        accs = [cute.make_rmem_tensor(thr_mma.partition_shape_C((16, 8)), cutlass.Float32) for _ in range(NG)]
        for a_ in accs:
            a_.fill(0.0)
        ring32 = cute.make_tensor(cute.recast_ptr(ring.iterator, dtype=cutlass.Int32),
                                  cute.make_layout((R, cfg.row_stride // 4), stride=(cfg.row_stride // 4, 1)))
        xs32 = cute.make_tensor(cute.recast_ptr(xs.iterator, dtype=cutlass.Int32), cute.make_layout(cfg.k_max // 2))
        for j in cutlass.range(warp, K // 16, cfg.warps, unroll=2):
            xw = j * 8 + 2 * kq
            tA[0] = xs32[xw]
            tA[1] = xs32[xw]
            tA[2] = xs32[xw + 1]
            tA[3] = xs32[xw + 1]
            for g in cutlass.range_constexpr(NG):
                w = ring32[8 * g + n_l, j * 4 + kq]
                tB[0] = cvt_8bit_pair_f16x2(w, False, self.w_fmt)
                tB[1] = cvt_8bit_pair_f16x2(w, True, self.w_fmt)
                cute.gemm(tiled_mma, accs[g], tCrA, tCrB, accs[g])
        for g in cutlass.range_constexpr(NG):
            for v in cutlass.range_constexpr(cute.size(accs[g])):
                if tCcC[v][0] == 0:
                    partial[warp, 8 * g + tCcC[v][1]] = accs[g][v]

    @cute.jit
    def stage_activation(self, mX, gs, bs, ln_bar, eps, xs, red, K, tid):
        """xs <- x, or LayerNorm(x) rounded to x's dtype as the unfused LayerNorm stores it.
        Every thread loads some 16-byte chunks (one round trip for the row), CTA-wide sums,
        two passes (GPT-2's residual stream has large means, which a one-pass sum of squares
        would cancel away). Same-run A/B: each warp staging only the chunks its own k-steps
        read, with the statistics per warp (no CTA barrier), made the chain 10% slower."""
        T = self.num_threads
        kc = K // 8
        v = cute.make_rmem_tensor((8,), mX.element_type)
        part = cutlass.Float32(0.0)
        for c in cutlass.range(tid, kc, T):
            cute.autovec_copy(cute.local_tile(mX[0, None], (8,), (c,)), v)
            cute.autovec_copy(v, xs[c, None])
            if cutlass.const_expr(self.ln):
                for i in cutlass.range_constexpr(8):
                    part = part + v[i].to(cutlass.Float32)
        if cutlass.const_expr(self.ln):
            mean = self.block_sum(part, red, 0, tid) / cutlass.Float32(K)
            part = cutlass.Float32(0.0)
            for c in cutlass.range(tid, kc, T):
                cute.autovec_copy(xs[c, None], v)
                for i in cutlass.range_constexpr(8):
                    d = v[i].to(cutlass.Float32) - mean
                    part = part + d * d
            rstd = cute.math.rsqrt(self.block_sum(part, red, self.cfg.warps, tid) / cutlass.Float32(K) + eps)
            cute.arch.mbarrier_wait(ln_bar, 0)  # gamma and beta, copied before the PDL wait
            for c in cutlass.range(tid, kc, T):
                cute.autovec_copy(xs[c, None], v)
                for i in cutlass.range_constexpr(8):
                    y = (v[i].to(cutlass.Float32) - mean) * rstd * gs[c * 8 + i].to(cutlass.Float32) \
                        + bs[c * 8 + i].to(cutlass.Float32)
                    v[i] = y.to(mX.element_type)
                cute.autovec_copy(v, xs[c, None])

    @cute.jit
    def block_sum(self, x, red, slot0: cutlass.Constexpr, tid):
        x = self.warp_sum(x)
        if tid % 32 == 0:
            red[slot0 + tid // 32] = x
        cute.arch.sync_threads()
        total = cutlass.Float32(0.0)
        for w in cutlass.range_constexpr(self.cfg.warps):
            total = total + red[slot0 + w]
        return total

    @cute.jit
    def warp_sum(self, x):
        for j in cutlass.range_constexpr(5):
            x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << j)
        return x

    @cute.jit
    def epilogue(self, s, bias, cs, res, n, N, mO, mKc, mVc, mPos, alpha, beta):
        """Output column n of the product, in GemmSm90._epilogue_value's order."""
        epi = self.epi
        x = s
        if cutlass.const_expr(epi.alpha):
            x = x * alpha
        if cutlass.const_expr(self.w_fmt is not None):
            x = x * cs
        if cutlass.const_expr(epi.bias):
            x = x + bias
        x = epilogue_activation(x, epi.activation)
        if cutlass.const_expr(epi.residual):
            r = res
            if cutlass.const_expr(epi.beta):
                r = r * beta
            x = x + r
        mO[0, n] = x.to(mO.element_type)
        if cutlass.const_expr(self.kv):
            # c_attn's fused KV append: columns [C, 2C) are the new key, [2C, 3C) the new
            # value, head-major; this row goes to cache row pos of sequence 0.
            C = N // 3
            D = mKc.shape[3]
            part = n // C
            within = n - part * C
            h = within // D
            d = within - h * D
            pos = mPos[0].to(cutlass.Int32)
            if part == 1:
                mKc[0, h, pos, d] = x.to(mKc.element_type)
            if part == 2:
                mVc[0, h, pos, d] = x.to(mVc.element_type)
