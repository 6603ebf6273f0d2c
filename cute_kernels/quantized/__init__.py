"""FP8 / INT8 GEMM on the GemmSm90 kernel with fused scaling: api, reference."""
