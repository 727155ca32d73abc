// Per-target SIMD RoPE helpers (Highway), bit-identical to kvcore/math/rope.hpp:
// the cos/sin of a row's pairs (math::sincos_f32 lane by lane: the same IEEE
// double operations in the same order, no contraction into FMAs, then the same
// f32 rounding) and f32 <-> f16 / bf16 conversions that round as math/half.hpp
// does (NaN becomes the canonical quiet NaN). Lanes with |angle| > 2^28 or a
// non-finite angle take the scalar function (its fmod branch).
#if defined(KVCORE_CPU_SIMD_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCORE_CPU_SIMD_ROPE_INL_H_
#undef KVCORE_CPU_SIMD_ROPE_INL_H_
#else
#define KVCORE_CPU_SIMD_ROPE_INL_H_
#endif

#include <hwy/highway.h>

#include <type_traits>

#include "cpu/simd_kv-inl.h"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// sin and cos (as doubles, before the f32 rounding) of f32 angles held in double lanes,
// for |x| <= 2^28: math::sincos_f32's reduction and polynomials, operation for operation.
// k = nearbyint(x * 2/pi) comes from the 1.5 * 2^52 shifter: below 2^51 the sum rounds to
// an integer (ties to even, as nearbyint), the subtraction is exact, and the sum's low
// significand bits hold k in two's complement, so k mod 4 (the quadrant) is read from
// its bits: bit 0 swaps sin and cos, bit 1 of k (of k + 1) negates sin (cos). A zero
// k may come out +0 where nearbyint gives -0; r = x - k * c is x either way, and x = -0
// gives sin +0 and cos 1 both ways.
template <class DD>
HWY_INLINE void SinCosLanes(DD dd, hn::Vec<DD> x, hn::Vec<DD>& sv, hn::Vec<DD>& cv) {
  const hn::RebindToUnsigned<DD> du;
  const auto shifter = hn::Set(dd, 0x1.8p52);
  const auto kt = hn::Add(hn::Mul(x, hn::Set(dd, 0.63661977236758134308)), shifter);
  const auto k = hn::Sub(kt, shifter);
  auto r = hn::Sub(x, hn::Mul(k, hn::Set(dd, 0x1.921fb4p+0)));
  r = hn::Sub(r, hn::Mul(k, hn::Set(dd, 0x1.4442dp-24)));
  r = hn::Sub(r, hn::Mul(k, hn::Set(dd, 0x1.8469898cc517p-48)));
  const auto z = hn::Mul(r, r);
  auto ps = hn::Set(dd, 1.0 / 6227020800.0);
  ps = hn::Add(hn::Mul(ps, z), hn::Set(dd, -1.0 / 39916800.0));
  ps = hn::Add(hn::Mul(ps, z), hn::Set(dd, 1.0 / 362880.0));
  ps = hn::Add(hn::Mul(ps, z), hn::Set(dd, -1.0 / 5040.0));
  ps = hn::Add(hn::Mul(ps, z), hn::Set(dd, 1.0 / 120.0));
  ps = hn::Add(hn::Mul(ps, z), hn::Set(dd, -1.0 / 6.0));
  const auto sr = hn::Add(r, hn::Mul(hn::Mul(r, z), ps));
  auto pc = hn::Set(dd, -1.0 / 87178291200.0);
  pc = hn::Add(hn::Mul(pc, z), hn::Set(dd, 1.0 / 479001600.0));
  pc = hn::Add(hn::Mul(pc, z), hn::Set(dd, -1.0 / 3628800.0));
  pc = hn::Add(hn::Mul(pc, z), hn::Set(dd, 1.0 / 40320.0));
  pc = hn::Add(hn::Mul(pc, z), hn::Set(dd, -1.0 / 720.0));
  pc = hn::Add(hn::Mul(pc, z), hn::Set(dd, 1.0 / 24.0));
  pc = hn::Add(hn::Mul(pc, z), hn::Set(dd, -0.5));
  const auto cr = hn::Add(hn::Set(dd, 1.0), hn::Mul(z, pc));
  const auto kb = hn::BitCast(du, kt);
  const auto sign = hn::Set(du, uint64_t{1} << 63);
  const auto swap = hn::TestBit(kb, hn::Set(du, 1));
  const auto s_neg = hn::BitCast(dd, hn::And(hn::ShiftLeft<62>(kb), sign));
  const auto c_neg = hn::BitCast(dd, hn::And(hn::ShiftLeft<62>(hn::Add(kb, hn::Set(du, 1))), sign));
  sv = hn::Xor(hn::IfThenElse(hn::RebindMask(dd, swap), cr, sr), s_neg);
  cv = hn::Xor(hn::IfThenElse(hn::RebindMask(dd, swap), sr, cr), c_neg);
}

// Vectors of double lanes RopeCosSinRange takes per step: their polynomials overlap.
inline constexpr int32_t kRopeCosSinVecs = 4;
// Pairs RopeCosSinRange computes per full step.
HWY_INLINE int32_t RopeCosSinStep() {
  return kRopeCosSinVecs * static_cast<int32_t>(hn::Lanes(hn::ScalableTag<double>()));
}

// V vectors of double lanes of sin and cos from pair i on: angle(v) gives vector v's f32
// angles; a NaN, infinite or beyond-2^28 lane sends every pair of the step to fallback(j)
// (the scalar function); else store(v, cos, sin) takes each vector's values demoted to f32.
template <int32_t V, class Angle, class Fallback, class Store>
HWY_INLINE void CosSinVectors(int32_t i, const Angle& angle, const Fallback& fallback, const Store& store) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(dd));
  const auto limit = hn::Set(dd, 268435456.0);
  hn::Vec<decltype(dd)> x[V], sv[V], cv[V];
  auto ok = hn::Le(hn::Zero(dd), limit);
  for (int32_t v = 0; v < V; ++v) {
    x[v] = hn::PromoteTo(dd, angle(v));
    ok = hn::And(ok, hn::Le(hn::Abs(x[v]), limit));
  }
  if (HWY_UNLIKELY(!hn::AllTrue(dd, ok))) {
    for (int32_t j = i; j < i + V * N; ++j) fallback(j);
    return;
  }
  for (int32_t v = 0; v < V; ++v) SinCosLanes(dd, x[v], sv[v], cv[v]);
  for (int32_t v = 0; v < V; ++v) store(v, hn::DemoteTo(df, cv[v]), hn::DemoteTo(df, sv[v]));
}

// V vectors of pairs from i: cs / sn as math::rope_cos_sin (magnitude applied when `scale`).
template <int32_t V>
HWY_INLINE void RopeCosSinVectors(const float* freq, int32_t i, float position, float magnitude, bool scale, float* cs,
                                  float* sn) {
  const hn::Rebind<float, hn::ScalableTag<double>> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  CosSinVectors<V>(
      i, [&](int32_t v) KVCORE_INLINE_LAMBDA { return hn::Mul(hn::Set(df, position), hn::LoadU(df, freq + i + v * N)); },  // math::rope_angle
      [&](int32_t j) KVCORE_INLINE_LAMBDA { math::rope_cos_sin(position, freq[j], magnitude, &cs[j], &sn[j]); },
      [&](int32_t v, hn::Vec<decltype(df)> fc, hn::Vec<decltype(df)> fs) KVCORE_INLINE_LAMBDA {
        if (scale) fc = hn::Mul(fc, hn::Set(df, magnitude)), fs = hn::Mul(fs, hn::Set(df, magnitude));
        hn::StoreU(fc, df, cs + i + v * N);
        hn::StoreU(fs, df, sn + i + v * N);
      });
}

// cs[i], sn[i] = math::rope_cos_sin(position, freq[i], magnitude) for i in [i0, i1), i0 a
// multiple of RopeCosSinStep(). Whole vectors are written (up to i1 rounded up to a
// multiple of the lanes), so freq, cs and sn hold a multiple of 16 entries (freq zero
// padded). A magnitude of 1 is not multiplied (x * 1 is x for the finite values that
// reach it).
HWY_INLINE void RopeCosSinRange(const float* freq, int32_t i0, int32_t i1, float position, float magnitude, float* cs,
                                float* sn) {
  const int32_t N = static_cast<int32_t>(hn::Lanes(hn::ScalableTag<double>()));
  const int32_t end = (i1 + N - 1) / N * N;
  const bool scale = magnitude != 1.0f;
  int32_t i = i0;
  for (; i + kRopeCosSinVecs * N <= end; i += kRopeCosSinVecs * N)
    RopeCosSinVectors<kRopeCosSinVecs>(freq, i, position, magnitude, scale, cs, sn);
  for (; i < end; i += N) RopeCosSinVectors<1>(freq, i, position, magnitude, scale, cs, sn);
}

// cs[i], sn[i] = math::rope_cos_sin(position, freq[i], magnitude) for i < n. freq, cs and
// sn hold a multiple of 16 entries (freq zero padded).
HWY_INLINE void RopeCosSinRow(const float* freq, int32_t n, float position, float magnitude, float* cs, float* sn) {
  RopeCosSinRange(freq, 0, n, position, magnitude, cs, sn);
}

// f32 lanes -> f16 bits as math::f32_to_f16_bits (round to nearest even; NaN -> 0x7e00).
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> F32ToF16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const hn::Rebind<uint16_t, DF> d16;
  v = hn::IfThenElse(hn::IsNaN(v), hn::BitCast(df, hn::Set(du, 0x7fc00000u)), v);  // converts to 0x7e00
  return hn::BitCast(d16, hn::DemoteTo(dh, v));
}

// f32 lanes -> bf16 bits in the low half of u32 lanes, as math::f32_to_bf16_bits.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToBf16BitsU32(DF /*df*/, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const auto x = hn::BitCast(du, v);
  const auto r = hn::ShiftRight<16>(hn::Add(hn::Add(x, hn::Set(du, 0x7fffu)), hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u))));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Set(du, 0x7fc0u), r);
}

// Targets whose f32 -> f16 conversion is a hardware instruction (F16C on x86, with
// the IEEE rounding math/half.hpp implements); the others round lane by lane with
// math/half.hpp, as Highway's emulation need not round the same way.
#undef KVCORE_SIMD_HW_F16  // per target
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
#define KVCORE_SIMD_HW_F16 0
#else
#define KVCORE_SIMD_HW_F16 1
#endif

// Lanes(df) values of T at p as f32 / stored from f32 (T: float, f16, bf16).
template <class T, class DF>
HWY_INLINE hn::Vec<DF> LoadAsF32(DF df, const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<T, f16>) {
    return LoadF16(df, reinterpret_cast<const uint16_t*>(p));
  } else {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p)))));
  }
}

template <class T, class DF>
HWY_INLINE void StoreFromF32(DF df, hn::Vec<DF> v, T* p) {
  if constexpr (std::is_same_v<T, float>) {
    hn::StoreU(v, df, p);
  } else if constexpr (std::is_same_v<T, f16>) {
#if KVCORE_SIMD_HW_F16
    const hn::Rebind<uint16_t, DF> d16;
    hn::StoreU(F32ToF16Bits(df, v), d16, reinterpret_cast<uint16_t*>(p));
#else
    HWY_ALIGN float lanes[hn::MaxLanes(df)];
    hn::Store(v, df, lanes);
    for (size_t i = 0; i < hn::Lanes(df); ++i) p[i].bits = math::f32_to_f16_bits(lanes[i]);
#endif
  } else {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToSigned<DF> di;
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, F32ToBf16BitsU32(df, v))), d16, reinterpret_cast<uint16_t*>(p));
  }
}

#if HWY_TARGET != HWY_SCALAR
// 2 * Lanes(df) values of T at p (pairs side by side) as f32: the first and the second
// of each pair.
template <class T, class DF>
HWY_INLINE void LoadPairsAsF32(DF df, const T* p, hn::Vec<DF>& x0, hn::Vec<DF>& x1) {
  if constexpr (std::is_same_v<T, float>) {
    hn::LoadInterleaved2(df, p, x0, x1);
  } else {
    HWY_ALIGN float lanes[2 * hn::MaxLanes(df)];
    const int32_t N = static_cast<int32_t>(hn::Lanes(df));
    hn::Store(LoadAsF32(df, p), df, lanes);
    hn::Store(LoadAsF32(df, p + N), df, lanes + N);
    hn::LoadInterleaved2(df, lanes, x0, x1);
  }
}

// y0 and y1 stored as pairs side by side at p (2 * Lanes(df) values of T).
template <class T, class DF>
HWY_INLINE void StorePairsFromF32(DF df, hn::Vec<DF> y0, hn::Vec<DF> y1, T* p) {
  if constexpr (std::is_same_v<T, float>) {
    hn::StoreInterleaved2(y0, y1, df, p);
  } else {
    HWY_ALIGN float lanes[2 * hn::MaxLanes(df)];
    const int32_t N = static_cast<int32_t>(hn::Lanes(df));
    hn::StoreInterleaved2(y0, y1, df, lanes);
    StoreFromF32(df, hn::Load(df, lanes), p);
    StoreFromF32(df, hn::Load(df, lanes + N), p + N);
  }
}
#endif

// Whether the n f16 values at p hold no infinity and no NaN: (bits << 1) below 0xf800.
HWY_INLINE bool F16RunFinite(const f16* p, int32_t n) {
  const hn::ScalableTag<uint16_t> d16;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d16));
  const uint16_t* b = reinterpret_cast<const uint16_t*>(p);
  auto m = hn::Zero(d16);
  int32_t i = 0;
  for (; i + N <= n; i += N) m = hn::Max(m, hn::ShiftLeft<1>(hn::LoadU(d16, b + i)));
  bool finite = hn::AllTrue(d16, hn::Lt(m, hn::Set(d16, uint16_t{0xf800})));
  for (; i < n; ++i) finite &= static_cast<uint16_t>(b[i] << 1) < 0xf800;
  return finite;
}

// Rotates the pairs of one row (xr -> orow, which may be xr) by cs / sn, as
// math::rotate_pair does pair by pair. `bounded`: every |cs|, |sn| <= 2^100, so f16
// rows without infinities or NaN (|x| <= 65504) give finite products and sums, and the
// hardware f32 -> f16 conversion needs no NaN fix (checked per row).
template <class T>
HWY_INLINE void RotatePairs(const math::RopeLayout& l, const T* xr, T* orow, const float* cs, const float* sn,
                            bool bounded = false) {
  (void)bounded;  // only the hardware-f16 targets use it
  const int32_t n_pairs = l.n_pairs();
  int32_t i = 0;
  if (!l.interleaved) {
    const hn::ScalableTag<float> df;
    const int32_t N = static_cast<int32_t>(hn::Lanes(df));
    const T* x0p = xr + l.first_dim;
    const T* x1p = x0p + n_pairs;
    T* y0p = orow + l.first_dim;
    T* y1p = y0p + n_pairs;
#if KVCORE_SIMD_HW_F16
    if constexpr (std::is_same_v<T, f16>) {
      if (bounded && F16RunFinite(x0p, l.n_rot)) {  // no NaN can come out: convert without the NaN fix
        const hn::Rebind<hwy::float16_t, decltype(df)> dh;
        for (; i + N <= n_pairs; i += N) {
          const auto x0 = LoadAsF32(df, x0p + i), x1 = LoadAsF32(df, x1p + i);
          const auto c = hn::LoadU(df, cs + i), s = hn::LoadU(df, sn + i);
          const auto y0 = hn::Sub(hn::Mul(x0, c), hn::Mul(x1, s));
          const auto y1 = hn::Add(hn::Mul(x0, s), hn::Mul(x1, c));
          hn::StoreU(hn::DemoteTo(dh, y0), dh, reinterpret_cast<hwy::float16_t*>(y0p + i));
          hn::StoreU(hn::DemoteTo(dh, y1), dh, reinterpret_cast<hwy::float16_t*>(y1p + i));
        }
      }
    }
#endif
    for (; i + N <= n_pairs; i += N) {
      const auto x0 = LoadAsF32(df, x0p + i), x1 = LoadAsF32(df, x1p + i);
      const auto c = hn::LoadU(df, cs + i), s = hn::LoadU(df, sn + i);
      // math::rotate_pair: y0 = x0 c - x1 s, y1 = x0 s + x1 c (two products, then the sum)
      const auto y0 = hn::Sub(hn::Mul(x0, c), hn::Mul(x1, s));
      const auto y1 = hn::Add(hn::Mul(x0, s), hn::Mul(x1, c));
      StoreFromF32(df, y0, y0p + i);
      StoreFromF32(df, y1, y1p + i);
    }
  } else {
#if HWY_TARGET != HWY_SCALAR
    // Interleaved pairs: a vector of pairs split into x0 and x1 lanes, rotated, and
    // interleaved again (same products and sums as above).
    const hn::ScalableTag<float> df;
    const int32_t N = static_cast<int32_t>(hn::Lanes(df));
    const T* xp = xr + l.first_dim;
    T* yp = orow + l.first_dim;
    for (; i + N <= n_pairs; i += N) {
      hn::Vec<decltype(df)> x0, x1;
      LoadPairsAsF32(df, xp + 2 * i, x0, x1);
      const auto c = hn::LoadU(df, cs + i), s = hn::LoadU(df, sn + i);
      const auto y0 = hn::Sub(hn::Mul(x0, c), hn::Mul(x1, s));
      const auto y1 = hn::Add(hn::Mul(x0, s), hn::Mul(x1, c));
      StorePairsFromF32(df, y0, y1, yp + 2 * i);
    }
#endif
  }
  for (; i < n_pairs; ++i) {
    const int32_t d0 = l.dim0(i), d1 = l.dim1(i);
    float x0 = to_f32(xr[d0]), x1 = to_f32(xr[d1]);
    math::rotate_pair(x0, x1, cs[i], sn[i]);
    orow[d0] = from_f32<T>(x0);
    orow[d1] = from_f32<T>(x1);
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCORE_CPU_SIMD_ROPE_INL_H_
