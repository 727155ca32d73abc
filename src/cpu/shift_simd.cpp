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

#include <cmath>
#include <cstring>

#include "cpu/shift_simd.hpp"
#include "cpu/simd_rope-inl.h"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/shift_rotate.hpp"

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

// cs[i], sn[i] = math::shift_sincos(delta, freq[i]) for i < n (freq zero padded to a multiple
// of 16): the exact split of delta * w and the three-part 2 pi reduction in f32 lanes (fused
// multiply-adds where the target has them, else the scalar function's std::fma lane by lane),
// then math::sincos_f32 in double lanes (simd_rope-inl.h's SinCosLanes).
void ShiftCosSinRow(const float* freq, int32_t n, int32_t delta, float* cs, float* sn) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(dd));
  const float dl = static_cast<float>(delta);
  for (int32_t i = 0; i < n; i += N) {
#if HWY_NATIVE_FMA
    const auto d = hn::Set(df, dl), w = hn::LoadU(df, freq + i);
    const auto hi = hn::Mul(d, w);
    const auto lo = hn::MulAdd(d, w, hn::Neg(hi));
    const auto k = hn::Neg(hn::Round(hn::Mul(hi, hn::Set(df, 0.159154943091895336f))));  // -nearbyint
    auto r = hn::MulAdd(k, hn::Set(df, 6.28318548202514648f), hi);
    r = hn::MulAdd(k, hn::Set(df, -1.74845553146951715e-07f), r);
    r = hn::MulAdd(k, hn::Set(df, -6.86049804e-15f), r);
    const auto a = hn::Add(r, lo);
#else
    HWY_ALIGN float lanes[hn::MaxLanes(df)];
    for (int32_t j = 0; j < N; ++j) {
      const float w = freq[i + j], hi = dl * w, lo = std::fma(dl, w, -hi);
      const float k = std::nearbyint(hi * 0.159154943091895336f);
      float r = std::fma(-k, 6.28318548202514648f, hi);
      r = std::fma(-k, -1.74845553146951715e-07f, r);
      r = std::fma(-k, -6.86049804e-15f, r);
      lanes[j] = r + lo;
    }
    const auto a = hn::Load(df, lanes);
#endif
    const auto x = hn::PromoteTo(dd, a);
    if (HWY_UNLIKELY(!hn::AllTrue(dd, hn::Le(hn::Abs(x), hn::Set(dd, 268435456.0))))) {  // NaN / inf / huge
      for (int32_t j = i; j < i + N; ++j) math::shift_sincos(delta, freq[j], &sn[j], &cs[j]);
      continue;
    }
    hn::Vec<decltype(dd)> sv, cv;
    SinCosLanes(dd, x, sv, cv);
    hn::StoreU(hn::DemoteTo(df, cv), df, cs + i);
    hn::StoreU(hn::DemoteTo(df, sv), df, sn + i);
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(ShiftRotateHead);
HWY_EXPORT(ShiftMoveHead);
HWY_EXPORT(ShiftCosSinRow);
void shift_cos_sin_row_simd(const float* freq, int32_t n, int32_t delta, float* cs, float* sn) {
  HWY_DYNAMIC_DISPATCH(ShiftCosSinRow)(freq, n, delta, cs, sn);
}
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
