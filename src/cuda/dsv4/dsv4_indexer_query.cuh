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

// The model's query heads (dim 128, quantized), a warp a head in registers: heads first, first +
// step, ... below end, kGroup of them a warp at a time with all loads first (independent shuffle
// chains overlap). store(h, v) receives head h's values at dims 4 lane .. 4 lane + 3, Hadamard +
// FP4 rounded like the stored rows (the CPU's butterfly network and block scales: identical
// bits); heads at or past n_heads (padding) arrive as zeros. Every lane of the warp calls it.
template <int kGroup, class Store>
__device__ __forceinline__ void transform_query_heads(const IndexerParams& p, const float* q, int first, int step, int end,
                                                      Store&& store) {
  const int lane = threadIdx.x & 31;
  for (int h0 = first; h0 < end; h0 += kGroup * step) {  // warp-uniform
    float v[kGroup][4];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int h = h0 + g * step;
      const float* src = q + (h < p.n_heads ? h : 0) * p.q_stride1 + 4 * lane;
#pragma unroll
      for (int j = 0; j < 4; ++j) v[g][j] = src[j];
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) math::fp4_hadamard_round_trip128_warp(v[g], lane);  // all lanes
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int h = h0 + g * step;
      if (h >= end) continue;
      if (h >= p.n_heads) v[g][0] = v[g][1] = v[g][2] = v[g][3] = 0.0f;
      store(h, v[g]);
    }
  }
}

// The query of row i into qs [n_heads, dim], Hadamard + FP4 transformed like the stored rows
// when quantized (the same butterfly network and block scales as the CPU: identical bits).
__device__ inline void load_query(const IndexerParams& p, float* qs, int32_t i) {
  const float* q = p.q + i * p.q_stride0;
  if (p.quant && p.dim == math::kHadamardDim) {  // the model's case: a warp per head, in registers
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    transform_query_heads<4>(p, q, warp, n_warps, p.n_heads, [&](int h, const float (&v)[4]) {
      *reinterpret_cast<float4*>(qs + h * math::kHadamardDim + 4 * lane) = make_float4(v[0], v[1], v[2], v[3]);
    });
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
