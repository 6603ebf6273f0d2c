"""A target for Nsight Compute: our prefill attention and FlashAttention-4 on the same shapes.

    ncu --clock-control none --profile-from-start off --set full -o rep \\
        python -m benchmarks.ncu_attention 1x16384x32x32x128 1x16384x32x32x64:causal

Each case BxSxHQxHKVxD[:causal] runs `flash_attn` and FA4's `flash_attn_func` (bf16, randn
inputs, as the suites use) 5 times each outside the profiler range, then once each inside it
(cudaProfilerStart/Stop), so the report holds two kernels per case, ours first. Without FA4
importable it profiles ours alone and says so.
"""

from __future__ import annotations

import argparse


def parse_case(text: str) -> tuple[tuple[int, int, int, int, int], bool]:
    """'1x16384x32x8x128:causal' -> ((1, 16384, 32, 8, 128), True)."""
    shape, _, flag = text.partition(":")
    if flag not in ("", "causal"):
        raise ValueError(f"{text!r}: the only flag after ':' is 'causal'")
    dims = tuple(int(x) for x in shape.split("x"))
    if len(dims) != 5:
        raise ValueError(f"{text!r}: expected BxSxHQxHKVxD, e.g. 1x16384x32x8x128")
    return dims, flag == "causal"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="BxSxHQxHKVxD[:causal], e.g. 1x16384x32x32x128")
    args = ap.parse_args(argv)
    try:
        cases = [parse_case(c) for c in args.cases]
    except ValueError as e:
        ap.error(str(e))

    import torch

    from benchmarks.common import require_hopper
    from cute_kernels.attention.api import flash_attn

    require_hopper("benchmarks.ncu_attention")
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError as e:
        print(f"[ncu_attention] FlashAttention-4 unavailable ({e}); profiling ours alone")
        flash_attn_func = None
    runs = []
    for (b, s, hq, hkv, d), causal in cases:
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        fns = [lambda q=q, k=k, v=v, c=causal: flash_attn(q, k, v, causal=c)]
        if flash_attn_func is not None:
            fns.append(lambda q=q, k=k, v=v, c=causal: flash_attn_func(q, k, v, causal=c))
        for _ in range(5):
            for f in fns:
                f()
        runs.append(fns)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fns in runs:
        for f in fns:
            f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
