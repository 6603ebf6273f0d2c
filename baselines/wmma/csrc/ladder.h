// Host-side entry points of the GEMM ladder (no torch, no device code: the
// binding includes this with the host compiler).
//
// Every rung computes C = A @ B with A [M, K] and B [K, N] row-major bf16,
// fp32 accumulation, and C [M, N] row-major in bf16 (c_fp32 = false) or fp32.
// Pointers are device pointers; the kernel is launched on `stream` and the
// launch error (if any) is returned.
#pragma once

#include <cuda_runtime_api.h>

cudaError_t ladder_naive(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                         cudaStream_t stream);
cudaError_t ladder_smem(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                        cudaStream_t stream);
// M, N multiples of 128, K a multiple of 16, pointers 16-byte aligned.
cudaError_t ladder_regtile(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                           cudaStream_t stream);
// M a multiple of 128, N of 256, K of 64, pointers 16-byte aligned.
cudaError_t ladder_wmma(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                        cudaStream_t stream);
