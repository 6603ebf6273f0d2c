"""Honest baselines the CuTe DSL kernels are measured against.

- `baselines.triton`: autotuned Triton kernels (GEMM with fused epilogues, FP8 and
  INT8 GEMM, FlashAttention-style forward) -- what a careful engineer gets from
  Triton without hand-written PTX.
- `baselines.wmma`: a CUDA C++ GEMM ladder (naive -> shared memory -> register
  tiling -> WMMA tensor cores) that shows where each optimisation step lands.

Importing this package touches neither Triton nor the GPU.
"""
