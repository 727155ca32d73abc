// Per-chunk steps of the 16-byte FP8 store paths (kv_store.cu, kv_store_layers.cu): a thread holds
// 8 consecutive dims of a row in registers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kvcore/math/fp8.hpp"
#include "ops/kv_store_row.hpp"

namespace kvcore::ops::cuda {

// Largest finite |x| of the 8 values (a scale group's max is the max over its chunks).
__device__ __forceinline__ float chunk_amax(const float* x) {
  float a = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) a = math::finite_abs_max(a, x[k]);
  return a;
}

// The 8 values' E4M3 codes at scale exponent k, packed in dim order for one 8-byte store.
__device__ __forceinline__ uint2 fp8_codes8(const float* x, int k) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i / 4] |= static_cast<uint32_t>(kvrow::fp8_code(x[i], k)) << (8 * (i % 4));
  return make_uint2(w[0], w[1]);
}

}  // namespace kvcore::ops::cuda
