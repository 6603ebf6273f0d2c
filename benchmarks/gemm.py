"""BF16 GEMM suite: ours vs cuBLAS (torch), QuACK and the Triton baseline, in one run.

    python -m benchmarks.gemm [--providers cute,cublas,quack,triton] [--quick]
    python -m benchmarks.gemm --decode [--no-gemv]
    python -m benchmarks.gemm --grid [--seed S] [--count 60] [--dtypes bf16,fp8,int8] [--rounds 3] [--slice A:B]
    python -m benchmarks.gemm --merge gemm_grid_slice0-20_h100.json gemm_grid_slice20-60_h100.json

Layout is the F.linear one (A [M, K] row-major, B = W.t() with W [N, K]) for every
provider. Writes benchmarks/results/gemm_<gpu>.json and .md.

--decode: GPT-2 XL's linears at M = 1 and 8 (decode steps), bias fused, reported as
weight GB/s and % of HBM bandwidth (gemm_decode_<gpu>.*). M <= 8 runs the skinny path
(cute_kernels/matmul/gemv.py); --no-gemv times the wgmma path instead (CUTE_KERNELS_GEMV=0).

--grid: a held-out check on shapes no heuristic or tuning run was fitted to: `count` linears
drawn from published models (cute_kernels.tuning.models: qkv, o, gate/up, down, lm_head of
GPT-2, Llama 3, Qwen 2.5, Mistral) with M log-uniform in 1..16384 (mostly not a multiple of
8), the draw a pure function of the seed. Per dtype, ours (`linear`, `scaled_mm` with
per-row scales and fast accumulation, `int8_mm`) against cuBLAS (`F.linear`,
`torch._scaled_mm`, `torch._int_mm`) and, for bf16, QuACK when importable
(gemm_grid_<gpu>.*). cuBLAS gets its operands padded to what it needs for free (N to a
multiple of 16, int8 M to 17 rows; --unpadded-baseline: as they are). --slice START:STOP
times part of the draw (gemm_grid_slice<START>-<STOP>_<gpu>.*); QuACK's autotuning results
persist under the cache root, so later slices and reruns skip its per-shape tuning;
--merge FILE... assembles gemm_grid_<gpu>.* from a grid's slice files (no GPU needed). Every
provider of a case is timed --rounds times (3), the order reversed each round, the median
kept: single timings of one config moved by up to 7% against cuBLAS between runs.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time

import torch
import torch.nn.functional as F

from .common import (
    PEAK_TFLOPS,
    Row,
    format_table,
    geomean,
    peak_tbps,
    require_hopper,
    rotation_count,
    speedups,
    time_ms,
    write_results,
)

SQUARE = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)]
GPT2 = [(m, n, k) for m in (512, 8192) for (k, n) in ((768, 2304), (768, 768), (768, 3072), (3072, 768), (1600, 6400), (6400, 1600))]
LLM = [(8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336)]
SUITE = SQUARE + GPT2 + LLM
# GPT-2 XL decode: c_attn, attn c_proj, c_fc, mlp c_proj, lm_head (N, K) at M tokens.
DECODE = [(m, n, k) for m in (1, 8) for (n, k) in ((4800, 1600), (1600, 1600), (6400, 1600), (1600, 6400),
                                                     (50257, 1600))]


def run_decode(shapes=DECODE, dtype=torch.bfloat16):
    """ck.linear vs F.linear (cuBLAS) with a bias, as a decode step calls them."""
    import cute_kernels as ck

    fns = {"cute": lambda x, w, b: ck.linear(x, w, b), "cublas": F.linear}
    rows: list[Row] = []
    for (M, N, K) in shapes:
        case = f"{M}x{N}x{K}"
        nrot = rotation_count((M * K + N * K + M * N) * 2)
        X = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in range(nrot)]
        W = [torch.randn(N, K, device="cuda", dtype=dtype) / K**0.5 for _ in range(nrot)]
        B = [torch.randn(N, device="cuda", dtype=dtype) for _ in range(nrot)]
        ref = F.linear(X[0].float(), W[0].float(), B[0].float())
        for name, fn in fns.items():
            err = (fn(X[0], W[0], B[0]).float() - ref).abs().max().item() / ref.abs().max().item()
            if not err < 2e-2:
                print(f"[gemm-decode] {name} {case}: WRONG (rel err {err:.3g}); not timed")
                continue
            ms = time_ms(lambda i, fn=fn, X=X, W=W, B=B: fn(X[i], W[i], B[i]), n_rotate=nrot)
            gbps = N * K * 2 / ms / 1e6  # the weight stream, which bounds a decode GEMM
            rows.append(Row(case, name, ms, gbps=gbps, extra={"pct_hbm": round(100 * gbps / (peak_tbps() * 1e3), 1)}))
        del X, W, B
        torch.cuda.empty_cache()
    return rows


def _providers(names):
    out = {}
    for name in names:
        try:
            if name == "cute":
                import cute_kernels as ck

                out[name] = lambda a, b: ck.gemm(a, b)
            elif name == "cublas":
                out[name] = torch.mm
            elif name == "quack":
                from quack.gemm_interface import gemm as quack_gemm

                out[name] = quack_gemm
            elif name == "triton":
                from baselines.triton import gemm as triton_gemm

                out[name] = triton_gemm
        except Exception as e:  # a missing peer is reported, not fatal
            print(f"[gemm] provider {name} unavailable: {type(e).__name__}: {e}")
    return out


def run(shapes=SUITE, providers=("cute", "cublas", "quack", "triton"), dtype=torch.bfloat16, check=True):
    fns = _providers(providers)
    rows: list[Row] = []
    for (M, N, K) in shapes:
        case = f"{M}x{N}x{K}"
        nbytes = (M * K + N * K + M * N) * 2
        nrot = rotation_count(nbytes)
        As = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in range(nrot)]
        Bs = [torch.randn(N, K, device="cuda", dtype=dtype).t() for _ in range(nrot)]
        ref = None
        for name, fn in fns.items():
            try:
                out = fn(As[0], Bs[0])
                if check:
                    ref = ref if ref is not None else torch.mm(As[0], Bs[0]).float()
                    err = (out.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
                    if not err < 2e-2:
                        print(f"[gemm] {name} {case}: WRONG (rel err {err:.3g}); not timed")
                        continue
                ms = time_ms(lambda i: fn(As[i], Bs[i]), n_rotate=nrot)
            except Exception as e:
                print(f"[gemm] {name} {case} failed: {type(e).__name__}: {e}")
                continue
            tflops = 2 * M * N * K / ms / 1e9
            rows.append(Row(case, name, ms, tflops, 100 * tflops / PEAK_TFLOPS["bf16"]))
        del As, Bs
        torch.cuda.empty_cache()
    return rows


def host_overhead_us(n: int = 2000) -> dict:
    """CPU time per call with the GPU idle enough to never block (tiny problem)."""
    import cute_kernels as ck

    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16).t()
    out = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    w, bias = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16), torch.randn(64, device="cuda", dtype=torch.bfloat16)
    res = {}
    for name, fn in (("cute.gemm", lambda: ck.gemm(a, b)), ("torch.mm", lambda: torch.mm(a, b)),
                     ("cute.gemm(out=)", lambda: ck.gemm(a, b, out=out)), ("torch.mm(out=)", lambda: torch.mm(a, b, out=out)),
                     ("cute.linear+bias", lambda: ck.linear(a, w, bias)),
                     ("F.linear+bias", lambda: torch.nn.functional.linear(a, w, bias))):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res[name] = (t1 - t0) / n * 1e6
    return res


def summarize(rows):
    s = speedups(rows, "cute", "cublas")
    summary = {"geomean_speedup_vs_cublas": geomean(list(s.values()))}
    big = {c: v for c, v in s.items() if int(c.split("x")[0]) >= 512}
    if big:
        summary["min_speedup_vs_cublas_M>=512"] = min(big.values())
    for other in ("quack", "triton"):
        so = speedups(rows, "cute", other)
        if so:
            summary[f"geomean_speedup_vs_{other}"] = geomean(list(so.values()))
    return summary


DEFAULT_PROVIDERS = "cute,cublas,quack,triton"
GRID_M_MAX = 16384
GRID_DTYPES = ("bf16", "fp8", "int8")
GRID_ROUNDS = 3  # run_grid: timings per provider and case (alternating order, median)


def grid_shapes(seed: int, count: int = 60) -> list[tuple[str, int, int, int]]:
    """`count` (name, M, N, K): a linear of a published model and an M log-uniform in
    1..GRID_M_MAX, drawn by a generator seeded with `seed` alone."""
    from cute_kernels.tuning.models import MODELS, linears

    if not isinstance(seed, int) or not isinstance(count, int) or count < 1:
        raise ValueError(f"seed must be an int and count an int >= 1, got {seed!r}, {count!r}")
    pool = [(f"{model}.{lin.name}", lin.n, lin.k) for model in MODELS for lin in linears(model)]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        name, n, k = rng.choice(pool)
        m = min(GRID_M_MAX, max(1, round(math.exp(rng.uniform(0.0, math.log(GRID_M_MAX))))))
        out.append((name, m, n, k))
    return out


# cuBLAS's alignment, which the grid's baseline is given for free: operands padded outside
# the timed call (as a serving stack pads its vocabulary), so an unaligned shape never times
# cuBLAS's slow path or leaves a case without a baseline. Ours runs the unpadded views.
_CUBLAS_N_ALIGN = 16  # F.linear at N = 50257 ran 5-6x slower than at 50272; _scaled_mm needs N % 16 == 0
_INT_MM_MIN_M = 17  # torch._int_mm needs M > 16


def _quack_autotune_cache() -> None:
    """QuACK autotunes every new shape (44 configs on the H100, about 30 s a shape), and keeps
    the timings only in memory unless asked: keep them under our cache root
    (<root>/quack), so a grid split over several processes (--slice), or run again, times
    each shape's configs once. A user's own QUACK_CACHE_* settings win."""
    from cute_kernels.runtime.cache import cache_root

    os.environ.setdefault("QUACK_CACHE_AUTOTUNING", "1")
    os.environ.setdefault("QUACK_CACHE_DIR", str(cache_root() / "quack"))


def _grid_providers(dtype: str, pad_baseline: bool = True):
    """(make_inputs(M, N, K), {provider: fn(*inputs)}, exact) for one dtype. The inputs are
    cuBLAS's padded operands (unpadded with pad_baseline=False: cuBLAS then fails where it
    needs alignment, and those cases have no ratio); every provider returns an output of at
    least M x N whose leading M x N block is the product (the rest is padding)."""
    import cute_kernels as ck

    def _pad(n: int, align: int) -> int:
        return -(-n // align) * align if pad_baseline else n

    if dtype == "bf16":
        provs = {"cute": lambda x, w, n: ck.linear(x, w[:n]), "cublas": lambda x, w, n: F.linear(x, w)}
        try:
            _quack_autotune_cache()
            from quack.gemm_interface import gemm as quack_gemm

            provs["quack"] = lambda x, w, n: quack_gemm(x, w[:n].t())
        except Exception as e:  # a missing peer is reported, not fatal
            print(f"[gemm-grid] provider quack unavailable: {type(e).__name__}: {e}")

        def make(M, N, K):
            return (torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                    torch.randn(_pad(N, _CUBLAS_N_ALIGN), K, device="cuda", dtype=torch.bfloat16) / K ** 0.5, N)

        return make, provs, False
    if dtype == "fp8":
        e4m3 = torch.float8_e4m3fn

        def make(M, N, K):
            n_pad = _pad(N, _CUBLAS_N_ALIGN)
            return (torch.randn(M, K, device="cuda").to(e4m3), torch.randn(n_pad, K, device="cuda").to(e4m3).t(),
                    torch.rand(M, 1, device="cuda") + 0.5, torch.rand(1, n_pad, device="cuda") + 0.5, N)

        return make, {
            "cute": lambda a, b, sa, sb, n: ck.scaled_mm(a, b[:, :n], sa, sb[:, :n], out_dtype=torch.bfloat16,
                                                         use_fast_accum=True),
            "cublas": lambda a, b, sa, sb, n: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16,
                                                               use_fast_accum=True),
        }, False
    if dtype == "int8":
        def make(M, N, K):
            return (torch.randint(-128, 128, (max(M, _INT_MM_MIN_M) if pad_baseline else M, K), device="cuda",
                                  dtype=torch.int8),
                    torch.randint(-128, 128, (_pad(N, _CUBLAS_N_ALIGN), K), device="cuda", dtype=torch.int8).t(), M, N)

        return make, {"cute": lambda a, b, m, n: ck.int8_mm(a[:m], b[:, :n]),
                      "cublas": lambda a, b, m, n: torch._int_mm(a, b)}, True
    raise ValueError(f"grid dtypes are {GRID_DTYPES}, got {dtype!r}")


# dtype -> the tuning cache's (op, output, epilogue class) of the call the grid times.
GRID_PROBLEM = {"bf16": ("bf16", "bf16", "plain"), "fp8": ("fp8-row", "bf16", "vector"), "int8": ("int8", "int32", "plain")}


def grid_problem(dtype: str, M: int, N: int, K: int):
    from cute_kernels.tuning.cache import Problem

    op, out, epi = GRID_PROBLEM[dtype]
    return Problem(op, out, "kk", epi, M, N, K)


def _grid_label(dtype: str, M: int, N: int, K: int) -> str:
    """The kernel config dispatch runs for this grid case ('gemv' for the skinny path)."""
    from cute_kernels.matmul.heuristics import skinny_gemv
    from cute_kernels.runtime import env
    from cute_kernels.tuning import tune

    if dtype == "bf16" and env.enabled("CUTE_KERNELS_GEMV") and skinny_gemv(M, N, K, swappable=True):
        return "gemv"
    if dtype == "fp8":
        # scaled_mm without a bias: swap_ab may run it, which its epilogue class (bias included) rules out.
        import torch

        from cute_kernels.matmul.api import _pick_config, swappable, tuning_class
        from cute_kernels.matmul.config import Epilogue

        e4m3, epi = torch.float8_e4m3fn, Epilogue(row_scale="vector", col_scale="vector")
        cls = tuning_class(e4m3, torch.bfloat16, ("k", "k"), epi)
        return tune.label(_pick_config(M, N, K, 1, False, cls, swappable(e4m3, e4m3, torch.bfloat16, epi)))
    return tune.label(tune.dispatch_config(grid_problem(dtype, M, N, K)))


def compile_grid_ahead(shapes, dtypes, jobs: int | None = None) -> dict:
    """Build every kernel the grid's `cute` rows run, in parallel worker processes, so that
    timing does not wait on one compile per config in turn."""
    from cute_kernels.precompile import precompile
    from cute_kernels.tuning import tune

    problems = [grid_problem(d, M, N, K) for d in dtypes for _, M, N, K in shapes]
    return precompile(tune.dispatch_entries(problems), jobs)


def run_grid(seed: int = 0, count: int = 60, dtypes=GRID_DTYPES, providers=None, pad_baseline: bool = True,
             part: slice = slice(None), rounds: int = 1):
    """Time every provider on the seed's shapes; a provider that fails or disagrees with
    cuBLAS (bf16/fp8: 2% of the largest value; int8: bit-exact) gets no row. `providers`
    (names) limits the peers timed; cuBLAS is always timed, as the reference, on operands
    padded to its alignment unless pad_baseline is False (_grid_providers). `part` times a
    slice of the seed's draw (the same shapes whatever the slice). `rounds` > 1 times every
    provider of a case that many times, the order reversed each round, and keeps each one's
    median: on the H100 one config's ratio to cuBLAS moved by up to 7% between single timings
    of separate runs (the clock follows power), which decided a draw's minimum."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    rows: list[Row] = []
    shapes = grid_shapes(seed, count)[part]
    stats = compile_grid_ahead(shapes, dtypes)
    print(f"[gemm-grid] kernels: {stats['kernels']}, compiled ahead {stats['compiled']} in {stats['wall_s']:.1f} s, "
          f"failed {stats['failed']}")
    from cute_kernels.runtime.timing import warm_up

    warm_up(500.0)  # settled clocks before the first case, which is otherwise timed cold
    for dtype in dtypes:
        make, provs, exact = _grid_providers(dtype, pad_baseline)
        if providers is not None:
            provs = {k: v for k, v in provs.items() if k in providers or k == "cublas"}
        for name, M, N, K in shapes:
            case = f"{dtype}-{M}x{N}x{K}-{name}"
            in_bytes = 2 if dtype == "bf16" else 1
            nrot = rotation_count((M * K + N * K) * in_bytes + M * N * (4 if exact else 2))
            sets = [make(M, N, K) for _ in range(nrot)]
            try:
                ref = provs["cublas"](*sets[0])[:M, :N]
            except Exception as e:  # then the others are timed unchecked, and say so
                print(f"[gemm-grid] no cuBLAS reference for {case}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                ref = None
            timed = {}  # provider -> its fn, once its output checked
            for prov, fn in provs.items():
                try:
                    if ref is not None:
                        out = fn(*sets[0])[:M, :N]
                        if exact:
                            ok = torch.equal(out, ref)
                        else:
                            # In the output dtype: an fp32 copy of a 16384 x 152064 output is 10 GB.
                            err = (out - ref).abs().max().float() / ref.abs().max().float().clamp_min(1e-6)
                            ok = bool(err < 2e-2)
                        del out
                        if not ok:
                            print(f"[gemm-grid] {prov} {case}: WRONG; not timed")
                            continue
                    timed[prov] = fn
                except Exception as e:
                    print(f"[gemm-grid] {prov} {case} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            times = {prov: [] for prov in timed}
            for r in range(rounds):
                for prov in (list(timed) if r % 2 == 0 else list(timed)[::-1]):
                    try:
                        times[prov].append(time_ms(lambda i, fn=timed[prov]: fn(*sets[i]), n_rotate=nrot))
                    except Exception as e:
                        print(f"[gemm-grid] {prov} {case} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            for prov, ts in times.items():
                if not ts:
                    continue
                ms = statistics.median(ts)
                tflops = 2 * M * N * K / ms / 1e9
                extra = {"dtype": dtype, "linear": name, "checked": ref is not None, "rounds": len(ts)}
                if prov == "cute":
                    extra["config"] = _grid_label(dtype, M, N, K)
                rows.append(Row(case, prov, ms, tflops, 100 * tflops / PEAK_TFLOPS[dtype], extra=extra))
                print(f"[gemm-grid] {case} {prov}: {ms:.4f} ms {extra.get('config', '')}", flush=True)
            del sets, ref
            torch.cuda.empty_cache()
    return rows


def _grid_ratios(rows, seed: int, count: int, dtypes) -> dict:
    """The grid summary's figures: per dtype, ours against cuBLAS (and QuACK for bf16)."""
    by = {d: [r for r in rows if r.extra.get("dtype") == d] for d in dtypes}
    vs_cublas = {d: speedups(rs, "cute", "cublas") for d, rs in by.items()}
    vs_quack = speedups(by.get("bf16", []), "cute", "quack")
    summary = {
        "seed": seed, "count": count,
        "geomean_speedup_vs_cublas": {d: geomean(list(s.values())) for d, s in vs_cublas.items() if s},
        "min_speedup_vs_cublas": {d: min(s.values()) for d, s in vs_cublas.items() if s},
        "cases_timed": {d: len(s) for d, s in vs_cublas.items()},
    }
    if vs_quack:
        summary["geomean_speedup_vs_quack"] = {"bf16": geomean(list(vs_quack.values()))}
        summary["min_speedup_vs_quack"] = {"bf16": min(vs_quack.values())}
        summary["cases_with_quack"] = {"bf16": len(vs_quack)}
    return summary


def summarize_grid(rows, seed: int, count: int, dtypes=GRID_DTYPES) -> dict:
    from cute_kernels.runtime import env
    from cute_kernels.tuning import cache

    return {**_grid_ratios(rows, seed, count, dtypes), "tuning_cache": env.enabled("CUTE_KERNELS_TUNING"),
            "tuning_entries": len(cache.entries())}


# What every slice of one grid must share for their rows to make one grid.
_MERGE_KEYS = ("seed", "count", "rounds", "cublas_padded", "tuning_cache", "tuning_entries")


def merge_grid(paths) -> tuple[list[Row], dict, str, str]:
    """(rows, summary, gpu, date) of one grid assembled from its --slice results files, which
    must come from one GPU and share _MERGE_KEYS (the same seed's draw, timed alike); a case
    timed in two files is refused. The summary is computed afresh over every row, names the
    slices and lists any case of the draw that no slice timed. Runs without a GPU."""
    import json
    from pathlib import Path

    if not paths:
        raise ValueError("merge_grid needs at least one slice file")
    files = []
    for p in paths:
        try:
            d = json.loads(Path(p).read_text())
            s = d["summary"]
            files.append((str(p), d["gpu"], d["date"], s, d["rows"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{p}: not a grid results file ({type(e).__name__}: {e})") from None
    first = files[0]
    for p, gpu, _, s, _ in files:
        if gpu != first[1]:
            raise ValueError(f"{p} ran on {gpu}, {first[0]} on {first[1]}: one grid is one GPU")
        for k in _MERGE_KEYS:
            if s.get(k) != first[3].get(k):
                raise ValueError(f"{p} has {k} = {s.get(k)!r}, {first[0]} {first[3].get(k)!r}: not one grid")
    rows, seen = [], {}
    for p, _, _, _, file_rows in files:
        for r in file_rows:
            row = Row(**r)
            key = (row.case, row.provider)
            if key in seen:
                raise ValueError(f"{row.case} {row.provider} is in both {seen[key]} and {p}")
            seen[key] = p
            rows.append(row)
    seed, count = first[3]["seed"], first[3]["count"]
    dtypes = tuple(d for d in GRID_DTYPES if any(r.extra.get("dtype") == d for r in rows))
    summary = _grid_ratios(rows, seed, count, dtypes)
    summary.update({k: first[3][k] for k in _MERGE_KEYS[2:] if k in first[3]})
    summary["merged_from"] = [f"{Path(p).name} ({s.get('slice', 'all')}, {date})" for p, _, date, s, _ in files]
    timed = {r.case for r in rows if r.provider == "cute"}
    missing = [f"{d}-{M}x{N}x{K}-{name}" for d in dtypes for name, M, N, K in grid_shapes(seed, count)
               if f"{d}-{M}x{N}x{K}-{name}" not in timed]
    if missing:
        summary["missing"] = missing
    return rows, summary, first[1], max(f[2] for f in files)


def _slice(text: str | None) -> slice:
    """'START:STOP' (either side may be empty) -> slice; None -> everything."""
    if text is None:
        return slice(None)
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, stop = (int(x) if x.strip() else None for x in parts)
    except ValueError:
        raise SystemExit(f"error: --slice takes START:STOP (integers, either may be empty), got {text!r}") from None
    if (start is not None and start < 0) or (stop is not None and stop < 0):
        raise SystemExit(f"error: --slice takes non-negative bounds, got {text!r}")
    return slice(start, stop)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--providers", default=DEFAULT_PROVIDERS,
                   help="the suite's providers; with --grid, the peers timed besides cuBLAS (cute, quack)")
    p.add_argument("--quick", action="store_true", help="square shapes only")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--decode", action="store_true", help="decode-step (M = 1, 8) linears instead of the suite")
    p.add_argument("--no-gemv", action="store_true", help="with --decode: the wgmma path instead of the skinny one")
    p.add_argument("--grid", action="store_true", help="held-out shapes drawn from published models' linears")
    p.add_argument("--seed", type=int, default=0, help="with --grid: the draw's seed")
    p.add_argument("--count", type=int, default=60, help="with --grid: shapes per dtype")
    p.add_argument("--dtypes", default=",".join(GRID_DTYPES), help="with --grid: comma-separated, from bf16,fp8,int8")
    p.add_argument("--slice", default=None, metavar="START:STOP",
                   help="with --grid: time only these shapes of the draw (e.g. 0:20), to split a grid over runs")
    p.add_argument("--unpadded-baseline", action="store_true",
                   help="with --grid: time cuBLAS on the unpadded operands (no ratio where it needs alignment)")
    p.add_argument("--rounds", type=int, default=GRID_ROUNDS,
                   help="with --grid: timings per provider and case, alternating order, median kept")
    p.add_argument("--merge", nargs="+", metavar="SLICE_JSON",
                   help="assemble gemm_grid_<gpu>.* from one grid's --slice results files (no GPU needed)")
    args = p.parse_args(argv)
    if args.slice is not None and not args.grid:
        raise SystemExit("error: --slice selects shapes of --grid")
    part = _slice(args.slice)
    if args.merge:
        try:
            rows, summary, gpu, date = merge_grid(args.merge)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        for k, v in summary.items():
            print(f"{k}: {v}")
        if not args.no_write:
            print("wrote", write_results("gemm_grid", rows, summary, gpu=gpu, date=date))
        return rows, summary
    require_hopper("python -m benchmarks.gemm")
    if args.grid:
        dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
        bad = [d for d in dtypes if d not in GRID_DTYPES]
        if bad or not dtypes or args.count < 1:
            raise SystemExit(f"error: --dtypes from {','.join(GRID_DTYPES)} and --count >= 1 (got {args.dtypes}, "
                             f"{args.count})")
        provs = None if args.providers == DEFAULT_PROVIDERS else set(args.providers.split(","))
        suite, rows = "gemm_grid", run_grid(args.seed, args.count, dtypes, provs, not args.unpadded_baseline, part,
                                             args.rounds)
        summary = summarize_grid(rows, args.seed, args.count, dtypes)
        summary["rounds"] = args.rounds
        summary["cublas_padded"] = not args.unpadded_baseline
        if args.slice:
            summary["slice"] = args.slice
            suite = f"gemm_grid_slice{part.start or 0}-{part.stop if part.stop is not None else args.count}"
    elif args.decode:
        if args.no_gemv:
            os.environ["CUTE_KERNELS_GEMV"] = "0"
        suite, rows = "gemm_decode", run_decode()
        s = speedups(rows, "cute", "cublas")
        summary = {"geomean_speedup_vs_cublas": geomean(list(s.values())), "min_speedup_vs_cublas": min(s.values()),
                   "gemv": not args.no_gemv}
    else:
        suite, rows = "gemm", run(SQUARE if args.quick else SUITE, args.providers.split(","))
        summary = summarize(rows)
        try:
            summary.update({f"host_overhead_us[{k}]": v for k, v in host_overhead_us().items()})
        except Exception as e:
            print("host overhead not measured:", e)
    print(format_table(rows))
    for k, v in summary.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    if not args.no_write:
        print("wrote", write_results(suite, rows, summary))
    return rows, summary

if __name__ == "__main__":
    main()
