"""GEMM autotuning: a persistent cache of measured configs per problem class, looked up
before the heuristics, and the tuner that fills it.

- `cache`: the key (op, output dtype, majors, epilogue class, N, K, M bucket), the user's
  cache file and the shipped tables, lookup and locked writes.
- `tune`: `tune_gemm` (candidates, parallel ahead-of-time compiles, timing on the GPU) and
  `tune` (model or shape lists); `python -m cute_kernels.tune` is its command line.
- `models`: the linear layers of published models (N, K), shared with the grid benchmark.

Importing this package reads no file and touches no GPU.
"""
