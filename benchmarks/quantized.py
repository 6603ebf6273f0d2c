"""FP8 and INT8 GEMM suite, plus the quantize kernels, all providers in one run.

    python -m benchmarks.quantized [--kind fp8|int8|all] [--quick]

FP8: ours vs cuBLASLt (torch._scaled_mm), per-tensor and per-row scales, bf16 out,
both with use_fast_accum=True (plus promoted accumulation on the square shapes), and
1 x 128 / 128 x 128 block scales (`scaled_mm_blockwise` vs cuBLASLt's blockwise mode). INT8: ours (raw int32) vs torch._int_mm. The Triton
baselines join when importable. Quantize: GB/s of quant.quantize_fp8/int8 against a
device-to-device copy of the same bytes. Writes benchmarks/results/{fp8,int8}_<gpu>.json.
"""

from __future__ import annotations

import argparse

import torch

from .common import (
    PEAK_TFLOPS,
    Row,
    format_table,
    geomean,
    require_hopper,
    rotation_count,
    speedups,
    time_ms,
    write_results,
)
from .gemm import SQUARE, SUITE

E4M3 = torch.float8_e4m3fn


def _fp8_inputs(M, N, K, rowwise):
    a = torch.randn(M, K, device="cuda").to(E4M3)
    b = torch.randn(N, K, device="cuda").to(E4M3).t()
    sa = torch.rand(M, 1, device="cuda") + 0.5 if rowwise else torch.rand((), device="cuda") + 0.5
    sb = torch.rand(1, N, device="cuda") + 0.5 if rowwise else torch.rand((), device="cuda") + 0.5
    return a, b, sa, sb


def run_fp8(shapes=SUITE):
    import cute_kernels as ck

    providers = {
        "cute": lambda a, b, sa, sb: ck.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True),
        "cublas": lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True),
    }
    try:
        from baselines.triton import scaled_mm as tri

        providers["triton"] = lambda a, b, sa, sb: tri(a, b, sa, sb, out_dtype=torch.bfloat16)
    except Exception as e:
        print("[fp8] triton baseline unavailable:", e)
    precise = {
        "cute": lambda a, b, sa, sb: ck.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=False),
        "cublas": lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=False),
    }
    rows = []
    # Fast accumulation on every shape (both granularities); precise (promoted) accumulation
    # on the square shapes, where K is long enough for it to matter.
    plan = [(rw, s, providers, "") for rw in (False, True) for s in shapes]
    plan += [(True, s, precise, "precise-") for s in shapes if s[0] == s[1] == s[2]]
    for rowwise, (M, N, K), provs, tag in plan:
        sets = [_fp8_inputs(M, N, K, rowwise) for _ in range(rotation_count(M * K + N * K + 2 * M * N))]
        rows += _time_checked(f"fp8-{tag}{'row' if rowwise else 'tensor'}-{M}x{N}x{K}", (M, N, K), provs, sets,
                              lambda: ck.scaled_mm_ref(*sets[0], out_dtype=torch.float32))
        del sets
    return rows


def _time_checked(case, mnk, provs, sets, make_ref, kind="fp8"):
    """Check each provider against the reference on sets[0] (fp8: 2% relative to the fp32
    reference; int8: bit-exact), then time it over the rotated input sets; a provider that
    fails or is wrong gets no row."""
    M, N, K = mnk
    rows, ref = [], None
    for name, fn in provs.items():
        try:
            out = fn(*sets[0])
            ref = make_ref() if ref is None else ref
            if kind == "int8":
                if not torch.equal(out, ref):
                    print(f"[int8] {name} {case}: WRONG (not bit-exact); not timed")
                    continue
            else:
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                if not err < 2e-2:
                    print(f"[fp8] {name} {case}: WRONG (rel err {err:.3g})")
                    continue
            ms = time_ms(lambda i: fn(*sets[i]), n_rotate=len(sets))
        except Exception as e:
            print(f"[{kind}] {name} {case} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        tf = 2 * M * N * K / ms / 1e9
        rows.append(Row(case, name, ms, tf, 100 * tf / PEAK_TFLOPS[kind]))
    return rows


def _block_inputs(M, N, K):
    import quant

    a, sa = quant.quantize_fp8(torch.randn(M, K, device="cuda"), "block")  # sa M-major [M, K/128]
    b, sb = quant.quantize_weight_fp8_block(torch.randn(N, K, device="cuda"))
    # cuBLASLt's 128 x 128 scales for b = w.t() are [K/128, N/128], K/128 innermost, 16-byte strides
    kb = sb.shape[1]
    buf = torch.empty(sb.shape[0], -(-kb // 4) * 4, device="cuda")
    buf[:, :kb] = sb
    return a, b, sa, sb, buf[:, :kb].t()


def run_fp8_block(shapes=SUITE):
    """DeepSeek-V3-style block scales (1 x 128 activations, 128 x 128 weights): ours vs
    cuBLASLt's Hopper blockwise `torch._scaled_mm`, which refuses K/128 not a multiple
    of 4 (GPT-2's K = 1600 / 6400); those cases have no cublas row."""
    import cute_kernels as ck

    providers = {
        "cute": lambda a, b, sa, sb, sbt: ck.scaled_mm_blockwise(a, b, sa, sb),
        "cublas": lambda a, b, sa, sb, sbt: torch._scaled_mm(a, b.t(), sa, sbt, out_dtype=torch.bfloat16),
    }
    rows = []
    for M, N, K in shapes:
        sets = [_block_inputs(M, N, K) for _ in range(rotation_count(M * K + N * K + 2 * M * N))]
        rows += _time_checked(f"fp8-block-{M}x{N}x{K}", (M, N, K), providers, sets,
                              lambda: ck.scaled_mm_blockwise_ref(*sets[0][:4], out_dtype=torch.float32))
        del sets
    return rows


def run_int8(shapes=SUITE):
    import cute_kernels as ck

    providers = {"cute": lambda a, b: ck.int8_mm(a, b), "cublas": torch._int_mm}
    try:
        from baselines.triton import int8_mm as tri

        providers["triton"] = tri
    except Exception as e:
        print("[int8] triton baseline unavailable:", e)
    rows = []
    for (M, N, K) in shapes:
        sets = [(torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8),
                 torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8).t())
                for _ in range(rotation_count(M * K + N * K + 4 * M * N))]
        rows += _time_checked(f"int8-{M}x{N}x{K}", (M, N, K), providers, sets, lambda: torch._int_mm(*sets[0]),
                              kind="int8")
        del sets
    return rows


def run_quantize(kind: str):
    """GB/s of the quantize kernels vs a device copy of the same bytes."""
    rows = []
    try:
        import quant
    except Exception as e:
        print("[quantize] quant package unavailable:", e)
        return rows
    for (M, K) in ((8192, 4096), (8192, 8192), (512, 768)):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        case = f"quantize-{kind}-{M}x{K}"
        copy_ms = time_ms(lambda i: y.copy_(x))
        rows.append(Row(case, "copy", copy_ms, gbps=2 * x.numel() * 2 / copy_ms / 1e6))
        for gran in ("row", "tensor", "block"):
            fn = (lambda: quant.quantize_fp8(x, granularity=gran)) if kind == "fp8" else (lambda: quant.quantize_int8(x, granularity=gran))
            try:
                fn()
                ms = time_ms(lambda i: fn())
            except Exception as e:
                print(f"[quantize] {kind} {gran} failed: {type(e).__name__}: {e}")
                continue
            nbytes = x.numel() * 3  # read bf16, write 8-bit (scales are negligible)
            rows.append(Row(case, f"cute-{gran}", ms, gbps=nbytes / ms / 1e6,
                            extra={"pct_of_copy_bw": 100 * (nbytes / ms) / (2 * x.numel() * 2 / copy_ms)}))
    return rows


def summarize(rows, kind):
    s = {}
    gemm_rows = [r for r in rows if r.tflops is not None]
    if kind == "fp8":
        for g in ("tensor", "row", "block"):
            sub = [r for r in gemm_rows if r.case.startswith(f"fp8-{g}")]
            sp = speedups(sub, "cute", "cublas")
            if sp:
                s[f"geomean_speedup_vs_cublas[{g}]"] = geomean(list(sp.values()))
    # The bar is over the tensor and row granularities; block is reported on its own.
    sp = speedups([r for r in gemm_rows if not r.case.startswith("fp8-block")], "cute", "cublas")
    if sp:
        s["geomean_speedup_vs_cublas"] = geomean(list(sp.values()))
    tri = speedups(gemm_rows, "cute", "triton")
    if tri:
        s["geomean_speedup_vs_triton"] = geomean(list(tri.values()))
    for r in rows:
        if r.case.endswith("8192x8192x8192") and r.provider == "cute":
            s[f"{r.case}_tflops"] = r.tflops
        if "pct_of_copy_bw" in r.extra and "8192x8192" in r.case:
            s[f"{r.case}[{r.provider}]_pct_of_copy_bw"] = r.extra["pct_of_copy_bw"]
    return s


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kind", default="all", choices=["fp8", "int8", "all"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    require_hopper("python -m benchmarks.quantized")
    shapes = SQUARE if args.quick else SUITE
    out = {}
    for kind in (["fp8", "int8"] if args.kind == "all" else [args.kind]):
        rows = (run_fp8(shapes) + run_fp8_block(shapes) if kind == "fp8" else run_int8(shapes)) + run_quantize(kind)
        summary = summarize(rows, kind)
        print(format_table(rows))
        for k, v in summary.items():
            print(f"{k}: {v:.3f}")
        if not args.no_write:
            print("wrote", write_results(kind, rows, summary))
        out[kind] = (rows, summary)
    return out


if __name__ == "__main__":
    main()
