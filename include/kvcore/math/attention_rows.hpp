// Reading K/V rows for attention: the per-element decode of every pool
// format, rope-on-read of one dim, and the DeepSeek-V4 packed 584-byte row.
// Shared by the CPU and CUDA attention kernels (the CUDA fast paths decode
// 16 bytes at a time with hardware conversions that give the same values).
#pragma once
#include <cstdint>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"

namespace kvcore::math {

// How an FP8 pool is scaled.
enum class KvScaleMode : int32_t {
  None = 0,      // 16/32-bit pool
  Ue8m0Per64 = 1,  // one UE8M0 byte per 64 dims of a (token, head) row
  F32PerRow = 2,   // one f32 per (token, head) row
};

// Storage element kinds of a pool (plain ints so they travel in Params).
enum class KvElem : int32_t { F32 = 0, F16 = 1, BF16 = 2, E4M3 = 3 };

KVCORE_HD float kv_elem_to_f32(const void* base, int64_t i, KvElem e) {
  switch (e) {
    case KvElem::F32: return static_cast<const float*>(base)[i];
    case KvElem::F16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case KvElem::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case KvElem::E4M3: return e4m3_decode(static_cast<const uint8_t*>(base)[i]);
  }
  return 0.0f;
}

// Rope-on-read of one dim: where its pair partner sits and which side of the
// pair it is. Dims outside the rotated slice return false.
struct RopeDim {
  int32_t pair;     // pair index i (frequency freq[i])
  int32_t partner;  // the other dim of the pair
  bool second;      // true: this dim is x1 of (x0, x1)
};
KVCORE_HD bool rope_dim(const RopeLayout& l, int32_t d, RopeDim* out) {
  if (!l.rotates(d)) return false;
  const int32_t local = d - l.first_dim;
  const int32_t h = l.n_pairs();
  if (l.interleaved) {
    out->pair = local >> 1;
    out->second = (local & 1) != 0;
    out->partner = out->second ? d - 1 : d + 1;
  } else {
    out->second = local >= h;
    out->pair = out->second ? local - h : local;
    out->partner = out->second ? d - h : d + h;
  }
  return true;
}

// The rotated value of one dim, with the same operations in the same order as
// rotate_pair() (so rotating a row dim by dim equals rope_rotate_row()).
KVCORE_HD float rope_rotated_dim(float self, float partner, bool second, float c, float s) {
  return second ? partner * s + self * c : self * c - partner * s;
}

// DeepSeek-V4 packed row (dsv4_row.hpp): dim d of 512 as f32.
KVCORE_HD float dsv4_row_value(const uint8_t* row, int32_t d) {
  using L = Dsv4RowLayout;
  if (d < L::kNope)
    return e4m3_decode(row[L::kNopeOffset + d]) * ue8m0_decode(row[L::kScaleOffset + d / 64]);
  const int32_t r = L::kRopeOffset + 2 * (d - L::kNope);
  const uint16_t bits = static_cast<uint16_t>(row[r] | (row[r + 1] << 8));  // little endian
  return bf16_bits_to_f32(bits);
}

}  // namespace kvcore::math
