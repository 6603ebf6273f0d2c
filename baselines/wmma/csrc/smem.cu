// Rung 2: shared-memory tiling, still one output per thread.
//
// A 32x32 block stages a 32x32 tile of A and of B in shared memory per step of
// K, so each element loaded from global memory is reused by 32 threads. In the
// inner loop a warp reads one As element (broadcast) and 32 consecutive Bs
// elements (no bank conflicts) per FMA: shared-memory loads are now the limit.
#include "common.cuh"

namespace {
constexpr int TILE = 32;
}

template <typename OutT>
__global__ void __launch_bounds__(TILE * TILE)
gemm_smem_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, OutT* __restrict__ C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // out-of-range elements load as 0 so ragged edges need no special case
        As[ty][tx] = (row < M && k0 + tx < K) ? __bfloat162float(A[static_cast<size_t>(row) * K + k0 + tx]) : 0.f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? __bfloat162float(B[static_cast<size_t>(k0 + ty) * N + col]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) store_out(C + static_cast<size_t>(row) * N + col, acc);
}

cudaError_t ladder_smem(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                        cudaStream_t stream) {
    const dim3 block(TILE, TILE);
    const dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    const auto* a = static_cast<const bf16*>(A);
    const auto* b = static_cast<const bf16*>(B);
    if (c_fp32)
        gemm_smem_kernel<float><<<grid, block, 0, stream>>>(a, b, static_cast<float*>(C), M, N, K);
    else
        gemm_smem_kernel<bf16><<<grid, block, 0, stream>>>(a, b, static_cast<bf16*>(C), M, N, K);
    return cudaGetLastError();
}
