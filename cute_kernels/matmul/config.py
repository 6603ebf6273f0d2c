"""GEMM tile/cluster configuration: one frozen dataclass, one validity check, and the shared
memory / epilogue geometry a config implies (what the kernel compiles from). The heuristic
that picks a config per problem shape lives in `heuristics.py`: it changes what runs, not how
a config compiles, so it is outside the tuning cache's source hash."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..runtime import hardware

# Hopper: 227 KiB of shared memory per block (the opt-in maximum on sm_90).
SM90_SMEM_BYTES = 232448
H100_SMS = hardware.H100_SXM.sms  # what the heuristics were tuned on (runtime/hardware.py)
# Clusters of each size that can be resident at once (cudaOccupancyMaxActiveClusters on the
# H100 SXM, one CTA per SM): the GPCs' SM counts are not multiples of 4 or 8, so clusters of
# 4 cover 120 SMs and clusters of 8 cover 120, not 132. A persistent grid larger than this
# runs its last clusters as a second wave (64x64 c2x2 at 128x4096x4096: 0.61x cuBLAS with 33
# clusters vs 0.89x unclustered, same run).
MAX_ACTIVE_CLUSTERS = {1: 132, 2: 66, 4: 30, 8: 15}


@dataclass(frozen=True)
class GemmConfig:
    """Static shape of one compiled GEMM kernel.

    tile_m x tile_n is the CTA tile; tile K is 64 for 16-bit and 128 for 8-bit inputs
    (four wgmma instructions, one 128-byte swizzle row). cluster_m x cluster_n CTAs
    form a cluster: CTAs along M share (multicast) the B tile, along N the A tile.
    group is the width, in clusters, of the swizzled raster band that keeps the tiles
    running at one time close together so their A/B panels are reused from L2.
    pingpong gives each consumer warpgroup whole tiles of its own (alternating), so
    one's epilogue overlaps the other's main loop; otherwise both cooperate on a tile.
    promote (FP8 "2xAcc"): each 128-deep k-tile accumulates into a fresh register
    tile that is then added into an fp32 main accumulator, because Hopper's fp8 wgmma
    keeps fewer accumulator bits than fp32 and long K sums would lose precision.
    split_k > 1 (split-K): the k-tiles of each output tile in the persistent grid's last,
    partial wave (every tile, when the grid fits one wave; `split_tail_tiles`) are dealt
    out in split_k contiguous, balanced ranges; each (tile, range) is a work item of its
    own, and the last of a tile's splits to finish adds the others' fp32 (int32 for int8)
    partial sums from a workspace and runs the fused epilogue, in the same launch. The
    tiles of whole waves before it run unsplit.
    The kernel is compiled once for "split or not"; the split count is a runtime value.
    swap_ab: the launch computes D^T = B A^T. The kernel's M runs along N (the weight's
    rows, 64, 128, 192 or 256 a tile) and its N along the tokens, so a token count M is padded to a
    multiple of tile_n (16..256 in steps of 16) instead of 64 / 128 rows: M = 273 runs as
    3 x 96 = 288 rather than 3 x 128 = 384. D is stored M-major (transposed stmatrix, or
    M-major per-warp boxes for 32-bit outputs; TMA). Epilogues without bias, residual or
    SwiGLU (`swap_supported`).
    stages: depth of the A/B shared-memory ring; None takes as many as fit, up to
    MAX_AB_STAGES (block-scaled FP8 at most 8: its scales ride in the stages).
    whole_tile_epi (cooperative, 16-bit outputs): the epilogue stages every slab of the tile
    in its own smem buffer and synchronizes once before the TMA stores, instead of two
    barriers and a wait for the store to read its buffer per slab (13 slabs at widths of 8
    mod 16). It costs tile_m x tile_n x 2 bytes of shared memory, often one A/B stage.
    None (default): `whole_tile_epilogue` decides; True / False force it.
    tile_m = 192 (16-bit, cooperative, unsplit, tile_n <= 192) runs three consumer warpgroups
    of 64 rows; the heuristic picks it only as swap_ab weight tiles on weights whose rows
    divide by 192 (docs/gemm.md, "192-row tiles").
    """

    tile_m: int = 128
    tile_n: int = 256
    cluster_m: int = 2
    cluster_n: int = 1
    group: int = 8
    raster_m: bool = True
    pingpong: bool = False
    promote: bool = False
    split_k: int = 1
    swap_ab: bool = False
    stages: int | None = None
    whole_tile_epi: bool | None = None

    @property
    def tile_mn(self) -> tuple[int, int]:
        return (self.tile_m, self.tile_n)

    @property
    def cluster_mn(self) -> tuple[int, int]:
        return (self.cluster_m, self.cluster_n)

    def kernel_mn(self, m: int, n: int) -> tuple[int, int]:
        """An M x N output as the kernel tiles it: N x M under swap_ab."""
        return (n, m) if self.swap_ab else (m, n)

    @property
    def num_mma_warpgroups(self) -> int:
        # Cooperative: two warpgroups split the M of a 128- or 256-row tile (64 or 128 rows
        # each), which keeps the fp32 accumulator at <= 128 registers per thread; three split
        # a 192-row tile (64 rows each).
        if self.tile_m == 192:
            return 3
        return 2 if self.tile_m >= 128 or self.pingpong else 1

    def tile_k(self, in_bytes: int) -> int:
        return 128 // in_bytes

    def ab_stages(self, in_bytes: int, out_bytes: int, extra_smem: int = 0) -> int:
        return _ab_stages(self, in_bytes, out_bytes, extra_smem)

    def validate(self, in_bytes: int = 2, out_bytes: int = 2, integer: bool = False) -> None:
        """The one validity check for a config; raises ValueError with the reason. integer:
        int8 inputs (int32 accumulation), whose wgmma shapes step N by 16 above 8 (e4m3 and
        16-bit ones by 8)."""
        if self.tile_m not in (64, 128, 192, 256):
            raise ValueError(f"tile_m must be 64, 128, 192 or 256, got {self.tile_m}")
        if self.tile_m == 192:
            # Three consumer warpgroups (512 threads): ptxas compiles the kernel under 128
            # registers a thread, so a warpgroup's 64 x tile_n fp32 accumulator (tile_n / 2
            # registers) stays at <= 96 (at 208 ptxas ran out of registers for the wgmma).
            if self.pingpong or self.promote or in_bytes != 2 or self.split_k > 1:
                raise ValueError(f"a 192-row tile is built cooperative, for 16-bit inputs, without split-K, got {self}")
            if not (64 <= self.tile_n <= 192 and self.tile_n % (8 if self.swap_ab else 16) == 0):
                raise ValueError(f"a 192-row tile takes tile_n in 64..192 (a multiple of {8 if self.swap_ab else 16}), "
                                 f"got {self.tile_n}")
        if self.swap_ab:
            # The swapped kernel's N is the token count: any multiple of 8 pads it least, as cuBLAS
            # pads it (128 x 88 at 260 tokens). The epilogue stores 16-column slabs where 32 does
            # not divide the tile and 8-column ones (stmatrix x2) at widths of 8 mod 16; checked on
            # the H100 against 16-multiple widths' outputs at 24 shapes, widths 88-248.
            if not (16 <= self.tile_n <= 256 and self.tile_n % 8 == 0 and self.tile_m in (64, 128, 192, 256)):
                raise ValueError(f"swap_ab takes a 64-, 128-, 192- or 256-row tile and tile_n in 16..256, a multiple of 8, "
                                 f"got {self.tile_mn}")
        elif self.tile_n not in (64, 96, 128, 160, 192, 256) and self.tile_m != 192:
            raise ValueError(f"tile_n must be 64, 96, 128, 160, 192 or 256, got {self.tile_n}")
        if integer and self.tile_n % 16:
            raise ValueError(f"int8 takes tile_n in multiples of 16, got {self.tile_n}")
        if self.tile_m == 256 and self.tile_n > 192:
            raise ValueError("a 256-row tile needs tile_n <= 192 (register budget)")
        if self.swap_ab and self.tile_m == 256 and (in_bytes != 2 or self.pingpong):
            raise ValueError("a 256-row swap_ab tile is built for 16-bit inputs, cooperative")
        for c in (self.cluster_m, self.cluster_n):
            if c not in (1, 2, 4):
                raise ValueError(f"cluster dims must be 1, 2 or 4, got {self.cluster_mn}")
        if self.cluster_m * self.cluster_n > 8:
            raise ValueError(f"a cluster has at most 8 CTAs (portable size), got {self.cluster_mn}")
        if self.pingpong and self.tile_m * self.tile_n > 128 * 192:
            raise ValueError("a ping-pong warpgroup holds a whole tile: tile_m * tile_n must be <= 128 * 192")
        if self.promote and (self.pingpong or self.tile_m * self.tile_n > 128 * 128):
            raise ValueError("promote keeps two accumulators: needs a cooperative tile of at most 128 x 128")
        if self.promote and self.tile_m == 64 and self.tile_n > 192:
            # One warpgroup holds both 64 x tile_n accumulators: ptxas spills 64 x 224 split
            # (64 bytes) and 64 x 240 / 256 (200-1000 bytes); up to 192 it does not.
            raise ValueError(f"promote on a 64-row tile needs tile_n <= 192, got {self.tile_n}")
        if self.whole_tile_epi and self.pingpong:
            raise ValueError("whole_tile_epi is for cooperative tiles (a ping-pong warpgroup stages its own slabs)")
        if self.group < 1:
            raise ValueError("group must be >= 1")
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"split_k must be an int >= 1, got {self.split_k!r}")
        if self.stages is not None and (not isinstance(self.stages, int) or self.stages < 2):
            raise ValueError(f"stages must be None or an int >= 2, got {self.stages!r}")
        fit = stages_that_fit(self, in_bytes, out_bytes)
        if fit < (self.stages or 2):
            raise ValueError(f"{self} fits {fit} pipeline stages in shared memory, needs {self.stages or 2}")


def epi_tile(cfg: GemmConfig, out_bytes: int = 2) -> tuple[int, int]:
    """The epilogue streams the C tile out in slabs of this shape.

    16-bit outputs: 32 columns keeps two slabs small enough to sit next to the A/B
    stages. The rows must be exactly what one M-step of the tiled MMA covers (64 per
    warpgroup that splits the tile: 128 cooperative, 64 ping-pong), so that slab s is
    one contiguous run of each thread's retiled accumulator.

    32-bit outputs (int32, fp32): every consumer warp stages its own 16 x 32 boxes
    (its 16 accumulator rows of one M-step), so warps never wait for each other in the
    epilogue; 16 x 16 where 32 does not divide a swap_ab tile's width.
    """
    width = 32 if cfg.tile_n % 32 == 0 else 16 if cfg.tile_n % 16 == 0 else 8
    if out_bytes == 4:
        return (16, min(width, cfg.tile_n))
    rows = 64 if cfg.pingpong or cfg.tile_m == 64 else 64 * cfg.num_mma_warpgroups
    return (rows, min(width, cfg.tile_n))


EPI_STAGES = 2


def epi_buffers(cfg: GemmConfig, out_bytes: int, group: int = 1) -> int:
    """Epilogue smem buffers: EPI_STAGES per consumer warp (32-bit), per warpgroup in
    ping-pong, one per slab of the tile with whole_tile_epi, else EPI_STAGES store groups of
    `group` slabs (`epi_group`) shared by the cooperating warpgroups."""
    if out_bytes == 4:
        return EPI_STAGES * 4 * cfg.num_mma_warpgroups
    if whole_tile_epilogue(cfg, out_bytes):
        em, en = epi_tile(cfg, out_bytes)
        return (cfg.tile_m // em) * (cfg.tile_n // en)
    return EPI_STAGES * group * (2 if cfg.pingpong else 1)


# The cooperative 16-bit ring epilogue stores 8-column slabs (swap_ab widths of 8 mod 16 where
# the whole-tile epilogue does not fit) in groups of up to EPI_GROUP_COLS columns: the group's
# slabs are written to smem, then one fence, one barrier and one bulk group of TMA stores. A
# 256 x 152 tile otherwise runs 38 slabs of 128 x 8, each with two barriers of 256 threads and
# a store wait. Same machine, H200, 73 bf16 shapes of 138-7340 tokens on their picks, one
# process each way, in-process compiles (`gemm_probe_epi_ab_h200.md`): the 256-row
# 8-column picks 1.035x faster grouped (29 shapes, 0.993x-1.100x; 1824x4608x3584 0.949x ->
# 1.044x cuBLAS), 128-row ones 1.02x-1.03x, 192-row 1.01x-1.08x; 16-column slabs in pairs
# 1.005x (0.966x-1.044x) and ping-pong 8-column slabs 1.005x: both keep one slab a round.
EPI_GROUP_COLS = 32


def epi_group(cfg: GemmConfig, out_bytes: int) -> int:
    """Slabs per TMA store group of the 16-bit ring epilogue: as many as EPI_GROUP_COLS
    columns hold (a power of two), halved while their buffers would cost an A/B stage."""
    em, en = epi_tile(cfg, out_bytes)
    if out_bytes != 2 or cfg.pingpong or en != 8 or whole_tile_epilogue(cfg, out_bytes):
        return 1
    group = 1
    while 2 * group * en <= EPI_GROUP_COLS and 2 * group <= (cfg.tile_m // em) * (cfg.tile_n // en):
        group *= 2
    slab = em * en * out_bytes
    base = min(cfg.stages or MAX_AB_STAGES, _stages_with_epi(cfg, 2, out_bytes, slab * epi_buffers(cfg, out_bytes)))
    while group > 1 and _stages_with_epi(cfg, 2, out_bytes, slab * epi_buffers(cfg, out_bytes, group)) < base:
        group //= 2
    return group


# The whole-tile epilogue by default: swap_ab tiles of widths 8 mod 16, whose epilogue runs
# in 8-column slabs (11 to 31 of them a tile), where it keeps at least this many A/B stages.
# H100, the fastest cooperative configs of 14 bf16 shapes each timed with and without it
# (`python -m benchmarks.gemm_probe epilogue ...`, `gemm_probe_whole_tile_epi_h100.md`): the
# 45 pairs this rule takes 1.067x faster with it (geomean), 41 of them faster, up to 1.28x
# (64 x 152; 128 x 104 and 128 x 152 1.10x-1.16x at K 1024-2048), the slowest 0.95x (128 x 88
# at K = 28672) and 0.97x (128 x 72 at K = 5120); with 4 stages left it lost at long K
# (128 x 184 0.89x at K = 28672); 16-column slabs (5-15 a tile) were mixed (128 x 112 0.96x at
# K = 5120, 64 x 112 1.03x at K = 1024), 32-column ones even.
WHOLE_TILE_EPI_MIN_STAGES = 5


def whole_tile_epilogue(cfg: GemmConfig, out_bytes: int) -> bool:
    """Whether `cfg` stages its whole output tile for the epilogue (16-bit outputs only)."""
    if out_bytes != 2 or cfg.pingpong:
        return False
    if cfg.whole_tile_epi is not None:
        return cfg.whole_tile_epi
    if not cfg.swap_ab or cfg.tile_n % 16 != 8:
        return False
    return _stages_with_epi(cfg, 2, out_bytes, cfg.tile_m * cfg.tile_n * out_bytes) >= WHOLE_TILE_EPI_MIN_STAGES


def block_scale_smem_bytes(cfg: GemmConfig) -> int:
    """Shared memory of block scales staged with every A/B stage (up to BLOCK_SCALE_STAGES
    stages): scale_a for the tile's rows and a 16-byte box of scale_b in a 128-byte slot, fp32."""
    return BLOCK_SCALE_STAGES * 4 * (cfg.tile_m + 32)


BLOCK_SCALE_STAGES = 8


def epi_vector_slots(cfg: GemmConfig) -> int:
    """fp32 slots of one tile's staged epilogue vectors: row scales, column scales, bias."""
    return cfg.tile_m + 2 * cfg.tile_n


VEC_STAGES = 2  # tiles of epilogue vectors staged ahead by the vector-loader warp


def epi_vector_bytes(cfg: GemmConfig, out_bytes: int) -> int:
    """Shared memory for the staged epilogue vectors of 16-bit outputs (the 32-bit epilogue
    reads them from global memory)."""
    if out_bytes != 2:
        return 0
    return 4 * epi_vector_slots(cfg) * VEC_STAGES


RES_SLOTS = 2  # residual slabs in flight per epilogue warpgroup


def residual_smem_bytes(cfg: GemmConfig, out_bytes: int) -> int:
    """Shared memory for the residual slabs a 16-bit epilogue TMA-loads (two per warpgroup
    that runs epilogues), plus their mbarriers."""
    if out_bytes != 2:
        return 0
    em, en = epi_tile(cfg, out_bytes)
    return em * en * out_bytes * RES_SLOTS * (2 if cfg.pingpong else 1) + 64


MAX_AB_STAGES = 8
# A 16-bit residual's TMA slabs may take A/B stages beyond this many (kernel.py).
RES_TMA_MIN_STAGES = 8


def _ab_stages(cfg: GemmConfig, in_bytes: int, out_bytes: int, extra_smem: int = 0) -> int:
    return min(cfg.stages or MAX_AB_STAGES, stages_that_fit(cfg, in_bytes, out_bytes, extra_smem))


def stages_that_fit(cfg: GemmConfig, in_bytes: int, out_bytes: int, extra_smem: int = 0) -> int:
    """A/B stages that shared memory holds beside the epilogue's buffers, whatever `cfg.stages`."""
    em, en = epi_tile(cfg, out_bytes)
    return _stages_with_epi(cfg, in_bytes, out_bytes, em * en * out_bytes * epi_buffers(cfg, out_bytes), extra_smem)


def _stages_with_epi(cfg: GemmConfig, in_bytes: int, out_bytes: int, epi: int, extra_smem: int = 0) -> int:
    per_stage = (cfg.tile_m + cfg.tile_n) * cfg.tile_k(in_bytes) * in_bytes
    # mbarriers + alignment slack + staged epilogue vectors + what the epilogue asks for (residual slabs)
    reserved = 1024 + 1024 + epi_vector_bytes(cfg, out_bytes) + extra_smem
    return (SM90_SMEM_BYTES - epi - reserved) // per_stage


def grid_clusters(cfg: GemmConfig, m: int, n: int) -> tuple[int, int]:
    """(clusters, clusters resident at once) of the persistent grid for an m x n output in
    the kernel's view (N x M under swap_ab), the tile grid padded to whole clusters."""
    clusters = -(-(-(-m // cfg.tile_m)) // cfg.cluster_m) * -(-(-(-n // cfg.tile_n)) // cfg.cluster_n)
    return clusters, MAX_ACTIVE_CLUSTERS[cfg.cluster_m * cfg.cluster_n]


def split_tail_tiles(cfg: GemmConfig, m: int, n: int) -> int:
    """CTA tiles a split-K config splits for an m x n output in the kernel's view (N x M
    under swap_ab): those of the persistent grid's last, partial wave of clusters, all of
    them when the grid fits one wave, none when its waves are whole (GemmSm90._split_head)."""
    clusters, per_wave = grid_clusters(cfg, m, n)
    return clusters % per_wave * cfg.cluster_m * cfg.cluster_n


def splitk_k_tiles(k_tiles: int, split: int, index: int) -> tuple[int, int]:
    """The k-tile range [begin, end) of split `index` (the kernel's exact formula).

    Balanced: every split gets floor or ceil(k_tiles / split) k-tiles, so none is
    empty as long as split <= k_tiles (the host clamps it). The zero-filled partial
    k-tile past K, if any, falls in the last split.
    """
    return index * k_tiles // split, (index + 1) * k_tiles // split



@dataclass(frozen=True)
class Epilogue:
    """Compile-time description of the fused epilogue."""

    # none | relu | gelu | gelu_tanh | swiglu (B = [gate; up], D = silu(gate) * up: half as wide)
    activation: str = "none"
    row_scale: str = "none"  # none | scalar | vector | block  (per-row of A: per token)
    col_scale: str = "none"  # none | scalar | vector | block  (per-column of B: per channel)
    bias: bool = False
    residual: bool = False
    alpha: bool = False  # multiply by the runtime scalar alpha
    beta: bool = False  # multiply the residual by the runtime scalar beta

    @property
    def is_identity(self) -> bool:
        return self == Epilogue()

    @property
    def block_scaled(self) -> bool:
        """DeepSeek-V3-style block scales: row_scale "block" is A's [M, K/128] (1 x 128
        groups), col_scale "block" is B's [N/128, K/128] (128 x 128 blocks). They apply
        per k-tile inside the promoted main loop, not in the epilogue."""
        return self.row_scale == "block"


def swap_supported(epi: Epilogue, out_bytes: int) -> str | None:
    """None if a swap_ab config can run `epi` with `out_bytes`-byte outputs, else why not.
    The swapped kernel sees D^T: row and column scale vectors trade places, but a bias
    (per column of D) and a residual (loaded as column pairs) have no transposed path.
    16-bit outputs leave through transposed stmatrix, 32-bit ones (int8's raw int32)
    through M-major per-warp boxes (`GemmSm90.epilogue_32bit`)."""
    if out_bytes not in (2, 4):
        return f"swap_ab writes 16- or 32-bit outputs, got {out_bytes}-byte ones"
    if epi.bias or epi.residual or epi.activation == "swiglu" or epi.block_scaled:
        return "swap_ab takes epilogues without bias, residual, SwiGLU or block scales"
    return None


def swapped_epilogue(epi: Epilogue) -> Epilogue:
    """The epilogue as the swapped kernel (D^T = B A^T) sees it: A's row scales are its column scales."""
    return dataclasses.replace(epi, row_scale=epi.col_scale, col_scale=epi.row_scale)


@dataclass(frozen=True)
class GemvConfig:
    """Static shape of one compiled GEMV: weight rows per CTA (a multiple of 8, the MMA's
    n), the longest K it takes (shared-memory rows are k_max + 8 elements apart), warps."""

    rows: int = 16
    k_max: int = 2048
    warps: int = 4
    wbytes: int = 2  # weight element bytes: 2 (bf16/fp16) or 1 (fp8 e4m3 / int8, weight-only)

    @property
    def row_stride(self) -> int:
        # 16 bytes of padding per row (in elements): the 8 rows one k-step reads start in 8
        # different bank groups (k_max is a multiple of 64).
        return self.k_max + 16 // self.wbytes

    def smem_bytes(self, ln: bool) -> int:
        return self.wbytes * self.rows * self.row_stride + 2 * (3 if ln else 1) * self.k_max + 8 * (self.rows + 1) \
            + 4 * self.warps * self.rows + 512
