"""GPT-2 decode GEMV chain as one persistent CuTe DSL kernel: experimental groundwork.

Status (H100, 2026-11-22, GPT-2 XL shapes, 48 layers x 4 GEMVs, batch 1, no attention):
correct (the same bf16 result as the separate kernels to within rounding; tests/
test_megakernel.py), 1.34-1.41 ms per chain (CUDA graph) against 1.32-1.35 ms for the
separate one-row GEMV kernels in the same runs, so nothing uses it yet. It is the base for a whole-step decode megakernel in
the DSL (inference/megakernel.py is the Triton attempt); NOTES.md has the measurements.

Layout of the kernel (one CTA per SM, `grid` CTAs, all resident):

  warp W (producer)   streams every weight chunk of every phase, in order, into a ring of
                      `slots` shared-memory slots with one cp.async.bulk per chunk; it
                      never waits for activations, only for free slots (`empty` barriers).
  warps 0..W-1        per phase: wait on a grid-wide counter (every CTA finished the
  (consumers)         previous phase), stage the phase's input row in shared memory
                      (LayerNorm fused for c_attn and c_fc), then reduce each chunk on the
                      tensor cores, every warp taking 1/W of K, arriving on the chunk's
                      `empty` barrier when done; one thread per output row then sums the
                      warps' partials and runs the epilogue (bias, gelu_tanh, residual).

Pipelines: `full[s]` (1 arrival + the chunk's transaction bytes, completed by the bulk
copy) and `empty[s]` (W arrivals, one per consumer warp). The grid barrier is one int32
counter: each CTA adds 1 (red.release.gpu) after a phase; a phase waits until it reaches
phase_index x grid (ld.acquire.gpu by one thread, then a named barrier).

A chunk is 8 "virtual rows" of E elements, contiguous in the weight: 8 output rows when
K = E, two output rows split in four when K = 4E (mlp c_proj). The MMA (m16n8k16) puts x in
A and the chunk's rows in B; lane group n reads its row rotated by 8n elements, so the 8 rows
of one k-step fall in 8 different bank groups without padding (rows are 3200 bytes apart),
and A row n carries x at the same rotated positions (x's segment n % Q for K = QE). C[n][n]
is virtual row n's dot product. Chunks are dealt round-robin over the CTAs in one global
order, so at any moment the CTAs read neighbouring addresses: with each CTA owning a
contiguous slice instead, the bare stream reached only 2.1-2.5 TB/s; in this order it reaches
3.0-3.1 TB/s (0.95-0.98 ms for the 2.95 GB), with 2 slots as well as 8.

What keeps it at 1.34 ms (timeline from %globaltimer, see NOTES.md): every phase pays
~2.5-3 us between the last CTA finishing the previous phase and the others seeing the
counter (L2 round trips behind the weight stream), ~0.4-0.9 us of staging, and the spread
of one chunk between the CTAs with the most and the fewest chunks; four phases per layer
add ~8 us to the ~20 us the layer's weights need. Neither a deeper ring, nor another grid
size (66, 100, 132), nor per-CTA flag words, nor NCCL-style tagged activation words, nor
merging mlp c_proj into c_fc's phase by split-K with fp32 atomics moved it below 1.34 ms.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.nvgpu import warp as warp_ops

from cute_kernels.gemm.gemv_kernel import bulk_copy_g2s
from cute_kernels.gemm.kernel import epilogue_activation


@dataclass(frozen=True)
class ChainConfig:
    """E: model width; slots: ring depth (8 virtual rows x E elements each); warps:
    consumer warps; grid: CTAs (at most the SM count: all must be resident)."""

    E: int = 1600
    slots: int = 4
    warps: int = 8
    grid: int = 132


# (output width in units of E, Q = K / E, LayerNorm (1: ln_1, 2: ln_2), activation, residual)
PHASES = ((3, 1, 1, "none", False), (1, 1, 0, "none", True), (4, 1, 2, "gelu_tanh", False), (1, 4, 0, "none", True))


class DecodeChainSm90:
    """48 x (ln_1 + c_attn, attn c_proj + residual, ln_2 + c_fc + gelu, mlp c_proj + residual),
    with c_attn's first E outputs standing in for the attention output (module docstring)."""

    def __init__(self, cfg: ChainConfig):
        assert cfg.E % 32 == 0 and cfg.E // 8 <= 32 * cfg.warps
        self.cfg = cfg
        self.num_threads = (cfg.warps + 1) * 32
        self.cw = cfg.warps * 32  # consumer threads
        self.max_chunks = max((self.n_chunks(i) + cfg.grid - 1) // cfg.grid for i in range(4))
        assert self.max_chunks * 8 <= self.cw  # one epilogue thread per output row

    def n_chunks(self, m: int) -> int:
        n_mult, Q = PHASES[m][0], PHASES[m][1]
        return n_mult * self.cfg.E * Q // 8

    @cute.jit
    def my_chunks(self, l, m: cutlass.Constexpr, bid):
        """(first chunk index, count) of phase (l, m) for this CTA: chunks are dealt
        round-robin in one global order over all phases."""
        G = self.cfg.grid
        per_layer = sum(self.n_chunks(i) for i in range(4))
        prefix = sum(self.n_chunks(i) for i in range(m))
        U = l * per_layer + prefix
        j0 = (bid - U % G + G) % G
        return j0, cutlass.max((self.n_chunks(m) - j0 + G - 1) // G, 0)

    @cute.jit
    def __call__(self, Wa, Wo, Wf, Wp, ba, bo, bf, bp, g1, b1, g2, b2, h_in, h_out, h, qkv, f, counter,
                 eps: cutlass.Float32, stream):
        mma = cute.make_tiled_mma(warp_ops.MmaF16BF16Op(Wa.element_type, cutlass.Float32, (16, 8, 16)), (1, 1, 1))
        self.kernel(Wa, Wo, Wf, Wp, ba, bo, bf, bp, g1, b1, g2, b2, h_in, h_out, h, qkv, f, counter, eps, mma).launch(
            grid=(self.cfg.grid, 1, 1), block=(self.num_threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, Wa, Wo, Wf, Wp, ba, bo, bf, bp, g1, b1, g2, b2, h_in, h_out, h, qkv, f, counter, eps, mma):
        cfg = self.cfg
        E, S, W = cfg.E, cfg.slots, cfg.warps
        tid, _, _ = cute.arch.thread_idx()
        warp, lane = tid // 32, tid % 32
        bid = cute.arch.block_idx()[0]
        dt = Wa.element_type

        smem = cutlass.memory.SmemAllocator()
        full = smem.allocate_array(cutlass.Int64, S)
        empty = smem.allocate_array(cutlass.Int64, S)
        ring = smem.allocate_tensor(dt, cute.make_layout((S, 8, E), stride=(8 * E, E, 1)), byte_alignment=128)
        xs = smem.allocate_tensor(dt, cute.make_layout((4 * E // 8, 8), stride=(8, 1)), byte_alignment=16)
        # h as the last LayerNorm phase staged it: the residual of the next projection.
        hs = smem.allocate_tensor(dt, cute.make_layout((E // 8, 8), stride=(8, 1)), byte_alignment=16)
        scratch = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.max_chunks, W, 8), stride=(8 * W, 8, 1)),
                                       byte_alignment=16)
        red = smem.allocate_tensor(cutlass.Float32, cute.make_layout(2 * W), byte_alignment=16)

        if warp == W:
            if lane < S:
                cute.arch.mbarrier_init(full + lane, 1)
                cute.arch.mbarrier_init(empty + lane, W)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if warp == W:
            self.load(Wa, Wo, Wf, Wp, ring, full, empty, bid, lane)
        else:
            self.consume(ba, bo, bf, bp, g1, b1, g2, b2, h_in, h_out, h, qkv, f, counter, eps, mma, ring, full, empty,
                         xs, hs, scratch, red, bid, tid)

    @cute.jit
    def load(self, Wa, Wo, Wf, Wp, ring, full, empty, bid, lane):
        """Producer warp: every chunk of every phase into the ring, one bulk copy each."""
        E, S = self.cfg.E, self.cfg.slots
        mats = (Wa, Wo, Wf, Wp)
        g = cutlass.Int32(0)
        for l in cutlass.range(Wa.shape[0]):
            for m in cutlass.range_constexpr(4):
                N = PHASES[m][0] * E
                RC = 8 // PHASES[m][1]
                j0, nch = self.my_chunks(l, m, bid)
                for c in cutlass.range(nch):
                    row0 = (j0 + c * self.cfg.grid) * RC
                    s = g % S
                    cute.arch.mbarrier_wait(empty + s, ((g // S) & 1) ^ 1)
                    if lane == 0:
                        nbytes = cutlass.min(RC, N - row0) * PHASES[m][1] * E * 2
                        cute.arch.mbarrier_arrive_and_expect_tx(full + s, nbytes)
                        src = cute.local_tile(mats[m][l, row0, None], (E,), (0,))
                        bulk_copy_g2s(ring[s, 0, None].iterator, src.iterator, nbytes, full + s)
                    g += 1

    @cute.jit
    def consume(self, ba, bo, bf, bp, g1, b1, g2, b2, h_in, h_out, h, qkv, f, counter, eps, mma, ring, full, empty,
                xs, hs, scratch, red, bid, tid):
        cfg = self.cfg
        E, S, W, G = cfg.E, cfg.slots, cfg.warps, cfg.grid
        warp = tid // 32
        lane = tid % 32
        dt = ba.element_type
        thr = mma.get_slice(lane)
        slot0 = ring[0, None, None]
        tCrB = thr.make_fragment_B(thr.partition_B(cute.local_tile(slot0, (8, 16), (0, 0))))
        tCrA = thr.make_fragment_A(thr.partition_A(cute.local_tile(slot0, (16, 16), (0, 0))))
        tCcC = thr.partition_C(cute.make_identity_tensor((16, 8)))
        xs32 = cute.make_tensor(cute.recast_ptr(xs.iterator, dtype=cutlass.Int32), cute.make_layout(2 * E))
        ring32 = cute.make_tensor(cute.recast_ptr(ring.iterator, dtype=cutlass.Int32),
                                  cute.make_layout((S, 4 * E), stride=(4 * E, 1)))
        biases = (ba, bo, bf, bp)
        outs = (qkv, h, f, h)
        g = cutlass.Int32(0)
        for l in cutlass.range(ba.shape[0]):
            for m in cutlass.range_constexpr(4):
                n_mult, Q, ln, act, resid = PHASES[m]
                N = n_mult * E
                RC = 8 // Q
                j0, nch = self.my_chunks(l, m, bid)
                # Constants before the wait: thread t's output row (chunk t // RC) bias and
                # its 8 LayerNorm weights.
                e_c = tid // RC
                e_r = tid % RC
                e_n = (j0 + e_c * G) * RC + e_r
                e_own = e_c < nch and e_n < N
                bias = cutlass.Float32(0.0)
                if e_own:
                    bias = biases[m][l, e_n].to(cutlass.Float32)
                gv = cute.make_rmem_tensor((8,), dt)
                bv = cute.make_rmem_tensor((8,), dt)
                if cutlass.const_expr(ln > 0):
                    if tid < E // 8:
                        cute.autovec_copy(cute.local_tile((g1 if ln == 1 else g2)[l, None], (8,), (tid,)), gv)
                        cute.autovec_copy(cute.local_tile((b1 if ln == 1 else b2)[l, None], (8,), (tid,)), bv)
                if tid == 0:
                    while cute.arch.load(counter.iterator, cutlass.Int32, sem="acquire", scope="gpu") < (l * 4 + m) * G:
                        pass
                cute.arch.barrier(barrier_id=1, number_of_threads=self.cw)
                if cutlass.const_expr(ln > 0):
                    if cutlass.const_expr(m == 0):
                        if l == 0:
                            self.stage_ln(h_in, gv, bv, xs, hs, red, eps, tid)
                        else:
                            self.stage_ln(h, gv, bv, xs, hs, red, eps, tid)
                    else:
                        self.stage_ln(h, gv, bv, xs, hs, red, eps, tid)
                else:
                    self.stage(qkv if m == 1 else f, xs, Q * E, tid)
                cute.arch.barrier(barrier_id=1, number_of_threads=self.cw)
                for c in cutlass.range(nch):
                    gg = g + c
                    s = gg % S
                    cute.arch.mbarrier_wait(full + s, (gg // S) & 1)
                    self.chunk_dot(ring32, xs32, s, Q, tCrA, tCrB, tCcC, thr, mma, scratch, c, warp, lane)
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(empty + s)
                g += nch
                cute.arch.barrier(barrier_id=1, number_of_threads=self.cw)
                if e_own:
                    tot = cutlass.Float32(0.0)
                    for w in cutlass.range_constexpr(W):
                        for q in cutlass.range_constexpr(Q):
                            tot = tot + scratch[e_c, w, e_r * Q + q]
                    x = epilogue_activation(tot + bias, act)
                    if cutlass.const_expr(resid):
                        x = x + hs[e_n // 8, e_n % 8].to(cutlass.Float32)
                    outs[m][0, e_n] = x.to(dt)
                    if cutlass.const_expr(m == 3):
                        h_out[0, e_n] = x.to(dt)
                # Every output of this CTA is written (barrier); one release add publishes
                # them (cumulativity through the barrier; a fence before it only cost time).
                cute.arch.barrier(barrier_id=1, number_of_threads=self.cw)
                if tid == 0:
                    cute.arch.red(counter.iterator, cutlass.Int32(1), op="add", dtype="s32", sem="release", scope="gpu")

    @cute.jit
    def chunk_dot(self, ring32, xs32, s, Q: cutlass.Constexpr, tCrA, tCrB, tCcC, thr, mma, scratch, c, warp, lane):
        """scratch[c, warp, n] <- this warp's share of K of virtual row n of slot s, dot x.
        Fully unrolled (13 k-steps per warp at E = 1600) over four accumulators, so later
        steps' shared-memory loads issue under earlier MMAs."""
        E, W = self.cfg.E, self.cfg.warps
        n_l = lane // 4
        kq = lane % 4
        seg = ((n_l % Q) * E) // 2
        tA = cute.recast_tensor(tCrA, cutlass.Int32)
        tB = cute.recast_tensor(tCrB, cutlass.Int32)
        accs = [cute.make_rmem_tensor(thr.partition_shape_C((16, 8)), cutlass.Float32) for _ in range(4)]
        for a in accs:
            a.fill(0.0)
        NK = E // 16
        for jj in cutlass.range_constexpr((NK + W - 1) // W):
            j = warp + jj * W
            live = j < NK
            j = cutlass.min(j, NK - 1)
            ka = j * 16 + 8 * n_l  # rotated by 8n elements (one 16-byte bank group per row)
            if ka >= E:
                ka -= E
            kb = ka + 8
            if kb >= E:
                kb -= E
            wa = ka // 2 + kq
            wb = kb // 2 + kq
            xa = xs32[seg + wa]
            xb = xs32[seg + wb]
            if not live:  # a clamped step past K: x = 0, no contribution
                xa = cutlass.Int32(0)
                xb = cutlass.Int32(0)
            tA[0] = xa
            tA[1] = xa
            tA[2] = xb
            tA[3] = xb
            tB[0] = ring32[s, n_l * (E // 2) + wa]
            tB[1] = ring32[s, n_l * (E // 2) + wb]
            cute.gemm(mma, accs[jj % 4], tCrA, tCrB, accs[jj % 4])
        for v in cutlass.range_constexpr(cute.size(accs[0])):
            if tCcC[v][0] == tCcC[v][1]:
                scratch[c, warp, tCcC[v][1]] = (accs[0][v] + accs[1][v]) + (accs[2][v] + accs[3][v])

    @cute.jit
    def load_cg(self, src, c, v):
        """v <- src[0, 8c : 8c + 8] through L2 (ld.global.cg): other SMs wrote it, so it must
        not come from this SM's L1."""
        vi = cute.recast_tensor(v, cutlass.Int32)
        p = cute.make_ptr(cutlass.Int32, (src.iterator + c * 8).toint(), cute.AddressSpace.gmem, assumed_align=16)
        for i in cutlass.range_constexpr(4):
            vi[i] = cute.arch.load(p + i, cutlass.Int32, cop="cg")

    @cute.jit
    def stage(self, src, xs, K: cutlass.Constexpr, tid):
        """xs <- src[0, :K]. (Issuing all of a thread's loads before its stores, through a
        recast slice of a 2-D register tensor, read garbage: keep one vector at a time.)"""
        v = cute.make_rmem_tensor((8,), src.element_type)
        for c in cutlass.range(tid, K // 8, self.cw):
            self.load_cg(src, c, v)
            cute.autovec_copy(v, xs[c, None])

    @cute.jit
    def stage_ln(self, src, gv, bv, xs, hs, red, eps, tid):
        """xs <- LayerNorm(h) rounded to h's dtype (as the unfused LayerNorm stores it), hs <- h.
        One 8-element vector per thread, two-pass statistics over the consumer warps."""
        E = self.cfg.E
        v = cute.make_rmem_tensor((8,), src.element_type)
        part = cutlass.Float32(0.0)
        own = tid < E // 8
        if own:
            self.load_cg(src, tid, v)
            cute.autovec_copy(v, hs[tid, None])
            for i in cutlass.range_constexpr(8):
                part = part + v[i].to(cutlass.Float32)
        mean = self.block_sum(part, red, 0, tid) / cutlass.Float32(E)
        part = cutlass.Float32(0.0)
        if own:
            for i in cutlass.range_constexpr(8):
                d = v[i].to(cutlass.Float32) - mean
                part = part + d * d
        rstd = cute.math.rsqrt(self.block_sum(part, red, self.cfg.warps, tid) / cutlass.Float32(E) + eps)
        if own:
            for i in cutlass.range_constexpr(8):
                y = (v[i].to(cutlass.Float32) - mean) * rstd * gv[i].to(cutlass.Float32) + bv[i].to(cutlass.Float32)
                v[i] = y.to(src.element_type)
            cute.autovec_copy(v, xs[tid, None])

    @cute.jit
    def block_sum(self, x, red, slot0: cutlass.Constexpr, tid):
        for j in cutlass.range_constexpr(5):
            x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << j)
        if tid % 32 == 0:
            red[slot0 + tid // 32] = x
        cute.arch.barrier(barrier_id=1, number_of_threads=self.cw)
        total = cutlass.Float32(0.0)
        for w in cutlass.range_constexpr(self.cfg.warps):
            total = total + red[slot0 + w]
        return total


# --------------------------------------------------------------------------- host side


def compile_chain(cfg: ChainConfig, keep_dir: str | None = None):
    """Compile the chain kernel for bf16 (layer count dynamic) on sm_90a."""
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from cute_kernels.runtime import TARGET_ARCH

    E, bf16 = cfg.E, cutlass.BFloat16
    n_layers = cute.sym_int32()

    def mat(n, k):
        return make_fake_tensor(bf16, (n_layers, n, k), (n * k, k, 1), assumed_align=16)

    def per_layer(n):
        return make_fake_tensor(bf16, (n_layers, n), (n, 1), assumed_align=16)

    def row(n):
        return make_fake_tensor(bf16, (1, n), (n, 1), assumed_align=16)

    counter = make_fake_tensor(cutlass.Int32, (1,), (1,), assumed_align=4)
    opts = f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}" + (f" --keep-ptx --dump-dir {keep_dir}" if keep_dir else "")
    return cute.compile(DecodeChainSm90(cfg), mat(3 * E, E), mat(E, E), mat(4 * E, E), mat(E, 4 * E),
                        per_layer(3 * E), per_layer(E), per_layer(4 * E), per_layer(E), *(per_layer(E) for _ in range(4)),
                        row(E), row(E), row(E), row(3 * E), row(4 * E), counter, cutlass.Float32(1e-5),
                        make_fake_stream(use_tvm_ffi_env_stream=True), options=opts)


def decode_chain(weights: dict, h_in: torch.Tensor, eps: float = 1e-5, cfg: ChainConfig | None = None) -> torch.Tensor:
    """Run the chain on stacked weights (see `chain_reference` for the keys and semantics):
    Wa [L, 3E, E], Wo [L, E, E], Wf [L, 4E, E], Wp [L, E, 4E] (bf16, [out, in]), biases and
    LayerNorm weights [L, n]; h_in [1, E]. Returns h [1, E]."""
    from cute_kernels.runtime import KERNELS, CompileKey, num_sms

    w = weights
    E = h_in.shape[1]
    if h_in.dtype != torch.bfloat16 or not h_in.is_cuda or h_in.shape[0] != 1:
        raise ValueError(f"decode_chain wants one bf16 CUDA row [1, E], got {tuple(h_in.shape)} {h_in.dtype}")
    sms = num_sms(h_in.device.index or 0)
    cfg = cfg or ChainConfig(E=E, grid=sms)
    if cfg.grid > sms:
        raise ValueError(f"grid {cfg.grid} exceeds the {sms} SMs: the CTAs must all be resident")
    key = CompileKey("decode_chain_dsl", ("BFloat16",), (), (cfg.E, cfg.slots, cfg.warps), (cfg.grid,))
    fn = KERNELS.get(key, functools.partial(compile_chain, cfg))
    dev = h_in.device
    h_out = torch.empty_like(h_in)
    h = torch.empty_like(h_in)
    qkv = torch.empty(1, 3 * E, device=dev, dtype=h_in.dtype)
    f = torch.empty(1, 4 * E, device=dev, dtype=h_in.dtype)
    counter = torch.zeros(1, device=dev, dtype=torch.int32)
    fn(w["Wa"], w["Wo"], w["Wf"], w["Wp"], w["ba"], w["bo"], w["bf"], w["bp"], w["g1"], w["b1"], w["g2"], w["b2"],
       h_in, h_out, h, qkv, f, counter, float(eps))
    return h_out


def chain_reference(weights: dict, h_in: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """The same chain on the separate kernels (one-row GEMVs with the same fusions)."""
    from cute_kernels.gemm.gemv import skinny_gemm

    w = weights
    E = h_in.shape[1]
    x = h_in
    for i in range(w["Wa"].shape[0]):
        q = skinny_gemm(x, w["Wa"][i], w["ba"][i], ln=(w["g1"][i], w["b1"][i], eps))
        x = skinny_gemm(q[:, :E], w["Wo"][i], w["bo"][i], residual=x)
        ff = skinny_gemm(x, w["Wf"][i], w["bf"][i], "gelu_tanh", ln=(w["g2"][i], w["b2"][i], eps))
        x = skinny_gemm(ff, w["Wp"][i], w["bp"][i], residual=x)
    return x
