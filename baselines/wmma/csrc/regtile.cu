// Rung 3: 2-D register tiling with 128-bit loads (Simon Boehm's kernels 5-6).
//
// A 256-thread block computes a 128x128 tile of C; each thread owns an 8x8
// sub-tile in registers. Per step of K it reads 8 values of A and 8 of B from
// shared memory and does 64 FMAs, so the FMA units, not shared memory, set the
// pace. Global loads are 16 bytes (8 bf16) per thread; the operands are widened
// to fp32 once, when staged, so the inner loop is pure fp32 FMA.
//
// A thread's 8 rows are two groups of 4 (r, r + 64), and likewise its columns,
// so each float4 read of a quarter-warp touches 8 consecutive 16-byte words of
// shared memory: no bank conflicts.
#include "common.cuh"

namespace {
constexpr int BM = 128, BN = 128, BK = 16;
constexpr int THREADS = 256;
}  // namespace

template <typename OutT>
__global__ void __launch_bounds__(THREADS)
gemm_regtile_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, OutT* __restrict__ C, int M, int N,
                    int K) {
    // A is stored transposed (k-major) so a thread's 4 consecutive rows are one float4.
    __shared__ __align__(16) float As[BK][BM];
    __shared__ __align__(16) float Bs[BK][BN];

    int tile_m, tile_n;
    grouped_tile(M / BM, N / BN, tile_m, tile_n);
    const bf16* a_blk = A + static_cast<size_t>(tile_m) * BM * K;
    const bf16* b_blk = B + static_cast<size_t>(tile_n) * BN;

    const int t = threadIdx.x;
    const int tx = t % 16, ty = t / 16;
    // Loaders: A tile 128x16 -> two threads per row; B tile 16x128 -> 16 threads per row.
    const int a_row = t / 2, a_col = (t % 2) * 8;
    const int b_row = t / 16, b_col = (t % 16) * 8;

    float acc[8][8] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        const uint4 av = *reinterpret_cast<const uint4*>(a_blk + static_cast<size_t>(a_row) * K + k0 + a_col);
        const uint4 bv = *reinterpret_cast<const uint4*>(b_blk + static_cast<size_t>(k0 + b_row) * N + b_col);
        const bf16* ah = reinterpret_cast<const bf16*>(&av);
        const bf16* bh = reinterpret_cast<const bf16*>(&bv);
        // The transposing store is 2-way bank-conflicted (threads 2r and 2r+1 hit
        // the same banks); it runs once per 64 FMAs per thread, so it is left so.
#pragma unroll
        for (int i = 0; i < 8; ++i) As[a_col + i][a_row] = __bfloat162float(ah[i]);
        *reinterpret_cast<float4*>(&Bs[b_row][b_col]) =
            make_float4(__bfloat162float(bh[0]), __bfloat162float(bh[1]), __bfloat162float(bh[2]),
                        __bfloat162float(bh[3]));
        *reinterpret_cast<float4*>(&Bs[b_row][b_col + 4]) =
            make_float4(__bfloat162float(bh[4]), __bfloat162float(bh[5]), __bfloat162float(bh[6]),
                        __bfloat162float(bh[7]));
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BK; ++k) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[k][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[k][64 + tx * 4]);
            const float ar[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float br[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] += ar[i] * br[j];
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = tile_m * BM + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        OutT* c_row = C + static_cast<size_t>(row) * N + tile_n * BN;
        store_out4(c_row + tx * 4, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        store_out4(c_row + 64 + tx * 4, make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]));
    }
}

cudaError_t ladder_regtile(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                           cudaStream_t stream) {
    if (M % BM || N % BN || K % BK) return cudaErrorInvalidValue;
    const dim3 grid((M / BM) * (N / BN));
    const auto* a = static_cast<const bf16*>(A);
    const auto* b = static_cast<const bf16*>(B);
    if (c_fp32)
        gemm_regtile_kernel<float><<<grid, THREADS, 0, stream>>>(a, b, static_cast<float*>(C), M, N, K);
    else
        gemm_regtile_kernel<bf16><<<grid, THREADS, 0, stream>>>(a, b, static_cast<bf16*>(C), M, N, K);
    return cudaGetLastError();
}
