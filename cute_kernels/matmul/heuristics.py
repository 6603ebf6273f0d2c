"""The GEMM config heuristic: tile, cluster, consumer mode, raster and split-K per problem shape,
from a cost model fitted to same-run sweeps on the H100 (benchmarks/results/gemm_tuning.md).

Dispatch asks the tuning cache first (cute_kernels.tuning) and falls back to this. It only
chooses among configs that `config.GemmConfig.validate` accepts, so changing it never changes
how a config compiles, and the tuning cache's source hash does not cover it.
"""

from __future__ import annotations

import dataclasses
import math

from .config import H100_SMS, MAX_AB_STAGES, MAX_ACTIVE_CLUSTERS, GemmConfig, grid_clusters, stages_that_fit

CANDIDATES: tuple[GemmConfig, ...] = (
    GemmConfig(128, 256, 2, 1),
    GemmConfig(128, 192, 2, 1, pingpong=True),
    GemmConfig(128, 160, 2, 1, pingpong=True),
    GemmConfig(128, 160, 2, 1),
    GemmConfig(128, 128, 2, 1, pingpong=True),
    GemmConfig(128, 96, 2, 1),
    GemmConfig(64, 64, 1, 1, pingpong=True),
    # 256-row tiles: picked from 2048 rows on (16-bit inputs, `_TILES_256`).
    GemmConfig(256, 160, 1, 2),
    GemmConfig(256, 128, 1, 2),
    # Not picked by the heuristic; available to the autotuner and to callers.
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
# 128 x 96 without a cluster (where an odd tile count along M would pad 2 x 1 clusters into one
# more wave) wins the cost model by its wave fill alone, but with neither panel multicast its
# L2 -> SM traffic bounds it: 3921x1600x1600 (grid seed 1081, 4 exact waves) ran it at 0.71x
# cuBLAS, fp8 0.86x. From this many waves on, the next tile in the model runs instead.
_TILE_128x96_MAX_WAVES_ALONE = 3
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
# An unclustered 64 x 64 tile in one wave at long K (32+ k-tiles: K >= 2048 for 16-bit inputs,
# 4096 for 8-bit, whose shorter-K shapes kept 64 x 64 in the 8-bit sweeps) reloads both panels
# for little math: the L2 -> SM traffic bounds it, and a clustered 64 x 128 tile in one wave
# beat it at every such shape
# the tuner swept (206x2048x8192 0.044 -> 0.025 ms, 10x4608x3584 0.022 -> 0.018, int8
# 86x4096x14336 0.041 -> 0.029; held out: fp8 36x1024x4096 1.51x `_scaled_mm`, 115x1280x5120
# 1.55x; H100, 2026-11-25). In several waves (45x57344x8192) 64 x 64 kept its lead over the
# 128-row tiles.
_TILE_64_UNCLUSTERED_LONG_K = 0.35
# 8-bit inputs run the main loop twice as fast, so the 128 x 256 cooperative tile's epilogue
# (the tensor cores idle while it runs) weighs twice as much: below this K a ping-pong tile
# won or tied (within 1.5%) every 8-bit shape swept (2026-11-23: fp8 8192x14336x4096
# 0.93x -> 1.01x with 128 x 160 ping-pong; doubling the epilogue's weight in the model mispicked
# 128 x 128 ping-pong over 128 x 96 at short K, 1.07x -> 0.93x at fp8 512x3072x768).
_TILE_128x256_MIN_K_8BIT = 4096
# 256-row tiles, A multicast to two N tiles (1 x 2: the 256-row A panel is the larger one),
# for 16-bit inputs from 2048 rows and K = 2048 on: cuBLAS's large-M tiles (nvjet 256 x
# 136-152). Same-run sweep on the H100 (2026-11-26, 14 shapes M 1124-13642, forced configs,
# `gemm_rules_ab_h100.md`): per wave x tile area they ran a median 1.0x (256 x 128) and 1.03x (256 x
# 160) the work of 128 x 256 in 2 x 1, and the pick below moved 7178x4096x4096 0.94x -> 1.00x
# cuBLAS, 6808x5120x27648 0.86x -> 0.95x, 7609x10240x8192 0.93x -> 0.97x, 3133x3072x2048
# 0.88x -> 0.91x, 8192^3 0.97x -> 0.99x; 2344x8192x28672 0.93x -> 0.91x, 5000x14336x4096
# 1.03x -> 1.01x. They lost at 1124 rows (12% padding: 0.99x -> 0.89x) and K = 768
# (13642x2304x768 1.05x -> 0.99x), hence the bounds.
# Width -> efficiency (the sweep's median work per wave x tile area, relative to 128 x 256 in
# 2 x 1; ties keep this order). Not 256 x 192: with a residual its consumer spills (ptxas).
_TILES_256 = {160: 1.03, 128: 1.0}
_TILE_256_MIN_M = 2048
_TILE_256_MIN_K = 2048
# Taken only where modelled at least 1% cheaper: on a held-out A/B (16 grid shapes of seeds
# 61-79, same run, H100, 2026-11-26) the 256-row pick ran 1.03x the old one (geomean); of
# the four within 1% of the old pick's cost, two lost 3% and 13% (10175x7168x5120), one won
# 15% (13709x5120x5120) and one tied; beyond the margin the worst was 0.99x.
_TILE_256_MARGIN = 0.99


def _per_wave(cluster_size: int, num_sms: int) -> int:
    """Clusters of this size resident at once."""
    return MAX_ACTIVE_CLUSTERS[cluster_size] if num_sms == H100_SMS else max(1, num_sms // cluster_size)


def _waves(tiles_m: int, tiles_n: int, cm: int, cn: int, num_sms: int = H100_SMS) -> int:
    """Waves of a persistent grid of cm x cn clusters. The grid is padded to whole clusters,
    and a padded CTA costs a full tile (its loads are zero-filled, its MMAs still run): at
    627x4096x14336, 128 x 160 tiles (5 x 26) in 2 x 1 clusters pad to 3 x 26 clusters, two
    waves, 0.214 ms; in 1 x 2 clusters 5 x 13, one wave, 0.123 ms (H100, 2026-11-25, the
    tuner's sweep of a held-out grid shape)."""
    return math.ceil(math.ceil(tiles_m / cm) * math.ceil(tiles_n / cn) / _per_wave(cm * cn, num_sms))


def config_waves(cfg: GemmConfig, m: int, n: int, num_sms: int = H100_SMS) -> int:
    """Waves of `cfg`'s persistent grid for an M x N output (the swapped kernel's view under
    swap_ab; split-K counted, its splits being extra work items)."""
    clusters, _ = grid_clusters(cfg, *cfg.kernel_mn(m, n))
    per_wave = _per_wave(cfg.cluster_m * cfg.cluster_n, num_sms)
    head = clusters - clusters % per_wave  # whole waves run unsplit (GemmSm90._split_head)
    return math.ceil((head + (clusters - head) * cfg.split_k) / per_wave)


def _fits_one_wave(tiles_m: int, tiles_n: int, cm: int, cn: int, num_sms: int = H100_SMS) -> bool:
    """The tile grid in cm x cn clusters, at least 2 along each multicast dimension used, fits
    in one wave of resident clusters."""
    return tiles_m >= cm and tiles_n >= cn and _waves(tiles_m, tiles_n, cm, cn, num_sms) == 1


# Clusters of 128- and 256-row tiles: each one's time per wave relative to 2 x 1, (in one
# wave, in more than one), in order of preference at equal cost. Large M: 2 x 1 (B, the larger
# panel, multicast to two M tiles) was the best cluster of every large shape swept
# (gemm_tuning.md; 2 x 2 lost at M = 8192 in the GPT-2 XL tuning), and a wave of 1 x 2 clusters
# took 1.12-1.26x as long (held-out grid, H100, 2026-11-25: 9079x4096x14336 128 x 160, 15 waves
# of 2 x 1 1.68 ms, 14 of 1 x 2 1.97 ms; 4209x4096x4096 128 x 256, 5 waves 0.240 ms, 4 waves
# 0.215 ms).
_CLUSTER_COST = {(2, 1): (1.0, 1.0), (1, 2): (1.15, 1.15), (1, 1): (1.2, 1.2)}
# At most this many 128-row tiles along M (the largest count swept), the weight panels are read
# by few CTAs each and multicasting both panels pays: per wave, 2 x 2 took 0.85x the time of
# 2 x 1 and 1 x 1 1.2x (medians over 118 same-tile pairs), while in one wave the clusters were
# within 3% (56 pairs; 2 x 1 keeps them: 512x3072x768 on 1 x 2 0.89x cuBLAS, on 2 x 1 1.0x).
# The tuner's sweep of 23 held-out grid shapes, M 131-1908, H100, 2026-11-25.
_SMALL_M_TILES = 15
_CLUSTER_COST_SMALL_M = {(2, 2): (0.97, 0.85), (2, 1): (1.0, 1.0), (1, 2): (1.0, 1.02), (1, 1): (1.0, 1.2)}
# From 5 tiles along M on, 2 x 2 saved less per wave (782x128256x2048, 128 x 256: 0.98x of
# 2 x 1) and lost where it needed more waves (1861x152064x5120: 80 waves of 2 x 2 0.989x
# cuBLAS, 72 of 2 x 1 1.065x).
_CLUSTER_22_FEW_TILES_M = 4
_CLUSTER_22_COST_MORE_TILES_M = 0.95


def _cluster_for(tiles_m: int, tiles_n: int, tile: tuple[int, int], k: int = 0, in_bytes: int = 2,
                 num_sms: int = H100_SMS) -> tuple[int, int]:
    """The cluster of a tile shape. k = 0 (split-K candidates) leaves 64 x 64 unclustered and
    keeps 128-row tiles to the clusters the split-K model was fitted with (no 2 x 2)."""
    if tile == (64, 64):
        if (in_bytes == 2 and k >= _CLUSTER_64_MIN_K and tiles_m >= _CLUSTER_64_MIN_TILES_M
                and tiles_m * tiles_n >= _CLUSTER_64_MIN_TILES and _fits_one_wave(tiles_m, tiles_n, 2, 2, num_sms)):
            return (2, 2)
        return (1, 1)
    if tile == (64, 128):
        # B multicast to 4 M tiles, A to 2 N tiles (512x1600x6400, same run: 4 x 2 0.94x
        # cuBLAS, 4 x 1 0.93x, 2 x 2 0.71x); with fewer M tiles the largest cluster that still
        # multicasts both panels (206x2048x8192: 2 x 2 0.025 ms, 1 x 1 0.037; int8
        # 86x4096x14336: 2 x 2 0.029, 1 x 1 0.041; 10x4608x3584: 1 x 2 0.018, 1 x 1 0.020;
        # H100, 2026-11-25). default_config admits this tile only as one wave of its cluster.
        if tiles_m >= 4:
            return (4, 2)
        return (2, 2) if tiles_m >= 2 else (1, 2)
    # The fewest waves once the grid is padded to whole clusters (an odd tile count along M
    # makes 2 x 1 pay for a row of empty tiles), weighed by what each cluster's multicast
    # saves; ties keep the order of the table.
    small_m = tiles_m <= _SMALL_M_TILES and k > 0
    costs = _CLUSTER_COST_SMALL_M if small_m else _CLUSTER_COST
    best, best_cost = (1, 1), math.inf
    for c, (one, more) in costs.items():
        if tiles_m < c[0] or tiles_n < c[1]:
            continue
        waves = _waves(tiles_m, tiles_n, *c, num_sms)
        if c == (2, 2) and tiles_m > _CLUSTER_22_FEW_TILES_M:
            more = _CLUSTER_22_COST_MORE_TILES_M
        cost = waves * (one if waves == 1 else more)
        if cost < best_cost - 1e-9:
            best, best_cost = c, cost
    return best


def _raster_m(tile: tuple[int, int], tiles_m: int, tiles_n: int, cm: int, cn: int, num_sms: int) -> bool:
    """Raster order of a 128-row tile grid. Where the whole grid is resident at once (one
    wave) and has fewer tile rows than columns, walking N first was 10-18% faster in every
    such case the tuner swept on the H100 (2026-11-25, bf16 and fp8; 627x4096x14336 128 x 160
    in 1 x 2 clusters: 0.123 -> 0.102 ms; 600x6400x1600 128 x 256 unclustered: 0.026 -> 0.022)
    and tied where the grid was taller than wide (1908x1024x1024). Only clusters of one tile
    along M were swept so (2 x 2 in one wave: 131x3840x1280 tied either way)."""
    return not (tile[0] == 128 and cm == 1 and tiles_m < tiles_n and _waves(tiles_m, tiles_n, cm, cn, num_sms) == 1)


def default_config(m: int, n: int, k: int, *, num_sms: int = H100_SMS, in_bytes: int = 2) -> GemmConfig:
    """Pick tile, cluster, consumer mode and raster order for an M x N x K problem.

    Cost model: waves x tile area x (K + unhidden epilogue) / tile efficiency. A
    persistent kernel runs its clusters in waves, so a big tile that leaves SMs
    idle in its last wave loses to a smaller one that fills them; at short K the
    ping-pong tile wins because its epilogue overlaps the other warpgroup's math
    (the more so for 8-bit inputs, whose main loop is twice as fast). Each tile is
    costed in the cluster that needs the fewest waves (`_cluster_for`).
    """
    best, best_cost = None, math.inf
    for (tm, tn, pp), eff in _TILE_EFFICIENCY.items():
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        cm, cn = _cluster_for(tiles_m, tiles_n, (tm, tn), k, in_bytes, num_sms)
        if (tm, tn) == (64, 128) and not (_fits_one_wave(tiles_m, tiles_n, cm, cn, num_sms)
                                           and (in_bytes == 2 or k >= _TILE_64x128_MIN_K_8BIT)):
            continue  # only as one wave of its clusters; 8-bit inputs only past short K
        if (tm, tn) == (128, 256) and in_bytes == 1 and k < _TILE_128x256_MIN_K_8BIT:
            continue
        if (tm, tn) == (128, 96) and (cm, cn) == (1, 1) and _waves(tiles_m, tiles_n, 1, 1, num_sms) >= _TILE_128x96_MAX_WAVES_ALONE:
            continue  # no multicast over many waves: see _TILE_128x96_MAX_WAVES_ALONE
        cost = model_cost(m, n, k, GemmConfig(tm, tn, cm, cn, pingpong=pp), num_sms=num_sms, in_bytes=in_bytes,
                          weigh_cluster=False)
        if cost < best_cost - 1e-9:
            raster_m = _raster_m((tm, tn), tiles_m, tiles_n, cm, cn, num_sms)
            best, best_cost = GemmConfig(tm, tn, cm, cn, pingpong=pp, raster_m=raster_m), cost
    if in_bytes == 2 and m >= _TILE_256_MIN_M and k >= _TILE_256_MIN_K:
        for tn, eff in _TILES_256.items():
            waves = _waves(math.ceil(m / 256), math.ceil(n / tn), 1, 2, num_sms)
            cost = waves * 256 * tn * (k + _EPILOGUE_K[False]) / eff
            if cost < best_cost * _TILE_256_MARGIN:
                best, best_cost = GemmConfig(256, tn, 1, 2), cost
    assert best is not None
    return best


# Efficiencies of the tiles the heuristic never picks (the tuner's other candidates): only to
# order those candidates by `model_cost`, between their neighbours in _TILE_EFFICIENCY.
_TUNER_EFFICIENCY = {(128, 192, False): 0.93, (128, 128, False): 0.9, (64, 128, False): 0.7, (64, 64, False): 0.45,
                     (128, 64, False): 0.6, **{(256, tn, False): eff for tn, eff in _TILES_256.items()}}


def _efficiency(tm: int, tn: int, pp: bool) -> float:
    """Modelled throughput of a tile relative to 128 x 256 (0.8 for tiles never measured)."""
    return _TILE_EFFICIENCY.get((tm, tn, pp)) or _TUNER_EFFICIENCY.get((tm, tn, pp), 0.8)


def model_cost(m: int, n: int, k: int, cfg: GemmConfig, *, num_sms: int = H100_SMS, in_bytes: int = 2,
               weigh_cluster: bool = True) -> float:
    """`default_config`'s cost of any config (split-K ignored): waves of the grid padded to
    whole clusters, x tile area x (K + unhidden epilogue) / efficiency, the waves weighed by
    the cluster's factor (weigh_cluster; `default_config` weighs clusters only to pick each
    tile's cluster, then compares tiles unweighted, as its sweeps were fitted). The autotuner times the configs it ranks cheapest first; on the tuner's sweep
    of 23 grid shapes the fastest of each first round was among the 8 cheapest every time
    (H100, 2026-11-25)."""
    tm, tn, pp = cfg.tile_m, cfg.tile_n, cfg.pingpong
    eff = _efficiency(tm, tn, pp)
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    cm, cn = cfg.cluster_mn
    waves = _waves(tiles_m, tiles_n, cm, cn, num_sms)
    one = more = 1.0  # 64-row tiles: their clusters come from rules (`_cluster_for`), not costs
    if tm >= 128 and weigh_cluster:
        table = _CLUSTER_COST_SMALL_M if tiles_m <= _SMALL_M_TILES else _CLUSTER_COST
        one, more = table.get((cm, cn), (1.0, 1.0))
        if (cm, cn) == (2, 2) and tiles_m > _CLUSTER_22_FEW_TILES_M:
            more = _CLUSTER_22_COST_MORE_TILES_M
    if (tm, tn) == (64, 64) and (cm, cn) == (1, 1) and k * in_bytes >= 2 * _CLUSTER_64_MIN_K and tiles_m * tiles_n <= num_sms:
        eff = _TILE_64_UNCLUSTERED_LONG_K
    return waves * (one if waves == 1 else more) * tm * tn * (k + _EPILOGUE_K[pp]) / eff


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
    base_eff = _efficiency(base.tile_m, base.tile_n, base.pingpong)
    base_us = _model_us(base.tile_m, base.tile_n, base.pingpong, base_eff, tiles, k, num_sms)
    best, best_us = base, base_us * _SPLIT_GAIN
    for (tm, tn, pp), eff in _TILE_EFFICIENCY.items():
        if (tm, tn) not in _SPLIT_TILES:
            continue
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        nt = tiles_m * tiles_n
        cm, cn = _cluster_for(tiles_m, tiles_n, (tm, tn), num_sms=num_sms)
        clusters = math.ceil(tiles_m / cm) * math.ceil(tiles_n / cn)
        for s in range(2, MAX_SPLIT_K + 1):
            # every split of every (padded) cluster in one wave
            if nt * s > num_sms or clusters * s > _per_wave(cm * cn, num_sms) or s * MIN_SPLIT_K_TILES > k_tiles:
                break
            k_split = math.ceil(k_tiles / s) * tk  # the longest split
            finisher_bytes = (s - 1) * tm * tn * 4  # the other splits' fp32 partials
            us = _model_us(tm, tn, pp, eff, nt * s, k_split, num_sms) + _US_FIXUP + finisher_bytes / _FIXUP_BYTES_PER_US
            if us < best_us - 1e-9:
                best, best_us = GemmConfig(tm, tn, cm, cn, pingpong=pp, split_k=s), us
    return best


# swap_ab (D^T = B A^T, the token count along wgmma's N): taken for plain 16-bit epilogues when
# a width pads M at least 10% less than 128-row tiles. H100, 2026-11-26, same run, vs the
# heuristic's unswapped pick / the tuner's best unswapped config / cuBLAS (ms): 273x5120x5120
# 128 x 96 in 2 x 1: 0.0349 / 0.0414 / 0.0292; 260x4608x3584 0.0229 / 0.0292 / 0.0202;
# 320x16384x2048 128 x 160 in 1 x 2: 0.0379 / 0.0494 / 0.0374; 800x6400x1600 128 x 160 in 2 x 1:
# 0.0274 / 0.0308 / 0.0264 (docs/gemm.md). At 1048 and 1186 rows (padding 3-8% less) 160-wide
# tiles lost; 176-wide ones won (below).
SWAP_M = (129, 2048)
# Above 1024 rows a width of 176 or more that pads M less than 128-row tiles do is enough:
# there the unswapped tiles lost to 176-240-wide swapped ones at equal or 4% less padding, and
# narrower swapped tiles lost to both (H100, same run, vs cuBLAS: 1186x2048x2048 0.70x -> 0.87x
# with 176, 0.63x with 112; 1033x2048x8192 0.69x -> 0.93x; 1647x4096x4096 0.73x -> 0.99x with
# 208, 0.75x with 128; 1104x5120x27648 0.87x -> 0.96x; 1931x3584x3584 0.82x -> 0.90x with 224).
_SWAP_LOOSE_PAD_M = 1024
# On a held-out A/B (18 grid shapes of seeds 89-112, H100, 2026-11-26, vs the unswapped
# default) the rule lost at K = 1024 (1084x4096x1024 0.81x -> 0.68x cuBLAS, 1722x3072x1024
# 0.91x -> 0.85x); from K = 3584 it was mixed (1694x3584x3584 0.86x -> 1.00x, 1303x3584x18944
# 0.74x -> 0.76x; 1107x4608x3584 0.85x -> 0.80x, 1211x128256x8192 0.97x -> 0.94x).
_SWAP_LARGE_M_MIN_K = 2048
_SWAP_LARGE_M_MIN_W = 176
# Narrow weights (N = 768 / 1280: 6-10 tiles along the swapped kernel's M) and K = 768 ran
# swapped at 0.62-0.79x cuBLAS in the H100 grid (145x768x768, 186x768x3072, 177x1280x1280,
# 304x3072x768; 2026-11-26), and were not measured unswapped: left to the heuristic. At
# K = 1280 swapping won (284x5120x1280: 0.0110 ms vs 0.0139 unswapped, cuBLAS 0.0092).
SWAP_MIN_N = 2048
SWAP_MIN_K = 1024
# Widths in steps of 16 (128 x 144 in 1 x 2 at 277x28672x4096: 0.88x cuBLAS, 128 x 96 0.74x;
# 260x6144x4096 1.00x vs 128 x 160 0.88x); at K < 2048 only multiples of 32, whose epilogue
# moves 32-column slabs (845x4096x1024: 128 x 224 0.92x, 128 x 208 0.53x; H100, 2026-11-26).
_SWAP_WIDTHS = tuple(range(96, 257, 16))
_SWAP_SLAB16_MIN_K = 2048
_SWAP_MAX_PAD = 0.9

# Few tokens: 64 weight rows per tile and the token width in steps of 16 (what cuBLAS runs
# there, its kernel names say: nvjet 64x16 at M = 15, 64x40 in 1 x 2 at 77, 64x88 in 4 x 1 at
# 257, 64x112 in 4 x 1 at 328). Same-run sweeps on the H100, 2026-11-26 (docs/gemm.md), vs
# cuBLAS: the best token-tile count t was the most that fit one wave (137x4096x4096 t = 2:
# 0.94x, 180x4096x1024 0.98x, 309x4096x14336 1.08x, 400x3072x3072 1.03x, 700x2048x2048 0.95x,
# 664x1024x1024 t = 7 1.00x, 229x1280x1280 t = 5 0.92x), except where four or more tiles
# re-read a 2048+ row weight with <= 96 tokens each or a K of 4096+ (257x2048x2048 t = 4 0.64x,
# t = 3 0.83x; 328x2048x8192 0.60x / 0.94x; 539x2048x8192 t = 4 0.70x, t = 3 0.99x). An even t
# pairs the token tiles in 1 x 2 clusters (the weight tile multicast: 137x4096x4096 0.79x ->
# 0.94x); an odd t with K >= 2048 multicasts the tokens to 4 x 1 weight tiles when that is still
# one wave (328x2048x8192 0.86x -> 0.94x; as two waves 0.64x at 200x8192x4096).
NARROW_MIN_N = 768
NARROW_MIN_K = 768
NARROW_MAX_W = 256  # a 64 x 256 fp32 accumulator is 128 registers a thread
_NARROW_REREAD_W = 96
_NARROW_REREAD_N = 2048
_NARROW_REREAD_K = 4096
_NARROW_C41_MIN_K = 2048
# Under 20 weight tiles (GPT-2's 768 rows), token tiles wider than 96 lost to 128-row tiles: same
# run on the H100 (`gemm_narrow_band_probe_h100.md`), vs cuBLAS, 64-row swap_ab -> the 128-row
# pick: 1671x768x768 64 x 160 0.73x -> 128 x 96 in 2 x 2 0.92x, 1671x768x3072 0.66x -> 1.11x,
# 2081x768x768 64 x 192 0.77x -> 128 x 128 ping-pong 0.84x, 2081x768x3072 0.61x -> 0.86x.
_NARROW_SMALL_WT = 20
_NARROW_SMALL_WT_MAX_W = 96
# At most 128 tokens: one token tile, K split where the grid fills under a quarter of a wave
# with 48+ k-tiles (up to 3/4 of a wave, each split 12+ k-tiles long), or in two under half a
# wave with 128+: 9x1024x4096 (16 tiles) 0.78x -> 1.07x cuBLAS in 5 splits, 25x1280x5120 0.82x
# -> 1.03x in 4 (1.00x in 6), 57x1280x5120 0.94x in 4 (0.89x in 6), 19x768x3072 0.95x -> 1.04x,
# 45x4096x14336 (64 tiles) 0.98x -> 1.01x in 2; with 25-32 k-tiles a split lost 18-25%
# (26x1600x1600, 30x2048x2048). Unsplit, the most token tiles one wave holds, unclustered:
# 71x768x768 in five 16-wide tiles 0.99x, one 80-wide 0.89x; 68x1280x1280 0.97x / 0.88x;
# 95x2304x768 three 32-wide 1.02x, one 96-wide 0.95x (two 16-wide tiles in a 1 x 2 cluster
# lost 1-3% to one 32-wide: 26x1600x1600, 22x4096x4096, 30x2048x2048).
_NARROW_SPLIT_MIN_K_TILES = 48
_NARROW_SPLIT_K_TILES = 12
_NARROW_SPLIT_FILL = 3 / 4
_NARROW_SPLIT_LONG_K_TILES = 128
_NARROW_MAX_SPLIT = 8
# A grid of one to two waves of weight tiles whose second wave holds at most a quarter of the SMs
# splits that wave's tiles (`GemmConfig.split_k` splits only the last, partial wave) as many ways
# as the SMs hold, each split 12+ k-tiles long: a few CTAs cannot draw the bandwidth the weight
# streams at, and that wave is half the launch. Same run on the H200, 3 rounds
# (`gemm_probe_tail_split_h200.md`): Llama 3 70B's 10240-row qkv (160 tiles, 28 in the second
# wave) in 4 splits 6x10240x8192 0.96x -> 1.08x cuBLAS, 8x 0.98x -> 1.10x, 30x 1.08x -> 1.13x,
# 50x 0.87x -> 0.90x; last waves of 39-55% of the SMs gained nothing in 2 splits (28672 rows:
# 0.93x -> 0.93x, 100 tokens 0.91x -> 0.89x; 37888 and 55296 rows 1-4% slower). Held out
# (`gemm_probe_held_tail_wide_h200.md`): 8 of 8 at 10240 rows faster, 1.03x-1.13x (106x10240x8192
# 0.88x -> 0.96x); after many waves the split lost 0.5-1.5% (24 of 2004 tiles at 128256 rows, 8
# shapes), so the rule stops at two waves. fp8 and int8 at 10240 rows gain alike
# (`gemm_probe_fp8_tail_split_h200.md`, `gemm_probe_int8_tail_split_h200.md`): 5 of 5 fp8
# shapes of 4-100 tokens 1.02x-1.07x (8x10240x8192 1.05x -> 1.12x `_scaled_mm`), 4 of 4 int8
# 1.03x-1.06x.
_NARROW_TAIL_SPLIT_FILL = 1 / 4
# M <= 8 runs the skinny GEMV (matmul/gemv.py) unless the weight has more than SKINNY_MAX_N
# rows: 64 x 16 swapped tiles won every such shape swept (6x14336x4096 0.83x -> 0.99x cuBLAS,
# 4x16384x2048 0.92x -> 1.02x, 3x7168x5120 0.97x -> 1.09x) and lost most narrower ones
# (8x2048x2048 1.18x -> 0.90x, 2x4096x4096 1.13x -> 1.02x, 2x2048x8192 1.04x -> 0.98x), except
# at most SKINNY_SPLIT_MAX_N rows with long K, where the swapped tiles split K
# (2x1600x6400 0.99x -> 1.07x, 4x1024x4096 0.92x -> 1.01x).
SKINNY_MAX_N = 4096
SKINNY_SPLIT_MAX_N = 1600
SKINNY_SPLIT_MIN_K = 4096
# One row (M = 1) takes the swapped tiles on weights of more than SKINNY_MAX_N rows too, from
# K = NARROW_MIN_K: the one-row GEMV streams such a weight at 80-88% of HBM, the tiles' TMA ring
# at 85-92%. And a norm before such a product (LayerNorm / RMSNorm -> lm_head, 1-8 rows) runs as
# its own launch ahead of the tiles rather than in the GEMV's prologue (api.norm_prologue_fits).
# H200, same run (`python -m benchmarks.skinny_heads`, `skinny_heads_h200.md`): at one row the
# tiles 1.05x the GEMV over 16 weights of 4800-152064 rows (1.01x-1.20x; 1x32000x4096 69.1 ->
# 64.0 us, cuBLAS 66.6), the norm's own launch then the tiles 1.25x (RMSNorm) and 1.33x
# (LayerNorm) the fused launch over six heads at 1, 2 and 8 rows (min 1.07x / 1.01x; RMSNorm ->
# 128256 x 4096 at 8 rows 341 -> 251 us); decode steps 1.004x-1.044x (Llama-3-8B, Llama-3.2-1B
# and GPT-2 XL, batch 1 and 8, the same tokens). At 4096 rows and fewer the GEMV stays ahead
# (1x4096x14336 30.0 us against 32.8, 1x2048x8192 9.5 against 13.4), as at 2-8 rows. False: the
# GEMV and its fused prologue, as before.
WIDE_DECODE_TILES = True


def skinny_gemv(m: int, n: int, k: int, swappable: bool) -> bool:
    """Whether an M x N x K product of at most 8 rows takes the skinny GEMV rather than 64 x 16
    swap_ab tiles (`swappable`: a 16-bit product whose epilogue swap_ab can run)."""
    if m > 8:
        return False
    if m == 1:
        return not (WIDE_DECODE_TILES and swappable and n > SKINNY_MAX_N and k >= NARROW_MIN_K)
    wide = n > SKINNY_MAX_N or (n <= SKINNY_SPLIT_MAX_N and k >= SKINNY_SPLIT_MIN_K)
    return not (swappable and k >= 1024 and wide)


def narrow_swap_config(m: int, n: int, k: int, *, num_sms: int = H100_SMS, in_bytes: int = 2,
                       out_bytes: int = 2, integer: bool = False) -> GemmConfig | None:
    """The 64-row swap_ab config for an M x N x K problem (module notes above), or None where
    M > 128 and no token tiling of at most NARROW_MAX_W columns fits one wave. k is costed as
    16-bit either way. Token tiles pair in 1 x 2 clusters at 17-128 tokens, take the multicast
    clusters of NARROW_MULTICAST above, and, from 17 tokens, deep A/B rings where every weight
    tile is read once per cluster and in every multicast cluster above 128 tokens (`deep_ring`);
    integer: int8 inputs, in widths of 16 (NARROW_INT8)."""
    cfg = _narrow_swap_config(m, n, k, num_sms, narrow_step(integer))
    # Deep rings from 17 tokens, the range they were measured on (decode's 1-16 rows keep 8).
    if cfg is None or m < _PAIRED_MIN_M:
        return cfg
    # fp8's one unclustered token tile keeps 8 stages: on 25 such grid shapes of 20-105 tokens
    # (seeds 1017, 1023, 1031; H100, each against the same seed's earlier run) the deep ring
    # ran 0.991x geomean, 17 slower, 0.94x-1.16x. int8's 4 x 1 clusters keep 8 too (NARROW_INT8).
    clustered = cfg.cluster_m * cfg.cluster_n > 1
    once = math.ceil(m / cfg.tile_n) <= cfg.cluster_n and (clustered or in_bytes == 2)
    if integer and cfg.cluster_n == 1:
        return cfg
    if once or (m > 128 and clustered):
        return deep_ring(cfg, in_bytes, out_bytes)
    return cfg


# Where 64-row tiles pad the tokens exactly as much as 128-row ones (M just under a multiple of
# 128: 241-256, 369-384, ...), `swap_config` leaves the narrow config out and a 128-row pick
# runs; over a final 16-bit pick of 128 rows the narrow config in a cluster, at most 224 wide,
# ran faster. Same run on the H100, 3 rounds (`gemm_probe_narrow_equal_pad_h100.md`, 24 draws of
# seeds 14400-14999): the 11 such 1.01-1.41x (383x4096x14336 0.81x -> 1.14x cuBLAS, 617x2048x2048
# 0.85x -> 1.20x); 256 wide 0.85-1.02x (4), unclustered 0.97-1.02x, over 64-row picks 0.88-1.07x.
EQUAL_PAD_NARROW_MAX_W = 224


def equal_pad_narrow_config(m: int, n: int, k: int, current: GemmConfig, *,
                            num_sms: int = H100_SMS) -> GemmConfig | None:
    """The 64-row swap_ab config for a 16-bit M x N x K problem (M > 128) where it pads the tokens
    as much as 128-row tiles (notes above: EQUAL_PAD_NARROW_MAX_W) to replace a 128-row pick
    `current`, or None."""
    if m <= 128 or n < NARROW_MIN_N or k < NARROW_MIN_K or current.tile_m != 128:
        return None
    cfg = narrow_swap_config(m, n, k, num_sms=num_sms)
    if (cfg is None or cfg.tile_n > EQUAL_PAD_NARROW_MAX_W or cfg.cluster_m * cfg.cluster_n == 1
            or math.ceil(m / cfg.tile_n) * cfg.tile_n != math.ceil(m / 128) * 128):
        return None
    return cfg


# An unswapped one-wave pick at 257-1023 tokens and K >= 4096 (16-bit) pads the tokens to a
# multiple of 128 (351 -> 384) and the weight rows to its width (6144 -> 6240 in 160-wide
# tiles). One wave of swap_ab tiles pads less: 192-row weight tiles where they divide N
# (cuBLAS's nvjet 192x88 at 351x6144x4096), as many token tiles as one wave holds; else 128-row
# weight tiles over the token tiles (at least 0.9 of a wave) of the least padding, taken where
# that pads the tokens less than 128-row tiles. Token tiles pair in 1 x 2 clusters when their
# count is even, else 2 x 1. H200, same run, 3 rounds, vs cuBLAS, pick -> this
# (`gemm_probe_midm_swap_fit_h200.md`): 345x6144x4096 0.80x -> 0.98x, 351x6144x4096 0.80x ->
# 0.97x, 360x6144x4096 0.87x -> 0.97x, 345x8192x8192 0.92x -> 1.00x, 351x8192x8192 0.94x ->
# 1.02x, 340x8192x28672 0.85x -> 0.98x, 690x4096x4096 0.93x -> 1.00x; left, where 128-row
# tiles pad as much: 380x8192x8192 1.10x (swapped 1.01x), 372x8192x28672 1.02x (1.02x),
# 640x4096x4096 1.01x (1.01x); three 208-wide token tiles at 600x4096x4096 (96 CTAs) 0.75x
# against the pick's 0.93x. Held out, the 10 draws it changes (`gemm_probe_midm_swap_held_h200.md`):
# all faster, 0.80x-0.96x -> 0.95x-1.05x (347x8192x8192 0.83x -> 0.99x, 350x6144x4096 0.80x ->
# 0.95x, 702x4096x14336 0.93x -> 1.01x).
MID_M_SWAP_M = (257, 1023)
MID_M_SWAP_MIN_K = 4096
MID_M_SWAP_MIN_N = 4096
_MID_M_SWAP_FILL = 0.9  # of a wave: 600x4096x4096 in three 208-wide token tiles (96 CTAs) ran 0.79x


def mid_m_swap_config(m: int, n: int, k: int, current: GemmConfig, *, num_sms: int = H100_SMS) -> GemmConfig | None:
    """The one-wave swap_ab config for a 16-bit M x N x K problem (notes above: MID_M_SWAP_*) to
    replace an unswapped one-wave pick `current`, or None."""
    if (not MID_M_SWAP_M[0] <= m <= MID_M_SWAP_M[1] or k < MID_M_SWAP_MIN_K or n < MID_M_SWAP_MIN_N
            or current.swap_ab or current.split_k > 1 or config_waves(current, m, n, num_sms) != 1):
        return None
    wave_192 = _one_wave_192_config(m, n, num_sms)
    if wave_192 is not None:
        return wave_192
    wt, best = math.ceil(n / 128), None
    for t in range(math.ceil(_MID_M_SWAP_FILL * num_sms / wt), num_sms // wt + 1):
        w = math.ceil(m / t / 16) * 16
        if w <= 256 and (best is None or t * w < best[0] * best[1]):
            best = (t, w)
    if best is None or best[0] * best[1] >= math.ceil(m / 128) * 128:
        return None
    t, w = best
    return GemmConfig(128, w, 1, 2, swap_ab=True) if t % 2 == 0 else GemmConfig(128, w, 2, 1, swap_ab=True)


# A one-wave pick at 257-1023 tokens that leaves over a fifth of the SMs idle (96 CTAs of 132:
# 24 weight tiles x 4 token tiles, or 30 x 3) on a weight of 3072+ rows, at any K: one wave of
# 128-row swap_ab tiles over as many token tiles t as it holds (cuBLAS runs nvjet 128 x 136 /
# 192 x 88 at 523x3840x1280), clustered 1 x 2 where t is even, else 4 x 1 where the weight
# tiles divide by 4 (the token tile multicast to four weight tiles; 2 x 1 ran 3-10% slower at
# 420-491 x 3072), else 2 x 1. Taken where the token tiles stay at least MID_M_FILL_MIN_W wide
# and the grid grows by a tenth. H200, same run, 2 rounds, vs cuBLAS, pick -> this
# (`gemm_probe_midm_low_fit_h200.md`): 523x3840x1280 0.82x -> 1.01x, 556x4096x1024 0.84x ->
# 0.99x, 443x4800x1600 0.75x -> 0.97x, 425x4800x1600 0.73x -> 0.94x, 474x3072x768 0.85x -> 1.02x,
# 491x3072x2048 0.81x -> 0.94x, 438x3072x768 0.93x -> 1.03x, 420x3072x1024 0.92x -> 0.99x; 64-wide
# token tiles lost (300x3072x2048 0.99x -> 0.89x), and on weights under 3072 rows the 64-row
# picks mostly won (526x1600x6400 1.39x against 1.01x; 683x2048x8192 0.82x against 0.91x).
# Held out, 14 draws it changes (`gemm_probe_midm_fill_held_h200.md`, 3 rounds): 13 faster,
# 0.69x-1.00x -> 0.86x-1.11x (387x4800x1600 0.69x -> 0.92x, 517x3840x1280 0.80x -> 1.01x),
# 383x3072x2048 0.99x -> 0.95x (80-wide token tiles). fp8 per-row (`scaled_mm`, swap_ab where
# no bias rules it out), same rule: 292x4608x3584 0.91x -> 1.16x `_scaled_mm`
# (`gemm_probe_fp8_c41_mid_h200.md`, the H200 grid's fp8 min at seed 2005), and held out, all 19
# draws it changes faster (`gemm_probe_fp8_fill_held_h200.md`): 541x3072x2048 0.80x -> 1.08x,
# 572x3072x2048 0.81x -> 1.05x, 296x4608x3584 0.90x -> 1.12x, 389x4608x3584 1.12x -> 1.53x,
# 630x5120x5120 0.99x -> 1.04x; the least gain 371x3072x1024 1.20x -> 1.23x. int8 (`int8_mm`),
# the same rule in widths of 16: 9 of 9 faster (`gemm_probe_int8_fill_fit_h200.md`, vs
# `_int_mm`): 322x3072x768 1.47x -> 1.63x, 576x3072x2048 1.25x -> 1.63x, 425x4608x3584 1.70x ->
# 2.28x, 586x5120x5120 2.02x -> 2.37x. Held out (`gemm_probe_int8_held_h200.md`): over 128-row
# picks 11 of 11 faster, 1.11x-1.36x (547x3072x2048 1.27x -> 1.72x, 447x5120x27648 2.11x ->
# 2.75x); over 64-row swap_ab picks of two token tiles 5 of 7 slower (0.90x-0.94x the pick at
# 321-352 tokens x 3072 x 2048), so int8 keeps those.
MID_M_FILL_MIN_N = 3072
MID_M_FILL_MAX_FILL = 0.8
MID_M_FILL_MIN_W = 80


def _ctas(cfg: GemmConfig, m: int, n: int) -> int:
    km, kn = cfg.kernel_mn(m, n)
    return math.ceil(km / cfg.tile_m) * math.ceil(kn / cfg.tile_n) * cfg.split_k


def mid_m_fill_config(m: int, n: int, k: int, current: GemmConfig, *, num_sms: int = H100_SMS,
                      step: int = 8) -> GemmConfig | None:
    """The one-wave 128-row swap_ab config for a 16-bit, fp8 or int8 M x N x K problem (notes
    above: MID_M_FILL_*) to replace a one-wave pick `current` that fills too few SMs, or None.
    step: the token-width step, 16 for int8 (`narrow_step`)."""
    if (not MID_M_SWAP_M[0] <= m <= MID_M_SWAP_M[1] or n < MID_M_FILL_MIN_N or current.split_k > 1
            or config_waves(current, m, n, num_sms) != 1 or _ctas(current, m, n) > MID_M_FILL_MAX_FILL * num_sms
            or (step == _NARROW_STEP_INT and current.swap_ab and current.tile_m == 64)):
        return None
    for t in range(num_sms // math.ceil(n / 128), 0, -1):
        cfg = _token_tiles_128(m, n, t, step)
        if cfg.tile_n <= 256 and config_waves(cfg, m, n, num_sms) == 1:
            break
    else:
        return None
    if cfg.tile_n < MID_M_FILL_MIN_W or _ctas(cfg, m, n) < 1.1 * _ctas(current, m, n):
        return None
    return cfg


def _token_tiles_128(m: int, n: int, tiles: int, step: int = 8) -> GemmConfig:
    """128-row swap_ab weight tiles over M tokens in `tiles` token tiles of the covering width:
    1 x 2 clusters where the token tiles pair up, else 4 x 1 where the weight tiles come in
    fours (the token tile multicast to four weight tiles), else 2 x 1 (`mid_m_fill_config`,
    `fp8_equal_fill_swap_config`)."""
    w = _covering_width(m, tiles, step)
    tiles = math.ceil(m / w)  # the rounding up of w may need fewer
    cm, cn = (1, 2) if tiles % 2 == 0 else (4, 1) if math.ceil(n / 128) % 4 == 0 else (2, 1)
    return GemmConfig(128, w, cm, cn, swap_ab=True)


def narrow_step(integer: bool) -> int:
    """The token-width step of 64-row swap_ab tiles: 8, or 16 for int8 (NARROW_INT8)."""
    return _NARROW_STEP_INT if integer else _NARROW_STEP_16BIT


def deep_ring(cfg: GemmConfig, in_bytes: int = 2, out_bytes: int = 2) -> GemmConfig:
    """`cfg` with the deepest A/B ring that fits, up to DEEP_AB_STAGES, where that is deeper
    than the default."""
    fit = min(DEEP_AB_STAGES, stages_that_fit(cfg, in_bytes, out_bytes))
    return dataclasses.replace(cfg, stages=fit) if fit > MAX_AB_STAGES else cfg


# 17-128 tokens against at most 66 weight tiles (16-bit): two token tiles of half the tokens
# in a 1 x 2 cluster (each CTA loads half the weight tile and multicasts it: twice the SMs
# stream the weights, each weight byte leaves HBM once), with the deepest ring that fits, and
# K split so the grid fills a wave where it has 64+ k-tiles. Same run on the H100 over 62
# shapes of 20-158 tokens (`gemm_narrow_depth_probe_h100.md`): deep rings against the default
# 8 stages, same config: 1.09-1.11x in 1 x 2 / 4 x 1 clusters, 1.04x unclustered with one token
# tile; unclustered configs whose token tiles re-read a weight tile lost up to 10%
# (122x3584x18944, 64 x 64: 0.0596 -> 0.0658 ms). 104x768x3072: split 4 lost 8% to unsplit
# 48 k-tiles. On 44 held-out shapes (`gemm_narrow_depth_ab_h100.md`) the paired tiles won
# 3.4% geomean and lost 3-6% on weights of fewer than 20 tiles with short K (36x768x768,
# 44x1024x1024, 114x1024x1024), where the unclustered rule runs 3-8 token tiles on more SMs:
# those keep it.
_PAIRED_MIN_M = 17
_PAIRED_MIN_WT = 20
_PAIRED_SHORT_WT_MIN_K_TILES = 48
DEEP_AB_STAGES = 12
_PAIRED_SPLIT_MIN_K_TILES = 64
# NARROW_MULTICAST (every input type; int8 as NARROW_INT8 below says): widths in
# steps of 8 (64 x 40 at 75 tokens, as cuBLAS runs 64 x 40 at 77), and above 128 tokens the
# most token tiles t whose grid is one wave in the first cluster shape that fits of: 4 x 2 (each
# weight tile multicast to two token tiles, each token tile to four weight tiles; 15 clusters of
# 8 a wave), 1 x 2 up to t = 4, 4 x 1; fewer tiles where none fits (with K < 2048, 1 x 2 or
# unclustered at any t, as before). Every multicast cluster above 128 tokens takes the deepest
# A/B ring that fits (up to DEEP_AB_STAGES). H100, same run (`gemm_probe_multicast_h100.md`, 77
# shapes of 17-1023 tokens whose pick the rule changes): 1.093x the picks before it, 0.978x ->
# 1.069x cuBLAS, 26 -> 5 shapes below 0.95x; 312x1280x5120 64 x 64 in 4 x 1 0.86x -> 64 x 56 in
# 4 x 2 at 12 stages 1.05x; 228x4096x4096 0.83x -> 1.22x (64 x 120 in 1 x 2); 598x2048x2048
# 0.73x -> 1.15x (64 x 152 in 1 x 2, 608 rows where 128-row tiles pad 640). In the draft's run
# (`gemm_probe_multicast_variants_h100.md`) the same configs with 8 stages lost 4-15% (64 x 56
# in 4 x 2 0.89x, 64 x 88 in 4 x 2 at 511x1280x5120 0.90x vs 1.02x), and 1 x 2 clusters lost
# from six token tiles up (511x1280x5120 0.71x; 670x1024x4096, eight tiles, 0.66x vs seven in
# 4 x 1 0.97x). One token tile lost to 128-row ones above 176 columns in 4 x 1 or 144
# unclustered (231x5120x5120 64 x 240 0.89x, 128 x 96 in 2 x 2 1.03x; 170x8192x28672 0.95x ->
# 1.06x; 147x7168x5120 64 x 152 in 4 x 1 1.01x, 128 x 96 0.89x in the draft's run); at
# K < 2048 it stays (196x6400x1600 0.90x vs 128 x 224 0.69x: widths of 32 there). Widths above
# 224 keep steps of 16 (481x3072x2048 64 x 248 in 4 x 2 0.83x, 64 x 256 0.93x). Four token tiles
# re-read a 2048+ row weight where three cannot hold the tokens (845x2048x8192: 64 x 216 in
# 1 x 2, 1.05x cuBLAS in `gemm_grid_h100.md`). A 4-row multicast config is taken at up to 1.04x
# the rows 128-row tiles pad (511x1280x5120: 528 vs 512 rows, 64 x 88 in 4 x 2 at 11 stages
# 0.98x vs 0.82x). fp8 with 16-bit outputs: the 19 picks it changed on grid seeds 1017, 1023 and
# 1031 ran 1.167x faster than the same seeds' earlier runs (845x2048x8192 0.72x -> 1.16x
# `_scaled_mm`; docs/gemm.md).
# NARROW_INT8: int8 takes the same rules in widths of 16 (wgmma's s8 shapes step N by 16), with
# three differences, each measured (H100, same run, `python -m benchmarks.gemm_probe configs
# --dtype int8`: `gemm_probe_int8_multicast_h100.md`, `gemm_probe_int8_multicast_rules_h100.md`,
# `gemm_probe_int8_eqpad_h100.md`): token tiles pair at 17-128 tokens only from 16 k-tiles of 128
# (K >= 2048; at 1600x1600 the pair ran 0.83-0.95x five unclustered 16-wide tiles at 71-78
# tokens, 1.00x at 23-41, 1.06x at 99; at K = 2048 1.00-1.10x on 11 shapes); 4 x 1 clusters
# keep 8 stages (deep: 0.94x-0.99x on three shapes); and a clustered token tiling that pads M
# as much as 128-row tiles do is taken
# (845x2048x8192 64 x 224 in 1 x 2 1.34x the 128 x 128 pick, 512x2048x2048 1.24x,
# 380x4096x4096 1.14x; 510x4096x14336 0.95x), an unclustered one not (254x4608x3584 64 x 256
# 0.91x). Over the 39 shapes of 17-979 tokens whose pick the rules change, 1.082x the picks
# before them (6 slower, min 0.85x at 54x3584x3584); 816x1280x5120 1.89x -> 2.75x `_int_mm`,
# 102x4096x14336 0.99x -> 1.28x.
_NARROW_STEP_16BIT = 8
_NARROW_STEP_INT = 16
_INT8_PAIRED_MIN_K_TILES = 16
_NARROW_PAIR_MAX_T = 4
_NARROW_ONE_TILE_MAX_W = 176
_NARROW_ONE_TILE_C11_MAX_W = 144
_NARROW_STEP8_MAX_W = 224
_NARROW_C4_PAD = 1.04


def _narrow_swap_config(m: int, n: int, k: int, num_sms: int, step: int) -> GemmConfig | None:
    wt = math.ceil(n / 64)  # weight tiles: the swapped kernel's M
    k_tiles = math.ceil(k / 64)
    if (_PAIRED_MIN_M <= m <= 128 and 2 * wt <= num_sms
            and (wt >= _PAIRED_MIN_WT or k_tiles >= _PAIRED_SHORT_WT_MIN_K_TILES)
            and (step == _NARROW_STEP_16BIT or k_tiles >= _INT8_PAIRED_MIN_K_TILES)):
        split = 1
        if k_tiles >= _PAIRED_SPLIT_MIN_K_TILES:
            split = min(num_sms // (2 * wt), k_tiles // _NARROW_SPLIT_K_TILES, _NARROW_MAX_SPLIT)
        return GemmConfig(64, math.ceil(m / 2 / step) * step, 1, 2, split_k=split,
                          swap_ab=True)
    if m <= 128:
        split = 1
        if 4 * wt <= num_sms and k_tiles >= _NARROW_SPLIT_MIN_K_TILES:
            split = min(int(_NARROW_SPLIT_FILL * num_sms) // wt, k_tiles // _NARROW_SPLIT_K_TILES, _NARROW_MAX_SPLIT)
        elif 2 * wt <= num_sms and k_tiles >= _NARROW_SPLIT_LONG_K_TILES:
            split = 2
        if split >= 2:
            return GemmConfig(64, math.ceil(m / 16) * 16, 1, 1, split_k=split, swap_ab=True)
        # Unsplit: the most token tiles one wave holds, unclustered.
        w = math.ceil(m / max(num_sms // wt, 1) / 16) * 16
        tail, split = wt * math.ceil(m / w) % num_sms, 1
        if num_sms < wt < 2 * num_sms and 0 < tail <= _NARROW_TAIL_SPLIT_FILL * num_sms:
            split = max(min(num_sms // tail, k_tiles // _NARROW_SPLIT_K_TILES, _NARROW_MAX_SPLIT), 1)
        return GemmConfig(64, w, 1, 1, split_k=split, swap_ab=True)
    return _narrow_multicast_config(m, n, k, wt, num_sms, step)


def _narrow_width(m: int, tiles: int, step: int = _NARROW_STEP_16BIT) -> int:
    """The narrowest token-tile width that covers m tokens in `tiles` tiles: steps of `step`, of 16
    above _NARROW_STEP8_MAX_W."""
    w = math.ceil(m / tiles / step) * step
    return w if w <= _NARROW_STEP8_MAX_W else math.ceil(m / tiles / 16) * 16


def _narrow_multicast_config(m: int, n: int, k: int, wt: int, num_sms: int, step: int) -> GemmConfig | None:
    """Above 128 tokens (module notes: NARROW_MULTICAST; int8: NARROW_INT8): the most token
    tiles t whose grid, in the first cluster shape of 4 x 2, 1 x 2 (t <= 4), 4 x 1 that fits,
    is one wave."""
    t0 = num_sms // wt
    if t0 < 1:
        return None
    w = _narrow_width(m, t0, step)
    if w > NARROW_MAX_W or (wt < _NARROW_SMALL_WT and w > _NARROW_SMALL_WT_MAX_W):
        return None
    t0 = math.ceil(m / w)
    if (t0 >= 4 and n >= _NARROW_REREAD_N and (w <= _NARROW_REREAD_W or k >= _NARROW_REREAD_K)
            and _narrow_width(m, t0 - 1, step) <= NARROW_MAX_W):
        t0 -= 1  # where fewer tiles still hold the tokens (845x2048x8192 keeps four 216-wide ones)
    wave8, wave4 = _per_wave(8, num_sms), _per_wave(4, num_sms)
    long_k = k >= _NARROW_C41_MIN_K
    for tiles in range(t0, 0, -1):
        w = _narrow_width(m, tiles, step)
        if w > NARROW_MAX_W:  # three tiles cannot hold the tokens (769x2048x8192: 272 wide)
            return None
        t = math.ceil(m / w)
        c41 = long_k and math.ceil(wt / 4) * t <= wave4
        if t == 1:
            if k >= _SWAP_SLAB16_MIN_K and w > (_NARROW_ONE_TILE_MAX_W if c41 else _NARROW_ONE_TILE_C11_MAX_W):
                return None
            return GemmConfig(64, w, 4 if c41 else 1, 1, swap_ab=True)
        if t % 2 == 0 and long_k and math.ceil(wt / 4) * (t // 2) <= wave8:
            return GemmConfig(64, w, 4, 2, swap_ab=True)
        if t % 2 == 0 and (t <= _NARROW_PAIR_MAX_T or not long_k):
            return GemmConfig(64, w, 1, 2, swap_ab=True)
        if c41:
            return GemmConfig(64, w, 4, 1, swap_ab=True)
        if t <= _NARROW_PAIR_MAX_T or not long_k:
            return GemmConfig(64, w, 1, 1, swap_ab=True)
    return None


# Narrow weights (fewer than SWAP_MIN_N rows: the GPT-2 family) at 1400-4096 tokens: one wave of
# 128-row swap_ab tiles in 2 x 1 clusters, the narrowest width in steps of 32 that fits, as cuBLAS
# runs there (its kernel names on the H100: 128 x 88-304 token tiles in 120-132 CTAs, e.g.
# 128x216 at 2081x1600x1600). Same run on the H100 (`gemm_swap_wave_h100.md`), 31 probe shapes
# of 1400-3500 tokens against weights of 768-1600 rows: 29 picks change, 1.095x (min 0.978x),
# 0.832x -> 0.906x cuBLAS (2081x1024x4096 0.73x -> 0.94x, 2331x1024x4096 0.67x -> 0.97x). On a
# held-out draw of 34 shapes (a later run) the rule without the long-K guard below changed 29
# picks, 1.035x, min 0.764x; with it 26, 1.062x, min 0.942x (0.885x -> 0.927x cuBLAS). Below
# 1400 tokens the one-wave tiles lost to 64-row ones (1302x1600x6400 0.74x, 767x1280x5120
# 0.79x); 1 x 2 clusters, which pad an odd weight-tile count with a whole row of CTAs, lost
# where 2 x 1 fits no wave; widths of 16 mod 32 lost at K = 5120 (1671x1280x5120 128 x 144:
# 0.89x the pick). The long-K guard: with K >= 4096 under 2000 tokens the rule replaces only a
# pick of two or more waves: one wave of unswapped ping-pong tiles in 2 x 2 clusters beat the
# swapped tiles there (1444x1280x5120 128 x 128: 0.0299 ms vs 0.0392), two waves of unswapped
# 128 x 96 tiles did not (1831x1600x6400 0.1000 ms vs 0.0633). On the H200 the guard holds only
# where the weight's 128-row tiles are odd (1600 rows: 13, a 2 x 1 grid pads a row of CTAs):
# same runs, 3 rounds, 1400-2000 tokens, the one-wave 2 x 1 swap_ab tile against the picks
# (`gemm_probe_narrow_long_k_h200.md`, in git at 5f341b1): 1024 / 1280 / 2048 rows (8 / 10 / 16
# tiles) 1.00x-1.33x on all 8 draws (1875x1024x4096 0.75x -> 1.00x cuBLAS), 1600 rows
# 0.87x-0.90x; held out, the
# 16 draws this changes (`gemm_probe_wave_swap_even_held_h200.md`): 1.093x, 11 faster, vs
# cuBLAS 0.885x -> 0.967x, the minimum 0.743x -> 0.897x; the 6 slower ones (0.980x-0.996x) were
# over picks in 4 x 2, 2 x 2 and 1 x 2 clusters (the H100's 1444x1280x5120 above is one), so the
# guard stays for those: over 2 x 1 and unclustered picks 10 of 10 faster, 1.155x (fitted on
# that run, not held out).
WAVE_SWAP_M = (1400, 4096)
_WAVE_SWAP_WIDTHS = tuple(range(96, 257, 32))
# Weights of at most 1024 rows (GPT-2 small's and medium's o / down) take the same one wave from
# 700 tokens, in the narrowest width of steps of 16 from 64 that fits, where the pick it
# replaces runs in clusters of at most 2 CTAs. Same runs on the H100: probe
# (`gemm_wave_narrow_probe_h100.md`, 20 shapes of 769-1281 tokens x the four weights, K
# 768-4096) and a later draw of 24 (`gemm_wave_narrow_ab_h100.md`). Replacing every pick:
# 1.175x and 1.031x (min 0.84x, 0.87x), every loss over a pick in 2 x 2 or 4 x 2 clusters
# (128 x 96, 64 x 128 ping-pong), which share both operands across the cluster. With the guard
# (fitted on both sets) 11 of 20 and 5 of 24 change, 1.07x-1.45x each, none slower: 1.134x and
# 1.043x over the sets. 1280-1600-row weights kept their picks (within 15% either way), and at
# 641 tokens 64-row tiles in 4 x 1 clusters won at K = 4096. A weight whose 128-row tiles come in
# fours (1024 rows) takes them in 4 x 1 clusters (each token tile multicast to four weight
# tiles) where one wave holds them, as cuBLAS runs 1163x1024x4096 (nvjet 128x80, cluster 4x1),
# replacing 128-row picks in any cluster: same run on the H100, 16 held-out shapes of 700-1010
# tokens whose pick it changes (`gemm_probe_swap_c41_rule_h100.md`): 1.179x the picks before it
# (1.08x-1.27x, 0.92x -> 1.09x cuBLAS); at 1050-1440 tokens 0.77x-0.98x -> 0.99x-1.14x against
# the 2 x 1 tiles; the table's entries tuned at 1218 tokens ran 0.65x-1.00x across their bucket
# against the rule's 0.98x-1.05x (`gemm_probe_swap_c41_table_h100.md`) and left the table.
WAVE_SWAP_NARROW = (700, 1024)  # (tokens from, weight rows up to)
# Above 4096 tokens the same narrow weights take one wave of 256-row swap_ab tiles in 1 x 2
# clusters where one holds them (the narrowest width of steps of 16 up to 192), over picks not
# already in 1 x 2: cuBLAS's own choice there (nvjet 256x160, cluster 1x2, at 5020x1024x4096).
# Same runs on the H100: 22 probe shapes of 4135-7419 tokens on 768-1280-row weights
# (`gemm_probe_swap256_wave_h100.md`) 1.078x the picks (min 0.94x), 5020x1024x4096 0.79x ->
# 0.98x cuBLAS; 27 held-out shapes whose pick it changes (`gemm_probe_swap256_wave_rule_h100.md`)
# 1.095x (min 0.978x, 4 slower), 0.858x -> 0.940x cuBLAS, 25 -> 14 below 0.95x. Picks in 1 x 2
# lost (4190x768x3072 128 x 192 ping-pong 1.03x vs 0.82x). Up to 7680 tokens, the range measured
# (the 8192-token suite shapes keep their picks).
_WAVE_SWAP_256_MAX_M = 7680
_WAVE_SWAP_256_WIDTHS = tuple(range(128, 193, 16))  # 256-row tiles: tile_n <= 192 (GemmConfig.validate)
_WAVE_SWAP_NARROW_WIDTHS = tuple(range(64, 257, 16))
_WAVE_SWAP_LONG_K = 4096
_WAVE_SWAP_LONG_K_MIN_M = 2000


def wave_swap_config(m: int, n: int, k: int, current: GemmConfig, *, num_sms: int = H100_SMS) -> GemmConfig | None:
    """The one-wave swap_ab config for a 16-bit M x N x K problem with a narrow weight (notes
    above: WAVE_SWAP_M, WAVE_SWAP_NARROW below it, 256-row tiles above it) to replace `current`
    (the pick it would replace), or None outside those ranges or where no width fits one wave."""
    if WAVE_SWAP_NARROW[0] <= m < WAVE_SWAP_M[0] and NARROW_MIN_N <= n <= WAVE_SWAP_NARROW[1] and k >= NARROW_MIN_K:
        shared = current.cluster_m * current.cluster_n > 2
        # Weight tiles in fours: 4 x 1 clusters, over any 128-row pick.
        if math.ceil(n / 128) % 4 == 0 and (not shared or current.tile_m == 128):
            fits = one_wave_swaps(m, n, _WAVE_SWAP_NARROW_WIDTHS, (4, 1), num_sms=num_sms)
            if fits:
                return fits[0]
        if shared:
            return None
        fits = one_wave_swaps(m, n, _WAVE_SWAP_NARROW_WIDTHS, num_sms=num_sms)
        return fits[0] if fits else None
    if WAVE_SWAP_M[1] < m <= _WAVE_SWAP_256_MAX_M and NARROW_MIN_N <= n < SWAP_MIN_N and k >= NARROW_MIN_K:
        if current.cluster_mn == (1, 2):
            return None
        fits = one_wave_swaps(m, n, _WAVE_SWAP_256_WIDTHS, (1, 2), tile_m=256, num_sms=num_sms)
        return fits[0] if fits else None
    if not (WAVE_SWAP_M[0] <= m <= WAVE_SWAP_M[1] and NARROW_MIN_N <= n < SWAP_MIN_N and k >= NARROW_MIN_K):
        return None
    guarded = math.ceil(n / 128) % 2 or current.cluster_mn not in ((1, 1), (2, 1))
    if k >= _WAVE_SWAP_LONG_K and m < _WAVE_SWAP_LONG_K_MIN_M and config_waves(current, m, n, num_sms) < 2 and guarded:
        return None
    fits = one_wave_swaps(m, n, _WAVE_SWAP_WIDTHS, num_sms=num_sms)
    return fits[0] if fits else None


# A narrow weight whose 128-row tiles are odd in number (GPT-2 XL's 1600-row down projection: 13)
# keeps wave_swap_config's 2 x 1 tiles out at long K (a 2 x 1 cluster pads a whole row of CTAs);
# its picks there are unswapped ping-pong tiles at 0.85x-0.95x cuBLAS, where cuBLAS runs nvjet
# 128x176 1x2 (1718x1600x6400). 128-row swap_ab tiles in 1 x 2 clusters (two token tiles share
# each weight tile; nothing padded along the weight) of the least padded waves x tile area
# (128-256 wide in steps of 8) replace such a pick that pads as much. H200, same runs, 3
# alternating rounds, pick -> 1 x 2: 1718x1600x6400 0.930x -> 0.995x cuBLAS, 1712 / 3626 / 3828
# tokens 1.031x / 1.099x / 1.053x (`gemm_probe_narrow_long_k_fit_h200.md`, in git at f093b46);
# 2 x 2 ping-pong picks (1475 / 1527 tokens) 1.031x / 0.993x, and past 4096 tokens a 128 x 160
# ping-pong pick 0.90x (14883 tokens): the bounds. Held out (`gemm_probe_odd_narrow_pair_held_h200.md`):
# 10 draws 1.085x, 9 faster (slowest 0.976x), vs cuBLAS 0.918x -> 0.996x, the minimum 0.818x -> 0.964x.
ODD_NARROW_PAIR_M = (1400, 4096)
ODD_NARROW_PAIR_MIN_K = 4096
_ODD_NARROW_PAIR_CFGS = tuple(GemmConfig(128, w, 1, 2, swap_ab=True) for w in range(128, 257, 8))


def odd_narrow_pair_config(m: int, n: int, k: int, current: GemmConfig, *,
                           num_sms: int = H100_SMS) -> GemmConfig | None:
    """128-row swap_ab tiles in 1 x 2 for a 16-bit M x N x K problem on a narrow weight with an odd
    128-row tile count (notes above: ODD_NARROW_PAIR_*) over an unswapped ping-pong pick `current`
    in a 1 x 1 or 2 x 1 cluster that pads at least as much, else None."""
    if not (ODD_NARROW_PAIR_M[0] <= m <= ODD_NARROW_PAIR_M[1] and NARROW_MIN_N <= n < SWAP_MIN_N
            and math.ceil(n / 128) % 2 and k >= ODD_NARROW_PAIR_MIN_K):
        return None
    if current.swap_ab or not current.pingpong or current.cluster_mn not in ((1, 1), (2, 1)) or current.split_k > 1:
        return None
    best = _least_padding(_ODD_NARROW_PAIR_CFGS, m, n, num_sms)
    return best if _padded_area(best, m, n, num_sms) <= _padded_area(current, m, n, num_sms) else None


# Vocabulary-sized and other wide weights (N >= 16384: the GPT-2 lm_heads, Llama 3.2 1B's gate_up
# and lm_head) at short K from 256 tokens: ping-pong 128-row swap_ab tiles. The grid runs many tiles
# per CTA there and K is short, so one warpgroup's epilogue hidden under the other's main loop is
# worth more than a cooperative tile's; cuBLAS runs its non-cooperative nvjet kernels at such
# shapes (128x168, 2x1, at 328x16384x2048). Up to 1150 tokens the cluster pairs two token tiles
# (1 x 2: each weight tile multicast to both; an even token tile count, an odd one pads a whole
# column of CTAs), above it two weight tiles (2 x 1). Width: the fewest waves x width /
# `_swap_width_efficiency`, the wider on a tie, in steps of 8 up to 192 (a ping-pong warpgroup's
# whole-tile accumulator). H100, same runs, vs the picks before it, N >= 16384 and K <= 2048:
# 1 x 2 on a held-out draw (`gemm_probe_pingpong_swap_heldout_h100.md`) 10 of 10 faster
# (1.02x-1.21x); a second draw (`gemm_probe_pingpong_swap_vocab_h100.md`) 1.00x-1.23x on all 14
# of 286-1200 tokens (378x16384x2048 0.92x -> 1.05x cuBLAS), 0.86x-0.98x on 7 of 11 from 1463
# tokens and 0.84x / 0.92x at 121 / 127 (one token tile); a third (`gemm_probe_vocab_pp_rule_h100.md`)
# 1.091x over 23 (20 faster, 0.90x and 0.97x at 1242 and 1197 tokens: the 1 x 2 range stops at
# 1150). 2 x 1 at 1308-6648 tokens (`gemm_probe_vocab_pp_c21_large_h100.md`): 1.071x over 15, all
# faster (2699x128256x2048 0.91x -> 1.00x cuBLAS). Over every wide weight (N >= 2048, 56 shapes of
# 256-2500 tokens) the 1 x 2 form lost (0.948x): 0.48x-0.94x at N <= 3072, 0.74x-0.96x on long K
# at N 3584-7168.
VOCAB_PP_MIN_N = 16384
VOCAB_PP_MAX_K = 2048
VOCAB_PP_M = (256, 8192)
# Below 256 tokens, on weights of 32000+ rows: two ping-pong token tiles of the covering width in
# a 1 x 2 cluster, each weight tile read once for both. Same run on the H200, 3 rounds
# (`gemm_probe_wide_tokens_h200.md`), vs cuBLAS: 171x50257x768 0.91x -> 1.01x (128 x 192
# ping-pong unswapped), 200x50257x1600 0.97x -> 1.03x, 150x128256x2048 0.99x -> 1.04x,
# 140x50257x1280 0.98x -> 1.04x, 230x50257x1024 0.95x -> 1.02x; cooperative tiles of the same
# width 0.95x-1.03x, one token tile 0.94x-1.01x. On a 16384-row weight the pick held
# (240x16384x2048 0.98x vs 0.97x).
VOCAB_PP_LOW_M = (129, 255)
VOCAB_PP_LOW_MIN_N = 32000
_VOCAB_PP_PAIRED_MAX_M = 1150
_VOCAB_PP_WIDTHS = tuple(range(96, 193, 8))


def vocab_pingpong_config(m: int, n: int, k: int, *, num_sms: int = H100_SMS) -> GemmConfig | None:
    """The ping-pong 128-row swap_ab config for a 16-bit M x N x K problem on a wide weight at
    short K (notes above: VOCAB_PP_*), or None outside that range."""
    if not (VOCAB_PP_LOW_M[0] <= m <= VOCAB_PP_M[1] and n >= VOCAB_PP_MIN_N and NARROW_MIN_K <= k <= VOCAB_PP_MAX_K):
        return None
    if m < VOCAB_PP_M[0]:
        if n < VOCAB_PP_LOW_MIN_N:
            return None
        return GemmConfig(128, _covering_width(m, 2), 1, 2, pingpong=True, swap_ab=True)
    paired = m <= _VOCAB_PP_PAIRED_MAX_M
    cluster = (1, 2) if paired else (2, 1)
    best = None
    for w in _VOCAB_PP_WIDTHS:
        if paired and math.ceil(m / w) % 2:
            continue
        cfg = GemmConfig(128, w, *cluster, pingpong=True, swap_ab=True)
        cost = config_waves(cfg, m, n, num_sms) * w / _swap_width_efficiency(w)
        if best is None or cost <= best[0]:
            best = (cost, cfg)
    return None if best is None else best[1]


# Vocabulary-sized weights (32000+ rows) at 65-128 tokens: one 128-row swap_ab token tile of the
# covering width in 2 x 1 clusters (half the weight tiles of the 64-row narrow config, each reading
# the weight once; two share the token tile). Same run on the H200, 3 rounds
# (`gemm_probe_vocab_low_h200.md`), vs cuBLAS, the 64-row pick -> this: 100x128256x2048 0.90x ->
# 1.04x, 70x128256x2048 1.03x -> 1.10x, 80x128256x4096 1.06x -> 1.10x, 110x152064x3584 0.92x ->
# 0.98x, 125x32000x4096 0.99x -> 1.06x, 120x50257x768 1.05x -> 1.05x, 65x50257x1280 1.05x ->
# 1.05x, 90x50257x1600 1.06x -> 1.04x; ping-pong or two 1 x 2 token tiles within 1-2% of it, two
# paired 64-row token tiles 0.71x-0.88x. fp8 per-row (`scaled_mm`, no bias), same
# (`gemm_probe_fp8_losers2007_h200.md`): 100x128256x2048 0.89x -> 1.04x, 70x 1.20x -> 1.24x.
# Held out, every draw it changes (`gemm_probe_vocab_few_held_h200.md`,
# `gemm_probe_fp8_vocab_few_held_h200.md`): bf16 1.038x geomean over 14, 11 faster
# (117x128256x2048 0.88x -> 1.03x, 124x152064x3584 0.93x -> 1.04x), the slowest 92x37888x3584
# 1.06x -> 1.02x; fp8 1.095x over 10, 9 faster (113x128256x4096 0.82x -> 0.99x, over 128 x 192
# ping-pong at K <= 1600 1.06x-1.17x), the slowest 0.995x.
VOCAB_FEW_M = (65, 128)
VOCAB_FEW_MIN_N = 32000


def vocab_few_tokens_config(m: int, n: int, k: int) -> GemmConfig | None:
    """The one-token-tile 128-row swap_ab config for a 16-bit or fp8 M x N x K problem on a
    vocabulary-sized weight (notes above: VOCAB_FEW_*), or None outside that range."""
    if not (VOCAB_FEW_M[0] <= m <= VOCAB_FEW_M[1] and n >= VOCAB_FEW_MIN_N and k >= NARROW_MIN_K):
        return None
    return GemmConfig(128, _covering_width(m, 1), 2, 1, swap_ab=True)


# Wide weights (N >= 16384: lm_heads, Llama 70B's and Qwen's gate_up) at long K (>= 3584) from
# 288 to 704 tokens: 128-row swap_ab tiles over ceil(M / 256) token tiles of the narrowest width
# in steps of 8 that covers M, ping-pong where a warpgroup's accumulator holds the width (<= 192),
# the cluster pairing two token tiles (1 x 2) when their count is even, else two weight tiles
# (2 x 1), over an unswapped pick (128 x 256 cooperative, 128 x 192 ping-pong). cuBLAS runs
# 192-row tiles there (nvjet 192x176 / 192x192 1x2 at 347 / 382 x 152064 x 5120), which lost in
# our kernel (docs/tried-and-not-kept.md). H100, same run, 3 rounds (`gemm_probe_wide_mid_h100.md`,
# draws of seeds 7600-8199 and seed 1081's 360x57344x8192): at 346-627 tokens this form was the
# fastest of four or five configs at all 10 shapes, 1.02x-1.44x the pick (347x152064x5120 0.72x ->
# 1.03x cuBLAS, 627x152064x5120 0.76x -> 0.90x); at 256 tokens the pick won (1.03x vs 0.97x),
# at 736-1021 tokens the picks won or tied at 7 of 13. Held out: 24 draws of seeds 8200-9399
# whose pick it changes (`gemm_probe_wide_long_k_swap_rule_h100.md`): 1.074x, 22 faster
# (337x152064x3584 0.79x -> 1.06x cuBLAS), the slowest 0.918x (631x28672x4096 over 128 x 160
# ping-pong in 1 x 2).
# It replaces swap_ab picks too (`swap_config` takes most of these shapes first) that run more
# token tiles where its own tiles are ping-pong (<= 192 wide), or as many tiles padding more
# tokens: same run on the H200, 3 rounds (`gemm_probe_wide_tokens_h200.md`), vs cuBLAS,
# 335x152064x3584 128 x 112 in three tiles 0.96x -> 1.07x, 335x128256x8192 0.92x -> 1.02x,
# 290x55296x5120 128 x 160 (320 tokens) 0.92x -> 1.01x, 420x57344x8192 128 x 224 0.98x -> 1.00x.
# Held out (`gemm_probe_held_tail_wide_h200.md`): over more token tiles 7 of 7 faster,
# 1.03x-1.11x (335x32000x4096 0.87x -> 0.97x); at as many tiles, 7 changed, 0.99x-1.08x
# (641x32000x4096 0.94x -> 1.01x); two cooperative 216-wide tiles over three 144-wide ones
# lost (418x128256x4096 0.98x, 424x37888x3584 0.93x), so those keep the pick.
WIDE_LONG_K_SWAP_M = (288, 704)
WIDE_LONG_K_SWAP_MIN_N = 16384
WIDE_LONG_K_SWAP_MIN_K = 3584
# One token tile more than ceil(M / 256) where the model (waves x width) rates it under this
# share, from 385 tokens at K <= 4096: at 513-704 tokens on a 28672-row weight three tiles run 5.1
# waves of 2 x 1 clusters, a sixth of 6 clusters, where four narrower ping-pong tiles in 1 x 2 run
# 6.8. H200, same runs, 3 rounds, the picks of the time (the three-tile form split over its sparse
# last wave) -> one tile more:
# - fit (`gemm_probe_wide_t4_h200.md`, in git at 5f341b1): 530-690 x 28672 x 4096 1.06x-1.25x
#   (633 tokens 0.86x -> 1.07x cuBLAS), 450-505 x 37888 x 3584 (two tiles -> three) 1.02x-1.11x; at 505 tokens on the
#   28672-row weight, which the model leaves at two tiles, three ran 0.88x.
# - the rule without the K and token bounds on 20 draws (`gemm_probe_wide_t4_fit2_h200.md`, in
#   git at 37379a0): 1.064x, 15 faster; the losers at K 5120-8192 (312x128256x8192 0.93x,
#   453x55296x5120 0.95x) and at 357 / 359 tokens, where it took the place of the 192-row tiles
#   (359x37888x3584 0.96x).
# - held out with the bounds (`gemm_probe_wide_t4_held_h200.md`): 16 draws 1.094x, 15 faster (the
#   slowest 0.995x), vs cuBLAS 1.036x -> 1.133x, the minimum 0.904x -> 1.006x.
WIDE_MORE_TILES_MARGIN = 0.95
WIDE_MORE_TILES_MAX_K = 4096
WIDE_MORE_TILES_MIN_M = 384
_WIDE_PP_MAX_W = 192  # a ping-pong warpgroup's whole-tile accumulator


def _wide_config(m: int, token_tiles: int) -> GemmConfig:
    width = _covering_width(m, token_tiles)
    cluster = (1, 2) if token_tiles % 2 == 0 else (2, 1)
    return GemmConfig(128, width, *cluster, pingpong=width <= _WIDE_PP_MAX_W, swap_ab=True)


def _wide_tiles_cost(m: int, n: int, token_tiles: int) -> int:
    """Waves x width of the wide long-K form over `token_tiles` token tiles (its tiles are all 128 rows)."""
    cfg = _wide_config(m, token_tiles)
    return config_waves(cfg, m, n) * cfg.tile_n


def wide_long_k_swap_config(m: int, n: int, k: int, current: GemmConfig) -> GemmConfig | None:
    """The swap_ab config for a 16-bit M x N x K problem on a wide weight at long K (notes above:
    WIDE_LONG_K_SWAP_*) to replace the pick `current`: an unswapped one, or a swap_ab one over
    more token tiles or more padded tokens. Else None."""
    if not (WIDE_LONG_K_SWAP_M[0] <= m <= WIDE_LONG_K_SWAP_M[1] and n >= WIDE_LONG_K_SWAP_MIN_N
            and k >= WIDE_LONG_K_SWAP_MIN_K):
        return None
    token_tiles = math.ceil(m / 256)
    if (m > WIDE_MORE_TILES_MIN_M and k <= WIDE_MORE_TILES_MAX_K
            and _wide_tiles_cost(m, n, token_tiles + 1) < WIDE_MORE_TILES_MARGIN * _wide_tiles_cost(m, n, token_tiles)):
        token_tiles += 1
    width = _covering_width(m, token_tiles)
    if current.swap_ab:
        tiles = math.ceil(m / current.tile_n)
        if (width > _WIDE_PP_MAX_W and tiles != token_tiles) or (
                tiles <= token_tiles and tiles * current.tile_n <= token_tiles * width):
            return None
    return _wide_config(m, token_tiles)


# Weights of 2048-8192 rows whose 128-row tiles come in fours at short K: one full wave of
# 128-row swap_ab tiles in 4 x 1 clusters (each token tile multicast to four weight tiles), the
# most token tiles the wave holds and the narrowest width in steps of 8 that covers M in them,
# over a 128-row pick. cuBLAS's own choice there (`gemm_probe_cublas_seed1069_bf16_h100.md`:
# nvjet 128x112, 128x144 and 128x88 in 4x1 at 330 / 400 / 260 x 5120 x 1280, 0.81x / 0.78x /
# 0.86x -> 0.95x / 0.98x / 0.96x cuBLAS in our kernel). Only where the wave is at least 28 of
# the 30 clusters of 4 the H100 holds (5120 rows: 10 x 3, 3072: 6 x 5, 2048: 4 x 7; 4096 rows
# fill 24: 620x4096x1024 0.91x) and over 128-row picks: same run on the H100, 28 shapes of
# 156-1168 tokens (`gemm_probe_swap_c41_short_k_h100.md`), replacing a 64-row pick lost every
# time (0.78x-0.97x), a 128-row one won 1.006x-1.179x but on the 4096-row weight. On a held-out
# draw of 24 shapes whose pick the rule changes (`gemm_probe_swap_c41_short_k_rule_h100.md`):
# 1.068x (17 faster; 404x5120x1280 0.75x -> 0.93x cuBLAS, 641x3072x1024 0.71x -> 0.97x), the
# three replaced unswapped 128 x 96 picks (cooperative, 2 x 1 / 2 x 2) 0.90x-0.96x, so those
# stay (fitted on that draw; over the other 21, 1.091x, min 0.86x at 969x3072x768).
C41_MIN_N = 2048
C41_MAX_K = 2048
_C41_MIN_CLUSTERS = 28


def wave_swap_c41_config(m: int, n: int, k: int, current: GemmConfig, *, num_sms: int = H100_SMS) -> GemmConfig | None:
    """The one-wave 4 x 1 swap_ab config for a 16-bit M x N x K problem (notes above: C41_*) to
    replace `current`, or None."""
    unswapped_96 = current.tile_n == 96 and not (current.swap_ab or current.pingpong)
    # Clusters of 4 resident at once are known for the H100's 132 SMs only (MAX_ACTIVE_CLUSTERS).
    if (current.tile_m != 128 or unswapped_96 or n < C41_MIN_N or not NARROW_MIN_K <= k <= C41_MAX_K
            or num_sms != H100_SMS):
        return None
    t = _c41_token_tiles(n, 128, _C41_MIN_CLUSTERS, num_sms)
    if t is None:
        return None
    w = _covering_width(m, t)
    if not 64 <= w <= 256:
        return None
    return GemmConfig(128, w, 4, 1, swap_ab=True)


def _c41_token_tiles(n: int, tile_m: int, min_clusters: int, num_sms: int) -> int | None:
    """Token tiles of one wave of 4 x 1 swap_ab clusters over an N-row weight in tile_m-row tiles:
    the most one wave holds, or None where the weight tiles do not come in fours or the wave
    would hold fewer than `min_clusters` clusters."""
    weight_tiles = math.ceil(n / tile_m)
    if weight_tiles % 4:
        return None
    fours = weight_tiles // 4
    t = _per_wave(4, num_sms) // fours
    return t if t >= 1 and fours * t >= min_clusters else None


def _covering_width(m: int, tiles: int, step: int = 8) -> int:
    """The narrowest width in steps of `step` (8: wgmma's N; 16 for int8) that covers M tokens
    in `tiles` tiles."""
    return math.ceil(math.ceil(m / tiles) / step) * step


_TILE_192_MAX_W = 192  # a three-warpgroup tile's width (GemmConfig.validate)


def _one_wave_192_config(m: int, n: int, num_sms: int) -> GemmConfig | None:
    """One wave of 192-row swap_ab weight tiles in 1 x 2 clusters over an even token-tile count
    (at most 4) of the covering width, where the weight's rows divide by 192 and that width is
    at most 192; else None (`mid_m_swap_config`, `long_k_c41_config`)."""
    if n % 192 or n // 192 > num_sms // 2:
        return None
    t = min(num_sms // (n // 192), 4)
    t -= t % 2
    w = _covering_width(m, t)
    return GemmConfig(192, w, 1, 2, swap_ab=True) if w <= _TILE_192_MAX_W else None


# The same one wave of 4 x 1 clusters at long K (>= 3584) from 256 to 1400 tokens, from 128-row
# weight tiles where their fours leave a wave of at least 27 clusters, else from 256-row ones on
# weights of 6144+ rows (at most 5 token tiles) at least 80 tokens wide: cuBLAS's own choice at a
# few hundred tokens on 3584-10240-row weights (nvjet 128x104 4x1 at 295x5120x27648 and
# 292x4608x3584, 128x128 at 377x5120x27648, 256x112 / 256x136 / 256x152 4x1 at 323 / 393 / 435 x
# 10240 x 8192), where the long-K one-wave rule's 2 x 1 / 1 x 2 tiles ran 0.65-0.88x cuBLAS; in
# our kernel 0.935-1.008x (`gemm_probe_long_k_mid_n_h100.md`, same run on the H100). The bounds
# are fitted on two draws, same runs, 3 rounds. Seeds 10600-11799, K the only bound
# (`gemm_probe_long_k_c41_h100.md`): 1.042x over 26, 14 faster; below 256 tokens 0.84-0.99x (4),
# 3472x1024x4096 0.955x, 256-row tiles on 4096-row weights (7 token tiles) 0.77-0.95x (5).
# Seeds 11800-12999 with those bounds (`gemm_probe_long_k_c41_rule_h100.md`): 1.033x over 26, 18
# faster; 256 x 64 tiles at 286 / 299 x 6144 x 4096 0.68x / 0.80x, 1432 / 1749 x 2048 x 8192
# 0.955x / 0.874x. Inside all the bounds, that draw's 22 shapes: 1.077x, 18 faster
# (274x5120x27648 0.76x -> 0.99x cuBLAS, 637x3584x3584 0.82x -> 0.98x), the slowest 0.968x.
# Where the weight's rows divide by 192 (Llama 3 8B's and Mistral 7B's 6144-row qkv), the 256-row
# tiles give way to one wave of 192-row swap_ab tiles (three consumer warpgroups) over an even
# token-tile count, at most 192 wide, in 1 x 2 clusters: 32 weight tiles x 4 token tiles fill 128
# SMs where 256-row tiles in fours fill 120, and each weight tile is read once per cluster pair.
# Same run on the H200, 3 rounds (`gemm_probe_qkv6144_h200.md`), vs cuBLAS, 8 shapes of 385-705 x
# 6144 x 4096: 1.08x the 256-row picks geomean, 7 faster (385 tokens 0.83x -> 0.99x, 417 0.83x ->
# 0.96x, 610 0.95x -> 1.00x), 641 tokens 0.987x -> 0.985x (2 x 1 there 1.10x); 2 x 1 clusters
# elsewhere 0.87x-1.06x, three 192-row token tiles 0.80x-0.89x. Above 768 tokens four 192-wide
# tiles cannot hold the tokens and the 256-row tiles stay. Held out, 14 draws of 397-700 tokens
# (`gemm_probe_held_qkv6144_h200.md`, H200, same run, 3 rounds): 14 of 14 faster, 1.05x-1.18x;
# 0.937x -> 1.020x cuBLAS geomean, min 0.849x -> 0.968x (397 tokens 0.85x -> 0.99x, 700 0.90x
# -> 1.00x). Not yet timed on the H100.
C41_LONG_MIN_K = 3584
C41_LONG_M = (256, 1400)
_C41_LONG_MIN_CLUSTERS = 27
_C41_LONG_256_MIN_N = 6144
_C41_LONG_256_MIN_W = 80


def long_k_c41_config(m: int, n: int, k: int, current: GemmConfig, *, num_sms: int = H100_SMS,
                      in_bytes: int = 2) -> GemmConfig | None:
    """The one-wave 4 x 1 swap_ab config for a 16-bit or fp8 M x N x K problem at long K (notes
    above: C41_LONG_*; for 16-bit inputs on weights whose rows divide by 192, the 192-row 1 x 2
    form) to replace a pick `current` of 128+ rows, or None. fp8 (in_bytes 1) takes the 128-row
    form only (notes at FP8_EQUAL_FILL_MIN_N)."""
    if (k < C41_LONG_MIN_K or not C41_LONG_M[0] <= m <= C41_LONG_M[1] or current.tile_m < 128
            or num_sms != H100_SMS):
        return None
    forms = ((128, 64, 256), (256, _C41_LONG_256_MIN_W, 192)) if in_bytes == 2 else ((128, 64, 256),)
    for tile_m, min_w, max_w in forms:
        t = _c41_token_tiles(n, tile_m, _C41_LONG_MIN_CLUSTERS, num_sms)
        if t is None or (tile_m == 256 and n < _C41_LONG_256_MIN_N):
            continue
        w = _covering_width(m, t)
        if not min_w <= w <= max_w:
            return None
        return (tile_m == 256 and _one_wave_192_config(m, n, num_sms)) or GemmConfig(tile_m, w, 4, 1, swap_ab=True)
    return None


# fp8 (per-row `scaled_mm`, swap_ab where no bias rules it out) takes two of the 16-bit swap_ab
# rules. The long-K one wave of 4 x 1 clusters (`long_k_c41_config`) in its 128-row form only:
# same run, H200, 3 rounds, vs `_scaled_mm` (`gemm_probe_fp8_c41_wide_h200.md`), on the 9
# shapes it changes 1.17x the picks geomean, 8 faster (1309x1024x4096 0.85x -> 1.30x,
# 853x1024x4096 1.18x -> 1.55x, 334x4608x3584 0.87x -> 1.09x, 386x5120x27648 1.49x -> 1.73x),
# 712x4608x3584 0.99x; its 256-row form lost (337x10240x8192 0.93x, 434x10240x8192 0.98x), as
# did the short-K 4 x 1 rule over 128 x 128 2 x 2 picks (1178x3072x1024 0.90x). And where one wave of
# unswapped 128 x 128 ping-pong tiles (the 1 x 2 raster-N pick) covers 257-1023 tokens on a
# weight of 3072+ rows, the same number of 128-row swap_ab token tiles, as wide as the tokens
# need, in the mid-M fill rule's clusters (`fp8_equal_fill_swap_config`): the same CTAs, less
# padding, the token tile multicast. Same run (`gemm_probe_fp8_eqfill_h200.md`): over those
# picks 10 of 10 faster, 1.01x-1.25x (340x4608x3584 0.87x -> 1.06x, 341x5120x27648 0.83x ->
# 1.02x, 282x4800x1600 0.90x -> 1.11x); over unswapped 128 x 96 cooperative picks it lost
# (486x3072x2048 0.85x, 426x3072x1024 0.88x), over 2 x 1 ping-pong ones 1.02x-1.03x (not taken).
# Both rules held out, 22 draws of seed 45 at 200-1500 tokens (`gemm_probe_fp8_swap_held_h200.md`):
# 22 of 22 faster, 1.007x-1.36x (262x5120x1280 0.87x -> 1.18x, 961x1024x4096 1.27x -> 1.47x).
FP8_EQUAL_FILL_MIN_N = 3072


def fp8_equal_fill_swap_config(m: int, n: int, k: int, current: GemmConfig, *,
                               num_sms: int = H100_SMS) -> GemmConfig | None:
    """The 128-row swap_ab config over ceil(M / 128) token tiles for an fp8 problem whose pick
    `current` is one wave of unswapped 128 x 128 ping-pong tiles in 1 x 2 clusters, rastered
    along N (notes above: FP8_EQUAL_FILL_*), or None."""
    if (not MID_M_SWAP_M[0] <= m <= MID_M_SWAP_M[1] or n < FP8_EQUAL_FILL_MIN_N or current.swap_ab
            or not current.pingpong or (current.tile_m, current.tile_n) != (128, 128) or current.raster_m
            or (current.cluster_m, current.cluster_n) != (1, 2) or current.split_k > 1
            or config_waves(current, m, n, num_sms) != 1):
        return None
    cfg = _token_tiles_128(m, n, math.ceil(m / 128))
    return cfg if config_waves(cfg, m, n, num_sms) == 1 else None


# From 400 tokens at long K (>= 3584), the swap_ab tile whose grid pads the least work: 256-row
# tiles 128-192 tokens wide or 128-row ones 192-256 wide, in steps of 8, 2 x 1 or 1 x 2, by
# fewest waves x tile area (the wider, then 2 x 1, on a tie), where that is at most 0.96x the
# pick's waves x tile area (0.95x over 7-12 waves, below; none past 12). cuBLAS's own choice:
# at 1477-15645 tokens its nvjet kernels are such tiles (256x136 at 1477x6144x4096, 256x152 at
# 4888x2048x8192, 128x208 at 5382x1280x5120, 128x240 at 3109x1280x5120;
# `gemm_probe_losers1083_h100.md`, `gemm_probe_cublas_bf16_h100.md`: our kernel in them ran
# 0.965-0.997x cuBLAS, the picks 0.82-0.96x). It replaces tuned entries too (matmul.api._pick_config). Fitted on 48
# draws of seeds 13100-13699 (`gemm_probe_wf_long_h100.md`, H100, same run, 3 rounds): the 12
# whose pick pads at least 1 / 0.96x the work 1.058x geomean, none slower (2645x8192x28672 1.22x,
# 8786x1280x5120 0.93x -> 0.98x cuBLAS); at 0.96-0.97x, 0.96-1.08x; at equal padding, 0.88-1.11x
# (the form alone is no gain). Held out (seeds 13800-14399, `gemm_probe_long_k_wave_swap_rule_h100.md`):
# 30 draws it changes 1.063x, 29 faster, slowest 0.991x. At 400-1399 tokens (seeds 15600-16199,
# `gemm_probe_wf_low_h100.md`): 28 of 28 faster, 1.008-1.239x (761x4096x14336 1.23x over a
# 256 x 112 pick, 558x7168x5120 1.14x over a 64-row one). At K 1024-3583 the rule lost
# (`gemm_probe_wf_mid_h100.md`: 0.85-1.05x, ping-pong picks hide their epilogue there).
# Over 7-12 waves (`gemm_probe_long_k_wave_swap_7_12_h100.md`, 20 draws of seeds 16500-17099):
# at <= 0.95x the pick's padding all 17 faster, 1.011-1.136x (3680x10240x8192 1.14x); at
# 0.952-0.958x 0.94x-1.05x, so many waves take the tighter bound.
LONG_K_WAVE_SWAP_MIN_K = 3584
LONG_K_WAVE_SWAP_MIN_M = 400
_LONG_K_WAVE_SWAP_GAIN = 0.96
_LONG_K_WAVE_SWAP_FEW_WAVES = 6
_LONG_K_WAVE_SWAP_MANY_GAIN = 0.95
_LONG_K_WAVE_SWAP_MAX_WAVES = 12
_LONG_K_WAVE_SWAP_CFGS = tuple(
    GemmConfig(tile_m, w, cm, cn, swap_ab=True)
    for tile_m, widths in ((256, range(128, 193, 8)), (128, range(192, 257, 8)))
    for w in widths for cm, cn in ((2, 1), (1, 2)))
# FP8 (e4m3, per-row scales) takes the same rule from K = 6400 over 128-row swap_ab tiles 128-256
# wide (256-row swap_ab tiles are 16-bit only). Fitted on 36 draws of seeds 18000-18299
# (`gemm_probe_fp8_long_k_swap_fit_h100.md`, H100, same run, 3 rounds, timed as the grid calls
# `scaled_mm`): the 13 at K >= 6400 padding <= 0.96x 1.10x geomean, 12 faster, slowest 0.955x
# (3603x1600x6400 1.26x, 2681x5120x27648 1.21x); at K 3584-5120 it lost from 4000 tokens
# (7605x4096x4096 0.84x, 8118x4608x3584 0.83x). Held out (seeds 18300-18599,
# `gemm_probe_fp8_long_k_swap_held_h100.md`): the 9 draws it changes 1.061x, 7 faster, slowest 0.989x.
FP8_LONG_K_WAVE_SWAP_MIN_K = 6400
_FP8_LONG_K_WAVE_SWAP_CFGS = tuple(GemmConfig(128, w, cm, cn, swap_ab=True)
                                   for w in range(128, 257, 8) for cm, cn in ((2, 1), (1, 2)))


def _padded_area(cfg: GemmConfig, m: int, n: int, num_sms: int) -> int:
    """Waves of cfg's grid x its tile area: the work a wave-quantised grid pays for, per unit of K."""
    return config_waves(cfg, m, n, num_sms) * cfg.tile_m * cfg.tile_n


def _least_padding(configs, m: int, n: int, num_sms: int) -> GemmConfig:
    """The config of `configs` with the least `_padded_area` for an M x N output; on a tie the
    wider tile, then the one with fewer CTAs along the cluster's N."""
    return min(configs, key=lambda c: (_padded_area(c, m, n, num_sms), -c.tile_n, c.cluster_n))


def long_k_wave_swap_config(m: int, n: int, k: int, current: GemmConfig, *, in_bytes: int = 2,
                            num_sms: int = H100_SMS) -> GemmConfig | None:
    """The least-padding swap_ab config for a 16-bit (in_bytes = 2) or fp8 (in_bytes = 1) M x N x K
    problem at long K (notes above: LONG_K_WAVE_SWAP_*, FP8_LONG_K_WAVE_SWAP_*) to replace the
    pick `current`, or None."""
    fp8 = in_bytes == 1
    if (k < (FP8_LONG_K_WAVE_SWAP_MIN_K if fp8 else LONG_K_WAVE_SWAP_MIN_K) or m < LONG_K_WAVE_SWAP_MIN_M
            or current.split_k > 1):
        return None
    best = _least_padding(_FP8_LONG_K_WAVE_SWAP_CFGS if fp8 else _LONG_K_WAVE_SWAP_CFGS, m, n, num_sms)
    waves = config_waves(best, m, n, num_sms)
    if waves > _LONG_K_WAVE_SWAP_MAX_WAVES:
        return None
    gain = _LONG_K_WAVE_SWAP_GAIN if waves <= _LONG_K_WAVE_SWAP_FEW_WAVES else _LONG_K_WAVE_SWAP_MANY_GAIN
    if _padded_area(best, m, n, num_sms) <= gain * _padded_area(current, m, n, num_sms):
        return best
    return None


def one_wave_swaps(m: int, n: int, widths, cluster: tuple[int, int] = (2, 1), *, tile_m: int = 128,
                   num_sms: int = H100_SMS) -> list[GemmConfig]:
    """The tile_m-row swap_ab configs of `widths` (in their order) in `cluster` whose grid runs
    an M x N problem in one wave."""
    configs = (GemmConfig(tile_m, w, *cluster, swap_ab=True) for w in widths)
    return [c for c in configs if config_waves(c, m, n, num_sms) == 1]


# int8 on a wide weight (GPT-2's lm_heads) at up to 32 tokens takes the 64-row swap_ab tiles at
# any K from 768, though costed as 16-bit it is half that: same run on the H200, 3 rounds
# (`gemm_probe_int8_lmhead_h200.md`), vs `_int_mm`, the unswapped 64 x 64 ping-pong pick ->
# 64 x 16 at 9 / 13 tokens x 50257 x 768 0.83x / 0.84x -> 1.16x, 13x32000x768 0.86x -> 1.12x,
# 64 x 32 at 30 tokens 0.93x -> 1.09x. Held out (`gemm_probe_int8_held_h200.md`): 2-28 tokens
# 0.82x-0.91x -> 1.09x-1.16x (4 shapes); above, mixed: 47 / 57 tokens 1.00x / 0.98x the pick,
# 88-126 tokens (over 128 x 192 ping-pong) 0.97x-1.06x.
NARROW_INT8_WIDE_N = 16384
NARROW_INT8_WIDE_MAX_M = 32


def swap_config(m: int, n: int, k: int, *, num_sms: int = H100_SMS, in_bytes: int = 2,
                out_bytes: int = 2, integer: bool = False) -> GemmConfig | None:
    """The swap_ab config for an M x N x K problem, or None where swapping is not expected to pay.

    With N, K >= 768: `narrow_swap_config` at M <= 128, and above where it fits one wave and pads
    M less than 128-row tiles do (or no more, int8 in a cluster: NARROW_INT8); above 128 tokens
    one such token tile at very long K gives way to one 128-row tile split over K
    (ONE_TILE_SPLIT_MIN_K). Otherwise, M in
    SWAP_M (8-bit inputs: up to 1024) with N >= SWAP_MIN_N and K >= SWAP_MIN_K: 128-row tiles;
    of the widths that pad M to at most 0.9x what 128-row unswapped tiles do (above 1024 rows:
    176+ wide, padding less), or no more in fewer waves, the one with the fewest waves x width
    (the wider on a tie); the cluster pairs two token tiles (1 x 2, sharing the weight tile) when
    their count is even, else two weight tiles (2 x 1): with an odd count 1 x 2 pads a whole
    column of tiles (273 rows in three 96-wide tiles: 0.0523 ms in 1 x 2, 0.0349 in 2 x 1).
    8-bit inputs (in_bytes = 1) are costed at the K of 16-bit ones with as many bytes: their
    k-tiles are 128 deep and run as fast, except that int8 on a wide weight at up to 32 tokens
    takes the narrow config from a K of 768 of its own (NARROW_INT8_WIDE_*). integer: int8
    inputs (`narrow_swap_config`)."""
    if m < 1:
        return None
    k_own, k = k, k * in_bytes // 2  # k from here: the 16-bit K of as many bytes
    if n >= NARROW_MIN_N and (k >= NARROW_MIN_K or (integer and m <= NARROW_INT8_WIDE_MAX_M
                                                     and n >= NARROW_INT8_WIDE_N and k_own >= NARROW_MIN_K)):
        narrow = narrow_swap_config(m, n, k, num_sms=num_sms, in_bytes=in_bytes, out_bytes=out_bytes,
                                    integer=integer)
        if narrow is not None:
            padded, padded_128 = math.ceil(m / narrow.tile_n) * narrow.tile_n, math.ceil(m / 128) * 128
            clustered = narrow.cluster_m * narrow.cluster_n > 1
            if (m <= 128 or padded < padded_128 or (narrow.cluster_m == 4 and padded <= _NARROW_C4_PAD * padded_128)
                    or (integer and clustered and padded == padded_128)):
                return _one_tile_split_config(m, n, k, narrow, num_sms, in_bytes) or narrow
    # Above 1024 rows the rule was measured on 16-bit inputs only, and holds from K = 2048.
    if not SWAP_M[0] <= m <= (SWAP_M[1] if in_bytes == 2 else _SWAP_LOOSE_PAD_M) or n < SWAP_MIN_N or k < SWAP_MIN_K:
        return None
    if m > _SWAP_LOOSE_PAD_M and k < _SWAP_LARGE_M_MIN_K:
        return None
    return _wide_swap_config(m, n, k, num_sms, one_wave=in_bytes == 2)


# Where every width takes more than this many waves, the last wave's quantisation matters less
# than what a tile does per loaded byte (a narrow tile re-reads the weight panel for fewer
# tokens): widths are costed waves x width / `_swap_width_efficiency`. 516x57344x8192 (17
# waves, Llama-3-70B's gate_up) ran 128 x 112 at 0.57x cuBLAS (H100 grid, seed 1010), where
# waves x width rated it 2% under 128 x 176. Same run on 22 such shapes of M 129-2048 against
# 8192+ weight rows: 1.14x the unweighted picks, 0.875x -> 0.996x cuBLAS
# (`gemm_swap_waves_ab_h100.md`); where some width fits in 4 waves, weighting lost
# (192x57344x8192 -9%, 1318x10240x8192 -4%).
_SWAP_FEW_WAVES = 4


def _swap_width_efficiency(w: int) -> float:
    """Per-tile throughput of a 128 x w swap_ab tile relative to 192+ wide ones, on the scale
    of _TILE_EFFICIENCY's 128-row tiles (96: 0.85, 160: 0.95)."""
    return min(1.0, 0.7 + w / 640)


# Where the costed width takes two or more waves and a 16-bit problem's K is 2048+, up to 1024
# tokens: the narrowest width (steps of 16) that runs the grid in one wave, padding M no more than
# 128-row tiles do. A tile's time grows with its width, but a second, mostly empty wave costs a
# whole tile's time: cuBLAS runs 128 x 168 in 2 x 1 at 330x8192x28672
# (`gemm_probe_s1077_bf16_h100.md`), where the costed 128 x 112 (192 tiles: 1.45 waves) ran 0.65x
# it. H100, same runs, 3 alternating rounds: the 9 shapes of grid seeds 3000-3199 this changes and
# seed 1077's 330x8192x28672 (`gemm_probe_swap_fewer_waves_h100.md`) 0.61x-0.90x -> 0.87x-1.32x
# cuBLAS; held out, the 53 shapes of seeds 3200-4199 whose pick it changes (321-336 and 642-671
# tokens; `gemm_probe_swap_one_wave_rule_h100.md`) all faster, 1.41x the picks before (min
# 1.16x), 0.68x -> 0.95x cuBLAS. The narrowest fewer-waves width where it still takes two or more
# waves lost (1812x37888x3584 -0.4%, 1846x37888x3584 -4%, 436x10240x8192 -1%); above 1024 tokens
# it would displace unmeasured 256-row picks (1714-1870 tokens on 2048-row weights).
_ONE_WAVE_MIN_K = 2048


def _wide_swap_config(m: int, n: int, k: int, num_sms: int, one_wave: bool = False) -> GemmConfig | None:
    padded = math.ceil(m / 128) * 128
    limit = padded - 1 if m > _SWAP_LOOSE_PAD_M else _SWAP_MAX_PAD * padded
    tiles_m = math.ceil(n / 128)  # the swapped kernel's rows are the weight's
    # Or no more padding than 128-row tiles and fewer waves than the unswapped pick:
    # 845x4096x1024 in four 224-wide tiles, one wave, 0.92x cuBLAS; 128 x 128 in two waves 0.67x.
    waves = config_waves(default_config(m, n, k, num_sms=num_sms), m, n, num_sms)
    widths = []  # (waves, w, cm, cn, padded M) of every width the epilogue and M allow
    for w in _SWAP_WIDTHS:
        if (w % 32 and k < _SWAP_SLAB16_MIN_K) or (m > _SWAP_LOOSE_PAD_M and w < _SWAP_LARGE_M_MIN_W):
            continue
        tiles_n = math.ceil(m / w)
        cm, cn = (1, 2) if tiles_n % 2 == 0 else (2, 1)
        widths.append((_waves(tiles_m, tiles_n, cm, cn, num_sms), w, cm, cn, tiles_n * w))
    # Those that pad M little enough
    options = [o for o in widths if o[4] <= limit or (o[4] <= padded and o[0] < waves)]
    many = bool(options) and min(o[0] for o in options) > _SWAP_FEW_WAVES
    best = None
    for w_waves, w, cm, cn, _ in options:
        cost = w_waves * w / (_swap_width_efficiency(w) if many else 1.0)
        if best is None or cost <= best[0]:
            best = (cost, w_waves, w, cm, cn)
    if best is None:
        return None
    _, w_waves, w, cm, cn = best
    if one_wave and k >= _ONE_WAVE_MIN_K and m <= _SWAP_LOOSE_PAD_M and w_waves >= 2:
        w, cm, cn = next(((o[1], o[2], o[3]) for o in widths if o[0] == 1 and o[4] <= padded), (w, cm, cn))
    # A grid that fills at most a quarter of a wave, or half of one with long K, splits K as
    # many ways as one wave holds, each split at least _SWAP_SPLIT_MIN_K_TILES long (its fixup
    # reads whole fp32 tiles back). H100, 2026-11-26, ms unsplit -> split: 129x1024x4096
    # (16 CTAs) 0.0181 -> 0.0148 (4 ways), 150x768x3072 (12) 0.0139 -> 0.0124 (3),
    # 309x4096x14336 (64, 224 k-tiles) 0.0947 -> 0.0664 (2); lost at 137x4096x4096 (64 CTAs,
    # 64 k-tiles) 0.0215 -> 0.0234 and 180x4096x4096 0.0201 -> 0.0225.
    clusters = math.ceil(tiles_m / cm) * math.ceil(math.ceil(m / w) / cn)
    k_tiles = math.ceil(k / 64)
    fill = clusters * cm * cn / num_sms
    split = 1
    if fill <= 0.25 or (fill <= 0.5 and k_tiles >= _SWAP_SPLIT_LONG_K_TILES):
        split = min(_per_wave(cm * cn, num_sms) // clusters, k_tiles // _SWAP_SPLIT_MIN_K_TILES, MAX_SPLIT_K)
    return GemmConfig(128, w, cm, cn, split_k=split if split >= 2 else 1, swap_ab=True)


_SWAP_SPLIT_MIN_K_TILES = 16
_SWAP_SPLIT_LONG_K_TILES = 128

# Above 128 tokens, where one 64-row token tile holds them all, K is at least
# ONE_TILE_SPLIT_MIN_K (16-bit inputs) and 128-row tiles in 2 x 1 clusters fill at most half a
# wave: one 128-row swap_ab token tile (the tokens in steps of 16) splits K as many ways as one
# wave holds, as cuBLAS runs 154x5120x27648 (nvjet 128x160 splitK). The 64-row grid is under a
# wave unsplit (5120 weight rows: 80 CTAs) and each CTA streams all of K. Same run on the H200
# (`gemm_probe_longk_split_h200.md`, vs cuBLAS): 154x5120x27648 64 x 160 in 4 x 1 0.89x ->
# 128 x 160 in 2 x 1, 3 splits, 0.99x (4 x 1: 0.99x); 140x8192x28672 64 x 144 0.95x -> 128 x 144,
# 2 splits, 1.03x. Held out (`gemm_probe_onetile_split_h200.md`), the five draws it changes all
# faster: 131-175 tokens x 5120x27648 0.82x-0.95x -> 0.97x-0.98x, 133x8192x28672 0.95x -> 1.01x
# (4 x 1 clusters there: 0.61x). Where the 64-row pick had two or more token tiles, split
# 128-row tiles lost (200x4096x14336 0.87x vs 1.05x, 250x3584x18944 0.84x vs 0.95x).
ONE_TILE_SPLIT_MIN_K = 24576
_ONE_TILE_SPLIT_FILL = 0.5


def _one_tile_split_config(m: int, n: int, k: int, narrow: GemmConfig, num_sms: int, in_bytes: int) -> GemmConfig | None:
    """The split 128-row swap_ab config that replaces a one-token-tile narrow config (notes above:
    ONE_TILE_SPLIT_MIN_K), or None. k is the 16-bit-equivalent K."""
    if m <= 128 or in_bytes != 2 or k < ONE_TILE_SPLIT_MIN_K or narrow.split_k > 1 or narrow.tile_n < m:
        return None
    if 2 * math.ceil(math.ceil(n / 128) / 2) > _ONE_TILE_SPLIT_FILL * num_sms:
        return None
    split = _one_token_tile_splits(n, k, num_sms)
    if split < 2:
        return None
    return GemmConfig(128, math.ceil(m / 16) * 16, 2, 1, split_k=split, swap_ab=True)


def _one_token_tile_splits(n: int, k: int, num_sms: int) -> int:
    """The ways one 128-row swap_ab token tile over an N-row weight splits K: as many as one wave of
    2 x 1 clusters holds, each split at least _SWAP_SPLIT_MIN_K_TILES k-tiles, at most MAX_SPLIT_K."""
    clusters = math.ceil(math.ceil(n / 128) / 2)
    return min(_per_wave(2, num_sms) // clusters, math.ceil(k / 64) // _SWAP_SPLIT_MIN_K_TILES, MAX_SPLIT_K)


# The same form where the pick is not one narrow token tile: at K >= ONE_TILE_SPLIT_MIN_K and
# 65-256 tokens (the down projections of Llama-3-70B and Qwen2.5-32B), one 128-row swap_ab token
# tile W = the tokens in steps of 8 wide, split over K as many ways as one wave of 2 x 1 clusters
# holds, replaces an unsplit pick where its work a wave slot (128 x W x K / splits) is under
# LONG_K_SPLIT_MARGIN of the pick's (waves x tile area x K). cuBLAS runs this form there (nvjet
# 128x200 2 x 1 splitK at 194x8192x28672, 128x104 splitK at 104x5120x27648). H200, same run,
# 3 alternating rounds, vs cuBLAS, pick -> this config (`gemm_probe_split_longk_fit_h200.md`):
# 221x5120x27648 128 x 112 in 1 x 2 0.86x -> 128 x 224 3 splits 0.98x, 159x8192x28672 128 x 96
# 0.88x -> 128 x 160 2 splits 1.01x, 98x5120x27648 64 x 112 0.91x -> 128 x 104 3 splits 0.99x,
# 248x5120x27648 1.02x -> 1.04x; where the model rates the two within the margin the pick stayed
# ahead (177x8192x28672 128 x 96 1.09x against 128 x 184 split 1.03x), and at K 14336-18944 the
# narrow 64-row picks beat every split form at all 14 draws. Held out
# (`gemm_probe_split_longk_held_h200.md`): the 16 draws it changes 1.105x, 14 faster, min 0.716x ->
# 0.966x cuBLAS; the slowest 0.969x (251x5120x27648, 128 x 96 unswapped).
LONG_K_SPLIT_M = (65, 256)
LONG_K_SPLIT_MARGIN = 0.9


def long_k_split_swap_config(m: int, n: int, k: int, current: GemmConfig, *,
                             num_sms: int = H100_SMS) -> GemmConfig | None:
    """One split 128-row swap_ab token tile for a 16-bit M x N x K problem at very long K (notes
    above: LONG_K_SPLIT_M), where the model puts it under LONG_K_SPLIT_MARGIN of the unsplit
    `current`; else None."""
    if not (LONG_K_SPLIT_M[0] <= m <= LONG_K_SPLIT_M[1] and k >= ONE_TILE_SPLIT_MIN_K) or current.split_k > 1:
        return None
    split = _one_token_tile_splits(n, k, num_sms)
    if split < 2:
        return None
    cfg = GemmConfig(128, math.ceil(m / 8) * 8, 2, 1, split_k=split, swap_ab=True)
    work = cfg.tile_m * cfg.tile_n * math.ceil(k / split)
    pick_work = config_waves(current, m, n, num_sms) * current.tile_m * current.tile_n * k
    return cfg if work < LONG_K_SPLIT_MARGIN * pick_work else None


def _grid_waves(cfg: GemmConfig, m: int, n: int, num_sms: int) -> tuple[int, int]:
    """(clusters of `cfg`'s persistent grid for an M x N output, clusters resident at once)."""
    clusters, _ = grid_clusters(cfg, *cfg.kernel_mn(m, n))
    return clusters, _per_wave(cfg.cluster_m * cfg.cluster_n, num_sms)


# A sparse last wave of 128-row swap_ab tiles splits over K (16-bit, split-K allowed). Where
# such a pick runs 1-6 waves and its last, partial wave holds at most half the resident
# clusters, `GemmConfig.split_k` (which splits only that wave's tiles) deals each of them out as
# s = min(4, clusters a wave / tail clusters) work items: the tail then runs 1/s as long on s
# times the SMs. These are gate_up weights at 100-600 tokens (28672-57344 rows: 3.4 waves of
# 128 x 160 at 149x57344x8192, the weakest class of the H200 grids). H200, same run, 3
# alternating rounds, pick -> split (`gemm_probe_sparse_tail_fit_h200.md`, in git at 5f341b1):
# the 19 draws of 103-561 tokens it takes 1.054x geomean, 18 faster (slowest 0.994x), vs cuBLAS 0.938x -> 0.989x;
# 523x28672x4096 0.94x -> 1.00x (4 splits), 130x57344x8192 0.95x -> 1.01x, 307x28672x4096 0.95x
# -> 1.04x. The 64-row narrow picks of 108-122 tokens gained nothing from 2 splits (0.98x-1.00x),
# as the thin second wave's notes found for them.
TAIL_SPLIT_MAX_WAVES = 6
TAIL_SPLIT_MAX = 4


def tail_split_config(m: int, n: int, k: int, current: GemmConfig, *, num_sms: int = H100_SMS) -> GemmConfig | None:
    """`current` with its sparse last wave split over K (notes above: TAIL_SPLIT_MAX_WAVES), for an
    unsplit 128-row swap_ab pick of a 16-bit M x N x K problem; else None."""
    if not current.swap_ab or current.tile_m != 128 or current.split_k > 1:
        return None
    clusters, per_wave = _grid_waves(current, m, n, num_sms)
    tail = clusters % per_wave
    if not (per_wave < clusters <= TAIL_SPLIT_MAX_WAVES * per_wave) or tail == 0 or 2 * tail > per_wave:
        return None
    split = min(TAIL_SPLIT_MAX, per_wave // tail, math.ceil(k / 64) // _SWAP_SPLIT_MIN_K_TILES)
    return dataclasses.replace(current, split_k=split) if split >= 2 else None


# 192-row swap_ab tiles on wide weights at 129-512 tokens, whether or not the weight's rows divide
# by 192 (the last weight tile then runs partly empty): one or two token tiles of the covering
# width (1 x 2 clusters over two, sharing the weight tile; 2 x 1 over one), taken where the tile
# model (`pick_cost`: waves x tile area) rates the cheaper of them under FEW_TOKENS_192_MARGIN of
# the pick, its split-K left out. cuBLAS runs these there (nvjet 192x80 / 192x112 in 1 x 2 at
# 153 / 208 x 37888 x 3584: 198 weight tiles x 2 = three whole waves).
FEW_TOKENS_192_M = (129, 512)
FEW_TOKENS_192_MIN_N = 14336
FEW_TOKENS_192_MARGIN = 0.97
FEW_TOKENS_192_FILL = 0.9


def _last_wave_fill(cfg: GemmConfig, m: int, n: int, num_sms: int) -> float:
    """How full the last wave of `cfg`'s persistent grid is (1.0 for whole waves; split-K ignored)."""
    clusters, per_wave = _grid_waves(cfg, m, n, num_sms)
    return (clusters % per_wave or per_wave) / per_wave


def few_tokens_192_config(m: int, n: int, k: int, current: GemmConfig, *,
                          num_sms: int = H100_SMS) -> GemmConfig | None:
    """192-row swap_ab tiles for a 16-bit M x N x K problem (notes above: FEW_TOKENS_192_M) where the
    model rates them under FEW_TOKENS_192_MARGIN of `current`; else None."""
    if not (FEW_TOKENS_192_M[0] <= m <= FEW_TOKENS_192_M[1]) or n < FEW_TOKENS_192_MIN_N:
        return None
    unsplit = dataclasses.replace(current, split_k=1)
    if _last_wave_fill(unsplit, m, n, num_sms) >= FEW_TOKENS_192_FILL:
        return None
    base = pick_cost(m, n, k, unsplit, num_sms)
    best, best_cost = None, FEW_TOKENS_192_MARGIN * base
    for t in (1, 2):
        w = _covering_width(m, t)
        if w > _TILE_192_MAX_W:
            continue
        cfg = GemmConfig(192, w, 2 // t, t, swap_ab=True)
        if _last_wave_fill(cfg, m, n, num_sms) < FEW_TOKENS_192_FILL:
            continue
        cost = pick_cost(m, n, k, cfg, num_sms)
        if cost < best_cost:
            best, best_cost = cfg, cost
    return best


# 256-row swap_ab tiles (16-bit inputs): 256 weight rows a tile and 96-192 tokens, in steps of
# 16, so a mid-size token count fills whole waves where 128-row tiles leave a sparse one:
# cuBLAS runs such tiles there (its kernel names on the H100: nvjet 256x152 in 2 x 1 at
# 1355x3584x3584, 192x176 at 2100x2048x2048). H100, 2026-11-27, same run, vs cuBLAS, dispatch
# pick -> the 256-row pick below (`gemm_swap256_probe_h100.md`): 1355x3584x3584 0.67x -> 0.93x
# (256 x 160 in 2 x 1, one wave of 63 clusters), 1355x4096x14336 0.75x -> 1.01x, 1057x4096x14336
# 0.56x -> 0.95x, 1150x5120x5120 0.74x -> 1.03x, 1722x2048x8192 0.61x -> 0.97x. Taken where
# the model (waves x tile area x (K + epilogue) / efficiency) puts it at least 1% under the
# pick it would replace: at equal cost it lost (1931x3584x3584, 256 x 112 vs 128 x 224 swapped,
# both two waves of the same area: 0.0748 vs 0.0686 ms), and with N = 768 (three weight
# tiles) it lost (1809x768x3072 0.56x).
SWAP_256_M = (640, 4096)
# From GPT-2 medium's 1024 weight rows on (four 256-row tiles): H100, vs cuBLAS, the pick then
# -> the 256-row one, 1900x1024x1024 0.71x -> 0.82x, 2900x1024x4096 0.60x -> 0.93x,
# 2900x1280x1280 0.79x -> 0.94x; on 40 held-out shapes 1.16x the old picks (`gemm_swap256_narrow_h100.md`).
SWAP_256_MIN_N = 1024
SWAP_256_MIN_K = 1024
_SWAP_256_WIDTHS = tuple(range(96, 193, 16))
_SWAP_128_EFFICIENCY = 0.97  # a 128-row swap_ab tile, relative to 128 x 256 (none was fitted)
# Under 128 tokens a 256-row tile's warpgroups each run 128 x W wgmmas, narrower than a 128-row
# tile's 64 x 2W of the same area (1931x3584x3584 above).
_SWAP_256_NARROW_EFFICIENCY = 0.95
_SWAP_256_MARGIN = 0.99
# Only where the 256-row grid takes at most this many waves: wave quantisation is what it
# fixes; on vocabulary-sized N (38-54 waves) it won or lost within 6% (1730x128256x2048 1.09x,
# 1211x128256x8192 0.94x).
_SWAP_256_MAX_WAVES = 4


def pick_cost(m: int, n: int, k: int, cfg: GemmConfig, num_sms: int = H100_SMS) -> float:
    """The tile model's cost of any unsplit config, swap_ab included: waves of its grid in the
    kernel's view x tile area x (K + unhidden epilogue) / efficiency."""
    if cfg.swap_ab:
        eff = _SWAP_128_EFFICIENCY if cfg.tile_m < 256 else 1.0 if cfg.tile_n >= 128 else _SWAP_256_NARROW_EFFICIENCY
    else:
        eff = _efficiency(cfg.tile_m, cfg.tile_n, cfg.pingpong)
    return config_waves(cfg, m, n, num_sms) * cfg.tile_m * cfg.tile_n * (k + _EPILOGUE_K[cfg.pingpong]) / eff


def swap_256_ranked(m: int, n: int, *, num_sms: int = H100_SMS, widths=None) -> list[GemmConfig]:
    """Every 256-row swap_ab width (`widths`, default _SWAP_256_WIDTHS) in 2 x 1 and 1 x 2
    clusters, best first: the fewest waves x width, the wider on a tie, the cluster sharing the
    token tile between two weight tiles (2 x 1) first."""
    configs = [GemmConfig(256, w, cm, cn, swap_ab=True) for w in (widths or _SWAP_256_WIDTHS)
               for cm, cn in ((2, 1), (1, 2))]
    return sorted(configs, key=lambda c: (config_waves(c, m, n, num_sms) * c.tile_n, -c.tile_n, c.cluster_n))


def swap_256_config(m: int, n: int, k: int, current: GemmConfig, *, num_sms: int = H100_SMS) -> GemmConfig | None:
    """A 256-row swap_ab config for a 16-bit M x N x K problem where the model puts it at least
    1% under `current` (the pick it would replace), else None: the first of `swap_256_ranked`.
    Unlike 128-row tiles, 256-row ones at K < 2048 ran widths of 16-column
    epilogue slabs as fast as their neighbours (H100: 1084x4096x1024 256 x 144 0.0172 ms,
    256 x 160 0.0191; 781x4800x1600 256 x 144 0.0237, 256 x 160 0.0267)."""
    if not (SWAP_256_M[0] <= m <= SWAP_256_M[1] and n >= SWAP_256_MIN_N and k >= SWAP_256_MIN_K) \
            or current.split_k > 1:
        return None
    best = swap_256_ranked(m, n, num_sms=num_sms)[0]
    if config_waves(best, m, n, num_sms) > _SWAP_256_MAX_WAVES:
        return None
    if pick_cost(m, n, k, best, num_sms) < _SWAP_256_MARGIN * pick_cost(m, n, k, current, num_sms):
        return best
    return None


# A 256-row swap_ab pick then takes its width in steps of 8 (96-192 tokens): the widths of
# 8 mod 16 store 8-column epilogue slabs, and cuBLAS runs them there (nvjet 256x120 at
# 1291x6144x4096, 256x152 at 2349x4096x1024). The rule that takes 256 rows still ranks the
# widths in steps of 16: ranked in steps of 8 there, 256-row tiles displaced 128-row picks at
# 800-940 tokens and K >= 4096 (909x4096x14336 0.96x, 920x8192x28672 0.93x; the 50 draws of grid
# seeds 2000-2019 / 2100-2124 that change, `gemm_probe_w8_fit_h200.md`, `gemm_probe_w8_held_h200.md`).
# H200, same run, 3 alternating rounds, pick -> the width in steps of 8: the 23 of those draws
# this rule changes 1.032x, 20 faster; held out, the 20 draws of seeds 2200-2259 it changes
# (`gemm_probe_w8_held2_h200.md`) 1.035x, 17 faster (2126x2048x2048 256 x 144 0.90x -> 256 x
# 136 0.99x cuBLAS, 771x4800x1600 0.86x -> 0.91x, 1483x5120x5120 0.94x -> 0.99x), the slowest
# 0.966x (2077x8192x28672, 256 x 176 -> 256 x 104; the three draws at K >= 14336 0.97x-0.99x).
_SWAP_256_FINE_WIDTHS = tuple(range(96, 193, 8))


def swap_256_fine_config(m: int, n: int, current: GemmConfig, *, num_sms: int = H100_SMS) -> GemmConfig | None:
    """For a 256-row swap_ab pick `current` at SWAP_256_M tokens whose width came in steps of 16
    (unsplit, cooperative, in a 2 x 1 or 1 x 2 cluster): the config of that cluster that
    `swap_256_ranked` puts first among the widths in steps of 8 (notes above), where it is
    another one; else None. 4 x 1 picks (long_k_c41_config) and the one-wave picks above 4096
    tokens keep their widths."""
    cluster = (current.cluster_m, current.cluster_n)
    if not (current.swap_ab and current.tile_m == 256 and current.split_k == 1 and not current.pingpong
            and current.tile_n % 16 == 0 and cluster in ((2, 1), (1, 2)) and SWAP_256_M[0] <= m <= SWAP_256_M[1]):
        return None
    best = next(c for c in swap_256_ranked(m, n, num_sms=num_sms, widths=_SWAP_256_FINE_WIDTHS)
                if (c.cluster_m, c.cluster_n) == cluster)
    return best if best != current else None


# Above 2048 tokens at long K, 256-row swap_ab tiles with their token tiles paired in 1 x 2
# clusters (each CTA multicasts half the weight tile to its peer) are cuBLAS's tile (nvjet
# 256x160 / 256x152 1x2 at 2113x37888x3584, 11042x7168x5120, 14707x5120x5120), and in our kernel
# they ran ahead of unswapped 128 x 256 / 256 x 160 cooperative picks of the same padded area.
# Width: the fewest waves x width (128-192 in steps of 8), the wider on a tie. H200, same run, 3
# alternating rounds, pick -> the 1 x 2 tile: fit, 16 draws 1.017x (`gemm_probe_big_d_fit_h200.md`,
# in git at 72a1eb4), 128 x 192 ping-pong picks at equal area 0.95x-0.96x (they hide the epilogue; hence 0.99x for
# them); held out (`gemm_probe_large_m_swap256_held_h200.md`) 24 draws 1.020x, 16 faster, slowest
# 0.967x, vs cuBLAS 0.972x -> 0.992x (min 0.923x -> 0.961x). From 641 tokens 1.013x over 14 draws
# (0.979x-1.068x) and at K = 2048 0.963x (`gemm_probe_big_e_h200.md`, in git at 72a1eb4): the bounds.
LARGE_M_SWAP_256_MIN_M = 2049
LARGE_M_SWAP_256_MIN_K = 3584
LARGE_M_SWAP_256_MIN_N = 4096
LARGE_M_SWAP_256_AREA = 0.99  # of a ping-pong pick's waves x tile area; 1.0 of a cooperative one's
_LARGE_M_SWAP_256_CFGS = tuple(GemmConfig(256, w, 1, 2, swap_ab=True) for w in range(128, 193, 8))


def large_m_swap_256_config(m: int, n: int, k: int, current: GemmConfig, *,
                            num_sms: int = H100_SMS) -> GemmConfig | None:
    """The 256-row swap_ab tile in 1 x 2 clusters for a 16-bit M x N x K problem (notes above:
    LARGE_M_SWAP_256_*) where it pads at most LARGE_M_SWAP_256_AREA of `current`'s waves x tile
    area (at most as much over a cooperative pick), else None."""
    if (m < LARGE_M_SWAP_256_MIN_M or k < LARGE_M_SWAP_256_MIN_K or n < LARGE_M_SWAP_256_MIN_N
            or current.split_k > 1):
        return None
    best = _least_padding(_LARGE_M_SWAP_256_CFGS, m, n, num_sms)
    if best == current:
        return None
    area, pick_area = _padded_area(best, m, n, num_sms), _padded_area(current, m, n, num_sms)
    return best if area <= (LARGE_M_SWAP_256_AREA if current.pingpong else 1.0) * pick_area else None


# A 128 x 128 ping-pong pick on a weight of 3072+ rows runs 128 x 192 ping-pong instead: the
# cost model rates 128 x 128 by its wave fill, but at these sizes the wider tile's fewer loads
# per flop win. H100, same run, 3 alternating rounds, vs the 128 x 128 pick:
# - 16-bit from 4096 tokens: at 7249x3584x18944 (grid seed 1079's worst bf16 row) 0.68x -> 0.88x
#   cuBLAS, 6942x3840x1280 0.92x -> 1.03x (`gemm_probe_large_m_pp128_h100.md`: of six tiles,
#   128 x 192 the fastest or within 2% of it at four shapes); then 24 grid draws (seeds
#   3000-4199) of 4246-13527 tokens (`gemm_probe_large_m_pp192_h100.md`): 1.072x, 20 faster
#   (5290x5120x27648 0.70x -> 0.96x), the slowest 0.947x (7389x3584x3584).
# - 16-bit at 2048-4095 tokens, 2 x 1 clusters only (`gemm_probe_pp192_mid_h100.md`, 30 grid
#   draws of seeds 4200-4799 at 1351-4095 tokens): the 23 picks in 2 x 1 clusters (2570-4095
#   tokens) 1.098x, every one faster (3250x8192x28672 0.70x -> 0.95x cuBLAS, 3692x7168x5120
#   0.89x -> 1.01x); the 7 in 1 x 2 clusters (1351-2917 tokens) 0.931x, 2 faster.
# - fp8 from 2048 tokens (`gemm_probe_pp192_fp8_h100.md`, 16 draws of 2578-15893 tokens, all
#   2 x 1): 1.034x, 14 faster (2850x4800x1600 0.96x -> 1.11x), the slowest 0.993x; 128 x 256
#   cooperative 0.913x. int8 not measured: unchanged.
# - fp8 from 2048 tokens at K <= 8192 also over the 128 x 256 cooperative pick in 2 x 1 clusters
#   (default_config's large-M tile): fit 20 grid draws of seeds 19000-19299
#   (`gemm_probe_fp8_large_m_pp192_h100.md`): at K <= 8192 16 draws 1.039x, 13 faster, slowest
#   0.992x (8669x7168x5120 0.92x -> 1.05x cuBLAS); at K 14336 / 28672 0.89x-0.97x, so not there.
#   Held out (seeds 19300-19599, `gemm_probe_fp8_large_m_pp192_coop_held_h100.md`): the 21 draws
#   on weights of 3072+ rows 1.040x, 15 faster, slowest 0.968x (16138x5120x5120 0.95x -> 1.03x
#   cuBLAS, 3298x32000x4096 1.02x -> 1.14x); the 20 the padding bound below keeps 1.043x.
#   16-bit inputs keep 128 x 256 (the same 20-draw probe on bf16,
#   `gemm_probe_bf16_large_m_pp192_h100.md`: 0.88x-1.06x, 13 of 20 slower).
PP192_MIN_M = 4096
PP192_MIN_N = 3072
PP192_C21_MIN_M = 2048
PP192_FP8_MIN_M = 2048
PP192_FP8_COOP_MAX_K = 8192
# ... and where 128 x 192 pads at most 1.05x the work of 128 x 256 (waves x tile area): the probed
# draws ran 0.99x-1.13x the 128 x 256 pick; at 1.07x (4815x6144x4096) 0.98x, and the fp8 suite's
# 4096^3 (1.125x: 5.3 waves of 128 x 192 against 3.9 of 128 x 256) 0.94x / 0.97x cuBLAS per-row /
# per-tensor without this bound (`benchmarks.quantized --kind fp8`, H100, 2026-11-28), where
# 128 x 256 ran 1.03x / 1.04x (`fp8_h100.md` of 2026-11-23, in git at d552a65).
PP192_FP8_COOP_MAX_PAD = 1.05


def large_m_pp192_config(m: int, n: int, current: GemmConfig, in_bytes: int = 2,
                         k: int | None = None) -> GemmConfig | None:
    """128 x 192 ping-pong for a 128 x 128 ping-pong pick `current` of 16-bit (in_bytes=2) or
    fp8 (in_bytes=1) inputs, or for fp8 with k given also for a 128 x 256 cooperative pick in
    2 x 1 clusters at K <= PP192_FP8_COOP_MAX_K (notes above: PP192_*), else None."""
    if (in_bytes == 1 and k is not None and k <= PP192_FP8_COOP_MAX_K and m >= PP192_FP8_MIN_M
            and n >= PP192_MIN_N and current == GemmConfig(128, 256, 2, 1, group=current.group,
                                                             raster_m=current.raster_m)):
        narrow = dataclasses.replace(current, tile_n=192, pingpong=True)
        if _padded_area(narrow, m, n, H100_SMS) <= PP192_FP8_COOP_MAX_PAD * _padded_area(current, m, n, H100_SMS):
            return narrow
        return None
    if not (n >= PP192_MIN_N and current.tile_mn == (128, 128) and current.pingpong and not current.swap_ab
            and current.split_k == 1 and not current.promote):
        return None
    if in_bytes == 2:
        wide = m >= PP192_MIN_M or (m >= PP192_C21_MIN_M and current.cluster_mn == (2, 1))
    elif in_bytes == 1:
        wide = m >= PP192_FP8_MIN_M
    else:
        raise ValueError(f"in_bytes must be 1 or 2, got {in_bytes!r}")
    return dataclasses.replace(current, tile_n=192) if wide else None


# ------------------------------------------------------------------------------ the rule chain
# What dispatch runs without a tuning-cache entry (matmul.api._pick_config). A base pick from the
# cost model, then rules that each replace it on the shape class it was fitted on and return None
# elsewhere. Every rule is a *_config function above; its notes give the fit and the held-out
# figures, and docs/gemm.md has a section for each. Order matters: a later rule sees the pick an
# earlier one made (several are written as "over a pick of this kind"), and within `or` the first
# rule that applies wins. `rule_spec` in benchmarks/gemm_probe.py switches one off by name (RULES).

RULES = (
    "vocab_pingpong_config", "vocab_few_tokens_config", "wide_long_k_swap_config", "wave_swap_config",
    "swap_256_config", "wave_swap_c41_config", "long_k_c41_config", "large_m_pp192_config",
    "long_k_wave_swap_config", "equal_pad_narrow_config", "mid_m_swap_config", "mid_m_fill_config",
    "long_k_split_swap_config", "swap_256_fine_config", "large_m_swap_256_config", "odd_narrow_pair_config",
    "few_tokens_192_config", "tail_split_config", "fp8_equal_fill_swap_config",
)


def pick_config(m: int, n: int, k: int, *, in_bytes: int = 2, split: bool = False, swappable: bool = False,
                out_bytes: int = 2, integer: bool = False) -> GemmConfig:
    """The heuristic's config for an M x N x K problem: `swap_config`'s swap_ab pick where
    `swappable` (swap_ab can run these operands and this epilogue) and it takes one, else
    `split_config`'s (split=True: split-K may run) or `default_config`'s; then the rules of its
    input kind (16-bit, fp8 or int8: in_bytes and `integer`) in the order below."""
    swapped = swap_config(m, n, k, in_bytes=in_bytes, out_bytes=out_bytes, integer=integer) if swappable else None
    if swapped is not None:
        pick = swapped
    elif split:
        pick = split_config(m, n, k, in_bytes=in_bytes)
    else:
        pick = default_config(m, n, k, in_bytes=in_bytes)
    if in_bytes == 2 and swappable:
        return _rules_16bit(m, n, k, pick, split)
    if in_bytes == 1 and not integer:
        return _rules_fp8(m, n, k, pick, swappable)
    if integer and swappable:
        return mid_m_fill_config(m, n, k, pick, step=narrow_step(True)) or pick
    return pick


def _rules_16bit(m: int, n: int, k: int, pick: GemmConfig, split: bool) -> GemmConfig:
    # The shape classes whose best tile the cost model does not see (the first that applies):
    pick = (vocab_pingpong_config(m, n, k)  # ping-pong token tiles: wide weight, short K, from 256 tokens
            or vocab_few_tokens_config(m, n, k)  # one 128-row token tile: 32000+ rows, 65-128 tokens
            or wide_long_k_swap_config(m, n, k, pick)  # ceil(M / 256) token tiles: wide weight, long K, 288-704
            or wave_swap_config(m, n, k, pick)  # one wave of swap_ab tiles: narrow weight, 700-7680 tokens
            or swap_256_config(m, n, k, pick)  # a 256-row swap_ab tile where modelled cheaper
            or wave_swap_c41_config(m, n, k, pick)  # one wave of 4 x 1 clusters at short K
            or pick)
    pick = long_k_c41_config(m, n, k, pick) or pick  # one wave of 4 x 1 clusters at long K
    pick = large_m_pp192_config(m, n, pick) or pick  # 128 x 128 ping-pong widens to 128 x 192 at large M
    # Padding and fill over whichever tile won (the first that applies):
    pick = (long_k_wave_swap_config(m, n, k, pick)  # the least-padding swap_ab tile, long K, from 400 tokens
            or equal_pad_narrow_config(m, n, k, pick)  # 64-row swap_ab tiles where they pad as 128-row ones do
            or mid_m_swap_config(m, n, k, pick)  # one wave of swap_ab tiles, 257-1023 tokens, K >= 4096
            or mid_m_fill_config(m, n, k, pick)  # one wave of 128-row swap_ab tiles over a sparse one-wave pick
            or pick)
    if split:
        pick = long_k_split_swap_config(m, n, k, pick) or pick  # one split token tile, 65-256 tokens, K >= 24576
    pick = swap_256_fine_config(m, n, pick) or pick  # 256-row swap_ab widths in steps of 8
    pick = (large_m_swap_256_config(m, n, k, pick)  # 256-row swap_ab tiles in 1 x 2 above 2048 tokens
            or odd_narrow_pair_config(m, n, k, pick)  # 1 x 2 token tiles on an odd count of weight tiles
            or pick)
    pick = few_tokens_192_config(m, n, k, pick) or pick  # 192-row tiles filling whole waves, 129-512 tokens
    if split:
        pick = tail_split_config(m, n, k, pick) or pick  # a sparse last wave split over K
    return pick


def _rules_fp8(m: int, n: int, k: int, pick: GemmConfig, swappable: bool) -> GemmConfig:
    pick = large_m_pp192_config(m, n, pick, in_bytes=1, k=k) or pick  # 128 x 192 ping-pong at large M
    if not swappable:
        return pick
    return (vocab_few_tokens_config(m, n, k)  # one 128-row token tile: 32000+ rows, 65-128 tokens
            or long_k_wave_swap_config(m, n, k, pick, in_bytes=1)  # 128-row least-padding tile from K = 6400
            or mid_m_fill_config(m, n, k, pick)  # one wave of 128-row swap_ab tiles over a sparse one-wave pick
            or long_k_c41_config(m, n, k, pick, in_bytes=1)  # one wave of 4 x 1 clusters at long K
            or fp8_equal_fill_swap_config(m, n, k, pick)  # as many swap_ab token tiles over a 1 x 2 ping-pong one
            or pick)
