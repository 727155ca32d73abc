// The general prefill building blocks (any shape, any alignment, windows that take
// candidates from the state): the one-window-a-block body and the state update. Used by
// prefill_kernel (dsv4.cu) and, for the one or two windows at a chunk's start and the state
// update, by the fast path's kernels (dsv4_prefill.cu), so those need no launch of their own.
#pragma once
#include <cuda_runtime.h>

#include "cuda/dsv4/dsv4_common.cuh"

namespace kvcore::ops::cuda::dsv4 {

// One block per window completed by the chunk; candidates from the chunk or the state.
// Two instantiations, so each gets its own registers: the 8-candidate register pool (CSA,
// the indexer) and the one-pass pool (HCA); the same choice dsv4_pool_any makes, so the
// same bits as emission from the state.
template <bool kEight, class At>
__device__ inline float prefill_pool(const CompressorParams& p, const At& at) {
  if constexpr (kEight) {
    return math::dsv4_pool_fixed<8>(at);
  } else {
    return math::dsv4_pool_any(p.state_rows, at);
  }
}

// A window whose candidates all lie in the chunk (every window but the first one or two):
// a branch-free fetch, so the loads of all candidates are in flight together (the general
// prefill_candidate branches per candidate, and a use inside each branch serialized the
// loads: one memory latency per candidate). The same values: c, and z + ape in f32.
template <bool kEight, bool kApeF16>
__device__ inline float prefill_pool_in_chunk(const CompressorParams& p, int64_t w, int k) {
  const int32_t m = p.ratio;
  const int64_t lane_a = (p.overlap ? w - 1 : w) * m - p.pos;  // chunk index of candidate 0
  const int64_t lane_b = w * m - p.pos;                         // of candidate m (overlap)
  return prefill_pool<kEight>(p, [&](int j, float& z, float& c) {
    const bool b = p.overlap && j >= m;
    const int32_t jm = b ? j - m : j;
    const int32_t col = b ? p.head_dim + k : k;
    const int64_t i = (b ? lane_b : lane_a) + jm;
    float a;
    if constexpr (kApeF16) {
      a = math::f16_bits_to_f32(static_cast<const uint16_t*>(p.ape)[jm * p.ape_stride + col]);
    } else {
      a = static_cast<const float*>(p.ape)[jm * p.ape_stride + col];
    }
    c = p.c[i * p.c_stride + col];
    z = p.z[i * p.z_stride + col] + a;
  });
}

// kMaybeInChunk false: the caller knows the window takes candidates from before the chunk
// (the fast path's edge windows), so only the general fetch is compiled in (fewer registers).
template <bool kEight, bool kMaybeInChunk = true>
__device__ inline void prefill_window_body(const CompressorParams& p, float* smem, int64_t w) {
  float* buf = smem;
  float* scratch = smem + p.head_dim;
  const bool in_chunk = kMaybeInChunk && (p.overlap ? w - 1 : w) * p.ratio >= p.pos;  // block-uniform
  for (int k = threadIdx.x; k < p.head_dim; k += blockDim.x) {
    if constexpr (kMaybeInChunk) {
      if (in_chunk) {
        buf[k] = p.ape_f16 ? prefill_pool_in_chunk<kEight, true>(p, w, k) : prefill_pool_in_chunk<kEight, false>(p, w, k);
        continue;
      }
    }
    buf[k] = prefill_pool<kEight>(p, [&](int j, float& z, float& c) { prefill_candidate(p, w, j, k, z, c); });
  }
  __syncthreads();
  finish_row(p, w, buf, scratch);
}

// The state as token-by-token storing leaves it. A thread per (column, row r < m):
// row r, then (overlapping states) row m + r, whose old value row r may copy: the
// only order between rows. (A thread walking all 128 rows of an HCA state was a
// chain of dependent loads: tens of microseconds.)
__device__ inline void prefill_state_row(const CompressorParams& p, int32_t r, int k) {
  int64_t tok = 0;
  int32_t src = 0;
  const int how = prefill_state_source(p, r, &tok, &src);
  const int64_t dst = static_cast<int64_t>(r) * p.width + k;
  if (how == 1) {
    const int64_t t = p.pos + tok;
    p.state_kv[dst] = p.c[tok * p.c_stride + k];
    p.state_score[dst] = p.z[tok * p.z_stride + k] + ape_value(p, t % p.ratio, k);
  } else if (how == 2) {
    p.state_kv[dst] = p.state_kv[static_cast<int64_t>(src) * p.width + k];
    p.state_score[dst] = p.state_score[static_cast<int64_t>(src) * p.width + k];
  }
}

}  // namespace kvcore::ops::cuda::dsv4
