// One head of a shift, rotated with SIMD (simd_rope-inl.h's RotatePairs: NeoX
// pairs a vector at a time): the bits of math::shift_rotate_head_plain. Moved heads
// (shift_dense) rotate from their old row into the new one without a scratch copy.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/shift_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <cstring>

#include "cpu/shift_simd.hpp"
#include "cpu/simd_rope-inl.h"
#include "kvcore/math/dsv4_row.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {

void ShiftRotateHead(ops::ShiftKind kind, uint8_t* head, const math::RopeLayout& l, const float* c, const float* s) {
  switch (kind) {
    case ops::ShiftKind::F32: return RotatePairs(l, reinterpret_cast<float*>(head), reinterpret_cast<float*>(head), c, s);
    case ops::ShiftKind::F16: return RotatePairs(l, reinterpret_cast<f16*>(head), reinterpret_cast<f16*>(head), c, s);
    case ops::ShiftKind::BF16: return RotatePairs(l, reinterpret_cast<bf16*>(head), reinterpret_cast<bf16*>(head), c, s);
    case ops::ShiftKind::Dsv4: {  // the bf16 tail holds dims [kNope, 512): rotate it with dims counted from kNope
      math::RopeLayout tail = l;
      tail.first_dim -= math::Dsv4RowLayout::kNope;
      bf16* t = reinterpret_cast<bf16*>(head + math::Dsv4RowLayout::kRopeOffset);
      return RotatePairs(tail, t, t, c, s);
    }
    default: return;  // not served (shift_simd_serves)
  }
}

// bytes [0, n) of from -> to, vectors at a time (a call to memcpy per row of a few hundred
// bytes costs about as much as the copy).
HWY_INLINE void CopyBytes(const uint8_t* from, uint8_t* to, int64_t n) {
  const hn::ScalableTag<uint8_t> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d8));
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a = hn::LoadU(d8, from + i), b = hn::LoadU(d8, from + i + N);
    hn::StoreU(a, d8, to + i);
    hn::StoreU(b, d8, to + i + N);
  }
  for (; i + N <= n; i += N) hn::StoreU(hn::LoadU(d8, from + i), d8, to + i);
  if (i < n) std::memcpy(to + i, from + i, static_cast<size_t>(n - i));
}

template <class T>
HWY_INLINE void MoveRotate(const math::RopeLayout& l, const uint8_t* from, uint8_t* to, int64_t head_bytes,
                           const float* c, const float* s) {
  if (l.interleaved) {  // copy, then rotate the copy in place
    CopyBytes(from, to, head_bytes);
    return RotatePairs(l, reinterpret_cast<const T*>(to), reinterpret_cast<T*>(to), c, s);
  }
  // NeoX pairs: the rotated dims go from -> to directly; the others are copied around them.
  const int64_t r0 = int64_t{l.first_dim} * sizeof(T), r1 = r0 + int64_t{l.n_rot} * sizeof(T);
  if (r0 > 0) CopyBytes(from, to, r0);
  if (r1 < head_bytes) CopyBytes(from + r1, to + r1, head_bytes - r1);
  RotatePairs(l, reinterpret_cast<const T*>(from), reinterpret_cast<T*>(to), c, s);
}

void ShiftMoveHead(ops::ShiftKind kind, const uint8_t* from, uint8_t* to, int64_t head_bytes,
                   const math::RopeLayout& l, const float* c, const float* s) {
  switch (kind) {
    case ops::ShiftKind::Copy: return CopyBytes(from, to, head_bytes);
    case ops::ShiftKind::F32: return MoveRotate<float>(l, from, to, head_bytes, c, s);
    case ops::ShiftKind::F16: return MoveRotate<f16>(l, from, to, head_bytes, c, s);
    case ops::ShiftKind::BF16: return MoveRotate<bf16>(l, from, to, head_bytes, c, s);
    case ops::ShiftKind::Dsv4:
      CopyBytes(from, to, head_bytes);
      return ShiftRotateHead(kind, to, l, c, s);
    default: return;  // not served (shift_simd_serves)
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(ShiftRotateHead);
HWY_EXPORT(ShiftMoveHead);
void shift_rotate_head_simd(ops::ShiftKind kind, uint8_t* head, const math::RopeLayout& l, const float* c,
                            const float* s) {
  HWY_DYNAMIC_DISPATCH(ShiftRotateHead)(kind, head, l, c, s);
}
void shift_move_head_simd(ops::ShiftKind kind, const uint8_t* from, uint8_t* to, int64_t head_bytes,
                          const math::RopeLayout& l, const float* c, const float* s) {
  HWY_DYNAMIC_DISPATCH(ShiftMoveHead)(kind, from, to, head_bytes, l, c, s);
}
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
