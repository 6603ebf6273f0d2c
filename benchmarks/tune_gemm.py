"""Sweep GEMM configs per shape (the data behind the heuristic in cute_kernels/matmul/heuristics.py).

    python -m benchmarks.tune_gemm [--shapes 8192x2304x768,...] [--splits 2,3,4,5] [--dtype bf16|fp8|int8]
                                   [--configs 128x256c21,128x256c12n,128x192c21P,...]

--configs replaces the candidate list with the named configs (the labels the sweep prints:
{tile_m}x{tile_n}c{cluster_m}{cluster_n}, then n for raster along N, g<group>, P for
ping-pong, s<split> for split-K). --splits adds split-K variants (s = each value) of the heuristic's four tile shapes,
the data to re-fit the split-K model in heuristics.py (`_US_*` constants).

Checks every candidate for correctness with the full epilogue on a ragged shape (swap_ab ones
with the plain epilogue, the only one they run), then
times each candidate against cuBLAS on every shape (CUDA-graph replays, L2-rotated
inputs) and prints the best configs per shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

import torch

from cute_kernels.matmul.api import _alloc_out, _pick_config, run_gemm
from cute_kernels.matmul.config import Epilogue, GemmConfig
from cute_kernels.matmul.heuristics import CANDIDATES
from cute_kernels.tuning.tune import label as _label  # the autotuner's labels, one format

from .common import require_hopper, rotation_count, time_ms
from .gemm import SUITE

_LABEL = re.compile(r"(\d+)x(\d+)c(\d)(\d)(n?)(?:g(\d+))?(P?)(?:s(\d+))?(\+2x)?(T?)(?:d(\d+))?([WR]?)$")


def parse_label(label: str) -> GemmConfig:
    """The GemmConfig a sweep label names (the inverse of tuning.tune.label)."""
    m = _LABEL.match(label.strip())
    if not m:
        raise ValueError(f"not a config label: {label!r} (expected e.g. 128x256c21, 128x192c12nP, 128x128c21s2, "
                         "64x32c12Td12)")
    tm, tn, cm, cn, col, group, pp, split, promote, swap, stages, whole = m.groups()
    return GemmConfig(int(tm), int(tn), int(cm), int(cn), group=int(group) if group else GemmConfig.group,
                      raster_m=not col, pingpong=bool(pp), split_k=int(split) if split else 1, promote=bool(promote),
                      swap_ab=bool(swap), stages=int(stages) if stages else None,
                      whole_tile_epi={"W": True, "R": False}.get(whole))


def check(cfgs) -> None:
    M, N, K = 300, 520, 200
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    epi = Epilogue(activation="gelu_tanh", bias=True, residual=True, alpha=True, beta=True)
    ref = torch.nn.functional.gelu(0.5 * (a.float() @ w.float().t()) + bias.float(), approximate="tanh") + 2 * res.float()
    plain = a.float() @ w.float().t()
    for cfg in cfgs:
        o = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        if cfg.swap_ab:  # swap_ab runs the plain epilogue only (config.swap_supported)
            run_gemm(a, w, o, epi=Epilogue(), config=cfg)
            err = ((o.float() - plain).abs().max() / plain.abs().max()).item()
        else:
            run_gemm(a, w, o, epi=epi, bias=bias, residual=res, alpha=0.5, beta=2.0, config=cfg)
            err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
        print(f"{_label(cfg):>14}: {'ok' if err < 1e-2 else 'WRONG'} (rel err {err:.2e})")


def _operands(dtype: str, M: int, N: int, K: int):
    """(a, w [N, K], out, ours(a, w, out, cfg), theirs(a, w)) for one input set of `dtype`."""
    if dtype == "int8":
        a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
        w = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8)
        out = _alloc_out(M, N, torch.int32, "cuda")
        return (a, w, out, dict(epi=Epilogue(), kernel_name="int8_mm_sm90", acc_name="Int32"),
                lambda: torch._int_mm(a, w.t()))
    if dtype == "fp8":  # per-token x per-channel scales, bf16 out, fast accumulation
        e4m3 = torch.float8_e4m3fn
        a = torch.randn(M, K, device="cuda").to(e4m3)
        w = torch.randn(N, K, device="cuda").to(e4m3)
        sa = torch.rand(M, 1, device="cuda") + 0.5
        sb = torch.rand(1, N, device="cuda") + 0.5
        out = _alloc_out(M, N, torch.bfloat16, "cuda")
        kw = dict(epi=Epilogue(row_scale="vector", col_scale="vector"), row_scale=sa.view(-1), col_scale=sb.view(-1),
                  kernel_name="scaled_mm_sm90")
        return a, w, out, kw, lambda: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    return a, w, _alloc_out(M, N, torch.bfloat16, "cuda"), dict(epi=Epilogue()), lambda: torch.mm(a, w.t())


def sweep(shapes, cfgs, dtype: str = "bf16"):
    in_bytes = 2 if dtype == "bf16" else 1
    out_bytes = {"bf16": 2, "fp8": 2, "int8": 4}[dtype]
    for (M, N, K) in shapes:
        nrot = rotation_count(M * K * in_bytes + N * K * in_bytes + M * N * out_bytes)
        sets = [_operands(dtype, M, N, K) for _ in range(nrot)]
        t_ref = time_ms(lambda i: sets[i][4](), n_rotate=nrot)
        res = []
        for cfg in cfgs:
            try:
                cfg.validate(in_bytes, out_bytes)
            except ValueError:
                continue
            t = time_ms(lambda i: run_gemm(sets[i][0], sets[i][1], sets[i][2], config=cfg, **sets[i][3]),
                        n_rotate=nrot)
            res.append((t_ref / t, cfg))
        res.sort(key=lambda x: -x[0])
        d = _pick_config(M, N, K, in_bytes, dtype == "bf16", integer=dtype == "int8")
        print(f"{dtype} {M}x{N}x{K}: heuristic {_label(d)} | " + "  ".join(f"{_label(c)} {r:.3f}" for r, c in res))
        del sets


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default="", help="comma-separated MxNxK (default: the GEMM suite)")
    p.add_argument("--splits", default="", help="comma-separated split-K counts to add (e.g. 2,3,4,5)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp8", "int8"],
                   help="inputs: bf16 (vs torch.mm), fp8 rowwise-scaled (vs torch._scaled_mm), int8 (vs torch._int_mm)")
    p.add_argument("--configs", default="", help="comma-separated config labels to sweep instead of the candidates")
    args = p.parse_args(argv)
    require_hopper("python -m benchmarks.tune_gemm")
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",") if s] or SUITE
    cfgs = list(CANDIDATES)
    if args.configs:
        cfgs = [parse_label(c) for c in args.configs.split(",") if c]
    elif args.dtype != "bf16":  # shapes the 16-bit table never needed: cooperative 128x128, wide clusters
        cfgs += [GemmConfig(128, 128, 2, 1), GemmConfig(128, 128, 1, 1, pingpong=True), GemmConfig(256, 128, 2, 1)]
    for s in (int(v) for v in args.splits.split(",") if v):
        cfgs += [dataclasses.replace(c, split_k=s) for c in CANDIDATES[:4]]
    check(cfgs)
    sweep(shapes, cfgs, args.dtype)


if __name__ == "__main__":
    main()
