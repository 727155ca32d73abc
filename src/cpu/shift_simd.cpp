// One head of a shift, rotated with SIMD (simd_rope-inl.h's RotatePairs: NeoX
// pairs a vector at a time): the bits of math::shift_rotate_head_plain. Moved heads
// (shift_dense) rotate from their old row into the new one without a scratch copy;
// rope_shift_rows' rows go in contiguous runs per thread (ShiftRows).
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/shift_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "cpu/shift_simd.hpp"
#include "cpu/simd_rope-inl.h"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/shift_rotate.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {

void ShiftRotateHead(ops::ShiftKind kind, uint8_t* head, const math::RopeLayout& l, const float* c, const float* s) {
  switch (kind) {
    case ops::ShiftKind::F32: return RotatePairs(l, reinterpret_cast<float*>(head), reinterpret_cast<float*>(head), c, s);
    case ops::ShiftKind::F16:  // shift angles carry no magnitude: |cos|, |sin| <= 1
      return RotatePairs(l, reinterpret_cast<f16*>(head), reinterpret_cast<f16*>(head), c, s, true);
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
    return RotatePairs(l, reinterpret_cast<const T*>(to), reinterpret_cast<T*>(to), c, s, true);
  }
  // NeoX pairs: the rotated dims go from -> to directly; the others are copied around them.
  const int64_t r0 = int64_t{l.first_dim} * sizeof(T), r1 = r0 + int64_t{l.n_rot} * sizeof(T);
  if (r0 > 0) CopyBytes(from, to, r0);
  if (r1 < head_bytes) CopyBytes(from + r1, to + r1, head_bytes - r1);
  RotatePairs(l, reinterpret_cast<const T*>(from), reinterpret_cast<T*>(to), c, s, true);  // |cos|, |sin| <= 1
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

// The reduced f32 angle math::shift_sincos takes the sine and cosine of, for the lanes of
// freq at w: the exact split of delta * w and the three-part 2 pi reduction (fused
// multiply-adds where the target has them, else the scalar function's std::fma lane by lane).
template <class DF>
HWY_INLINE hn::Vec<DF> ShiftReducedAngle(DF df, float dl, const float* freq) {
#if HWY_NATIVE_FMA
  const auto d = hn::Set(df, dl), w = hn::LoadU(df, freq);
  const auto hi = hn::Mul(d, w);
  const auto lo = hn::MulAdd(d, w, hn::Neg(hi));
  const auto k = hn::Neg(hn::Round(hn::Mul(hi, hn::Set(df, 0.159154943091895336f))));  // -nearbyint
  auto r = hn::MulAdd(k, hn::Set(df, 6.28318548202514648f), hi);
  r = hn::MulAdd(k, hn::Set(df, -1.74845553146951715e-07f), r);
  r = hn::MulAdd(k, hn::Set(df, -6.86049804e-15f), r);
  return hn::Add(r, lo);
#else
  HWY_ALIGN float lanes[hn::MaxLanes(df)];
  for (size_t j = 0; j < hn::Lanes(df); ++j) {
    const float w = freq[j], hi = dl * w, lo = std::fma(dl, w, -hi);
    const float k = std::nearbyint(hi * 0.159154943091895336f);
    float r = std::fma(-k, 6.28318548202514648f, hi);
    r = std::fma(-k, -1.74845553146951715e-07f, r);
    r = std::fma(-k, -6.86049804e-15f, r);
    lanes[j] = r + lo;
  }
  return hn::Load(df, lanes);
#endif
}

// V vectors of pairs from i (see ShiftCosSinRow).
template <int32_t V>
HWY_INLINE void ShiftCosSinVectors(const float* freq, int32_t i, int32_t delta, float* cs, float* sn) {
  const hn::Rebind<float, hn::ScalableTag<double>> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  CosSinVectors<V>(
      i, [&](int32_t v) KVCORE_INLINE_LAMBDA { return ShiftReducedAngle(df, static_cast<float>(delta), freq + i + v * N); },
      [&](int32_t j) KVCORE_INLINE_LAMBDA { math::shift_sincos(delta, freq[j], &sn[j], &cs[j]); },
      [&](int32_t v, hn::Vec<decltype(df)> fc, hn::Vec<decltype(df)> fs) KVCORE_INLINE_LAMBDA {
        hn::StoreU(fc, df, cs + i + v * N);
        hn::StoreU(fs, df, sn + i + v * N);
      });
}

// cs[i], sn[i] = math::shift_sincos(delta, freq[i]) for i < n (freq zero padded to a multiple
// of 16): the reduced angles in f32 lanes (ShiftReducedAngle), then math::sincos_f32 in
// double lanes (simd_rope-inl.h's SinCosLanes), several vectors a step so their
// polynomials overlap.
void ShiftCosSinRow(const float* freq, int32_t n, int32_t delta, float* cs, float* sn) {
  const int32_t N = static_cast<int32_t>(hn::Lanes(hn::ScalableTag<double>()));
  const int32_t end = (n + N - 1) / N * N;
  int32_t i = 0;
  for (; i + kRopeCosSinVecs * N <= end; i += kRopeCosSinVecs * N) ShiftCosSinVectors<kRopeCosSinVecs>(freq, i, delta, cs, sn);
  for (; i < end; i += N) ShiftCosSinVectors<1>(freq, i, delta, cs, sn);
}

// cs[i], sn[i] for i in [i0, i1), i0 a multiple of RopeCosSinStep(); whole vectors up to i1
// rounded up to the lanes are written.
HWY_INLINE void ShiftCosSinRange(const float* freq, int32_t i0, int32_t i1, int32_t delta, float* cs, float* sn) {
  const int32_t N = static_cast<int32_t>(hn::Lanes(hn::ScalableTag<double>()));
  const int32_t end = (i1 + N - 1) / N * N;
  int32_t i = i0;
  for (; i + kRopeCosSinVecs * N <= end; i += kRopeCosSinVecs * N) ShiftCosSinVectors<kRopeCosSinVecs>(freq, i, delta, cs, sn);
  for (; i < end; i += N) ShiftCosSinVectors<1>(freq, i, delta, cs, sn);
}

// rope_shift_rows for the kinds of shift_simd_serves: each thread a contiguous run of rows,
// and, as rope_apply does, the next moved row's cos/sin computed in slices between the
// heads of the current one, so that arithmetic overlaps the rotation's memory traffic.
void ShiftRows(const ops::RopeShiftRowsParams& p, const float* freq, bool parallel) {
  const ops::ShiftTensorParams& t = p.k;
  const math::RopeLayout& l = p.table.layout;
  const int32_t n_pairs = l.n_pairs();
  const int32_t step = RopeCosSinStep();
  const int64_t steps = (n_pairs + step - 1) / step;
  const int64_t heads = std::max<int64_t>(t.n_heads, 1);
  const int64_t steps_per_head = (steps + heads - 1) / heads;
  constexpr int32_t kPadded = math::RopeTable::kMaxPairs + 16;
#pragma omp parallel if (parallel)
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t r0 = p.rows * me / threads, r1 = p.rows * (me + 1) / threads;
    HWY_ALIGN float angles[4][kPadded];
    float *cs = angles[0], *sn = angles[1], *cs_next = angles[2], *sn_next = angles[3];
    int64_t r = r0;
    while (r < r1 && p.delta[r] == 0) ++r;
    if (r < r1) ShiftCosSinRange(freq, 0, n_pairs, p.delta[r], cs, sn);
    while (r < r1) {
      int64_t next = r + 1;
      while (next < r1 && p.delta[next] == 0) ++next;
      int64_t done = next < r1 ? 0 : steps;  // steps of the next row's cos/sin computed so far
      for (int64_t h = 0; h < t.n_heads; ++h) {
        ShiftRotateHead(t.kind, t.base + r * t.token_stride + h * t.head_bytes, l, cs, sn);
        if (done < steps) {
          const int64_t upto = std::min(steps, done + steps_per_head);
          ShiftCosSinRange(freq, static_cast<int32_t>(done * step), static_cast<int32_t>(std::min<int64_t>(upto * step, n_pairs)),
                           p.delta[next], cs_next, sn_next);
          done = upto;
        }
      }
      if (done < steps) ShiftCosSinRange(freq, static_cast<int32_t>(done * step), n_pairs, p.delta[next], cs_next, sn_next);
      std::swap(cs, cs_next);
      std::swap(sn, sn_next);
      r = next;
    }
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(ShiftRotateHead);
HWY_EXPORT(ShiftMoveHead);
HWY_EXPORT(ShiftCosSinRow);
HWY_EXPORT(ShiftRows);
void shift_rows_simd(const ops::RopeShiftRowsParams& p, const float* freq, bool parallel) {
  HWY_DYNAMIC_DISPATCH(ShiftRows)(p, freq, parallel);
}
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
