"""BF16/FP16 GEMM (GemmSm90) with fused epilogues, and the decode GEMVs: config, kernel, api, reference."""
