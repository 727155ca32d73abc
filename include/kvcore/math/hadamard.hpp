// Orthonormal Walsh-Hadamard transform (DeepSeek-V4 rotates indexer rows with
// the 128-point one, scaled by 128^-0.5, before FP4).
//
// H[i][j] = (-1)^popcount(i & j) / sqrt(N), symmetric, H * H = I.
// The fast transform runs log2(N) butterfly stages in a FIXED order
// (stride 1, 2, 4, ...; within a pair (a, b) -> (a + b, a - b), a the lower
// index) and multiplies by N^-0.5 at the end, so every implementation that
// follows this network (the per-thread loop below, the warp version on the
// GPU) gives identical bits.
#pragma once
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

inline constexpr int kHadamardDim = 128;
inline constexpr float kHadamard128Scale = 0.08838834764831845f;  // 128^-0.5 rounded to f32

// N^-0.5 rounded to f32, for the powers of two this header supports.
template <int N>
constexpr KVCORE_HD float hadamard_scale() {
  static_assert(N >= 2 && N <= 1024 && (N & (N - 1)) == 0, "Hadamard size must be a power of two in [2, 1024]");
  if constexpr (N == 2) return 0.7071067811865476f;
  else if constexpr (N == 4) return 0.5f;
  else if constexpr (N == 8) return 0.3535533905932738f;
  else if constexpr (N == 16) return 0.25f;
  else if constexpr (N == 32) return 0.1767766952966369f;
  else if constexpr (N == 64) return 0.125f;
  else if constexpr (N == 128) return kHadamard128Scale;
  else if constexpr (N == 256) return 0.0625f;
  else if constexpr (N == 512) return 0.04419417382415922f;
  else return 0.03125f;
}

// One butterfly stage of stride h over x[0..N).
template <int N>
KVCORE_HD void hadamard_stage(float* x, int h) {
  for (int i = 0; i < N; i += 2 * h) {
    for (int j = i; j < i + h; ++j) {
      const float a = x[j], b = x[j + h];
      x[j] = a + b;
      x[j + h] = a - b;
    }
  }
}

// In place: x <- H x (orthonormal). Works per thread on the device (x in registers/local memory).
template <int N = kHadamardDim>
KVCORE_HD void hadamard_transform(float* x) {
  for (int h = 1; h < N; h *= 2) hadamard_stage<N>(x, h);
  const float s = hadamard_scale<N>();
  for (int i = 0; i < N; ++i) x[i] *= s;
}

KVCORE_HD void hadamard128(float* x) { hadamard_transform<kHadamardDim>(x); }

#if defined(__CUDACC__)
// Warp-cooperative 128-point transform: lane l holds x[4l .. 4l+3] in v[0..3].
// Same butterfly network and order as hadamard_transform<128>, so the same bits.
// All 32 lanes of the warp must call it together.
__device__ __forceinline__ void hadamard128_warp(float (&v)[4], int lane) {
  // strides 1 and 2 stay inside a lane
  float a = v[0], b = v[1];
  v[0] = a + b;
  v[1] = a - b;
  a = v[2];
  b = v[3];
  v[2] = a + b;
  v[3] = a - b;
  a = v[0];
  b = v[2];
  v[0] = a + b;
  v[2] = a - b;
  a = v[1];
  b = v[3];
  v[1] = a + b;
  v[3] = a - b;
  // strides 4..64 pair lane l with lane l ^ (h / 4); the lower lane keeps a + b, the upper a - b
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, v[i], m);
      v[i] = upper ? other - v[i] : v[i] + other;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] *= kHadamard128Scale;
}
#endif

}  // namespace kvcore::math
