"""Attention suite: prefill TFLOP/s and decode KV bandwidth, all providers in one run.

    python -m benchmarks.attention [--quick] [--no-write] [--decode]
    python -m benchmarks.attention --wide [--head-dims 64,128] [--seqlens 512,...] [--gqa 1,4,8] [--merge]
        [--providers cute,cudnn,fa4]

Providers: ours (`cute`), SDPA with the
cuDNN backend (`cudnn`) and the flash backend (`sdpa_flash`), the Triton baseline, and
FlashAttention-4 (`fa4`) when importable. Prefill FLOPs: 4*B*H*S^2*D (causal counts half).
Decode (one query token against a cache of L keys): GB/s of K and V read, and % of HBM
bandwidth. Peak extra memory per call is reported to show O(S) memory. Prefill providers are
timed in PREFILL_ROUNDS rounds per case, the order reversed every other round; a row is the
median over them.
Writes benchmarks/results/attention_<gpu>.json and .md.

--wide: the prefill shapes Llama-family models run: head dim {64, 128} x S {512 ... 16384} x
causal / not x GQA ratio {1, 4, 8} (32 query heads on 32 / 8 / 4 KV heads), batch sized to
about 16k tokens. Each shape's `speedup_vs_best_peer` is ours against the faster of cuDNN and
FA4 (whichever ran), the figure a user choosing between them would see
(attention_wide_<gpu>.*). --merge keeps the other cases already in that file for this GPU, so
the suite can run in parts (one head dim per process) and be summarized whole.

--fp8: `flash_attn_fp8` (`cute_fp8`: e4m3 Q, K, V with per-(batch, KV head) descales, bf16 O)
against our bf16 kernel and cuDNN's bf16 SDPA on the same shapes (head dim {64, 128} x S {4096,
8192, 16384} x causal / not, 32 query heads on 32 or 8 KV heads, ~16k tokens). Each fp8 row
records its max error against the fp64 reference of the dequantized inputs and that of an fp32
emulation of the same quantization (`flash_attn_fp8_emulated`), on the first batch / query head
(attention_fp8_<gpu>.*). `cute_fp8_quant` times the call a caller holding bf16 Q, K, V makes:
`quantize_qkv_fp8` (per-(batch, KV head) amax descales) and then `flash_attn_fp8`.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from cute_kernels.tune import _ints as int_list  # the package CLI's comma-separated integers

from .common import (
    PEAK_TFLOPS,
    Row,
    format_table,
    geomean,
    peak_tbps,
    require_hopper,
    speedups,
    time_ms,
    write_results,
)

PREFILL = [(2, 16, 8192, 128), (8, 16, 2048, 128), (16, 12, 1024, 64), (4, 32, 4096, 64), (8, 25, 1024, 64)]
WIDE_HEAD_DIMS = (64, 128)
WIDE_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
WIDE_GQA = (1, 4, 8)
WIDE_TOKENS = 16384
WIDE_HEADS = 32
BEST_PEERS = ("cudnn", "fa4")  # a user picks the faster of these for their shape
PREFILL_ROUNDS = 2


def wide_shapes(head_dims=WIDE_HEAD_DIMS, seqlens=WIDE_SEQLENS, gqa=WIDE_GQA) -> list[tuple[int, int, int, int, int]]:
    """(B, Hq, Hkv, S, D) of the widened suite: batch B = WIDE_TOKENS // S (at least 1)."""
    for r in gqa:
        if r < 1 or WIDE_HEADS % r:
            raise ValueError(f"a GQA ratio divides {WIDE_HEADS} query heads, got {r}")
    return [(max(1, WIDE_TOKENS // S), WIDE_HEADS, WIDE_HEADS // r, S, D) for D in head_dims for S in seqlens for r in gqa]
DECODE = [(b, L, hq, hkv, d) for b in (1, 8, 64) for L in (1024, 8192, 32768) for (hq, hkv, d) in ((12, 12, 64), (32, 8, 128))]
# Llama 3 70B's and Qwen2.5 7B's GQA (8 and 7 query heads a KV head) at small batches: few CTAs,
# so the key splits and their merge decide.
DECODE += [(b, L, hq, hkv, 128) for b in (1, 4) for L in (2048, 8192) for (hq, hkv) in ((64, 8), (28, 4))]


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[backend]

    def fn(q, k, v, causal):
        rep = q.shape[2] // k.shape[2]
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=rep > 1).transpose(1, 2)

    return fn


PROVIDER_NAMES = ("cute", "cudnn", "sdpa_flash", "triton", "fa4")


def providers():
    out = {}
    try:
        import cute_kernels as ck

        out["cute"] = lambda q, k, v, causal: ck.flash_attn(q, k, v, causal=causal)
    except Exception as e:
        print("[attn] cute unavailable:", e)
    out["cudnn"] = _sdpa("cudnn")
    out["sdpa_flash"] = _sdpa("sdpa_flash")
    try:
        from baselines.triton import flash_attn as tri

        out["triton"] = lambda q, k, v, causal: tri(q, k, v, causal=causal)
    except Exception as e:
        print("[attn] triton baseline unavailable:", e)
    try:
        from flash_attn.cute import flash_attn_func

        def fa4(q, k, v, causal):
            out = flash_attn_func(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out  # (out, lse) in some versions

        out["fa4"] = fa4
    except Exception as e:
        print("[attn] FlashAttention-4 unavailable:", e)
    return out


def _run_one(name, fn, q, k, v, causal, ref, timed=True):
    """Check fn against ref, measure its extra memory, and (timed) its median ms."""
    try:
        out = fn(q, k, v, causal)
        out = out[0] if isinstance(out, tuple) else out
        err = (out.float() - ref).abs().max().item()
        if not err < 5e-2:
            print(f"[attn] {name}: WRONG (max err {err:.3g}); not timed")
            return None, None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn(q, k, v, causal)
        torch.cuda.synchronize()
        extra_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
        return (time_ms(lambda i: fn(q, k, v, causal)) if timed else 0.0), extra_mb
    except Exception as e:
        print(f"[attn] {name} failed: {type(e).__name__}: {str(e)[:200]}")
        return None, None


def run_prefill(shapes=PREFILL, rounds: int = PREFILL_ROUNDS, only: tuple[str, ...] | None = None):
    """shapes: (B, H, S, D), or (B, Hq, Hkv, S, D) for grouped-query attention; only: the
    providers to time (None: all).

    Each case checks every provider once, then times them in `rounds` rounds, the order
    reversed every other round (A B C, C B A, ...), so that a clock or temperature drift over
    the case weighs on every provider alike; a row's ms is the median over the rounds."""
    from cute_kernels.attention.reference import flash_attn_ref

    fns, rows = {k: v for k, v in providers().items() if only is None or k in only}, []
    for shape in shapes:
        B, H, Hkv, S, D = shape if len(shape) == 5 else (shape[0], shape[1], shape[1], *shape[2:])
        heads = f"{H}" if Hkv == H else f"{H}/{Hkv}"
        for causal in (False, True):
            case = f"prefill-{B}x{heads}x{S}x{D}{'-causal' if causal else ''}"
            q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            # The fp32 reference materialises S x S: check on the first batch / query head (which
            # reads KV head 0) only.
            ref = flash_attn_ref(q[:1, :, :1].float(), k[:1, :, :1].float(), v[:1, :, :1].float(), causal=causal)
            ok = {}
            for name, fn in fns.items():
                check = lambda q_, k_, v_, c_, fn=fn: fn(q_, k_, v_, c_)[:1, :, :1]  # noqa: E731
                ms, extra = _run_one(name, check, q, k, v, causal, ref, timed=False)
                if ms is not None:
                    ok[name] = (check, extra)
            times: dict[str, list[float]] = {name: [] for name in ok}
            for r in range(rounds):
                for name in (list(ok) if r % 2 == 0 else list(ok)[::-1]):
                    check = ok[name][0]
                    times[name].append(time_ms(lambda i, check=check: check(q, k, v, causal)))
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            for name, (_, extra) in ok.items():
                ms = statistics.median(times[name])
                tf = flops / ms / 1e9
                rows.append(Row(case, name, ms, tf, 100 * tf / PEAK_TFLOPS["bf16"],
                                extra={"extra_mem_mb": round(extra, 1), "times_ms": [round(t, 5) for t in times[name]]}))
            del q, k, v
            torch.cuda.empty_cache()
    return rows


FP8_SEQLENS = (4096, 8192, 16384)


def run_fp8(head_dims=WIDE_HEAD_DIMS, seqlens=FP8_SEQLENS, gqa=(1, 8)):
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_fp8_emulated, flash_attn_fp8_ref

    peers = {k: v for k, v in providers().items() if k in ("cute", "cudnn")}
    rows = []
    for B, H, Hkv, S, D in wide_shapes(head_dims, seqlens, gqa):
        for causal in (False, True):
            case = f"prefill-{B}x{H}/{Hkv}x{S}x{D}{'-causal' if causal else ''}"
            f8 = torch.float8_e4m3fn
            q8 = torch.randn(B, S, H, D, device="cuda").to(f8)
            k8, v8 = (torch.randn(B, S, Hkv, D, device="cuda").to(f8) for _ in range(2))
            qd, kd, vd = (torch.rand(B, Hkv, device="cuda") * 0.5 + 0.5 for _ in range(3))
            kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
            # bf16 inputs that hold the same (dequantized) values, for the 16-bit providers
            rep = H // Hkv
            q, k, v = ((t.float() * d.repeat_interleave(r, 1)[:, None, :, None]).to(torch.bfloat16)
                       for t, d, r in ((q8, qd, rep), (k8, kd, 1), (v8, vd, 1)))
            first = dict(q_descale=qd[:1, :1], k_descale=kd[:1, :1], v_descale=vd[:1, :1], causal=causal)
            ref64 = flash_attn_fp8_ref(q8[:1, :, :1], k8[:1, :, :1], v8[:1, :, :1], **first)
            ref = ref64.float()
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            for name, fn in peers.items():
                check = lambda q_, k_, v_, c_, fn=fn: fn(q_, k_, v_, c_)[:1, :, :1]  # noqa: E731
                ms, _ = _run_one(name, check, q, k, v, causal, ref)
                if ms is not None:
                    tf = flops / ms / 1e9
                    rows.append(Row(case, name, ms, tf, 100 * tf / PEAK_TFLOPS["bf16"]))
            try:
                out = ck.flash_attn_fp8(q8, k8, v8, **kw)
                emu = flash_attn_fp8_emulated(q8[:1, :, :1], k8[:1, :, :1], v8[:1, :, :1], **first)
                err = (out[:1, :, :1].double() - ref64).abs().max().item()
                err_emu = (emu.double() - ref64).abs().max().item()
                ms = time_ms(lambda i: ck.flash_attn_fp8(q8, k8, v8, **kw))
                tf = flops / ms / 1e9
                rows.append(Row(case, "cute_fp8", ms, tf, 100 * tf / PEAK_TFLOPS["fp8"],
                                extra={"max_err": err, "max_err_fp32_emulation": err_emu}))
            except Exception as e:  # noqa: BLE001 - one failing shape must not stop the suite
                print(f"[attn] cute_fp8 failed on {case}: {type(e).__name__}: {str(e)[:200]}")
            try:  # what swapping our bf16 kernel for the fp8 one costs a caller holding bf16 Q, K, V
                def quantized(i, q=q, k=k, v=v, causal=causal):
                    q8_, k8_, v8_, qd_, kd_, vd_ = ck.quantize_qkv_fp8(q, k, v)
                    return ck.flash_attn_fp8(q8_, k8_, v8_, q_descale=qd_, k_descale=kd_, v_descale=vd_, causal=causal)

                ms = time_ms(quantized)
                tf = flops / ms / 1e9
                rows.append(Row(case, "cute_fp8_quant", ms, tf, 100 * tf / PEAK_TFLOPS["fp8"]))
            except Exception as e:  # noqa: BLE001
                print(f"[attn] cute_fp8_quant failed on {case}: {type(e).__name__}: {str(e)[:200]}")
            del q8, k8, v8, q, k, v
            torch.cuda.empty_cache()
    return rows


def summarize_fp8(rows):
    s = {}
    for provider, key in (("cute_fp8", "fp8"), ("cute_fp8_quant", "fp8_quant")):
        sp = speedups(rows, provider, "cute")
        if not sp:
            continue
        s[f"geomean_speedup_{key}_vs_bf16"] = geomean(list(sp.values()))
        long128 = [v for c, v in sp.items() if "x128" in c and int(c.split("x")[-2]) >= 4096]
        if long128:
            s[f"geomean_speedup_{key}_vs_bf16[d128,S>=4096]"] = geomean(long128)
            if key == "fp8":
                s["min_speedup_fp8_vs_bf16[d128,S>=4096]"] = min(long128)
    sc = speedups(rows, "cute_fp8", "cudnn")
    if sc:
        s["geomean_speedup_fp8_vs_cudnn_bf16"] = geomean(list(sc.values()))
    ratios = [r.extra["max_err"] / max(r.extra["max_err_fp32_emulation"], 1e-30) for r in rows if r.provider == "cute_fp8"]
    if ratios:
        s["max_err_ratio_vs_fp32_emulation"] = max(ratios)
    return s


def run_decode(shapes=DECODE):
    from cute_kernels.attention.reference import flash_attn_ref

    fns, rows = providers(), []
    for (B, L, hq, hkv, D) in shapes:
        case = f"decode-b{B}-L{L}-h{hq}/{hkv}-d{D}"
        q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, L, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        # One query token sees the whole cache: no mask (SDPA's is_causal would align it
        # top-left and keep only key 0). The fp32 reference runs on the first sequence.
        ref = flash_attn_ref(q[:1].float(), k[:1].float(), v[:1].float())
        kv_bytes = 2 * k.numel() * k.element_size()
        for name, fn in fns.items():
            if name == "fa4":
                continue  # FA4's decode path is not its forward entry point
            check = lambda q_, k_, v_, c_, fn=fn: fn(q_, k_, v_, c_)[:1]  # noqa: E731
            ms, extra = _run_one(name, check, q, k, v, False, ref)
            if ms is None:
                continue
            gbps = kv_bytes / ms / 1e6
            rows.append(Row(case, name, ms, gbps=gbps, extra={"pct_hbm": round(100 * gbps / (peak_tbps() * 1e3), 1),
                                                              "extra_mem_mb": round(extra, 1)}))
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def best_peer_speedups(rows) -> dict[str, float]:
    """Per case: the faster of the BEST_PEERS that ran, over ours."""
    ours = {r.case: r.ms for r in rows if r.provider == "cute"}
    best: dict[str, float] = {}
    for r in rows:
        if r.provider in BEST_PEERS and r.case in ours:
            best[r.case] = min(best.get(r.case, r.ms), r.ms)
    return {c: best[c] / ours[c] for c in best}


def summarize(rows):
    pre = [r for r in rows if r.case.startswith("prefill")]
    dec = [r for r in rows if r.case.startswith("decode")]
    s = {}
    bp = best_peer_speedups(pre)
    if bp:
        s["geomean_speedup_vs_best_peer[prefill]"] = geomean(list(bp.values()))
        s["min_speedup_vs_best_peer[prefill]"] = min(bp.values())
    for other in ("cudnn", "sdpa_flash", "triton", "fa4"):
        sp = speedups(pre, "cute", other)
        if sp:
            s[f"geomean_speedup_vs_{other}[prefill]"] = geomean(list(sp.values()))
    d128 = {c: v for c, v in speedups(pre, "cute", "fa4").items() if c.endswith("x128") or "x128-" in c}
    if d128:
        s["geomean_speedup_vs_fa4[prefill,d128]"] = geomean(list(d128.values()))
    sd = speedups(dec, "cute", "cudnn") or speedups(dec, "cute", "sdpa_flash")
    if sd:
        s["min_speedup_vs_sdpa[decode]"] = min(sd.values())
    for other in ("cudnn", "sdpa_flash", "triton"):
        sp = speedups(dec, "cute", other)
        if sp:
            s[f"geomean_speedup_vs_{other}[decode]"] = geomean(list(sp.values()))
    long = [r.extra["pct_hbm"] for r in dec if r.provider == "cute" and int(r.case.split("-L")[1].split("-")[0]) >= 8192]
    if long:
        s["min_pct_hbm[decode,L>=8k]"] = min(long)
    return s


def merged_rows(suite: str, rows: list[Row]) -> list[Row]:
    """rows plus those of other cases in the suite's results file for this GPU (if any)."""
    from .common import gpu_name, gpu_tag, results_dir

    path = results_dir() / f"{suite}_{gpu_tag()}.json"
    if not path.exists():
        return rows
    old = json.loads(path.read_text())
    if old.get("gpu") != gpu_name():
        print(f"[attn] --merge: {path} is from {old.get('gpu')}, not this GPU; not merged")
        return rows
    mine = {r.case for r in rows}
    kept = [Row(**d) for d in old["rows"] if d["case"] not in mine]
    print(f"[attn] --merge: kept {len(kept)} rows of {path}")
    return kept + rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="first prefill shape and four decode points")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--decode", action="store_true",
                   help="the decode points only (writes attention_decode_<gpu>.*, leaving the full suite's file)")
    p.add_argument("--wide", action="store_true", help="the widened GQA prefill suite (attention_wide_<gpu>.*)")
    p.add_argument("--head-dims", type=int_list, default=None, help="with --wide: comma-separated subset of 64,128")
    p.add_argument("--seqlens", type=int_list, default=None, help="with --wide: comma-separated sequence lengths")
    p.add_argument("--fp8", action="store_true", help="flash_attn_fp8 against our bf16 and cuDNN (attention_fp8_<gpu>.*)")
    p.add_argument("--gqa", type=int_list, default=None,
                   help="with --wide: comma-separated query heads per KV head, from 1,4,8")
    p.add_argument("--providers", type=lambda s: tuple(x for x in s.split(",") if x), default=None,
                   help="with --wide: comma-separated providers to time, from cute,cudnn,sdpa_flash,triton,fa4 "
                        "(default all; cute,cudnn,fa4 give speedup_vs_best_peer in less time; the summary's "
                        "ratios to the others then cover only the cases that timed them)")
    p.add_argument("--merge", action="store_true",
                   help="with --wide: keep the rows of other cases already in attention_wide_<gpu>.json (same GPU "
                        "name) and summarize them all, so the suite can run in parts (e.g. one head dim each)")
    args = p.parse_args(argv)
    if args.fp8 and (args.decode or args.quick or args.wide):
        raise SystemExit("error: --fp8 is a suite of its own: not with --decode, --quick or --wide")
    if args.wide and (args.decode or args.quick):
        raise SystemExit("error: --wide is a prefill suite of its own: not with --decode or --quick")
    if args.merge and not args.wide:
        raise SystemExit("error: --merge adds to the --wide suite's results")
    if args.providers is not None and (not args.wide or not set(args.providers) <= set(PROVIDER_NAMES)
                                       or "cute" not in args.providers):
        raise SystemExit(f"error: --providers selects, for --wide, cute and any of {', '.join(PROVIDER_NAMES[1:])}")
    if not (args.wide or args.fp8) and (args.head_dims or args.seqlens or args.gqa):
        raise SystemExit("error: --head-dims, --seqlens and --gqa select shapes of --wide or --fp8")
    try:
        shapes = wide_shapes(args.head_dims or WIDE_HEAD_DIMS, args.seqlens or WIDE_SEQLENS,
                             args.gqa or WIDE_GQA) if args.wide else None
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    require_hopper("python -m benchmarks.attention")
    decode = DECODE[:4] if args.quick else DECODE
    if args.fp8:
        rows = run_fp8(args.head_dims or WIDE_HEAD_DIMS, args.seqlens or FP8_SEQLENS, args.gqa or (1, 8))
    elif args.wide:
        rows = run_prefill(shapes, only=args.providers)
    elif args.decode:
        rows = run_decode(decode)
    else:
        rows = run_prefill(PREFILL[:1] if args.quick else PREFILL) + run_decode(decode)
    if args.merge:
        rows = merged_rows("attention_wide", rows)
    summary = summarize_fp8(rows) if args.fp8 else summarize(rows)
    print(format_table(rows, baseline="cudnn"))
    for k, v in summary.items():
        print(f"{k}: {v:.3f}")
    if not args.no_write:
        suite = ("attention_fp8" if args.fp8 else "attention_wide" if args.wide else "attention_decode" if args.decode
                 else "attention")
        print("wrote", write_results(suite, rows, summary, baseline="cudnn"))
    return rows, summary


if __name__ == "__main__":
    main()
