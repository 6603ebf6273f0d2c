"""Sweep GEMM configs per shape (the data behind the heuristic in cute_kernels/gemm/config.py).

    python -m benchmarks.tune_gemm [--shapes 8192x2304x768,...] [--splits 2,3,4,5]

--splits adds split-K variants (s = each value) of the heuristic's four tile shapes,
the data to re-fit the split-K model in config.py (`_US_*` constants).

Checks every candidate for correctness with the full epilogue on a ragged shape, then
times each candidate against cuBLAS on every shape (CUDA-graph replays, L2-rotated
inputs) and prints the best configs per shape.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from cute_kernels.gemm.api import _alloc_out, _pick_config, run_gemm
from cute_kernels.gemm.config import CANDIDATES
from cute_kernels.gemm.kernel import Epilogue

from .common import rotation_count, time_ms
from .gemm import SUITE


def _label(c) -> str:
    split = f"s{c.split_k}" if c.split_k > 1 else ""
    return f"{c.tile_m}x{c.tile_n}c{c.cluster_m}{c.cluster_n}{'' if c.raster_m else 'n'}{'P' if c.pingpong else ''}{split}"


def check(cfgs) -> None:
    M, N, K = 300, 520, 200
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    epi = Epilogue(activation="gelu_tanh", bias=True, residual=True, alpha=True, beta=True)
    ref = torch.nn.functional.gelu(0.5 * (a.float() @ w.float().t()) + bias.float(), approximate="tanh") + 2 * res.float()
    for cfg in cfgs:
        o = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        run_gemm(a, w, o, epi=epi, bias=bias, residual=res, alpha=0.5, beta=2.0, config=cfg)
        err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
        print(f"{_label(cfg):>14}: {'ok' if err < 1e-2 else 'WRONG'} (rel err {err:.2e})")


def sweep(shapes, cfgs):
    for (M, N, K) in shapes:
        nrot = rotation_count((M * K + N * K + M * N) * 2)
        A = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
        W = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
        O = [_alloc_out(M, N, torch.bfloat16, "cuda") for _ in range(nrot)]
        t_cublas = time_ms(lambda i: torch.mm(A[i], W[i].t()), n_rotate=nrot)
        res = []
        for cfg in cfgs:
            t = time_ms(lambda i: run_gemm(A[i], W[i], O[i], epi=Epilogue(), config=cfg), n_rotate=nrot)
            res.append((t_cublas / t, cfg))
        res.sort(key=lambda x: -x[0])
        d = _pick_config(M, N, K, 2, True)
        print(f"{M}x{N}x{K}: heuristic {_label(d)} | " + "  ".join(f"{_label(c)} {r:.3f}" for r, c in res[:5]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default="", help="comma-separated MxNxK (default: the GEMM suite)")
    p.add_argument("--splits", default="", help="comma-separated split-K counts to add (e.g. 2,3,4,5)")
    args = p.parse_args(argv)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",") if s] or SUITE
    cfgs = list(CANDIDATES)
    for s in (int(v) for v in args.splits.split(",") if v):
        cfgs += [dataclasses.replace(c, split_k=s) for c in CANDIDATES[:4]]
    check(cfgs)
    sweep(shapes, cfgs)


if __name__ == "__main__":
    main()
