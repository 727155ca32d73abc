// Per-element codecs of pool rows (kv_store family), for the CPU and CUDA
// kernels alike: decode one stored dim to f32, encode one dim, and the FP8
// group encoding (scale exponent from the group's finite amax). Built only from
// the math headers, so both backends produce identical bytes for identical floats.
#pragma once
#include <cstdint>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/ops/kv_store.hpp"

namespace kvcore::kvrow {

using Dsv4 = math::Dsv4RowLayout;

KVCORE_HD float load_src(const void* src, DType t, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(src)[i];
  if (t == DType::F16) return math::f16_bits_to_f32(static_cast<const uint16_t*>(src)[i]);
  return math::bf16_bits_to_f32(static_cast<const uint16_t*>(src)[i]);
}

// Stored value of dim d of a row. `row` points at the (cell, head) row of the pool;
// `scales` at its UE8M0 group scales (Fp8 only).
KVCORE_HD float decode(KvFormat f, const void* row, const uint8_t* scales, int32_t d) {
  switch (f) {
    case KvFormat::F32: return static_cast<const float*>(row)[d];
    case KvFormat::F16: return math::f16_bits_to_f32(static_cast<const uint16_t*>(row)[d]);
    case KvFormat::BF16: return math::bf16_bits_to_f32(static_cast<const uint16_t*>(row)[d]);
    case KvFormat::Fp8:
      return math::e4m3_decode(static_cast<const uint8_t*>(row)[d]) * math::ue8m0_decode(scales[d / math::kFp8Block]);
    case KvFormat::Dsv4Row: {
      const uint8_t* b = static_cast<const uint8_t*>(row);
      if (d < Dsv4::kNope)
        return math::e4m3_decode(b[Dsv4::kNopeOffset + d]) * math::ue8m0_decode(b[Dsv4::kScaleOffset + d / math::kFp8Block]);
      const uint16_t* tail = reinterpret_cast<const uint16_t*>(b + Dsv4::kRopeOffset);
      return math::bf16_bits_to_f32(tail[d - Dsv4::kNope]);
    }
  }
  return 0.0f;
}

// Does dim d belong to an FP8 group (quantized together with its 63 neighbours)?
KVCORE_HD bool is_fp8_dim(KvFormat f, int32_t d) {
  return f == KvFormat::Fp8 || (f == KvFormat::Dsv4Row && d < Dsv4::kNope);
}

// Encode dim d of a 16-bit / f32 row, or of the Dsv4Row's bf16 tail.
KVCORE_HD void encode_plain(KvFormat f, void* row, int32_t d, float v) {
  switch (f) {
    case KvFormat::F32: static_cast<float*>(row)[d] = v; break;
    case KvFormat::F16: static_cast<uint16_t*>(row)[d] = math::f32_to_f16_bits(v); break;
    case KvFormat::BF16: static_cast<uint16_t*>(row)[d] = math::f32_to_bf16_bits(v); break;
    case KvFormat::Dsv4Row:
      reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(row) + Dsv4::kRopeOffset)[d - Dsv4::kNope] = math::f32_to_bf16_bits(v);
      break;
    case KvFormat::Fp8: break;  // groups only (encode_group)
  }
}

// Where FP8 group g of a row keeps its codes and its scale byte.
KVCORE_HD uint8_t* group_codes(KvFormat f, void* row, int32_t g) {
  return static_cast<uint8_t*>(row) + (f == KvFormat::Dsv4Row ? Dsv4::kNopeOffset : 0) + g * math::kFp8Block;
}
KVCORE_HD uint8_t* group_scale(KvFormat f, void* row, uint8_t* scales, int32_t g) {
  return f == KvFormat::Dsv4Row ? static_cast<uint8_t*>(row) + Dsv4::kScaleOffset + g : scales + g;
}
KVCORE_HD int32_t n_fp8_groups(KvFormat f, int32_t head_dim) {
  return f == KvFormat::Fp8 ? head_dim / math::kFp8Block : (f == KvFormat::Dsv4Row ? Dsv4::kBlocks : 0);
}

KVCORE_HD uint8_t fp8_code(float v, int k) { return math::e4m3_encode(math::e4m3_scaled(v, math::pow2f(-k))); }

// Quantize 64 values (serial: the CPU path; CUDA reduces amax across a warp, same result).
KVCORE_HD void encode_group(const float* v, uint8_t* codes, uint8_t* scale) {
  float amax = 0.0f;
  for (int i = 0; i < math::kFp8Block; ++i) amax = math::finite_abs_max(amax, v[i]);
  const int k = math::e4m3_scale_exponent(amax);
  for (int i = 0; i < math::kFp8Block; ++i) codes[i] = fp8_code(v[i], k);
  *scale = math::ue8m0_encode(k);
}

// Does FP8 group g contain a rotated dim?
KVCORE_HD bool group_rotates(const math::RopeLayout& l, int32_t g) {
  const int32_t lo = g * math::kFp8Block, hi = lo + math::kFp8Block;
  return l.n_rot > 0 && lo < l.first_dim + l.n_rot && l.first_dim < hi;
}

// Serial whole-row encode (CPU).
KVCORE_HD void encode_row(KvFormat f, const float* in, void* row, uint8_t* scales, int32_t head_dim) {
  const int32_t groups = n_fp8_groups(f, head_dim);
  for (int32_t g = 0; g < groups; ++g)
    encode_group(in + g * math::kFp8Block, group_codes(f, row, g), group_scale(f, row, scales, g));
  for (int32_t d = groups * math::kFp8Block; d < head_dim; ++d) encode_plain(f, row, d, in[d]);
  if (f == KvFormat::Dsv4Row) static_cast<uint8_t*>(row)[Dsv4::kPadOffset] = 0;
}

// Serial re-encode of only what a rotation changed (CPU): rotated plain dims, and the FP8
// groups that contain a rotated dim. Every other byte of the row stays as it was.
KVCORE_HD void encode_rotated(KvFormat f, const float* in, void* row, uint8_t* scales, int32_t head_dim,
                              const math::RopeLayout& l) {
  const int32_t groups = n_fp8_groups(f, head_dim);
  for (int32_t g = 0; g < groups; ++g)
    if (group_rotates(l, g)) encode_group(in + g * math::kFp8Block, group_codes(f, row, g), group_scale(f, row, scales, g));
  for (int32_t d = l.first_dim; d < l.first_dim + l.n_rot; ++d)
    if (!is_fp8_dim(f, d)) encode_plain(f, row, d, in[d]);
}

}  // namespace kvcore::kvrow
