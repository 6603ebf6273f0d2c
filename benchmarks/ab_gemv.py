"""Same-run A/B of the one-row GEMV's weight slice per CTA (matmul.gemv.gemv_sm90_config).

    python -m benchmarks.ab_gemv --slices 96,64,48,32,24 --shapes 50257x768,50257x1600,4800x1600

For each 1 x N x K shape (16-bit weights, the CuTe DSL one-row kernel of matmul/gemv_kernel.py),
times the config that each slice size (KB of weight a CTA copies into shared memory) gives,
slice sizes that give the same rows a CTA timed once (provider `cute <KB>k r<rows>`), against
cuBLAS (`F.linear` on the weight padded to a multiple of 16 rows, as a serving stack pads a
vocabulary). Each call stands alone: CUDA-graph replays over enough weight copies that L2 holds
none of them, `--reps` repetitions, every other one in reverse order, median kept; each
config's output is checked against the fp32 product first. The decode chain overlaps one
GEMV's copies with the next (PDL), which this does not measure: `benchmarks.gemv_sweep` times
chains. Writes ab_gemv_<name>_<gpu>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.common import (
    Row,
    add_ab_arguments,
    apply_ab_arguments,
    format_table,
    geomean,
    require_hopper,
    write_results,
)
from cute_kernels.matmul.gemv import GEMV_K_MAX
from cute_kernels.tune import _ints as int_list  # the package CLI's comma-separated integers


def parse_shapes(spec: str) -> list[tuple[int, int]]:
    """'50257x768,4800x1600' -> [(50257, 768), (4800, 1600)]: N x K of a one-row product."""
    out = []
    for part in spec.split(","):
        try:
            n, k = (int(v) for v in part.strip().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"shapes are NxK[,NxK...], got {part!r}") from None
        if n < 1 or not 16 <= k <= GEMV_K_MAX or k % 16:
            raise argparse.ArgumentTypeError(f"{part!r}: N >= 1 and K a multiple of 16 up to {GEMV_K_MAX} (the "
                                             "kernel's rows)")
        out.append((n, k))
    return out


def summarize(rows: list[Row]) -> dict:
    """Per shape: the dispatch config's (where a slice gave its rows) and the best config's
    ratio to cuBLAS."""
    from cute_kernels.matmul.gemv import gemv_sm90_config

    t = {(r.case, r.provider): r.ms for r in rows}
    cases = sorted({r.case for r in rows}, key=[r.case for r in rows].index)
    summary = {}
    for c in cases:
        ours = {p: ms for (case, p), ms in t.items() if case == c and p != "cublas"}
        best = min(ours, key=ours.get)
        _, n, k = (int(v) for v in c.split("x"))
        picked = gemv_sm90_config(n, k, False).rows
        default = next((p for p in ours if p.endswith(f" r{picked}")), None)
        summary[f"best[{c}]"] = best
        summary[f"best_vs_cublas[{c}]"] = t[(c, "cublas")] / ours[best]
        if default is not None:
            summary[f"default_vs_cublas[{c}]"] = t[(c, "cublas")] / ours[default]
    summary["best_vs_cublas_geomean"] = geomean([summary[f"best_vs_cublas[{c}]"] for c in cases])
    return summary


def run(shapes, slices_kb, reps: int) -> list[Row]:
    import torch
    import torch.nn.functional as F

    from benchmarks.common import rotation_count, time_ms, warm_up
    from cute_kernels.matmul import gemv
    from cute_kernels.matmul.config import Epilogue
    from cute_kernels.runtime import KERNELS

    warm_up()
    rows = []
    for N, K in shapes:
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        n_rot = rotation_count(N * K * 2)
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5 for _ in range(n_rot)]
        pad = -(-N // 16) * 16 - N
        wps = [F.pad(w, (0, 0, 0, pad)) for w in ws]
        out = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), ws[0].float())
        fns, seen = {"cublas": lambda i: F.linear(x, wps[i % n_rot])}, set()
        for kb in slices_kb:
            cfg = gemv.gemv_sm90_config(N, K, False, slice_bytes=kb * 1024)
            if cfg in seen:
                continue
            seen.add(cfg)
            # The plain epilogue's build, as gemv.gemv_sm90 compiles it (one JIT cache entry per config).
            kern = KERNELS.compiled("gemv_sm90", gemv._compile_gemv_sm90, torch.bfloat16, torch.bfloat16, Epilogue(),
                                    False, None, cfg, w_dt=torch.bfloat16)
            kern(x, ws[0], out, None, None, None, None, None, None, None, None, 1.0, 1.0, 1e-5)
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            if err > 2e-2:
                raise RuntimeError(f"1x{N}x{K} {kb} KB slices: relative error {err:.3g} against the fp32 product")
            fns[f"cute {kb}k r{cfg.rows}"] = lambda i, kern=kern: kern(x, ws[i % n_rot], out, None, None, None, None,
                                                                       None, None, None, None, 1.0, 1.0, 1e-5)
        times = {n: [] for n in fns}
        for r in range(reps):
            for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                times[n].append(time_ms(fns[n], n_rotate=n_rot))
        for n, ts in times.items():
            ms = statistics.median(ts)
            rows.append(Row(f"1x{N}x{K}", n, ms, gbps=N * K * 2 / ms / 1e6, extra={"times_ms": ts}))
        del ws, wps
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slices", type=int_list, default="96,64,48,32,24", help="comma-separated slice sizes in KB")
    p.add_argument("--shapes", type=parse_shapes, default="50257x768,50257x1024,50257x1280,50257x1600,4800x1600",
                   help="comma-separated NxK one-row products")
    add_ab_arguments(p, "slices", 3)
    args = p.parse_args(argv)
    apply_ab_arguments(p, args)
    require_hopper("benchmarks.ab_gemv")
    rows = run(args.shapes, args.slices, args.reps)
    print(format_table(rows))
    flags = f"--slices {','.join(map(str, args.slices))} --shapes {','.join(f'{n}x{k}' for n, k in args.shapes)}"
    notes = (f"`python -m benchmarks.ab_gemv {flags} --reps {args.reps}`: the one-row GEMV (CuTe DSL kernel) per "
             "slice size against cuBLAS on the weight padded to 16 rows; standalone calls, CUDA-graph timed over "
             "rotated weights, the median of the repetitions (every other one in reverse order).")
    print("wrote", write_results(f"ab_gemv_{args.name}", rows, summarize(rows), notes=notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
