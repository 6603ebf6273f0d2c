"""One table from the raw files of `inference bench --tp N` runs on one machine:
`python -m benchmarks.tp_summary RAW.json [RAW.json ...] --name tp_h200x2`.

Each raw file is one `torchrun ... -m inference bench --tp N --out DIR` result. The summary pairs
every model's TP>1 rows with its TP=1 row (when present) and writes
benchmarks/results/<name>.json and .md (CUTE_KERNELS_RESULTS_DIR to redirect).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import RESULTS_DIR


def _top(breakdown: dict | None, n: int = 6) -> str:
    if not breakdown:
        return "-"
    return "; ".join(f"{k['kernel'][:40]} {k['pct_time']:.1f}%" for k in breakdown["kernels"][:n])


def _timeline(dec: dict, n: int = 5) -> str:
    kinds = sorted(dec.get("timeline", {}).get("kinds", []), key=lambda k: -k["adds_us"])[:n]
    return "; ".join(f"{k['kernel'][:30]} x{int(k['calls'])} {k['adds_us']:.0f} us" for k in kinds)


def rows_of(raw: dict) -> list[dict]:
    out = []
    for allreduce, dec in (raw.get("decode") or {"none": {}}).items():
        p = raw["prefill"]
        out.append({"model": raw["model"], "tp": raw["tp"], "tp_invariant": raw.get("tp_invariant") or 0,
                    "allreduce": allreduce, "prefill_batch": raw["batch"],
                    "prompt_len": raw["prompt_len"], "prefill_ms": p["ms"], "prefill_tok_s": p["tok_s"],
                    "prefill_mfu_pct_per_rank": p.get("mfu_pct"),
                    "prefill_ms_collectives_nccl": raw.get("prefill_sp_collectives", {}).get("nccl", {}).get("ms"),
                    "prefill_ms_seq_parallel_off": raw.get("prefill_seq_parallel", {}).get("off", {}).get("ms"),
                    "prefill_ms_sp_overlap_off": raw.get("prefill_sp_overlap", {}).get("off", {}).get("ms"),
                    "decode_ms_per_token": dec.get("ms_per_token"), "decode_mbu_pct": dec.get("mbu_pct"),
                    "roofline_ms": dec.get("roofline_ms"), "allreduce_us": dec.get("allreduce_us"),
                    "weight_gb_per_rank": raw["weight_gb_per_rank"]})
    return out


def summarize(raws: list[dict]) -> dict:
    s = {}
    by = {(r["model"], r["tp"], r.get("tp_invariant") or 0): r for r in raws}
    for (name, tp, inv), r in sorted(by.items()):
        base = by.get((name, 1, inv))
        model = f"{name}[tp_invariant={inv}]" if inv else name
        if tp > 1 and base is not None:
            s[f"{model}_prefill_speedup_tp{tp}_vs_tp1"] = base["prefill"]["ms"] / r["prefill"]["ms"]
            for ar, dec in r.get("decode", {}).items():
                s[f"{model}_decode_ratio_tp{tp}_vs_tp1[{ar}]"] = dec["ms_per_token"] / base["decode"]["none"]["ms_per_token"]
            tf = r.get("teacher_forced_vs_reference")
            if tf:
                s[f"{model}_teacher_forced_agreement"] = f"{tf['agree']}/{tf['positions']}"
                s[f"{model}_max_reference_margin_at_disagreement"] = max(tf["margin_reference"], default=0.0)
                if "teacher_forced_margins_identical" in tf:
                    s[f"{model}_teacher_forced_margins_identical_tp{tp}_vs_tp{tf['reference_tp']}"] = \
                        tf["teacher_forced_margins_identical"]
                if "greedy_identical" in tf:
                    s[f"{model}_greedy_tokens_identical_tp{tp}_vs_tp{tf['reference_tp']}"] = tf["greedy_identical"]
        if tp > 1:
            s[f"{model}_tp{tp}_prefill_tok_s"] = r["prefill"]["tok_s"]
            if "prefill_sp_overlap" in r:
                o = r["prefill_sp_overlap"]
                s[f"{model}_tp{tp}_prefill_ms[reduce-scatter overlapped|after the GEMM]"] = [o["on"]["ms"], o["off"]["ms"]]
            if "prefill_sp_collectives" in r:
                c = r["prefill_sp_collectives"]
                s[f"{model}_tp{tp}_prefill_ms[copy-engine collectives|nccl]"] = [c["p2p"]["ms"], c["nccl"]["ms"]]
            for ar, dec in r.get("decode", {}).items():
                s[f"{model}_tp{tp}_decode_ms_per_token[{ar}]"] = dec["ms_per_token"]
    return s


def markdown(payload: dict, raws: list[dict]) -> str:
    md = [f"# Tensor parallel on {payload['gpu']}, {payload['date']}", "",
          f"Random weights, bf16, attention cute, torch {payload['torch']}, transformers {payload['transformers']}; "
          "every row from one machine, the runs one after another. Prefill is timed with CUDA events on eager launches; "
          "decode is one CUDA graph per token. MBU and rooflines: the rank's sharded weights plus its KV rows.", "",
          "| model | TP | invariant | all-reduce | prefill ms | tok/s | MFU/rank | reduce-scatter after the GEMM | "
          "collectives on NCCL | replicated stream | decode ms/token | MBU | all-reduce us |", "|---" * 13 + "|"]
    if payload.get("note"):
        md[4:4] = [payload["note"], ""]
    f = (lambda v, p=2: "-" if v is None else f"{v:,.{p}f}")
    for r in payload["rows"]:
        md.append(f"| {r['model']} | {r['tp']} | {r.get('tp_invariant') or '-'} | {r['allreduce']} | {f(r['prefill_ms'])} | {f(r['prefill_tok_s'], 0)} | "
                  f"{f(r['prefill_mfu_pct_per_rank'], 1)}% | {f(r.get('prefill_ms_sp_overlap_off'))} | "
                  f"{f(r['prefill_ms_collectives_nccl'])} | "
                  f"{f(r['prefill_ms_seq_parallel_off'])} | {f(r['decode_ms_per_token'], 3)} | "
                  f"{f(r['decode_mbu_pct'], 1)}% | {f(r['allreduce_us'], 1)} |")
    md += ["", "## Summary", ""] + [f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}"
                                    for k, v in payload["summary"].items()]
    md += ["", "## Where the time goes", ""]
    for r in raws:
        inv = f" tp_invariant={r['tp_invariant']}" if r.get("tp_invariant") else ""
        md.append(f"- {r['model']} TP={r['tp']}{inv} prefill kernels: {_top(r['prefill'].get('breakdown'))}")
        for ar, dec in r.get("decode", {}).items():
            md.append(f"  - decode [{ar}] step timeline, most time added: {_timeline(dec)}")
        tf = r.get("teacher_forced_vs_reference")
        if tf:
            md.append(f"  - TP=1's greedy tokens teacher-forced through TP={r['tp']}: {tf['agree']}/{tf['positions']} "
                      f"agree; TP=1's top-2 logit gap at each disagreement: {tf['margin_reference']}")
            if "greedy_identical" in tf:
                md.append(f"  - greedy tokens generated by TP={r['tp']} identical to TP={tf['reference_tp']}'s: "
                          f"{tf['greedy_identical']} (first difference at {tf['greedy_first_difference']})")
    md += ["", f"Raw files: {', '.join(payload['raw'])}."]
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tp_summary", description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="+", type=Path)
    ap.add_argument("--name", required=True, help="results file stem, e.g. tp_h200x2")
    ap.add_argument("--gpu", default=None, help="the machine in words (default: the raw files' GPU name)")
    ap.add_argument("--note", type=Path, default=None, help="a markdown file placed under the heading (commands, notes)")
    args = ap.parse_args(argv)
    raws = [json.loads(p.read_text()) for p in args.raw]
    first = raws[0]
    payload = {"suite": "tp", "gpu": args.gpu or first["gpu"], "date": first["date"], "torch": first["torch"],
               "transformers": first["transformers"], "rows": [row for r in raws for row in rows_of(r)],
               "summary": summarize(raws), "raw": [p.name for p in args.raw],
               "note": args.note.read_text().strip() if args.note else ""}
    from cute_kernels.runtime import env

    out = Path(env.get("CUTE_KERNELS_RESULTS_DIR") or RESULTS_DIR)
    (out / f"{args.name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(markdown(payload, raws))
    print(f"wrote {out / args.name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
