"""Same-run A/B of the prefill kernel's config fields (attention.config.PrefillConfig).

    python -m benchmarks.ab_attention [--option wg_key_range] [--reps 2] [--out DIR]
    python -m benchmarks.ab_attention --set tma_o=True --set n_block=176 [--wide] [--head-dims 128]
    python -m benchmarks.ab_attention --group 24MB --group 1 --wide --seqlens 512,1024 --causal-only
    python -m benchmarks.ab_attention --fp8 --set n_block=224,pingpong=True --wide --head-dims 128 --seqlens 4096

For each case, times the config `prefill_config` picks (provider `cute`) against variants of
it: `--option` flips a boolean field, each `--set FIELD=VALUE[,FIELD=VALUE]` is one variant
(provider `cute FIELD=VALUE`; a variant that is the pick itself or fails `validate` for a
case is left out of that case); each `--group G` runs the pick with another tile order
(provider `cute group=G`): G heads per tile-order group, or G MB of K/V a group (`8MB`).
cuDNN's SDPA runs for reference. Cases: Llama-style GQA shapes, causal and not, head dim 64
and 128, plus a ragged MHA one; `--wide`: the widened suite's shapes
(benchmarks.attention.wide_shapes, GQA 1 and 8). All CUDA-graph timed with L2 rotation
(runtime.timing), `--reps` repetitions, every other one in reverse order, median kept; each
variant's max error against cuDNN's output is recorded with its row. `--fp8`: the FP8 kernel
(`flash_attn_fp8` on e4m3 copies of the inputs, descales 1) from `prefill_config_fp8`'s pick,
cuDNN on the same values in bf16. Writes ab_attention_<name>_<gpu>.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from benchmarks.common import (
    PEAK_TFLOPS,
    Row,
    add_ab_arguments,
    apply_ab_arguments,
    format_table,
    geomean,
    parse_config_fields,
    require_hopper,
    time_ms,
    write_results,
)

# (batch, seqlen, query heads, kv heads, head dim, causal)
CASES = [(4, 2048, 32, 8, 64, True), (16, 1024, 32, 8, 64, True), (2, 4096, 32, 8, 64, True),
         (1, 8192, 32, 8, 64, True), (4, 2048, 32, 8, 64, False), (4, 2048, 32, 8, 128, True),
         (3, 1000, 12, 12, 64, True)]
BOOL_OPTIONS = ("wg_key_range", "pingpong", "tma_o")


def wide_cases(head_dims=(64, 128), seqlens=None, causal=(False, True)) -> list[tuple[int, int, int, int, int, bool]]:
    from benchmarks.attention import WIDE_SEQLENS, wide_shapes

    return [(B, S, Hq, Hkv, D, c) for B, Hq, Hkv, S, D in wide_shapes(head_dims, seqlens or WIDE_SEQLENS, (1, 8))
            for c in causal]


def parse_set(spec: str) -> dict:
    """'n_block=176,tma_o=True' -> {'n_block': 176, 'tma_o': True} (values are Python literals)."""
    from cute_kernels.attention.config import PrefillConfig

    return parse_config_fields(PrefillConfig, spec, "176, True, None")


def parse_group(spec: str) -> tuple[str, int]:
    """'8MB' -> ('bytes', 8 << 20); '1' -> ('heads', 1)."""
    spec = spec.strip()
    try:
        if spec.upper().endswith("MB"):
            n = int(spec[:-2])
            kind = "bytes"
        else:
            n = int(spec)
            kind = "heads"
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--group takes a head count (1) or megabytes of K/V (8MB), got {spec!r}")
    return kind, n << 20 if kind == "bytes" else n


def _group_heads(spec: str, cfg, Sk: int, ratio: int) -> int:
    from cute_kernels.attention.api import heads_per_group

    kind, n = parse_group(spec)
    if kind == "heads":
        return n
    return heads_per_group(Sk, cfg.head_dim, ratio // cfg.pack_gqa, group_bytes=n)


def _case(B, S, Hq, Hk, D, causal) -> str:
    return f"{B}x{S}x{Hq}/{Hk}x{D}{' causal' if causal else ''}"


def run(option: str | None = "wg_key_range", reps: int = 2, sets: list[str] = (), cases=CASES,
        groups: list[str] = (), fp8: bool = False):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cute_kernels.attention.api import _run, _run_fp8
    from cute_kernels.attention.config import prefill_config, prefill_config_fp8

    if fp8 and groups:
        raise ValueError("--group is for the 16-bit kernel")
    in_bytes = 1 if fp8 else 2
    peak = PEAK_TFLOPS["fp8" if fp8 else "bf16"]

    rows: list[Row] = []
    gains: dict[str, dict[str, float]] = {}
    for B, S, Hq, Hk, D, causal in cases:
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16)
        if fp8:
            q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
            q, k, v = (t.to(torch.bfloat16) for t in (q8, k8, v8))  # cuDNN sees the same values
            ones = torch.ones(B, Hk, device="cuda", dtype=torch.float32)

            def attend(cfg, group, q8=q8, k8=k8, v8=v8, ones=ones, causal=causal):
                return _run_fp8(q8, k8, v8, ones, ones, ones, causal, None, config=cfg)
        else:
            def attend(cfg, group, q=q, k=k, v=v, causal=causal):
                return _run(q, k, v, causal, None, config=cfg, tile_group=group)
        flops = 4 * B * Hq * S * S * D / (2 if causal else 1)
        case = _case(B, S, Hq, Hk, D, causal)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2)
            ms = time_ms(lambda _i: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True))
        rows.append(Row(case, "cudnn", ms, flops / ms / 1e9, 100 * flops / ms / 1e9 / PEAK_TFLOPS["bf16"]))
        base = prefill_config_fp8(D, S, causal) if fp8 else prefill_config(D, S, Hq // Hk, causal)
        variants = {"cute": (base, None)}
        if option:
            flipped = not getattr(base, option)
            variants[f"cute {option}={flipped}"] = (dataclasses.replace(base, **{option: flipped}), None)
        for spec in sets:
            cfg = dataclasses.replace(base, **parse_set(spec))
            try:
                cfg.validate(in_bytes)
            except ValueError:
                continue
            if cfg != base:
                variants[f"cute {spec}"] = (cfg, None)
        for spec in groups:
            variants[f"cute group={spec}"] = (base, _group_heads(spec, base, S, Hq // Hk))
        times: dict[str, list[float]] = {name: [] for name in variants}
        errs = {}
        names = list(variants)
        for rep in range(reps):
            # Every other repetition runs the variants in reverse: a kernel's time moves with
            # its place in the run (benchmarks.attention's notes), so no variant keeps the first.
            for name in names if rep % 2 == 0 else names[::-1]:
                cfg, group = variants[name]
                out, _ = attend(cfg, group)
                errs[name] = (out.float() - ref.float()).abs().max().item()
                times[name].append(time_ms(lambda _i, cfg=cfg, g=group: attend(cfg, g)))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        for name in variants:
            ms = med[name]
            rows.append(Row(case, name, ms, flops / ms / 1e9, 100 * flops / ms / 1e9 / peak,
                            extra={"times_ms": times[name], "max_err_vs_cudnn": errs[name],
                                   "config": str(variants[name][0]), "tile_group": variants[name][1]}))
            if name != "cute":
                gains.setdefault(name, {})[case] = med["cute"] / ms
    t = {(r.case, r.provider): r.ms for r in rows}
    cased = sorted({r.case for r in rows}, key=[r.case for r in rows].index)
    summary = {f"variant_vs_shipped_geomean[{name}]": geomean(list(g.values())) for name, g in gains.items()}
    summary.update({f"variant_vs_shipped[{name}|{c}]": v for name, g in gains.items() for c, v in g.items()})
    summary["cute_vs_cudnn_geomean"] = geomean([t[(c, "cudnn")] / t[(c, "cute")] for c in cased])
    return rows, summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--option", default=None, choices=BOOL_OPTIONS,
                   help="a boolean PrefillConfig field to flip (default wg_key_range when no --set is given)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="one variant: PrefillConfig fields set on top of the pick (repeatable)")
    p.add_argument("--group", dest="groups", action="append", default=[], metavar="G",
                   help="one variant: the pick in another tile order, G heads per group (1) or G MB of K/V (8MB) "
                        "(repeatable)")
    p.add_argument("--fp8", action="store_true", help="the FP8 kernel (flash_attn_fp8) from prefill_config_fp8's pick")
    p.add_argument("--wide", action="store_true", help="the widened suite's shapes (GQA 1 and 8) instead of CASES")
    p.add_argument("--head-dims", default="64,128", help="with --wide: comma-separated head dims")
    p.add_argument("--seqlens", default=None, help="with --wide: comma-separated sequence lengths (default all)")
    p.add_argument("--causal-only", action="store_true", help="with --wide: the causal cases only")
    add_ab_arguments(p, None, 2)  # --name default: the option, or 'variants'
    args = p.parse_args(argv)
    apply_ab_arguments(p, args)
    try:
        for spec in args.sets:
            parse_set(spec)
        for spec in args.groups:
            parse_group(spec)
        head_dims = tuple(int(x) for x in args.head_dims.split(","))
        seqlens = tuple(int(x) for x in args.seqlens.split(",")) if args.seqlens else None
    except ValueError as e:
        p.error(str(e))
    if args.fp8 and args.groups:
        p.error("--group is for the 16-bit kernel")
    option = args.option or (None if args.sets or args.groups else "wg_key_range")
    require_hopper("benchmarks.ab_attention")
    cases = wide_cases(head_dims, seqlens, (True,) if args.causal_only else (False, True)) if args.wide else CASES
    rows, summary = run(option, args.reps, args.sets, cases, args.groups, args.fp8)
    print(format_table(rows, baseline="cudnn"))
    name = args.name or option or "variants"
    flags = ("--fp8 " if args.fp8 else "") + (f"--option {option} " if option else "") + "".join(f"--set {s} " for s in args.sets) + \
        "".join(f"--group {g} " for g in args.groups) + \
        (f"--wide --head-dims {args.head_dims} " if args.wide else "") + \
        (f"--seqlens {args.seqlens} " if args.wide and args.seqlens else "") + ("--causal-only " if args.causal_only else "")
    notes = (f"`python -m benchmarks.ab_attention {flags}--reps {args.reps}`: the shipped {'FP8 ' if args.fp8 else ''}"
             "prefill config (`cute`) "
             "against its variants, cuDNN SDPA for reference; CUDA-graph timed with L2 rotation, the median of the "
             "repetitions (every other one in reverse order).")
    print("wrote", write_results(f"ab_attention_{name}", rows, summary, notes=notes, baseline="cudnn"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
