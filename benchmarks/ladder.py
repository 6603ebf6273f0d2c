"""The GEMM ladder: what each optimisation step buys at 4096^3 bf16, in one run.

    python -m benchmarks.ladder [--size 4096] [--no-write] [--no-chart]

Rungs, slowest first: the four CUDA C++ kernels of baselines.wmma (naive ->
shared-memory tiles -> register tiles -> WMMA tensor cores), then the autotuned
Triton kernel, cuBLAS (torch.mm) and ours (cute_kernels.gemm). Every provider
gets the same row-major A [M, K] and B [K, N] and returns bf16; each result is
checked against torch.mm before it is timed. Prints TFLOP/s, % of the dense
bf16 peak and the speedup over the previous rung; writes
benchmarks/results/ladder_<gpu>.{json,md} and a bar chart ladder_<gpu>.png.
"""

from __future__ import annotations

import argparse

import torch

from .common import PEAK_TFLOPS, Row, require_hopper, rotation_count, time_ms, write_results

LABELS = {
    "naive": "CUDA naive",
    "smem": "CUDA smem tiles",
    "regtile": "CUDA register tiles",
    "wmma": "CUDA WMMA",
    "triton": "Triton (autotuned)",
    "cublas": "cuBLAS (torch.mm)",
    "cute": "ours (cute_kernels)",
}
ORDER = tuple(LABELS)


def _providers() -> tuple[dict, list[str]]:
    """name -> fn(a, b), in ladder order, plus notes on providers that are unavailable."""
    fns, notes = {}, []
    try:
        from baselines import wmma

        wmma.build()  # compile once up front (about a minute the first time), not inside a timing
        for rung in wmma.RUNGS:
            fns[rung] = lambda a, b, rung=rung: wmma.gemm(a, b, rung=rung)
    except Exception as e:  # no nvcc/ninja: the ladder still shows the rest
        notes.append(f"CUDA ladder rungs skipped: {type(e).__name__}: {e}")
    try:
        from baselines.triton import gemm as triton_gemm

        fns["triton"] = triton_gemm
    except Exception as e:
        notes.append(f"triton skipped: {type(e).__name__}: {e}")
    fns["cublas"] = torch.mm
    try:
        from cute_kernels import gemm as cute_gemm

        fns["cute"] = cute_gemm
    except Exception as e:
        notes.append(f"ours (cute_kernels.gemm) skipped: {type(e).__name__}: {e}")
    return {k: fns[k] for k in ORDER if k in fns}, notes


def run(size: int = 4096, dtype=torch.bfloat16) -> tuple[list[Row], list[str]]:
    M = N = K = size
    case = f"{M}x{N}x{K}"
    fns, notes = _providers()
    nrot = rotation_count((M * K + K * N + M * N) * 2)
    As = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in range(nrot)]
    Bs = [torch.randn(K, N, device="cuda", dtype=dtype) for _ in range(nrot)]
    ref = torch.mm(As[0].float(), Bs[0].float())
    scale = ref.abs().max().item()
    rows: list[Row] = []
    prev = None
    for name, fn in fns.items():
        try:
            err = (fn(As[0], Bs[0]).float() - ref).abs().max().item() / scale
            if not err < 2e-2:
                notes.append(f"{name}: WRONG result (max error {err:.3g} of max |C|); not timed")
                print(f"[ladder] {notes[-1]}")
                continue
            ms = time_ms(lambda i: fn(As[i], Bs[i]), n_rotate=nrot)
        except Exception as e:
            notes.append(f"{name} failed: {type(e).__name__}: {e}")
            print(f"[ladder] {notes[-1]}")
            continue
        tflops = 2 * M * N * K / ms / 1e9
        extra = {"label": LABELS[name], "max_rel_err": err}
        if prev is not None:
            extra["speedup_vs_prev"] = prev.ms / ms
            extra["prev"] = prev.provider
        row = Row(case, name, ms, tflops, 100 * tflops / PEAK_TFLOPS["bf16"], extra=extra)
        rows.append(row)
        prev = row
        print(f"[ladder] {LABELS[name]:<22} {tflops:8.1f} TFLOP/s")
    return rows, notes


def ladder_table(rows: list[Row]) -> str:
    head = f"| {'rung':<22} | {'ms':>9} | {'TFLOP/s':>8} | {'% peak':>6} | {'x prev':>7} |"
    lines = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        sp = r.extra.get("speedup_vs_prev")
        lines.append(
            f"| {r.extra['label']:<22} | {r.ms:9.3f} | {r.tflops:8.1f} | {r.pct_peak:6.1f} | "
            f"{(f'{sp:.2f}x' if sp else '-'):>7} |"
        )
    return "\n".join(lines)


def summarize(rows: list[Row]) -> dict:
    t = {r.provider: r for r in rows}
    summary = {f"tflops[{r.provider}]": r.tflops for r in rows}
    summary.update({f"pct_peak[{r.provider}]": r.pct_peak for r in rows})
    if "cublas" in t:
        for other in ("wmma", "triton", "cute"):
            if other in t:
                summary[f"{other}_vs_cublas"] = t["cublas"].ms / t[other].ms
    if "naive" in t and rows:
        summary["best_vs_naive"] = t["naive"].ms / min(r.ms for r in rows)
    return summary


def chart(rows: list[Row], path) -> bool:
    """Horizontal bars of TFLOP/s on a log axis (the rungs span ~3 orders of magnitude)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[ladder] matplotlib not installed: no chart (pip install matplotlib)")
        return False
    labels = [r.extra["label"] for r in rows]
    values = [r.tflops for r in rows]
    colors = ["#4c72b0" if r.provider in ("naive", "smem", "regtile", "wmma") else "#dd8452" for r in rows]
    for i, r in enumerate(rows):
        if r.provider == "cute":
            colors[i] = "#55a868"
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.5))
    y = list(range(len(rows)))[::-1]
    ax.barh(y, values, color=colors)
    ax.set_yticks(y, labels)
    ax.set_xscale("log")
    ax.set_xlabel("TFLOP/s (log scale)")
    peak = PEAK_TFLOPS["bf16"]
    ax.axvline(peak, color="gray", ls="--", lw=1)
    ax.text(peak * 1.05, max(y) + 0.45, "dense peak", color="gray", va="center", fontsize=8)
    for yi, r in zip(y, rows):
        sp = r.extra.get("speedup_vs_prev")
        pct = f"{r.pct_peak:.1f}%" if r.pct_peak < 10 else f"{r.pct_peak:.0f}%"
        ax.text(r.tflops * 1.05, yi, f"{r.tflops:.1f} ({pct})" + (f", {sp:.1f}x" if sp else ""), va="center",
                fontsize=8)
    ax.set_xlim(left=min(values) / 2, right=peak * 4)
    ax.set_title(f"bf16 GEMM {rows[0].case} on {torch.cuda.get_device_name(0)}")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=4096, help="M = N = K (multiple of 256)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--no-chart", action="store_true")
    args = p.parse_args(argv)
    require_hopper("python -m benchmarks.ladder")
    rows, notes = run(args.size)
    summary = summarize(rows)
    print(ladder_table(rows))
    for n in notes:
        print("note:", n)
    if not args.no_write and rows:
        text = (
            "A [M, K] and B [K, N] row-major bf16, bf16 out, fp32 accumulation; CUDA-graph device time, "
            "inputs rotated past L2. 'x prev' is the speedup over the row above.\n\n"
            + ladder_table(rows)
            + ("\n\nNotes:\n" + "\n".join(f"- {n}" for n in notes) if notes else "")
        )
        jpath = write_results("ladder", rows, summary, notes=text)
        print("wrote", jpath)
        if not args.no_chart and chart(rows, jpath.with_suffix(".png")):
            print("wrote", jpath.with_suffix(".png"))
    return rows, summary


if __name__ == "__main__":
    main()
