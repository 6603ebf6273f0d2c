"""Roofline of the suite on this machine: measured ceilings, then every kernel placed on them.

    python -m benchmarks.roofline [--out DIR]

Ceilings measured here: device-to-device copy bandwidth (bytes read + written), the
bf16 matmul peak (torch.mm at 8192^3) and the fp8 peak (torch._scaled_mm at 8192^3),
drawn next to the datasheet ones. Points: our bf16/fp8/int8 GEMMs on several shapes,
the quantize kernels, and the attention baseline. Arithmetic intensity counts the
fewest bytes a kernel must move (each input read once, the output written once).
Writes benchmarks/results/roofline_<gpu>.json and .png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .common import PEAK_TFLOPS, RESULTS_DIR, gpu_name, gpu_tag, require_hopper, rotation_count, time_ms

GEMM_SHAPES = [(512, 768, 768), (512, 3072, 768), (8192, 768, 768), (8192, 3072, 768), (4096, 4096, 4096), (8192, 8192, 8192)]


def measure_ceilings() -> dict:
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")  # 256 MiB, far past L2
    y = torch.empty_like(x)
    ms = time_ms(lambda i: y.copy_(x))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bf16_ms = time_ms(lambda i: torch.mm(a, b))
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.ones((), device="cuda")
    fp8_ms = time_ms(lambda i: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=True))
    flops = 2 * 8192**3
    return {
        "copy_tbps": 2 * x.numel() / ms / 1e9,
        "bf16_tflops": flops / bf16_ms / 1e9,
        "fp8_tflops": flops / fp8_ms / 1e9,
    }


def _point(name, kind, flops, nbytes, ms):
    return {"name": name, "kind": kind, "ai": flops / nbytes, "tflops": flops / ms / 1e9, "ms": ms}


def measure_points() -> list[dict]:
    import cute_kernels as ck

    pts = []
    for (M, N, K) in GEMM_SHAPES:
        nrot = rotation_count((M * K + N * K + M * N) * 2)
        A = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
        B = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t() for _ in range(nrot)]
        ms = time_ms(lambda i: ck.gemm(A[i], B[i]), n_rotate=nrot)
        pts.append(_point(f"bf16 {M}x{N}x{K}", "bf16", 2 * M * N * K, 2 * (M * K + N * K + M * N), ms))
        A8 = [t.to(torch.float8_e4m3fn) for t in A]
        B8 = [t.t().contiguous().to(torch.float8_e4m3fn).t() for t in B]
        sa, sb = torch.ones(M, 1, device="cuda"), torch.ones(1, N, device="cuda")
        ms = time_ms(lambda i: ck.scaled_mm(A8[i], B8[i], sa, sb, use_fast_accum=True), n_rotate=nrot)
        pts.append(_point(f"fp8 {M}x{N}x{K}", "fp8", 2 * M * N * K, M * K + N * K + 2 * M * N, ms))
        I8 = [torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8) for _ in range(nrot)]
        W8 = [torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8).t() for _ in range(nrot)]
        ms = time_ms(lambda i: ck.int8_mm(I8[i], W8[i]), n_rotate=nrot)
        pts.append(_point(f"int8 {M}x{N}x{K}", "int8", 2 * M * N * K, M * K + N * K + 4 * M * N, ms))
        del A, B, A8, B8, I8, W8
    try:
        import quant

        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        ms = time_ms(lambda i: quant.quantize_fp8(x, granularity="row"))
        # ~4 flops per element (abs, max, scale, clamp): memory-bound by construction.
        pts.append(_point("quantize fp8 row 8192^2", "quantize", 4 * x.numel(), 3 * x.numel(), ms))
    except Exception as e:
        print("[roofline] quantize skipped:", e)
    try:
        from baselines.triton import flash_attn

        for (B, H, S, D) in ((16, 12, 1024, 64), (2, 16, 8192, 128)):
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            ms = time_ms(lambda i: flash_attn(q, k, v, causal=True))
            flops = 4 * B * H * S * S * D / 2
            pts.append(_point(f"attn (triton) causal {B}x{H}x{S}x{D}", "attention", flops, 4 * q.numel() * 2, ms))
    except Exception as e:
        print("[roofline] attention skipped:", e)
    return pts


def plot(ceil: dict, pts: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[roofline] matplotlib not installed: no picture")
        return False
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ai = np.logspace(-1, 4, 200)
    for label, bw, peak, style in (
        ("measured bf16", ceil["copy_tbps"], ceil["bf16_tflops"], "-"),
        ("measured fp8", ceil["copy_tbps"], ceil["fp8_tflops"], "-"),
        ("datasheet bf16", PEAK_TFLOPS["bf16"], ":"),
        ("datasheet fp8/int8", PEAK_TFLOPS["fp8"], ":"),
    ):
        ax.plot(ai, np.minimum(ai * bw, peak), style, label=f"{label} ({peak:.0f} TFLOP/s, {bw:.2f} TB/s)")
    markers = {"bf16": "o", "fp8": "s", "int8": "^", "quantize": "D", "attention": "*"}
    for kind in markers:
        sel = [p for p in pts if p["kind"] == kind]
        if sel:
            ax.scatter([p["ai"] for p in sel], [p["tflops"] for p in sel], marker=markers[kind], label=kind, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of compulsory traffic)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"Roofline on {gpu_name()}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(RESULTS_DIR))
    args = p.parse_args(argv)
    require_hopper("python -m benchmarks.roofline")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceil = measure_ceilings()
    pts = measure_points()
    print(f"ceilings: copy {ceil['copy_tbps']:.2f} TB/s, bf16 {ceil['bf16_tflops']:.0f} TFLOP/s, fp8 {ceil['fp8_tflops']:.0f} TFLOP/s")
    for pt in pts:
        print(f"  {pt['name']:<40} AI {pt['ai']:8.1f}  {pt['tflops']:8.1f} TFLOP/s")
    tag = gpu_tag()
    (out / f"roofline_{tag}.json").write_text(json.dumps({"gpu": gpu_name(), "ceilings": ceil, "points": pts}, indent=1))
    if plot(ceil, pts, out / f"roofline_{tag}.png"):
        print("wrote", out / f"roofline_{tag}.png")


if __name__ == "__main__":
    main()
