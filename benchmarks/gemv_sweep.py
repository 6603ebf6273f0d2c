"""One-row (M = 1) decode GEMV launch configs, timed as the decode chain runs them.

    python -m benchmarks.gemv_sweep [--sets 8b,1b,70b-tp2,gpt2xl] [--default-only]

For each shape of a set (Llama-3-8B, Llama-3.2-1B, Llama-3-70B at TP=2, GPT-2 XL; the RMSNorm
prologue where the model has one), a chain of launches on distinct weights (at least 3 GB of
them, so nothing is served from L2) in one CUDA graph with programmatic dependent launch, for
the heuristic's pick (`gemv._launch_blocks`) and every (BLOCK_N, BLOCK_K, warps, stages) with
1024 <= BLOCK_N * BLOCK_K <= 16384. Microseconds per launch: the chain timed by the suites'
one helper (CUDA-graph replays, median). Writes
gemv_sweep_<gpu>.json / .md (the six fastest per shape).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
from pathlib import Path

SETS = {"8b": [("gate_up", 28672, 4096, True), ("qkv", 6144, 4096, True), ("down", 4096, 14336, False),
               ("lm_head", 128256, 4096, True)],
        "1b": [("gate_up", 16384, 2048, True), ("qkv", 3072, 2048, True), ("down", 2048, 8192, False),
               ("lm_head", 128256, 2048, True)],
        "70b-tp2": [("gate_up", 28672, 8192, True), ("qkv", 5120, 8192, True), ("down", 8192, 14336, False)],
        "gpt2xl": [("c_attn", 4800, 1600, False), ("c_fc", 6400, 1600, False), ("mlp_proj", 1600, 6400, False),
                   ("lm_head", 50257, 1600, False)]}
CANDIDATES = [(1, bn, bk, w, st) for bn, bk, w, st in itertools.product((1, 2, 4, 8, 16, 32), (256, 512, 1024, 2048),
                                                                         (4, 8), (2, 3, 4)) if 1024 <= bn * bk <= 16384]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="8b,1b,70b-tp2,gpt2xl")
    p.add_argument("--default-only", action="store_true", help="time the heuristic's pick only")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: gemv_sweep needs a CUDA GPU")
        return 2
    from benchmarks.common import RESULTS_DIR, gpu_name, gpu_tag, time_ms
    from cute_kernels.matmul import gemv
    from cute_kernels.runtime import env

    dev = torch.device("cuda")
    base = gemv._launch_blocks
    rows = []
    for key in args.sets.split(","):
        for name, N, K, rms in SETS[key]:
            wb = N * K * 2
            reps = max(3, min(32, math.ceil(3e9 / wb)))
            ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(reps)]
            x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
            nw = torch.ones(K, device=dev, dtype=torch.bfloat16)
            outs = [torch.empty(1, N, device=dev, dtype=torch.bfloat16) for _ in range(reps)]

            def run():
                for w, o in zip(ws, outs):
                    gemv.skinny_gemm(x, w, out=o, rms=(nw, 1e-5) if rms else None)

            timed = []
            for cfg in [None] + ([] if args.default_only else CANDIDATES):
                gemv._launch_blocks = base if cfg is None else (lambda M, N_, K_, c=cfg: c)
                try:
                    timed.append({"cfg": list(base(1, N, K) if cfg is None else cfg), "default": cfg is None,
                                  "us": time_ms(lambda _i: run(), rep_ms=50) / reps * 1e3})
                except Exception as e:  # noqa: BLE001 - a config that does not build or fit is skipped
                    print(f"{key}:{name} {cfg}: {type(e).__name__}")
            gemv._launch_blocks = base
            default = next(t for t in timed if t["default"])
            best = sorted(timed, key=lambda t: t["us"])[:6]
            rows.append({"set": key, "shape": name, "M": 1, "N": N, "K": K, "rms_prologue": rms, "chain": reps,
                         "default": default, "best": best, "default_tbps": wb / default["us"] / 1e6,
                         "best_over_default": default["us"] / best[0]["us"]})
            print(json.dumps(rows[-1]), flush=True)
            del ws
            torch.cuda.empty_cache()
    summary = {"geomean_best_over_default": math.exp(sum(math.log(r["best_over_default"]) for r in rows) / len(rows))}
    md = [f"# One-row GEMV launch configs on {gpu_name()} ({datetime.date.today().isoformat()})", "",
          "`python -m benchmarks.gemv_sweep" + (" --default-only" if args.default_only else "") + f" --sets {args.sets}`;"
          " us per launch in a chain of distinct weights in one CUDA graph (PDL). Config: "
          "(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages).", "",
          "| shape | M x N x K | default | us | TB/s | fastest (us) |", "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['set']}:{r['shape']} | 1 x {r['N']} x {r['K']} | {tuple(r['default']['cfg'])} | "
                  f"{r['default']['us']:.1f} | {r['default_tbps']:.2f} | "
                  + ", ".join(f"{tuple(b['cfg'])} {b['us']:.1f}" for b in r["best"][:3]) + " |")
    md += ["", f"Geomean fastest over default: {summary['geomean_best_over_default']:.3f}"]
    out = Path(env.get("CUTE_KERNELS_RESULTS_DIR") or RESULTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"gemv_sweep_{gpu_tag()}"
    stem.with_suffix(".json").write_text(json.dumps({"gpu": gpu_name(), "date": datetime.date.today().isoformat(),
                                                      "sets": args.sets, "default_only": args.default_only,
                                                      "rows": rows, "summary": summary}, indent=1) + "\n")
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
