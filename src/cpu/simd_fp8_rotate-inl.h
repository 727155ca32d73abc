// Per-target SIMD rotation of one FP8 pool row (Fp8, Dsv4Row) in place, the rows of a
// rope-stored shift: the groups holding rotated dims decoded to f32 (DecodeFp8Group), the
// pairs rotated (RotatePairs), those groups re-encoded with fresh scales (EncodeFp8Group),
// every other byte kept. The bytes of kvrow::decode / kvrow::encode_rotated per element.
// Shared by kv_rotate_blocks (one layer) and the all-layers pass of paged_rotate, so the
// two give the same bytes. Included by kernels that use hwy/foreach_target.h, once per
// target (the guard toggles).
#if defined(KVCORE_CPU_SIMD_FP8_ROTATE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCORE_CPU_SIMD_FP8_ROTATE_INL_H_
#undef KVCORE_CPU_SIMD_FP8_ROTATE_INL_H_
#else
#define KVCORE_CPU_SIMD_FP8_ROTATE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>

#include "cpu/simd_kv-inl.h"
#include "cpu/simd_rope-inl.h"
#include "ops/kv_store_row.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The first rotated dim outside the FP8 groups of an FP8 row (Fp8, Dsv4Row): the rotated dims
// past it are plain (the Dsv4Row's bf16 tail); an Fp8 row has none (the end of the rotation).
HWY_INLINE int32_t FirstPlainRotatedDim(KvFormat f, const math::RopeLayout& l) {
  const int32_t end = l.first_dim + l.n_rot;
  return f == KvFormat::Dsv4Row ? std::min(std::max(l.first_dim, kvrow::Dsv4::kNope), end) : end;
}

// The dims of an FP8 row that a rotation reads: every group holding a rotated dim
// (DecodeFp8Group: kvrow::decode's floats) and the rotated plain dims (the Dsv4Row's bf16 tail).
HWY_INLINE void DecodeRotated(KvFormat f, void* dst, uint8_t* scales, int32_t n, const math::RopeLayout& l, float* row) {
  using DF = hn::ScalableTag<float>;
  const int32_t groups = kvrow::n_fp8_groups(f, n);
  for (int32_t g = 0; g < groups; ++g)
    if (kvrow::group_rotates(l, g))
      DecodeFp8Group(DF(), kvrow::group_codes(f, dst, g), *kvrow::group_scale(f, dst, scales, g), row + g * math::kFp8Block);
  for (int32_t d = FirstPlainRotatedDim(f, l); d < l.first_dim + l.n_rot; ++d) row[d] = kvrow::decode(f, dst, scales, d);
}

// kvrow::encode_rotated with the groups encoded a vector at a time (EncodeFp8Group: the same
// bytes): only what the rotation changed is written, every other byte stays.
HWY_INLINE void EncodeRotated(KvFormat f, const float* row, void* dst, uint8_t* scales, int32_t n,
                              const math::RopeLayout& l) {
  const int32_t groups = kvrow::n_fp8_groups(f, n);
  for (int32_t g = 0; g < groups; ++g)
    if (kvrow::group_rotates(l, g))
      EncodeFp8Group(row + g * math::kFp8Block, kvrow::group_codes(f, dst, g), kvrow::group_scale(f, dst, scales, g));
  for (int32_t d = FirstPlainRotatedDim(f, l); d < l.first_dim + l.n_rot; ++d) kvrow::encode_plain(f, dst, d, row[d]);
}

// One FP8 row (head_dim n; `scales` its group scales, Fp8 only) rotated in place by the
// pairs' cos `c` and sin `s`.
HWY_INLINE void RotateFp8Row(KvFormat f, void* dst, uint8_t* scales, int32_t n, const math::RopeLayout& l, const float* c,
                             const float* s) {
  HWY_ALIGN float row[kMaxKvHeadDim];
  DecodeRotated(f, dst, scales, n, l, row);
  RotatePairs(l, row, row, c, s);
  EncodeRotated(f, row, dst, scales, n, l);
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCORE_CPU_SIMD_FP8_ROTATE_INL_H_
