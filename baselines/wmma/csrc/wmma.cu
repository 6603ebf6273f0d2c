// Rung 4: tensor cores through nvcuda::wmma (16x16x16 bf16 fragments, fp32 accumulate).
//
// A 256-thread block computes a 128x256 tile of C; its 8 warps form a 2x4 grid
// and each owns a 64x64 sub-tile, i.e. 4x4 accumulator fragments (128 fp32
// registers per thread). A large tile is what keeps the tensor cores fed: per
// 16-deep step a warp loads 8 fragments and issues 16 MMAs, and the block reads
// (128 + 256) * 64 bf16 from L2 per 128 * 256 * 64 multiply-adds.
//
// Operands move global -> shared with cp.async (16 bytes per instruction, no
// register staging) into a 3-slot ring of 64-deep K-tiles, so the loads for the
// next two K-tiles are in flight while the tensor cores work on the current
// one. Shared-memory rows are padded by 8 bf16 (16 bytes): the 8 rows one
// ldmatrix phase reads then start in 8 different 16-byte bank groups, so
// fragment loads are conflict-free.
//
// The main loop is software-pipelined; three choices matter:
//
// - Double-buffered fragments. With one set of fragments a warp loads 8
//   fragments, waits for the ldmatrix results, then issues 16 MMAs: the tensor
//   cores idle during every load. With two sets (64 more registers per thread)
//   the fragments of step s+1 are loaded while the MMAs of step s run. The
//   barrier that hands the warp over to the next ring slot is placed after the
//   MMAs of the second-to-last step, so those MMAs cover the wait, and the
//   last step's MMAs cover the load of the next slot's first fragments.
// - BK = 64 (4 steps of 16 per slot). A block barrier per K-tile stalls every
//   warp until the slowest one arrives; a deeper K-tile halves the barriers and
//   cp.async waits per multiply-add compared with BK = 32, and gives the
//   pipeline four steps to hide them in. The ring shrinks to 3 slots to fit
//   (3 x 51 KB of shared memory); a K-tile's copies, issued two K-tiles ahead,
//   still get 5 to 7 steps (80 to 112 MMAs per warp) to land.
// - Copies spread over the steps. A slot's refill is 12 cp.async per thread
//   (4 for the 128x64 A tile, 8 for the 64x256 B tile). Issued all at once
//   they hold up that step's MMAs behind a burst of copies; instead step 0
//   issues the A tile, step 1 the first 32 rows of B and step 2 the last 32,
//   each next to 16 MMAs, and the K-tile's commit group is closed before
//   step 2's wait.
//
// Measured on an H100 (2026-11-22, a tuning sweep of this kernel's knobs, same
// run, bf16 out, all variants correct to a max relative error of 3.9e-3):
//   previous version (BK 32, 4 stages, single-buffered fragments):
//     271 TFLOP/s at 4096^3, 279 at 8192^3
//   this version (BK 64, 3 stages, double-buffered fragments, split copies):
//     378.8 TFLOP/s at 4096^3 (38.3% of the 989 TFLOP/s dense bf16 peak),
//     364.2 at 8192^3 -- the fastest of the sweep.
//
// This is the pre-Hopper (sm_80 style) recipe: no TMA, no wgmma, no warp
// specialisation. It shows what tensor cores give before Hopper's own features.
#include <mma.h>

#include "common.cuh"

namespace {
using namespace nvcuda;

constexpr int BM = 128, BN = 256, BK = 64;
constexpr int WM = 64, WN = 64;  // warp tile
constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int STAGES = 3;
constexpr int KSTEPS = BK / 16;            // 16-deep MMA steps per K-tile
constexpr int FM = WM / 16, FN = WN / 16;  // fragments per warp tile
constexpr int A_LD = BK + 8;               // padded row lengths (elements)
constexpr int B_LD = BN + 8;
constexpr int A_STAGE = BM * A_LD;  // elements per ring slot
constexpr int B_STAGE = BK * B_LD;
constexpr size_t SMEM_BYTES = size_t(STAGES) * (A_STAGE + B_STAGE) * sizeof(bf16);
constexpr int A_CHUNKS = BM * BK / 8 / THREADS;  // 16-byte copies per thread per K-tile
constexpr int B_CHUNKS = BK * BN / 8 / THREADS;

static_assert(THREADS == 256, "8 warps");
static_assert(KSTEPS == 4, "the schedule below: copies at steps 0-2, slot hand-over after step 2");
static_assert(A_CHUNKS == 4 && B_CHUNKS == 8, "copy split: A tile, B rows 0-31, B rows 32-63");
static_assert((BM * BK / 8) % THREADS == 0 && (BK * BN / 8) % THREADS == 0, "whole 16-byte chunks per thread");
// wmma::load_matrix_sync needs 32-byte aligned fragment pointers.
static_assert((16 * A_LD * sizeof(bf16)) % 32 == 0 && (A_STAGE * sizeof(bf16)) % 32 == 0, "A alignment");
static_assert((16 * B_LD * sizeof(bf16)) % 32 == 0 && (B_STAGE * sizeof(bf16)) % 32 == 0, "B alignment");
static_assert(SMEM_BYTES <= 227 * 1024, "dynamic shared memory per block");
static_assert(SMEM_BYTES >= size_t(THREADS / 32) * 256 * sizeof(float), "epilogue scratch fits");

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

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
__device__ __forceinline__ void load_a(FragA& f, const bf16* p, int ldm) {
    unsigned* r = reinterpret_cast<unsigned*>(&f.x[0]);
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s), "r"(ldm));
}
__device__ __forceinline__ void load_b(FragB& f, const bf16* p, int ldm) {
    unsigned* r = reinterpret_cast<unsigned*>(&f.x[0]);
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s), "r"(ldm));
}

// Copies of K-tile `kt` into one ring slot, in the three parts the main loop
// spreads over its steps. Every thread copies 16 bytes per chunk; consecutive
// threads take consecutive chunks of a row, so each warp reads whole 128-byte
// lines.
//
// The 128x64 A tile: 8 chunks per row, 4 per thread.
__device__ __forceinline__ void copy_a_tile(bf16* As, const bf16* a_blk, int kt, int K) {
#pragma unroll
    for (int i = 0; i < A_CHUNKS; ++i) {
        const int c = threadIdx.x + i * THREADS;
        const int row = c / (BK / 8), col = (c % (BK / 8)) * 8;
        cp_async_16(As + row * A_LD + col, a_blk + static_cast<size_t>(row) * K + kt * BK + col);
    }
}
// Rows [row0, row0 + 32) of the 64x256 B tile: 32 chunks per row (one warp per
// row), 4 per thread.
__device__ __forceinline__ void copy_b_half(bf16* Bs, const bf16* b_blk, int kt, int N, int row0) {
#pragma unroll
    for (int i = 0; i < B_CHUNKS / 2; ++i) {
        const int c = threadIdx.x + i * THREADS;
        const int row = row0 + c / (BN / 8), col = (c % (BN / 8)) * 8;
        cp_async_16(Bs + row * B_LD + col, b_blk + static_cast<size_t>(kt * BK + row) * N + col);
    }
}
__device__ __forceinline__ void copy_k_tile(bf16* As, bf16* Bs, const bf16* a_blk, const bf16* b_blk, int kt, int K,
                                            int N) {
    copy_a_tile(As, a_blk, kt, K);
    copy_b_half(Bs, b_blk, kt, N, 0);
    copy_b_half(Bs, b_blk, kt, N, BK / 2);
}

// The fragments of one 16-deep step (column kk of the K-tile) of the warp tile;
// `as` / `bs` point at the warp's corner of a ring slot.
__device__ __forceinline__ void load_frags(FragA (&a)[FM], FragB (&b)[FN], const bf16* as, const bf16* bs, int kk) {
#pragma unroll
    for (int i = 0; i < FM; ++i) load_a(a[i], as + (i * 16) * A_LD + kk, A_LD);
#pragma unroll
    for (int j = 0; j < FN; ++j) load_b(b[j], bs + kk * B_LD + j * 16, B_LD);
}

__device__ __forceinline__ void mma_step(FragC (&acc)[FM][FN], const FragA (&a)[FM], const FragB (&b)[FN]) {
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
}

__device__ __forceinline__ int next_slot(int s) { return s + 1 == STAGES ? 0 : s + 1; }
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
    const bf16* a_warp = As + (warp_m * WM) * A_LD;  // + slot * A_STAGE
    const bf16* b_warp = Bs + warp_n * WN;           // + slot * B_STAGE

    FragC acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    const int KT = K / BK;
    // Prologue: fill STAGES - 1 slots. One commit group per K-tile (possibly
    // empty) keeps the wait_group count below uniform.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) copy_k_tile(As + s * A_STAGE, Bs + s * B_STAGE, a_blk, b_blk, s, K, N);
        cp_async_commit();
    }

    FragA a_frag[2][FM];  // two fragment sets: step s computes on set s % 2
    FragB b_frag[2][FN];  // while step s + 1's fragments load into the other
    int rd = 0;           // ring slot being read: K-tile kt
    int wr = STAGES - 1;  // ring slot being refilled: K-tile kt + STAGES - 1 (it held kt - 1)

    cp_async_wait<STAGES - 2>();  // K-tile 0 has landed (for this thread)...
    __syncthreads();              // ...and for all threads
    load_frags(a_frag[0], b_frag[0], a_warp, b_warp, 0);

    for (int kt = 0; kt < KT; ++kt) {
        const int next = kt + STAGES - 1;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {  // unrolled: every `ks == ...` below is resolved at compile time
            const int cur = ks % 2;  // KSTEPS is even, so step 0 of every K-tile uses set 0

            // 1. Fragments of the next step. On the last step rd has already
            //    moved on, so this is step 0 of K-tile kt + 1 (after the final
            //    K-tile: a stale slot, read but never used).
            load_frags(a_frag[cur ^ 1], b_frag[cur ^ 1], a_warp + rd * A_STAGE, b_warp + rd * B_STAGE,
                       ((ks + 1) % KSTEPS) * 16);

            // 2. A third of the refill of slot wr. Nobody reads it any more: its
            //    last fragment load came before the previous K-tile's barrier.
            if (next < KT) {
                if (ks == 0) copy_a_tile(As + wr * A_STAGE, a_blk, next, K);
                if (ks == 1) copy_b_half(Bs + wr * B_STAGE, b_blk, next, N, 0);
                if (ks == 2) copy_b_half(Bs + wr * B_STAGE, b_blk, next, N, BK / 2);
            }
            if (ks == 2) {  // close K-tile `next`'s group (empty past the end) before the wait below
                cp_async_commit();
                wr = next_slot(wr);
            }

            // 3. The 16 MMAs of this step, overlapping the loads above.
            mma_step(acc, a_frag[cur], b_frag[cur]);

            // 4. Hand over to the next slot. This warp's reads of slot rd are
            //    done (step 3's fragments were loaded above); the MMAs just
            //    issued keep the tensor cores busy through the wait.
            if (ks == KSTEPS - 2) {
                cp_async_wait<STAGES - 2>();  // K-tile kt + 1 has landed (for this thread)...
                __syncthreads();              // ...and for all; slot rd may be refilled from now on
                rd = next_slot(rd);
            }
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
