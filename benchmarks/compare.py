"""Same-machine before/after timing of our kernels between two checkouts.

    cd OTHER_CHECKOUT && python /path/to/benchmarks/compare.py time before > before.json
    cd THIS_CHECKOUT  && python benchmarks/compare.py time after > after.json
    python benchmarks/compare.py report before.json after.json [--suite NAME] [--note TEXT]

`time` runs in whatever checkout is the working directory (it imports that tree's
`cute_kernels` and `benchmarks.common`): the GEMM suite's shapes through `ck.gemm` against
`torch.mm`, the attention suite's prefill and decode points through `ck.flash_attn` against
SDPA's cuDNN backend, each checked against the vendor. The vendor's own times are the
drift check: a ratio moves only where ours moves and theirs does not. `report` writes
benchmarks/results/<suite>_<gpu>.{json,md} (default suite: compare) with per-case
before/after times and the geomean of before/after per group.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def time_all() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cute_kernels as ck
    from benchmarks.attention import DECODE, PREFILL
    from benchmarks.common import rotation_count, time_ms
    from benchmarks.gemm import SUITE

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal, enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)

    torch.manual_seed(0)
    res = {}
    for (M, N, K) in SUITE:
        nrot = rotation_count((M * K + N * K + M * N) * 2)
        A = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
        B = [torch.randn(K, N, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
        err = (ck.gemm(A[0], B[0]).float() - torch.mm(A[0], B[0]).float()).abs().max().item()
        res[f"gemm {M}x{N}x{K}"] = {"cute": time_ms(lambda i: ck.gemm(A[i], B[i]), n_rotate=nrot),
                                    "vendor": time_ms(lambda i: torch.mm(A[i], B[i]), n_rotate=nrot), "err": err}
        del A, B
    for (B, H, S, D) in PREFILL:
        for causal in (False, True):
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            err = (ck.flash_attn(q, k, v, causal=causal).float() - cudnn(q, k, v, causal).float()).abs().max().item()
            res[f"prefill {B}x{H}x{S}x{D}{'-causal' if causal else ''}"] = {
                "cute": time_ms(lambda i: ck.flash_attn(q, k, v, causal=causal)),
                "vendor": time_ms(lambda i: cudnn(q, k, v, causal)), "err": err}
            del q, k, v
            torch.cuda.empty_cache()
    for (B, L, hq, hkv, D) in DECODE:
        q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, L, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        err = (ck.flash_attn(q, k, v).float() - cudnn(q, k, v, False).float()).abs().max().item()
        res[f"decode b{B}-L{L}-h{hq}/{hkv}-d{D}"] = {"cute": time_ms(lambda i: ck.flash_attn(q, k, v)),
                                                     "vendor": time_ms(lambda i: cudnn(q, k, v, False)), "err": err}
        del q, k, v
        torch.cuda.empty_cache()
    return {"gpu": torch.cuda.get_device_name(0), "res": res}


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def report(before: dict, after: dict, suite: str, note: str, date: str) -> tuple[dict, str]:
    """(results JSON, markdown) comparing two `time` outputs of one machine."""
    if before["gpu"] != after["gpu"]:
        raise ValueError(f"before ran on {before['gpu']}, after on {after['gpu']}: not one machine")
    rows, groups = [], {}
    for case, b in before["res"].items():
        a = after["res"].get(case)
        if a is None:
            continue
        rows.append({"case": case, "before_ms": b["cute"], "after_ms": a["cute"], "speed_after_vs_before": b["cute"] / a["cute"],
                     "vendor_before_ms": b["vendor"], "vendor_after_ms": a["vendor"],
                     "max_abs_diff_vs_vendor": [b["err"], a["err"]]})
        groups.setdefault(case.split()[0], []).append(rows[-1])
    summary = {}
    for g, rs in groups.items():
        summary[f"geomean_after_vs_before[{g}]"] = _geomean([r["speed_after_vs_before"] for r in rs])
        summary[f"vendor_drift[{g}]"] = _geomean([r["vendor_before_ms"] / r["vendor_after_ms"] for r in rs])
        summary[f"min_after_vs_before[{g}]"] = min(r["speed_after_vs_before"] for r in rs)
    payload = {"gpu": before["gpu"], "date": date, "rows": rows, "summary": summary}
    md = [f"# {suite} on {before['gpu']} ({date})", ""] + ([note, ""] if note else [])
    md += ["| case | before ms | after ms | after vs before | vendor before | vendor after |", "|---|---|---|---|---|---|"]
    md += [f"| {r['case']} | {r['before_ms']:.4f} | {r['after_ms']:.4f} | {r['speed_after_vs_before']:.3f}x | "
           f"{r['vendor_before_ms']:.4f} | {r['vendor_after_ms']:.4f} |" for r in rows]
    md += ["", "## Summary", ""] + [f"- {k}: {v:.3f}" for k, v in summary.items()]
    return payload, "\n".join(md) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("tag")
    r = sub.add_parser("report")
    r.add_argument("before")
    r.add_argument("after")
    r.add_argument("--suite", default="compare")
    r.add_argument("--note", default="")
    r.add_argument("--date", default=None)
    args = p.parse_args(argv)
    if args.cmd == "time":
        sys.path.insert(0, str(Path.cwd()))  # the checkout being timed, not this file's
        from benchmarks.common import require_hopper

        require_hopper("benchmarks/compare.py time")
        out = time_all()
        out["tag"] = args.tag
        json.dump(out, sys.stdout)
        return 0
    import datetime

    payload, md = report(json.loads(Path(args.before).read_text()), json.loads(Path(args.after).read_text()),
                         args.suite, args.note, args.date or datetime.date.today().isoformat())
    tag = "h100" if "H100" in payload["gpu"] else payload["gpu"].lower().replace(" ", "_")
    out = Path(__file__).resolve().parent / "results"
    (out / f"{args.suite}_{tag}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (out / f"{args.suite}_{tag}.md").write_text(md)
    print(f"wrote {out / f'{args.suite}_{tag}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
