// The indexer query as both scorers (the SIMT tiled kernel, the tensor-core kernel) take it:
// all heads of one query row in shared memory, Hadamard + FP4 transformed like the stored rows
// when quantized (the same butterfly network and block scales as the CPU: identical bits).
#pragma once
#include <cuda_runtime.h>

#include "cuda/dsv4/dsv4_common.cuh"
#include "kvcore/math/fp4_hadamard.hpp"

namespace kvcore::ops::cuda::dsv4 {

// The rows query i can see (vis); the invisible rest of its scores [vis, cap) becomes -inf, spread
// over the x blocks of that query's grid row (the scorers' shared prologue).
__device__ __forceinline__ int64_t mask_invisible_scores(const IndexerParams& p, int32_t i) {
  const int64_t vis = min(p.n_rows, visible_rows(p.first_query_pos + i, p.ratio));
  float* sc = p.scores + i * p.scores_stride;
  for (int64_t s = vis + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < p.cap;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x)
    sc[s] = -INFINITY;
  return vis;
}

// The query of row i into qs [n_heads, dim], Hadamard + FP4 transformed like the stored rows
// when quantized (the same butterfly network and block scales as the CPU: identical bits).
__device__ inline void load_query(const IndexerParams& p, float* qs, int32_t i) {
  const float* q = p.q + i * p.q_stride0;
  if (p.quant && p.dim == math::kHadamardDim) {  // the model's case: a warp per head, in registers
    // Heads in groups of kGroup a warp, all loads first: independent shuffle chains to overlap.
    constexpr int kGroup = 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int h0 = warp; h0 < p.n_heads; h0 += kGroup * n_warps) {
      float v[kGroup][4];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const int h = h0 + g * n_warps;
        const float* src = q + (h < p.n_heads ? h : 0) * p.q_stride1 + 4 * lane;
#pragma unroll
        for (int j = 0; j < 4; ++j) v[g][j] = src[j];
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) math::fp4_hadamard_round_trip128_warp(v[g], lane);  // warp-uniform: all lanes
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const int h = h0 + g * n_warps;
        if (h < p.n_heads)
          *reinterpret_cast<float4*>(qs + h * math::kHadamardDim + 4 * lane) = make_float4(v[g][0], v[g][1], v[g][2], v[g][3]);
      }
    }
    __syncthreads();
    return;
  }
  const int n = p.n_heads * p.dim;
  for (int idx = threadIdx.x; idx < n; idx += blockDim.x) {
    const int h = idx / p.dim, d = idx - h * p.dim;
    qs[idx] = q[h * p.q_stride1 + d];
  }
  __syncthreads();
  if (p.quant) {  // FP4 blocks of 32 never straddle two heads (dim % 32 == 0)
    hadamard_smem(qs, p.dim, p.n_heads);
    fp4_blocks(qs, n, nullptr);
    __syncthreads();
  }
}

}  // namespace kvcore::ops::cuda::dsv4
