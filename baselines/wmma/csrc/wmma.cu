// Rung 4: tensor cores through nvcuda::wmma (16x16x16 bf16 fragments, fp32 accumulate).
//
// A 256-thread block computes a 128x256 tile of C; its 8 warps form a 2x4 grid
// and each owns a 64x64 sub-tile, i.e. 4x4 accumulator fragments (128 fp32
// registers per thread). A large tile is what keeps the tensor cores fed: per
// 16-deep step a warp loads 8 fragments and issues 16 MMAs, and the block reads
// (128 + 256) * 32 bf16 from L2 per 128 * 256 * 32 multiply-adds.
//
// Operands move global -> shared with cp.async (16 bytes per instruction, no
// register staging) in a STAGES-deep ring, so the loads for future K steps are
// in flight while the tensor cores work on the current one. Shared-memory rows
// are padded by 8 bf16 (16 bytes): the 8 rows one ldmatrix phase reads then
// start in 8 different 16-byte bank groups, so fragment loads are conflict-free.
//
// This is the pre-Hopper (sm_80 style) recipe: no TMA, no wgmma, no warp
// specialisation. It shows what tensor cores give before Hopper's own features.
#include <mma.h>

#include "common.cuh"

namespace {
using namespace nvcuda;

constexpr int BM = 128, BN = 256, BK = 32;
constexpr int WM = 64, WN = 64;  // warp tile
constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int STAGES = 4;
constexpr int FM = WM / 16, FN = WN / 16;  // fragments per warp tile
constexpr int A_LD = BK + 8;               // padded row lengths (elements)
constexpr int B_LD = BN + 8;
constexpr int A_STAGE = BM * A_LD;  // elements per stage
constexpr int B_STAGE = BK * B_LD;
constexpr size_t SMEM_BYTES = size_t(STAGES) * (A_STAGE + B_STAGE) * sizeof(bf16);

static_assert(THREADS == 256, "8 warps");
static_assert((BM * BK / 8) % THREADS == 0 && (BK * BN / 8) % THREADS == 0, "whole 16-byte chunks per thread");
// wmma::load_matrix_sync needs 32-byte aligned fragment pointers.
static_assert((16 * A_LD * sizeof(bf16)) % 32 == 0 && (A_STAGE * sizeof(bf16)) % 32 == 0, "A alignment");
static_assert((16 * B_LD * sizeof(bf16)) % 32 == 0 && (B_STAGE * sizeof(bf16)) % 32 == 0, "B alignment");
static_assert(SMEM_BYTES >= size_t(THREADS / 32) * 256 * sizeof(float), "epilogue scratch fits");

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    // .cg: cache in L2 only; each operand byte is used once per block from shared memory
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// wmma::load_matrix_sync from shared memory, spelled with the PTX `.shared`
// state space. Through the C++ API nvcc emits the generic form for these
// dynamic-shared-memory pointers, which ptxas turns into four 32-bit generic
// loads per fragment (plus MOVM transposes for B); with `.shared` it emits one
// ldmatrix per fragment (LDSM.16.M88.4 for A, LDSM.16.MT88.4 for row-major B).
// The fragment storage is the same 4 x 32-bit registers the API fills.
template <typename Frag>
__device__ __forceinline__ void load_a(Frag& f, const bf16* p, int ldm) {
    unsigned* r = reinterpret_cast<unsigned*>(&f.x[0]);
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s), "r"(ldm));
}
template <typename Frag>
__device__ __forceinline__ void load_b(Frag& f, const bf16* p, int ldm) {
    unsigned* r = reinterpret_cast<unsigned*>(&f.x[0]);
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s), "r"(ldm));
}

// Issue the copies of K-tile `kt` into ring slot `slot`.
__device__ __forceinline__ void load_stage(bf16* As, bf16* Bs, const bf16* a_blk, const bf16* b_blk, int kt, int K,
                                           int N) {
    const int t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < BM * BK / 8 / THREADS; ++i) {  // 4 chunks of 8 per A row
        const int c = t + i * THREADS;
        const int row = c / (BK / 8), col = (c % (BK / 8)) * 8;
        cp_async_16(As + row * A_LD + col, a_blk + static_cast<size_t>(row) * K + kt * BK + col);
    }
#pragma unroll
    for (int i = 0; i < BK * BN / 8 / THREADS; ++i) {  // 32 chunks per B row: one warp per row
        const int c = t + i * THREADS;
        const int row = c / (BN / 8), col = (c % (BN / 8)) * 8;
        cp_async_16(Bs + row * B_LD + col, b_blk + static_cast<size_t>(kt * BK + row) * N + col);
    }
}
}  // namespace

template <typename OutT>
__global__ void __launch_bounds__(THREADS, 1)
gemm_wmma_kernel(const bf16* __restrict__ A, const bf16* __restrict__ B, OutT* __restrict__ C, int M, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* As = reinterpret_cast<bf16*>(smem_raw);
    bf16* Bs = As + STAGES * A_STAGE;

    int tile_m, tile_n;
    grouped_tile(M / BM, N / BN, tile_m, tile_n);
    const bf16* a_blk = A + static_cast<size_t>(tile_m) * BM * K;
    const bf16* b_blk = B + static_cast<size_t>(tile_n) * BN;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    const int KT = K / BK;
    // Prologue: fill STAGES - 1 slots. One commit group per K-tile (possibly
    // empty) keeps the wait_group count below uniform.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(As + s * A_STAGE, Bs + s * B_STAGE, a_blk, b_blk, s, K, N);
        cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();  // K-tile kt has landed (for this thread)...
        __syncthreads();              // ...and for all threads; slot kt-1 is free again
        const int next = kt + STAGES - 1;
        if (next < KT) {
            const int slot = next % STAGES;
            load_stage(As + slot * A_STAGE, Bs + slot * B_STAGE, a_blk, b_blk, next, K, N);
        }
        cp_async_commit();

        const bf16* as = As + (kt % STAGES) * A_STAGE + (warp_m * WM) * A_LD;
        const bf16* bs = Bs + (kt % STAGES) * B_STAGE + warp_n * WN;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a_frag[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b_frag[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) load_a(a_frag[i], as + (i * 16) * A_LD + kk, A_LD);
#pragma unroll
            for (int j = 0; j < FN; ++j) load_b(b_frag[j], bs + kk * B_LD + j * 16, B_LD);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is now free: reuse it as epilogue scratch

    // Epilogue: the accumulator's register layout is opaque, so each fragment
    // goes through a per-warp 16x16 fp32 scratch in shared memory; then every
    // lane converts and writes 8 consecutive outputs of one row (16 or 32 bytes).
    float* scratch = reinterpret_cast<float*>(smem_raw) + warp * 256;
    const int r = lane / 2, c = (lane % 2) * 8;
    const int row0 = tile_m * BM + warp_m * WM, col0 = tile_n * BN + warp_n * WN;
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            wmma::store_matrix_sync(scratch, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            const float4 v0 = *reinterpret_cast<const float4*>(scratch + r * 16 + c);
            const float4 v1 = *reinterpret_cast<const float4*>(scratch + r * 16 + c + 4);
            OutT* out = C + static_cast<size_t>(row0 + i * 16 + r) * N + col0 + j * 16 + c;
            store_out4(out, v0);
            store_out4(out + 4, v1);
            __syncwarp();  // scratch is overwritten by the next fragment
        }
    }
}

template <typename OutT>
static cudaError_t launch_wmma(const bf16* a, const bf16* b, OutT* c, int M, int N, int K, cudaStream_t stream) {
    // More than 48 KB of dynamic shared memory needs an opt-in per device; do it
    // on the first launch there (warm-up), not on every call, so that calls
    // captured into a CUDA graph are plain launches.
    static bool opted_in[64] = {};
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 64 && !opted_in[dev]) {
        err = cudaFuncSetAttribute(gemm_wmma_kernel<OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(SMEM_BYTES));
        if (err != cudaSuccess) return err;
        opted_in[dev] = true;
    }
    const dim3 grid((M / BM) * (N / BN));
    gemm_wmma_kernel<OutT><<<grid, THREADS, SMEM_BYTES, stream>>>(a, b, c, M, N, K);
    return cudaGetLastError();
}

cudaError_t ladder_wmma(const void* A, const void* B, void* C, bool c_fp32, int M, int N, int K,
                        cudaStream_t stream) {
    if (M % BM || N % BN || K % BK) return cudaErrorInvalidValue;
    const auto* a = static_cast<const bf16*>(A);
    const auto* b = static_cast<const bf16*>(B);
    if (c_fp32) return launch_wmma(a, b, static_cast<float*>(C), M, N, K, stream);
    return launch_wmma(a, b, static_cast<bf16*>(C), M, N, K, stream);
}
