"""Compile random GEMM configs for sm_90a and report what ptxas says: spills and errors.

    python -m benchmarks.compile_sweep --dtype bf16 --count 300 [--seed 0]
    python -m benchmarks.compile_sweep --dtype fp8 --count 250

No GPU: every config `GemmConfig.validate` admits can be forced with `config=` or picked by
the tuner, and a build that spills runs slowly without a word. Each draw is a config of the
tuner's space (tiles, clusters, ping-pong, split-K, swap_ab, raster, promote for fp8) with an
epilogue its dtype's ops take; repeated (config, epilogue) pairs compile once. Found this way:
split-K residual builds spill at 192 accumulators a thread (`tuning.cache.SPLIT_RESIDUAL_SPILL_ACC`)
and promoted 64-row tiles past 192 columns (`GemmConfig.validate`).
"""

from __future__ import annotations

import argparse
import random

_EPILOGUES_16 = ({}, {"bias": True, "activation": "gelu_tanh"}, {"bias": True, "residual": True}, {"residual": True})
_EPILOGUES_8 = ({}, {"bias": True}, {"bias": True, "activation": "gelu_tanh"}, {"residual": True},
                {"bias": True, "residual": True})


def draw_config(r: random.Random, dtype: str = "bf16"):
    """A config of the tuner's space that validates for `dtype` (bf16, fp8 or int8)."""
    from cute_kernels.matmul.config import GemmConfig

    integer, in_bytes = dtype == "int8", 2 if dtype == "bf16" else 1
    while True:
        swap = r.random() < 0.4
        tm = r.choice([64, 128, 128, 192, 256])
        tn = r.choice(range(16, 257, 16 if integer else 8)) if swap else r.choice([64, 96, 128, 160, 192, 256])
        cm, cn = r.choice([(1, 1), (2, 1), (2, 1), (1, 2), (2, 2)])
        cfg = GemmConfig(tm, tn, cm, cn, pingpong=r.random() < 0.4, split_k=r.choice([1, 1, 2, 3, 4]), swap_ab=swap,
                         raster_m=r.random() < 0.7, group=r.choice([1, 4, 8]),
                         promote=dtype == "fp8" and r.random() < 0.25)
        try:
            cfg.validate(in_bytes, 2, integer=integer)
        except ValueError:
            continue
        return cfg


def draw_epilogue(r: random.Random, cfg, dtype: str) -> dict:
    """Swapped tiles run the plain epilogue (plus an 8-bit op's scales); 192-row tiles no residual."""
    scales = {} if dtype == "bf16" else {"row_scale": r.choice(["vector", "scalar"]),
                                         "col_scale": r.choice(["vector", "scalar"])}
    if cfg.swap_ab:
        return scales
    epi = dict(r.choice(_EPILOGUES_16 if dtype == "bf16" else _EPILOGUES_8))
    if cfg.tile_m == 192:
        epi.pop("residual", None)
    return {**scales, **epi}


def compile_report(cfg, epi: dict, dtype: str) -> str:
    """'ok', 'SPILL <stores>/<loads> bytes' or 'ERROR <why>' for one build."""
    import dataclasses
    import glob
    import re
    import tempfile

    import torch

    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue
    from tests.ptx_check import ptxas_report

    in_dt = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}[dtype]
    out_dt = torch.bfloat16 if dtype != "bf16" else in_dt
    acc = "Int32" if dtype == "int8" else "Float32"
    if cfg.split_k > 1:  # the split count is a runtime value: one build for every count
        cfg = dataclasses.replace(cfg, split_k=2)
    with tempfile.TemporaryDirectory() as d:
        try:
            _compile(in_dt, in_dt, out_dt, "k", "k", cfg, Epilogue(**epi), acc, keep_dir=d)
        except Exception as e:  # noqa: BLE001 - the report is the point
            return f"ERROR {type(e).__name__}: {str(e)[:200]}"
        report = ptxas_report(glob.glob(d + "/*.ptx")[0])
    spills = [(int(a), int(b)) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)]
    bad = [s for s in spills if s != (0, 0)]
    return f"SPILL {bad[0][0]}/{bad[0][1]} bytes" if bad else ("ok" if report else "ok (no ptxas: not checked)")


def main(argv=None) -> None:
    import os

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cute_kernels.tuning.tune import label

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp8", "int8"])
    ap.add_argument("--count", type=int, default=100, help="draws (repeats compile once)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    seen, bad = set(), 0
    for i in range(args.count):
        r = random.Random(f"{args.dtype}/{args.seed}/{i}")
        cfg = draw_config(r, args.dtype)
        epi = draw_epilogue(r, cfg, args.dtype)
        key = (cfg, tuple(sorted(epi.items())))
        if key in seen:
            continue
        seen.add(key)
        verdict = compile_report(cfg, epi, args.dtype)
        bad += not verdict.startswith("ok")
        print(f"{i:4d} {label(cfg):>18} {','.join(f'{k}={v}' for k, v in sorted(epi.items())) or 'plain':<60} {verdict}",
              flush=True)
    print(f"{len(seen)} builds, {bad} spilled or failed")


if __name__ == "__main__":
    main()
