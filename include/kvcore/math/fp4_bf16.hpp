// FP4 E2M1 codes times their UE8M0 block scale as bf16 pairs: the operand form of bf16 tensor-core
// instructions (DeepSeek-V4's indexer rows), in a few integer instructions a pair.
//
// Bit for bit bf16(e2m1_decode(c) * ue8m0_decode(b)), the f32 product rounded to bf16, computed
// as the bf16 value of c times the bf16 scale, rounded to nearest: the same bits, because every
// such product is a bf16 value and neither rounding rounds. An E2M1 value has 2 significant bits;
// bf16 has f32's exponent range, and its subnormal step 2^-133 divides the smallest product,
// 0.5 * 2^-127. Products past the largest finite value (b = 253 with |v| >= 4, b = 254 with
// |v| >= 2) are +-inf in both; b = 0xff (NaN) gives the canonical NaN 0x7fff in both on the GPU.
// Only b = 0 and 1 make subnormals (the scale 2^-127 itself, products below 2^-126), which the
// bf16 multiply keeps (PTX's bf16 mul and fma have no .ftz); the encoder never writes them
// (e2m1_scale_exponent gives -15 <= k <= 126: the amax floor 1e-4, the largest finite amax, so
// 112 <= b <= 253). tests/cuda/dsv4_fp4_fragments_test.cu checks every code and byte on the device.
#pragma once
#include "kvcore/math/byte_perm.hpp"
#include "kvcore/math/fp4.hpp"
#include "kvcore/math/half.hpp"

namespace kvcore::math {

// The 8 E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as bf16 (0x0000 0x3f00 0x3f80 0x3fc0 0x4000
// 0x4040 0x4080 0x40c0), split into the tables of their low bytes and of their high bytes, each
// two words (magnitudes 0-3, 4-7) for byte_perm to look 4 of them up at once.
inline constexpr uint32_t kE2M1Bf16Lo03 = 0xc0800000u, kE2M1Bf16Lo47 = 0xc0804000u;
inline constexpr uint32_t kE2M1Bf16Hi03 = 0x3f3f3f00u, kE2M1Bf16Hi47 = 0x40404040u;

// Block scale j (0 <= j < 4) of a word of 4 UE8M0 bytes (byte j) as a bf16 pair, 2^(b - 127) in both halves:
// the upper half of ue8m0_decode's f32 bits (its lower half is zero), b << 7 for 0 < b < 0xff;
// b = 0 is the subnormal 2^-127 (0x0040), b = 0xff the NaN 0x7fc0.
KVCORE_HD uint32_t ue8m0_bf16x2(uint32_t scales, int j) {
  const uint32_t sel = 0x4040u | (static_cast<uint32_t>(j) << 8) | static_cast<uint32_t>(j);  // bytes b, 0, b, 0
  const uint32_t h = byte_perm(scales, 0u, sel) << 7;
  // b = 0xff is the one byte whose h + 0x80 reaches bit 15 of its half: a mantissa bit makes it NaN.
  const uint32_t nan = h | (((h + 0x00800080u) >> 9) & 0x00400040u);
  return nan < 0x00400040u ? 0x00400040u : nan;  // b = 0 (h = 0): 2^-127
}

// bf16 pairs a * b, each half rounded to nearest; a NaN result is the canonical 0x7fff, as the
// GPU's bf16 arithmetic gives it. The host rounds the f32 product, which is the same: a product
// of bf16 values has at most 16 significant bits, so f32 holds it exactly from 2^-134 (half of
// bf16's smallest subnormal) up, and below that rounds it to at most 2^-134, which bf16 rounds
// to zero (ties to even) as it does the exact product.
KVCORE_HD uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  const __nv_bfloat162 p = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&p);
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const float p = bf16_bits_to_f32(static_cast<uint16_t>(a >> (16 * h))) * bf16_bits_to_f32(static_cast<uint16_t>(b >> (16 * h)));
    const uint32_t r = p != p ? 0x7fffu : f32_to_bf16_bits(p);
    d |= r << (16 * h);
  }
  return d;
#endif
}

// The 4 codes of t's low 16 bits (code i in bits 4i..4i+3, its sign in bit 4i+3; the upper bits
// are ignored) as signed bf16 values: codes 0 and 1 in p01 (code 0 in the low half), 2 and 3 in p23.
KVCORE_HD void e2m1x4_bf16(uint32_t t, uint32_t& p01, uint32_t& p23) {
  const uint32_t mag = t & 0x7777u;  // selectors without bit 3, which would switch byte_perm to sign mode
  const uint32_t lo = byte_perm(kE2M1Bf16Lo03, kE2M1Bf16Lo47, mag);
  const uint32_t hi = byte_perm(kE2M1Bf16Hi03, kE2M1Bf16Hi47, mag);
  // Byte i 0xff for a negative code i, in sign mode: the signs of codes 1 and 3 are the top bits of
  // t's bytes 0 and 1 (selectors 0, 1), those of codes 0 and 2 the top bits of (t << 4)'s (4, 5).
  const uint32_t neg = byte_perm(t, t << 4, 0x9d8cu);
  const uint32_t signed_hi = hi | (neg & 0x80808080u);
  p01 = byte_perm(lo, signed_hi, 0x5140u);  // low and high bytes of codes 0, 1
  p23 = byte_perm(lo, signed_hi, 0x7362u);  // of codes 2, 3
}

// The same values times the block scale pair s (ue8m0_bf16x2), exactly (see the top of this file).
// The sign goes in before the multiply, so that a NaN scale gives the canonical NaN for every code.
KVCORE_HD void e2m1x4_scaled_bf16(uint32_t t, uint32_t s, uint32_t& p01, uint32_t& p23) {
  uint32_t v01, v23;
  e2m1x4_bf16(t, v01, v23);
  p01 = bf16x2_mul(v01, s);
  p23 = bf16x2_mul(v23, s);
}

}  // namespace kvcore::math
