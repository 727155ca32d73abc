// Per-chunk steps of the 16-byte FP8 store paths (kv_store.cu, kv_store_layers.cu): a thread holds
// 8 consecutive dims of a row in registers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/fp8_hw.cuh"
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

// The 8 values' E4M3 codes at scale exponent k, packed in dim order for one 8-byte store: the
// codes of kvrow::fp8_code, two at a time by fp8_hw's conversions (the hardware's on sm_89+,
// which tests/cuda/codec_hardware_cuda_test.cu proves equal to the shared codec over every f32).
__device__ __forceinline__ uint2 fp8_codes8(const float* x, int k) {
  const float inv = math::pow2f(-k);
  uint32_t pair[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) pair[i] = fp8_hw::encode2_scaled(x[2 * i], x[2 * i + 1], inv);
  return make_uint2(pair[0] | (pair[1] << 16), pair[2] | (pair[3] << 16));
}

}  // namespace kvcore::ops::cuda
