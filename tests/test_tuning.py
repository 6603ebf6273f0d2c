"""GEMM tuning cache, lookup in dispatch, the autotuner (fake timer and build), the model table
and the grid benchmark's draw. CPU only, nothing compiled."""

import dataclasses
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from cute_kernels.matmul.config import Epilogue, GemmConfig
from cute_kernels.tuning import cache
from cute_kernels.tuning.cache import Entry, Problem

H100 = "NVIDIA H100 80GB HBM3"
PLAIN = ("bf16", "bf16", "kk", "plain")


@pytest.fixture
def tuning_env(tmp_path, monkeypatch):
    """A private cache root and tables folder, the GPU named H100, nothing memoised."""
    from cute_kernels.matmul import api
    from cute_kernels.quantized import api as qapi

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUTE_KERNELS_TUNING", raising=False)
    monkeypatch.setattr(cache, "gpu_name", lambda: H100)
    monkeypatch.setattr(cache, "TABLES_DIR", tmp_path / "tables")
    cache.forget()
    api.clear_dispatch_caches()
    qapi.clear_dispatch_caches()
    yield tmp_path
    cache.forget()
    api.clear_dispatch_caches()
    qapi.clear_dispatch_caches()


def _entry(m=512, n=4096, k=4096, cfg=GemmConfig(128, 160, 2, 1, pingpong=True), cls=PLAIN, ms=1.0):
    return Entry(Problem(*cls, m, n, k), cfg, ms, 2 * ms)


def test_m_buckets_are_exact_then_half_octaves_and_cover_every_m():
    assert [cache.m_bucket(m) for m in (1, 7, 16)] == [(1, 1), (7, 7), (16, 16)]
    assert cache.m_bucket(17) == (17, 22) and cache.m_bucket(512) == (512, 724) and cache.m_bucket(8192)[0] == 8192
    prev_hi = 0
    for m in range(1, 20000):
        lo, hi = cache.m_bucket(m)
        assert lo <= m <= hi and (lo == prev_hi + 1 or lo == cache.m_bucket(m - 1)[0])
        prev_hi = hi
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            cache.m_bucket(bad)


def test_problem_validates_its_fields():
    for bad in (("int4", "bf16", "kk", "plain"), ("bf16", "int32", "kk", "plain"), ("int8", "int32", "kk", "vector"),
                ("fp8-row", "bf16", "kk", "plain"), ("fp8-tensor", "bf16", "mk", "plain"),
                ("bf16", "bf16", "kx", "plain"), ("bf16", "bf16", "kk", "gelu"), ("int8", "bf16", "kk", "swiglu")):
        with pytest.raises(ValueError):
            Problem(*bad, 64, 64, 64)
    with pytest.raises(ValueError, match="K % 16"):
        Problem("int8", "int32", "kk", "plain", 64, 64, 72)
    with pytest.raises(ValueError, match="promote"):
        Problem("fp8-row-promoted", "bf16", "kk", "vector", 64, 64, 64).check(GemmConfig(128, 128, 1, 1))


def test_stored_entries_round_trip_and_merge(tuning_env):
    path = cache.store([_entry(512), _entry(8192)], H100)
    assert path == cache.user_path(H100) and path.parent == tuning_env / "cache" / "tuning"
    assert H100.lower().replace(" ", "-") in path.name and cache.source_hash() in path.name
    cache.store([_entry(600, cfg=GemmConfig(128, 128, 2, 1))], H100)  # same bucket as 512: replaced
    data = json.loads(path.read_text())
    assert {k: data[k] for k in ("format", "gpu", "dsl", "source")} == cache.header(H100)
    assert len(data["entries"]) == 2
    cache.forget()
    assert cache.lookup(Problem(*PLAIN, 700, 4096, 4096)).config == GemmConfig(128, 128, 2, 1)


_WRITER = """
import pathlib, sys, time
from cute_kernels.matmul.config import GemmConfig
from cute_kernels.tuning import cache
n, here = int(sys.argv[1]), pathlib.Path(sys.argv[2])
(here / f"ready{n}").touch()
while len(list(here.glob("ready*"))) < 2:  # both writers start storing together
    time.sleep(0.001)
for m in list(range(1, 17)) * 4:
    cache.store([cache.Entry(cache.Problem("bf16", "bf16", "kk", "plain", m, n, 1024), GemmConfig(), 1.0, 1.0)],
                "NVIDIA H100 80GB HBM3")
"""


def test_processes_writing_at_once_keep_each_others_entries(tuning_env):
    env = {**__import__("os").environ, "CUTE_KERNELS_CACHE_DIR": str(tuning_env / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(n), str(tuning_env)], env=env) for n in (1024, 2048)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    data = json.loads(cache.user_path(H100).read_text())
    assert sorted((e["n"], e["m"]) for e in data["entries"]) == sorted((n, m) for n in (1024, 2048)
                                                                        for m in range(1, 17))


# (no parameter named "gpu": conftest skips tests whose keywords say gpu)
@pytest.mark.parametrize("damage", ["corrupt", "other-card", "dsl", "source", "format"])
def test_a_corrupt_or_foreign_cache_is_ignored_with_one_warning_and_rebuilt(tuning_env, damage):
    path = cache.store([_entry(512)], H100)
    if damage == "corrupt":
        path.write_text('{"format": 1, "gpu": ')
    else:
        data = json.loads(path.read_text())
        field = "gpu" if damage == "other-card" else damage
        data[field] = {"gpu": "NVIDIA H200", "dsl": "4.9.0", "source": "0" * 16, "format": 99}[field]
        path.write_text(json.dumps(data))
    cache.forget()
    with pytest.warns(UserWarning, match="ignored") as record:
        assert cache.lookup(Problem(*PLAIN, 512, 4096, 4096)) is None
        assert cache.lookup(Problem(*PLAIN, 8192, 4096, 4096)) is None
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache.store([_entry(8192)], H100)
    data = json.loads(path.read_text())
    assert {k: data[k] for k in ("format", "gpu", "dsl", "source")} == cache.header(H100)
    assert [e["m"] for e in data["entries"]] == [8192]  # the foreign entry is gone


def test_an_entry_past_a_wave_boundary_of_its_bucket_is_not_used(tuning_env):
    """128 x 160 in 1 x 2 clusters at N = 4096: 5 row tiles x 13 clusters fill one wave at
    M = 633; at M = 695 (same bucket) 6 x 13 clusters need two, so the heuristic decides."""
    from cute_kernels.matmul.heuristics import config_waves

    cfg = GemmConfig(128, 160, 1, 2)
    cache.store([_entry(633, cfg=cfg)], H100)
    cache.forget()
    assert (config_waves(cfg, 633, 4096), config_waves(cfg, 695, 4096)) == (1, 2)
    assert cache.lookup(Problem(*PLAIN, 600, 4096, 4096)).config == cfg
    assert cache.lookup(Problem(*PLAIN, 695, 4096, 4096)) is None
    assert config_waves(GemmConfig(128, 96, 2, 1, swap_ab=True), 273, 5120) == 1  # 40 x 3 tiles, swapped


def test_an_entry_that_pads_the_rows_much_more_than_where_it_was_tuned_is_not_used(tuning_env):
    """A 64 x 160 swap_ab entry (the tokens along its 160-wide tiles) tuned at M = 609 computes
    640 rows there (1.05x) and for M = 512 too (1.25x): one wave either way, but at 512 it ran
    at 0.47x cuBLAS on the H100, so lookup leaves 512 to the heuristic."""
    cfg = GemmConfig(64, 160, 1, 2, swap_ab=True)
    cache.store([_entry(609, n=1600, k=6400, cfg=cfg)], H100)
    cache.forget()
    assert cache.m_padding(cfg, 609) == 640 / 609 and cache.m_padding(cfg, 512) == 640 / 512
    assert cache.lookup(Problem(*PLAIN, 600, 1600, 6400)).config == cfg
    assert cache.lookup(Problem(*PLAIN, 512, 1600, 6400)) is None
    assert cache.m_padding(GemmConfig(128, 128, 2, 1), 700) == 768 / 700  # unswapped: tile_m


def test_shipped_table_answers_what_the_user_cache_lacks(tuning_env):
    table_cfg, user_cfg = GemmConfig(128, 96, 2, 1), GemmConfig(128, 128, 1, 1, pingpong=True)
    cache.store([_entry(512, cfg=table_cfg), _entry(8192, cfg=table_cfg)], H100, path=cache.table_path(H100))
    cache.store([_entry(8192, cfg=user_cfg)], H100)
    cache.forget()
    assert cache.lookup(Problem(*PLAIN, 512, 4096, 4096)).config == table_cfg
    assert cache.lookup(Problem(*PLAIN, 8192, 4096, 4096)).config == user_cfg
    assert cache.lookup(Problem(*PLAIN, 128, 4096, 4096)) is None


def test_long_k_least_padding_swap_replaces_a_tuned_entry(tuning_env):
    """At long K the least-padding swap_ab tile (heuristics.long_k_wave_swap_config) replaces a
    16-bit tuned entry that pads 1 / 0.96x as much; an entry it does not beat, or a class that
    cannot swap (a bias), keeps its config."""
    from cute_kernels.matmul import api

    entry_cfg = GemmConfig(256, 112, 2, 1, swap_ab=True)
    vector = ("bf16", "bf16", "kk", "vector")
    cache.store([_entry(761, 4096, 14336, cfg=entry_cfg), _entry(761, 4096, 1024, cfg=entry_cfg),
                 _entry(761, 4096, 14336, cfg=GemmConfig(128, 192, 2, 1), cls=vector)], H100)
    cache.forget()
    api.clear_dispatch_caches()
    assert api._pick_config(761, 4096, 14336, 2, True, PLAIN, True) == GemmConfig(128, 192, 2, 1, swap_ab=True)
    assert api._pick_config(761, 4096, 1024, 2, True, PLAIN, True) == entry_cfg  # short K: the entry
    assert api._pick_config(761, 4096, 14336, 2, True, vector, False) == GemmConfig(128, 192, 2, 1)


def test_the_shipped_tables_match_this_code():
    """A shipped table made for other kernel sources or another DSL is ignored: after an edit of
    matmul/kernel.py or matmul/config.py (not heuristics.py), re-tune on the GPU (docs/gemm.md, Tuning) or, for an
    edit that cannot move a winner, restamp: python -m cute_kernels.tune --write-table --gpu NAME."""
    tables = sorted(cache.TABLES_DIR.glob("*.json"))
    assert [p.name for p in tables] == ["nvidia-h100-80gb-hbm3.json", "nvidia-h200.json"]
    for path in tables:
        data = json.loads(path.read_text())
        assert cache.slug(data["gpu"]) == path.stem
        assert {k: data[k] for k in ("format", "gpu", "dsl", "source")} == cache.header(data["gpu"]), path.name
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cache.read(path, data["gpu"]) is not None


def test_a_lookup_hit_changes_the_dispatch_pick_and_a_miss_keeps_the_heuristic(tuning_env, monkeypatch):
    from cute_kernels.matmul.api import _pick_config, clear_dispatch_caches, tuning_class
    from cute_kernels.matmul.heuristics import split_config

    cls = tuning_class(torch.bfloat16, torch.bfloat16, ("k", "k"), Epilogue())
    assert cls == PLAIN
    assert tuning_class(torch.bfloat16, torch.bfloat16, ("k", "k"), Epilogue(bias=True))[3] == "vector"
    heur = split_config(512, 4096, 4096)
    tuned = GemmConfig(64, 128, 4, 2, pingpong=True)
    assert tuned != heur
    assert _pick_config(512, 4096, 4096, 2, True, cls) == heur  # miss
    cache.store([_entry(650, cfg=tuned)], H100)
    clear_dispatch_caches()
    assert _pick_config(650, 4096, 4096, 2, True, cls) == tuned
    assert _pick_config(700, 4096, 4096, 2, True, cls) == tuned  # same M bucket, same waves
    assert _pick_config(512, 4096, 4096, 2, True, cls) == heur  # same bucket, one wave fewer
    assert _pick_config(2048, 4096, 4096, 2, True, cls) == split_config(2048, 4096, 4096)
    assert _pick_config(650, 4096, 4096, 2, True, ("bf16", "bf16", "kk", "vector")) == split_config(650, 4096, 4096)
    monkeypatch.setenv("CUTE_KERNELS_TUNING", "0")
    clear_dispatch_caches()
    assert _pick_config(650, 4096, 4096, 2, True, cls) == split_config(650, 4096, 4096)
    monkeypatch.setattr(cache, "gpu_name", lambda: None)  # no GPU: no lookup at all
    monkeypatch.delenv("CUTE_KERNELS_TUNING")
    clear_dispatch_caches()
    assert _pick_config(650, 4096, 4096, 2, True, cls) == split_config(650, 4096, 4096)


def test_the_promoted_path_looks_up_its_own_class(tuning_env):
    from cute_kernels.matmul.api import tuning_class
    from cute_kernels.quantized.api import _promoted_config, clear_dispatch_caches

    epi = Epilogue(row_scale="vector", col_scale="vector")
    cls = tuning_class(torch.float8_e4m3fn, torch.bfloat16, ("k", "k"), epi, True)
    assert cls == ("fp8-row-promoted", "bf16", "kk", "vector")
    tuned = GemmConfig(128, 96, 1, 1, promote=True)
    cache.store([_entry(256, 4096, 4096, tuned, cls)], H100)
    clear_dispatch_caches()
    assert _promoted_config(256, 4096, 4096, cls) == tuned
    assert _promoted_config(256, 4096, 4096) != tuned  # the heuristic


def _fake_build(log):
    def build(entries, on_ready):
        for key, _ in entries:
            log.append(key)
            on_ready(key, "cached")
    return build


def test_the_tuner_stores_the_fastest_candidate_and_skips_tuned_classes(tuning_env):
    from cute_kernels.tuning.tune import candidates, heuristic, tune_gemm

    p = Problem("bf16", "bf16", "kk", "vector", 2100, 4800, 1600)
    best = [c for c in candidates(p) if c != heuristic(p)][-1]
    timed = []

    def timer(problem, cfg):
        timed.append(cfg)
        return 0.5 if cfg == best else 1.0 + 0.001 * len(timed)

    built = []
    (res,) = tune_gemm([p, Problem("bf16", "bf16", "kk", "vector", 2200, 4800, 1600)], timer=timer,
                       build=_fake_build(built), log=None)
    assert timed[0] == heuristic(p)  # the reference first
    assert res.config == best and res.ms == 0.5 and res.heuristic == heuristic(p) and res.timed == len(set(timed))
    assert len(built) == len(set(built)) >= 10
    cache.forget()
    assert cache.lookup(p).config == best
    assert tune_gemm([p], timer=timer, build=_fake_build([]), log=None) == []  # tuned already
    assert tune_gemm([p], timer=timer, build=_fake_build([]), log=None, force=True)[0].config == best


def test_second_rounds_time_after_every_first_round_with_the_reference_first_again(tuning_env):
    """A problem's second round compiles while the later problems time their first; when it
    is timed, the heuristic's config (the reference output) runs first again, then the first
    round's fastest beside the new candidates, and the reference once more at the end."""
    from cute_kernels.tuning.tune import candidates, heuristic, tune_gemm

    ps = [Problem("bf16", "bf16", "kk", "vector", m, 4800, 1600) for m in (2100, 700)]
    calls = []

    def timer(problem, cfg):
        calls.append((problem, cfg))
        return 1.0 + 0.001 * (len(calls) % 7)

    res = tune_gemm(ps, timer=timer, build=_fake_build([]), log=None, refine=2)
    assert [r.problem for r in res] == ps
    firsts = {p: candidates(p) for p in ps}
    n1 = sum(len(f) + 1 for f in firsts.values())  # each pass ends re-timing the reference
    # Both first rounds come before any second-round config.
    assert set(calls[:n1]) == {(p, c) for p in ps for c in firsts[p]}
    for p in ps:
        assert [c for q, c in calls[:n1] if q == p][-1] == heuristic(p)
        again = [c for q, c in calls[n1:] if q == p]
        assert again[0] == heuristic(p) and again[-1] == heuristic(p) and any(c not in firsts[p] for c in again)


def test_the_reference_keeps_its_faster_time(tuning_env):
    """The heuristic's config is timed again at the end of each pass and keeps its faster
    time: a candidate that only beat a slow first timing of it is not stored."""
    from cute_kernels.tuning.tune import heuristic, tune_gemm

    p = Problem("bf16", "bf16", "kk", "plain", 700, 4800, 1600)
    heur, seen = heuristic(p), []

    def timer(problem, cfg):
        if cfg == heur:
            seen.append(cfg)
            return 1.2 if len(seen) == 1 else 0.9  # cold first, then its real time
        return 1.0

    (res,) = tune_gemm([p], timer=timer, build=_fake_build([]), log=None, refine=0)
    assert res.config == heur and res.ms == 0.9


def test_builds_asked_for_while_one_runs_go_into_one_batch():
    import threading
    import time

    from cute_kernels.tuning.tune import _Ready

    batches, gate, started = [], threading.Event(), threading.Event()

    def build(entries, on_ready):
        batches.append([k for k, _ in entries])
        started.set()
        if len(batches) == 1:
            gate.wait(5)
        for k, _ in entries:
            on_ready(k, "cached")

    ready = _Ready(build)
    ready.start([("a", None), ("b", None)])
    assert started.wait(5)
    for k in ("c", "d", "c", "a"):  # queued while the first batch builds; "a" is built or queued already
        ready.start([(k, None)])
    gate.set()
    for k in "abcd":
        assert ready.wait_any([k]) == [(k, "cached")]
    deadline = time.time() + 5
    while ready._builder is not None and time.time() < deadline:
        time.sleep(0.01)
    assert batches == [["a", "b"], ["c", "d"]]


def test_the_tuner_keeps_the_heuristic_unless_beaten_by_the_margin(tuning_env):
    from cute_kernels.tuning.tune import heuristic, tune_gemm

    p = Problem("int8", "int32", "kk", "plain", 64, 6400, 1600)

    def timer(problem, cfg):
        if cfg.split_k == 3:
            raise ArithmeticError("disagrees")  # a wrong candidate is skipped
        return 1.0 if cfg == heuristic(problem) else 0.995

    (res,) = tune_gemm([p], timer=timer, build=_fake_build([]), log=None, margin=0.01)
    assert res.config == heuristic(p) and cache.find(p, H100).config == heuristic(p)


def test_candidates_all_validate_and_fit():
    from cute_kernels.tuning.tune import candidates, compile_entries, heuristic, refinements

    problems = [Problem(op, out, majors, epi, m, n, k)
                for op, out, majors, epi in (("bf16", "bf16", "kk", "plain"), ("bf16", "fp32", "mn", "residual"),
                                             ("fp8-tensor", "bf16", "kk", "plain"), ("fp8-row", "bf16", "kk", "vector"),
                                             ("fp8-row-promoted", "bf16", "kk", "vector"),
                                             ("fp8-block", "bf16", "kk", "residual"), ("int8", "int32", "kk", "plain"))
                for m, n, k in ((1, 4800, 1600), (100, 50257, 1600), (8192, 1600, 6400), (3000, 28672, 8192))]
    for p in problems:
        first = candidates(p)
        assert first[0] == heuristic(p) and len(first) == len(set(first))
        more = refinements(p, first[:3])
        for cfg in first + more:
            p.check(cfg)
            assert cfg.tile_m <= 64 or cfg.tile_m < 2 * p.m
        assert len(compile_entries(p, first + more)) <= len(first + more)
        if p.m == 1:
            assert {c.tile_m for c in first[1:]} == {64} and any(c.split_k > 1 for c in refinements(p, first))
    # int8's wgmma steps N by 16: no candidate of 8 mod 16 columns (the 16-bit multicast widths)
    p8 = Problem("int8", "int32", "kk", "plain", 312, 1280, 5120)
    assert all(c.tile_n % 16 == 0 for c in candidates(p8, limit=None))
    with pytest.raises(ValueError, match="multiples of 16"):
        p8.check(GemmConfig(64, 56, 4, 2, swap_ab=True))
    with pytest.raises(ValueError, match="multiples of 16"):
        GemmConfig(64, 56, 4, 2, swap_ab=True).validate(1, 4, integer=True)
    Problem("fp8-tensor", "bf16", "kk", "plain", 312, 1280, 5120).check(GemmConfig(64, 56, 4, 2, swap_ab=True))


def test_the_tuner_times_the_last_wave_split_of_a_close_config(tuning_env):
    """A config that loses unsplit because of its sparse last wave gets that wave split in
    the second round (it is not among the `refine` fastest), and wins if the split is fastest."""
    from cute_kernels.tuning.tune import TAIL_SPLIT_CLOSE, candidates, tune_gemm

    p = Problem("bf16", "bf16", "kk", "plain", 1355, 3584, 18944)
    slow = GemmConfig(128, 256, 1, 2)  # 77 clusters of 2: one wave and 11
    assert slow in candidates(p)  # ranked by its split cost

    def timer(problem, cfg):
        if cfg.tile_mn == (128, 256) and cfg.cluster_mn == (1, 2):
            return 0.5 if cfg.split_k == 6 else 0.99 * TAIL_SPLIT_CLOSE
        return 1.0

    (res,) = tune_gemm([p], timer=timer, build=_fake_build([]), log=None, refine=1)
    assert res.config == dataclasses.replace(slow, split_k=6)


def test_refinements_split_a_sparse_last_wave():
    """Split-K variants for grids of more than one wave: only where the last wave of clusters
    is at most TAIL_SPLIT_MAX_FILL full, with all its splits in one more wave."""
    from cute_kernels.tuning.tune import refinements

    p = Problem("bf16", "bf16", "kk", "plain", 1355, 3584, 18944)
    cfg = GemmConfig(128, 256, 2, 1)  # 84 clusters: 66 whole, 18 in the last wave
    assert {c.split_k for c in refinements(p, [cfg])} == {1, 2, 3}
    full = Problem("bf16", "bf16", "kk", "plain", 128 * 132, 512, 4096)  # 132 clusters, two whole waves
    assert {c.split_k for c in refinements(full, [cfg])} == {1}
    dense = Problem("bf16", "bf16", "kk", "plain", 128 * 182, 512, 4096)  # the last wave 50 / 66 full
    assert {c.split_k for c in refinements(dense, [cfg])} == {1}


def test_split_residual_configs_that_spill_are_not_tuned():
    """Split-K with a residual spills from 192 accumulators a consumer thread (ptxas; the
    compile tier pins the boundary): the residual class never takes such a split, unsplit
    and plain classes still do."""
    from cute_kernels.tuning.cache import accumulators_per_thread
    from cute_kernels.tuning.tune import last_wave_splits

    assert [accumulators_per_thread(c) for c in (
        GemmConfig(128, 192, pingpong=True), GemmConfig(256, 96, pingpong=True), GemmConfig(256, 192),
        GemmConfig(128, 160, pingpong=True), GemmConfig(256, 160), GemmConfig(128, 256), GemmConfig(192, 160),
        GemmConfig(64, 128))] == [192, 192, 192, 160, 160, 128, 80, 64]
    res = Problem("bf16", "bf16", "kk", "residual", 1355, 3584, 18944)
    plain = Problem("bf16", "bf16", "kk", "plain", 1355, 3584, 18944)
    spills = GemmConfig(128, 192, 2, 1, pingpong=True, split_k=2)
    with pytest.raises(ValueError, match="spills"):
        res.check(spills)
    plain.check(spills)
    res.check(dataclasses.replace(spills, split_k=1))
    res.check(GemmConfig(128, 160, 2, 1, pingpong=True, split_k=2))
    big = GemmConfig(128, 192, 2, 1, pingpong=True)  # 1100 rows: 95 clusters, 29 in the last wave
    plain, res = (dataclasses.replace(p, m=1100) for p in (plain, res))
    assert last_wave_splits(plain, [big]) and not last_wave_splits(res, [big])


def test_refinements_skip_raster_variants_of_the_same_tile_order():
    """A raster or band variant whose tile order equals its base's (a grid one cluster wide, a
    band at least as wide as the grid) is not timed; distinct orders are."""
    from cute_kernels.tuning.tune import cluster_order, refinements

    # 64 x 56 swap_ab in 4 x 2 at 201x1600x6400: 7 x 2 clusters, so bands of 8 and 16 are one band.
    p = Problem("bf16", "bf16", "kk", "plain", 201, 1600, 6400)
    cfg = GemmConfig(64, 56, 4, 2, swap_ab=True)
    assert cluster_order(p, cfg) == cluster_order(p, dataclasses.replace(cfg, group=16))
    assert cluster_order(p, cfg) != cluster_order(p, dataclasses.replace(cfg, group=4))
    groups = {(c.raster_m, c.group) for c in refinements(p, [cfg]) if c.split_k == 1 and c.stages == cfg.stages}
    assert (True, 16) not in groups and (True, 4) in groups and (False, 8) in groups
    # A band of 1 along M walks N first: the same order as one band along N, so one of them.
    assert cluster_order(p, dataclasses.replace(cfg, group=1)) == cluster_order(p, dataclasses.replace(cfg, raster_m=False))
    assert not ((True, 1) in groups and (False, 8) in groups)
    # Two token tiles in a 1 x 2 cluster: one cluster across, every raster is the same order.
    p = Problem("bf16", "bf16", "kk", "plain", 335, 152064, 3584)
    cfg = GemmConfig(128, 168, 1, 2, pingpong=True, swap_ab=True)
    assert all(c.raster_m and c.group == cfg.group for c in refinements(p, [cfg]))
    # A 2-D grid of many clusters keeps both rasters and every band.
    p = Problem("bf16", "bf16", "kk", "plain", 8192, 8192, 4096)
    cfg = GemmConfig(128, 256, 2, 1)
    groups = {(c.raster_m, c.group) for c in refinements(p, [cfg]) if c.split_k == 1}
    assert {(False, 8), (True, 1), (True, 4), (True, 16)} <= groups


def test_the_swiglu_class_tunes_only_configs_its_epilogue_runs(tuning_env):
    from cute_kernels.matmul.api import swiglu_config, swiglu_fallback, tuning_class
    from cute_kernels.tuning.tune import candidates, heuristic, problems_for, refinements

    assert tuning_class(torch.bfloat16, torch.bfloat16, ("k", "k"), Epilogue(activation="swiglu"))[3] == "swiglu"
    for bad in (("fp8-row", "bf16", "kk", "swiglu", 64, 128, 64), ("bf16", "fp32", "kk", "swiglu", 64, 128, 64),
                ("bf16", "bf16", "kk", "swiglu", 64, 96, 64)):
        with pytest.raises(ValueError, match="swiglu"):
            Problem(*bad)
    for m, n2, k in ((8192, 16384, 2048), (8192, 28672, 4096), (300, 2 * 18944, 3584)):
        p = Problem("bf16", "bf16", "kk", "swiglu", m, n2, k)
        assert heuristic(p) == swiglu_fallback(m, n2 // 2, k)
        first = candidates(p)
        for cfg in first + refinements(p, first[:3]):
            p.check(cfg)
            assert cfg.split_k == 1 and (n2 // 2) % (cfg.tile_n // 2) == 0
        assert len(first) > 4
    with pytest.raises(ValueError, match="swiglu"):
        Problem("bf16", "bf16", "kk", "swiglu", 64, 16384, 2048).check(GemmConfig(128, 192, 1, 1, pingpong=True))
    # A tuned swiglu entry is what swiglu_config runs; without one it is the fallback.
    tuned = GemmConfig(256, 128, 1, 2)
    assert swiglu_config(8192, 8192, 2048) == swiglu_fallback(8192, 8192, 2048) != tuned
    cache.store([_entry(8192, 16384, 2048, tuned, ("bf16", "bf16", "kk", "swiglu"))], H100)
    from cute_kernels.matmul.api import clear_dispatch_caches

    clear_dispatch_caches()
    assert swiglu_config(8192, 8192, 2048) == tuned and swiglu_config(8192, 8192, 4096) != tuned
    ps = problems_for(model="llama-3.2-1b", dtypes=("bf16", "fp8"), ms=(8192,))
    assert {p.op: p.epilogue for p in ps if p.n == 16384} == {"bf16": "swiglu", "fp8-row": "vector"}


def test_tile_192_candidates():
    """192-row tiles: 16-bit from TILE_192_MIN_M rows, the cheapest per form, all valid for
    the class; swapped only where the class swaps."""
    from cute_kernels.tuning.tune import TILE_192_MIN_M, TILE_192_PER_FORM, candidates, tile_192_candidates

    p = Problem("bf16", "bf16", "kk", "plain", 1175, 10240, 8192)
    got = tile_192_candidates(p)
    assert all(c.tile_m == 192 and not c.pingpong and c.split_k == 1 for c in got)
    assert sum(c.swap_ab for c in got) == sum(not c.swap_ab for c in got) == TILE_192_PER_FORM
    # the probe's winner there (gemm_probe_tile192_h100.md)
    assert GemmConfig(192, 168, 2, 1, swap_ab=True) in got and set(got) <= set(candidates(p))
    for c in got:
        p.check(c)
    assert not tile_192_candidates(Problem("bf16", "bf16", "kk", "plain", TILE_192_MIN_M - 1, 4096, 4096))
    assert not tile_192_candidates(Problem("fp8-row", "bf16", "kk", "vector", 2048, 4096, 4096))
    for epilogue in ("residual", "swiglu"):  # the kernel builds neither on 192-row tiles
        assert not tile_192_candidates(Problem("bf16", "bf16", "kk", epilogue, 2048, 4096, 4096))
    vector = tile_192_candidates(Problem("bf16", "bf16", "kk", "vector", 2048, 4096, 4096))
    assert vector and not any(c.swap_ab for c in vector)


def test_first_round_is_the_cheapest_by_the_cost_model():
    """Ranked by the cost model, a sparse last wave counted as its split (`_ranking_cost`)."""
    from cute_kernels.tuning.tune import FIRST_ROUND, _ranking_cost, candidates, heuristic

    for m, n, k in ((627, 4096, 14336), (138, 28672, 4096), (8192, 1600, 6400), (1, 4800, 1600)):
        p = Problem("bf16", "bf16", "kk", "plain", m, n, k)
        every, first = candidates(p, None), candidates(p)
        # swap_ab and 192-row configs come last, unranked (test_swap_candidates,
        # test_tile_192_candidates)
        every = every[:1] + [c for c in every[1:] if not c.swap_ab and c.tile_m != 192]
        first = first[:1] + [c for c in first[1:] if not c.swap_ab and c.tile_m != 192]
        assert first[0] == every[0] == heuristic(p)
        assert set(first) <= set(every) and len(first) == min(len(every), FIRST_ROUND + 1)
        costs = [_ranking_cost(p, c) for c in first[1:]]
        assert costs == sorted(costs)
        left = [_ranking_cost(p, c) for c in every[1:] if c not in first]
        assert not left or min(left) >= costs[-1]
    with pytest.raises(ValueError, match="limit"):
        candidates(p, -1)


def test_swap_candidates():
    """swap_ab is tried where the token count pads less along wgmma's N than in 128-row
    tiles, in the plain epilogue class with 16-bit outputs or int8's int32 only."""
    from cute_kernels.tuning.tune import candidates, swap_candidates

    at = lambda m, epi="plain", op="bf16", out="bf16": swap_candidates(Problem(op, out, "kk", epi, m, 5120, 5120))  # noqa: E731
    assert {c.tile_n for c in at(273)} == {144, 96, 72} and all(c.swap_ab and c.tile_m == 128 for c in at(273))
    assert at(512) == at(40) == at(4253) == []  # no less padding, or outside 64..SWAP_MAX_M
    assert {c.tile_n for c in at(102)} == {104, 112, 120}  # 102 rows: 104-120 where 128-row tiles compute 128
    assert at(273, "vector") == at(273, "residual") == [] and at(273, out="fp32") == []
    assert {c.tile_n for c in at(273, op="int8", out="int32")} == {144, 96}  # int8_mm's raw int32; N by 16
    p = Problem("bf16", "bf16", "kk", "plain", 273, 5120, 5120)
    assert set(at(273)) <= set(candidates(p))
    for c in at(273):
        p.check(c)
    with pytest.raises(ValueError, match="swap_ab runs the plain epilogue class"):
        Problem("bf16", "bf16", "kk", "residual", 273, 5120, 5120).check(GemmConfig(128, 96, 2, 1, swap_ab=True))


def test_wave_swap_candidates():
    """On a narrow weight from 1024 tokens the tuner also times one wave of 128-row swap_ab
    tiles: the three narrowest widths that fit in 2 x 1 clusters (steps of 32 under K = 2048)
    and the narrowest in 1 x 2; none for 8-bit inputs or N >= 2048."""
    from cute_kernels.matmul.heuristics import config_waves
    from cute_kernels.tuning.tune import candidates, wave_swap_candidates

    p = Problem("bf16", "bf16", "kk", "plain", 2081, 1024, 1024)
    got = wave_swap_candidates(p)
    assert [(c.tile_n, c.cluster_mn) for c in got] == [(160, (2, 1)), (192, (2, 1)), (224, (2, 1)), (160, (1, 2))]
    assert all(c.swap_ab and c.tile_m == 128 and config_waves(c, 2081, 1024) == 1 for c in got)
    assert set(got) <= set(candidates(p))
    assert {c.tile_n for c in wave_swap_candidates(Problem("bf16", "bf16", "kk", "plain", 2081, 1024, 4096))} >= {144}
    assert wave_swap_candidates(Problem("bf16", "bf16", "kk", "plain", 650, 1024, 1024)) == []
    assert wave_swap_candidates(Problem("bf16", "bf16", "kk", "plain", 900, 1280, 1280)) == []
    # weights of up to 1024 rows from 700 tokens (heuristics.WAVE_SWAP_NARROW): steps of 16 from 64,
    # in 4 x 1 clusters too where the weight's 128-row tiles come in fours
    got = wave_swap_candidates(Problem("bf16", "bf16", "kk", "plain", 1025, 1024, 1024))
    assert [(c.tile_n, c.cluster_mn) for c in got] == [(80, (4, 1)), (96, (4, 1)), (80, (2, 1)), (96, (2, 1)),
                                                       (112, (2, 1)), (80, (1, 2))]
    got = wave_swap_candidates(Problem("bf16", "bf16", "kk", "plain", 1025, 768, 768))
    assert all(c.cluster_mn != (4, 1) for c in got)
    assert wave_swap_candidates(Problem("bf16", "bf16", "kk", "plain", 2081, 4096, 1024)) == []
    assert wave_swap_candidates(Problem("int8", "bf16", "kk", "vector", 2081, 1024, 1024)) == []


def test_compile_entries_are_the_keys_dispatch_builds(gemm_keys, recorded_builds):
    """The tuner builds ahead exactly the kernel that dispatch asks the cache for."""
    from cute_kernels.matmul.api import get_kernel
    from cute_kernels.tuning.tune import compile_entries

    p = Problem("bf16", "fp32", "kk", "plain", 512, 4096, 4096)
    for cfg in (GemmConfig(128, 160, 2, 1, pingpong=True), GemmConfig(128, 128, 2, 1, split_k=5)):
        (key, _), = compile_entries(p, [cfg])
        assert gemm_keys(cfg, Epilogue(), torch.float32) == key
    swap = GemmConfig(128, 96, 2, 1, swap_ab=True)  # the kernel's view (operands swapped) in both
    (key, _), = compile_entries(Problem("bf16", "bf16", "kk", "plain", 273, 5120, 5120), [swap])
    assert gemm_keys(swap, Epilogue(), torch.bfloat16) == key
    p8 = Problem("int8", "int32", "kk", "plain", 512, 4096, 4096)
    cfg = GemmConfig(128, 160, 2, 1, pingpong=True)
    get_kernel("int8_mm_sm90", torch.int8, torch.int8, torch.int32, "k", "k", cfg, Epilogue(), "Int32")
    assert compile_entries(p8, [cfg])[0][0] == recorded_builds.last


def test_problems_for_a_model_and_shapes():
    from cute_kernels.tuning.tune import problems_for

    ps = problems_for(model="gpt2-xl", dtypes=("bf16", "fp8", "int8"), ms=(1, 8, 512))
    assert {(p.op, p.m) for p in ps if p.op == "bf16"} == {("bf16", 512)}  # decode GEMVs take M <= 8
    assert {p.epilogue for p in ps if p.op == "fp8-row"} == {"vector", "residual"}
    assert len(ps) == 5 * (1 + 3 + 3)
    ps = problems_for([(4096, 4096), (77, 1024, 2048)], ms=(512, 8192), dtypes="int8-raw")
    assert [(p.m, p.n, p.k, p.out) for p in ps] == [(512, 4096, 4096, "int32"), (8192, 4096, 4096, "int32"),
                                                    (77, 1024, 2048, "int32")]
    for bad in (dict(dtypes=("bf8",)), dict(ms=(0,)), dict(epilogue="gelu"), dict(model=None)):
        with pytest.raises(ValueError):
            problems_for(None if "model" in bad else [(64, 64)], **{"model": "gpt2", **bad})


def test_model_table_has_the_published_sizes():
    from cute_kernels.tuning.models import MODELS, linears, model_name, tuned_linears

    xl = {lin.name: (lin.n, lin.k) for lin in linears("openai-community/gpt2-xl")}
    assert xl == {"qkv": (4800, 1600), "o": (1600, 1600), "up": (6400, 1600), "down": (1600, 6400),
                  "lm_head": (50257, 1600)}
    l8 = {lin.name: (lin.n, lin.k) for lin in linears("llama-3-8b")}
    assert l8 == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                  "lm_head": (128256, 4096)}
    assert {lin.name: lin.epilogue for lin in linears("llama-3-8b")}["down"] == "residual"  # as patch_model fuses it
    t1 = {lin.name: (lin.n, lin.k) for lin in tuned_linears("llama-3.2-1b")}
    assert t1["q"] == (2048, 2048) and t1["kv"] == (512, 2048) and t1["qkv"] == (3072, 2048)
    assert tuned_linears("gpt2") == linears("gpt2")
    assert len(MODELS) == 10 and model_name("meta-llama/Meta-Llama-3-8B") == "llama-3-8b"
    with pytest.raises(ValueError, match="unknown model"):
        linears("gpt5")


def test_grid_draw_is_a_function_of_the_seed():
    from benchmarks.gemm import GRID_M_MAX, grid_shapes

    a, b, c = grid_shapes(7), grid_shapes(7), grid_shapes(8)
    assert a == b and a != c and len(a) == 60
    assert all(1 <= m <= GRID_M_MAX for _, m, _, _ in a) and any(m % 8 for _, m, _, _ in a)
    assert len({name.rsplit(".", 1)[0] for name, *_ in grid_shapes(0, 400)}) == 10
    with pytest.raises(ValueError):
        grid_shapes(0, 0)


def test_gemm_probe_draw_and_arguments(tmp_path):
    """benchmarks.gemm_probe: the tuned probe's draw is a function of its arguments and stays in
    its ranges; bad ranges, shapes and widths are refused before any GPU work."""
    import benchmarks.gemm_probe as P

    a = P.draw(4001, 30, (150, 700), (1280, 8192), 1024)
    assert a == P.draw(4001, 30, (150, 700), (1280, 8192), 1024) and a != P.draw(4002, 30, (150, 700), (1280, 8192), 1024)
    assert all(150 <= m <= 700 and 1280 <= n <= 8192 and k >= 1024 for m, n, k in a)
    assert P.parse_shapes("1302x768x768,2081X1024x4096") == [(1302, 768, 768), (2081, 1024, 4096)]
    assert P.parse_widths("64:256:16") == range(64, 257, 16) and P.parse_range("150,700", "--m") == (150, 700)
    for fn, bad in ((P.parse_shapes, "12x3"), (P.parse_shapes, "0x8x8"), (P.parse_widths, "60:256:16"),
                    (P.parse_widths, "64:300:16"), (P.parse_widths, "64:256:4"), (lambda s: P.parse_range(s, "--m"), "9,3")):
        with pytest.raises(ValueError):
            fn(bad)
    with pytest.raises(ValueError, match="no grid-model weight"):
        P.draw(1, 3, (1, 10), (10, 20), 1)
    for argv in (["widths", "--shapes", "1x2"], ["tuned", "--seed", "1", "--m", "5"], ["tuned", "--seed", "1", "--count", "0"],
                 ["epilogue", "--shapes", "1x2"], ["epilogue", "--shapes", "299x5120x1280", "--top", "0"],
                 ["pdl", "--shapes", "1x2"], ["pdl", "--shapes", "64x64x64", "--dtypes", "int8"]):
        with pytest.raises(SystemExit):
            P.main(argv)
    # the configs probe's spec: a {shape: [labels]} file, or a results file whose summary holds it
    import json

    spec = {"312x1280x5120": ["64x64c41T", "64x56c42Td12"]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "res.json").write_text(json.dumps({"rows": [], "summary": {"spec": spec}}))
    assert P.load_spec(str(tmp_path / "spec.json")) == spec == P.load_spec(str(tmp_path / "res.json"))
    for bad in ({"312x1280": ["64x64c41T"]}, {"312x1280x5120": []}, {"312x1280x5120": ["64x64"]}, []):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError):
            P.load_spec(str(tmp_path / "bad.json"))
    with pytest.raises(SystemExit):
        P.main(["configs", "--spec", str(tmp_path / "spec.json"), "--rounds", "0"])
    # the cublas probe's reading of nvjet kernel names (H100, cuBLAS 12.x): our swap_ab tile
    assert P.nvjet_config("nvjet_sm90_tst_128x80_64x8_4x1_v_bz_TNT") == GemmConfig(128, 80, 4, 1, swap_ab=True)
    assert P.nvjet_config("nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT") == GemmConfig(256, 160, 1, 2, swap_ab=True)
    assert P.nvjet_config("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_ovscale_TNT") == GemmConfig(128, 128, 2, 1, swap_ab=True)
    assert P.nvjet_config("nvjet_sm90_tst_128x272_64x4_2x1_v_bz_coopA_TNT") is None  # wider than our tiles
    assert P.nvjet_config("nvjet_sm90_tst_256x200_64x4_1x2_h_bz_coopA_TNT") is None  # 256 rows: at most 192 wide
    assert P.nvjet_config("Memset (Device)") is None and P.nvjet_config("sm90_xmma_gemm_bf16bf16") is None
    # splitK: as many splits as one wave holds (40 tiles in 10 clusters of 4, 30 a wave -> 3)
    split_name = "nvjet_sm90_tst_128x160_64x5_4x1_v_bz_splitK_TNT"
    assert P.nvjet_config(split_name, (154, 5120, 27648)) == GemmConfig(128, 160, 4, 1, split_k=3, swap_ab=True)
    assert P.nvjet_config(split_name) == GemmConfig(128, 160, 4, 1, swap_ab=True)
    assert P.nvjet_config(split_name, (154, 5120, 256)).split_k == 1  # 4 k-tiles: no room to split
    with pytest.raises(SystemExit):
        P.main(["cublas", "--shapes", "1x2"])
    # the epilogue probe's pairs: each cooperative config forced both ways; none for ping-pong
    from benchmarks.gemm import grid_problem

    p = grid_problem("bf16", 299, 5120, 1280)
    first = P.epilogue_candidates(p)
    assert GemmConfig(128, 104, 4, 1, swap_ab=True) in first and len(first) == len(set(first))
    assert P._forced(GemmConfig(128, 104, swap_ab=True), False).whole_tile_epi is False
    assert P._forced(GemmConfig(128, 128, pingpong=True), True) is None


def test_gemm_probe_ab_sets_and_table(tmp_path, monkeypatch):
    """benchmarks.gemm_probe ab / configs --set: only an existing cute_kernels module constant and
    a Python literal are taken (a typo would time the unchanged code as the variant); applying one
    turns the disk cache of compiled kernels off; the table sets each side against cuBLAS in its
    own process."""
    import benchmarks.gemm_probe as P
    from cute_kernels.matmul import config

    sets = P.parse_sets(["cute_kernels.matmul.config.EPI_STAGES=3"])
    assert sets == [("cute_kernels.matmul.config", "EPI_STAGES", 3)]
    for bad in ("EPI_STAGES=3", "cute_kernels.matmul.config.NO_SUCH=1", "cute_kernels.no_such.X=1",
                "cute_kernels.matmul.config.EPI_STAGES=three", "torch.cuda.X=1"):
        with pytest.raises(ValueError):
            P.parse_sets([bad])
    monkeypatch.setattr(config, "EPI_STAGES", config.EPI_STAGES)  # restored after the test
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    P.apply_sets(sets)
    assert config.EPI_STAGES == 3 and os.environ["CUTE_KERNELS_DISK_CACHE"] == "0"

    def run(cute_ms, cublas_ms):
        return {"rows": [{"case": "100x200x300", "provider": "cute 128x96c21T", "ms": cute_ms},
                         {"case": "100x200x300", "provider": "cublas", "ms": cublas_ms}]}

    # the variant's process ran slower overall (cuBLAS too): against cuBLAS it is 1.1x the base
    rows, summary = P.combine_ab([run(1.0, 1.0), run(1.0, 1.0)], [run(1.0, 1.1), run(1.0, 1.1)])
    assert summary["configs_compared"] == 1 and summary["set_faster"] == 1
    assert summary["geomean_set_over_base"] == pytest.approx(1.1)
    assert [r.provider for r in rows] == ["cute 128x96c21T", "cute 128x96c21T [set]", "cublas"]
    assert P.combine_ab([run(1.0, 1.0)], [])[1] == {"configs_compared": 0}
    # run_ab's orchestration, with the configs processes stood in for: pairs alternate the side
    # that runs first, only the variant's processes get the --set items, all with the disk cache off
    import subprocess
    from pathlib import Path

    calls = []

    def fake_run(cmd, env, check):
        name, out = cmd[cmd.index("--name") + 1], cmd[cmd.index("--out") + 1]
        calls.append((name, "--set" in cmd, env["CUTE_KERNELS_DISK_CACHE"]))
        cub = 1.1 if "--set" in cmd else 1.0
        (Path(out) / f"gemm_probe_{name}_h200.json").write_text(json.dumps(run(1.0, cub)))

    monkeypatch.setattr(subprocess, "run", fake_run)
    rows, summary = P.run_ab({"100x200x300": ["128x96c21T"]}, ["cute_kernels.matmul.config.EPI_STAGES=3"], 2, 1, "bf16")
    assert calls == [("ab_base0", False, "0"), ("ab_set0", True, "0"), ("ab_set1", True, "0"), ("ab_base1", False, "0")]
    assert summary["geomean_set_over_base"] == pytest.approx(1.1) and summary["pairs"] == 2
    spec = tmp_path / "spec.json"
    spec.write_text('{"312x1280x5120": ["64x64c41T"]}')
    for argv in (["ab", "--spec", str(spec), "--set", "cute_kernels.matmul.config.NO_SUCH=1"],
                 ["ab", "--spec", str(spec)], ["configs", "--spec", str(spec), "--set", "nope"],
                 ["ab", "--spec", str(spec), "--set", "cute_kernels.matmul.config.EPI_STAGES=2", "--pairs", "0"]):
        with pytest.raises(SystemExit):
            P.main(argv)


def test_gemm_probe_rule_spec(capsys):
    """benchmarks.gemm_probe rule: the draws a rule changes, with the grid's pick without the rule
    and with it, a function of the arguments; the rule is switched back on afterwards, and an
    unknown rule or a draw it never changes is refused before any GPU work."""
    import json

    import benchmarks.gemm_probe as P
    from benchmarks.gemm import _grid_label
    from cute_kernels.matmul import heuristics

    names = P.rule_names()
    assert "fp8_equal_fill_swap_config" in names and "long_k_c41_config" in names and "default_config" not in names
    spec = P.rule_spec("fp8_equal_fill_swap_config", "fp8", 45, 4, (200, 1500))
    assert len(spec) == 4 and spec == P.rule_spec("fp8_equal_fill_swap_config", "fp8", 45, 4, (200, 1500))
    before = heuristics.fp8_equal_fill_swap_config
    for shape, (off, on) in spec.items():
        m, n, k = (int(x) for x in shape.split("x"))
        assert off != on and _grid_label("fp8", m, n, k) == on and off.endswith("P") and on.endswith("T")
    assert heuristics.fp8_equal_fill_swap_config is before
    assert P.main(["rule", "--rule", "fp8_equal_fill_swap_config", "--dtype", "fp8", "--seed", "45", "--count", "2",
                   "--dry-run"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    for argv in (["rule", "--rule", "no_such_config", "--seed", "1"], ["rule", "--rule", "default_config", "--seed", "1"],
                 ["rule", "--rule", "fp8_equal_fill_swap_config", "--dtype", "fp8", "--seed", "1", "--m", "1,8"],
                 ["rule", "--rule", "swap_config", "--seed", "1", "--count", "0"]):
        with pytest.raises(SystemExit):
            P.main(argv)


def test_rule_chain_names_every_rule():
    """heuristics.RULES (what `gemm_probe rule` can switch off) lists exactly the *_config
    functions the chain of heuristics.pick_config calls, each of them a function of the module."""
    from cute_kernels.matmul import heuristics as h

    called = {n for f in (h.pick_config, h._rules_16bit, h._rules_fp8) for n in f.__code__.co_names
              if n.endswith("_config")}
    assert called - {"swap_config", "split_config", "default_config"} == set(h.RULES)
    assert len(h.RULES) == len(set(h.RULES)) and all(callable(getattr(h, n)) for n in h.RULES)


def test_grid_slices_and_quack_cache(tmp_path, monkeypatch):
    """--slice picks part of the seed's draw (validated before the GPU check); QuACK's
    autotuning cache defaults under our cache root and keeps a user's own setting."""
    import benchmarks.gemm as G

    assert G._slice(None) == slice(None) and G._slice("0:20") == slice(0, 20) and G._slice("40:") == slice(40, None)
    for bad in ("5", "a:b", "-1:3", "1:2:3"):
        with pytest.raises(SystemExit, match="slice"):
            G._slice(bad)
    with pytest.raises(SystemExit, match="--slice selects shapes of --grid"):
        G.main(["--slice", "0:5"])
    assert G.grid_shapes(7, 60)[slice(10, 20)] == G.grid_shapes(7, 60)[10:20]
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("QUACK_CACHE_DIR", raising=False)
    monkeypatch.delenv("QUACK_CACHE_AUTOTUNING", raising=False)
    G._quack_autotune_cache()
    assert os.environ["QUACK_CACHE_DIR"] == str(tmp_path / "quack") and os.environ["QUACK_CACHE_AUTOTUNING"] == "1"
    monkeypatch.setenv("QUACK_CACHE_DIR", "/elsewhere")
    G._quack_autotune_cache()
    assert os.environ["QUACK_CACHE_DIR"] == "/elsewhere"


def test_the_cli_needs_a_gpu_and_says_so_in_one_line():
    out = subprocess.run([sys.executable, "-m", "cute_kernels.tune", "--model", "gpt2-xl"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Hopper" in out.stderr, out.stderr


def test_tune_is_one_callable_however_it_is_reached():
    import importlib

    import cute_kernels as ck

    mod = importlib.import_module("cute_kernels.tune")
    assert ck.tune is mod and callable(ck.tune)
    with pytest.raises(ValueError, match="shapes, a model"):
        ck.tune()


def test_precompile_reports_cached_kernels_at_once(tmp_path, monkeypatch):
    from cute_kernels.precompile import precompile
    from cute_kernels.runtime.cache import object_path
    from cute_kernels.tuning.tune import compile_entries

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUTE_KERNELS_DISK_CACHE", raising=False)
    entries = compile_entries(Problem(*PLAIN, 512, 4096, 4096), [GemmConfig(), GemmConfig(128, 128, 2, 1)])
    for key, _ in entries:
        object_path(key).parent.mkdir(parents=True, exist_ok=True)
        object_path(key).touch()
    seen = []
    assert precompile(entries, on_ready=lambda k, s: seen.append((k, s)))["cached"] == 2
    assert seen == [(k, "cached") for k, _ in entries]


def test_scales_only_times_fp8_per_row_without_its_bias():
    """Probes time fp8 per-row as the grid calls it (scale vectors, no bias), so swap_ab configs
    build; the tuner's class keeps its bias, and other classes refuse the flag."""
    from cute_kernels.tuning import tune

    p = Problem("fp8-row", "bf16", "kk", "vector", 301, 5120, 5120)
    assert tune._kernel_args(p)["epi"].bias
    epi = tune._kernel_args(p, scales_only=True)["epi"]
    assert not epi.bias and (epi.row_scale, epi.col_scale) == ("vector", "vector")
    key, _ = tune.compile_entries(p, [GemmConfig(128, 104, 4, 1, swap_ab=True)], scales_only=True)[0]
    assert '"bias":false' in key.recipe
    assert tune.GpuTimer(rep_ms=1.0, warm_ms=0.0, scales_only=True).scales_only
    with pytest.raises(ValueError, match="scales_only"):
        tune._kernel_args(Problem(*PLAIN, 64, 4096, 4096), scales_only=True)
