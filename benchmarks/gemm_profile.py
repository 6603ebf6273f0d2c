"""Nsight Compute side by side: our GEMM kernel and cuBLAS's on one shape, where each stalls.

    python -m benchmarks.gemm_profile run --shape 1364x4096x1024 [--config 128x176c21PT] [--out DIR]
    python -m benchmarks.gemm_profile summarize DIR/cute_1364x4096x1024_sass.csv [--top 25]

`run` (an H100 and `ncu` on the PATH or under /usr/local/cuda/bin): for ours (the dispatch pick
of bf16 `linear`, or --config, a tuning.tune.label) and cuBLAS (`F.linear`), profiles one launch
after warm-up with the SpeedOfLight, WarpStateStats, SourceCounters and InstructionStats
sections, and writes under --out (default gemm_profile_out/, git-ignored: the reports are
0.4-0.6 MB each): <provider>_<shape>.ncu-rep, its SASS source page and details page as CSV
(<provider>_<shape>_sass.csv, _details.csv) and the summary of each side by side
(profile_<shape>.md: elapsed and SM-active cycles, then the stall samples).

`summarize`: for a source-page CSV, the warp-stall samples by stall reason and by opcode, the share
on wgmma instructions and their waits (HGMMA / IGMMA / QGMMA, WARPGROUP.*), and the share of the
code from the first to the last store of the output (stmatrix, TMA store, global store: the
epilogue's staging and stores, whatever the code layout). Reading cuBLAS's nvjet kernel this way at 1364x4096x1024 (same 128 x 176 ping-pong
swap_ab tile as ours) showed per-warp TMA stores without a named barrier and a third of our
samples at barriers (docs/tried-and-not-kept.md has what that led to).
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import shutil
import subprocess
import sys

_SECTIONS = ("SpeedOfLight", "WarpStateStats", "SourceCounters", "InstructionStats")
_KERNELS = "regex:nvjet|cutlass|gemm|Gemm"
_WARMUP_CALLS = 20
_SKIP = 10  # profiled launch: the 11th GEMM kernel, inside the warm-up (clocks settled, caches warm)
_STORE_OPS = ("STSM", "UTMASTG", "STG", "UBLKCP")
_MMA_OPS = ("HGMMA", "IGMMA", "QGMMA", "WARPGROUP.")


def _shape(text: str) -> tuple[int, int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"a shape is MxNxK (e.g. 1364x4096x1024), got {text!r}")
    return tuple(int(x) for x in m.groups())


def _opcode(source: str) -> str:
    """'@!P0  BRA 0x7f..' -> 'BRA' (predicate dropped, modifiers kept)."""
    s = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return s.split(" ")[0] if s else ""


def summarize(path: str, top: int = 25) -> dict:
    """Warp-stall samples of a Nsight Compute source-page CSV (`--page source --csv --print-source
    sass`): totals by stall reason and opcode, the wgmma and epilogue shares, the `top`
    instructions by samples."""
    if not isinstance(top, int) or top < 0:
        raise ValueError(f"top must be an int >= 0, got {top!r}")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Source" in r and "Warp Stall Sampling (All Samples)" in r), None)
    if header_at is None:
        raise ValueError(f"{path}: not an ncu source page (no 'Source' / 'Warp Stall Sampling (All Samples)' header)")
    hdr, data = rows[header_at], [r for r in rows[header_at + 1:] if len(r) == len(rows[header_at])]
    i_src, i_smp = hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)")
    i_exec = hdr.index("Instructions Executed") if "Instructions Executed" in hdr else None
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and not h.endswith("(Not Issued)")]

    def num(r, i):
        try:
            return int(float(r[i] or 0))
        except ValueError:
            return 0

    samples = [num(r, i_smp) for r in data]
    ops = [_opcode(r[i_src]) for r in data]
    total = sum(samples)
    by_reason = collections.Counter({hdr[i][len("stall_"):]: sum(num(r, i) for r in data) for i in reasons})
    by_op = collections.Counter()
    for op, s in zip(ops, samples):
        by_op[op] += s
    stores = [i for i, op in enumerate(ops) if op.startswith(_STORE_OPS)]
    epi = sum(samples[stores[0]:stores[-1] + 1]) if stores else None
    mma = sum(s for op, s in zip(ops, samples) if op.startswith(_MMA_OPS))

    order = sorted(range(len(data)), key=lambda i: -samples[i])[:top]
    return {
        "kernel": rows[0][1] if rows and len(rows[0]) > 1 and rows[0][0] == "Kernel Name" else "",
        "samples": total,
        "instructions_executed": sum(num(r, i_exec) for r in data) if i_exec is not None else None,
        "by_reason": dict(by_reason.most_common()),
        "by_opcode": dict(by_op.most_common(top)),
        "mma_share": mma / total if total else None,
        "epilogue_share": epi / total if total and epi is not None else None,
        "top": [(data[i][i_src].strip(), samples[i]) for i in order if samples[i]],
    }


# What the SpeedOfLight section gives per kernel, in the order the report lists them: elapsed
# against SM-active cycles is what a kernel's launch, ramp and tail cost besides its CTAs' work
# (sample counts alone hid a 15% cycle gap between two kernels with as many samples).
_SOL_METRICS = ("Elapsed Cycles", "SM Active Cycles", "Duration", "SM Frequency")


def speed_of_light(path: str) -> dict:
    """The SpeedOfLight figures of the first kernel in an ncu details page (`--page details
    --csv`): {metric: (value, unit)} for the metrics of _SOL_METRICS it holds."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or not {"Section Name", "Metric Name", "Metric Unit", "Metric Value"} <= set(rows[0]):
        raise ValueError(f"{path}: not an ncu details page (no Section / Metric Name / Unit / Value header)")
    hdr = rows[0]
    i_sec, i_name, i_unit, i_val = (hdr.index(h) for h in ("Section Name", "Metric Name", "Metric Unit", "Metric Value"))
    i_id = hdr.index("ID") if "ID" in hdr else None
    first = rows[1][i_id] if i_id is not None and len(rows) > 1 else None
    need = max(i_sec, i_name, i_unit, i_val) + 1  # rows leave out the trailing rule columns
    out = {}
    for r in rows[1:]:
        if len(r) < need or (i_id is not None and r[i_id] != first) or not r[i_sec].startswith("GPU Speed Of Light"):
            continue
        if r[i_name] in _SOL_METRICS:
            out[r[i_name]] = (float(r[i_val].replace(",", "")), r[i_unit])
    return out


def format_summary(name: str, s: dict, top: int = 12, sol: dict | None = None) -> str:
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    lines = [f"### {name}", "", f"kernel: `{s['kernel'][:120]}`", ""]
    if sol:
        lines += [", ".join(f"{k} {v:,.2f} {u}".replace(".00 ", " ") for k, (v, u) in sol.items()), ""]
    lines += [f"samples {s['samples']}, wgmma and its waits {pct(s['mma_share'])}, epilogue stores' span "
             f"{pct(s['epilogue_share'])}", "",
             "| stall reason | samples | share |", "|---|---|---|"]
    for k, v in list(s["by_reason"].items())[:top]:
        lines.append(f"| {k} | {v} | {pct(v / s['samples'] if s['samples'] else None)} |")
    lines += ["", "| opcode | samples |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in list(s["by_opcode"].items())[:top]]
    return "\n".join(lines) + "\n"


def _launch(provider: str, shape: tuple[int, int, int], label: str | None) -> None:
    """The profiled child: warm-up calls of one GEMM, then a few more (ncu picks one by --launch-skip)."""
    import torch

    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    if provider == "cublas":
        def call():
            return torch.nn.functional.linear(a, w)
    elif label:
        from cute_kernels.matmul.api import _alloc_out, run_gemm
        from cute_kernels.matmul.config import Epilogue

        from .tune_gemm import parse_label

        cfg, out = parse_label(label), _alloc_out(M, N, torch.bfloat16, "cuda")

        def call():
            return run_gemm(a, w, out, epi=Epilogue(), config=cfg)
    else:
        import cute_kernels as ck

        def call():
            return ck.linear(a, w)
    for _ in range(_WARMUP_CALLS + 3):
        call()
    torch.cuda.synchronize()


def _ncu() -> str:
    found = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not os.path.exists(found):
        raise SystemExit("error: Nsight Compute's ncu is not on the PATH nor at /usr/local/cuda/bin/ncu")
    return found


def run(shape: tuple[int, int, int], label: str | None, out_dir: str) -> str:
    from .common import require_hopper

    require_hopper("python -m benchmarks.gemm_profile run")
    ncu = _ncu()
    os.makedirs(out_dir, exist_ok=True)
    tag = "x".join(map(str, shape))
    parts = [f"# GEMM profile {tag} (bf16 `linear`; ours: {label or 'the dispatch pick'})", ""]
    for provider in ("cute", "cublas"):
        base = os.path.join(out_dir, f"{provider}_{tag}")
        cmd = [ncu, "--launch-skip", str(_SKIP), "--launch-count", "1", "-k", _KERNELS, "-f", "-o", base]
        for sec in _SECTIONS:
            cmd += ["--section", sec]
        cmd += [sys.executable, "-m", "benchmarks.gemm_profile", "_launch", provider, tag] + ([label] if label else [])
        subprocess.run(cmd, check=True)
        with open(base + "_sass.csv", "w") as f:
            subprocess.run([ncu, "-i", base + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                           check=True, stdout=f)
        with open(base + "_details.csv", "w") as f:
            subprocess.run([ncu, "-i", base + ".ncu-rep", "--page", "details", "--csv"], check=True, stdout=f)
        parts.append(format_summary(provider, summarize(base + "_sass.csv"), sol=speed_of_light(base + "_details.csv")))
    path = os.path.join(out_dir, f"profile_{tag}.md")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="profile ours and cuBLAS on one shape (ncu), then summarize both")
    r.add_argument("--shape", type=_shape, required=True)
    r.add_argument("--config", default=None, help="our config label (default: the dispatch pick)")
    r.add_argument("--out", default="gemm_profile_out")
    s = sub.add_parser("summarize", help="warp-stall samples of an ncu source-page CSV")
    s.add_argument("csv")
    s.add_argument("--top", type=int, default=25)
    launch = sub.add_parser("_launch", help=argparse.SUPPRESS)
    launch.add_argument("provider", choices=("cute", "cublas"))
    launch.add_argument("shape", type=_shape)
    launch.add_argument("label", nargs="?")
    args = p.parse_args(argv)
    if args.cmd == "_launch":
        _launch(args.provider, args.shape, args.label)
    elif args.cmd == "run":
        print("wrote", run(args.shape, args.config, args.out))
    else:
        print(format_summary(os.path.basename(args.csv), summarize(args.csv, args.top), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
