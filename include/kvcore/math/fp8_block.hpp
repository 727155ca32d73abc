// FP8 blocks and rows: the per-row building blocks every FP8 user shares
// (fp8 ops, context shift, paged and DeepSeek-V4 caches, attention).
//
// A block is up to 64 consecutive values with one UE8M0 scale 2^k,
// k = e4m3_scale_exponent(amax of the block's finite values). A partial last
// block (n < 64) takes the amax of its n values. The contract:
//   fp8_block_unpack(fp8_block_pack(x)) == fp8_block_round_trip(x), bit for bit,
// and both equal seed 002's kernel_dsv4_fp8_kv_quantize_f32 (with the exact
// scale exponent; see fp8.hpp). Strides are in elements; src and dst may alias.
#pragma once
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

// ---- one value -------------------------------------------------------------
KVCORE_HD uint8_t fp8_encode_scaled(float v, int k) { return e4m3_encode(e4m3_scaled(v, pow2f(-k))); }
KVCORE_HD float fp8_decode_scaled(uint8_t code, uint8_t scale_byte) {
  return e4m3_decode(code) * ue8m0_decode(scale_byte);
}

// The E4M3 value nearest to s clamped to +-448 (ties to the even code; +-inf -> +-448; NaN stays
// NaN), by float rounding instead of codes: adding 1.5 * 2^20 * binade(s) leaves exactly the bits
// of the E4M3 grid step and rounds to nearest even in one f32 add. Branch-free, several times faster on
// a CPU than decode(encode(.)), and equal to e4m3_decode(e4m3_encode(e4m3_scaled(s, 1))) for every
// f32 (tests/exhaustive checks all 2^32), so the round trip below may use it.
KVCORE_HD float e4m3_round_value(float s) {
  const uint32_t u = float_bits(s);
  uint32_t a = u & 0x7fffffffu;
  a = (a - 0x43e00001u < 0x7f800000u - 0x43e00000u) ? 0x43e00000u : a;  // (448, inf] -> 448; NaN passes
  uint32_t binade = a & 0x7f800000u;                                     // 2^floor(log2 |s|), 0 below normals
  binade = binade > 0x3c800000u ? binade : 0x3c800000u;                  // below 2^-6 the step stays 2^-9
  const float magic = bits_float(binade + (20u << 23) + 0x400000u);     // 1.5 * 2^20 * binade: ulp = step
  const float r = (bits_float(a) + magic) - magic;                      // the add rounds onto the grid; the sub is exact
  return bits_float(float_bits(r) | (u & 0x80000000u));                 // the sign (and -0 for tiny negatives)
}

// The code of s clamped to +-448: e4m3_encode(e4m3_scaled(s, 1)) for every f32 (exhaustive test),
// read off the rounded value instead of rounding on the code: branch-free, so CPU loops run it fast.
KVCORE_HD uint8_t e4m3_encode_clamped(float s) {
  const float r = e4m3_round_value(s);
  const uint32_t u = float_bits(r);
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t normal = (a - (120u << 23)) >> 20;                        // biased exponent - 120 | 3 mantissa bits
  const uint32_t below = a < 0x3c800000u ? a : 0u;                         // (no float->int cast of NaN)
  const uint32_t subnormal = static_cast<uint32_t>(bits_float(below) * 512.0f);  // r / 2^-9, an integer 0..7
  const uint32_t code = a >= 0x3c800000u ? normal : subnormal;             // 2^-6: the smallest normal
  return static_cast<uint8_t>(a > 0x7f800000u ? 0x7fu : (((u >> 24) & 0x80u) | code));
}

// ---- one block of n <= 64 values -----------------------------------------
template <class T>
KVCORE_HD float fp8_block_amax(const T* src, int64_t stride, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = finite_abs_max(amax, to_f32(src[i * stride]));
  return amax;
}

// Round trip in f32 (seed 002): e4m3_round_trip(v, k) for each value. Returns the scale exponent k.
KVCORE_HD int fp8_block_round_trip(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int n) {
  const int k = e4m3_scale_exponent(fp8_block_amax(src, src_stride, n));
  const float inv_scale = pow2f(-k), scale = pow2f(k);
  for (int i = 0; i < n; ++i) dst[i * dst_stride] = e4m3_round_value(src[i * src_stride] * inv_scale) * scale;
  return k;
}

// Encode: n codes to codes[i * code_stride]; returns the UE8M0 scale byte.
template <class T>
KVCORE_HD uint8_t fp8_block_pack(const T* src, int64_t src_stride, int n, uint8_t* codes, int64_t code_stride) {
  const int k = e4m3_scale_exponent(fp8_block_amax(src, src_stride, n));
  const float inv_scale = pow2f(-k);
  for (int i = 0; i < n; ++i) codes[i * code_stride] = e4m3_encode_clamped(to_f32(src[i * src_stride]) * inv_scale);
  return ue8m0_encode(k);
}

// Decode n codes with one scale byte into T (f32 exactly; f16/bf16 rounded to nearest even).
template <class T>
KVCORE_HD void fp8_block_unpack(const uint8_t* codes, int64_t code_stride, uint8_t scale, int n, T* dst,
                                int64_t dst_stride) {
  for (int i = 0; i < n; ++i) dst[i * dst_stride] = from_f32<T>(fp8_decode_scaled(codes[i * code_stride], scale));
}

// ---- one row: n_nope FP8 values (blocks of 64) + n_rot 16-bit tail ----------
// codes [n_nope], scales [ceil(n_nope / 64)], tail [n_rot] of Tail (f16 or bf16), all contiguous.
template <class T, class Tail>
KVCORE_HD void fp8_row_pack(const T* src, int n_nope, int n_rot, uint8_t* codes, uint8_t* scales, Tail* tail) {
  for (int b = 0; b * kFp8Block < n_nope; ++b) {
    const int off = b * kFp8Block;
    const int n = n_nope - off < kFp8Block ? n_nope - off : kFp8Block;
    scales[b] = fp8_block_pack(src + off, 1, n, codes + off, 1);
  }
  for (int i = 0; i < n_rot; ++i) tail[i] = from_f32<Tail>(to_f32(src[n_nope + i]));
}

template <class T, class Tail>
KVCORE_HD void fp8_row_unpack(const uint8_t* codes, const uint8_t* scales, const Tail* tail, int n_nope, int n_rot,
                              T* dst) {
  for (int b = 0; b * kFp8Block < n_nope; ++b) {
    const int off = b * kFp8Block;
    const int n = n_nope - off < kFp8Block ? n_nope - off : kFp8Block;
    fp8_block_unpack(codes + off, 1, scales[b], n, dst + off, 1);
  }
  for (int i = 0; i < n_rot; ++i) dst[n_nope + i] = from_f32<T>(to_f32(tail[i]));
}

// ---- DeepSeek-V4's 584-byte row (dsv4_row.hpp): f32 [512] <-> bytes [584] ---
// The rope tail is stored as bf16, little-endian, through byte accesses (a row
// needs no alignment); the pad byte is written as 0.
KVCORE_HD void dsv4_row_pack(const float* src, uint8_t* row) {
  using L = Dsv4RowLayout;
  for (int b = 0; b < L::kBlocks; ++b)
    row[L::kScaleOffset + b] = fp8_block_pack(src + b * kFp8Block, 1, kFp8Block, row + L::kNopeOffset + b * kFp8Block, 1);
  for (int i = 0; i < L::kRope; ++i) {
    const uint16_t h = f32_to_bf16_bits(src[L::kNope + i]);
    row[L::kRopeOffset + 2 * i] = static_cast<uint8_t>(h & 0xffu);
    row[L::kRopeOffset + 2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  row[L::kPadOffset] = 0;
}

KVCORE_HD void dsv4_row_unpack(const uint8_t* row, float* dst) {
  using L = Dsv4RowLayout;
  for (int b = 0; b < L::kBlocks; ++b)
    fp8_block_unpack(row + L::kNopeOffset + b * kFp8Block, 1, row[L::kScaleOffset + b], kFp8Block, dst + b * kFp8Block, 1);
  for (int i = 0; i < L::kRope; ++i) {
    const uint16_t h = static_cast<uint16_t>(row[L::kRopeOffset + 2 * i] | (row[L::kRopeOffset + 2 * i + 1] << 8));
    dst[L::kNope + i] = bf16_bits_to_f32(h);
  }
}

}  // namespace kvcore::math
