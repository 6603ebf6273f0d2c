"""Tune GEMM configs for a model's linears on this GPU: `python -m cute_kernels.tune --model gpt2-xl`.

    python -m cute_kernels.tune --model gpt2-xl [--m 1,8,512,8192] [--dtypes bf16,fp8,int8] [--force]
    python -m cute_kernels.tune --shapes 4800x1600,512x1600x6400 [--m ...] [--dtypes ...]
    python -m cute_kernels.tune --list
    python -m cute_kernels.tune --write-table [--gpu "NVIDIA H100 80GB HBM3"]

Winners go to the tuning cache of this GPU (`cute_kernels.tuning.cache`), where every later
GEMM of that class finds them. --write-table merges that cache into the shipped table of
the GPU (cute_kernels/tuning/tables/), or with --gpu and no GPU present only restamps
that table's header for the current sources. The function is `cute_kernels.tune(...)`.
"""

from __future__ import annotations

import argparse
import sys
import types


def tune(shapes=None, **kwargs):
    """`cute_kernels.tuning.tune.tune`: tune shapes and/or a model's linears on this GPU."""
    from .tuning.tune import tune as _tune

    return _tune(shapes, **kwargs)


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"need ints >= 1, got {text!r}")
    return vals


def _shapes(text: str) -> list[tuple[int, ...]]:
    out = []
    for s in text.split(","):
        try:
            dims = tuple(int(v) for v in s.strip().split("x"))
        except ValueError:
            dims = ()
        if len(dims) not in (2, 3) or min(dims) < 1:
            raise argparse.ArgumentTypeError(f"a shape is NxK or MxNxK, got {s!r}")
        out.append(dims)
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        self.exit(2, f"error: {message}\n")


def main(argv=None) -> int:
    from .tuning import cache, models
    from .tuning.tune import DTYPES, label

    p = _Parser(prog="python -m cute_kernels.tune", description="Tune GEMM configs on this GPU into the tuning cache.")
    p.add_argument("--model", help=f"tune this model's linears: {', '.join(models.MODELS)}")
    p.add_argument("--shapes", type=_shapes, default=None, help="comma-separated NxK (at every --m) or MxNxK")
    p.add_argument("--m", type=_ints, default=(1, 8, 512, 8192), help="M values (default 1,8,512,8192)")
    p.add_argument("--dtypes", default="bf16", help=f"comma-separated, from {','.join(DTYPES)} (default bf16)")
    p.add_argument("--epilogue", choices=cache.EPILOGUES, default=None,
                   help="epilogue class (default: each linear's own, plain for --shapes)")
    p.add_argument("--force", action="store_true", help="tune classes the cache already holds again")
    p.add_argument("--jobs", type=int, default=None, help="compile worker processes (default: one per CPU core)")
    p.add_argument("--list", action="store_true", help="print this GPU's tuning cache")
    p.add_argument("--write-table", action="store_true", help="merge this GPU's tuning cache into its shipped table")
    p.add_argument("--gpu", default=None, help="with --write-table: the GPU name (default: the GPU present)")
    args = p.parse_args(argv)

    if args.write_table:
        gpu = args.gpu or cache.gpu_name()
        if gpu is None:
            print("error: no GPU: name the table's GPU with --gpu", file=sys.stderr)
            return 2
        path = cache.write_table(gpu)
        print(f"wrote {path}")
        return 0
    gpu = cache.gpu_name()
    from .runtime import is_hopper_available

    if gpu is None or not is_hopper_available():
        print(f"error: tuning times kernels on an NVIDIA Hopper GPU (sm_90): {gpu or 'no CUDA GPU found'}",
              file=sys.stderr)
        return 2
    if args.list:
        for e in sorted(cache.entries(gpu), key=lambda e: e.problem.key):
            q = e.problem
            print(f"{q.op} {q.out} {q.majors} {q.epilogue} N={q.n} K={q.k} M={q.m}: {label(e.config)} {e.ms:.4f} ms "
                  f"(heuristic {e.heuristic_ms:.4f})")
        print(f"{cache.user_path(gpu)}")
        return 0
    if args.model is None and args.shapes is None:
        print("error: give --model or --shapes (or --list / --write-table)", file=sys.stderr)
        return 2
    try:
        results = tune(args.shapes, model=args.model, dtypes=[d.strip() for d in args.dtypes.split(",") if d.strip()],
                       ms=args.m, epilogue=args.epilogue, force=args.force, jobs=args.jobs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if results:
        from math import exp, log

        gain = exp(sum(log(r.speedup) for r in results) / len(results))
        print(f"tune: {len(results)} classes tuned, {gain:.3f}x the heuristic (geomean) -> {cache.user_path(gpu)}")
    return 0


class _CallableModule(types.ModuleType):
    """`cute_kernels.tune` is both this module (`python -m cute_kernels.tune`) and the function
    the package exports: importing the module rebinds the package attribute to it, so the
    module forwards calls to the function."""

    def __call__(self, shapes=None, **kwargs):
        return tune(shapes, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
