"""Same-run A/B of the prefill kernel's schedule options (attention.config.PrefillConfig).

    python -m benchmarks.ab_attention [--option wg_key_range] [--reps 2] [--out DIR]

For each case (Llama-style GQA shapes, causal and not, head dim 64 and 128, plus a ragged
MHA one), times the config `prefill_config` picks (provider `cute`) against the same config
with the option flipped (`cute <option>=<value>`), and cuDNN's SDPA for reference, all
CUDA-graph timed with L2 rotation (runtime.timing), `--reps` alternating repetitions. Each
variant's max error against cuDNN's output is recorded with its row. Writes ab_attention_<option>_<gpu>.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks.common import PEAK_TFLOPS, Row, format_table, geomean, require_hopper, time_ms, write_results

# (batch, seqlen, query heads, kv heads, head dim, causal)
CASES = [(4, 2048, 32, 8, 64, True), (16, 1024, 32, 8, 64, True), (2, 4096, 32, 8, 64, True),
         (1, 8192, 32, 8, 64, True), (4, 2048, 32, 8, 64, False), (4, 2048, 32, 8, 128, True),
         (3, 1000, 12, 12, 64, True)]
BOOL_OPTIONS = ("wg_key_range", "pingpong")


def _case(B, S, Hq, Hk, D, causal) -> str:
    return f"{B}x{S}x{Hq}/{Hk}x{D}{' causal' if causal else ''}"


def run(option: str = "wg_key_range", reps: int = 2) -> tuple[list[Row], dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cute_kernels.attention.api import _run
    from cute_kernels.attention.config import prefill_config

    rows: list[Row] = []
    for B, S, Hq, Hk, D, causal in CASES:
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16)
        flops = 4 * B * Hq * S * S * D / (2 if causal else 1)
        case = _case(B, S, Hq, Hk, D, causal)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2)
            ms = time_ms(lambda _i: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True))
        rows.append(Row(case, "cudnn", ms, flops / ms / 1e9, 100 * flops / ms / 1e9 / PEAK_TFLOPS["bf16"]))
        base = prefill_config(D, S)
        flipped = not getattr(base, option)
        variants = {"cute": base, f"cute {option}={flipped}": dataclasses.replace(base, **{option: flipped})}
        times: dict[str, list[float]] = {name: [] for name in variants}
        errs = {}
        for _ in range(reps):
            for name, cfg in variants.items():
                out, _ = _run(q, k, v, causal, None, config=cfg)
                errs[name] = (out.float() - ref.float()).abs().max().item()
                times[name].append(time_ms(lambda _i, cfg=cfg: _run(q, k, v, causal, None, config=cfg)))
        for name in variants:
            ms = sorted(times[name])[len(times[name]) // 2]
            rows.append(Row(case, name, ms, flops / ms / 1e9,
                            100 * flops / ms / 1e9 / PEAK_TFLOPS["bf16"],
                            extra={"times_ms": times[name], "max_err_vs_cudnn": errs[name],
                                   "config": str(variants[name])}))
    t = {(r.case, r.provider): r.ms for r in rows}
    flip = {r.case: r.provider for r in rows if r.provider.startswith(f"cute {option}=")}
    gain = {c: t[(c, flip[c])] / t[(c, "cute")] for c in flip}
    summary = {"shipped_vs_flipped_geomean": geomean(list(gain.values())),
               **{f"shipped_vs_flipped[{c}]": g for c, g in gain.items()},
               "cute_vs_cudnn_geomean": geomean([t[(c, "cudnn")] / t[(c, "cute")] for c in flip])}
    return rows, summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--option", default="wg_key_range", choices=BOOL_OPTIONS, help="the PrefillConfig switch to flip")
    p.add_argument("--reps", type=int, default=2, help="alternating repetitions per variant (median kept)")
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    require_hopper("benchmarks.ab_attention")
    if args.out:
        import os

        os.environ["CUTE_KERNELS_RESULTS_DIR"] = args.out
    rows, summary = run(args.option, args.reps)
    print(format_table(rows, baseline="cudnn"))
    notes = (f"`python -m benchmarks.ab_attention --option {args.option} --reps {args.reps}`: the shipped prefill "
             f"config (`cute`) against the same config with `{args.option}` flipped, cuDNN SDPA for reference; "
             "CUDA-graph timed with L2 rotation, the median of the alternating repetitions.")
    print("wrote", write_results(f"ab_attention_{args.option}", rows, summary, notes=notes, baseline="cudnn"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
