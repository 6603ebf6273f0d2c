"""A target for Nsight Compute: our kernel (a named config) and cuBLAS on the same bf16 shapes.

    ncu --clock-control none --profile-from-start off --set full -o rep \\
        python -m benchmarks.ncu_target 1633x6144x4096:256x152c21T [MxNxK:LABEL ...]

Each MxNxK:LABEL runs `linear` in that config (tuning.tune.label's format) and `F.linear`, 20
times each outside the profiler range, then once each inside it (cudaProfilerStart/Stop), so
the report holds two kernels per shape, ours first. randn inputs, as the suites use.
"""

from __future__ import annotations

import argparse


def main(argv=None) -> None:
    import torch

    from benchmarks.tune_gemm import parse_label
    from cute_kernels.matmul.api import _alloc_out, run_gemm
    from cute_kernels.matmul.config import Epilogue

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="MxNxK:LABEL, e.g. 1633x6144x4096:256x152c21T")
    args = ap.parse_args(argv)
    runs = []
    for case in args.cases:
        shape, _, lab = case.partition(":")
        m, n, k = map(int, shape.split("x"))
        cfg = parse_label(lab)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = _alloc_out(m, n, torch.bfloat16, "cuda")
        ours = lambda a=a, w=w, out=out, cfg=cfg: run_gemm(a, w, out, epi=Epilogue(), config=cfg)  # noqa: E731
        theirs = lambda a=a, w=w: torch.nn.functional.linear(a, w)  # noqa: E731
        for _ in range(20):
            ours()
            theirs()
        runs.append((ours, theirs))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for ours, theirs in runs:
        ours()
        theirs()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
