// Rung 1: one thread per output element, operands straight from global memory.
//
// threadIdx.x runs along N so a warp reads 32 consecutive B elements and writes
// 32 consecutive C elements (coalesced); every thread of the warp reads the same
// A element (a broadcast). Each operand element is still fetched from L2/DRAM
// once per output that uses it: this rung is bound by memory traffic.
#include "common.cuh"

template <typename OutT>
__global__ void gemm_naive_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, OutT* __restrict__ C,
                                  int M, int N, int K) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    const bf16* a = A + static_cast<size_t>(row) * K;
    const bf16* b = B + col;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += __bfloat162float(a[k]) * __bfloat162float(b[static_cast<size_t>(k) * N]);
    store_out(C + static_cast<size_t>(row) * N + col, acc);
}

cudaError_t ladder_naive(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                         cudaStream_t stream) {
    const dim3 block(32, 8);
    const dim3 grid((N + block.x - 1) / block.x, (M + block.y - 1) / block.y);
    const auto* a = static_cast<const bf16*>(A);
    const auto* b = static_cast<const bf16*>(B);
    if (c_fp32)
        gemm_naive_kernel<float><<<grid, block, 0, stream>>>(a, b, static_cast<float*>(C), M, N, K);
    else
        gemm_naive_kernel<bf16><<<grid, block, 0, stream>>>(a, b, static_cast<bf16*>(C), M, N, K);
    return cudaGetLastError();
}
