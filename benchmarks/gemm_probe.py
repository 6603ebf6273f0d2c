"""GEMM probes behind the heuristics' rules: what a config space can do on a draw of shapes.

    python -m benchmarks.gemm_probe tuned --seed 4001 --count 30 --m 150,700 --n 1280,8192 --min-k 1024
    python -m benchmarks.gemm_probe tuned --shapes 171x50257x768,154x5120x27648 [--keep DIR]
    python -m benchmarks.gemm_probe widths --shapes 1302x768x768,2081x1024x4096 [--widths 64:256:16] [--top 3]
    python -m benchmarks.gemm_probe epilogue --shapes 299x5120x1280,1186x2048x2048 [--top 10]
    python -m benchmarks.gemm_probe rule --rule fp8_equal_fill_swap_config --dtype fp8 --seed 45 [--dry-run]

`tuned`: a draw of bf16 `linear` shapes, M log-uniform in the --m range and (N, K) a weight of
the grid's models (cute_kernels.tuning.models) inside --n with K >= --min-k, the draw a pure
function of the seed; each class is tuned from scratch (`tuning.tune.tune_gemm(force=True)`:
both rounds, outputs checked against the first config's) into a throwaway tuning cache, and
its best is set against the heuristic's pick (no tuning table) and cuBLAS (`F.linear`) timed
in the same process. --shapes tunes the shapes given instead of a draw; --keep DIR tunes into
DIR's tuning cache, which then holds the winners. Summary: best / pick and both against cuBLAS, overall and split at
K = 1600. Writes gemm_probe_tuned_<gpu>.{json,md} (--name to change "tuned").

`widths`: per shape, the dispatch pick (shipped table, then the heuristic) against the
narrowest --top 128-row swap_ab widths in --widths whose 2 x 1 grid fits one wave, timed by
the tuner's GpuTimer (each output checked against the pick's), cuBLAS alongside. Writes
gemm_probe_widths_<gpu>.{json,md}.

`epilogue`: per shape, every first-round candidate of the tuner (`candidates(limit=None)`)
and, below 1400 tokens, the swap_ab widths that pad the tokens by at most 12% in 1 x 1, 2 x 1,
1 x 2, 4 x 1 and 2 x 2 clusters; then the --top fastest cooperative ones again, each with the
whole-tile epilogue and with the slab ring forced (`GemmConfig.whole_tile_epi` True / False),
side by side. Summary: the best whole-tile config against the best ring one. Writes
gemm_probe_epilogue_<gpu>.{json,md}.

`pdl`: per shape and dtype (bf16 `linear`, fp8 per-row `scaled_mm`, the grid's calls), the
dispatch pick built with and without programmatic dependent launch (`GemmSm90(pdl=...)`),
side by side with cuBLAS, in rounds that alternate the order. The graph replays back-to-back
calls, so with PDL each call's setup overlaps the previous call's tail. Writes
gemm_probe_pdl_<gpu>.{json,md}.

`cublas`: per shape, the kernel cuBLAS runs (its name, read with torch.profiler) mapped onto our
config space (`nvjet_config`) and timed against the dispatch pick, as `configs` times them.
cuBLAS computes the column-major product D^T = W X^T, so an nvjet tile's first dimension runs
along the weight's rows: our swap_ab tile (`nvjet_sm90_tst_128x80_64x8_4x1` -> 128x80c41T;
`qqtst` for fp8, timed without a bias as `--scales-only` below); a `splitK` kernel splits K as
many ways as one wave of its grid holds. Its stage count is left to our default ring. Writes gemm_probe_cublas_<gpu>.{json,md}.

`configs`: named configs per shape, side by side with cuBLAS: --spec is a JSON file of
{"MxNxK": [label, ...]} (tuning.tune.label's format), or a results file of this probe, whose
summary holds the spec it ran. The first label of a shape is the reference its others' outputs
are checked against; --rounds rounds alternate the order, medians reported. With --rule, the
summary sets the first label (the pick before a heuristic change) against the heuristic's
current pick where that was timed. --dtype fp8 times the tuner's fp8 per-row class, whose
epilogue carries a bias (so no swap_ab config runs); --scales-only drops the bias, as the grid's
`scaled_mm` call does, and --rule then compares against the grid's pick. Writes
gemm_probe_configs_<gpu>.{json,md}. Plain 16-bit problems also check the first config's output
against an fp64 product (at most 2x torch's error). --set cute_kernels.MODULE.ATTR=VALUE (repeatable)
sets a module constant before anything compiles and turns the disk cache of compiled kernels off:
the compile pool's workers are spawned and would import the code afresh, building the unchanged
kernel (a first A/B without that compared the same code with itself, 0.999x over 73 shapes, the
spread of two processes about +-3% a shape).

`ab`: a kernel-code constant switched, as one command: --pairs pairs of `configs` processes on
--spec, one as the tree is and one with the --set items, alternating which runs first, every
kernel compiled in its own process. Per shape and config each side is taken against cuBLAS in
its own process (geomean over the pairs) and the variant's speed set over the base's; summary:
geomean, how many faster, min and max. Writes gemm_probe_ab_<gpu>.{json,md}.

`rule`: one rule of `heuristics.pick_config`'s chain (--rule, e.g. fp8_equal_fill_swap_config) switched
off and on: a draw (grid-model weights, M log-uniform in --m, --seed) kept where the rule changes
the grid's pick (--count such draws), both picks timed as `configs` times them in the grid's call
of --dtype (fp8: per-row scales without a bias). Summary: the pick with the rule against the pick
without it, and both against cuBLAS. --dry-run prints the draws' picks as a configs spec without
a GPU. Writes gemm_probe_rule_<gpu>.{json,md} (--name to change "rule").

All times: CUDA graphs over L2-rotated randn inputs (runtime.timing), bf16 unless said, H100-class GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import tempfile

from .common import PEAK_TFLOPS, Row, format_table, geomean, require_hopper, write_results


def parse_range(spec: str, name: str) -> tuple[int, int]:
    """'150,700' -> (150, 700); both ends positive, lo <= hi."""
    try:
        lo, hi = (int(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(f"{name} takes LO,HI (two integers), got {spec!r}") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} needs 1 <= LO <= HI, got {spec!r}")
    return lo, hi


def parse_shapes(spec: str) -> list[tuple[int, int, int]]:
    """'1302x768x768,2081x1024x4096' -> [(1302, 768, 768), (2081, 1024, 4096)]."""
    out = []
    for part in spec.split(","):
        try:
            m, n, k = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"--shapes takes MxNxK[,MxNxK...], got {part!r}") from None
        if min(m, n, k) < 1:
            raise ValueError(f"--shapes: every extent must be >= 1, got {part!r}")
        out.append((m, n, k))
    return out


def parse_widths(spec: str) -> range:
    """'64:256:16' -> range(64, 257, 16): swap_ab token-tile widths, multiples of 8 in 16..256."""
    try:
        lo, hi, step = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"--widths takes LO:HI:STEP, got {spec!r}") from None
    if not (16 <= lo <= hi <= 256 and step >= 8 and lo % 8 == 0 and step % 8 == 0):
        raise ValueError(f"--widths needs 16 <= LO <= HI <= 256 with LO and STEP multiples of 8, got {spec!r}")
    return range(lo, hi + 1, step)


def draw(seed: int, count: int, m_range: tuple[int, int], n_range: tuple[int, int], min_k: int):
    """`count` (M, N, K): (N, K) a grid-model weight with N in n_range and K >= min_k, M
    log-uniform in m_range; a pure function of the arguments."""
    from cute_kernels.tuning.models import MODELS, linears

    pool = sorted({(lin.n, lin.k) for model in MODELS for lin in linears(model)
                   if n_range[0] <= lin.n <= n_range[1] and lin.k >= min_k})
    if not pool:
        raise ValueError(f"no grid-model weight has N in {n_range} and K >= {min_k}")
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n, k = rng.choice(pool)
        out.append((round(math.exp(rng.uniform(math.log(m_range[0]), math.log(m_range[1])))), n, k))
    return out


def _cublas_ms(m: int, n: int, k: int) -> float:
    """cuBLAS over as many input copies as the tuner's timer rotates (a weight that fits in L2
    would otherwise be timed warm)."""
    import torch
    import torch.nn.functional as F

    from cute_kernels.runtime.timing import rotation_count, time_ms

    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
            for _ in range(rotation_count((m * k + n * k + m * n) * 2))]
    return time_ms(lambda i: F.linear(*sets[i]), n_rotate=len(sets), rep_ms=20.0)


def _row(case: str, provider: str, m: int, n: int, k: int, ms: float, dtype: str = "bf16", **extra) -> Row:
    tf = 2 * m * n * k / ms / 1e9
    return Row(case, provider, ms, tf, 100 * tf / PEAK_TFLOPS[dtype], extra=extra)


def run_tuned(shapes, keep: str | None = None) -> tuple[list[Row], dict]:
    from benchmarks.gemm import grid_problem
    from cute_kernels.tuning.tune import label, tune_gemm

    # A throwaway cache root unless --keep names one: the probe's winners must not steer later
    # dispatch (its kernels compile afresh there too).
    os.environ["CUTE_KERNELS_CACHE_DIR"] = keep or tempfile.mkdtemp(prefix="gemm-probe-")
    results = tune_gemm([grid_problem("bf16", m, n, k) for m, n, k in shapes], force=True, log=None)
    rows, best_pick, short, long_ = [], [], [], []
    for r in results:
        p = r.problem
        case = f"{p.m}x{p.n}x{p.k}"
        cub = _cublas_ms(p.m, p.n, p.k)
        rows.append(_row(case, "cute", p.m, p.n, p.k, r.heuristic_ms, config=label(r.heuristic), role="pick"))
        rows.append(_row(case, "cute tuned", p.m, p.n, p.k, r.ms, config=label(r.config), role="best",
                         timed=r.timed))
        rows.append(_row(case, "cublas", p.m, p.n, p.k, cub))
        best_pick.append(r.heuristic_ms / r.ms)
        (short if p.k <= 1600 else long_).append(cub / r.ms)
    t = {(r.case, r.provider): r.ms for r in rows}
    cases = sorted({r.case for r in rows})
    summary = {
        "classes": len(results),
        "geomean_best_vs_pick": geomean(best_pick),
        "geomean_pick_vs_cublas": geomean([t[(c, "cublas")] / t[(c, "cute")] for c in cases]),
        "geomean_best_vs_cublas": geomean([t[(c, "cublas")] / t[(c, "cute tuned")] for c in cases]),
        "min_best_vs_cublas": min(t[(c, "cublas")] / t[(c, "cute tuned")] for c in cases),
    }
    if short:
        summary["geomean_best_vs_cublas[K<=1600]"] = geomean(short)
    if long_:
        summary["geomean_best_vs_cublas[K>1600]"] = geomean(long_)
    return rows, summary


def _start_builds(cands: dict, scales_only: bool = False):
    """The tuner's compile pool started on every config of `cands` ({problem: configs}), and
    the tuner's timer (its output check against each problem's first config included).
    scales_only: fp8 per-row without the bias its tuning class carries (`tune._kernel_args`)."""
    from cute_kernels.tuning.tune import GpuTimer, _dedupe, _Ready, compile_entries, precompile_build

    ready = _Ready(precompile_build())
    ready.start(_dedupe(e for p, cs in cands.items() for e in compile_entries(p, cs, scales_only)))
    return ready, GpuTimer(rep_ms=10.0, warm_ms=300.0, scales_only=scales_only)


def _cublas_on_timer_inputs(timer, dtype: str = "bf16") -> float:
    """cuBLAS over the input sets the timer rotated for its current problem: `F.linear` (bf16), or
    `torch._scaled_mm` with the sets' per-row scales and fast accumulation (fp8), `torch._int_mm`
    (int8, raw int32 outputs)."""
    import torch
    import torch.nn.functional as F

    from benchmarks.gemm import _CUBLAS_N_ALIGN
    from cute_kernels.runtime.timing import time_ms

    def padded_rows(t):  # the weight (or its column scales) padded to cuBLAS's N alignment, as the grid does
        extra = -t.shape[0] % _CUBLAS_N_ALIGN
        return torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) if extra else t

    sets = timer._sets
    if dtype == "int8":
        # torch._int_mm needs M > 16: padded rows outside the timed call, as the grid pads them.
        from benchmarks.gemm import _INT_MM_MIN_M

        padded = [(torch.cat([a, a.new_zeros(max(_INT_MM_MIN_M - a.shape[0], 0), a.shape[1])]), padded_rows(w))
                  for a, w, *_ in sets]
        return time_ms(lambda i: torch._int_mm(padded[i][0], padded[i][1].t()), n_rotate=len(sets), rep_ms=10.0)
    if dtype == "fp8":
        fp8 = [(a, padded_rows(w), args["row_scale"].view(-1, 1), padded_rows(args["col_scale"].view(-1)).view(1, -1))
               for a, w, _, args in sets]

        def run(i):
            a, w, rs, cs = fp8[i]
            return torch._scaled_mm(a, w.t(), rs, cs, out_dtype=torch.bfloat16, use_fast_accum=True)
        return time_ms(run, n_rotate=len(fp8), rep_ms=10.0)
    weights = [padded_rows(w) for _, w, *_ in sets]
    return time_ms(lambda i: F.linear(sets[i][0], weights[i]), n_rotate=len(sets), rep_ms=10.0)


def run_widths(shapes, widths: range, top: int) -> tuple[list[Row], dict]:
    from benchmarks.gemm import grid_problem
    from cute_kernels.matmul.heuristics import one_wave_swaps
    from cute_kernels.tuning.tune import _fits, _time_all, dispatch_config, label

    probs, cands = [], {}
    for m, n, k in shapes:
        p = grid_problem("bf16", m, n, k)
        swaps = [c for c in one_wave_swaps(m, n, widths) if _fits(p, c)][:top]
        probs.append(p)
        cands[p] = list(dict.fromkeys([dispatch_config(p)] + swaps))
    ready, timer = _start_builds(cands)
    rows, best_pick, pick_cub, best_cub = [], [], [], []
    for p in probs:
        times = _time_all(p, cands[p], ready, timer, print)  # a config whose output disagrees is logged, left out
        pick = cands[p][0]
        if pick not in times:
            continue
        cub = _cublas_on_timer_inputs(timer)
        case = f"{p.m}x{p.n}x{p.k}"
        for cfg, ms in times.items():
            name = "cute" if cfg == pick else f"cute {label(cfg)}"
            rows.append(_row(case, name, p.m, p.n, p.k, ms, config=label(cfg)))
        rows.append(_row(case, "cublas", p.m, p.n, p.k, cub))
        best = min(times.values())
        best_pick.append(times[pick] / best)
        pick_cub.append(cub / times[pick])
        best_cub.append(cub / best)
    summary = {"shapes": len(best_pick)}
    if best_pick:
        summary.update({"geomean_best_vs_pick": geomean(best_pick), "geomean_pick_vs_cublas": geomean(pick_cub),
                        "geomean_best_vs_cublas": geomean(best_cub)})
    return rows, summary


def epilogue_candidates(problem):
    """The probe's first timing round for `problem`: every first-round candidate, then (below
    1400 tokens) the swap_ab widths padding the tokens by <= 12% in the probe's cluster shapes."""
    from cute_kernels.matmul.config import GemmConfig
    from cute_kernels.tuning.tune import _fits, candidates

    out = candidates(problem, limit=None)
    if problem.m < 1400:
        for tm in (64, 128):
            for w in range(64, 257, 8):
                if -(-problem.m // w) * w - problem.m > 0.12 * problem.m:
                    continue
                for cm, cn in ((1, 1), (2, 1), (1, 2), (4, 1), (2, 2)):
                    cfg = GemmConfig(tm, w, cm, cn, swap_ab=True)
                    try:
                        cfg.validate()
                    except ValueError:
                        continue
                    if _fits(problem, cfg):
                        out.append(cfg)
    return list(dict.fromkeys(out))


def _forced(cfg, whole: bool):
    """cfg with the whole-tile epilogue forced on or off, or None where that does not validate."""
    import dataclasses

    c = dataclasses.replace(cfg, whole_tile_epi=whole)
    try:
        c.validate()
    except ValueError:
        return None
    return c


def run_epilogue(shapes, top: int) -> tuple[list[Row], dict]:
    from benchmarks.gemm import grid_problem
    from cute_kernels.tuning.tune import _fits, _time_all, label

    probs, first, pairs = [], {}, {}
    for m, n, k in shapes:
        p = grid_problem("bf16", m, n, k)
        probs.append(p)
        first[p] = epilogue_candidates(p)
        pairs[p] = [c for c in (_forced(x, w) for x in first[p] if not x.pingpong for w in (True, False))
                    if c is not None and _fits(p, c)]
    ready, timer = _start_builds({p: first[p] + pairs[p] for p in probs})
    rows, ratios = [], []
    for p in probs:
        times = _time_all(p, first[p], ready, timer, print)
        top_cfgs = [c for c, _ in sorted(times.items(), key=lambda kv: kv[1]) if not c.pingpong][:top]
        both = [c for x in top_cfgs for c in (_forced(x, True), _forced(x, False)) if c is not None and c in pairs[p]]
        t2 = _time_all(p, both, ready, timer, print)
        whole = {c: t for c, t in t2.items() if c.whole_tile_epi}
        ring = {c: t for c, t in t2.items() if not c.whole_tile_epi}
        if not whole or not ring:
            continue
        cub = _cublas_on_timer_inputs(timer)
        case = f"{p.m}x{p.n}x{p.k}"
        bw, br = min(whole, key=whole.get), min(ring, key=ring.get)
        rows.append(_row(case, "cute whole", p.m, p.n, p.k, whole[bw], config=label(bw),
                         all={label(c): round(t, 5) for c, t in t2.items()}))
        rows.append(_row(case, "cute ring", p.m, p.n, p.k, ring[br], config=label(br)))
        rows.append(_row(case, "cute any", p.m, p.n, p.k, min(times.values()), config=label(min(times, key=times.get))))
        rows.append(_row(case, "cublas", p.m, p.n, p.k, cub))
        ratios.append(ring[br] / whole[bw])
    summary = {"shapes": len(ratios)}
    if ratios:
        summary.update({"geomean_best_whole_vs_best_ring": geomean(ratios), "min_best_whole_vs_best_ring": min(ratios),
                        "max_best_whole_vs_best_ring": max(ratios)})
    return rows, summary


class _WithoutPdl:
    """Inside the block, dispatch builds and runs GEMM kernels without PDL (their own compile
    keys, so the disk cache keeps both); on exit dispatch is as before."""

    def __enter__(self):
        from cute_kernels.matmul import api
        from cute_kernels.quantized import api as qapi

        real = self._real = api.KERNELS

        class _Kernels:
            def compiled(self, kernel, fn, *args, **kw):
                return real.compiled(kernel, fn, *args, **dict(kw, pdl=False) if fn is api._compile else kw)

            def __getattr__(self, name):
                return getattr(real, name)

        api.KERNELS = _Kernels()
        api.clear_dispatch_caches()
        qapi.clear_dispatch_caches()
        return self

    def __exit__(self, *exc):
        from cute_kernels.matmul import api
        from cute_kernels.quantized import api as qapi

        api.KERNELS = self._real
        api.clear_dispatch_caches()
        qapi.clear_dispatch_caches()


def run_pdl(shapes, dtypes, rounds: int = 4) -> tuple[list[Row], dict]:
    """The `pdl` probe: both builds of each dispatch pick compiled ahead in parallel, each
    output checked against cuBLAS, then `rounds` alternating rounds of the three timings."""
    import contextlib
    import functools
    import statistics

    from benchmarks.gemm import _grid_label, _grid_providers, grid_problem
    from cute_kernels.precompile import precompile
    from cute_kernels.runtime.key import CompileKey
    from cute_kernels.runtime.timing import rotation_count, time_ms, warm_up
    from cute_kernels.tuning.tune import dispatch_entries

    entries = []
    for dt in dtypes:
        for key, rec in dispatch_entries([grid_problem(dt, m, n, k) for m, n, k in shapes]):
            off = functools.partial(rec.func, *rec.args, **dict(rec.keywords, pdl=False))
            entries += [(key, rec), (CompileKey.of(key.kernel, off), off)]
    precompile(entries)
    warm_up(500.0)
    rows, ratios = [], {dt: [] for dt in dtypes}
    for dt in dtypes:
        make, provs, _ = _grid_providers(dt)
        for m, n, k in shapes:
            sets = [make(m, n, k) for _ in range(rotation_count((m * k + n * k) * (2 if dt == "bf16" else 1) + 2 * m * n))]
            ref = provs["cublas"](*sets[0])[:m, :n].float()
            modes = {"cute": contextlib.nullcontext, "cute no-pdl": _WithoutPdl}
            for name, mode in modes.items():
                with mode():
                    err = ((provs["cute"](*sets[0])[:m, :n].float() - ref).abs().max() / ref.abs().max()).item()
                if err > 2e-2:
                    raise AssertionError(f"{name} {dt} {m}x{n}x{k} disagrees with cuBLAS ({err:.3g})")
            times = {"cublas": [], **{name: [] for name in modes}}
            for r in range(rounds):
                for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
                    fn = provs["cublas" if name == "cublas" else "cute"]
                    with modes.get(name, contextlib.nullcontext)():
                        times[name].append(time_ms(lambda i, fn=fn: fn(*sets[i]), n_rotate=len(sets), rep_ms=40.0))
            case, label = f"{dt}-{m}x{n}x{k}", _grid_label(dt, m, n, k)
            med = {name: statistics.median(t) for name, t in times.items()}
            for name, ms in med.items():
                tf = 2 * m * n * k / ms / 1e9
                rows.append(Row(case, name, ms, tf, 100 * tf / PEAK_TFLOPS[dt],
                                extra={"config": label} if name != "cublas" else {}))
            ratios[dt].append(med["cute no-pdl"] / med["cute"])
            print(f"[pdl] {case} {label}: " + " ".join(f"{x}={v * 1e3:.2f}us" for x, v in med.items()), flush=True)
            del sets
    summary = {"shapes": {dt: len(r) for dt, r in ratios.items()}}
    for dt, r in ratios.items():
        if r:
            summary[f"geomean_pdl_vs_none[{dt}]"] = geomean(r)
            summary[f"min_pdl_vs_none[{dt}]"] = min(r)
    return rows, summary


def load_spec(path: str) -> dict[str, list[str]]:
    """{"MxNxK": [labels]} from a spec file or from a `configs` results file's summary."""
    import json

    from benchmarks.tune_gemm import parse_label

    with open(path) as f:
        data = json.load(f)
    spec = data.get("summary", {}).get("spec") if isinstance(data, dict) and "rows" in data else data
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"{path}: expected {{\"MxNxK\": [labels]}} or a configs results file")
    for shape, labels in spec.items():
        parse_shapes(shape)
        if not isinstance(labels, list) or not labels:
            raise ValueError(f"{path}: {shape} needs a non-empty list of config labels")
        for lab in labels:
            parse_label(lab)
    return spec


def _check_against_torch(timer, problem) -> None:
    """The first config's output for a plain 16-bit problem (the timer's reference for the
    others) against an fp64 product of the same inputs: at most 2x torch's own error, so a
    kernel variant timed alone (`ab`) is checked too. Other classes: the timer's checks."""
    import torch

    a, w, _out, args = timer._sets[0]
    if args or problem.eight_bit or problem.epilogue != "plain" or timer._ref is None:
        return
    ref = a.double() @ w.double().t()
    ours = (timer._ref.double() - ref).abs().max().item()
    theirs = (torch.nn.functional.linear(a, w).double() - ref).abs().max().item()
    if not ours <= 2 * theirs + 1e-6 * max(ref.abs().max().item(), 1.0):
        raise ArithmeticError(f"{problem.m}x{problem.n}x{problem.k}: error {ours:.3g} against an fp64 product, "
                              f"torch's {theirs:.3g}")


_SET = re.compile(r"(cute_kernels(?:\.\w+)+)\.(\w+)=(.+)$")


def parse_sets(values) -> list[tuple[str, str, object]]:
    """--set MODULE.ATTR=VALUE items: an existing module constant of cute_kernels and a Python
    literal. Refused (ValueError) if the module or attribute does not exist: a typo must not
    time the unchanged code as the variant."""
    import ast
    import importlib

    out = []
    for v in values or ():
        m = _SET.match(v.strip())
        if not m:
            raise ValueError(f"--set takes cute_kernels.MODULE.ATTR=VALUE, got {v!r}")
        mod, attr, literal = m.groups()
        try:
            value = ast.literal_eval(literal)
        except (ValueError, SyntaxError):
            raise ValueError(f"--set {v!r}: the value must be a Python literal") from None
        try:
            module = importlib.import_module(mod)
        except ImportError:
            raise ValueError(f"--set {v!r}: no module {mod}") from None
        if not hasattr(module, attr):
            raise ValueError(f"--set {v!r}: {mod} has no attribute {attr}")
        out.append((mod, attr, value))
    return out


def apply_sets(sets) -> None:
    """Set each (module, attr, value) in this process, with the disk cache of compiled kernels
    off: the compile pool's spawned workers would import the code afresh and build the
    unchanged kernel, and a cached object would be the unchanged kernel too."""
    import importlib

    if not sets:
        return
    os.environ["CUTE_KERNELS_DISK_CACHE"] = "0"
    for mod, attr, value in sets:
        setattr(importlib.import_module(mod), attr, value)


def combine_ab(base: list[dict], varied: list[dict], dtype: str = "bf16") -> tuple[list[Row], dict]:
    """The `ab` probe's table from its `configs` runs' results (payloads with rows): per shape and
    config the median time of each side and cuBLAS's, and the variant's speed over the base's,
    each side taken against cuBLAS in its own process (geomean over the runs), which cancels
    most of the drift between processes."""
    import statistics

    def table(runs):
        t = {}
        for run in runs:
            by = {}
            for r in run["rows"]:
                by.setdefault(r["case"], {})[r["provider"]] = r["ms"]
            for case, provs in by.items():
                cub = provs.get("cublas")
                for prov, ms in provs.items():
                    if prov.startswith("cute ") and cub:
                        t.setdefault((case, prov), []).append((ms, cub / ms, cub))
        return t

    tb, tv = table(base), table(varied)
    rows, ratios = [], []
    for key in tb:
        if key not in tv:
            continue
        case, prov = key
        m, n, k = (int(x) for x in case.split("x"))
        b_speed = geomean([x[1] for x in tb[key]])
        v_speed = geomean([x[1] for x in tv[key]])
        ratio = v_speed / b_speed
        ratios.append(ratio)
        rows.append(_row(case, prov, m, n, k, statistics.median(x[0] for x in tb[key]), dtype, side="base"))
        rows.append(_row(case, f"{prov} [set]", m, n, k, statistics.median(x[0] for x in tv[key]), dtype, side="set",
                         set_over_base=round(ratio, 4)))
        rows.append(_row(case, "cublas", m, n, k, statistics.median(x[2] for x in tb[key] + tv[key]), dtype))
    summary = {"configs_compared": len(ratios)}
    if ratios:
        summary.update({"geomean_set_over_base": geomean(ratios), "set_faster": sum(r > 1 for r in ratios),
                        "min_set_over_base": min(ratios), "max_set_over_base": max(ratios)})
    return rows, summary


def run_ab(spec: dict, sets_argv: list[str], pairs: int, rounds: int, dtype: str) -> tuple[list[Row], dict]:
    """The `ab` probe: `pairs` pairs of `configs` processes on `spec`, one as the tree is and one
    with the --set items, alternating which runs first, every kernel compiled in its process."""
    import json
    import subprocess
    import sys

    work = tempfile.mkdtemp(prefix="gemm-probe-ab-")
    spec_path = os.path.join(work, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, CUTE_KERNELS_DISK_CACHE="0")
    runs = {"base": [], "set": []}
    for i in range(pairs):
        for side in (("base", "set") if i % 2 == 0 else ("set", "base")):
            name = f"ab_{side}{i}"
            cmd = [sys.executable, "-m", "benchmarks.gemm_probe", "configs", "--spec", spec_path, "--rounds", str(rounds),
                   "--dtype", dtype, "--name", name, "--out", work]
            if side == "set":
                for v in sets_argv:
                    cmd += ["--set", v]
            print(f"[ab] {side} {i + 1}/{pairs}", flush=True)
            subprocess.run(cmd, env=env, check=True)
            (path,) = [os.path.join(work, f) for f in os.listdir(work) if f.startswith(f"gemm_probe_{name}_") and f.endswith(".json")]
            with open(path) as f:
                runs[side].append(json.load(f))
    rows, summary = combine_ab(runs["base"], runs["set"], dtype)
    summary.update({"set": list(sets_argv), "pairs": pairs, "rounds": rounds, "dtype": dtype, "spec": spec})
    return rows, summary


def run_configs(spec: dict, rounds: int = 2, rule: bool = False, dtype: str = "bf16",
                scales_only: bool = False) -> tuple[list[Row], dict]:
    """The `configs` probe: every named config compiled ahead in the tuner's pool, timed by its
    timer (outputs checked against the first label's) in `rounds` alternating rounds.
    scales_only (fp8): per-row scales without the bias of the tuner's class, the grid's call,
    which swap_ab configs can run; --rule then sets the first label against the grid's pick."""
    import statistics

    from benchmarks.gemm import _grid_label, grid_problem
    from benchmarks.tune_gemm import parse_label
    from cute_kernels.tuning.tune import _time_all, heuristic, label

    if scales_only and dtype != "fp8":
        raise ValueError(f"scales_only is for dtype 'fp8', got {dtype!r}")

    probs = {}
    for shape, labels in spec.items():
        (m, n, k), = parse_shapes(shape)
        probs[grid_problem(dtype, m, n, k)] = [parse_label(x) for x in labels]
    ready, timer = _start_builds(probs, scales_only)
    rows, firsts, picks, pick_first = [], [], [], []
    for p, cfgs in probs.items():
        acc, cubs = {}, []
        for r in range(rounds):
            order = cfgs if r % 2 == 0 else cfgs[:1] + cfgs[:0:-1]
            for cfg, ms in _time_all(p, order, ready, timer, print).items():
                acc.setdefault(label(cfg), []).append(ms)
            if acc:
                cubs.append(_cublas_on_timer_inputs(timer, dtype))
        if not acc:
            continue
        _check_against_torch(timer, p)
        case, cub = f"{p.m}x{p.n}x{p.k}", statistics.median(cubs)
        med = {lab: statistics.median(t) for lab, t in acc.items()}
        for lab, ms in med.items():
            rows.append(_row(case, f"cute {lab}", p.m, p.n, p.k, ms, dtype, config=lab))
        rows.append(_row(case, "cublas", p.m, p.n, p.k, cub, dtype))
        first = label(cfgs[0])
        pick = _grid_label(dtype, p.m, p.n, p.k) if scales_only else label(heuristic(p))
        print(f"[configs] {case}: " + "  ".join(f"{lab} {cub / ms:.3f}" for lab, ms in med.items()), flush=True)
        if rule and first in med and pick in med:
            firsts.append(cub / med[first])
            picks.append(cub / med[pick])
            pick_first.append(med[first] / med[pick])
    summary = {"dtype": dtype, "shapes": len(probs), "rounds": rounds, "spec": spec}
    if scales_only:
        summary["scales_only"] = True
    if pick_first:
        summary.update({"rule_shapes": len(pick_first), "geomean_pick_vs_first": geomean(pick_first),
                        "geomean_first_vs_cublas": geomean(firsts), "geomean_pick_vs_cublas": geomean(picks),
                        "min_first_vs_cublas": min(firsts), "min_pick_vs_cublas": min(picks),
                        "below_0.95_first": sum(x < 0.95 for x in firsts),
                        "below_0.95_pick": sum(x < 0.95 for x in picks)})
    return rows, summary


def rule_names() -> list[str]:
    """The heuristic rules dispatch applies (`heuristics.RULES`, the chain of
    `heuristics.pick_config`), each of which `rule_spec` can switch off."""
    from cute_kernels.matmul import heuristics

    return sorted(heuristics.RULES)


def rule_spec(rule: str, dtype: str, seed: int, count: int, m_range: tuple[int, int],
              n_range: tuple[int, int] = (1, 1 << 30), min_k: int = 1, tries: int = 20000) -> dict[str, list[str]]:
    """{"MxNxK": [the grid's pick with `rule` switched off, the pick with it]} for the first
    `count` draws the rule changes: (N, K) a grid-model weight in n_range with K >= min_k, M
    log-uniform in m_range, a pure function of the arguments (and the heuristics). Skinny GEMV
    picks are left out (configs cannot name them)."""
    from benchmarks.gemm import _grid_label
    from cute_kernels.matmul import api, heuristics
    from cute_kernels.tuning.models import MODELS, linears

    if rule not in rule_names():
        raise ValueError(f"--rule takes one of {', '.join(rule_names())}, got {rule!r}")
    pool = sorted({(lin.n, lin.k) for model in MODELS for lin in linears(model)
                   if n_range[0] <= lin.n <= n_range[1] and lin.k >= min_k and (dtype == "bf16" or lin.k % 16 == 0)})
    if not pool:
        raise ValueError(f"no grid-model weight has N in {n_range} and K >= {min_k}")
    rng, on, spec = random.Random(seed), getattr(heuristics, rule), {}

    def off(*args, **kwargs):
        return None

    try:
        for _ in range(tries):
            if len(spec) >= count:
                break
            n, k = rng.choice(pool)
            m = round(math.exp(rng.uniform(math.log(m_range[0]), math.log(m_range[1]))))
            key = f"{m}x{n}x{k}"
            if key in spec:
                continue
            setattr(heuristics, rule, on)
            api.clear_dispatch_caches()
            with_rule = _grid_label(dtype, m, n, k)
            setattr(heuristics, rule, off)
            api.clear_dispatch_caches()
            without = _grid_label(dtype, m, n, k)
            if without != with_rule and "gemv" not in (without, with_rule):
                spec[key] = [without, with_rule]
    finally:
        setattr(heuristics, rule, on)
        api.clear_dispatch_caches()
    return spec


def rule_summary(rows: list[Row], spec: dict[str, list[str]]) -> dict:
    """The `rule` probe's figures: each shape's pick with the rule against the pick without it,
    and both against cuBLAS."""
    ms = {(r.case, r.provider): r.ms for r in rows}
    gain, without, with_rule = [], [], []
    for shape, (off, on) in spec.items():
        a, b, c = ms.get((shape, f"cute {off}")), ms.get((shape, f"cute {on}")), ms.get((shape, "cublas"))
        if a and b and c:
            gain.append(a / b)
            without.append(c / a)
            with_rule.append(c / b)
    if not gain:
        return {}
    return {"rule_shapes": len(gain), "geomean_with_vs_without": geomean(gain), "faster_with": sum(g > 1 for g in gain),
            "min_with_vs_without": min(gain), "geomean_without_vs_cublas": geomean(without),
            "geomean_with_vs_cublas": geomean(with_rule), "min_without_vs_cublas": min(without),
            "min_with_vs_cublas": min(with_rule)}


# The nvjet kernels cuBLAS 12.x runs for F.linear (tst) and per-row _scaled_mm (qqtst) on sm_90:
# tile, k-tile x stages, cluster.
_NVJET = re.compile(r"nvjet_sm90_(?:tst|qqtst)_(\d+)x(\d+)_(\d+)x(\d+)_(\d)x(\d)_")


def nvjet_config(name: str, shape: tuple[int, int, int] | None = None, in_bytes: int = 2):
    """The swap_ab GemmConfig an nvjet kernel name describes (tile along the weight's rows x
    along the tokens, cluster the same way round), or None where the name is not an nvjet
    GEMM or its tile is not one our kernel builds (`GemmConfig.validate`). A `splitK` kernel
    on an (M, N, K) `shape` whose grid fits one wave splits K as many ways as that wave holds
    (the name gives no count; at most MAX_SPLIT_K, each split >= MIN_SPLIT_K_TILES k-tiles)."""
    import dataclasses

    from cute_kernels.matmul.config import GemmConfig, grid_clusters
    from cute_kernels.matmul.heuristics import MAX_SPLIT_K, MIN_SPLIT_K_TILES

    m = _NVJET.search(name)
    if not m:
        return None
    tm, tn, _, _, cm, cn = (int(x) for x in m.groups())
    cfg = GemmConfig(tm, tn, cm, cn, swap_ab=True)
    if "_splitK" in name and shape is not None:
        clusters, per_wave = grid_clusters(cfg, *cfg.kernel_mn(shape[0], shape[1]))
        k_tiles = math.ceil(shape[2] / (128 // in_bytes))
        split = min(per_wave // clusters, MAX_SPLIT_K, k_tiles // MIN_SPLIT_K_TILES)
        if split >= 2:
            cfg = dataclasses.replace(cfg, split_k=split)
    try:
        cfg.validate(in_bytes)
    except ValueError:
        return None
    return cfg


def cublas_kernel(call, args) -> str:
    """The name of the longest GPU kernel `call(*args)` runs (one cuBLAS call)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call(*args)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return max(kernels, key=lambda e: e.device_time_total).key if kernels else ""


def _fits_validated(cfg) -> bool:
    """A config cuBLAS ran on the problem fits its grid; ours need only build it for fp8 inputs."""
    try:
        cfg.validate(in_bytes=1)
    except ValueError:
        return False
    return True


def run_cublas(shapes, dtype: str = "bf16", rounds: int = 2) -> tuple[list[Row], dict]:
    """The `cublas` probe: cuBLAS's own config in our kernel against the dispatch pick."""
    from benchmarks.gemm import _grid_label, _grid_providers, grid_problem
    from cute_kernels.tuning.tune import _fits, dispatch_config, label

    # The grid's cuBLAS call (`F.linear`, or per-row `_scaled_mm` with fast accumulation) on its
    # padded operands. fp8 runs ours as the grid does, without a bias (`run_configs`' scales_only):
    # cuBLAS's fp8 kernels are swap_ab ones, which the tuner's fp8 class (bias included) cannot run.
    scales_only = dtype == "fp8"
    make, provs, _ = _grid_providers(dtype)
    spec, names = {}, {}
    for m, n, k in shapes:
        name = cublas_kernel(provs["cublas"], make(m, n, k))
        cfg = nvjet_config(name, (m, n, k), 1 if dtype == "fp8" else 2)
        p = grid_problem(dtype, m, n, k)
        pick = _grid_label(dtype, m, n, k) if scales_only else label(dispatch_config(p))
        names[f"{m}x{n}x{k}"] = name
        print(f"[cublas] {m}x{n}x{k}: {name} -> {label(cfg) if cfg else 'no config of ours'}", flush=True)
        fits = _fits(p, cfg) if cfg is not None and not scales_only else cfg is not None and _fits_validated(cfg)
        if fits and label(cfg) != pick:
            spec[f"{m}x{n}x{k}"] = [pick, label(cfg)]
        elif cfg is not None and label(cfg) != pick:
            try:
                p.check(cfg)
                why = "it does not fit the problem (a tile or cluster wider than its grid)"
            except ValueError as e:
                why = str(e)
            print(f"[cublas] {m}x{n}x{k}: {label(cfg)} not timed: {why}", flush=True)
    rows, summary = (run_configs(spec, rounds, rule=False, dtype=dtype, scales_only=scales_only) if spec
                     else ([], {"dtype": dtype}))
    for r in rows:
        r.extra["cublas_kernel"] = names.get(r.case)
    firsts, theirs = [], []
    t = {(r.case, r.provider): r.ms for r in rows}
    for case, (pick, ours) in spec.items():
        if (case, f"cute {pick}") in t and (case, f"cute {ours}") in t:
            firsts.append(t[(case, "cublas")] / t[(case, f"cute {pick}")])
            theirs.append(t[(case, "cublas")] / t[(case, f"cute {ours}")])
    summary.update({"kernels": names, "shapes_mapped": len(spec)})
    if firsts:
        summary.update({"geomean_pick_vs_cublas": geomean(firsts), "geomean_cublas_config_vs_cublas": geomean(theirs),
                        "cublas_config_faster": sum(b > a for a, b in zip(firsts, theirs))})
    return rows, summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="probe", required=True)
    t = sub.add_parser("tuned", help="tune a draw of shapes from scratch: best vs the heuristic vs cuBLAS")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--shapes", default=None, help="MxNxK[,MxNxK...] instead of a --seed draw")
    t.add_argument("--keep", default=None, help="cache root to tune into (its tuning file keeps the winners)")
    t.add_argument("--count", type=int, default=30)
    t.add_argument("--m", default="150,700", help="LO,HI of the log-uniform token count")
    t.add_argument("--n", default="1280,8192", help="LO,HI of the weight rows")
    t.add_argument("--min-k", type=int, default=1024)
    w = sub.add_parser("widths", help="the dispatch pick vs one wave of 128-row swap_ab widths vs cuBLAS")
    w.add_argument("--shapes", required=True, help="MxNxK[,MxNxK...]")
    w.add_argument("--widths", default="64:256:16", help="LO:HI:STEP token-tile widths")
    w.add_argument("--top", type=int, default=3, help="how many of the narrowest fitting widths")
    e = sub.add_parser("epilogue", help="the best configs with the whole-tile epilogue vs the slab ring, vs cuBLAS")
    e.add_argument("--shapes", required=True, help="MxNxK[,MxNxK...]")
    e.add_argument("--top", type=int, default=10, help="how many of the fastest cooperative configs to pair")
    d = sub.add_parser("pdl", help="the dispatch pick with and without programmatic dependent launch, vs cuBLAS")
    d.add_argument("--shapes", required=True, help="MxNxK[,MxNxK...]")
    d.add_argument("--dtypes", default="bf16,fp8", help="of bf16, fp8 (the grid's calls)")
    cb = sub.add_parser("cublas", help="cuBLAS's own kernel config (by its name) in our kernel, vs the pick and cuBLAS")
    cb.add_argument("--shapes", required=True, help="MxNxK[,MxNxK...]")
    cb.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"], help="bf16 `linear` or fp8 per-row `scaled_mm`")
    cb.add_argument("--rounds", type=int, default=2, help="alternating timing rounds (medians)")
    c = sub.add_parser("configs", help="named configs per shape (a JSON spec), vs cuBLAS")
    c.add_argument("--spec", required=True, help='{"MxNxK": [labels]} JSON, or a configs results file')
    c.add_argument("--rounds", type=int, default=2, help="alternating timing rounds (medians)")
    c.add_argument("--rule", action="store_true", help="summarise the heuristic's pick against each first label")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp8", "int8"],
                   help="bf16 `linear`, fp8 per-row `scaled_mm` or int8 `int8_mm`")
    c.add_argument("--scales-only", action="store_true",
                   help="fp8: per-row scales without the bias of the tuner's class (the grid's call; swap_ab can run)")
    c.add_argument("--set", action="append", default=[], metavar="MODULE.ATTR=VALUE",
                   help="a cute_kernels module constant set in this process before anything compiles "
                        "(repeatable; turns the disk cache of compiled kernels off)")
    ab = sub.add_parser("ab", help="a kernel-code constant switched in one of two processes, on a configs spec, vs cuBLAS")
    ab.add_argument("--spec", required=True, help='{"MxNxK": [labels]} JSON, or a configs results file')
    ab.add_argument("--set", action="append", required=True, metavar="MODULE.ATTR=VALUE",
                    help="what the variant processes set (repeatable), e.g. cute_kernels.matmul.kernel.MMA_PEEK=False")
    ab.add_argument("--pairs", type=int, default=2, help="pairs of processes, alternating which side runs first")
    ab.add_argument("--rounds", type=int, default=2, help="alternating timing rounds in each process (medians)")
    ab.add_argument("--dtype", default="bf16", choices=["bf16", "fp8", "int8"],
                    help="bf16 `linear`, fp8 per-row `scaled_mm` or int8 `int8_mm`")
    ru = sub.add_parser("rule", help="a heuristic rule switched off and on, on the draws it changes, vs cuBLAS")
    ru.add_argument("--rule", required=True, help="a matmul.api rule (e.g. fp8_equal_fill_swap_config)")
    ru.add_argument("--dtype", default="bf16", choices=["bf16", "fp8", "int8"], help="the grid's call of this dtype")
    ru.add_argument("--seed", type=int, required=True)
    ru.add_argument("--count", type=int, default=20, help="draws the rule changes")
    ru.add_argument("--m", default="200,1500", help="LO,HI of the log-uniform token count")
    ru.add_argument("--n", default=f"1,{1 << 30}", help="LO,HI of the weight rows")
    ru.add_argument("--min-k", type=int, default=1)
    ru.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (medians)")
    ru.add_argument("--dry-run", action="store_true", help="print the draws and both picks as a configs spec; no GPU")
    for s in (t, w, e, d, cb, c, ab, ru):
        s.add_argument("--name", default=None, help="results name suffix (default: the probe's name)")
        s.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = p.parse_args(argv)
    try:
        if args.probe == "tuned":
            if (args.seed is None) == (args.shapes is None):
                raise ValueError("tuned takes --seed (a draw) or --shapes, one of them")
            if args.shapes is not None:
                shapes = parse_shapes(args.shapes)
                flags = f"tuned --shapes {args.shapes}"
            else:
                if args.count < 1 or args.min_k < 1:
                    raise ValueError("--count and --min-k must be >= 1")
                shapes = draw(args.seed, args.count, parse_range(args.m, "--m"), parse_range(args.n, "--n"), args.min_k)
                flags = f"tuned --seed {args.seed} --count {args.count} --m {args.m} --n {args.n} --min-k {args.min_k}"
        elif args.probe == "widths":
            if args.top < 1:
                raise ValueError("--top must be >= 1")
            shapes, widths = parse_shapes(args.shapes), parse_widths(args.widths)
            flags = f"widths --shapes {args.shapes} --widths {args.widths} --top {args.top}"
        elif args.probe == "pdl":
            shapes, dtypes = parse_shapes(args.shapes), args.dtypes.split(",")
            if not set(dtypes) <= {"bf16", "fp8"}:
                raise ValueError(f"--dtypes takes bf16 and fp8, got {args.dtypes!r}")
            flags = f"pdl --shapes {args.shapes} --dtypes {args.dtypes}"
        elif args.probe == "cublas":
            if args.rounds < 1:
                raise ValueError("--rounds must be >= 1")
            shapes = parse_shapes(args.shapes)
            flags = f"cublas --shapes {args.shapes} --dtype {args.dtype} --rounds {args.rounds}"
        elif args.probe == "rule":
            if args.rounds < 1 or args.count < 1 or args.min_k < 1:
                raise ValueError("--rounds, --count and --min-k must be >= 1")
            spec = rule_spec(args.rule, args.dtype, args.seed, args.count, parse_range(args.m, "--m"),
                             parse_range(args.n, "--n"), args.min_k)
            if not spec:
                raise ValueError(f"{args.rule} changes none of the draws")
            flags = (f"rule --rule {args.rule} --dtype {args.dtype} --seed {args.seed} --count {args.count} "
                     f"--m {args.m} --n {args.n} --min-k {args.min_k} --rounds {args.rounds}")
            if args.dry_run:
                import json

                print(json.dumps(spec, indent=0))
                return 0
        elif args.probe == "configs":
            if args.rounds < 1:
                raise ValueError("--rounds must be >= 1")
            sets = parse_sets(args.set)
            spec = load_spec(args.spec)
            if args.scales_only and args.dtype != "fp8":
                raise ValueError("--scales-only is for --dtype fp8")
            flags = (f"configs --spec {args.spec} --rounds {args.rounds} --dtype {args.dtype}"
                     f"{' --rule' if args.rule else ''}{' --scales-only' if args.scales_only else ''}"
                     + "".join(f" --set {v}" for v in args.set))
        elif args.probe == "ab":
            if args.rounds < 1 or args.pairs < 1:
                raise ValueError("--rounds and --pairs must be >= 1")
            parse_sets(args.set)
            spec = load_spec(args.spec)
            flags = (f"ab --spec {args.spec} --pairs {args.pairs} --rounds {args.rounds} --dtype {args.dtype}"
                     + "".join(f" --set {v}" for v in args.set))
        else:
            if args.top < 1:
                raise ValueError("--top must be >= 1")
            shapes = parse_shapes(args.shapes)
            flags = f"epilogue --shapes {args.shapes} --top {args.top}"
    except ValueError as e:
        p.error(str(e))
    require_hopper("benchmarks.gemm_probe")
    if args.out:
        os.environ["CUTE_KERNELS_RESULTS_DIR"] = args.out
    if args.probe == "tuned":
        rows, summary = run_tuned(shapes, args.keep)
    elif args.probe == "widths":
        rows, summary = run_widths(shapes, widths, args.top)
    elif args.probe == "pdl":
        rows, summary = run_pdl(shapes, dtypes)
    elif args.probe == "cublas":
        rows, summary = run_cublas(shapes, args.dtype, args.rounds)
    elif args.probe == "configs":
        apply_sets(sets)
        rows, summary = run_configs(spec, args.rounds, args.rule, args.dtype, args.scales_only)
        if sets:
            summary["set"] = list(args.set)
    elif args.probe == "ab":
        rows, summary = run_ab(spec, args.set, args.pairs, args.rounds, args.dtype)
    elif args.probe == "rule":
        rows, summary = run_configs(spec, args.rounds, False, args.dtype, args.dtype == "fp8")
        summary.update(rule=args.rule, **rule_summary(rows, spec))
    else:
        rows, summary = run_epilogue(shapes, args.top)
    print(format_table(rows, baseline="cublas"))
    dtype = getattr(args, "dtype", "bf16")
    what = ("bf16 `linear` and fp8 per-row `scaled_mm`" if args.probe == "pdl" else
            {"fp8": "fp8 per-row `scaled_mm`, randn inputs",
             "int8": "int8 `int8_mm` against `torch._int_mm`, uniform int8 inputs"}.get(dtype, "bf16 `linear`, randn inputs"))
    notes = (f"`python -m benchmarks.gemm_probe {flags}`: {what}, CUDA-graph timing over "
             "L2-rotated inputs, cuBLAS in the same process; see benchmarks/gemm_probe.py.")
    print("wrote", write_results(f"gemm_probe_{args.name or args.probe}", rows, summary, notes=notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
