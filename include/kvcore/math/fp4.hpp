// FP4 E2M1 codec with power-of-two block scales (DeepSeek-V4's indexer rows).
//
// E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; magnitudes
// 0, 0.5, 1, 1.5, 2, 3, 4, 6; no infinities, no NaN. A code is one byte
// (sign in bit 3, magnitude in bits 0..2): kvcore keeps one code per byte.
// Encoding rounds to nearest, ties to the even code, and saturates to +-6
// (PTX cvt.rn.satfinite.e2m1x2.f32). Non-finite inputs, as CUDA's
// __nv_cvt_float_to_fp4 defines them: +-inf -> +-6; NaN -> +6 (code 0x7).
// Block scale: 2^ceil(log2(max(amax, 1e-4) / 6)) per block of 32, computed
// exactly from the float's bits (see pow2_scale_exponent in fp8.hpp).
#pragma once
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

inline constexpr float kE2M1Max = 6.0f;
inline constexpr int kFp4Block = 32;  // values per power-of-two scale

// Branch-free (a GPU warp whose lanes hold values of either range would run both sides of a
// branch): the magnitude code is the number of rounding boundaries at or below |x|, the ties
// going to the even code (0.25, 1.25, 2.5 and 5 round down; 0.75, 1.75 and 3.5 up), compared
// as bit patterns (ordered like the values for |x|). Above 5 (6 and inf too) it is 7, the
// saturation; a NaN exceeds every boundary (code 7) and drops its sign.
KVCORE_HD uint8_t e2m1_encode(float x) {
  const uint32_t u = float_bits(x), a = u & 0x7fffffffu;
  const uint32_t code = static_cast<uint32_t>(a > 0x3e800000u) + static_cast<uint32_t>(a >= 0x3f400000u) +
                        static_cast<uint32_t>(a > 0x3fa00000u) + static_cast<uint32_t>(a >= 0x3fe00000u) +
                        static_cast<uint32_t>(a > 0x40200000u) + static_cast<uint32_t>(a >= 0x40600000u) +
                        static_cast<uint32_t>(a > 0x40a00000u);
  const uint32_t sign = a > 0x7f800000u ? 0u : (u >> 28) & 0x8u;
  return static_cast<uint8_t>(sign | code);
}

KVCORE_HD float e2m1_decode(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x8u) << 28;
  const uint32_t e = (c >> 1) & 0x3u;
  const uint32_t m = c & 0x1u;
  if (e == 0) return bits_float(sign | (m ? 0x3f000000u : 0u));  // 0 or 0.5
  return bits_float(sign | ((e + 126u) << 23) | (m << 22));
}

// Exponent k of the block scale 2^k = 2^ceil(log2(max(amax, 1e-4) / 6)), exactly.
// 6 = 1.5 * 2^2, fraction bits of 1.5 = 0x400000.
KVCORE_HD int e2m1_scale_exponent(float amax) {
  const float a = (amax >= kScaleAmaxFloor) ? amax : kScaleAmaxFloor;
  return pow2_scale_exponent<0x400000u, 2>(a);
}

// v / 2^k clamped to +-6 (NaN passes through to the encoder).
KVCORE_HD float e2m1_scaled(float v, float inv_scale) {
  float s = v * inv_scale;
  s = s > kE2M1Max ? kE2M1Max : s;
  s = s < -kE2M1Max ? -kE2M1Max : s;
  return s;
}

KVCORE_HD uint8_t e2m1_encode_scaled(float v, int k) { return e2m1_encode(e2m1_scaled(v, pow2f(-k))); }

// One value's FP4 round trip given the block's scale exponent k.
KVCORE_HD float e2m1_round_trip(float v, int k) { return e2m1_decode(e2m1_encode_scaled(v, k)) * pow2f(k); }

// The FP4 round trip of one block of n <= 32 values (src and dst may alias):
// the scale comes from the finite values only. Returns the scale exponent.
KVCORE_HD int fp4_block_round_trip(const float* src, float* dst, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = finite_abs_max(amax, src[i]);
  const int k = e2m1_scale_exponent(amax);
  for (int i = 0; i < n; ++i) dst[i] = e2m1_round_trip(src[i], k);
  return k;
}

}  // namespace kvcore::math
