// DeepSeek-V4's indexer-row codec: the orthonormal 128-point Hadamard transform, then the
// FP4 E2M1 round trip in 4 blocks of 32 (power-of-two scale per block). Rows are stored in
// the rotated space (queries get the same rotation, and H is orthonormal, so q.k is kept
// up to the FP4 error). With quantization off the engine skips this entirely.
#pragma once
#include "kvcore/math/fp4.hpp"
#include "kvcore/math/hadamard.hpp"
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

// In place on x[128]: x <- FP4(H x), one scale per 32 values.
KVCORE_HD void fp4_hadamard_round_trip128(float* x) {
  hadamard128(x);
  for (int b = 0; b < kHadamardDim / kFp4Block; ++b) fp4_block_round_trip(x + b * kFp4Block, x + b * kFp4Block, kFp4Block);
}

#if defined(__CUDACC__)
// Warp-cooperative version: lane l holds x[4l .. 4l+3] in v; all 32 lanes call it together.
// Same bits as fp4_hadamard_round_trip128 (same transform network; the block amax is an exact max).
__device__ __forceinline__ void fp4_hadamard_round_trip128_warp(float (&v)[4], int lane) {
  hadamard128_warp(v, lane);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = finite_abs_max(amax, v[i]);
#pragma unroll
  for (int m = 1; m < kFp4Block / 4; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));  // 8 lanes per block
  const int k = e2m1_scale_exponent(amax);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = e2m1_round_trip(v[i], k);
}
#endif

}  // namespace kvcore::math
