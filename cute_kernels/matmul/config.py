"""GEMM tile/cluster configuration: one frozen dataclass, a candidate list, one validity check,
and the heuristic that picks a config per problem shape."""

from __future__ import annotations

import math
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
    split_k > 1 (split-K): the k-tiles of every output tile are dealt out in split_k
    contiguous, balanced ranges; each (tile, range) is a work item of its own, and
    the last of a tile's splits to finish adds the others' fp32 (int32 for int8)
    partial sums from a workspace and runs the fused epilogue, in the same launch.
    The kernel is compiled once for "split or not"; the split count is a runtime value.
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

    @property
    def tile_mn(self) -> tuple[int, int]:
        return (self.tile_m, self.tile_n)

    @property
    def cluster_mn(self) -> tuple[int, int]:
        return (self.cluster_m, self.cluster_n)

    @property
    def num_mma_warpgroups(self) -> int:
        # Cooperative: two warpgroups split the M of a 128+ tile (64 or 128 rows each),
        # which keeps the fp32 accumulator at <= 128 registers per thread.
        return 2 if self.tile_m >= 128 or self.pingpong else 1

    def tile_k(self, in_bytes: int) -> int:
        return 128 // in_bytes

    def ab_stages(self, in_bytes: int, out_bytes: int, extra_smem: int = 0) -> int:
        return _ab_stages(self, in_bytes, out_bytes, extra_smem)

    def validate(self, in_bytes: int = 2, out_bytes: int = 2) -> None:
        """The one validity check for a config; raises ValueError with the reason."""
        if self.tile_m not in (64, 128, 256):
            raise ValueError(f"tile_m must be 64, 128 or 256, got {self.tile_m}")
        if self.tile_n not in (64, 96, 128, 160, 192, 256):
            raise ValueError(f"tile_n must be 64, 96, 128, 160, 192 or 256, got {self.tile_n}")
        if self.tile_m == 256 and self.tile_n > 128:
            raise ValueError("a 256-row tile needs tile_n <= 128 (register budget)")
        for c in (self.cluster_m, self.cluster_n):
            if c not in (1, 2, 4):
                raise ValueError(f"cluster dims must be 1, 2 or 4, got {self.cluster_mn}")
        if self.cluster_m * self.cluster_n > 8:
            raise ValueError(f"a cluster has at most 8 CTAs (portable size), got {self.cluster_mn}")
        if self.pingpong and self.tile_m * self.tile_n > 128 * 192:
            raise ValueError("a ping-pong warpgroup holds a whole tile: tile_m * tile_n must be <= 128 * 192")
        if self.promote and (self.pingpong or self.tile_m * self.tile_n > 128 * 128):
            raise ValueError("promote keeps two accumulators: needs a cooperative tile of at most 128 x 128")
        if self.group < 1:
            raise ValueError("group must be >= 1")
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"split_k must be an int >= 1, got {self.split_k!r}")
        if _ab_stages(self, in_bytes, out_bytes) < 2:
            raise ValueError(f"{self} leaves fewer than 2 pipeline stages in shared memory")


def epi_tile(cfg: GemmConfig, out_bytes: int = 2) -> tuple[int, int]:
    """The epilogue streams the C tile out in slabs of this shape.

    16-bit outputs: 32 columns keeps two slabs small enough to sit next to the A/B
    stages. The rows must be exactly what one M-step of the tiled MMA covers (64 per
    warpgroup that splits the tile: 128 cooperative, 64 ping-pong), so that slab s is
    one contiguous run of each thread's retiled accumulator.

    32-bit outputs (int32, fp32): every consumer warp stages its own 16 x 32 boxes
    (its 16 accumulator rows of one M-step, 128-byte rows), so warps never wait for
    each other in the epilogue.
    """
    if out_bytes == 4:
        return (16, min(32, cfg.tile_n))
    rows = 64 if cfg.pingpong or cfg.tile_m == 64 else 128
    return (rows, min(32, cfg.tile_n))


EPI_STAGES = 2


def epi_buffers(cfg: GemmConfig, out_bytes: int) -> int:
    """Epilogue smem buffers: EPI_STAGES per consumer warp (32-bit), per warpgroup in
    ping-pong, else EPI_STAGES shared by the cooperating warpgroups."""
    if out_bytes == 4:
        return EPI_STAGES * 4 * cfg.num_mma_warpgroups
    return EPI_STAGES * (2 if cfg.pingpong else 1)


def block_scale_smem_bytes(cfg: GemmConfig) -> int:
    """Shared memory of block scales staged with every A/B stage (up to 8 stages): scale_a
    for the tile's rows and a 16-byte box of scale_b in a 128-byte slot, fp32."""
    return 8 * 4 * (cfg.tile_m + 32)


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


def _ab_stages(cfg: GemmConfig, in_bytes: int, out_bytes: int, extra_smem: int = 0) -> int:
    tk = cfg.tile_k(in_bytes)
    per_stage = (cfg.tile_m + cfg.tile_n) * tk * in_bytes
    em, en = epi_tile(cfg, out_bytes)
    epi = em * en * out_bytes * epi_buffers(cfg, out_bytes)
    # mbarriers + alignment slack + staged epilogue vectors + what the epilogue asks for (residual slabs)
    reserved = 1024 + 1024 + epi_vector_bytes(cfg, out_bytes) + extra_smem
    return min(8, (SM90_SMEM_BYTES - epi - reserved) // per_stage)


CANDIDATES: tuple[GemmConfig, ...] = (
    GemmConfig(128, 256, 2, 1),
    GemmConfig(128, 192, 2, 1, pingpong=True),
    GemmConfig(128, 160, 2, 1, pingpong=True),
    GemmConfig(128, 160, 2, 1),
    GemmConfig(128, 128, 2, 1, pingpong=True),
    GemmConfig(128, 96, 2, 1),
    GemmConfig(64, 64, 1, 1, pingpong=True),
    # Not picked by the heuristic; available to the autotuner and to callers.
    GemmConfig(256, 128, 1, 2),
    GemmConfig(128, 192, 2, 1),
    GemmConfig(64, 128, 1, 1, pingpong=True),
)

# Per-tile throughput relative to 128x256, from the H100 sweep (dev notes in
# benchmarks/results/gemm_tuning.md): bigger tiles reuse each loaded byte more.
_TILE_EFFICIENCY = {
    (128, 256, False): 1.0,
    # 128x160 divides N = 1600 / 4800 / 6400 (GPT-2 XL) exactly where 128 and 256 leave a
    # half-empty column of tiles: +15% at 8192x1600x6400, +6% at 8192x1600x1600 (bf16,
    # same-run sweep, tune_gemm); 0.975 keeps it off every shape where it lost.
    (128, 160, False): 0.975,
    # Ping-pong tiles of 128 x 192 and 128 x 160 (192 / 160 accumulator registers per
    # thread under setmaxnreg 232, no spills): big tiles *and* a hidden epilogue. Same-run
    # sweeps on the H100, 2026-11-23 (`gemm_tuning.md`): 8192x768x3072 0.96x -> 1.01x
    # cuBLAS (bf16), 8192x6400x1600 1.03x -> 1.07x; fp8 8192^3 0.99x -> 1.07x `_scaled_mm`,
    # 8192x14336x4096 0.93x -> 1.01x; int8 8192x14336x4096 1.53x -> 1.65x `_int_mm`.
    (128, 192, True): 0.96,
    (128, 160, True): 0.96,
    (128, 128, True): 0.93,
    (128, 96, False): 0.85,
    (64, 64, True): 0.5,
    # With a 4 x 2 cluster, in one wave (see default_config): cuBLAS's pick (nvjet 64x128,
    # cluster 4x2) for M = 512 with long K, where 128-row tiles leave most SMs idle. Same-run
    # sweeps on the H100 (2026-11-23, `gemm_tuning.md`): bf16 512x1600x6400 0.94x cuBLAS (128x128 split 2:
    # 0.82x); fp8 per-tensor 0.96x `_scaled_mm` (128x96: 0.79x), per-row 1.40x (1.17x).
    (64, 128, True): 0.75,
}
# A cooperative kernel's epilogue stalls the tensor cores; ping-pong hides it
# under the other warpgroup's main loop. Expressed as extra K per tile.
_EPILOGUE_K = {False: 128, True: 16}


# Few-tile shapes (too few output tiles to fill the GPU) are bound by the A/B panels' L2 -> SM
# traffic, which multicast within a cluster cuts. Same-run sweeps on the H100 (2026-11-23,
# `benchmarks/results/gemm_tuning.md`): 64 x 64 in 2 x 2 at 512x768x3072 (bf16) 0.81-0.83x
# -> 0.87-0.92x cuBLAS, lost at K = 768 (0.90 -> 0.85x), at 48 tiles (0.82 -> 0.80x) and on every
# 8-bit shape swept (1-6%); a held-out check of the new picks (78 shapes, M 128-2048) put them
# 1.18x over the old ones, after excluding what still lost there: 2 x 2 at 128 rows (0.97-0.99x;
# 384+ rows +1-11%) and 8-bit 64 x 128 at K = 768 (0.94-1.02x; K >= 1600 1.06-1.87x).
_CLUSTER_64_MIN_K = 2048
_CLUSTER_64_MIN_TILES_M = 6
_CLUSTER_64_MIN_TILES = 64
_TILE_64x128_MIN_K_8BIT = 1536
# 8-bit inputs run the main loop twice as fast, so the 128 x 256 cooperative tile's epilogue
# (the tensor cores idle while it runs) weighs twice as much: below this K a ping-pong tile
# won or tied (within 1.5%) every 8-bit shape swept (2026-11-23: fp8 8192x14336x4096
# 0.93x -> 1.01x with 128 x 160 ping-pong; doubling the epilogue's weight in the model mispicked
# 128 x 128 ping-pong over 128 x 96 at short K, 1.07x -> 0.93x at fp8 512x3072x768).
_TILE_128x256_MIN_K_8BIT = 4096


def _fits_one_wave(tiles_m: int, tiles_n: int, cm: int, cn: int) -> bool:
    """The tile grid in cm x cn clusters, at least 2 along each multicast dimension used, fits
    in one wave of resident clusters."""
    if tiles_m < cm or tiles_n < cn:
        return False
    return math.ceil(tiles_m / cm) * math.ceil(tiles_n / cn) <= MAX_ACTIVE_CLUSTERS[cm * cn]


def _cluster_for(tiles_m: int, tiles_n: int, tile: tuple[int, int], k: int = 0, in_bytes: int = 2) -> tuple[int, int]:
    """The cluster of a tile shape. k = 0 (split-K candidates) leaves 64 x 64 unclustered."""
    if tile == (64, 64):
        if (in_bytes == 2 and k >= _CLUSTER_64_MIN_K and tiles_m >= _CLUSTER_64_MIN_TILES_M
                and tiles_m * tiles_n >= _CLUSTER_64_MIN_TILES and _fits_one_wave(tiles_m, tiles_n, 2, 2)):
            return (2, 2)
        return (1, 1)
    if tile == (64, 128):
        # B multicast to 4 M tiles, A to 2 N tiles (512x1600x6400, same run: 4 x 2 0.94x
        # cuBLAS, 4 x 1 0.93x, 2 x 2 0.71x); default_config admits this tile only as one wave
        # of such clusters.
        return (4, 2)
    if tiles_m >= 2:
        return (2, 1)
    return (1, 2) if tiles_n >= 2 else (1, 1)


def default_config(m: int, n: int, k: int, *, num_sms: int = H100_SMS, in_bytes: int = 2) -> GemmConfig:
    """Pick tile, cluster and consumer mode for an M x N x K problem.

    Cost model: waves x tile area x (K + unhidden epilogue) / tile efficiency. A
    persistent kernel runs ceil(tiles / SMs) waves, so a big tile that leaves SMs
    idle in its last wave loses to a smaller one that fills them; at short K the
    ping-pong tile wins because its epilogue overlaps the other warpgroup's math
    (the more so for 8-bit inputs, whose main loop is twice as fast).
    """
    best, best_cost = None, math.inf
    for (tm, tn, pp), eff in _TILE_EFFICIENCY.items():
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        if (tm, tn) == (64, 128) and not (_fits_one_wave(tiles_m, tiles_n, 4, 2)
                                           and (in_bytes == 2 or k >= _TILE_64x128_MIN_K_8BIT)):
            continue  # only as one wave of 4 x 2 clusters; 8-bit inputs only past short K
        if (tm, tn) == (128, 256) and in_bytes == 1 and k < _TILE_128x256_MIN_K_8BIT:
            continue
        waves = math.ceil(tiles_m * tiles_n / num_sms)
        cost = waves * tm * tn * (k + _EPILOGUE_K[pp]) / eff
        if cost < best_cost - 1e-9:
            cm, cn = _cluster_for(tiles_m, tiles_n, (tm, tn), k, in_bytes)
            best, best_cost = GemmConfig(tm, tn, cm, cn, pingpong=pp), cost
    assert best is not None
    return best



# --------------------------------------------------------------------------- split-K
#
# A problem whose output has fewer tiles than there are SMs leaves SMs idle for the
# whole main loop. Split-K deals each tile's K range out to `s` CTAs of one launch;
# the last split of a tile to finish adds the others' fp32 partials (GemmSm90.
# split_fixup). It pays the fixup: a counter round trip or two and the finisher's
# read of s - 1 partial tiles from L2 (the non-finishers' writes overlap other work).
# The model turns the tile cost above into microseconds and adds the fixup. Fitted
# on the H100 (same-run sweep, 2026-11-22, bf16): ~2.5 us fixed + 0.3 ps per cost
# unit unsplit; the fixup measured ~0.5-1 us with S = 1 and ~2.3 us for one 128x128
# partial read back (512x1600x6400: 128x128 ping-pong S = 2 25.8 us vs 28.3 unsplit;
# 512x768x3072 stays unsplit on 64x64, 11.0 us vs 13.9 for the best split). Small-M
# problems are also bound by the A/B panels' L2 -> SM traffic, which splitting does
# not reduce; the 20% margin keeps the model off the cases that fitting misses.
_US_FIXED = 2.5  # one GEMM launch: prologue, pipeline fill, last epilogue
_US_PER_UNIT = 0.3e-6  # one unit of `default_config`'s cost (tile area x K / efficiency)
_US_FIXUP = 1.5  # a split tile's fixup: counter round trips, barriers, epilogue start
_FIXUP_BYTES_PER_US = 5e4  # the finisher's read of the other splits' fp32 partials
_SPLIT_GAIN = 0.8  # a split must be modelled at least 20% faster than no split
# The tiles the split-K model was fitted on (128x160 was never swept split).
_SPLIT_TILES = ((128, 256), (128, 128), (128, 96), (64, 64))
MIN_SPLIT_K_TILES = 4  # each split sums at least 4 k-tiles (256 of K for 16-bit inputs)
MAX_SPLIT_K = 16


def _model_us(tm: int, tn: int, pp: bool, eff: float, ctas: int, k: int, num_sms: int) -> float:
    waves = math.ceil(ctas / num_sms)
    return _US_FIXED + _US_PER_UNIT * waves * tm * tn * (k + _EPILOGUE_K[pp]) / eff


def splitk_k_tiles(k_tiles: int, split: int, index: int) -> tuple[int, int]:
    """The k-tile range [begin, end) of split `index` (the kernel's exact formula).

    Balanced: every split gets floor or ceil(k_tiles / split) k-tiles, so none is
    empty as long as split <= k_tiles (the host clamps it). The zero-filled partial
    k-tile past K, if any, falls in the last split.
    """
    return index * k_tiles // split, (index + 1) * k_tiles // split


def split_config(m: int, n: int, k: int, *, num_sms: int = H100_SMS, in_bytes: int = 2) -> GemmConfig:
    """`default_config`, or a split-K config when the output has too few tiles.

    Only problems whose `default_config` fills less than one wave (tiles < SMs) are
    considered, so every problem with enough tiles gets exactly `default_config`.
    Candidates: each tile shape with s = 2..MAX_SPLIT_K splits such that tiles x s
    still fits one wave and every split sums >= MIN_SPLIT_K_TILES k-tiles. The
    cheapest is taken if the model puts it at least 20% under no split.
    """
    base = default_config(m, n, k, num_sms=num_sms, in_bytes=in_bytes)
    tiles = math.ceil(m / base.tile_m) * math.ceil(n / base.tile_n)
    if tiles >= num_sms:
        return base
    tk = base.tile_k(in_bytes)
    k_tiles = math.ceil(k / tk)
    base_eff = _TILE_EFFICIENCY[(base.tile_m, base.tile_n, base.pingpong)]
    base_us = _model_us(base.tile_m, base.tile_n, base.pingpong, base_eff, tiles, k, num_sms)
    best, best_us = base, base_us * _SPLIT_GAIN
    for (tm, tn, pp), eff in _TILE_EFFICIENCY.items():
        if (tm, tn) not in _SPLIT_TILES:
            continue
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        nt = tiles_m * tiles_n
        for s in range(2, MAX_SPLIT_K + 1):
            if nt * s > num_sms or s * MIN_SPLIT_K_TILES > k_tiles:
                break
            k_split = math.ceil(k_tiles / s) * tk  # the longest split
            finisher_bytes = (s - 1) * tm * tn * 4  # the other splits' fp32 partials
            us = _model_us(tm, tn, pp, eff, nt * s, k_split, num_sms) + _US_FIXUP + finisher_bytes / _FIXUP_BYTES_PER_US
            if us < best_us - 1e-9:
                cm, cn = _cluster_for(tiles_m, tiles_n, (tm, tn))
                best, best_us = GemmConfig(tm, tn, cm, cn, pingpong=pp, split_k=s), us
    return best


@dataclass(frozen=True)
class Epilogue:
    """Compile-time description of the fused epilogue."""

    activation: str = "none"  # none | relu | gelu | gelu_tanh
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
