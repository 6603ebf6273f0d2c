"""The GEMM autotuner: time candidate configs per problem on the GPU, keep the winner in the
tuning cache (tuning.cache), where dispatch finds it before the heuristics.

Per problem: the heuristic's own pick, then every tile / consumer mode / cluster shape
that validates and fits the problem (`candidates`), then for the fastest few their raster
direction, band width and split-K variants (`refinements`), timed once every problem's
first round is: a problem's second round compiles while the later problems time their
first. All candidates compile ahead in parallel worker processes (`cute_kernels.precompile`;
what is asked for while a batch builds goes into the next) while the ones already built are
timed (CUDA-graph replays, median, L2-rotated inputs: runtime.timing), after a warm-up
that keeps the first candidate from being timed on a cold GPU. Each candidate's output is
checked against the heuristic's. A candidate is stored only if it beats the heuristic by
`margin`; otherwise the heuristic itself is stored, so the class is not tuned again.

The timing and build steps are arguments (`timer`, `build`), so the whole tuner runs on a
CPU with fakes of both.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ..matmul.config import H100_SMS, MAX_ACTIVE_CLUSTERS, Epilogue, GemmConfig, grid_clusters
from ..matmul.heuristics import MAX_SPLIT_K, MIN_SPLIT_K_TILES, deep_ring
from . import cache
from .cache import Entry, Problem

# (tile_m, tile_n, pingpong): the tiles swept on the H100 (matmul/heuristics.py CANDIDATES and
# benchmarks/results/gemm_tuning.md); promoted kernels keep two accumulators, so only
# cooperative tiles of at most 128 x 128.
TILES = ((128, 256, False), (128, 192, True), (128, 192, False), (128, 160, True), (128, 160, False),
         (128, 128, True), (128, 128, False), (128, 96, False), (64, 64, True), (64, 128, True), (256, 128, False),
         (256, 160, False))
PROMOTED_TILES = ((128, 128, False), (128, 96, False), (128, 64, False), (64, 128, False), (64, 64, False))
CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 2))
GROUPS = (1, 4, 16)  # band widths tried besides GemmConfig.group
SPLITS = (2, 3, 4, 6, 8)
# Split the last wave only where it is at most this full: on 176 bf16 shapes of M 700-4500
# (H100, `gemm_split_tail_probe_h100.md`) splitting it won by more than 2% at fills of
# 0.03-0.45 (1355x3584x18944, 128 x 256: 0.406 ms in two waves, 0.263 with the last split 6
# ways), and a tail over 0.6 of a wave has little idle time to fill.
TAIL_SPLIT_MAX_FILL = 0.6

# dtype names `tune` takes -> (op, output) as the library's linears run them: fp8 is
# FP8Linear's per-token x per-channel scales with fast accumulation, int8 Int8Linear's
# dequantized bf16 output; int8-raw is int8_mm without scales (int32).
DTYPES = {
    "bf16": ("bf16", "bf16"), "fp16": ("fp16", "fp16"), "fp8": ("fp8-row", "bf16"), "fp8-row": ("fp8-row", "bf16"),
    "fp8-tensor": ("fp8-tensor", "bf16"), "fp8-promoted": ("fp8-row-promoted", "bf16"),
    "fp8-block": ("fp8-block", "bf16"), "int8": ("int8", "bf16"), "int8-raw": ("int8", "int32"),
}


def label(cfg: GemmConfig) -> str:
    """{tile_m}x{tile_n}c{cluster_m}{cluster_n}, then n for raster along N, g<group>, P for
    ping-pong, s<split> for split-K, +2x for promoted accumulation, T for swap_ab (the
    tile and cluster then in the swapped kernel's terms: tile_m along N), d<stages> for a set
    A/B ring depth, W / R for whole_tile_epi forced on / off (whole tile / ring)."""
    group = "" if cfg.group == GemmConfig.group else f"g{cfg.group}"
    split = f"s{cfg.split_k}" if cfg.split_k > 1 else ""
    return (f"{cfg.tile_m}x{cfg.tile_n}c{cfg.cluster_m}{cfg.cluster_n}{'' if cfg.raster_m else 'n'}{group}"
            f"{'P' if cfg.pingpong else ''}{split}{'+2x' if cfg.promote else ''}{'T' if cfg.swap_ab else ''}"
            f"{'' if cfg.stages is None else f'd{cfg.stages}'}{'' if cfg.whole_tile_epi is None else 'W' if cfg.whole_tile_epi else 'R'}")


def heuristic(problem: Problem) -> GemmConfig:
    """What dispatch picks for `problem` without the tuning cache."""
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a Problem, got {type(problem).__name__}")
    from ..matmul.api import _pick_config

    if problem.promoted:
        from ..quantized.api import _promoted_config

        return _promoted_config(problem.m, problem.n, problem.k)
    if problem.epilogue == "swiglu":
        from ..matmul.api import swiglu_fallback

        return swiglu_fallback(problem.m, problem.n // 2, problem.k)
    return _pick_config(problem.m, problem.n, problem.k, problem.in_bytes, not problem.eight_bit, None,
                        _swappable(problem), problem.out_bytes, problem.integer)


def _swappable(problem: Problem) -> bool:
    """Whether dispatch may run `problem` swap_ab (`matmul.api.swappable`, the one check)."""
    from ..matmul.api import swappable

    kw = _kernel_args(problem)
    return swappable(kw["in_dtype"], kw["in_dtype"], kw["out_dtype"], kw["epi"])


def dispatch_config(problem: Problem) -> GemmConfig:
    """What dispatch runs for `problem`: the tuning cache's winner for its class, else the
    heuristic's pick (`matmul.api._pick_config`, which can pass over an unswapped entry for
    `heuristics.pick_config`'s rules)."""
    if problem.promoted or problem.epilogue == "swiglu":
        entry = cache.lookup(problem)
        return heuristic(problem) if entry is None else entry.config
    from ..matmul.api import _pick_config

    cls = (problem.op, problem.out, problem.majors, problem.epilogue)
    return _pick_config(problem.m, problem.n, problem.k, problem.in_bytes, not problem.eight_bit, cls,
                        _swappable(problem), problem.out_bytes, problem.integer)


def dispatch_entries(problems: Iterable[Problem]) -> list:
    """(CompileKey, recipe) of the kernels dispatch runs for `problems`, each once: what a
    benchmark compiles ahead in parallel (`cute_kernels.precompile`) before it times them."""
    return _dedupe(e for p in problems for e in compile_entries(p, [dispatch_config(p)]))


def _fits(problem: Problem, cfg: GemmConfig) -> bool:
    try:
        problem.check(cfg)
    except ValueError:
        return False
    m, n = cfg.kernel_mn(problem.m, problem.n)
    tiles_m, tiles_n = math.ceil(m / cfg.tile_m), math.ceil(n / cfg.tile_n)
    # A tile at least twice the problem along a dimension only computes padding where a
    # smaller tile exists; a cluster wider than the tile grid only pads it.
    if (cfg.tile_m > 64 and cfg.tile_m >= 2 * m) or (cfg.tile_n > 64 and cfg.tile_n >= 2 * n):
        return False
    if cfg.cluster_m > tiles_m or cfg.cluster_n > tiles_n:
        return cfg.cluster_mn == (1, 1)
    return True


# First-round candidates timed per problem besides the heuristic's pick: the cheapest by the
# heuristic's cost model (matmul.heuristics.model_cost). On the sweep it was fitted to, the
# fastest config was always among the 8 cheapest; 12 leaves room for shapes it was not.
FIRST_ROUND = 12


def candidates(problem: Problem, limit: int | None = FIRST_ROUND) -> list[GemmConfig]:
    """The first round: the heuristic's pick first, then of every tile x consumer mode x
    cluster shape that validates for `problem` and fits it (no tile twice the problem, no
    cluster wider than the tile grid; 4 x 2 clusters only for 64-row tiles, as cuBLAS runs
    them) the `limit` cheapest by the cost model (None: all of them); then the swap_ab
    configs of `swap_candidates` and its siblings and the 192-row tiles of
    `tile_192_candidates`, which the cost model does not rank."""

    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    first = heuristic(problem)
    rest = []
    for tm, tn, pp in (PROMOTED_TILES if problem.promoted else TILES):
        for cm, cn in CLUSTERS:
            if (cm, cn) == (4, 2) and tm != 64:
                continue
            cfg = GemmConfig(tm, tn, cm, cn, pingpong=pp, promote=problem.promoted)
            if cfg != first and cfg not in rest and _fits(problem, cfg):
                rest.append(cfg)
    if limit is not None:
        cost = {c: _ranking_cost(problem, c) for c in rest}
        rest = sorted(rest, key=cost.get)[:limit]  # stable: ties keep the table's order
    swaps = list(dict.fromkeys(swap_candidates(problem) + narrow_candidates(problem) + swap_256_candidates(problem)
                               + wave_swap_candidates(problem) + tile_192_candidates(problem)))
    return [first] + rest + [c for c in swaps if c != first and c not in rest]


# swap_ab: the token count M runs along the kernel's N, padded to a multiple of these.
SWAP_WIDTHS = tuple(range(64, 257, 8))
SWAP_CLUSTERS = ((2, 1, False), (1, 2, False), (1, 2, True))
SWAP_MAX_M = 2048  # above, 128-row tiles pad M by at most 6%


def swap_candidates(problem: Problem) -> list[GemmConfig]:
    """swap_ab configs (D^T = B A^T) where they pad M less than 128-row tiles do: the three
    widths that pad M least (the wider on a tie), each cooperative in 2 x 1 and 1 x 2
    clusters and ping-pong in 1 x 2 where the tile allows it (what cuBLAS runs at such M,
    its kernel names say: 128 x 96 at M = 273, 128 x 88 at 260, 128 x 152 at 1186)."""
    if (problem.promoted or not 64 <= problem.m <= SWAP_MAX_M
            or not _swappable(problem)):
        return []
    padded = lambda w: math.ceil(problem.m / w) * w  # noqa: E731
    widths = sorted(SWAP_WIDTHS, key=lambda w: (padded(w), -w))[:3]
    out = []
    for w in widths:
        if padded(w) >= math.ceil(problem.m / 128) * 128:
            continue
        for cm, cn, pp in SWAP_CLUSTERS:
            cfg = GemmConfig(128, w, cm, cn, pingpong=pp, swap_ab=True)
            if cfg not in out and _fits(problem, cfg):
                out.append(cfg)
    return out


def swap_256_candidates(problem: Problem) -> list[GemmConfig]:
    """256-row swap_ab configs for 16-bit problems in the range `heuristics.swap_256_config`
    covers: the three widths of fewest waves x width (the wider on a tie), each in 2 x 1 and
    1 x 2 clusters."""
    from ..matmul.heuristics import SWAP_256_M, SWAP_256_MIN_N, swap_256_ranked

    if (problem.promoted or problem.in_bytes != 2 or not SWAP_256_M[0] <= problem.m <= SWAP_256_M[1]
            or problem.n < SWAP_256_MIN_N or not _swappable(problem)):
        return []
    widths = [c.tile_n for c in swap_256_ranked(problem.m, problem.n) if c.cluster_mn == (2, 1)][:3]
    out = []
    for w in widths:
        for cm, cn in ((2, 1), (1, 2)):
            cfg = GemmConfig(256, w, cm, cn, swap_ab=True)
            if _fits(problem, cfg):
                out.append(cfg)
    return out


def wave_swap_candidates(problem: Problem) -> list[GemmConfig]:
    """One wave of 128-row swap_ab tiles on a narrow weight (`heuristics.wave_swap_config`),
    from 1024 tokens: the three narrowest widths whose grid fits one wave in 2 x 1 clusters
    (steps of 16 from K = 2048, else 32), and the narrowest in 1 x 2; on weights of up to 1024
    rows from 700 tokens, and below 1400 in steps of 16 from 64, with the two narrowest in 4 x 1
    where the weight's 128-row tiles come in fours (`WAVE_SWAP_NARROW`)."""
    from ..matmul.heuristics import (
        NARROW_MIN_K,
        NARROW_MIN_N,
        SWAP_MIN_N,
        WAVE_SWAP_M,
        WAVE_SWAP_NARROW,
        one_wave_swaps,
    )

    low = WAVE_SWAP_NARROW[0] if problem.n <= WAVE_SWAP_NARROW[1] else 1024
    if (problem.promoted or problem.in_bytes != 2 or not low <= problem.m <= WAVE_SWAP_M[1]
            or not NARROW_MIN_N <= problem.n < SWAP_MIN_N or problem.k < NARROW_MIN_K or not _swappable(problem)):
        return []
    narrow_band = problem.m < WAVE_SWAP_M[0] and problem.n <= WAVE_SWAP_NARROW[1]
    widths = range(64 if narrow_band else 96, 257, 16 if problem.k >= 2048 or narrow_band else 32)
    fitting = lambda cluster: [c for c in one_wave_swaps(problem.m, problem.n, widths, cluster)  # noqa: E731
                               if _fits(problem, c)]
    fours = fitting((4, 1))[:2] if narrow_band and math.ceil(problem.n / 128) % 4 == 0 else []
    return fours + fitting((2, 1))[:3] + fitting((1, 2))[:1]


# 192-row tiles (three consumer warpgroups, GemmConfig): 16-bit problems from this many rows,
# swapped up to TILE_192_SWAP_MAX_M tokens; per form the TILE_192_PER_FORM cheapest configs
# (tile_192_candidates). On 16 grid shapes where the picks trailed cuBLAS (H100,
# `gemm_probe_tile192_h100.md`) the best of them beat the pick on 7 (1175x10240x8192
# 192 x 168 swap_ab 2 x 1 0.880x -> 0.967x cuBLAS, 2230x28672x4096 192 x 160 swap_ab 1 x 2
# 0.915x -> 1.004x, 363x8192x28672 192 x 128 1 x 2 0.783x -> 0.898x) and lost on 9, with no
# rule between them: the heuristic does not pick them, the tuner times them.
TILE_192_MIN_M = 256
TILE_192_SWAP_MAX_M = 4096
TILE_192_PER_FORM = 3
# A tile's time modelled as its width plus this many columns: each k-step loads 192 + w rows
# for 192 x w products, so narrow tiles run below the tensor cores' rate (the probe's winners
# were 128-168 wide).
TILE_192_WIDTH_COST = 64


def tile_192_candidates(problem: Problem) -> list[GemmConfig]:
    """192-row cooperative configs for a 16-bit problem of at least TILE_192_MIN_M rows:
    unswapped (widths 64-192 by 16) and, where the class swaps and M <= TILE_192_SWAP_MAX_M,
    swap_ab (by 8), each form's TILE_192_PER_FORM of fewest waves x (width +
    TILE_192_WIDTH_COST) (the wider on a tie) in 2 x 1 and 1 x 2 clusters."""
    from ..matmul.heuristics import config_waves

    if problem.promoted or problem.in_bytes != 2 or problem.m < TILE_192_MIN_M:
        return []
    forms = [False] + ([True] if problem.m <= TILE_192_SWAP_MAX_M and _swappable(problem) else [])
    out = []
    for swap in forms:
        ranked = [GemmConfig(192, w, cm, cn, swap_ab=swap) for w in range(64, 193, 8 if swap else 16)
                  for cm, cn in ((2, 1), (1, 2))]
        ranked = [c for c in ranked if _fits(problem, c)]
        ranked.sort(key=lambda c: (config_waves(c, problem.m, problem.n) * (c.tile_n + TILE_192_WIDTH_COST),
                                   -c.tile_n, c.cluster_n))
        out += ranked[:TILE_192_PER_FORM]
    return out


def narrow_candidates(problem: Problem) -> list[GemmConfig]:
    """64-row swap_ab configs (matmul.heuristics.narrow_swap_config) around the heuristic's
    token-tile count t: t - 1, t and t + 1 tiles of the narrowest width that covers M, each
    unclustered and with the multicast the heuristic gives that count (1 x 2 for an even t,
    4 x 1 for an odd one). Split-K variants come in the second round (`refinements`)."""
    from ..matmul.heuristics import NARROW_MAX_W, NARROW_MIN_K, NARROW_MIN_N, narrow_swap_config

    if (problem.promoted or problem.m > SWAP_MAX_M or problem.n < NARROW_MIN_N or problem.k < NARROW_MIN_K
            or not _swappable(problem)):
        return []
    m = problem.m
    # 8-bit K as swap_config costs it
    pick = narrow_swap_config(m, problem.n, problem.k * problem.in_bytes // 2, in_bytes=problem.in_bytes,
                              out_bytes=problem.out_bytes, integer=problem.integer)
    t0 = math.ceil(m / pick.tile_n) if pick is not None else math.ceil(m / NARROW_MAX_W)
    out = [dataclasses.replace(pick, split_k=1)] if pick is not None else []
    for t in (t0 - 1, t0, t0 + 1):
        if t < 1:
            continue
        w = math.ceil(m / t / 16) * 16
        if w > NARROW_MAX_W:
            continue
        multicast = (1, 2) if math.ceil(m / w) % 2 == 0 else (4, 1)
        for cm, cn in ((1, 1), multicast):
            cfg = GemmConfig(64, w, cm, cn, swap_ab=True)
            if cfg not in out and _fits(problem, cfg):
                out.append(cfg)
    if m > 128:
        out += [c for c in _multicast_candidates(problem, t0) if c not in out]
    return out


def _multicast_candidates(problem: Problem, t0: int) -> list[GemmConfig]:
    """Above 128 tokens: t0 - 1 .. t0 + 1 token tiles of the heuristic's widths (steps of 8 up
    to 224; 16 for int8), in every multicast cluster that t allows (4 x 2 and 1 x 2
    for an even t, 4 x 1), each with the deepest A/B ring that fits
    (heuristics.NARROW_MULTICAST, NARROW_INT8)."""
    from ..matmul.heuristics import NARROW_MAX_W, _narrow_width, deep_ring, narrow_step

    out = []
    step = narrow_step(problem.integer)
    for t in (t0 - 1, t0, t0 + 1):
        if t < 1:
            continue
        w = _narrow_width(problem.m, t, step)
        if w > NARROW_MAX_W:
            continue
        even = math.ceil(problem.m / w) % 2 == 0
        for cm, cn in ((4, 2), (1, 2), (4, 1)) if even else ((4, 1),):
            cfg = deep_ring(GemmConfig(64, w, cm, cn, swap_ab=True), problem.in_bytes, problem.out_bytes)
            if cfg not in out and _fits(problem, cfg):
                out.append(cfg)
    return out


def cluster_order(problem: Problem, cfg: GemmConfig) -> tuple[tuple[int, int], ...]:
    """The cluster coordinates (along the kernel's M, N) the persistent grid's work items map to,
    in order: the grouped raster of `GemmSm90._tile_coord`, which is all that `raster_m` and
    `group` change. A grid one cluster wide or tall runs its clusters in one order whatever
    they are, and a band at least as wide as the grid is the whole grid."""
    m, n = cfg.kernel_mn(problem.m, problem.n)
    cms = math.ceil(math.ceil(m / cfg.tile_m) / cfg.cluster_m)
    cns = math.ceil(math.ceil(n / cfg.tile_n) / cfg.cluster_n)
    if cms == 1 or cns == 1:
        return tuple((i, 0) if cns == 1 else (0, i) for i in range(max(cms, cns)))
    along, across = (cms, cns) if cfg.raster_m else (cns, cms)
    g, out = cfg.group, []
    for work in range(cms * cns):
        band, r = divmod(work, g * across)
        width = min(along - band * g, g)
        a, b = band * g + r % width, r // width
        out.append((a, b) if cfg.raster_m else (b, a))
    return tuple(out)


def _schedule_key(problem: Problem, cfg: GemmConfig) -> tuple:
    """`cfg` up to its raster: configs of one key run the same kernel over the same tile order."""
    return dataclasses.replace(cfg, raster_m=True, group=GemmConfig.group), cluster_order(problem, cfg)


def refinements(problem: Problem, configs: Iterable[GemmConfig], num_sms: int = H100_SMS) -> list[GemmConfig]:
    """The second round, around the fastest configs of the first: the other raster
    direction and band widths (where the tile grid is 2-D), and split-K where the output has
    fewer tiles than SMs (every split >= MIN_SPLIT_K_TILES k-tiles, all splits in one wave)
    or where the grid's last wave of clusters is at most TAIL_SPLIT_MAX_FILL full (the
    kernel then splits only that wave's tiles, all their splits in one more wave); the other
    A/B ring depth (default or deepest, `heuristics.deep_ring`) where more than 8 stages fit.
    A raster or band variant whose tile order is its base's or another variant's
    (`cluster_order`) is left out: timing the same schedule twice costs a compile and lets
    noise pick a "winner" (H200: a band of 16 over a grid 7 clusters tall "won" 1.10x over
    the band of 8 it equals)."""
    out: list[GemmConfig] = []
    schedules: set = set()
    k_tiles = math.ceil(problem.k / (128 // problem.in_bytes))
    for cfg in configs:
        base = dataclasses.replace(cfg, split_k=1)
        m, n = cfg.kernel_mn(problem.m, problem.n)
        tiles_m, tiles_n = math.ceil(m / cfg.tile_m), math.ceil(n / cfg.tile_n)
        variants = []
        if tiles_m > 1 and tiles_n > 1:
            schedules.add(_schedule_key(problem, base))
            for v in [dataclasses.replace(base, raster_m=not base.raster_m)] + [
                    dataclasses.replace(base, group=g) for g in GROUPS if g != base.group]:
                key = _schedule_key(problem, v)
                if key not in schedules:
                    schedules.add(key)
                    variants.append(v)
        # The A/B ring's depth, where more than the default 8 stages fit (small swap_ab tiles).
        # (Block-scaled FP8 stages its scales in at most 8.)
        if problem.op != "fp8-block":
            deep = deep_ring(base, problem.in_bytes, problem.out_bytes)
            variants.append(deep if base.stages is None else dataclasses.replace(base, stages=None))
        tiles = tiles_m * tiles_n
        clusters = math.ceil(tiles_m / cfg.cluster_m) * math.ceil(tiles_n / cfg.cluster_n)
        per_wave = MAX_ACTIVE_CLUSTERS[cfg.cluster_m * cfg.cluster_n]
        tail = clusters % per_wave
        for s in SPLITS:
            if s > MAX_SPLIT_K or s * MIN_SPLIT_K_TILES > k_tiles:
                continue
            one_wave = tiles < num_sms and clusters * s <= per_wave
            last_wave = clusters > per_wave and 0 < tail <= TAIL_SPLIT_MAX_FILL * per_wave and tail * s <= per_wave
            if one_wave or last_wave:
                variants.append(dataclasses.replace(base, split_k=s))
        for v in variants:
            if v != cfg and v not in out and _fits(problem, v):
                out.append(v)
    return out


# First-round configs at most this much slower than the fastest get their last-wave split
# timed: 1355x3584x18944, 128 x 256 in 1 x 2 clusters, ran 0.407 ms in two waves (1.55x the
# fastest unsplit config) and 0.263 ms with its last wave split 6 ways, the fastest of all
# (H100, `gemm_split_tail_probe_h100.md`).
TAIL_SPLIT_CLOSE = 1.6


def _last_wave(problem: Problem, cfg: GemmConfig) -> tuple[int, int, int]:
    """(clusters, clusters per wave, clusters in the last wave) of `cfg`'s grid for `problem`."""
    clusters, per_wave = grid_clusters(cfg, *cfg.kernel_mn(problem.m, problem.n))
    return clusters, per_wave, clusters % per_wave


def _ranking_cost(problem: Problem, cfg: GemmConfig) -> float:
    """The cost model's figure for ranking the first round, a sparse last wave counted as
    1 / S of a wave plus TAIL_SPLIT_OVERHEAD when the config's last-wave split can run (the
    second round times that split for configs close to the fastest)."""
    from ..matmul.heuristics import model_cost

    cost = model_cost(problem.m, problem.n, problem.k, cfg, in_bytes=problem.in_bytes)
    split = last_wave_splits(problem, [cfg])
    if split:
        clusters, per_wave, _ = _last_wave(problem, cfg)
        waves = math.ceil(clusters / per_wave)
        cost *= (waves - 1 + 1 / split[0].split_k + TAIL_SPLIT_OVERHEAD) / waves
    return cost


# The modelled cost of a split last wave beyond its 1 / S of a wave (fixup, imbalance): fitted
# on the probe above (0.3 ranked its configs best among 0-0.3).
TAIL_SPLIT_OVERHEAD = 0.3


def last_wave_splits(problem: Problem, configs: Iterable[GemmConfig]) -> list[GemmConfig]:
    """For each config whose grid takes more than one wave with the last at most
    TAIL_SPLIT_MAX_FILL full: that wave split as many ways as one more wave holds (at most
    MAX_SPLIT_K, each split >= MIN_SPLIT_K_TILES k-tiles)."""
    out = []
    k_tiles = math.ceil(problem.k / (128 // problem.in_bytes))
    for cfg in configs:
        clusters, per_wave, tail = _last_wave(problem, cfg)
        if clusters <= per_wave or not 0 < tail <= TAIL_SPLIT_MAX_FILL * per_wave:
            continue
        s = min(per_wave // tail, MAX_SPLIT_K, k_tiles // MIN_SPLIT_K_TILES)
        v = dataclasses.replace(cfg, split_k=s)
        if s >= 2 and v not in out and _fits(problem, v):
            out.append(v)
    return out


# --------------------------------------------------------------------------- how a problem runs


def _kernel_args(problem: Problem, scales_only: bool = False) -> dict:
    """dtypes, kernel name, accumulator and Epilogue of the op `problem` names, with the
    epilogue operands its class stands for (bias for "vector", bias + residual for
    "residual"; fp8-row's scale vectors are vectors already). scales_only: a scaled op's
    "vector" class without the bias (the call `scaled_mm` makes without one, which swap_ab can
    run; probes only: the tuner times the class with its bias, so its entries serve both)."""
    import torch

    if scales_only and not (problem.epilogue == "vector" and problem.op.startswith(("fp8-row", "int8"))):
        raise ValueError(f"scales_only is for the 'vector' class of fp8-row or scaled int8, got {problem}")

    op = problem.op
    if op in ("bf16", "fp16"):
        in_dt, kernel, acc, row, col = (torch.bfloat16 if op == "bf16" else torch.float16), "gemm_sm90", "Float32", \
            "none", "none"
    elif op == "int8":
        scaled = problem.out != "int32"
        in_dt, kernel, acc = torch.int8, "int8_mm_sm90", "Int32"
        row = col = ("vector" if problem.epilogue != "plain" else "scalar") if scaled else "none"
    elif op == "fp8-block":
        in_dt, kernel, acc, row, col = torch.float8_e4m3fn, "scaled_mm_blockwise_sm90", "Float32", "block", "block"
    else:
        mode = "vector" if op.startswith("fp8-row") else "scalar"
        in_dt, kernel, acc, row, col = torch.float8_e4m3fn, "scaled_mm_sm90", "Float32", mode, mode
    out_dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int32": torch.int32}[problem.out]
    if problem.epilogue == "swiglu":
        epi = Epilogue(activation="swiglu")
    else:
        epi = Epilogue(row_scale=row, col_scale=col, bias=problem.epilogue != "plain" and not scales_only,
                       residual=problem.epilogue == "residual")
    return {"in_dtype": in_dt, "out_dtype": out_dt, "kernel_name": kernel, "acc_name": acc, "epi": epi}


def compile_entries(problem: Problem, configs: Iterable[GemmConfig], scales_only: bool = False) -> list:
    """(CompileKey, recipe) of each config's kernel for `problem`, as dispatch builds it
    (scales_only: `_kernel_args`)."""
    from ..matmul.api import compile_entry

    kw = _kernel_args(problem, scales_only)
    majors = (problem.majors[0], problem.majors[1])
    out, seen = [], set()
    for cfg in configs:
        key, rec = compile_entry(kw["kernel_name"], kw["in_dtype"], kw["in_dtype"], kw["out_dtype"], *majors, cfg,
                                 kw["epi"], kw["acc_name"])
        if key not in seen:
            seen.add(key)
            out.append((key, rec))
    return out


class GpuTimer:
    """timer(problem, config) -> median milliseconds on the GPU, inputs rotated through L2.

    Inputs are made once per problem. The first call warms the GPU up (`warm_ms` of large
    GEMMs); the first config timed per problem gives the reference output that every later
    config must match (int32 exactly, 16-bit within 2% of the largest value). scales_only:
    time a scaled op's "vector" class without its bias (`_kernel_args`)."""

    def __init__(self, rep_ms: float = 50.0, warm_ms: float = 300.0, scales_only: bool = False):
        if not (rep_ms > 0 and warm_ms >= 0):
            raise ValueError("rep_ms must be > 0 and warm_ms >= 0")
        self.rep_ms, self.warm_ms, self.scales_only = rep_ms, warm_ms, scales_only
        self._problem, self._sets, self._ref, self._warm = None, [], None, False

    def _make(self, problem: Problem):
        import torch

        from ..matmul.api import _alloc_out, _prepare_operand
        from ..quantized.api import block_scales_for_kernel
        from ..runtime.timing import rotation_count

        kw = _kernel_args(problem, self.scales_only)
        M, N, K = problem.m, problem.n, problem.k
        epi, in_dt, out_dt = kw["epi"], kw["in_dtype"], kw["out_dtype"]

        def operand(rows, major):
            shape = (rows, K) if major == "k" else (K, rows)
            if in_dt == torch.int8:
                t = torch.randint(-128, 128, shape, device="cuda", dtype=torch.int8)
            else:
                t = (torch.randn(shape, device="cuda") / K ** 0.25).to(in_dt)
            # M- / N-major operands with unaligned rows are padded as gemm pads them.
            return t if major == "k" else _prepare_operand(t.t(), major)

        def one_set():
            a, w = operand(M, problem.majors[0]), operand(N, problem.majors[1])
            args = {"bias": None, "residual": None, "row_scale": None, "col_scale": None}
            vec = lambda n: torch.rand(n, device="cuda") + 0.5  # noqa: E731
            if epi.row_scale == "block":
                kb = -(-K // 128)
                args["row_scale"], args["col_scale"] = block_scales_for_kernel(vec(M * kb).view(M, kb),
                                                                               vec(-(-N // 128) * kb).view(-1, kb))
            elif epi.row_scale != "none":
                args["row_scale"] = vec(M if epi.row_scale == "vector" else 1)
                args["col_scale"] = vec(N if epi.col_scale == "vector" else 1)
            if epi.bias:
                args["bias"] = torch.randn(N, device="cuda").to(out_dt)
            if epi.residual:
                args["residual"] = torch.randn(M, N, device="cuda").to(out_dt)
            return a, w, _alloc_out(M, N // 2 if swiglu else N, out_dt, "cuda"), args

        swiglu = problem.epilogue == "swiglu"
        out_n = N // 2 if swiglu else N
        nbytes = (M * K + N * K) * problem.in_bytes + M * out_n * problem.out_bytes * (2 if epi.residual else 1)
        return [one_set() for _ in range(rotation_count(nbytes))]

    def __call__(self, problem: Problem, cfg: GemmConfig) -> float:
        import torch

        from ..matmul.api import run_gemm, swiglu_linear
        from ..runtime.timing import time_ms, warm_up

        if problem != self._problem:
            self._problem, self._sets, self._ref = None, [], None
            torch.cuda.empty_cache()
            self._sets, self._problem = self._make(problem), problem
        if not self._warm:
            warm_up(self.warm_ms)
            self._warm = True
        kw = _kernel_args(problem, self.scales_only)
        run_kw = dict(epi=kw["epi"], config=cfg, kernel_name=kw["kernel_name"], acc_name=kw["acc_name"])

        def run(i):
            a, w, out, args = self._sets[i]
            if problem.epilogue == "swiglu":  # the [gate; up] view and output width are swiglu_linear's
                return swiglu_linear(a, w, config=cfg)
            return run_gemm(a, w, out, **args, **run_kw)

        out = run(0).float()
        torch.cuda.synchronize()
        if self._ref is None:
            self._ref = out.clone()
        else:
            err = (out - self._ref).abs().max().item()
            scale = max(self._ref.abs().max().item(), 1e-6)
            if (err != 0) if problem.out == "int32" else not err / scale < 2e-2:
                raise ArithmeticError(f"{label(cfg)} disagrees with the reference (max err {err:.3g}, scale {scale:.3g})")
        return time_ms(run, n_rotate=len(self._sets), rep_ms=self.rep_ms)


def precompile_build(jobs: int | None = None) -> Callable:
    """build(entries, on_ready): `cute_kernels.precompile` in worker processes. With the
    disk cache off every entry is ready at once, and compiles in this process when timed."""

    def build(entries, on_ready):
        from ..precompile import precompile
        from ..runtime.cache import cache_dir

        if cache_dir() is None:
            for key, _ in entries:
                on_ready(key, "in process")
            return
        precompile(entries, jobs, on_ready=on_ready)

    return build


# --------------------------------------------------------------------------- the tuner


@dataclass(frozen=True)
class Result:
    """One tuned problem: the stored config and its time, the heuristic's, and how many
    candidates were timed."""

    problem: Problem
    config: GemmConfig
    ms: float
    heuristic: GemmConfig
    heuristic_ms: float
    timed: int

    @property
    def speedup(self) -> float:
        return self.heuristic_ms / self.ms


class _Ready:
    """Compile keys whose kernels can be loaded, filled by one build thread at a time.

    Each build runs its own pool of worker processes (`precompile`), so the batches are
    built one after another, and everything queued while one builds goes into the next: the
    second rounds that the problems ask for while the first round compiles become one batch
    (one pool) instead of a pool per problem. build(entries, on_ready) is the one builder."""

    def __init__(self, build):
        self._build = build
        self._cond = threading.Condition()
        self._status: dict = {}
        self._queue: list = []
        self._builder: threading.Thread | None = None

    def mark(self, key, status: str) -> None:
        with self._cond:
            self._status[key] = status
            self._cond.notify_all()

    def wait_any(self, keys) -> list:
        """Block until at least one of `keys` is ready; return those that are, with their status."""
        with self._cond:
            while True:
                done = [(k, self._status[k]) for k in keys if k in self._status]
                if done:
                    return done
                self._cond.wait()

    def start(self, entries) -> None:
        with self._cond:
            self._queue.extend(entries)
            if self._builder is None:
                self._builder = threading.Thread(target=self._run, daemon=True)
                self._builder.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = _dedupe(e for e in self._queue if e[0] not in self._status)
                self._queue = []
                if not batch:
                    self._builder = None
                    return
            try:
                self._build(batch, self.mark)
            except Exception:  # noqa: BLE001 - a broken build pool: each kernel then compiles when timed
                pass
            for key, _ in batch:  # anything the build did not report is tried in process
                with self._cond:
                    if key not in self._status:
                        self._status[key] = "in process"
                        self._cond.notify_all()


def _time_all(problem, configs, ready: _Ready, timer, log, reference_first: bool = True) -> dict:
    """{config: ms} of `configs` timed in the order their kernels become ready; failures are
    left out. With reference_first the first config is timed before any other (the timer
    checks the others against its output), and nothing else is timed if it fails."""
    scales_only = getattr(timer, "scales_only", False)  # a GpuTimer's; a plain callable times the class
    by_key: dict = {}  # split counts share one kernel: configs per compile key
    for cfg in configs:
        by_key.setdefault(compile_entries(problem, [cfg], scales_only)[0][0], []).append(cfg)
    times: dict = {}
    order = list(by_key)
    first = order[0] if reference_first else None
    while order:
        done = ready.wait_any([first] if first in order else order)
        for key, status in done:
            order.remove(key)
            if status == "failed":
                log(f"    {', '.join(label(c) for c in by_key[key])}: did not build")
                continue
            for cfg in by_key[key]:
                try:
                    times[cfg] = float(timer(problem, cfg))
                except Exception as e:  # noqa: BLE001 - one bad candidate must not stop the tuning
                    log(f"    {label(cfg)}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
        if first is not None and first not in order and configs[0] not in times:
            break  # no reference: nothing else can be judged
    return times


def tune_gemm(
    problems: Sequence[Problem],
    *,
    timer: Callable[[Problem, GemmConfig], float] | None = None,
    build: Callable | None = None,
    gpu: str | None = None,
    force: bool = False,
    margin: float = 0.01,
    refine: int = 3,
    first_round: int | None = FIRST_ROUND,
    jobs: int | None = None,
    log: Callable[[str], None] | None = print,
) -> list[Result]:
    """Tune each problem's class and store the results in the tuning cache of `gpu`.

    problems: tuning.cache.Problem objects (one per class: a second problem of a class
    already listed is skipped, and so is a class the cache or the shipped table holds,
    unless force). timer(problem, config) -> ms (default: GpuTimer on this GPU);
    build(entries, on_ready) compiles (CompileKey, recipe) entries and calls
    on_ready(key, status) as each is loadable (default: `cute_kernels.precompile` in `jobs`
    worker processes). A config other than the heuristic's is stored only when it is
    faster by more than `margin` (a fraction); `refine` of the first round's fastest get
    their raster, band and split-K variants timed too. The first round times the heuristic's
    pick and the `first_round` configs the cost model ranks cheapest (None: every one that
    fits); the second, the `refine` fastest's variants and the last-wave splits of those
    within TAIL_SPLIT_CLOSE of the fastest, after every problem's first round, with the
    heuristic's pick (the reference output again) and the `refine` fastest timed once more.
    Returns one Result per tuned problem.
    """
    problems = list(problems)
    for p in problems:
        if not isinstance(p, Problem):
            raise TypeError(f"problems must be tuning.cache.Problem objects, got {type(p).__name__}")
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise ValueError(f"margin must be a fraction in [0, 1), got {margin!r}")
    if not isinstance(refine, int) or refine < 0:
        raise ValueError(f"refine must be an int >= 0, got {refine!r}")
    gpu = gpu or cache.gpu_name()
    if gpu is None:
        raise ValueError("tuning measures on a GPU and keys its results by the GPU's name: none found (gpu=None)")
    log = log or (lambda _msg: None)
    timer = timer or GpuTimer()
    build = build or precompile_build(jobs)

    todo, seen = [], set()
    for p in problems:
        if p.key in seen or (not force and cache.find(p, gpu) is not None):
            continue
        seen.add(p.key)
        todo.append(p)
    if not todo:
        log("tune: every problem's class is tuned already (force=True tunes again)")
        return []
    first = {p: candidates(p, first_round) for p in todo}
    ready = _Ready(build)
    # Every first-round kernel of every problem starts building now; timing follows the builds.
    ready.start(_dedupe(e for p in todo for e in compile_entries(p, first[p])))
    # Two passes, so that a problem's second round compiles while later problems time their
    # first: timing each second round right after its own first waited on its compiles with
    # the GPU idle, problem after problem.
    rounds = []
    for p in todo:
        heur = first[p][0]
        times = _time_all(p, first[p], ready, timer, log)
        if heur not in times:
            log(f"{_name(p)}: the heuristic's config could not be timed; nothing stored")
            continue
        _retime_reference(p, heur, times, timer)
        extra, top = [], []
        if refine:
            ranked = sorted(times, key=times.get)
            top = ranked[:refine]
            extra = [c for c in refinements(p, top) if c not in times]
            # A config that runs a sparse last wave can lose unsplit and win with that wave
            # split: give the close ones their split too (`last_wave_splits`).
            close = [c for c in ranked[refine:] if times[c] <= TAIL_SPLIT_CLOSE * times[ranked[0]]]
            extra += [c for c in last_wave_splits(p, close) if c not in times and c not in extra]
            if extra:
                ready.start(compile_entries(p, extra))
        rounds.append((p, heur, times, top, extra))
    results = []
    for p, heur, times, top, extra in rounds:
        if extra:
            # The timer has moved on to other problems' inputs: the heuristic's config is the
            # reference again, and the first round's fastest are timed again beside the
            # second round, so that every contender of the final pick ran in this pass.
            again = _time_all(p, list(dict.fromkeys([heur, *top, *extra])), ready, timer, log)
            if heur in again:
                _retime_reference(p, heur, again, timer)
                times.update(again)
        win = min(times, key=times.get)
        if not times[win] < times[heur] * (1 - margin):
            win = heur
        entry = Entry(p, win, times[win], times[heur])
        cache.store([entry], gpu)
        results.append(Result(p, win, times[win], heur, times[heur], len(times)))
        log(f"{_name(p)}: {label(win)} {times[win]:.4f} ms, heuristic {label(heur)} {times[heur]:.4f} ms "
            f"({times[heur] / times[win]:.3f}x; {len(times)} timed)")
    _forget_dispatch()
    return results


def _retime_reference(problem: Problem, heur: GemmConfig, times: dict, timer) -> None:
    """Time the heuristic's config once more, after the pass, and keep its faster time. It is
    timed first in each pass (the reference the others' outputs are checked against), right
    after the timer switched inputs or waited on compiles, where the GPU may have clocked
    down; a candidate must beat its best time, not its first."""
    try:
        times[heur] = min(times[heur], float(timer(problem, heur)))
    except Exception:  # noqa: BLE001 - the first time stands
        pass


def _dedupe(entries):
    out, seen = [], set()
    for key, rec in entries:
        if key not in seen:
            seen.add(key)
            out.append((key, rec))
    return out


def _name(p: Problem) -> str:
    return f"{p.op} {p.out} {p.majors} {p.epilogue} {p.m}x{p.n}x{p.k}"


def _forget_dispatch() -> None:
    """Dispatch memoises its config picks and launches: forget them, so that this process
    runs what was just tuned."""
    from ..matmul.api import clear_dispatch_caches
    from ..quantized.api import clear_dispatch_caches as clear_quantized

    clear_dispatch_caches()
    clear_quantized()


# --------------------------------------------------------------------------- model / shape lists


def problems_for(shapes=None, *, model: str | None = None, dtypes: Sequence[str] = ("bf16",),
                 ms: Sequence[int] = (1, 8, 512, 8192), epilogue: str | None = None) -> list[Problem]:
    """The Problems `tune` tunes: each (N, K) in `shapes` (or each linear of `model`) at every
    M in `ms`, each (M, N, K) in `shapes` as it is, for every dtype in `dtypes` (DTYPES).
    The epilogue class is `epilogue`, else the linear's (models.Linear), else "plain";
    ops that apply scale vectors count as at least "vector". 16-bit problems of at most 8
    rows are left out while the decode GEMVs take them (CUTE_KERNELS_GEMV)."""
    from ..runtime import env
    from . import models

    if shapes is None and model is None:
        raise ValueError("give shapes, a model, or both")
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"dtypes must be among {', '.join(DTYPES)}, got {list(dtypes)!r}")
    if epilogue is not None and epilogue not in cache.EPILOGUES:
        raise ValueError(f"epilogue must be one of {cache.EPILOGUES} or None, got {epilogue!r}")
    ms = tuple(ms)
    if not ms or any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in ms):
        raise ValueError(f"ms must be ints >= 1, got {ms!r}")
    triples = []  # (m, n, k, epilogue class)
    for s in shapes or ():
        s = tuple(s)
        if len(s) == 2:
            triples += [(m, s[0], s[1], epilogue or "plain") for m in ms]
        elif len(s) == 3:
            triples.append((*s, epilogue or "plain"))
        else:
            raise ValueError(f"a shape is (N, K) or (M, N, K), got {s!r}")
    if model is not None:
        for lin in models.tuned_linears(model):
            triples += [(m, lin.n, lin.k, epilogue or lin.epilogue) for m in ms]
    gemv = env.enabled("CUTE_KERNELS_GEMV")
    out = []
    for d in dtypes:
        op, outname = DTYPES[d]
        for m, n, k, epi in triples:
            if gemv and op in ("bf16", "fp16") and m <= 8:
                continue
            if epi == "swiglu" and op not in ("bf16", "fp16"):
                epi = "plain"  # the 8-bit linears run gate and up as GEMMs, silu * up after them
            if outname == "int32":
                epi = "plain"
            elif epi == "plain" and op in ("fp8-row", "fp8-row-promoted", "fp8-block", "int8"):
                epi = "vector"
            out.append(Problem(op, outname, "kk", epi, m, n, k))
    return out


def tune(shapes=None, *, model: str | None = None, dtypes: Sequence[str] = ("bf16",),
         ms: Sequence[int] = (1, 8, 512, 8192), epilogue: str | None = None, force: bool = False,
         jobs: int | None = None, log: Callable[[str], None] | None = print, **tuner) -> list[Result]:
    """Tune the GEMMs of `shapes` and/or `model`'s linears on this GPU into the tuning cache.

    shapes: (N, K) pairs, each tuned at every M in `ms`, or (M, N, K) triples; model: a
    name from tuning.models.MODELS (gpt2 ... gpt2-xl, llama-3.2-1b, llama-3-8b,
    llama-3-70b, qwen2.5-7b, qwen2.5-32b, mistral-7b). dtypes: names from DTYPES ("bf16",
    "fp8", "int8", ...). Classes already tuned are skipped unless force. Further keyword
    arguments go to `tune_gemm` (timer, build, gpu, margin, refine). Later GEMMs of this
    process, and every later process on this GPU, run the stored winners.
    """
    problems = problems_for(shapes, model=model, dtypes=dtypes, ms=ms, epilogue=epilogue)
    return tune_gemm(problems, force=force, jobs=jobs, log=log, **tuner)
