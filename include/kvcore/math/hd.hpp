// KVCORE_HD and the bit-level helpers every math header builds on.
// Everything under math/ compiles for host and device: CPU and CUDA kernels
// call the same functions, so both backends compute the same function.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVCORE_HD __host__ __device__ __forceinline__
#else
#define KVCORE_HD inline
#endif

namespace kvcore::math {

template <class T>
constexpr KVCORE_HD T ceil_div(T a, T b) { return (a + b - 1) / b; }

KVCORE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

KVCORE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Integer shift right by s (1 <= s <= 31) with round-to-nearest, ties to even.
KVCORE_HD uint32_t rne_shift(uint32_t m, uint32_t s) {
  if (s >= 32) return 0;  // callers only pass m < 2^24 here, so the result is below one half
  const uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

KVCORE_HD bool is_finite_bits(uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }

}  // namespace kvcore::math
