"""Same-run A/B of the decode kernels' config fields (attention.config.DecodeConfig, DecodeMmaConfig).

    python -m benchmarks.ab_decode --set threads=128 --set kv_pack=1,threads=128
    python -m benchmarks.ab_decode --set unroll=4,stages=4 --batches 16,32,48 --seqlens 8192 --name b_sweep
    python -m benchmarks.ab_decode --gqa 4 --heads 32 --head-dims 128 --set stages=4 --set warps=8,stages=2

For each point (batch x cache length x query heads x GQA ratio x head dim, one query token
each), times the config the dispatch picks for the launch (provider `cute`, through the same
dispatch as `flash_attn`: the SIMT kernel's `decode_config`, or `decode_mma_config` where the
tensor-core kernel runs, `decode_uses_mma`) against variants of it, each `--set
FIELD=VALUE[,FIELD=VALUE]` one variant (provider `cute FIELD=VALUE`); a variant whose fields
the point's config class lacks, that is the pick itself or that fails `validate` is left out
of that point. `splits=N` in a variant splits the keys N ways (merged as `flash_attn` merges
them: in a cluster where `decode_merges_in_cluster` allows, else through global memory;
`merge=global` always through global memory); variants without it split as the pick does.
`kernel=simt` / `kernel=mma` runs the other kernel where dispatch picks one (`decode_uses_mma`),
from that kernel's own pick and split count, with the variant's other fields on top.
cuDNN's SDPA runs for reference. Points: `--batches` x `--seqlens` x `--heads` x `--gqa` (query heads per KV head; 1:
MHA) x `--head-dims`. Timing as the decode suite's (benchmarks.attention): CUDA graphs,
`--reps` repetitions, every other one in reverse order, median kept; each variant's output is
checked against the fp32 reference on the first sequence. Writes ab_decode_<name>_<gpu>.{json,md}.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

from benchmarks.common import (
    Row,
    add_ab_arguments,
    apply_ab_arguments,
    format_table,
    geomean,
    parse_config_fields,
    peak_tbps,
    require_hopper,
    time_ms,
    write_results,
)
from cute_kernels.attention.config import MAX_DECODE_SPLITS
from cute_kernels.tune import _ints as int_list  # the package CLI's comma-separated integers


def parse_set(spec: str, config_cls=None) -> tuple[dict, int | None, bool]:
    """'threads=128,kv_pack=1,splits=2,merge=global' -> ({'threads': 128, 'kv_pack': 1}, 2, False):
    config fields (values are Python literals), the launch's key splits (`splits`; None: the
    pick's) and whether splits may merge in a cluster (`merge=global` merges them through
    global memory); `kernel` is checked here and read by parse_kernel. The fields must be
    config_cls's, or by default DecodeConfig's or DecodeMmaConfig's."""
    from cute_kernels.attention.config import DecodeConfig, DecodeMmaConfig

    items = [p.partition("=") for p in spec.split(",")]
    launch = {"splits", "merge", "kernel"}
    parts = [f"{k}={v}" if sep else k for k, sep, v in items if k.strip() not in launch]
    splits = [v.strip() for k, _, v in items if k.strip() == "splits"]
    merge = [v.strip() for k, _, v in items if k.strip() == "merge"]
    if len(splits) > 1 or (splits and not (splits[0].isdigit() and 1 <= int(splits[0]) <= MAX_DECODE_SPLITS)):
        raise ValueError(f"--set {spec!r}: splits takes one integer in 1..{MAX_DECODE_SPLITS}")
    if len(merge) > 1 or (merge and merge[0] not in ("global", "cluster")):
        raise ValueError(f"--set {spec!r}: merge takes one of global, cluster")
    kernels = [v.strip() for k, _, v in items if k.strip() == "kernel"]
    if len(kernels) > 1 or (kernels and kernels[0] not in ("simt", "mma")):
        raise ValueError(f"--set {spec!r}: kernel takes one of simt, mma")
    n = int(splits[0]) if splits else None
    cluster = not merge or merge[0] == "cluster"
    if not parts:
        return {}, n, cluster
    if config_cls is not None:
        return parse_config_fields(config_cls, ",".join(parts), "128, 2"), n, cluster
    try:
        return parse_config_fields(DecodeConfig, ",".join(parts), "128, 2"), n, cluster
    except ValueError as e:
        try:
            return parse_config_fields(DecodeMmaConfig, ",".join(parts), "128, 2"), n, cluster
        except ValueError:
            raise e from None


def parse_kernel(spec: str) -> str | None:
    """The decode kernel a --set spec asks for (`kernel=simt` or `kernel=mma`), None for the
    dispatch's choice (parse_set checks the value)."""
    found = [v.strip() for k, _, v in (p.partition("=") for p in spec.split(",")) if k.strip() == "kernel"]
    return found[0] if found else None


def _point_pick(B: int, L: int, H: int, G: int, D: int, mma: bool):
    """(config, heads per CTA, key splits) dispatch would run at this point with the SIMT
    (mma False) or the tensor-core kernel."""
    from cute_kernels.attention import api
    from cute_kernels.attention.config import decode_config, decode_mma_config

    heads = api._heads_per_cta(G, api._decode_cfg(D, mma))
    splits = api.decode_splits_heuristic(B, H, heads, L, D, mma=mma)
    ctas = B * (H // heads)
    pick = (decode_mma_config(D, 0 if splits > 1 else ctas, heads, L, split_ctas=ctas if splits > 1 else 0) if mma
            else decode_config(D, ctas, L, mha=G == 1 and splits == 1))
    return pick, heads, splits


def _fits(spec: str, config_cls) -> dict | None:
    """The spec's fields for config_cls, None where it names a field config_cls lacks."""
    try:
        return parse_set(spec, config_cls)[0]
    except ValueError:
        return None


def run(sets: list[str], points, reps: int):
    import torch

    from benchmarks.attention import _sdpa
    from cute_kernels.attention import api
    from cute_kernels.attention.config import DecodeMmaConfig
    from cute_kernels.attention.reference import flash_attn_ref

    cudnn = _sdpa("cudnn")
    rows, gains = [], {}
    for B, L, H, G, D in points:
        Hkv = H // G
        case = f"decode-b{B}-L{L}-h{H}/{Hkv}-d{D}"
        q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ref = flash_attn_ref(q[:1].float(), k[:1].float(), v[:1].float())
        mma = api.decode_uses_mma(B, H, Hkv, L, D)
        pick, _, splits = _point_pick(B, L, H, G, D, mma)
        fns = {"cudnn": (lambda: cudnn(q, k, v, False), None),
               "cute": (lambda: api._run_decode(q, k, v, None)[0], pick)}
        for spec in sets:
            kernel = parse_kernel(spec)
            other = kernel is not None and (kernel == "mma") != mma
            if other and kernel == "mma" and D not in DecodeMmaConfig.HEAD_DIMS:
                continue
            base, _, base_splits = _point_pick(B, L, H, G, D, kernel == "mma") if other else (pick, None, splits)
            fields, (_, n, merge) = _fits(spec, type(base)), parse_set(spec)
            if fields is None:
                continue
            cfg, n = dataclasses.replace(base, **fields), base_splits if n is None else n
            try:
                cfg.validate()
            except ValueError:
                continue
            if other or cfg != pick or n != splits or not merge:
                fns[f"cute {spec}"] = (lambda cfg=cfg, n=n, merge=merge: api._run_decode(
                    q, k, v, None, num_splits=n, config=cfg, cluster_merge=merge)[0], cfg)
        errs = {}
        for name, (fn, _) in fns.items():
            errs[name] = (fn()[:1].float() - ref).abs().max().item()
            if errs[name] > 2e-2:
                raise RuntimeError(f"{case} {name}: max error {errs[name]:.3g} against the fp32 reference")
        names = list(fns)
        times = {n: [] for n in names}
        for r in range(reps):
            for n in (names if r % 2 == 0 else names[::-1]):
                times[n].append(time_ms(lambda i, f=fns[n][0]: f()))
        kv_bytes = 2 * k.numel() * k.element_size()
        med = {n: statistics.median(t) for n, t in times.items()}
        for n in names:
            gbps = kv_bytes / med[n] / 1e6
            rows.append(Row(case, n, med[n], gbps=gbps,
                            extra={"pct_hbm": round(100 * gbps / (peak_tbps() * 1e3), 1), "times_ms": times[n],
                                   "max_err": errs[n], "splits": splits,
                                   "config": str(fns[n][1]) if fns[n][1] is not None else None}))
            if n.startswith("cute "):
                gains.setdefault(n, {})[case] = med["cute"] / med[n]
        del q, k, v
        torch.cuda.empty_cache()
    t = {(r.case, r.provider): r.ms for r in rows}
    cases = sorted({r.case for r in rows}, key=[r.case for r in rows].index)
    summary = {f"variant_vs_shipped_geomean[{n}]": geomean(list(g.values())) for n, g in gains.items()}
    summary.update({f"variant_vs_shipped[{n}|{c}]": x for n, g in gains.items() for c, x in g.items()})
    summary["cute_vs_cudnn_geomean"] = geomean([t[(c, "cudnn")] / t[(c, "cute")] for c in cases])
    summary["cute_vs_cudnn_min"] = min(t[(c, "cudnn")] / t[(c, "cute")] for c in cases)
    return rows, summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="one variant: DecodeConfig or DecodeMmaConfig fields set on top of the pick, splits=N "
                        "to split the keys N ways, merge=global to merge the splits in global memory and "
                        "kernel=simt|mma to run that kernel (its own pick and splits) (repeatable)")
    p.add_argument("--batches", type=int_list, default="16,32,48,64,96,128", help="comma-separated batch sizes")
    p.add_argument("--seqlens", type=int_list, default="1024,8192", help="comma-separated cache lengths")
    p.add_argument("--heads", type=int_list, default="12", help="comma-separated query head counts")
    p.add_argument("--gqa", type=int_list, default="1",
                   help="comma-separated query heads per KV head (1: MHA; each must divide every head count)")
    p.add_argument("--head-dims", type=int_list, default="64", help="comma-separated head dims")
    add_ab_arguments(p, "variants", 3)
    args = p.parse_args(argv)
    apply_ab_arguments(p, args)
    try:
        for spec in args.sets:
            parse_set(spec)
    except ValueError as e:
        p.error(str(e))
    if any(h % g for h in args.heads for g in args.gqa):
        p.error(f"every --gqa ratio must divide every --heads count, got {args.gqa} and {args.heads}")
    points = [(b, s, h, g, d) for d in args.head_dims for g in args.gqa for h in args.heads for s in args.seqlens
              for b in args.batches]
    require_hopper("benchmarks.ab_decode")
    rows, summary = run(args.sets, points, args.reps)
    print(format_table(rows, baseline="cudnn"))
    flags = "".join(f"--set {s} " for s in args.sets) + \
        "".join(f"--{opt} {','.join(map(str, getattr(args, opt.replace('-', '_'))))} "
                for opt in ("batches", "seqlens", "heads", "gqa", "head-dims"))
    notes = (f"`python -m benchmarks.ab_decode {flags}--reps {args.reps}`: the shipped decode config (`cute`) "
             "against its variants (split as the pick is unless one sets splits), cuDNN SDPA for reference; CUDA-graph timed, the median of the "
             "repetitions (every other one in reverse order).")
    print("wrote", write_results(f"ab_decode_{args.name}", rows, summary, notes=notes, baseline="cudnn"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
