"""One-row (M = 1) decode GEMV launch configs, timed as the decode chain runs them.

    python -m benchmarks.gemv_sweep [--sets 8b,1b,70b-tp2,gpt2xl] [--weights bf16|fp8|int8] [--quick]
                                    [--default-only] [--m M] [--stem NAME]

For each shape of a set (Llama-3-8B, Llama-3.2-1B, Llama-3-70B at TP=2, GPT-2 XL), a chain of
launches on distinct weights (at least 3 GB of them, so nothing is served from L2) in one CUDA
graph with programmatic dependent launch, for the heuristic's pick (`gemv._launch_blocks`, or
the CuTe DSL one-row kernel where `gemv_sm90_applies`) and every Triton (BLOCK_N, BLOCK_K, warps,
stages) with 1024 <= BLOCK_N * BLOCK_K <= 16384 (--quick: 4 warps, 2048-element steps and up to
16384 elements, 8192 for SwiGLU's two tiles), plus the DSL kernel as the candidate "dsl" where
it applies. A shape's kind is what the decode step fuses into the launch: "rms" (the RMSNorm
prologue), "rms_swiglu" (prologue and silu(gate) * up over [gate; up]; N is the output
width), "residual" (the o_proj / down epilogue), "plain". --weights fp8 / int8 time the
weight-only 8-bit form (per-channel fp32 scales). Microseconds per launch: the chain timed by
the suites' one helper (CUDA-graph replays, median), with cuBLAS (`F.linear` on the same
weights, "cublas_us") in the same run. --m 2..8 times that many activation rows (16-bit
weights: the tl.dot form's candidates, `batch_candidates`). Writes <stem>_<gpu>.json / .md (stem:
gemv_sweep, gemv_sweep_<weights> for 8-bit) with the six fastest per shape.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
from pathlib import Path

SETS = {"8b": [("gate_up", 28672, 4096, "rms"), ("qkv", 6144, 4096, "rms"), ("down", 4096, 14336, "plain"),
               ("lm_head", 128256, 4096, "rms")],
        "1b": [("gate_up", 16384, 2048, "rms"), ("qkv", 3072, 2048, "rms"), ("down", 2048, 8192, "plain"),
               ("lm_head", 128256, 2048, "rms")],
        "70b-tp2": [("gate_up", 28672, 8192, "rms"), ("qkv", 5120, 8192, "rms"), ("down", 8192, 14336, "plain")],
        "gpt2xl": [("c_attn", 4800, 1600, "plain"), ("c_fc", 6400, 1600, "plain"), ("mlp_proj", 1600, 6400, "plain"),
                   ("lm_head", 50257, 1600, "plain")],
        # what the Llama decode step launches with every fusion (8-bit steps: these four shapes)
        "8b-step": [("qkv", 6144, 4096, "rms"), ("gate_up_swiglu", 14336, 4096, "rms_swiglu"),
                    ("o_proj", 4096, 4096, "residual"), ("down", 4096, 14336, "residual")],
        "1b-step": [("qkv", 3072, 2048, "rms"), ("gate_up_swiglu", 8192, 2048, "rms_swiglu"),
                    ("o_proj", 2048, 2048, "residual"), ("down", 2048, 8192, "residual")],
        # GPT-2's vocabulary heads (tied to wte, 50257 rows) at every width of the family
        "gpt2-heads": [("gpt2:lm_head", 50257, 768, "plain"), ("medium:lm_head", 50257, 1024, "plain"),
                       ("large:lm_head", 50257, 1280, "plain"), ("xl:lm_head", 50257, 1600, "plain")],
        # GPT-2's short rows (K < 2048) wider than 2048: c_attn and c_fc of every size
        "gpt2-short": [("gpt2:c_attn", 2304, 768, "plain"), ("gpt2:c_fc", 3072, 768, "plain"),
                       ("medium:c_attn", 3072, 1024, "plain"), ("medium:c_fc", 4096, 1024, "plain"),
                       ("large:c_attn", 3840, 1280, "plain"), ("large:c_fc", 5120, 1280, "plain"),
                       ("xl:c_attn", 4800, 1600, "plain"), ("xl:c_fc", 6400, 1600, "plain")],
        "swiglu-step": [("8b:gate_up_swiglu", 14336, 4096, "rms_swiglu"), ("1b:gate_up_swiglu", 8192, 2048, "rms_swiglu")]}
CANDIDATES = [(1, bn, bk, w, st) for bn, bk, w, st in itertools.product((1, 2, 4, 8, 16, 32), (256, 512, 1024, 2048),
                                                                         (4, 8), (2, 3, 4)) if 1024 <= bn * bk <= 16384]


def quick_candidates(swiglu: bool) -> list:
    top = 8192 if swiglu else 16384
    return [(1, bn, bk, 4, st) for bn, bk, st in itertools.product((1, 2, 4, 8, 16, 32), (512, 1024, 2048), (2, 3, 4))
            if 2048 <= bn * bk <= top]


def dot_candidates() -> list:
    return [(16, bn, bk, 4, st) for bn, bk, st in itertools.product((16, 32, 64), (128, 256, 512), (3, 4, 5))
            if bn * bk <= 16384]


def batch_candidates() -> list:
    """The tl.dot form at 2-8 rows of 16-bit weights: up to 64 KB weight tiles."""
    return [(16, bn, bk, w, st) for bn, bk, w, st in itertools.product((16, 32, 64, 128), (128, 256, 512), (4, 8),
                                                                        (3, 4)) if bn * bk <= 32768]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="8b,1b,70b-tp2,gpt2xl")
    p.add_argument("--weights", default="bf16", choices=("bf16", "fp8", "int8"))
    p.add_argument("--quick", action="store_true", help="the shorter candidate list (see the module docstring)")
    p.add_argument("--dot", action="store_true", help="the tl.dot form's candidates (16 rows of x, 8-bit weights "
                                                      "in f16 on the tensor cores)")
    p.add_argument("--default-only", action="store_true", help="time the heuristic's pick only")
    p.add_argument("--m", type=int, default=1, help="activation rows (1-8; default 1)")
    p.add_argument("--stem", default=None, help="results file stem (default gemv_sweep[_<weights>])")
    args = p.parse_args(argv)
    if not 1 <= args.m <= 8:
        p.error("--m must be 1-8")
    if args.m > 1 and (args.weights != "bf16" or args.dot or args.quick):
        p.error("--m > 1 times 16-bit weights on the tl.dot form's candidates (no --weights, --dot, --quick)")
    import torch

    if not torch.cuda.is_available():
        print("error: gemv_sweep needs a CUDA GPU")
        return 2
    from benchmarks.common import RESULTS_DIR, gpu_name, gpu_tag, time_ms
    from benchmarks.gemm import _CUBLAS_N_ALIGN
    from cute_kernels.matmul import gemv
    from cute_kernels.runtime import env

    dev = torch.device("cuda")
    base, sm90_applies = gemv._launch_blocks, gemv.gemv_sm90_applies
    w8 = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}.get(args.weights)
    rows = []
    for key in args.sets.split(","):
        for name, N, K, kind in SETS[key]:
            swiglu = kind == "rms_swiglu"
            rows_w = 2 * N if swiglu else N
            wb = rows_w * K * (1 if w8 else 2)
            reps = max(3, min(32, math.ceil(3e9 / wb)))
            if w8 is None:
                ws = [torch.randn(rows_w, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(reps)]
            elif w8 == torch.int8:
                ws = [torch.randint(-127, 128, (rows_w, K), device=dev, dtype=torch.int8) for _ in range(reps)]
            else:
                ws = [torch.randn(rows_w, K, device=dev).to(w8) for _ in range(reps)]
            scale = None if w8 is None else torch.rand(rows_w, device=dev) * 1e-3 + 1e-4
            x = torch.randn(args.m, K, device=dev, dtype=torch.bfloat16)
            nw = torch.ones(K, device=dev, dtype=torch.bfloat16)
            res = torch.randn(args.m, N, device=dev, dtype=torch.bfloat16) if kind == "residual" else None
            outs = [torch.empty(args.m, N, device=dev, dtype=torch.bfloat16) for _ in range(reps)]
            rms = (nw, 1e-5) if kind.startswith("rms") else None

            def run():
                for w, o in zip(ws, outs):
                    gemv.skinny_gemm(x, w, residual=res, out=o, rms=rms, swiglu=swiglu, w_scale=scale)

            dsl = rms is None and sm90_applies(x, ws[0], outs[0], None, res, None, scale, None, None)
            cands = [] if args.default_only else (["dsl"] if dsl else []) + (
                batch_candidates() if args.m > 1 else dot_candidates() if args.dot
                else quick_candidates(swiglu) if args.quick else CANDIDATES)
            timed = []
            for cfg in [None] + cands:
                gemv._launch_blocks = base if cfg in (None, "dsl") else (lambda *a, c=cfg, **k: c)
                gemv.gemv_sm90_applies = sm90_applies if cfg in (None, "dsl") else (lambda *a, **k: False)
                pick = ("dsl" if dsl else list(base(args.m, N, K, 1 if w8 else 2, swiglu, rms is not None))) if cfg is None else (
                    cfg if cfg == "dsl" else list(cfg))
                try:
                    timed.append({"cfg": pick, "default": cfg is None,
                                  "us": time_ms(lambda _i: run(), rep_ms=50) / reps * 1e3})
                except Exception as e:  # noqa: BLE001 - a config that does not build or fit is skipped
                    print(f"{key}:{name} {cfg}: {type(e).__name__}: {str(e)[:200]}")
            gemv._launch_blocks, gemv.gemv_sm90_applies = base, sm90_applies
            cublas_us, wps = None, None
            if kind == "plain" and w8 is None:
                # cuBLAS on the weight padded to its N alignment, as benchmarks.gemm's grid times
                # F.linear (odd N would take its slower unaligned kernels)
                npad = -(-N // _CUBLAS_N_ALIGN) * _CUBLAS_N_ALIGN
                wps = [torch.cat([w, w[:npad - N]]) if npad > N else w for w in ws]
                ops = [torch.empty(args.m, npad, device=dev, dtype=torch.bfloat16) for _ in range(reps)]

                def run_cublas():
                    for w, o in zip(wps, ops):
                        torch.matmul(x, w.t(), out=o)

                cublas_us = time_ms(lambda _i: run_cublas(), rep_ms=50) / reps * 1e3
            default = next(t for t in timed if t["default"])
            best = sorted(timed, key=lambda t: t["us"])[:6]
            rows.append({"set": key, "shape": name, "M": args.m, "N": N, "K": K, "kind": kind, "weights": args.weights,
                         "chain": reps, "default": default, "best": best, "default_tbps": wb / default["us"] / 1e6,
                         "best_over_default": default["us"] / best[0]["us"], "cublas_us": cublas_us})
            print(json.dumps(rows[-1]), flush=True)
            del ws, wps
            torch.cuda.empty_cache()
    summary = {"geomean_best_over_default": math.exp(sum(math.log(r["best_over_default"]) for r in rows) / len(rows))}
    md = [f"# GEMV launch configs on {gpu_name()} ({datetime.date.today().isoformat()})", "",
          "`python -m benchmarks.gemv_sweep" + (" --default-only" if args.default_only else "")
          + (" --quick" if args.quick else "") + (" --dot" if args.dot else "")
          + (f" --m {args.m}" if args.m > 1 else "") + f" --weights {args.weights} --sets {args.sets}`;"
          " us per launch in a chain of distinct weights in one CUDA graph (PDL). Config: "
          "(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages).", "",
          "| shape | kind | M x N x K | default | us | TB/s | cuBLAS us | fastest (us) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cb = "-" if r["cublas_us"] is None else f"{r['cublas_us']:.1f}"
        md.append(f"| {r['set']}:{r['shape']} | {r['kind']} | {r['M']} x {r['N']} x {r['K']} | {_cfg(r['default']['cfg'])} | "
                  f"{r['default']['us']:.1f} | {r['default_tbps']:.2f} | {cb} | "
                  + ", ".join(f"{_cfg(b['cfg'])} {b['us']:.1f}" for b in r["best"][:3]) + " |")
    md += ["", f"Geomean fastest over default: {summary['geomean_best_over_default']:.3f}"]
    out = Path(env.get("CUTE_KERNELS_RESULTS_DIR") or RESULTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{args.stem or ('gemv_sweep' if w8 is None else 'gemv_sweep_' + args.weights)}_{gpu_tag()}"
    stem.with_suffix(".json").write_text(json.dumps({"gpu": gpu_name(), "date": datetime.date.today().isoformat(),
                                                      "sets": args.sets, "default_only": args.default_only,
                                                      "rows": rows, "summary": summary}, indent=1) + "\n")
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def _cfg(c) -> str:
    return c if isinstance(c, str) else str(tuple(c))


if __name__ == "__main__":
    raise SystemExit(main())
