// Device helpers shared by the ladder kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "ladder.h"

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// Grouped tile order (as in the Triton baseline): consecutive blocks walk down
// GROUP_M tile-rows before moving right, so the A and B panels that co-resident
// blocks read stay in L2.
__device__ __forceinline__ void grouped_tile(int tiles_m, int tiles_n, int& tile_m, int& tile_n) {
    constexpr int GROUP_M = 8;
    const int pid = blockIdx.x;
    const int group_size = GROUP_M * tiles_n;
    const int first_m = (pid / group_size) * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    tile_m = first_m + (pid % group_size) % rows;
    tile_n = (pid % group_size) / rows;
}

// Four consecutive outputs: one 16-byte store for fp32, one 8-byte store for bf16.
__device__ __forceinline__ void store_out4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store_out4(bf16* p, float4 v) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
    __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 packed;
    packed.x = *reinterpret_cast<unsigned*>(&lo);
    packed.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(p) = packed;
}
