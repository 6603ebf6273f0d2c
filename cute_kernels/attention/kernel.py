"""FlashAttention forward for Hopper (CuTe DSL, sm_90a).

    O[b, i, h] = softmax(scale * Q[b, i, h] K[b, :, h_kv]^T + mask) V[b, :, h_kv]

A tile is a 128- or 192-row block of queries of one (batch, head), or of one (batch, KV
head) with its query heads packed into the rows; CTAs are persistent (one per
SM, looping over tiles; see `_tiles`) or, with a grid of one CTA per tile, plain. Causal
masking is aligned bottom-right (query i sees keys j <= i + Sk - Sq), as FlashAttention
does; key blocks that are fully masked are never loaded.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import LayoutEnum

from .config import PrefillConfig

_LOG2_E = 1.4426950408889634
# Named barriers _TURN_BARRIER + w (w < num_mma_wg): warpgroup w's turn to issue wgmma;
# _O_BARRIER + w: warpgroup w's threads around its O slot (tma_o).
_TURN_BARRIER = 2
_O_BARRIER = 5
_LN_2 = 0.6931471805599453
# FP8: P = exp2(s - max + _P_SHIFT) in [0, 2^_P_SHIFT], so that e4m3 keeps 2^-14 and up in its
# normal range; the row sums carry the same factor, so O / sum is unchanged, and the LSE
# takes it back out.
_P_SHIFT = 8.0


@dsl_user_op
def _cvt_pair(lo, hi, dtype, *, loc=None, ip=None):
    """Two fp32 values as one bf16x2 / f16x2 word (lo in the low half). The DSL's tensor
    conversion pairs them only for 128-key blocks and falls back to one cvt a value otherwise."""
    kind = "bf16x2" if dtype is cutlass.BFloat16 else "f16x2"
    return cutlass.Int32(llvm.inline_asm(
        cutlass.Int32.mlir_type,
        [cutlass.Float32(hi).ir_value(loc=loc, ip=ip), cutlass.Float32(lo).ir_value(loc=loc, ip=ip)],
        f"cvt.rn.{kind}.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


class FlashAttnFwdSm90:
    """Warp-specialized FlashAttention forward.

    Warp roles (384 threads):
      * warpgroup 0 (producer, 24 registers after setmaxnreg): warp 0 issues the TMA
        loads: the Q block once, then K and V blocks through their own rings, so the
        S = Q K^T of block j can start as soon as K_j lands, while V_j is in flight.
      * warpgroups 1-2 (consumers, 240 registers): each owns 64 query rows. Per key block:
        S = Q K^T (wgmma, both from smem), masking, online softmax in fp32 with exp2 and
        the scale folded into log2 space, P converted to 16-bit in registers, then
        O += P V (wgmma with A from registers). Finally O / rowsum and the LSE; with
        `tma_o` O goes through the warpgroup's own shared-memory slot (stmatrix) and its
        first thread stores the 64 x D block with TMA, waiting for that store to have read
        the slot only when the warpgroup's next tile needs it.

    Pipelines (PipelineTmaAsync): q_pipe (1 stage), k_pipe and v_pipe (`stages` deep);
    empty barriers collect one arrive per consumer warp.

    Scheduling: within a warpgroup, S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued
    together and the softmax of S_j overlaps the second product. With `pingpong`, named
    barriers take turns between the warpgroups (round robin) at every issue point, so one
    warpgroup's softmax runs while the other's GEMMs own the tensor cores (as in
    FlashAttention-3).

    Persistence: the producer warp runs ahead across tiles (the next tile's Q as soon as
    the consumers release the current one after their last Q K^T, then its K/V blocks), so
    the next tile's loads overlap the last P V and the O store of this one. The pipeline
    states and ping-pong turns carry over from tile to tile.

    Causal key ranges (`wg_key_range`): a tile's block count is its last row's; each
    consumer warpgroup computes up to its own rows' last block and then passes over the
    rest (waits on and releases each K/V stage, takes its turns), so the producer's ring
    and the round robin see the same sequence from every warpgroup.

    GQA packing (`pack_gqa`): a tile's rows are (query position, query head) pairs of one KV
    head, head fastest; Q and O move as 5-D TMA boxes ((heads, positions), D, KV head,
    batch), and the causal limit and LSE index take the row's position and head.

    Split-KV (`split_kv`, for grids too small to fill the GPU, e.g. decode): grid z is
    batch x splits, each CTA takes a balanced range of the query block's key blocks and
    writes its own normalised fp32 O and LSE; api.combine_splits merges them.

    FP8 (e4m3 Q, K and V^T, from the input dtype): both products are e4m3 wgmmas; V comes
    transposed with its keys permuted per 32 (fp8_vt.py), P is rounded to e4m3 straight
    into the P V operand registers in the matching order (`_p_fragment_view`), shifted by
    2^_P_SHIFT; the descales fold into the exp2 scale and O's 1 / rowsum (`mScales`).
    """

    def __init__(self, cfg: PrefillConfig, causal: bool, split_kv: bool = False):
        self.head_dim = cfg.head_dim
        # How many of a thread's exp2s run before it waits for the previous P V (None: all).
        # The rest follow the wait, where ptxas interleaves them with O's rescale and P's
        # conversion (the MUFU-bound exp2s leave issue slots free for the FMULs).
        self.exps_before_pv_wait = cfg.exps_before_pv_wait
        self.causal = causal
        # Each consumer warpgroup owns 64 query rows of the tile.
        self.num_mma_wg = cfg.num_mma_wg
        assert cfg.m_block == 64 * cfg.num_mma_wg and cfg.num_mma_wg in (2, 3)
        self.m_block, self.n_block, self.stages = cfg.m_block, cfg.n_block, cfg.stages
        self.pingpong = cfg.pingpong
        # Split-KV partials are fp32 rows of the split's own O: they keep the register stores.
        self.tma_o = cfg.tma_o and not split_kv
        self.wg_key_range = cfg.wg_key_range
        # GQA packing: a tile's rows are (query position, query head of one KV head) pairs,
        # head fastest; positions are rows // pack. Split-KV partials keep one row per head.
        self.pack = cfg.pack_gqa
        assert self.pack == 1 or not split_kv
        # Split-KV (decode): the key blocks of a query block are dealt out to `splits`
        # CTAs (the runtime leading extent of mO); each writes its own normalised fp32 O
        # and LSE, and api.py's combine step merges them with LSE weights.
        self.split_kv = split_kv
        self.num_threads = 128 * (1 + self.num_mma_wg)
        # setmaxnreg budgets: the producer warpgroup and the consumers share 64K registers.
        self.load_regs, self.mma_regs = (24, 240) if self.num_mma_wg == 2 else (24, 160)

    @staticmethod
    def _permute(t: cute.Tensor, order) -> cute.Tensor:
        layout = cute.make_layout(tuple(t.shape[i] for i in order), stride=tuple(t.stride[i] for i in order))
        return cute.make_tensor(t.iterator, layout)

    def _pack_rows(self, t: cute.Tensor) -> cute.Tensor:
        """(s, d, h_q, b) -> ((pack, s), d, h_kv, b): row (i, s) is position s of query head
        h_kv * pack + i (with pack = 1, unchanged)."""
        if cutlass.const_expr(self.pack == 1):
            return t
        p = self.pack
        layout = cute.make_layout(((p, t.shape[0]), t.shape[1], t.shape[2] // p, t.shape[3]),
                                  stride=((t.stride[2], t.stride[0]), t.stride[1], t.stride[2] * p, t.stride[3]))
        return cute.make_tensor(t.iterator, layout)

    def _row_tiler(self, rows: int):
        """The TMA tile of `rows` packed rows by D: whole positions of `pack` heads each."""
        if cutlass.const_expr(self.pack == 1):
            return (rows, self.head_dim)
        return ((self.pack, rows // self.pack), self.head_dim)

    def _pos(self, row):
        """The query position of a (packed) tile row."""
        if cutlass.const_expr(self.pack == 1):
            return row
        return row // self.pack

    def _head(self, h, row):
        """The query head of a (packed) tile row of the tile's head h."""
        if cutlass.const_expr(self.pack == 1):
            return h
        return h * self.pack + row % self.pack

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (b, s_q, h_q, d)
        mK: cute.Tensor,  # (b, s_k, h_kv, d)
        mV: cute.Tensor,  # (b, s_k, h_kv, d)
        mO: cute.Tensor,  # (b, s_q, h_q, d); split_kv: (splits, b, s_q, h_q, d) fp32
        mLSE: cute.Tensor,  # (b, h_q, s_q), fp32; split_kv: (splits, b, h_q, s_q)
        mSeqlensK: cute.Tensor | None,  # (b,) int32: keys in use per sequence (KV cache); None = all
        mSeqlensQ: cute.Tensor | None,  # (b,) int32: query rows per sequence (varlen); None = all
        mScales: cute.Tensor | None,  # FP8: (b, h_kv, 2) fp32, q_descale * k_descale and v_descale
        scale_log2: cutlass.Float32,
        qheads_per_kvhead: cutlass.Int32,
        max_ctas: cutlass.Int32,  # persistent grid: at most one CTA per SM
        heads_per_group: cutlass.Int32,  # tile order: (batch, head) pairs whose K/V share L2
        stream,
    ):
        dtype = mQ.element_type
        self.dtype = dtype
        self.o_dtype = mO.element_type
        # FP8 (e4m3) inputs: wgmma takes 8-bit operands K-major only, so V comes transposed
        # ((b, h_kv, d, s_k), keys contiguous). P stays in registers: see _p_fragment_view.
        self.fp8 = dtype.width == 8
        # Views the TMA helpers want: (rows, d, head, batch); V transposed to (d, s_k, ...).
        q = self._pack_rows(self._permute(mQ, (1, 3, 2, 0)))
        k = self._permute(mK, (1, 3, 2, 0))
        vt = self._permute(mV, (2, 3, 1, 0) if self.fp8 else (3, 1, 2, 0))
        D, mb, nb = self.head_dim, self.m_block, self.n_block
        self.qk_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
            cutlass.Float32, (self.num_mma_wg, 1, 1), tiler_mn=(64, nb),
        )
        v_major = LayoutEnum.ROW_MAJOR if self.fp8 else LayoutEnum.COL_MAJOR
        self.pv_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), v_major.sm90_mma_major_mode(),
            cutlass.Float32, (self.num_mma_wg, 1, 1), tiler_mn=(64, D),
            a_source=warpgroup.OperandSource.RMEM,
        )
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (mb, nb, D), dtype, 1)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (mb, nb, D), dtype, self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(v_major, (mb, D, nb), dtype, self.stages)
        tma_q, tQ = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), q, cute.slice_(sQ_layout, (None, None, 0)), self._row_tiler(mb))
        tma_k, tK = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), k, cute.slice_(sK_layout, (None, None, 0)), (nb, D))
        tma_v, tVt = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), vt, cute.slice_(sV_layout, (None, None, 0)), (D, nb))
        # O: one 64 x D slot per consumer warpgroup, stored by TMA from the (s_q, d, h, b) view.
        # A one-warpgroup P V MMA partitions a slot (each warpgroup's accumulator is 64 x D).
        sO_layout = sm90_utils.make_smem_layout_epi(self.o_dtype, LayoutEnum.ROW_MAJOR, (64, D), self.num_mma_wg)
        tma_o = tO = o_mma = None
        if cutlass.const_expr(self.tma_o):
            o_mma = sm90_utils.make_trivial_tiled_mma(
                dtype, dtype, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), v_major.sm90_mma_major_mode(),
                cutlass.Float32, (1, 1, 1), tiler_mn=(64, D), a_source=warpgroup.OperandSource.RMEM,
            )
            tma_o, tO = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), self._pack_rows(self._permute(mO, (1, 3, 2, 0))),
                cute.slice_(sO_layout, (None, None, 0)), self._row_tiler(64))
        o_elems = cute.cosize(sO_layout) if self.tma_o else 8  # no O slots: a placeholder

        @cute.struct
        class SharedStorage:
            q_bar: cute.struct.MemRange[cutlass.Int64, 2]
            k_bar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            v_bar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[self.o_dtype, o_elems], 1024]

        self.shared_storage = SharedStorage
        bz = mQ.shape[0]
        if cutlass.const_expr(self.split_kv):
            bz = mQ.shape[0] * mO.shape[0]
        num_tiles = cute.ceil_div(mQ.shape[1] * self.pack, mb) * (mQ.shape[2] // self.pack) * bz
        grid = (cutlass.min(num_tiles, max_ctas), 1, 1)
        self.kernel(
            tma_q, tQ, tma_k, tK, tma_v, tVt, tma_o, tO, mO, mLSE, mSeqlensK, mSeqlensQ, mScales, scale_log2,
            qheads_per_kvhead, heads_per_group, self.qk_mma, self.pv_mma, o_mma, sQ_layout, sK_layout, sV_layout,
            sO_layout,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    # ------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(
        self, tma_q, tQ, tma_k, tK, tma_v, tVt, tma_o, tO, mO, mLSE, mSeqlensK: cute.Tensor | None,
        mSeqlensQ: cute.Tensor | None, mScales: cute.Tensor | None, scale_log2, qheads_per_kvhead, heads_per_group,
        qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, o_mma: cute.TiledMma | None,
        sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * 4)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0)))
        kv_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
        q_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.q_bar.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=q_bytes, defer_sync=True)
        k_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.k_bar.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=kv_bytes, defer_sync=True)
        v_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.v_bar.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=kv_bytes, defer_sync=True)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sO = None
        if cutlass.const_expr(self.tma_o):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

        tiles = self._tiles(mO, heads_per_group)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.load_regs)
            if warp_idx == 0:
                self.load(tma_q, tQ, tma_k, tK, tma_v, tVt, sQ, sK, sV, q_pipe, k_pipe, v_pipe,
                          mSeqlensK, mSeqlensQ, qheads_per_kvhead, tiles)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            self.mma(qk_mma, pv_mma, o_mma, sQ, sK, sV, sO, tma_o, tO, q_pipe, k_pipe, v_pipe, mO, mLSE, mSeqlensK,
                     mSeqlensQ, mScales, scale_log2, qheads_per_kvhead, tiles, tK.shape[0])

    # ------------------------------------------------------------------ tile schedule
    @cute.jit
    def _tiles(self, mO, heads_per_group):
        """Static persistent schedule: in round k, CTA c takes tile k * grid + c (causal:
        every other round runs backwards, k * grid + grid - 1 - c, so that a CTA that drew
        a long tile draws a short one next).

        A tile is (query block, head, batch[, split]). Tiles are ordered in groups of
        `heads_per_group` (batch, head) pairs, chosen by the host so that one group's K and
        V stay in L2 while the tiles in flight walk it. Non-causal: the query block varies
        fastest (the tiles in flight share K and V). Causal: the query block varies slowest
        and descends, longest tiles first, so the short ones fill the tail.
        With a grid of one CTA per tile (max_ctas >= tiles) this is a plain launch.
        """
        n_heads, s_q_max, n_bz, splits = mO.shape[2], mO.shape[1], mO.shape[0], 1
        if cutlass.const_expr(self.split_kv):  # mO: (splits, b, s_q, h_q, d)
            n_heads, s_q_max, n_bz, splits = mO.shape[3], mO.shape[2], mO.shape[0] * mO.shape[1], mO.shape[0]
        n_heads = n_heads // self.pack  # packed: a tile's head is a KV head
        n_m = cute.ceil_div(s_q_max * self.pack, self.m_block)
        n_hz = n_heads * n_bz
        return (cute.arch.block_idx()[0], cute.arch.grid_dim()[0], n_m * n_hz, n_m, n_heads, n_hz, heads_per_group,
                s_q_max, splits)

    @cute.jit
    def _tile_index(self, k, tiles):
        """Round k's tile for this CTA (>= the tile count when it has none)."""
        first, step = tiles[0], tiles[1]
        t = k * step + first
        if cutlass.const_expr(self.causal):
            if k % 2 == 1:
                t = k * step + step - 1 - first
        return t

    @cute.jit
    def _tile_coord(self, t, tiles, mSeqlensK, mSeqlensQ, s_k_max):
        """Tile t -> (query block, head, batch, split, s_q, s_k, first key block, key blocks)."""
        _, _, _, n_m, n_heads, n_hz, group, s_q_max, splits = tiles
        per_group = n_m * group
        g = t // per_group
        r = t - g * per_group
        g_size = cutlass.min(group, n_hz - g * group)
        m_idx = r % n_m
        hz = g * group + r // n_m
        if cutlass.const_expr(self.causal):
            m_idx = n_m - 1 - r // g_size
            hz = g * group + r % g_size
        h = hz % n_heads
        b = hz // n_heads
        split = 0
        if cutlass.const_expr(self.split_kv):
            split = b % splits
            b = b // splits
        s_q = s_q_max
        s_k = s_k_max
        if cutlass.const_expr(mSeqlensK is not None):
            # KV cache: only the first cache_seqlens[b] keys are valid; later blocks are
            # never loaded and the tail of the last one is masked like any ragged end.
            s_k = mSeqlensK[b]
        if cutlass.const_expr(mSeqlensQ is not None):
            # Ragged queries: rows past s_q are neither computed into the causal offset
            # nor written.
            s_q = mSeqlensQ[b]
        # Split-KV deals the query block's key blocks out in balanced ranges (an empty
        # range writes O = 0, LSE = -inf).
        n_total = self._n_blocks(m_idx, s_q, s_k)
        j_begin = split * n_total // splits
        n_blocks = (split + 1) * n_total // splits - j_begin
        return m_idx, h, b, split, s_q, s_k, j_begin, n_blocks

    @cute.jit
    def _n_blocks(self, m_idx, s_q, s_k):
        """Key blocks this query block attends to (causal: up to the diagonal, bottom-right)."""
        n_end = s_k
        if cutlass.const_expr(self.causal):  # the tile's last position + 1, shifted
            n_end = cutlass.min(s_k, self._pos((m_idx + 1) * self.m_block - 1) + 1 + s_k - s_q)
        return cutlass.max(cute.ceil_div(n_end, self.n_block), 0)

    @cute.jit
    def load(self, tma_q, tQ, tma_k, tK, tma_v, tVt, sQ, sK, sV, q_pipe, k_pipe, v_pipe, mSeqlensK, mSeqlensQ,
             qheads_per_kvhead, tiles):
        """Producer warp: per tile, Q once, then K_j and V_j for each of its key blocks.

        It runs ahead across tiles: the next tile's Q is loaded as soon as the consumers
        have issued their last Q K^T of the current one, and its first K/V blocks fill
        the ring while they finish the last P V and store O.
        """
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for k in range(cute.ceil_div(tiles[2], tiles[1])):
            t = self._tile_index(k, tiles)
            m_idx, h, b, split, s_q, s_k, j_begin, n_blocks = self._tile_coord(
                cutlass.min(t, tiles[2] - 1), tiles, mSeqlensK, mSeqlensQ, tK.shape[0])
            if t >= tiles[2]:
                n_blocks = 0
            h_kv = h if cutlass.const_expr(self.pack > 1) else h // qheads_per_kvhead
            gQ = cute.local_tile(tQ[(None, None, h, b)], (self.m_block, self.head_dim), (m_idx, 0))
            gK = cute.local_tile(tK[(None, None, h_kv, b)], (self.n_block, self.head_dim), (None, 0))
            gV = cute.local_tile(tVt[(None, None, h_kv, b)], (self.head_dim, self.n_block), (0, None))
            tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                             cute.group_modes(gQ, 0, 2))
            tKs, tKg = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                             cute.group_modes(gK, 0, 2))
            tVs, tVg = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                             cute.group_modes(gV, 0, 2))
            if n_blocks > 0:
                q_pipe.producer_acquire(q_state)
                cute.copy(tma_q, tQg, tQs[(None, 0)], tma_bar_ptr=q_pipe.producer_get_barrier(q_state))
                q_state.advance()
            for jj in range(n_blocks):
                j = j_begin + jj
                k_pipe.producer_acquire(k_state)
                cute.copy(tma_k, tKg[(None, j)], tKs[(None, k_state.index)], tma_bar_ptr=k_pipe.producer_get_barrier(k_state))
                k_state.advance()
                v_pipe.producer_acquire(v_state)
                cute.copy(tma_v, tVg[(None, j)], tVs[(None, v_state.index)], tma_bar_ptr=v_pipe.producer_get_barrier(v_state))
                v_state.advance()
        q_pipe.producer_tail(q_state)
        k_pipe.producer_tail(k_state)
        v_pipe.producer_tail(v_state)

    @cute.jit
    def mma(self, qk_mma, pv_mma, o_mma, sQ, sK, sV, sO, tma_o, tO, q_pipe, k_pipe, v_pipe, mO, mLSE, mSeqlensK,
            mSeqlensQ, mScales, scale_log2, qheads_per_kvhead, tiles, s_k_max):
        """Consumer warpgroups: S = QK^T, online softmax, O += PV, then normalise and store.

        Software-pipelined within the warpgroup (as FlashAttention-3 does): S_j = Q K_j^T
        and O += P_{j-1} V_{j-1} are issued back to back, and the softmax of S_j runs on
        the CUDA cores while the tensor cores still work on P_{j-1} V_{j-1}. O is only
        rescaled once that product has landed. The tile loop (see `_tiles`) carries the
        pipeline states and the ping-pong turns from one tile to the next.
        """
        tidx = cute.arch.thread_idx()[0] - 128
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        qk_wg = qk_mma.get_slice(wg_idx * 128)
        pv_wg = pv_mma.get_slice(wg_idx * 128)
        tSrQ = qk_mma.make_fragment_A(qk_wg.partition_A(sQ))
        tSrK = qk_mma.make_fragment_B(qk_wg.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(pv_wg.partition_B(sV))
        acc_s = cute.make_rmem_tensor(qk_wg.partition_shape_C((self.m_block, self.n_block)), cutlass.Float32)
        acc_o = cute.make_rmem_tensor(pv_wg.partition_shape_C((self.m_block, self.head_dim)), cutlass.Float32)
        # Per-thread coordinates need this thread's slice (the warpgroup slice is thread 0's).
        tScS = qk_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((self.m_block, self.n_block)))
        tOcO = pv_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((self.m_block, self.head_dim)))
        # acc_o is zero-filled and rescaled in registers, so every P V wgmma accumulates
        # (the field defaults to overwrite, which would keep only the last 16 keys).
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        if cutlass.const_expr(self.fp8):
            # The e4m3 A fragment of P V, filled from the fp32 scores through a permuted view
            # (see _p_fragment_view), so no byte moves between threads.
            rP = cute.make_rmem_tensor(pv_wg.partition_shape_A((self.m_block, self.n_block)), self.dtype)
            tOrP = rP
        else:
            rP = cute.make_rmem_tensor(acc_s.shape, self.dtype)
            tOrP = cute.make_tensor(rP.iterator, self._acc_to_a_layout(rP.layout))

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        # Ping-pong turns: warpgroup w waits on barrier _TURN_BARRIER + w before issuing and
        # then arrives on the next warpgroup's (round robin). Every wait pairs with exactly
        # one arrive: per tile the last warpgroup pre-arrives once so warpgroup 0 goes first,
        # and skips its very last arrive.
        for k in range(cute.ceil_div(tiles[2], tiles[1])):
            t = self._tile_index(k, tiles)
            m_idx, h, b, split, s_q, s_k, j_begin, n_blocks = self._tile_coord(
                cutlass.min(t, tiles[2] - 1), tiles, mSeqlensK, mSeqlensQ, s_k_max)
            if t >= tiles[2]:  # no tile this round: nothing computed, nothing stored
                n_blocks = 0
                s_q = 0
            sl2 = scale_log2
            v_scale = cutlass.Float32(1.0)
            if cutlass.const_expr(self.fp8):
                h_kv = h if cutlass.const_expr(self.pack > 1) else h // qheads_per_kvhead
                sl2 = scale_log2 * mScales[b, h_kv, 0]
                v_scale = mScales[b, h_kv, 1]
            # A 64xN wgmma accumulator holds, per thread, rows r and r+8 of its quad:
            # flat index v = col_pair + 2 * row_half + 4 * col_group. The running max and sum
            # of those two rows are loop-carried scalars (m0, m1, l0, l1).
            m0, m1 = cutlass.Float32(-cutlass.Float32.inf), cutlass.Float32(-cutlass.Float32.inf)
            l0, l1 = cutlass.Float32(0.0), cutlass.Float32(0.0)
            acc_o.fill(0.0)
            row0 = m_idx * self.m_block
            causal_shift = s_k - s_q
            last_wg = wg_idx == self.num_mma_wg - 1
            # This warpgroup's first row, and the key blocks its 64 rows attend to.
            wrow0 = row0 + 64 * wg_idx
            n_mine = n_blocks
            if cutlass.const_expr(self.causal and self.wg_key_range and self.num_mma_wg > 1):
                end = cutlass.min(s_k, self._pos(wrow0 + 63) + 1 + causal_shift)
                n_mine = cutlass.max(cutlass.min(cute.ceil_div(end, self.n_block) - j_begin, n_blocks), 0)
                if wrow0 >= s_q * self.pack:
                    n_mine = 0
            if n_blocks > 0:
                if cutlass.const_expr(self.pingpong):
                    if last_wg:  # the last warpgroup lets the first go
                        cute.arch.barrier_arrive(barrier_id=_TURN_BARRIER, number_of_threads=256)
                q_pipe.consumer_wait(q_state)
            if n_mine == 0 and n_blocks > 0:
                # Nothing of this tile to compute: release Q and take the turn that the last
                # P V would have taken (its blocks are passed over below).
                q_pipe.consumer_release(q_state)
                q_state.advance()
                self._wait_turn(wg_idx)
                self._pass_turn(wg_idx)
            if n_mine > 0:
                # ---- block 0: S_0, softmax, P_0 (nothing to overlap with yet)
                k_pipe.consumer_wait(k_state)
                self._wait_turn(wg_idx)
                self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, k_state.index)
                self._pass_turn(wg_idx)
                warpgroup.wait_group(0)
                k_pipe.consumer_release(k_state)
                k_state.advance()
                self._mask(acc_s, tScS, j_begin * self.n_block, row0, wrow0, s_k, causal_shift)
                m0, m1, l0, l1, corr0, corr1 = self._online_softmax(acc_s, m0, m1, l0, l1, sl2)
                self._store_p(acc_s, rP)
                for j in range(1, n_mine):
                    # ---- issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}
                    k_pipe.consumer_wait(k_state)
                    v_pipe.consumer_wait(v_state)
                    self._wait_turn(wg_idx)
                    self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, k_state.index)
                    self._issue_pv(pv_mma, acc_o, tOrP, tOrV, v_state.index)
                    self._pass_turn(wg_idx)
                    # ---- softmax of S_j while P_{j-1} V_{j-1} runs
                    warpgroup.wait_group(1)
                    k_pipe.consumer_release(k_state)
                    k_state.advance()
                    self._mask(acc_s, tScS, (j_begin + j) * self.n_block, row0, wrow0, s_k, causal_shift)
                    m0, m1, ref0, ref1, corr0, corr1 = self._row_max(acc_s, m0, m1, sl2)
                    n_early = cute.size(acc_s) if self.exps_before_pv_wait is None else self.exps_before_pv_wait
                    l0, l1 = self._exps(acc_s, 0, n_early, ref0, ref1, l0 * corr0, l1 * corr1, sl2)
                    # ---- P_{j-1} V_{j-1} landed: rescale O to the new max, P_j replaces P_{j-1}
                    if s_k > 0:  # always true: a basic-block boundary that keeps ptxas from hoisting the wait
                        warpgroup.wait_group(0)
                        l0, l1 = self._exps(acc_s, n_early, cute.size(acc_s), ref0, ref1, l0, l1, sl2)
                        for v in cutlass.range_constexpr(cute.size(acc_o)):
                            acc_o[v] = acc_o[v] * (corr0 if (v // 2) % 2 == 0 else corr1)
                        self._store_p(acc_s, rP)
                    v_pipe.consumer_release(v_state)
                    v_state.advance()
                # Every Q K^T of this tile has completed: the producer may load the next Q.
                q_pipe.consumer_release(q_state)
                q_state.advance()
                # ---- last block's P V
                v_pipe.consumer_wait(v_state)
                self._wait_turn(wg_idx)
                self._issue_pv(pv_mma, acc_o, tOrP, tOrV, v_state.index)
                # The tile's very last turn is the last warpgroup's; the first warpgroup's next
                # turn is the next tile's (its pre-arrive).
                if not last_wg or n_mine < n_blocks:
                    self._pass_turn(wg_idx)
                warpgroup.wait_group(0)
                v_pipe.consumer_release(v_state)
                v_state.advance()
            # ---- the tile's key blocks past this warpgroup's rows: wait for each stage to
            # fill before releasing it (an early arrive would count toward its previous phase).
            for jj in range(n_mine, n_blocks):
                k_pipe.consumer_wait(k_state)
                k_pipe.consumer_release(k_state)
                k_state.advance()
                v_pipe.consumer_wait(v_state)
                v_pipe.consumer_release(v_state)
                v_state.advance()
                self._wait_turn(wg_idx)
                if not last_wg or jj < n_blocks - 1:
                    self._pass_turn(wg_idx)

            # ---- normalise, write O and the LSE
            sums = [l0, l1]
            maxes = [m0, m1]
            inv = [None, None]
            for half in cutlass.range_constexpr(2):
                tot = sums[half]  # this thread's part of the row: add the quad's other three
                tot = tot + cute.arch.shuffle_sync_bfly(tot, offset=1)
                tot = tot + cute.arch.shuffle_sync_bfly(tot, offset=2)
                sums[half] = tot
                # Rows with nothing to attend to (sum 0) produce zeros, not NaN.
                inv[half] = cutlass.select_(tot > 0.0, v_scale / cutlass.max(tot, cutlass.Float32(1e-30)),
                                            cutlass.Float32(0.0))
            if cutlass.const_expr(self.split_kv):
                for v in cutlass.range_constexpr(cute.size(acc_o)):
                    r_o, c_o = tOcO[v]
                    if row0 + r_o < s_q:
                        mO[split, b, row0 + r_o, h, c_o] = acc_o[v] * inv[(v // 2) % 2]
            else:
                rO = cute.make_rmem_tensor(acc_o.shape, self.o_dtype)
                rO32 = cute.recast_tensor(rO, cutlass.Int32)
                for v in cutlass.range_constexpr(cute.size(rO32)):
                    f = inv[v % 2]  # word v holds columns (2c, 2c + 1) of row half v % 2
                    rO32[v] = _cvt_pair(acc_o[2 * v] * f, acc_o[2 * v + 1] * f, self.o_dtype)
                if cutlass.const_expr(self.tma_o):
                    if wrow0 + 64 <= s_q * self.pack:
                        self._store_o_tma(rO, o_mma, sO, tma_o, tO, tidx, wg_idx, m_idx, h, b)
                    else:
                        self._store_o_rows(rO, tOcO, mO, b, h, row0, s_q)
                elif row0 + self.m_block <= s_q and cutlass.const_expr(self.pack == 1):
                    # A full tile: each thread's column pairs go out as 4-byte stores.
                    gO = cute.local_tile(mO[b, None, h, None], (self.m_block, self.head_dim), (m_idx, 0))
                    cute.autovec_copy(rO, pv_mma.get_slice(tidx).partition_C(gO))
                else:
                    self._store_o_rows(rO, tOcO, mO, b, h, row0, s_q)
            r0, c0 = tOcO[0]
            if c0 == 0:  # one thread of each quad writes its two rows' LSE
                for half in cutlass.range_constexpr(2):
                    lrow = row0 + r0 + 8 * half
                    if lrow < s_q * self.pack:
                        log2_sum = cute.math.log2(cutlass.max(sums[half], cutlass.Float32(1e-30)), fastmath=True)
                        if cutlass.const_expr(self.fp8):
                            log2_sum = log2_sum - _P_SHIFT
                        lse = (maxes[half] * sl2 + log2_sum) * _LN_2
                        lse = cutlass.select_(sums[half] > 0.0, lse, -cutlass.Float32.inf)
                        if cutlass.const_expr(self.split_kv):
                            mLSE[split, b, h, lrow] = lse
                        else:
                            mLSE[b, self._head(h, lrow), self._pos(lrow)] = lse
        if cutlass.const_expr(self.tma_o):
            if tidx % 128 == 0:  # the slots must outlive the last stores' reads
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _store_o_rows(self, rO, tOcO, mO, b, h, row0, s_q):
        """This thread's values of O, element by element, in rows before s_q only (a ragged tile)."""
        for v in cutlass.range_constexpr(cute.size(rO)):
            r_o, c_o = tOcO[v]
            row = row0 + r_o
            if row < s_q * self.pack:
                mO[b, self._pos(row), self._head(h, row), c_o] = rO[v]

    @cute.jit
    def _store_o_tma(self, rO, o_mma, sO, tma_o, tO, tidx, wg_idx, m_idx, h, b):
        """This warpgroup's 64 x D block of O: registers -> its slot (stmatrix) -> global (TMA,
        issued by the warpgroup's first thread, which also owns the wait on its last store)."""
        first = tidx % 128 == 0
        if first:  # the store from this slot one tile ago has read it by now, almost always
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.barrier(barrier_id=_O_BARRIER + wg_idx, number_of_threads=128)
        r2s = cute.make_tiled_copy_C(
            sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, self.o_dtype, cutlass.Float32), o_mma)
        thr = r2s.get_slice(tidx % 128)
        sO_wg = sO[(None, None, wg_idx)]
        cute.copy(r2s, thr.retile(rO), thr.partition_D(sO_wg))
        # stmatrix writes through the generic proxy; TMA reads through the async one.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=_O_BARRIER + wg_idx, number_of_threads=128)
        if first:
            gO = cute.local_tile(tO[(None, None, h, b)], (64, self.head_dim), (None, 0))
            tOs, tOg = cpasync.tma_partition(tma_o, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
                                             cute.group_modes(gO, 0, 2))
            cute.copy(tma_o, tOs[(None, wg_idx)], tOg[(None, m_idx * self.num_mma_wg + wg_idx)])
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def _wait_turn(self, wg_idx):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=_TURN_BARRIER + wg_idx, number_of_threads=256)

    @cute.jit
    def _pass_turn(self, wg_idx):
        if cutlass.const_expr(self.pingpong):
            nxt = (wg_idx + 1) % self.num_mma_wg
            cute.arch.barrier_arrive(barrier_id=_TURN_BARRIER + nxt, number_of_threads=256)

    @cute.jit
    def _issue_qk(self, qk_mma, acc_s, tSrQ, tSrK, stage):
        """S = Q K^T into acc_s (overwrites), issued and committed, not waited on."""
        qk_mma.set(warpgroup.Field.ACCUMULATE, False)
        warpgroup.fence()
        # The stage is sliced off first, so each k-block's descriptor is a 64-bit add to the
        # stage's (UIADD3.64); indexing (kb, stage) at once rebuilt both halves before every
        # wgmma (UMOV + ULOP3 pairs: 11 of the D = 64 main loop's 570 SASS instructions).
        rQ, rK = tSrQ[(None, None, None, 0)], tSrK[(None, None, None, stage)]
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(qk_mma, acc_s, rQ[(None, None, kb)], rK[(None, None, kb)], acc_s)
            qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

    @cute.jit
    def _issue_pv(self, pv_mma, acc_o, tOrP, tOrV, stage):
        """O += P V with P from registers: the S accumulator of a 64xN wgmma, split into
        16-column k-blocks, is exactly the A fragment layout (FP8: 32-key blocks, keys
        permuted, see _p_fragment_view)."""
        warpgroup.fence()
        rV = tOrV[(None, None, None, stage)]
        for kb in cutlass.range_constexpr(cute.size(tOrV, mode=[2])):
            cute.gemm(pv_mma, acc_o, tOrP[(None, None, kb)], rV[(None, None, kb)], acc_o)
        warpgroup.commit_group()

    @cute.jit
    def _mask(self, acc_s, tScS, col0, row0, wrow0, s_k, causal_shift):
        """-inf where a key is past s_k (TMA zero-filled it) or, if causal, past the diagonal.

        Only blocks that straddle a boundary pay for it: the test is uniform across the
        warpgroup (it uses the warpgroup's first row wrow0, whose causal limit is the
        smallest; tScS rows count from the tile's first row, row0).
        """
        limit0 = s_k
        if cutlass.const_expr(self.causal):
            limit0 = cutlass.min(s_k, self._pos(wrow0) + causal_shift + 1)
        if col0 + self.n_block > limit0:
            for v in cutlass.range_constexpr(cute.size(acc_s)):
                r, c = tScS[v]
                limit = s_k
                if cutlass.const_expr(self.causal):
                    limit = cutlass.min(s_k, self._pos(row0 + r) + causal_shift + 1)
                acc_s[v] = cutlass.select_(col0 + c < limit, acc_s[v], -cutlass.Float32.inf)

    @cute.jit
    def _online_softmax(self, acc_s, m0, m1, l0, l1, scale_log2):
        """acc_s (scores) -> unnormalised probabilities in place; returns the new running
        max and sum of the thread's two rows and the factors that rescale the old O."""
        mx0, mx1, ref0, ref1, c0, c1 = self._row_max(acc_s, m0, m1, scale_log2)
        s0, s1 = self._exps(acc_s, 0, cute.size(acc_s), ref0, ref1, l0 * c0, l1 * c1, scale_log2)
        return mx0, mx1, s0, s1, c0, c1

    @cute.jit
    def _row_max(self, acc_s, m0, m1, scale_log2):
        """New running max of the thread's two rows, the exp2 reference (max in log2 units)
        and the factors that rescale the old sum and O."""
        neg_inf = -cutlass.Float32.inf
        mx0, mx1 = m0, m1
        for v in cutlass.range_constexpr(cute.size(acc_s)):
            if cutlass.const_expr((v // 2) % 2 == 0):
                mx0 = cute.arch.fmax(mx0, acc_s[v])
            else:
                mx1 = cute.arch.fmax(mx1, acc_s[v])
        # The four threads of a quad hold the rest of each row.
        mx0 = cute.arch.fmax(mx0, cute.arch.shuffle_sync_bfly(mx0, offset=1))
        mx0 = cute.arch.fmax(mx0, cute.arch.shuffle_sync_bfly(mx0, offset=2))
        mx1 = cute.arch.fmax(mx1, cute.arch.shuffle_sync_bfly(mx1, offset=1))
        mx1 = cute.arch.fmax(mx1, cute.arch.shuffle_sync_bfly(mx1, offset=2))
        # Rows with every key masked so far keep max -inf: use 0 as the reference so
        # exp2(-inf - 0) = 0 rather than NaN. The reference is then finite, so an old max of
        # -inf rescales by exp2(-inf) = 0 with no test of its own (scale_log2 > 0: the host
        # rejects other scales).
        ref0 = cutlass.select_(mx0 == neg_inf, cutlass.Float32(0.0), mx0 * scale_log2)
        ref1 = cutlass.select_(mx1 == neg_inf, cutlass.Float32(0.0), mx1 * scale_log2)
        c0 = cute.math.exp2(m0 * scale_log2 - ref0, fastmath=True)
        c1 = cute.math.exp2(m1 * scale_log2 - ref1, fastmath=True)
        if cutlass.const_expr(self.fp8):
            ref0, ref1 = ref0 - _P_SHIFT, ref1 - _P_SHIFT
        return mx0, mx1, ref0, ref1, c0, c1

    @cute.jit
    def _exps(self, acc_s, lo: cutlass.Constexpr, hi: cutlass.Constexpr, ref0, ref1, s0, s1, scale_log2):
        """Scores lo..hi-1 -> exp2(score * scale - reference) in place, added to the row sums."""
        for v in cutlass.range_constexpr(lo, hi):
            p = cute.arch.exp2(acc_s[v] * scale_log2 - (ref0 if (v // 2) % 2 == 0 else ref1))
            if cutlass.const_expr((v // 2) % 2 == 0):
                s0 = s0 + p
            else:
                s1 = s1 + p
            acc_s[v] = p
        return s0, s1

    @cute.jit
    def _store_p(self, acc_s, rP):
        """P (the probabilities in acc_s) into the register A operand of the next P V: for
        FP8, rounded to e4m3 in the permuted order of _p_fragment_view."""
        if cutlass.const_expr(self.fp8):
            view = cute.make_tensor(acc_s.iterator, self._p_fragment_view(acc_s.layout))
            rP.store(view.load().to(self.dtype))
        else:
            rP32 = cute.recast_tensor(rP, cutlass.Int32)
            for v in cutlass.range_constexpr(cute.size(rP32)):
                rP32[v] = _cvt_pair(acc_s[2 * v], acc_s[2 * v + 1], self.dtype)

    @staticmethod
    def _p_fragment_view(layout):
        """((2, 2, N/8), M, 1) fp32 accumulator -> ((4, 2, 2), M, N/32), the e4m3 A fragment
        of a k32 wgmma. A thread's A values are keys 4t..4t+3 and 16+4t..16+4t+3 of each
        32-key block, its accumulator columns 2t, 2t+1 of each 8-column group. Reading the
        accumulator as columns (2t, 2t+1, 8+2t, 9+2t | 16+2t, .., 25+2t) makes A's key k
        the score column pi(k) = 16 (k // 16) + 8 ((k % 4) // 2) + 2 ((k % 16) // 4) + k % 2,
        with no byte crossing threads; V^T's keys come permuted by the same pi
        (fp8_vt.vt_fp8), so the product is unchanged."""
        m_mode = layout.shape[1]
        n8 = layout.shape[0][2]
        return cute.make_layout((((2, 2), 2, 2), m_mode, n8 // 4), stride=(((1, 4), 2, 8), 4 * n8, 16))

    @staticmethod
    def _acc_to_a_layout(layout):
        """((2, 2, N/8), M, 1) accumulator -> ((2, 2, 2), M, N/16) register-A fragment."""
        m_mode = layout.shape[1]
        n8 = layout.shape[0][2]
        return cute.make_layout(((2, 2, 2), m_mode, n8 // 2), stride=((1, 2, 4), 4 * n8, 8))
