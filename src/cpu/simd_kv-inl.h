// Per-target SIMD helpers of the CPU kernels (Highway): decoding K/V elements of
// every pool format into f32 lanes, and exp2 of non-positive scores. Included by
// kernels that use hwy/foreach_target.h, once per target (the guard toggles).
//
// Decoding gives exactly the values of math::kv_elem_to_f32 (times the scale, as
// the scalar path multiplies): f16 and bf16 widen exactly; an e4m3 byte becomes
// the f16 with the same sign, exponent bits and mantissa bits (an exact f16,
// subnormals included, 2^8 times smaller than the e4m3 value), widened by the
// hardware conversion and multiplied by 2^8 (exact); the NaN codes stay NaN.
#if defined(KVCORE_CPU_SIMD_KV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCORE_CPU_SIMD_KV_INL_H_
#undef KVCORE_CPU_SIMD_KV_INL_H_
#else
#define KVCORE_CPU_SIMD_KV_INL_H_
#endif

#include <hwy/highway.h>

#include "kvcore/math/attention_rows.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(df) e4m3 bytes at offset d of row, as f32 values 2^-8 times the e4m3
// values (exact: the f16 with the byte's sign, exponent and mantissa bits).
template <class DF>
HWY_INLINE hn::Vec<DF> LoadE4m3Over256(DF df, const uint8_t* row, int64_t d) {
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto b = hn::PromoteTo(d16, hn::LoadU(d8, row + d));
  const auto mag = hn::And(b, hn::Set(d16, 0x7f));
  auto h = hn::Or(hn::ShiftLeft<7>(mag), hn::ShiftLeft<8>(hn::And(b, hn::Set(d16, 0x80))));
  h = hn::IfThenElse(hn::Eq(mag, hn::Set(d16, 0x7f)), hn::Or(h, hn::Set(d16, 0x7e00)), h);  // NaN codes
  return hn::PromoteTo(df, hn::BitCast(dh, h));
}

// Lanes(df) elements of kind E at element offset d of row (bytes), as f32.
template <math::KvElem E, class DF>
HWY_INLINE hn::Vec<DF> LoadKv(DF df, const uint8_t* row, int64_t d) {
  if constexpr (E == math::KvElem::F32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + d);
  } else if constexpr (E == math::KvElem::F16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + d));
  } else if constexpr (E == math::KvElem::BF16) {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<uint32_t, DF> d32;
    const auto bits = hn::PromoteTo(d32, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(row) + d));
    return hn::BitCast(df, hn::ShiftLeft<16>(bits));
  } else {
    return hn::Mul(LoadE4m3Over256(df, row, d), hn::Set(df, 256.0f));
  }
}

// 2^x for x <= 0 (scores minus their running max): 2^floor(x) times a degree-6
// polynomial of the fraction (relative error below 1e-7, least squares on
// Chebyshev nodes of [0, 1)); x below -126 (-inf included) and NaN give 0.
template <class DF>
HWY_INLINE hn::Vec<DF> Exp2NonPositive(DF df, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const auto live = hn::Ge(x, hn::Set(df, -126.0f));
  x = hn::Max(x, hn::Set(df, -126.0f));
  const auto fl = hn::Floor(x);
  const auto f = hn::Sub(x, fl);
  auto p = hn::Set(df, 0.00021795998327434063f);
  p = hn::MulAdd(p, f, hn::Set(df, 0.0012414311058819294f));
  p = hn::MulAdd(p, f, hn::Set(df, 0.009681269526481628f));
  p = hn::MulAdd(p, f, hn::Set(df, 0.0554824136197567f));
  p = hn::MulAdd(p, f, hn::Set(df, 0.24022991955280304f));
  p = hn::MulAdd(p, f, hn::Set(df, 0.6931470036506653f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  const auto pow2 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, fl), hn::Set(di, 127))));
  return hn::IfThenElseZero(live, hn::Mul(p, pow2));
}

// out[0..4) = the lane sums of a, b, c and d: pairs of lanes added inside each
// 128-bit block (a transposition of four vectors), then the blocks added, so the
// four sums cost about what one SumOfLanes does.
template <class DF>
HWY_INLINE void SumOfLanes4(DF df, hn::Vec<DF> a, hn::Vec<DF> b, hn::Vec<DF> c, hn::Vec<DF> d, float* out) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  out[0] = hn::GetLane(a), out[1] = hn::GetLane(b), out[2] = hn::GetLane(c), out[3] = hn::GetLane(d);
#else
  const hn::Repartition<uint64_t, DF> du;
  const auto ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));  // a02 b02 a13 b13
  const auto cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));  // c02 d02 c13 d13
  const auto lo = hn::BitCast(df, hn::InterleaveLower(du, hn::BitCast(du, ab), hn::BitCast(du, cd)));
  const auto hi = hn::BitCast(df, hn::InterleaveUpper(du, hn::BitCast(du, ab), hn::BitCast(du, cd)));
  HWY_ALIGN float lanes[hn::MaxLanes(df)];
  hn::Store(hn::Add(lo, hi), df, lanes);  // per block: partial sums of a, b, c, d
  const hn::Full128<float> d4;
  auto sum = hn::Load(d4, lanes);
  for (size_t i = 4; i < hn::Lanes(df); i += 4) sum = hn::Add(sum, hn::Load(d4, lanes + i));
  hn::StoreU(sum, d4, out);
#endif
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCORE_CPU_SIMD_KV_INL_H_
