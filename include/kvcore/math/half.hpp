// f16 and bf16 storage types and their conversions to and from f32.
// Round to nearest even; host and device give identical bits for every
// non-NaN input (the device path uses the hardware conversions, which are
// IEEE-exact; NaNs become the canonical quiet NaN on both).
#pragma once
#include "kvcore/math/hd.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kvcore {

// Plain 16-bit storage: trivially copyable, layout-identical to __half / __nv_bfloat16.
struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

namespace math {

KVCORE_HD uint16_t f32_to_f16_bits(float f) {
#if defined(__CUDA_ARCH__)
  if (f != f) return 0x7e00u;
  return __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7e00u;                     // NaN: canonical quiet NaN
  if (a >= 0x47800000u) return sign | 0x7c00u;             // >= 65536 (and inf) -> inf
  if (a >= 0x38800000u) {                                  // normal f16 range, >= 2^-14
    const uint32_t r = a - (112u << 23);                   // rebias 127 -> 15
    return sign | static_cast<uint16_t>((r + 0xfffu + ((r >> 13) & 1u)) >> 13);  // carry may give inf: correct
  }
  if (a < 0x33000000u) return sign;                        // < 2^-25 (the tie at 2^-25 goes to 0)
  const uint32_t e = a >> 23;                              // f16 subnormal: value / 2^-24, rounded
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return sign | static_cast<uint16_t>(rne_shift(m, 126u - e));
#endif
}

KVCORE_HD float f16_bits_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_float(sign);
  // subnormal: m * 2^-24, exact in f32
  const float v = static_cast<float>(m) * 5.9604644775390625e-08f;
  return sign ? -v : v;
#endif
}

KVCORE_HD uint16_t f32_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN: canonical quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

KVCORE_HD float bf16_bits_to_f32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

}  // namespace math

KVCORE_HD float to_f32(float x) { return x; }
KVCORE_HD float to_f32(f16 x) { return math::f16_bits_to_f32(x.bits); }
KVCORE_HD float to_f32(bf16 x) { return math::bf16_bits_to_f32(x.bits); }

// from_f32<T>(x): round x to storage type T (round to nearest even).
template <class T>
KVCORE_HD T from_f32(float x);
template <>
KVCORE_HD float from_f32<float>(float x) { return x; }
template <>
KVCORE_HD f16 from_f32<f16>(float x) { return f16{math::f32_to_f16_bits(x)}; }
template <>
KVCORE_HD bf16 from_f32<bf16>(float x) { return bf16{math::f32_to_bf16_bits(x)}; }

}  // namespace kvcore
