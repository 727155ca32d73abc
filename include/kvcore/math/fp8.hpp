// FP8 E4M3FN codec and UE8M0 power-of-two block scales (DeepSeek-V4's KV format).
//
// E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7f/0xff
// are NaN; largest finite 448; subnormal step 2^-9.
// Encoding rounds to nearest, ties to the even code, and saturates to +-448
// (the semantics of PTX cvt.rn.satfinite.e4m3x2.f32). Non-finite inputs:
//   NaN -> 0x7f (decodes to NaN); +-inf -> +-448 (saturated, like satfinite).
// All of it is integer arithmetic on the float's bits: no log2/exp2 calls,
// so host and device give identical codes for identical inputs.
#pragma once
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kScaleAmaxFloor = 1.0e-4f;  // amax floor of DeepSeek-V4's block scales
inline constexpr int kFp8Block = 64;             // values per UE8M0 scale

// Round |x| (bits a, sign cleared, finite) onto a minifloat grid of `mant_bits`
// mantissa bits whose smallest normal is 2^(emin_f32 - 127). Returns the
// unsigned code (exponent<<mant_bits | mantissa) before saturation. Subnormals
// and normals share one formula: the code is the value in units of the local
// grid step, rounded to nearest even, offset by the exponent.
template <int kMantBits, int kEminF32>
KVCORE_HD uint32_t minifloat_round_code(uint32_t a) {
  const uint32_t e = a >> 23;
  const uint32_t m = e ? ((a & 0x7fffffu) | 0x800000u) : (a & 0x7fffffu);
  const uint32_t e_eff = e ? e : 1u;
  constexpr uint32_t kNormShift = 23u - kMantBits;
  if (e_eff >= static_cast<uint32_t>(kEminF32))
    return ((e_eff - kEminF32) << kMantBits) + rne_shift(m, kNormShift);
  return rne_shift(m, kNormShift + (kEminF32 - e_eff));
}

KVCORE_HD uint8_t e4m3_encode(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;                  // NaN
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  uint32_t code = minifloat_round_code<3, 121>(a);    // 121 = 127 - 6: smallest normal 2^-6
  if (code > 0x7eu) code = 0x7eu;                     // (448, 464] rounds past 448: saturate
  return static_cast<uint8_t>(sign | code);
}

KVCORE_HD float e4m3_decode(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xfu;
  const uint32_t m = c & 0x7u;
  if (e == 0xfu && m == 0x7u) return bits_float(0x7fc00000u | sign);
  if (e == 0) return bits_float(sign | float_bits(static_cast<float>(m) * 0.001953125f));
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

// Exponent k of the smallest power of two with 2^k >= amax / max_code_value,
// exactly (as real numbers). amax must be finite and >= 1e-4 (a normal float).
// max_code_value = mant * 2^exp with mant in [1, 2) given by its fraction bits.
template <uint32_t kMaxFracBits, int kMaxExp>
KVCORE_HD int pow2_scale_exponent(float amax) {
  const uint32_t a = float_bits(amax) & 0x7fffffffu;
  const int e = static_cast<int>(a >> 23) - 127;
  const uint32_t frac = a & 0x7fffffu;
  return e - kMaxExp + (frac > kMaxFracBits ? 1 : 0);
}

// UE8M0 scale exponent for an FP8 block: 2^ceil(log2(max(amax, 1e-4) / 448)).
// 448 = 1.75 * 2^8, fraction bits of 1.75 = 0x600000.
KVCORE_HD int e4m3_scale_exponent(float amax) {
  const float a = (amax >= kScaleAmaxFloor) ? amax : kScaleAmaxFloor;  // NaN-free input expected
  return pow2_scale_exponent<0x600000u, 8>(a);
}

KVCORE_HD float pow2f(int k) {  // 2^k for k in [-126, 127]
  return bits_float(static_cast<uint32_t>(k + 127) << 23);
}

KVCORE_HD uint8_t ue8m0_encode(int k) { return static_cast<uint8_t>(k + 127); }
// 0xff is NaN, 0 is 2^-127. Selects, not branches: attention decodes 8 scales per step.
KVCORE_HD float ue8m0_decode(uint8_t b) {
  const uint32_t normal = static_cast<uint32_t>(b) << 23;
  return bits_float(b == 0xffu ? 0x7fc00000u : (b == 0 ? 0x00400000u : normal));
}

// The scaled value that gets encoded: v / scale, clamped to +-448 as the seed does.
KVCORE_HD float e4m3_scaled(float v, float inv_scale) {
  float s = v * inv_scale;  // inv_scale is a power of two: exact unless it underflows below 2^-126
  s = s > kE4M3Max ? kE4M3Max : s;
  s = s < -kE4M3Max ? -kE4M3Max : s;
  return s;
}

// One value's FP8 round trip given the block's scale exponent k.
KVCORE_HD float e4m3_round_trip(float v, int k) {
  return e4m3_decode(e4m3_encode(e4m3_scaled(v, pow2f(-k)))) * pow2f(k);
}

// max |v| over finite values (NaN and inf do not set the scale).
KVCORE_HD float finite_abs_max(float acc, float v) {
  const float a = v < 0 ? -v : v;
  return (is_finite_bits(float_bits(v)) && a > acc) ? a : acc;
}

}  // namespace kvcore::math
