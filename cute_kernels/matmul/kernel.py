"""Persistent, warp-specialized Hopper GEMM with a fused epilogue (CuTe DSL, sm_90a).

    D[m, n] = act(alpha * row_scale[m] * col_scale[n] * sum_k A[m, k] B[n, k] + bias[n])
              + beta * residual[m, n]

A is (M, K), B is (N, K) and D is (M, N) row-major. A and B may be K-major or
M/N-major for 16-bit inputs; 8-bit inputs (fp8, int8) must be K-major, which is
the only layout the 8-bit wgmma accepts. Every epilogue operand is optional and
its absence is compiled in, so a plain GEMM carries no epilogue cost.

The SwiGLU epilogue (Llama-family MLPs) instead takes B = [gate; up] (2N, K) and writes
D[m, n] = silu(sum_k A[m, k] gate[n, k]) * sum_k A[m, k] up[n, k], (M, N).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from .config import (
    BLOCK_SCALE_STAGES,
    EPI_STAGES,
    RES_SLOTS,
    RES_TMA_MIN_STAGES,
    SM90_SMEM_BYTES,
    VEC_STAGES,
    Epilogue,  # noqa: F401  (public here: the kernel's compile-time epilogue)
    GemmConfig,
    block_scale_smem_bytes,
    epi_buffers,
    epi_group,
    epi_tile,
    epi_vector_slots,
    residual_smem_bytes,
    swap_supported,
    whole_tile_epilogue,
)

_SQRT_2_OVER_PI = 0.7978845608028654
_INV_SQRT_2 = 0.7071067811865476
_LOG2_E = 1.4426950408889634


@cute.jit
def epilogue_activation(x, act: cutlass.Constexpr):
    """The epilogue activation on an fp32 value (none | relu | gelu | gelu_tanh)."""
    if cutlass.const_expr(act == "relu"):
        x = cutlass.max(x, cutlass.Float32(0.0))
    if cutlass.const_expr(act == "gelu"):
        x = 0.5 * x * (1.0 + cute.math.erf(x * _INV_SQRT_2))
    if cutlass.const_expr(act == "gelu_tanh"):
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        x = 0.5 * x * (1.0 + cute.math.tanh(inner, fastmath=True))
    return x


class GemmSm90:
    """Hopper GEMM: TMA -> 128B-swizzled smem ring -> wgmma -> fused epilogue -> TMA store.

    Warp roles (one CTA = 128 x (1 + num_mma_warpgroups) threads):
      * warpgroup 0 (producer, 40 registers/thread after setmaxnreg): warp 0 walks the
        persistent tile schedule and issues the TMA loads of A and B k-tiles into the
        smem ring, multicasting across the cluster the operand that its peers share.
        Warp 1 (16-bit outputs with vector operands) is the vector loader: it copies
        each tile's row scales, column scales and bias into a smem stage ahead of the
        epilogue (`load_vectors`). The other warps only donate their registers.
      * warpgroups 1..n (consumers, 232 registers/thread). Cooperative: each owns a
        64- or 128-row slice of every CTA tile. Ping-pong: each owns alternate whole
        tiles (up to 128 x 192: 192 fp32 accumulators per thread), and named barriers
        2/3 hand the tensor cores over so one warpgroup's epilogue runs under the
        other's main loop. Per tile: `mma()` (wgmma main loop;
        FP8 "promote" adds each k-tile's partial sums into an fp32 accumulator), then
        `epilogue()`: accumulators -> epilogue math in fp32 (SwiGLU: silu(gate) * up from
        two accumulator slabs into one) -> output dtype -> stmatrix
        into a staged smem slab -> one warp issues the TMA store (the same store warp
        TMA-loads the tile's residual slabs ahead, when `res_tma`). Under swap_ab the
        launch hands the kernel D^T (the caller's D seen M-major): stmatrix transposes
        into M-major slabs and the TMA store writes them, nothing else changes. 32-bit outputs
        (int32, fp32) use `epilogue_32bit()`: each warp writes its own 16 x 32 boxes
        into two private swizzled smem buffers and its lane 0 TMA-stores them, with no
        barrier between warps (M-major boxes under swap_ab).

    Pipelines:
      * ab_pipeline (PipelineTmaAsync, `ab_stages` deep): full barriers complete on
        the TMA transaction bytes; empty barriers collect one arrive per consumer
        warp of every CTA that reads the stage (multicast peers included), so a
        stage is only refilled when all its readers in the cluster are done.
      * vec_pipeline (PipelineAsync, VEC_STAGES tiles deep): the vector-loader warp's
        32 threads arrive on full after their smem stores; every thread that runs the
        tile's epilogue arrives on empty when it is done reading.
      * store pipeline (PipelineTmaStore, EPI_STAGES deep): bulk-group commit/wait
        that keeps at most EPI_STAGES - 1 TMA stores in flight before an epilogue
        buffer is reused. The 32-bit epilogue keeps the same discipline per warp
        (lane 0's bulk groups). With the whole-tile epilogue (`config.whole_tile_epilogue`)
        every slab of the tile has its own buffer: one barrier, then all of the tile's
        stores in one bulk group, whose reads the next tile's epilogue waits for.
      * residual slots (`res_tma`: RES_SLOTS smem slabs per epilogue warpgroup, one
        mbarrier each, completed by the TMA transaction bytes): the store warp loads
        the tile's first slabs before the main loop and refills a slot right after
        the epilogue barrier that follows every thread's read of it; each wait's
        phase follows from how often the slot is filled per tile.

    Launch: a programmatic dependent (PDL). Setup (descriptor prefetch, barrier init, the
    cluster handshake) runs before `griddepcontrol.wait`, under the tail of the kernel ahead;
    no global memory is touched before it. The producer warp lets the next kernel launch once
    it has issued its last load.

    Tile schedule: static persistent. Cluster c processes work items c, c + G, ...
    (G = clusters launched); a work item maps to a cluster tile through a grouped
    raster (bands of `group` clusters along M, or N) so tiles in flight share
    A and B panels in L2. Producer and consumers compute the same sequence, so
    no scheduling state is exchanged.

    Split-K (cfg.split_k > 1, entry point `call_split`, compiled once for any split
    count S, a runtime argument): the cluster tiles of the grid's whole waves run
    unsplit, and each tile of the last, partial wave (every tile of a grid that fits one
    wave) is dealt out as S work items, so the splits fill the SMs that wave would leave
    idle (wave quantisation: 1355x3584x3584 in 128 x 256 tiles is 84 clusters of 2, one
    wave and 18 clusters). Split l of a tile sums k-tiles [l * kt // S, (l + 1) * kt // S)
    (config.splitk_k_tiles). After its main loop a split either finds the other S - 1 partials published
    (it is the finisher) or publishes its own raw accumulators to a global workspace
    in register order (element v of thread e at v * threads + e: coalesced) and
    counts in on the tile's counter, becoming the finisher if it is the last. The
    finisher sums the partials in split order (fp32: the same bits whichever split
    finishes), resets the counter and runs the normal fused epilogue; the others skip
    it (`split_fixup`). One launch, no waits.
    """

    def __init__(self, cfg: GemmConfig, acc_dtype, epilogue: Epilogue, b_kn: bool = False, pdl: bool = True):
        cfg.validate(integer=acc_dtype is cutlass.Int32)
        if (epilogue.row_scale == "block") != (epilogue.col_scale == "block"):
            raise ValueError("block scales come in pairs: row_scale and col_scale must both be 'block'")
        if epilogue.block_scaled and not (cfg.promote and cfg.tile_n in (64, 128) and not cfg.pingpong
                                          and cfg.tile_m in (64, 128)):
            # One 128-wide column block per tile and one 64-row M-step per warpgroup, so
            # every thread needs exactly three scales per k-tile (two rows, one column block).
            raise ValueError(f"block scales need a promoted cooperative 64/128 x 64/128 tile, got {cfg}")
        # SwiGLU: B is [gate; up] ([2N, K], K-major) and D = silu(A gate^T) * (A up^T) is [M, N].
        # Each CTA tile multiplies tile_n / 2 gate rows and the matching up rows (one B view,
        # `_gate_up_view`), so its accumulator holds both halves of every output column it writes.
        self.swiglu = epilogue.activation == "swiglu"
        if self.swiglu and (cfg.split_k > 1 or b_kn or cfg.tile_n not in (64, 128, 192, 256)
                            or epilogue != Epilogue(activation="swiglu")):
            raise ValueError("the swiglu epilogue takes no other epilogue operand, no split-K, a [2N, K] B "
                             f"and tile_n in (64, 128, 192, 256), got {cfg} {epilogue}")
        if cfg.tile_m == 192 and (epilogue.residual or self.swiglu or epilogue.block_scaled):
            raise ValueError(f"a 192-row tile takes no residual, SwiGLU or block scales, got {epilogue}")
        if cfg.swap_ab:
            why = swap_supported(epilogue, 2)
            if why or b_kn:
                raise ValueError(why or "swap_ab takes B as [N, K] (no b_kn)")
        self.cfg = cfg
        # Programmatic dependent launch (`kernel`, `load`); False only for side-by-side probes.
        self.pdl = pdl
        # b_kn: B arrives as torch.mm's b [K, N] rather than as its [N, K] transpose. The
        # transpose is then a layout permutation at trace time instead of a torch view
        # built on the host every call (~2 us of CPU, as much as a quarter of the call).
        self.b_kn = b_kn
        # Only whether to split is compiled in; the split count is a runtime argument.
        self.split = cfg.split_k > 1
        self.acc_dtype = acc_dtype
        self.epi = epilogue
        self.tile_mn = cfg.tile_mn
        self.cluster_mn = cfg.cluster_mn
        self.num_mma_wg = cfg.num_mma_warpgroups
        # Cooperative: the warpgroups split the tile's rows. Ping-pong: each warpgroup
        # computes a whole tile on its own.
        self.atom_layout_mnk = (1, 1, 1) if cfg.pingpong else (self.num_mma_wg, 1, 1)
        self.threads_per_wg = 128
        self.num_threads = 128 * (1 + self.num_mma_wg)
        self.num_mma_threads = 128 * self.num_mma_wg
        # setmaxnreg budgets (64K registers a CTA): 40 + 2 x 232 x 128, 40 + 3 x 152 x 128.
        self.load_regs, self.mma_regs = (40, 152) if self.num_mma_wg == 3 else (40, 232)
        self.epi_store_warp = 4  # first warp of the first consumer warpgroup
        # Named barriers: 0 is __syncthreads, 2/3 hand the tensor cores between ping-pong
        # warpgroups, 4/5 are the epilogue barriers (one per warpgroup in ping-pong).

    # ------------------------------------------------------------------ host side
    def _setup(self, a_dtype, b_dtype, c_dtype, a_layout, b_layout, c_layout):
        self.a_dtype, self.b_dtype, self.c_dtype = a_dtype, b_dtype, c_dtype
        self.a_layout, self.b_layout, self.c_layout = a_layout, b_layout, c_layout
        in_bytes = a_dtype.width // 8
        self.tile_k = self.cfg.tile_k(in_bytes)
        self.tile_mnk = (*self.tile_mn, self.tile_k)
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            a_dtype,
            b_dtype,
            a_layout.sm90_mma_major_mode(),
            b_layout.sm90_mma_major_mode(),
            self.acc_dtype,
            self.atom_layout_mnk,
            tiler_mn=(64, self.tile_mn[1]),
        )
        out_bytes = c_dtype.width // 8
        # swap_ab's D^T is M-major (the launch passes D transposed); nothing else is.
        if c_layout.is_m_major_c() != self.cfg.swap_ab:
            raise ValueError(f"D must be {'M' if self.cfg.swap_ab else 'N'}-major for {self.cfg}")
        if self.swiglu and out_bytes != 2:
            raise ValueError("the swiglu epilogue writes a 16-bit output")
        # Columns of D one tile writes: half the B rows it multiplies under SwiGLU.
        self.out_n = self.tile_mn[1] // 2 if self.swiglu else self.tile_mn[1]
        self.epi_tile = epi_tile(self.cfg, out_bytes)
        scale_bytes = block_scale_smem_bytes(self.cfg) if self.epi.block_scaled else 0
        self.ab_stages = self.cfg.ab_stages(in_bytes, out_bytes, scale_bytes)
        if self.epi.block_scaled and self.ab_stages > BLOCK_SCALE_STAGES:
            if self.cfg.stages is not None:
                raise ValueError(f"{self.cfg}: block-scaled FP8 stages its scales in at most {BLOCK_SCALE_STAGES} stages")
            self.ab_stages = BLOCK_SCALE_STAGES
        # A 16-bit residual is TMA-loaded slab by slab into RES_SLOTS smem buffers per
        # epilogue warpgroup and read there at the accumulator coordinates, where the tile
        # has the shared memory to spare (128 x 160, 64 x 64: no A/B stage lost) and does
        # not split K. Otherwise each thread loads its values from global memory as column
        # pairs (`_load_residual`), the first slab's held in registers across the main loop,
        # which a 128 x 192 ping-pong warpgroup (192 accumulators per thread) cannot afford
        # (ptxas spilled): it gives up an A/B stage for the slabs instead (5 -> 4).
        slab_bytes = residual_smem_bytes(self.cfg, out_bytes)
        stages_with_slabs = self.cfg.ab_stages(in_bytes, out_bytes, scale_bytes + slab_bytes)
        big_pingpong = self.cfg.pingpong and self.tile_mn[0] * self.tile_mn[1] > 128 * 160
        self.whole_epi = whole_tile_epilogue(self.cfg, out_bytes)
        self.res_tma = (self.epi.residual and out_bytes == 2 and not self.split and not self.whole_epi
                        and (big_pingpong or stages_with_slabs >= min(self.ab_stages, RES_TMA_MIN_STAGES)))
        if self.res_tma:
            self.ab_stages = stages_with_slabs
        self.a_smem_staged = sm90_utils.make_smem_layout_a(a_layout, self.tile_mnk, a_dtype, self.ab_stages)
        self.b_smem_staged = sm90_utils.make_smem_layout_b(b_layout, self.tile_mnk, b_dtype, self.ab_stages)
        # Slabs per bulk group of TMA stores (config.epi_group): one slab at a time where a
        # residual's slots or block scales take the shared memory, or under SwiGLU.
        self.epi_group = 1
        if not (self.epi.residual or self.epi.block_scaled or self.swiglu):
            self.epi_group = epi_group(self.cfg, out_bytes)
        self.c_smem_staged = sm90_utils.make_smem_layout_epi(
            c_dtype, c_layout, self.epi_tile, epi_buffers(self.cfg, out_bytes, self.epi_group))
        self.res_slots = RES_SLOTS * (2 if self.cfg.pingpong else 1)
        self.n_slabs = (self.tile_mn[0] // self.epi_tile[0]) * (self.tile_mn[1] // self.epi_tile[1])
        self.r_smem_staged = sm90_utils.make_smem_layout_epi(
            c_dtype, c_layout, self.epi_tile, self.res_slots if self.res_tma else 1)
        # 16-bit epilogues read per-row / per-column vectors from a per-tile smem copy
        # that the vector-loader warp fills ahead (`load_vectors`).
        # Not for the 128 x 256 cooperative tile with a residual: its 128 accumulators
        # per thread plus the residual slabs leave no registers for the smem reads
        # (ptxas spilled 56 bytes there); it reads the vectors from global memory.
        self.stage_vectors = out_bytes == 2 and (
            self.epi.row_scale == "vector" or self.epi.col_scale == "vector" or self.epi.bias) and not (
            self.epi.residual and self.tile_mn[1] >= 256 and not self.cfg.pingpong)
        self.vec_slots = epi_vector_slots(self.cfg) if self.stage_vectors else 4  # unused placeholder

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # (M, K)
        mB: cute.Tensor,  # (N, K), or (K, N) when b_kn
        mD: cute.Tensor,  # (M, N), row-major
        mBias: cute.Tensor | None,  # (N,)
        mResidual: cute.Tensor | None,  # (M, N)
        mRowScale: cute.Tensor | None,  # (M,) or (1,)
        mColScale: cute.Tensor | None,  # (N,) or (1,)
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        max_active_clusters: cutlass.Constexpr,
        stream,
    ):
        assert not self.split, "a split-K config launches through call_split"
        self._launch(mA, mB, mD, mBias, mResidual, mRowScale, mColScale, alpha, beta,
                     None, None, cutlass.Int32(1), max_active_clusters, stream)

    @cute.jit
    def call_split(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mD: cute.Tensor,
        mBias: cute.Tensor | None,
        mResidual: cute.Tensor | None,
        mRowScale: cute.Tensor | None,
        mColScale: cute.Tensor | None,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        mWs: cute.Tensor,  # (>= S * split tiles * tile_m * tile_n,) accumulator dtype: the partials
        mSem: cute.Tensor,  # (>= split tiles,) int32 per-tile counters, zero between launches
        splits: cutlass.Int32,  # S >= 1, at most the number of k-tiles
        max_active_clusters: cutlass.Constexpr,
        stream,
    ):
        """Split-K launch: the same operands as `__call__` plus the workspace and S."""
        assert self.split, "call_split needs a config with split_k > 1"
        self._launch(mA, mB, mD, mBias, mResidual, mRowScale, mColScale, alpha, beta,
                     mWs, mSem, splits, max_active_clusters, stream)

    @cute.jit
    def _launch(self, mA, mB, mD, mBias, mResidual, mRowScale, mColScale, alpha, beta, mWs, mSem, splits,
                max_active_clusters: cutlass.Constexpr, stream):
        if cutlass.const_expr(self.b_kn):
            mB = cute.make_tensor(mB.iterator, cute.select(mB.layout, mode=[1, 0]))
        if cutlass.const_expr(self.swiglu):
            mB = self._gate_up_view(mB, mD.shape[1])
        # Append the batch mode CuTe's TMA/tiling helpers expect: (M, K) -> (M, K, 1).
        mA = self._add_batch_mode(mA)
        mB = self._add_batch_mode(mB)
        mD = self._add_batch_mode(mD)
        self._setup(
            mA.element_type,
            mB.element_type,
            mD.element_type,
            LayoutEnum.from_tensor(mA),
            LayoutEnum.from_tensor(mB),
            LayoutEnum.from_tensor(mD),
        )

        # One stage's layout by dropping the stage mode: cute.slice_ of a swizzled staged layout
        # with an odd number of 8-row atoms (tile_n 72, 88, 104, ...) aborts the DSL.
        a_smem = cute.select(self.a_smem_staged, mode=[0, 1])
        b_smem = cute.select(self.b_smem_staged, mode=[0, 1])
        c_smem = cute.select(self.c_smem_staged, mode=[0, 1])
        # Each operand is multicast to the CTAs of the cluster that share it.
        tma_a, tA = cpasync.make_tiled_tma_atom(
            self._load_op(self.cluster_mn[1]), mA, a_smem, (self.tile_mnk[0], self.tile_mnk[2]),
            num_multicast=self.cluster_mn[1],
        )
        tma_b, tB = cpasync.make_tiled_tma_atom(
            self._load_op(self.cluster_mn[0]), mB, b_smem, (self.tile_mnk[1], self.tile_mnk[2]),
            num_multicast=self.cluster_mn[0],
        )
        tma_d, tD = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mD, c_smem, self.epi_tile)
        tma_sa = tSA = tma_sb = tSB = None
        if cutlass.const_expr(self.epi.block_scaled):
            sa_staged, sb_staged = self._scale_smem_layouts()
            tma_sa, tSA = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mRowScale,
                                                      cute.slice_(sa_staged, (None, None, 0)), (self.tile_mn[0], 1))
            tma_sb, tSB = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mColScale,
                                                      cute.slice_(sb_staged, (None, None, 0)), (1, 4))
        tma_r = tR = None
        if cutlass.const_expr(self.res_tma):
            tma_r, tR = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), self._add_batch_mode(mResidual),
                                                    cute.slice_(self.r_smem_staged, (None, None, 0)), self.epi_tile)

        tiles_m = cute.ceil_div(mD.shape[0], self.tile_mn[0])
        tiles_n = cute.ceil_div(mD.shape[1], self.out_n)
        clusters_m = cute.ceil_div(tiles_m, self.cluster_mn[0])
        clusters_n = cute.ceil_div(tiles_n, self.cluster_mn[1])
        self.max_clusters = max_active_clusters
        work_items = self._num_work(clusters_m, clusters_n, splits)
        num_clusters = cutlass.min(work_items, max_active_clusters)

        @cute.struct
        class SharedStorage:
            ab_full_empty: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.a_dtype, cute.cosize(self.a_smem_staged)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(self.b_smem_staged)], 1024]
            sD: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(self.c_smem_staged)], 1024]
            vec_full_empty: cute.struct.MemRange[cutlass.Int64, VEC_STAGES * 2]
            split_flag: cute.struct.MemRange[cutlass.Int32, 4]  # split-K: "finisher" flags (split_fixup)
            res_full: cute.struct.MemRange[cutlass.Int64, 4]  # residual slabs landed (TMA transaction bytes)
            sRes: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, cute.cosize(self.r_smem_staged) if self.res_tma else 8], 1024]
            sVec: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.vec_slots * VEC_STAGES], 16]
            sSA: cute.struct.Align[cute.struct.MemRange[
                cutlass.Float32, self.tile_mn[0] * self.ab_stages if self.epi.block_scaled else 4], 128]
            sSB: cute.struct.Align[cute.struct.MemRange[
                cutlass.Float32, 32 * self.ab_stages if self.epi.block_scaled else 4], 128]

        self.shared_storage = SharedStorage
        assert SharedStorage.size_in_bytes() <= SM90_SMEM_BYTES

        self.kernel(
            tma_a, tA, tma_b, tB, tma_d, tD, tma_r, tR, (tma_sa, tSA, tma_sb, tSB), mD,
            mBias, mResidual, mRowScale, mColScale, alpha, beta, mWs, mSem,
            clusters_m, clusters_n, splits,
            self.tiled_mma, self.a_smem_staged, self.b_smem_staged, self.c_smem_staged, self.r_smem_staged,
        ).launch(
            grid=(self.cluster_mn[0], self.cluster_mn[1], num_clusters),
            block=[self.num_threads, 1, 1],
            cluster=(self.cluster_mn[0], self.cluster_mn[1], 1),
            min_blocks_per_mp=1,
            stream=stream,
            use_pdl=self.pdl,
        )

    def _scale_smem_layouts(self):
        """Block scales ride in the A/B stages: per k-tile, scale_a's tile_m rows (a box of
        the M-major [M, K/128] array) and a 4-wide k box of scale_b's row for the tile's
        column block (TMA boxes need 16 bytes; the consumer picks k % 4). Every stage's
        box starts 128-byte aligned, as TMA's shared-memory destination must. Built where
        used: IR values made on the host side cannot be used inside the kernel."""
        return (cute.make_layout((self.tile_mn[0], 1, self.ab_stages)),
                cute.make_layout((1, 4, self.ab_stages), stride=(4, 1, 32)))

    @staticmethod
    def _add_batch_mode(t: cute.Tensor) -> cute.Tensor:
        layout = cute.make_layout((*t.shape, 1), stride=(*t.stride, 0))
        return cute.make_tensor(t.iterator, layout)

    def _gate_up_view(self, mB: cute.Tensor, n_out) -> cute.Tensor:
        """[gate; up] ([2N, K], rows ld apart) seen as the B whose tile t is gate rows
        [t h, (t + 1) h) then up rows [t h, (t + 1) h), h = tile_n / 2: row (i, j, t) of the
        hierarchical row mode is gate/up row t h + i of half j. One TMA box per tile loads
        both halves (a 4-D box), and a cluster's multicast slices split it as usual.
        The host guarantees N % h == 0."""
        h = self.tile_mn[1] // 2
        ld = mB.stride[0]
        rows = cute.make_layout((h, 2, n_out // h), stride=(ld, cutlass.Int64(n_out) * ld, h * ld))
        return cute.make_tensor(mB.iterator, cute.make_layout((rows.shape, mB.shape[1]), stride=(rows.stride, 1)))

    @staticmethod
    def _load_op(num_multicast: int):
        return cpasync.CopyBulkTensorTileG2SMulticastOp() if num_multicast > 1 else cpasync.CopyBulkTensorTileG2SOp()

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_d: cute.CopyAtom,
        mD_tma: cute.Tensor,
        tma_r: cute.CopyAtom | None,
        mR_tma: cute.Tensor | None,
        scale_tma: tuple,  # block scales: (atom, tensor) for scale_a, then scale_b; Nones otherwise
        mD: cute.Tensor,
        mBias: cute.Tensor | None,
        mResidual: cute.Tensor | None,
        mRowScale: cute.Tensor | None,
        mColScale: cute.Tensor | None,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        mWs: cute.Tensor | None,
        mSem: cute.Tensor | None,
        clusters_m: cutlass.Int32,
        clusters_n: cutlass.Int32,
        splits: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout,
        b_smem_staged: cute.ComposedLayout,
        c_smem_staged: cute.ComposedLayout,
        r_smem_staged: cute.ComposedLayout,
    ):
        # Layouts and the tiled MMA are built on the host (the TMA atoms need them) and
        # passed in: values created outside the kernel region cannot be used inside it.
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_d)
            if cutlass.const_expr(self.res_tma):
                cpasync.prefetch_descriptor(tma_r)
            if cutlass.const_expr(self.epi.block_scaled):
                cpasync.prefetch_descriptor(scale_tma[0])
                cpasync.prefetch_descriptor(scale_tma[2])

        cta_layout = cute.make_layout((*self.cluster_mn, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cta_coord = cta_layout.get_flat_coord(cta_rank)

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        ab_pipeline = self._make_ab_pipeline(storage.ab_full_empty.data_ptr(), cta_layout, a_smem_staged, b_smem_staged)
        vec_pipeline = None
        if cutlass.const_expr(self.stage_vectors):
            # Every thread that runs a tile's epilogue releases its stage.
            readers = self.threads_per_wg if self.cfg.pingpong else self.num_mma_threads
            vec_pipeline = pipeline.PipelineAsync.create(
                barrier_storage=storage.vec_full_empty.data_ptr(),
                num_stages=VEC_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, readers),
                defer_sync=True,
            )
        res_full = storage.res_full.data_ptr()
        if cutlass.const_expr(self.res_tma):
            if warp_idx == 0:
                with cute.arch.elect_one():
                    for i in cutlass.range_constexpr(self.res_slots):
                        cute.arch.mbarrier_init(res_full + i, 1)
                cute.arch.mbarrier_init_fence()
        # Cluster peers must see initialised barriers before any multicast lands.
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sD = storage.sD.get_tensor(c_smem_staged.outer, swizzle=c_smem_staged.inner)
        sVec = storage.sVec.get_tensor(cute.make_layout((self.vec_slots, VEC_STAGES)))
        sFlag = storage.split_flag.get_tensor(cute.make_layout(4))
        sRes = None
        if cutlass.const_expr(self.res_tma):
            sRes = storage.sRes.get_tensor(r_smem_staged.outer, swizzle=r_smem_staged.inner)
        sScale = None
        if cutlass.const_expr(self.epi.block_scaled):
            sa_staged, sb_staged = self._scale_smem_layouts()
            sScale = (storage.sSA.get_tensor(sa_staged), storage.sSB.get_tensor(sb_staged))

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_mn)
        if cutlass.const_expr(self.pdl):
            # Launched as a programmatic dependent: the launch, the descriptor prefetch,
            # barrier init and the cluster handshake above overlap the tail of the kernel
            # ahead, and no thread touches global memory before that kernel has finished
            # and its writes are visible. (The next kernel is let go in `load`.)
            cute.arch.griddepcontrol_wait()

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.load_regs)
            if warp_idx == 0:
                self.load(tma_a, mA, tma_b, mB, sA, sB, ab_pipeline, cta_layout, cta_coord, clusters_m, clusters_n, splits,
                          scale_tma, sScale)
            if cutlass.const_expr(self.stage_vectors):
                if warp_idx == 1:
                    self.load_vectors(mD, mBias, mRowScale, mColScale, sVec, vec_pipeline, cta_coord,
                                      clusters_m, clusters_n, splits)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            self.consumer(
                tiled_mma, sA, sB, sD, sVec, sFlag, tma_d, mD_tma, mD, mBias, mResidual, mRowScale, mColScale,
                alpha, beta, mWs, mSem, (tma_r, mR_tma, sRes, res_full), sScale,
                ab_pipeline, vec_pipeline, cta_coord, clusters_m, clusters_n, splits, cute.ceil_div(mA.shape[1], self.tile_k),
            )

    def _make_ab_pipeline(self, barrier_ptr, cta_layout, a_smem_staged, b_smem_staged):
        a_bytes = cute.size_in_bytes(self.a_dtype, cute.select(a_smem_staged, mode=[0, 1]))
        b_bytes = cute.size_in_bytes(self.b_dtype, cute.select(b_smem_staged, mode=[0, 1]))
        # A stage is read by this CTA's consumer warps and, through multicast, by the
        # peers in its cluster row and column: each of their warps arrives once.
        # In ping-pong mode only the owning warpgroup reads a stage.
        mcast_peers = self.cluster_mn[0] + self.cluster_mn[1] - 1
        readers = 1 if self.cfg.pingpong else self.num_mma_wg
        consumer = pipeline.CooperativeGroup(pipeline.Agent.Thread, mcast_peers * readers * 4)
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barrier_ptr,
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=consumer,
            tx_count=a_bytes + b_bytes + (4 * (self.tile_mn[0] + 4) if self.epi.block_scaled else 0),
            cta_layout_vmnk=cute.make_layout((1, *cta_layout.shape)),
            defer_sync=True,
        )

    @cute.jit
    def _tile_coord(self, work: cutlass.Int32, clusters_m: cutlass.Int32, clusters_n: cutlass.Int32, cta_coord):
        """Grouped raster: work item -> (tile_m, tile_n) of this CTA.

        Work items walk a band of `group` clusters along the raster dimension before
        moving on in the other dimension; the last band may be narrower.
        """
        g = self.cfg.group
        if cutlass.const_expr(self.cfg.raster_m):
            per_band = g * clusters_n
            band = work // per_band
            first = band * g
            width = cutlass.min(clusters_m - first, g)
            r = work - band * per_band
            cm = first + r % width
            cn = r // width
        else:
            per_band = g * clusters_m
            band = work // per_band
            first = band * g
            width = cutlass.min(clusters_n - first, g)
            r = work - band * per_band
            cn = first + r % width
            cm = r // width
        return cm * self.cluster_mn[0] + cta_coord[0], cn * self.cluster_mn[1] + cta_coord[1]

    def _split_head(self, tiles):
        """Split-K: how many of the `tiles` cluster tiles run whole, before the split ones.

        The persistent grid runs max_active_clusters clusters at a time. Whole waves of
        cluster tiles run unsplit; only the last, partial wave's tiles are split, so the
        splits fill the SMs that wave would leave idle (a grid of at most one wave splits
        every tile). The host computes the same count (`split_tail_tiles`)."""
        return tiles - tiles % self.max_clusters

    def _num_work(self, clusters_m, clusters_n, splits):
        """Work items of the schedule: cluster tiles, the split ones counted once per split."""
        tiles = clusters_m * clusters_n
        if self.split:  # trace-time branch (plain Python helper, inlined into the kernel)
            head = self._split_head(tiles)
            return head + (tiles - head) * splits
        return tiles

    def _work_item(self, work, clusters_m, clusters_n, splits, k_tiles):
        """Work item -> (tile work index, split index, first k-tile, number of k-tiles,
        splits of this tile).

        Without split-K this is (work, 0, 0, k_tiles, 1). With it the items of the whole
        waves come first, one a tile (`_split_head`); then each tail tile's splits, the
        split the slow index, so the CTAs running at one time share the K range of their
        A/B panels. The ranges are balanced (config.splitk_k_tiles), never empty while
        S <= k_tiles.
        """
        if self.split:
            tiles = clusters_m * clusters_n
            head = self._split_head(tiles)
            in_tail = work >= head
            w = cutlass.max(work - head, cutlass.Int32(0))
            tail = cutlass.max(tiles - head, cutlass.Int32(1))
            l_idx = w // tail
            tile = cutlass.select_(in_tail, head + w - l_idx * tail, work)
            l_idx = cutlass.select_(in_tail, l_idx, cutlass.Int32(0))
            s = cutlass.select_(in_tail, splits, cutlass.Int32(1))
            k_begin = l_idx * k_tiles // s
            k_end = (l_idx + 1) * k_tiles // s
            return tile, l_idx, k_begin, k_end - k_begin, s
        return work, 0, 0, k_tiles, 1

    @cute.jit
    def load(self, tma_a, mA, tma_b, mB, sA, sB, ab_pipeline, cta_layout, cta_coord, clusters_m, clusters_n, splits,
             scale_tma, sScale):
        """Producer warp: TMA loads of every k-tile of every tile this CTA owns (and, when
        block-scaled, of each k-tile's scales, on the same stage barrier)."""
        gA = cute.local_tile(mA, cute.slice_(self.tile_mnk, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.tile_mnk, (0, None, None)), (None, None, None))
        # A is shared by the CTAs of one cluster row (same M tile, different N): they
        # each load a slice and multicast it; B likewise along the cluster column.
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, cta_coord[1], cute.make_layout(self.cluster_mn[1]),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, cta_coord[0], cute.make_layout(self.cluster_mn[0]),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2),
        )
        a_mask = cute.make_layout_image_mask(cta_layout, cta_coord, mode=1) if self.cluster_mn[1] > 1 else 0
        b_mask = cute.make_layout_image_mask(cta_layout, cta_coord, mode=0) if self.cluster_mn[0] > 1 else 0
        k_tiles = cute.size(gA, mode=[3])
        tSAs = tSAg = tSBs = tSBg = None
        if cutlass.const_expr(self.epi.block_scaled):
            # Not multicast: each CTA loads the scales of its own rows / column block.
            tma_sa, mSA, tma_sb, mSB = scale_tma
            tSAs, tSAg = cpasync.tma_partition(
                tma_sa, 0, cute.make_layout(1), cute.group_modes(sScale[0], 0, 2),
                cute.group_modes(cute.local_tile(mSA, (self.tile_mn[0], 1), (None, None)), 0, 2))
            tSBs, tSBg = cpasync.tma_partition(
                tma_sb, 0, cute.make_layout(1), cute.group_modes(sScale[1], 0, 2),
                cute.group_modes(cute.local_tile(mSB, (1, 4), (None, None)), 0, 2))

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        total = self._num_work(clusters_m, clusters_n, splits)
        work = cute.arch.block_idx()[2]
        while work < total:
            tile_work, _split_idx, k_begin, k_count, _s = self._work_item(work, clusters_m, clusters_n, splits, k_tiles)
            tm, tn = self._tile_coord(tile_work, clusters_m, clusters_n, cta_coord)
            tAgA_t = tAgA[(None, tm, None, 0)]
            tBgB_t = tBgB[(None, tn, None, 0)]
            for kk in range(k_count):
                k = k_begin + kk
                ab_pipeline.producer_acquire(state)
                bar = ab_pipeline.producer_get_barrier(state)
                cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, state.index)], tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=b_mask)
                if cutlass.const_expr(self.epi.block_scaled):
                    cute.copy(scale_tma[0], tSAg[(None, tm, k)], tSAs[(None, state.index)], tma_bar_ptr=bar)
                    cute.copy(scale_tma[2], tSBg[(None, tn * self.tile_mn[1] // 128, k // 4)], tSBs[(None, state.index)],
                              tma_bar_ptr=bar)
                ab_pipeline.producer_commit(state)
                state.advance()
            work += cute.arch.grid_dim()[2]
        if cutlass.const_expr(self.pdl):
            # Every load of this CTA is issued: the next kernel may launch, and its CTAs
            # run their own setup as ours drain (it still waits for our grid to finish
            # before it reads memory). A trigger right after the wait measured the same
            # on average and 4% slower at 312x1280x5120 (docs/tried-and-not-kept.md).
            cute.arch.griddepcontrol_launch_dependents()
        # Do not exit while peers may still arrive on our empty barriers.
        ab_pipeline.producer_tail(state)

    @cute.jit
    def consumer(
        self, tiled_mma, sA, sB, sD, sVec, sFlag, tma_d, mD_tma, mD, mBias, mResidual, mRowScale, mColScale,
        alpha, beta, mWs, mSem, res_tma, sScale, ab_pipeline, vec_pipeline, cta_coord, clusters_m, clusters_n, splits,
        k_tiles,
    ):
        """Consumer warpgroups: for each owned tile, `mma()` then `epilogue()`.

        Cooperative: both warpgroups work on every tile (each on its own rows).
        Ping-pong: warpgroup w takes the CTA's tiles w, w+2, ...; a pair of named
        barriers hands the tensor cores from one warpgroup's main loop to the
        other's, so one warpgroup's epilogue runs under the other's main loop.
        """
        pingpong = self.cfg.pingpong
        wg_threads = self.threads_per_wg
        tidx = cute.arch.thread_idx()[0] - wg_threads
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // wg_threads)
        thr_mma = tiled_mma.get_slice(0 if pingpong else wg_idx * wg_threads)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        gD = cute.local_tile(mD_tma, cute.slice_(self.tile_mnk, (None, None, 0)), (None, None, None))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gD).shape[:3], self.acc_dtype)
        gD_out = gD  # the tiles the epilogue stores: (tile_m, tile_n / 2) under SwiGLU
        if cutlass.const_expr(self.swiglu):
            gD_out = cute.local_tile(mD_tma, (self.tile_mn[0], self.out_n), (None, None, None))
        acc_k = acc  # per-k-tile partial sums when promoting (fp8 "2xAcc")
        if cutlass.const_expr(self.cfg.promote):
            acc_k = cute.make_rmem_tensor(acc.shape, self.acc_dtype)
        # Tile (m, n) of every accumulator register, for the 32-bit epilogue: the
        # identity tensor partitioned by *this thread's* slice (thr_mma above is the
        # warpgroup's slice, which is all wgmma needs), so acc[i] sits at tCcD[i].
        tCcD = tiled_mma.get_slice(tidx % wg_threads if pingpong else tidx).partition_C(
            cute.make_identity_tensor(self.tile_mn))
        box_sD = box_gD = None
        if cutlass.const_expr(self.c_dtype.width == 32):
            # 32-bit epilogue: D cut into (16, 32) boxes, ((16, 32), (M/16, N/32, L)).
            box_sD, box_gD = cpasync.tma_partition(
                tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2), cute.zipped_divide(mD_tma, self.epi_tile))

        copy_r2s = self._make_r2s_copy(tiled_mma)
        thr_r2s = copy_r2s.get_slice(tidx % wg_threads if pingpong else tidx)
        epi_threads = wg_threads if pingpong else self.num_mma_threads
        # Ping-pong warpgroups each own EPI_STAGES smem slabs and their own barrier.
        epi_barrier = pipeline.NamedBarrier(barrier_id=4, num_threads=epi_threads)
        epi_barrier_wg1 = pipeline.NamedBarrier(barrier_id=5, num_threads=epi_threads)
        turn = (pipeline.NamedBarrier(barrier_id=2, num_threads=2 * wg_threads),
                pipeline.NamedBarrier(barrier_id=3, num_threads=2 * wg_threads))
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=EPI_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, epi_threads),
        )
        is_store_warp = warp_idx == self.epi_store_warp
        if cutlass.const_expr(pingpong):
            is_store_warp = warp_idx == self.epi_store_warp + 4 * wg_idx

        vec_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, VEC_STAGES)
        # Scalar scales are the same for every tile: fold them into one factor here.
        # Read in the epilogue, they were re-read from global memory after every slab's
        # barrier (a barrier orders memory, so the loads could not be reused).
        factor = cutlass.Float32(1.0)
        if cutlass.const_expr(self.epi.alpha):
            factor = alpha
        if cutlass.const_expr(self.epi.row_scale == "scalar"):
            factor = factor * cutlass.Float32(mRowScale[0])
        if cutlass.const_expr(self.epi.col_scale == "scalar"):
            factor = factor * cutlass.Float32(mColScale[0])
        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        total = self._num_work(clusters_m, clusters_n, splits)
        step = cute.arch.grid_dim()[2]
        work = cute.arch.block_idx()[2]
        local = cutlass.Int32(0)  # index of the tile among this CTA's tiles
        tiles_done = cutlass.Int32(0)
        while work < total:
            tile_work, split_idx, _k_begin, k_count, tile_splits = self._work_item(work, clusters_m, clusters_n, splits, k_tiles)
            mine = True
            if cutlass.const_expr(pingpong):
                mine = local % 2 == wg_idx
            if mine:
                tm, tn = self._tile_coord(tile_work, clusters_m, clusters_n, cta_coord)
                res_first = None
                if cutlass.const_expr(self.res_tma):
                    # The first slabs' TMA loads start before the main loop (see `epilogue`).
                    if is_store_warp:
                        for slab in cutlass.range_constexpr(min(RES_SLOTS, self.n_slabs)):
                            self._issue_residual_slab(res_tma, tm, tn, wg_idx, slab)
                if cutlass.const_expr(self.epi.residual and self.c_dtype.width == 16 and not self.res_tma):
                    res_first = self._residual_fragment(thr_r2s, sD)
                    if cutlass.const_expr(not self.split):
                        # The first slab's residual is loaded before the main loop, so its
                        # global-memory latency hides under the MMAs instead of stalling the
                        # epilogue (later slabs are loaded one slab ahead, in `epilogue`).
                        # Split-K loads it after the fixup: only the finisher needs it, and
                        # held across the fixup it spilled the 128 x 128 ping-pong tile.
                        self._load_residual(res_first, thr_r2s.partition_S(cute.make_identity_tensor(self.epi_tile)),
                                            mD, mResidual, tm * self.tile_mn[0], tn * self.tile_mn[1])
                if cutlass.const_expr(pingpong):
                    if local > 0:  # wait for the other warpgroup to finish issuing its main loop
                        if wg_idx == 0:
                            turn[0].arrive_and_wait()
                        else:
                            turn[1].arrive_and_wait()
                blk = None
                if cutlass.const_expr(self.epi.block_scaled):
                    # This thread's first accumulator row within the tile, for its scale_a.
                    blk = (sScale[0], sScale[1], tCcD[0][0], _k_begin)
                read_state, release_state = self.mma(
                    tiled_mma, acc, acc_k, tCrA, tCrB, ab_pipeline, read_state, release_state, k_count,
                    turn, wg_idx, work + step < total, blk,
                )
                finish = True
                if cutlass.const_expr(self.split):
                    if tile_splits > 1:
                        finish = self.split_fixup(acc, mWs, mSem, sFlag, tidx, wg_idx, tile_work, cta_coord,
                                                  split_idx, tile_splits, clusters_m, clusters_n, tiles_done,
                                                  epi_barrier, epi_barrier_wg1)
                if cutlass.const_expr(self.stage_vectors):
                    vec_pipeline.consumer_wait(vec_state)
                if finish:
                    if cutlass.const_expr(self.split and self.epi.residual and self.c_dtype.width == 16):
                        self._load_residual(res_first, thr_r2s.partition_S(cute.make_identity_tensor(self.epi_tile)),
                                            mD, mResidual, tm * self.tile_mn[0], tn * self.tile_mn[1])
                    if cutlass.const_expr(self.c_dtype.width == 32):
                        self.epilogue_32bit(
                            acc, tCcD, sD, box_sD, box_gD, tma_d, mD, mBias, mResidual, mRowScale, mColScale,
                            factor, beta, tm, tn, tiles_done, warp_idx - 4)
                    else:
                        self.epilogue(
                            acc, copy_r2s, thr_r2s, sD, tma_d, gD_out, mD, mBias, mResidual, mRowScale, mColScale,
                            factor, beta, tm, tn, tiles_done, wg_idx, is_store_warp, store_pipeline,
                            epi_barrier, epi_barrier_wg1, res_first, sVec, vec_state.index, res_tma,
                        )
                if cutlass.const_expr(self.stage_vectors):
                    vec_pipeline.consumer_release(vec_state)
                tiles_done += 1
            else:
                # The other warpgroup's tile: step over its stages in the smem ring.
                for _k in range(k_count):
                    read_state.advance()
                    release_state.advance()
            if cutlass.const_expr(self.stage_vectors):
                vec_state.advance()
            local += 1
            work += step
        store_pipeline.producer_tail()

    @cute.jit
    def mma(self, tiled_mma, acc, acc_k, tCrA, tCrB, ab_pipeline, read_state, release_state, k_tiles, turn, wg_idx,
            has_next, blk=None):
        """Main loop over k: keep one wgmma batch in flight while the next stage lands."""
        if cutlass.const_expr(self.cfg.promote):
            return self._mma_promoted(tiled_mma, acc, acc_k, tCrA, tCrB, ab_pipeline, read_state, release_state,
                                      k_tiles, blk)
        k_blocks = cute.size(tCrA, mode=[2])
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        ab_pipeline.consumer_wait(read_state)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(k_blocks):
            cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                      tCrB[(None, None, kb, read_state.index)], acc)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        read_state.advance()
        for _k in range(1, k_tiles):
            ab_pipeline.consumer_wait(read_state)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(k_blocks):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                          tCrB[(None, None, kb, read_state.index)], acc)
            warpgroup.commit_group()
            # The batch issued one iteration ago is done: its stage can be refilled.
            warpgroup.wait_group(1)
            ab_pipeline.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
        if cutlass.const_expr(self.cfg.pingpong):
            # All of this tile's wgmmas are issued: the other warpgroup may start its
            # main loop (only if it has a next tile, so no barrier is left half-arrived).
            if has_next:
                if wg_idx == 0:
                    turn[1].arrive()
                else:
                    turn[0].arrive()
        warpgroup.wait_group(0)
        ab_pipeline.consumer_release(release_state)
        release_state.advance()
        return read_state, release_state

    @cute.jit
    def split_fixup(self, acc, mWs, mSem, sFlag, tidx, wg_idx, tile_work, cta_coord, split_idx, splits, clusters_m,
                    clusters_n, tiles_done, epi_barrier, epi_barrier_wg1):
        """Split-K: exactly one split of the tile (the finisher) adds all the partials.

        Returns whether this CTA (warpgroup, in ping-pong) is the finisher and runs the
        tile's epilogue. The tile's counter holds how many splits have published
        their partial. A split that finds S - 1 already published is the finisher and
        writes nothing; otherwise it publishes its partial (store, release fence) and
        counts in, and the one that brings the count to S is the finisher. Either way
        exactly one split finishes, nobody waits for anybody (a spin loop here made
        ptxas spill under the 168-register launch cap), and the finisher resets the
        counter for the next launch. Floating-point partials are summed in split order
        whichever split finishes, so a launch's result is the same bits every time.
        """
        pingpong = self.cfg.pingpong
        threads = self.threads_per_wg if pingpong else self.num_mma_threads
        e = tidx % self.threads_per_wg if pingpong else tidx  # this thread's rank in the tile
        # Counters and partials are indexed by the split tiles only (the tail's CTA tiles).
        cluster_size = self.cluster_mn[0] * self.cluster_mn[1]
        head = self._split_head(clusters_m * clusters_n)
        tiles = (clusters_m * clusters_n - head) * cluster_size
        tile = (tile_work - head) * cluster_size + cta_coord[0] * self.cluster_mn[1] + cta_coord[1]
        tile_elems = self.tile_mn[0] * self.tile_mn[1]
        n_acc = cute.size(acc)
        # Flags alternate between two slots per epilogue group, so a fast thread setting
        # the next tile's flag never overwrites one a slow thread has yet to read.
        slot = tiles_done % 2
        if cutlass.const_expr(pingpong):
            slot = wg_idx * 2 + tiles_done % 2
        if e == 0:
            seen = cute.arch.load(mSem.iterator + tile, cutlass.Int32, sem="acquire", scope="gpu")
            sFlag[slot] = cutlass.select_(seen == splits - 1, cutlass.Int32(1), cutlass.Int32(0))
        self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
        finish = sFlag[slot] == 1
        if not finish:
            # Register order, threads fastest: each warp-wide store is one 128-byte line.
            base = (split_idx * tiles + tile) * tile_elems + e
            for v in cutlass.range_constexpr(n_acc):
                mWs[base + v * threads] = acc[v]
            # Release the partial before counting in; the finisher acquires all of them.
            cute.arch.fence_acq_rel_gpu()
            self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
            if e == 0:
                old = cute.arch.atomic_add(mSem.iterator + tile, cutlass.Int32(1), sem="acq_rel", scope="gpu")
                sFlag[slot] = cutlass.select_(old == splits - 1, cutlass.Int32(1), cutlass.Int32(0))
            self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
            finish = sFlag[slot] == 1
        if finish:
            if e == 0:
                mSem[tile] = 0  # all other splits have counted in: ready for the next launch
            cute.arch.fence_acq_rel_gpu()
            if cutlass.const_expr(self.acc_dtype == cutlass.Int32):
                # Integer sums are exact in any order: add the others to our own.
                for other in range(splits):
                    if other != split_idx:
                        obase = (other * tiles + tile) * tile_elems + e
                        for v in cutlass.range_constexpr(n_acc):
                            acc[v] = acc[v] + mWs[obase + v * threads]
            else:
                # fp32 addition is not associative: sum in split order, from split 0's
                # partial, whichever split finishes, so the bits never depend on arrival
                # order. A finisher other than split 0 parks its own partial at its index
                # first (each thread reads back only what it wrote: no fence needed).
                if split_idx != 0:
                    own = (split_idx * tiles + tile) * tile_elems + e
                    for v in cutlass.range_constexpr(n_acc):
                        mWs[own + v * threads] = acc[v]
                    first = tile * tile_elems + e
                    for v in cutlass.range_constexpr(n_acc):
                        acc[v] = mWs[first + v * threads]
                for other in range(1, splits):
                    obase = (other * tiles + tile) * tile_elems + e
                    for v in cutlass.range_constexpr(n_acc):
                        acc[v] = acc[v] + mWs[obase + v * threads]
        return finish

    @cute.jit
    def _mma_promoted(self, tiled_mma, acc, acc_k, tCrA, tCrB, ab_pipeline, read_state, release_state, k_tiles,
                      blk=None):
        """FP8 main loop with promotion: acc += (fresh wgmma sum over one k-tile), in fp32.

        The wait after every k-tile costs some tensor-core idle time; it buys fp32
        accuracy for long K (what torch._scaled_mm's use_fast_accum=False provides).

        Block-scaled (blk = (staged scale_a, staged scale_b, first row, first k-tile)):
        a k-tile is exactly one 128-deep scale block, so the promotion is
        acc += acc_k * scale_a[row, k] * scale_b[n-block, k]. The producer TMA-loads the
        scales into the k-tile's stage with A and B, so they are in shared memory when
        the stage is; they are read while the wgmmas run and before the stage is
        released. (Read from global memory in this loop, even one or two k-tiles ahead,
        they cost 10-20%: the stall is the load latency at the first k-tile of each tile
        and the register pressure of keeping loads in flight.) Rows alternate every two
        accumulator registers (row r for (v // 2) % 2 == 0, r + 8 otherwise), the wgmma
        C layout.
        """
        k_blocks = cute.size(tCrA, mode=[2])
        acc.fill(0.0)
        if cutlass.const_expr(blk is not None):
            sSA, sSB, row0, k0 = blk
            assert cute.size(acc, mode=[1]) == 1 and cute.size(acc, mode=[2]) == 1, "one 64-row M-step per warpgroup"
        for k in range(k_tiles):
            ab_pipeline.consumer_wait(read_state)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(k_blocks):
                cute.gemm(tiled_mma, acc_k, tCrA[(None, None, kb, read_state.index)],
                          tCrB[(None, None, kb, read_state.index)], acc_k)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
            s0 = s1 = cutlass.Float32(1.0)
            if cutlass.const_expr(blk is not None):
                sb = sSB[0, (k0 + k) % 4, read_state.index]
                s0 = sSA[row0, 0, read_state.index] * sb
                s1 = sSA[row0 + 8, 0, read_state.index] * sb
            warpgroup.wait_group(0)
            ab_pipeline.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
            for v in cutlass.range_constexpr(cute.size(acc)):
                if cutlass.const_expr(blk is not None):
                    acc[v] = acc_k[v] * (s0 if (v // 2) % 2 == 0 else s1) + acc[v]
                else:
                    acc[v] = acc[v] + acc_k[v]
        return read_state, release_state

    @cute.jit
    def epilogue(
        self, acc, copy_r2s, thr_r2s, sD, tma_d, gD, mD, mBias, mResidual, mRowScale, mColScale,
        factor, beta, tm, tn, tiles_done, wg_idx, is_store_warp, store_pipeline, epi_barrier, epi_barrier_wg1,
        res_first, sVec, vec_buf, res_tma,
    ):
        """Accumulators -> fused epilogue math (fp32) -> output dtype -> smem slab -> TMA store.

        The residual, with `res_tma`, waits for each slab's TMA load into its smem slot
        and is read there at the accumulator coordinates; the store warp refills the
        slot for slab + RES_SLOTS once every thread is past it. Otherwise it is loaded
        from global memory as column pairs, one slab ahead of its use (`res_first`, slab
        0, was loaded before the main loop).
        """
        tRS_sD = thr_r2s.partition_D(sD)
        tRS_acc = copy_r2s.retile(acc)
        # Epilogue math is fp32; a raw int32 result (int8 GEMM) must bypass it, since
        # fp32 holds integers exactly only up to 2^24.
        rd_dtype = cutlass.Int32 if cutlass.const_expr(self.c_dtype == cutlass.Int32) else cutlass.Float32
        tRS_rD = cute.make_rmem_tensor(thr_r2s.partition_S(sD).shape[:3], rd_dtype)
        tRS_rOut = cute.make_rmem_tensor(tRS_rD.shape, self.c_dtype)
        n_regs = cute.size(tRS_rD)
        slab_layout = self._slab_layout()
        n_slabs = self.n_slabs
        acc_slabs_n = self.tile_mn[1] // self.epi_tile[1]
        tRS_rU = None
        if cutlass.const_expr(self.swiglu):
            # Output slab (r, c) takes gate from accumulator slab (r, c) and up from (r, c + S/2).
            n_slabs = n_slabs // 2
            slab_layout = self._slab_layout(self.out_n)
            tRS_rU = cute.make_rmem_tensor(tRS_rD.shape, cutlass.Float32)
        gD_tile = gD[(None, None, tm, tn, 0)]
        bSG_sD, bSG_gD = cpasync.tma_partition(
            tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2),
            cute.zipped_divide(gD_tile, self.epi_tile),
        )
        # Slab coordinates of the registers: stmatrix is warp-collective, so the
        # *source* partition says which elements a thread holds (the destination
        # partition only says which smem rows it addresses).
        tRS_cD = thr_r2s.partition_S(cute.make_identity_tensor(self.epi_tile))
        G = self.epi_group
        n_groups = (n_slabs + G - 1) // G
        buf0 = 0
        if cutlass.const_expr(self.cfg.pingpong):
            buf0 = wg_idx * EPI_STAGES * G
        res = [None, None]
        if cutlass.const_expr(self.epi.residual and not self.res_tma):
            res = [res_first, self._residual_fragment(thr_r2s, sD)]
        r_tma = None
        if cutlass.const_expr(self.res_tma):
            r_tma = cute.make_rmem_tensor(tRS_rD.shape, self.c_dtype)
        whole = self.whole_epi
        if cutlass.const_expr(self.split and not whole):
            # The buffer sets alternate by tile count, and a split tile this CTA did not finish
            # ran no epilogue: with an odd number of store rounds a tile, this epilogue's first
            # set could be the one the last stores are still reading. Let them finish first.
            if is_store_warp:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
        if cutlass.const_expr(whole):
            # One buffer per slab: the previous tile's stores must have read them (the wait
            # lands here, under this tile's main loop, rather than after every slab).
            if tiles_done > 0:
                if is_store_warp:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
        for slab in cutlass.range_constexpr(n_slabs):
            slab_mn = slab_layout.get_hier_coord(slab)
            if cutlass.const_expr(self.swiglu):
                gate = slab_mn[0] * acc_slabs_n + slab_mn[1]
                for v in cutlass.range_constexpr(n_regs):
                    tRS_rD[v] = tRS_acc[gate * n_regs + v]
                    tRS_rU[v] = tRS_acc[(gate + acc_slabs_n // 2) * n_regs + v]
                self._swiglu(tRS_rD, tRS_rU)
            else:
                for v in cutlass.range_constexpr(n_regs):
                    tRS_rD[v] = rd_dtype(tRS_acc[slab * n_regs + v])
            rres = res[slab % 2]
            if cutlass.const_expr(self.res_tma):
                self._read_residual_slab(res_tma, r_tma, tRS_cD, tiles_done, wg_idx, slab, n_slabs)
                rres = r_tma
            if cutlass.const_expr(self.epi.residual and not self.res_tma and slab + 1 < n_slabs):
                nxt = slab_layout.get_hier_coord(slab + 1)
                self._load_residual(res[(slab + 1) % 2], tRS_cD, mD, mResidual,
                                    tm * self.tile_mn[0] + nxt[0] * self.epi_tile[0],
                                    tn * self.tile_mn[1] + nxt[1] * self.epi_tile[1])
            if cutlass.const_expr(not self.epi.is_identity and not self.swiglu):
                self._epilogue_math(tRS_rD, tRS_cD, mD, mBias, rres, mRowScale, mColScale, factor, beta,
                                    tm * self.tile_mn[0] + slab_mn[0] * self.epi_tile[0],
                                    tn * self.tile_mn[1] + slab_mn[1] * self.epi_tile[1],
                                    sVec, vec_buf, slab_mn[0] * self.epi_tile[0], slab_mn[1] * self.epi_tile[1])
            tRS_rOut.store(tRS_rD.load().to(self.c_dtype))
            if cutlass.const_expr(whole):
                cute.copy(copy_r2s, tRS_rOut, tRS_sD[(None, None, None, slab)])
            else:
                # Group `slab // G` of the tile takes buffer set (tiles_done * n_groups + group)
                # % EPI_STAGES; its slabs go out together once the last is in shared memory.
                group = slab // G
                first = group * G
                bufs = buf0 + ((tiles_done * n_groups + group) % EPI_STAGES) * G
                cute.copy(copy_r2s, tRS_rOut, tRS_sD[(None, None, None, bufs + slab - first)])
                if cutlass.const_expr(slab == n_slabs - 1 or slab - first == G - 1):
                    # stmatrix writes are generic-proxy; the TMA store reads via the async proxy.
                    cute.arch.fence_proxy("async.shared", space="cta")
                    self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
                    if is_store_warp:
                        # One lane issues the stores: a TMA instruction executed by the whole
                        # warp is 32 identical bulk copies (measured: no time difference on
                        # the H100, but there is no reason to queue 31 redundant copies).
                        with cute.arch.elect_one():
                            for s in cutlass.range_constexpr(first, slab + 1):
                                cute.copy(tma_d, bSG_sD[(None, bufs + s - first)],
                                          bSG_gD[(None, slab_layout.get_hier_coord(s))])
                            # One bulk group: the wait below leaves this group in flight and
                            # frees the other set's buffers for the next group.
                            store_pipeline.producer_commit()
                            store_pipeline.producer_acquire()
                        if cutlass.const_expr(self.res_tma and slab + RES_SLOTS < n_slabs):
                            # Everyone has read this slab's residual (barrier above): refill its
                            # slot (res_tma runs one slab a group).
                            self._issue_residual_slab(res_tma, tm, tn, wg_idx, slab + RES_SLOTS)
                    self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
        if cutlass.const_expr(whole):
            # stmatrix writes are generic-proxy; the TMA stores read via the async proxy.
            cute.arch.fence_proxy("async.shared", space="cta")
            self._epi_sync(epi_barrier, epi_barrier_wg1, wg_idx)
            if is_store_warp:
                with cute.arch.elect_one():
                    for slab in cutlass.range_constexpr(n_slabs):
                        cute.copy(tma_d, bSG_sD[(None, slab)], bSG_gD[(None, slab_layout.get_hier_coord(slab))])
                    cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def _issue_residual_slab(self, res_tma, tm, tn, wg_idx, slab: int):
        """TMA-load residual slab `slab` of tile (tm, tn) into its smem slot (one whole warp).

        Called by the full warp: the DSL's TMA load elects its issuing lane itself
        (`elect.sync` over all 32 lanes), so calling it from inside `elect_one()` hangs
        (the first GPU run of this path did). Only the expect-tx arrive is elected here."""
        tma_r, mR_tma, sRes, res_full = res_tma
        slot = self._residual_slot(wg_idx, slab)
        gR = cute.local_tile(mR_tma, cute.slice_(self.tile_mnk, (None, None, 0)), (None, None, None))
        tRsR, tRgR = cpasync.tma_partition(
            tma_r, 0, cute.make_layout(1), cute.group_modes(sRes, 0, 2),
            cute.zipped_divide(gR[(None, None, tm, tn, 0)], self.epi_tile),
        )
        bar = res_full + slot
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(bar, self.epi_tile[0] * self.epi_tile[1] * self.c_dtype.width // 8)
        cute.copy(tma_r, tRgR[(None, self._slab_layout().get_hier_coord(slab))], tRsR[(None, slot)], tma_bar_ptr=bar)

    @cute.jit
    def _swiglu(self, rG, rU):
        """rG <- silu(gate) * up with transformers' roundings: both projections rounded to the
        output dtype, silu rounded, the product rounded by the store.

        silu is g * rcp(1 + 2^(-g log2 e)) with the approximate ex2 and rcp (a few ulp of fp32,
        far below the bf16 rounding that follows). The cooperative epilogue does not overlap
        the main loop, so its cost adds to every tile: with expf and an IEEE division the
        fused Llama-3-8B gate/up GEMM ran no faster than the plain GEMM plus a silu * up launch."""
        rG.store(rG.load().to(self.c_dtype).to(cutlass.Float32))
        for v in cutlass.range_constexpr(cute.size(rG)):
            g = rG[v]
            rG[v] = g * cute.arch.rcp_approx(1.0 + cute.math.exp2(g * -_LOG2_E, fastmath=True))
        u = rU.load().to(self.c_dtype).to(cutlass.Float32)
        rG.store(rG.load().to(self.c_dtype).to(cutlass.Float32) * u)

    def _slab_layout(self, tile_n: int | None = None):
        """Epilogue slab index -> (slab row, slab column) in the tile; slabs run along N first."""
        slabs_mn = (self.tile_mn[0] // self.epi_tile[0], (tile_n or self.tile_mn[1]) // self.epi_tile[1])
        return cute.make_layout(slabs_mn, stride=(slabs_mn[1], 1))

    def _residual_slot(self, wg_idx, slab: int):
        """The smem slot of residual slab `slab`: RES_SLOTS per epilogue warpgroup, in turn."""
        if cutlass.const_expr(self.cfg.pingpong):
            return wg_idx * RES_SLOTS + slab % RES_SLOTS
        return slab % RES_SLOTS

    @cute.jit
    def _read_residual_slab(self, res_tma, rR, cD, tiles_done, wg_idx, slab: int, n_slabs: int):
        """Wait for residual slab `slab` and copy this thread's values (slab coordinates cD)
        into rR. Slot j of a warpgroup is filled ceil((n_slabs - j) / RES_SLOTS) times per
        tile, which gives each wait its mbarrier phase. Rows and columns past M and N were
        zero-filled by TMA; their outputs are clipped by the store."""
        _tma_r, _mR, sRes, res_full = res_tma
        j = slab % RES_SLOTS
        slot = self._residual_slot(wg_idx, slab)
        fills = (n_slabs - j + RES_SLOTS - 1) // RES_SLOTS
        cute.arch.mbarrier_wait(res_full + slot, (tiles_done * fills + slab // RES_SLOTS) % 2)
        sR = sRes[(None, None, slot)]
        for v in cutlass.range_constexpr(cute.size(rR)):
            rR[v] = sR[cD[v]]

    @cute.jit
    def epilogue_32bit(
        self, acc, tCcD, sD, box_sD, box_gD, tma_d, mD, mBias, mResidual, mRowScale, mColScale,
        factor, beta, tm, tn, tiles_done, warp_slot,
    ):
        """32-bit outputs (raw int32, fp32): per-warp 16 x 32 boxes -> swizzled smem -> TMA store.

        A wgmma accumulator gives each warp 16 whole rows of every M-step and, per
        8-column group, values (i0, i1) at rows {r, r + 8} and columns {c, c + 1}; a box
        is four such groups of one M-step, 16 values per thread (two groups and 8 values
        in a 16-wide box). The warp owns two buffers: lane 0 waits until the store that last
        read the buffer is done (bulk wait_group.read 1), the warp writes the box (N-major:
        the 128-byte swizzle keeps the 8 rows of a store instruction on distinct banks, one
        8-byte store per pair; swap_ab's M-major box holds a pair's two values 16 elements
        apart: two 4-byte stores), fences the generic-proxy writes for the async proxy,
        and lane 0 issues the store. No warp waits for any other, so a warp's stores
        overlap its neighbours' math. TMA clips the boxes at M and N.
        """
        box_m, box_n = self.epi_tile
        groups_per_box = box_n // 8
        mma_m = cute.size(acc, mode=[1])
        boxes_n = self.tile_mn[1] // box_n
        boxes_per_tile = mma_m * boxes_n
        row0 = tm * self.tile_mn[0]
        col0 = tn * self.tile_mn[1]
        m_last = mD.shape[0] - 1
        n_last = mD.shape[1] - 1
        lane = cute.arch.lane_idx()
        pair = cute.make_rmem_tensor((2,), self.c_dtype)
        for mm in cutlass.range_constexpr(mma_m):
            # The warp's 16-row band of this M-step (warp-uniform).
            band = (tCcD[((0, 0, 0), mm, 0)][0] // box_m) * box_m
            for b in cutlass.range_constexpr(boxes_n):
                buf = warp_slot * EPI_STAGES + (tiles_done * boxes_per_tile + mm * boxes_n + b) % EPI_STAGES
                if lane == 0:
                    cute.arch.cp_async_bulk_wait_group(EPI_STAGES - 1, read=True)
                cute.arch.sync_warp()
                # (1, 2) pieces of the box: a thread's (i0 = 0, 1) pair is one 8-byte store.
                pairs = cute.flat_divide(sD[(None, None, buf)], (1, 2))
                for g in cutlass.range_constexpr(groups_per_box):
                    for i1 in cutlass.range_constexpr(2):
                        m_local, n_local = tCcD[((0, i1, b * groups_per_box + g), mm, 0)]
                        for i0 in cutlass.range_constexpr(2):
                            crd = ((i0, i1, b * groups_per_box + g), mm, 0)
                            if cutlass.const_expr(self.epi.is_identity):
                                pair[i0] = self.c_dtype(acc[crd])
                            else:
                                # Clamped, not predicated: TMA drops what lies past M and N.
                                row = cutlass.min(row0 + m_local, m_last)
                                col = cutlass.min(col0 + n_local + i0, n_last)
                                r = None
                                if cutlass.const_expr(self.epi.residual):
                                    r = mResidual[row, col]
                                rs, cs, bias_v = self._global_operands(row, col, mBias, mRowScale, mColScale)
                                pair[i0] = self.c_dtype(self._epilogue_value(
                                    cutlass.Float32(acc[crd]), rs, cs, bias_v, r, factor, beta))
                        cute.autovec_copy(pair, pairs[(0, None, m_local - band, (n_local - b * box_n) // 2)])
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                if lane == 0:
                    cute.copy(tma_d, box_sD[(None, buf)],
                              box_gD[(None, ((row0 + band) // box_m, (col0 + b * box_n) // box_n, 0))])
                    cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def _epi_sync(self, bar0, bar1, wg_idx):
        if cutlass.const_expr(self.cfg.pingpong):
            if wg_idx == 0:
                bar0.arrive_and_wait()
            else:
                bar1.arrive_and_wait()
        else:
            bar0.arrive_and_wait()

    def _make_r2s_copy(self, tiled_mma):
        atom_r2s = sm90_utils.get_smem_store_op(self.c_layout, elem_ty_d=self.c_dtype, elem_ty_acc=self.acc_dtype)
        if cutlass.const_expr(self.c_dtype.width == 16):
            # stmatrix x4 covers 16 accumulator columns of a warp's 16 rows; an 8-column slab
            # (swap_ab widths of 8 mod 16) takes x2.
            n_mat = 4 if self.epi_tile[1] % 16 == 0 else 2
            atom_c = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(self.c_layout.is_m_major_c(), n_mat),
                                         self.c_dtype)
            atom_r2s = atom_c
        else:
            atom_c = atom_r2s
        return cute.make_tiled_copy_S(atom_r2s, cute.make_tiled_copy_C_atom(atom_c, tiled_mma))

    def _residual_fragment(self, thr_r2s, sD):
        """Registers for one slab of the residual: its 16-bit values in (column) pairs, one Int32
        per pair (see `_load_residual`)."""
        return cute.make_rmem_tensor((cute.size(thr_r2s.partition_S(sD).shape[:3]) // 2,), cutlass.Int32)

    @cute.jit
    def _load_residual(self, rR, cD, mD, mResidual, row0, col0):
        """residual[(row0, col0) + cD[i]] for the slab's values i, as 4-byte column pairs.

        A thread's slab values come in pairs (i, i + 1) at columns (c, c + 1), c even
        (the wgmma accumulator layout). One 4-byte load per pair instead of two 2-byte
        ones halves the load instructions, each of which touches 8 rows (8 L1 wavefronts).
        The host passes a residual with a 16-byte aligned base and 16-byte row strides
        (api.residual_for_kernel; pairs need 4 and an even stride). Rows past M are
        clamped; columns to the last even one,
        (N - 1) & ~1: its pair is (N - 2, N - 1) for even N and (N - 1, padding) for odd N,
        whose rows are padded. Clamped values land in clipped outputs only.
        """
        m_last = mD.shape[0] - 1
        n_pair = (mD.shape[1] - 1) // 2 * 2
        for k in cutlass.range_constexpr(cute.size(rR)):
            m_local, n_local = cD[2 * k]
            crd = (cutlass.min(row0 + m_local, m_last), cutlass.min(col0 + n_local, n_pair))
            addr = (mResidual.iterator + cute.crd2idx(crd, mResidual.layout)).toint()
            # The element address (dynamic column) is only known 2-byte aligned, so an Int32
            # view of it was split back into two 2-byte loads; the column is even (above).
            pair = cute.make_ptr(cutlass.Int32, addr, cute.AddressSpace.gmem, assumed_align=4)
            rR[k] = cute.make_tensor(pair, cute.make_layout(1))[0]

    def _vector_segments(self):
        """(kind, first slot, length) of each staged vector present in the epilogue."""
        tm_, tn_ = self.tile_mn
        segs = []
        if self.epi.row_scale == "vector":
            segs.append(("row", 0, tm_))
        if self.epi.col_scale == "vector":
            segs.append(("col", tm_, tn_))
        if self.epi.bias:
            segs.append(("bias", tm_ + tn_, tn_))
        return segs

    @cute.jit
    def load_vectors(self, mD, mBias, mRowScale, mColScale, sVec, vec_pipeline, cta_coord, clusters_m, clusters_n,
                     splits):
        """Vector-loader warp: each tile's row scales, column scales and bias -> sVec stage.

        It walks the same tile sequence as the consumers and runs up to VEC_STAGES tiles
        ahead, so the epilogue reads these operands from shared memory. Read from global
        memory in the epilogue itself, each slab waited on a load round trip: 5-8% per
        vector on fp8 GEMMs at K = 1600 (H100). Rows and columns past M or N are clamped
        to the last valid one (their results are clipped by the TMA store).
        """
        lane = cute.arch.lane_idx()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, VEC_STAGES)
        total = self._num_work(clusters_m, clusters_n, splits)
        work = cute.arch.block_idx()[2]
        k_tiles = cutlass.Int32(1)
        while work < total:
            tile_work, _split, _kb, _kc, _s = self._work_item(work, clusters_m, clusters_n, splits, k_tiles)
            tm, tn = self._tile_coord(tile_work, clusters_m, clusters_n, cta_coord)
            vec_pipeline.producer_acquire(state)
            for kind, off, length in self._vector_segments():
                src, base, last = mBias, tn * self.tile_mn[1], mD.shape[1] - 1
                if cutlass.const_expr(kind == "row"):
                    src, base, last = mRowScale, tm * self.tile_mn[0], mD.shape[0] - 1
                if cutlass.const_expr(kind == "col"):
                    src = mColScale
                for i in cutlass.range_constexpr(-(-length // 32)):
                    e = i * 32 + lane
                    if e < length:
                        sVec[off + e, state.index] = cutlass.Float32(src[cutlass.min(base + e, last)])
            vec_pipeline.producer_commit(state)
            state.advance()
            work += cute.arch.grid_dim()[2]

    @cute.jit
    def _epilogue_math(self, rD, cD, mD, mBias, rRes, mRowScale, mColScale, factor, beta, row0, col0,
                       sVec, buf, r_tile0, c_tile0):
        """In-register epilogue on one fp32 slab; register i sits at (row0, col0) + cD[i]
        (in the tile: (r_tile0, c_tile0) + cD[i]); its residual (if any) is half i of rRes (pairs).

        Vector operands come from the tile's staged copy in sVec when `stage_vectors`;
        otherwise coordinates are clamped into the matrix instead of predicated: rows
        and columns past M or N read a valid neighbour and are then clipped by the TMA
        store, which keeps the loop branch-free.
        """
        m_last = mD.shape[0] - 1
        n_last = mD.shape[1] - 1
        tm_, tn_ = self.tile_mn
        sV = None
        if cutlass.const_expr(self.stage_vectors):
            sV = sVec[(None, buf)]
        res_vals = None
        if cutlass.const_expr(self.epi.residual):
            res_vals = cute.recast_tensor(rRes, self.c_dtype)  # the pairs' 16-bit halves, in order
        for v in cutlass.range_constexpr(cute.size(rD)):
            m_local, n_local = cD[v]
            r = None
            if cutlass.const_expr(self.epi.residual):
                r = res_vals[v]
            if cutlass.const_expr(self.stage_vectors):
                rs = cs = b = None
                if cutlass.const_expr(self.epi.row_scale == "vector"):
                    rs = sV[r_tile0 + m_local]
                if cutlass.const_expr(self.epi.col_scale == "vector"):
                    cs = sV[tm_ + c_tile0 + n_local]
                if cutlass.const_expr(self.epi.bias):
                    b = sV[tm_ + tn_ + c_tile0 + n_local]
            else:
                rs, cs, b = self._global_operands(cutlass.min(row0 + m_local, m_last),
                                                  cutlass.min(col0 + n_local, n_last), mBias, mRowScale, mColScale)
            rD[v] = self._epilogue_value(rD[v], rs, cs, b, r, factor, beta)

    @cute.jit
    def _global_operands(self, row, col, mBias, mRowScale, mColScale):
        """(row scale, column scale, bias) vectors at (row, col) as fp32, None where absent
        (scalar scales are folded into the epilogue's factor)."""
        rs = cs = b = None
        if cutlass.const_expr(self.epi.row_scale == "vector"):
            rs = cutlass.Float32(mRowScale[row])
        if cutlass.const_expr(self.epi.col_scale == "vector"):
            cs = cutlass.Float32(mColScale[col])
        if cutlass.const_expr(self.epi.bias):
            b = cutlass.Float32(mBias[col])
        return rs, cs, b

    @cute.jit
    def _epilogue_value(self, x, rs, cs, b, res, factor, beta):
        """act(factor * x * rs * cs + b) + beta * res; a None operand is absent. factor is
        alpha times the scalar scales (see `consumer`)."""
        if cutlass.const_expr(self.epi.alpha or self.epi.row_scale == "scalar" or self.epi.col_scale == "scalar"):
            x = x * factor
        if cutlass.const_expr(rs is not None):
            x = x * rs
        if cutlass.const_expr(cs is not None):
            x = x * cs
        if cutlass.const_expr(b is not None):
            x = x + b
        x = self._activation(x)
        if cutlass.const_expr(self.epi.residual):
            r = cutlass.Float32(res)
            if cutlass.const_expr(self.epi.beta):
                r = r * beta
            x = x + r
        return x

    @cute.jit
    def _activation(self, x):
        return epilogue_activation(x, self.epi.activation)
