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

#include <cmath>

#include "kvcore/math/attention_rows.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(df) e4m3 bytes at offset d of row, as f32 values 2^-8 times the e4m3
// values (exact: the f16 with the byte's sign, exponent and mantissa bits).
// Targets without hardware f16 conversions (F16C) build the f32 directly: the
// byte's exponent and mantissa bits placed in an f32 (a subnormal f32 for the
// e4m3 subnormals) times 2^112, exact; Highway's emulated f16 widening need not be.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadE4m3Over256(DF df, const uint8_t* row, int64_t d) {
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  const hn::Rebind<uint8_t, DF> d8;
  const hn::RebindToUnsigned<DF> du;
  const auto b = hn::PromoteTo(du, hn::LoadU(d8, row + d));
  const auto mag = hn::And(b, hn::Set(du, 0x7fu));
  const auto bits = hn::Or(hn::ShiftLeft<20>(mag), hn::ShiftLeft<24>(hn::And(b, hn::Set(du, 0x80u))));
  const auto v = hn::Mul(hn::BitCast(df, bits), hn::Set(df, 0x1p112f));
  return hn::IfThenElse(hn::RebindMask(df, hn::Eq(mag, hn::Set(du, 0x7fu))), hn::Set(df, std::nanf("")), v);
#else
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto b = hn::PromoteTo(d16, hn::LoadU(d8, row + d));
  const auto mag = hn::And(b, hn::Set(d16, 0x7f));
  auto h = hn::Or(hn::ShiftLeft<7>(mag), hn::ShiftLeft<8>(hn::And(b, hn::Set(d16, 0x80))));
  h = hn::IfThenElse(hn::Eq(mag, hn::Set(d16, 0x7f)), hn::Or(h, hn::Set(d16, 0x7e00)), h);  // NaN codes
  return hn::PromoteTo(df, hn::BitCast(dh, h));
#endif
}

// LoadE4m3Over256 for bytes known to hold no NaN code (|code| != 0x7f), in fewer
// instructions where the target converts f16 in hardware: the byte sign-extended
// to 16 bits and shifted left by 7 holds the f16 with the byte's exponent and
// mantissa bits in place, its sign in bits 15 and 14; clearing bit 14 leaves it.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadE4m3Over256Finite(DF df, const uint8_t* row, int64_t d) {
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  return LoadE4m3Over256(df, row, d);
#else
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<int16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto h = hn::And(hn::ShiftLeft<7>(hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(row) + d))),
                         hn::Set(d16, static_cast<int16_t>(-16385)));  // 0xbfff: every bit but 14
  return hn::PromoteTo(df, hn::BitCast(dh, h));
#endif
}

// Whether bytes [0, n) of an e4m3 row hold a NaN code (n a multiple of 8).
HWY_INLINE bool E4m3RowHasNan(const uint8_t* row, int64_t n) {
  const hn::ScalableTag<uint8_t> d8;
  const hn::CappedTag<uint8_t, 8> d8t;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d8));
  auto hit = hn::Zero(d8);
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hit = hn::Or(hit, hn::VecFromMask(d8, hn::Eq(hn::And(hn::LoadU(d8, row + i), hn::Set(d8, 0x7f)), hn::Set(d8, 0x7f))));
  bool any = !hn::AllFalse(d8, hn::Ne(hit, hn::Zero(d8)));
  for (; i < n; i += 8)
    any |= !hn::AllFalse(d8t, hn::Eq(hn::And(hn::LoadU(d8t, row + i), hn::Set(d8t, 0x7f)), hn::Set(d8t, 0x7f)));
  return any;
}

// Lanes(df) f16 values at p as f32, exactly (math::f16_bits_to_f32): the hardware
// conversion where the target has one (F16C), else the bits placed in an f32
// times 2^112 (exact for normals and subnormals), infinities and NaN by select.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF16(DF df, const uint16_t* p) {
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToUnsigned<DF> du;
  const auto h = hn::PromoteTo(du, hn::LoadU(d16, p));
  const auto mag = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto finite = hn::BitCast(du, hn::Mul(hn::BitCast(df, mag), hn::Set(df, 0x1p112f)));
  const auto special = hn::Eq(hn::And(h, hn::Set(du, 0x7c00u)), hn::Set(du, 0x7c00u));
  return hn::BitCast(df, hn::Or(sign, hn::IfThenElse(special, hn::Or(mag, hn::Set(du, 0x7f800000u)), finite)));
#else
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
}

// Lanes(df) elements of kind E at element offset d of row (bytes), as f32.
template <math::KvElem E, class DF>
HWY_INLINE hn::Vec<DF> LoadKv(DF df, const uint8_t* row, int64_t d) {
  if constexpr (E == math::KvElem::F32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + d);
  } else if constexpr (E == math::KvElem::F16) {
    return LoadF16(df, reinterpret_cast<const uint16_t*>(row) + d);
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

// E4M3 codes (in u32 lanes) of already scaled values s, as math::e4m3_encode(
// clamp(s, -448, 448)) computes them (math::e4m3_scaled's clamp included), by two
// roundings the hardware does exactly as math::minifloat_round_code: normal codes
// (|s| >= 2^-6) round the float's bits to 3 mantissa bits, to nearest even, by an
// integer add and shift (the exponent rebased from 127 to 7); subnormal codes are
// the low bits of |s| + 2^14, a float sum whose ulp is the subnormal step 2^-9, so
// the add rounds |s| to a multiple of it, to nearest even (2^-6 itself gives code
// 8, the smallest normal, either way).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> E4m3EncodeScaled(DF df, hn::Vec<DF> s) {
  const hn::RebindToSigned<DF> di;
  const auto u = hn::BitCast(di, s);
  const auto sign = hn::And(hn::ShiftRight<24>(u), hn::Set(di, 0x80));  // arithmetic shift: the mask keeps bit 7
  const auto nan = hn::Gt(hn::And(u, hn::Set(di, 0x7fffffff)), hn::Set(di, 0x7f800000));
  const auto x = hn::Min(hn::Abs(s), hn::Set(df, math::kE4M3Max));  // NaN lanes are replaced below
  const auto a = hn::BitCast(di, x);
  const auto odd = hn::And(hn::ShiftRight<20>(a), hn::Set(di, 1));
  const auto normal = hn::Sub(hn::ShiftRight<20>(hn::Add(a, hn::Add(hn::Set(di, 0x7ffff), odd))), hn::Set(di, 120 << 3));
  const auto big = hn::Set(df, 16384.0f);  // 2^14
  const auto sub = hn::Sub(hn::BitCast(di, hn::Add(x, big)), hn::BitCast(di, big));
  const auto code = hn::IfThenElse(hn::Lt(a, hn::Set(di, 0x3c800000)), sub, normal);  // 2^-6
  return hn::IfThenElse(nan, hn::Set(di, 0x7f), hn::Or(sign, code));
}

// E4M3 codes (in u32 lanes) of scaled values s that are finite with |s| <= 448, as
// math::e4m3_encode gives them (its NaN and saturation branches cannot fire): normal codes
// by E4m3EncodeScaled's integer rounding, the sign OR-ed in; lanes below 2^-6 (subnormal
// codes) take its float add at the subnormal step, only in vectors that hold one. The
// constants come in as vectors so that loops keep them in registers.
template <class DF>
struct E4m3InRangeConsts {
  hn::Vec<hn::RebindToUnsigned<DF>> magnitude, one, round, tiny, sign;
  hn::Vec<DF> big;
  explicit E4m3InRangeConsts(DF df) {
    const hn::RebindToUnsigned<DF> du;
    magnitude = hn::Set(du, 0x7fffffffu);
    one = hn::Set(du, 1u);
    round = hn::Set(du, 0x7ffffu - (120u << 23));  // the rounding bias, the exponent rebased from 127 to 7
    tiny = hn::Set(du, 0x3c800000u);               // 2^-6, the smallest normal
    sign = hn::Set(du, 0x80u);
    big = hn::Set(df, 16384.0f);  // 2^14: a sum's ulp is the subnormal step 2^-9
  }
};

template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> E4m3CodesInRange(DF df, hn::Vec<DF> s, const E4m3InRangeConsts<DF>& k) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, s);
  const auto a = hn::And(u, k.magnitude);
  // (a - (120 << 23) + 0x7ffff + odd) >> 20: rounded to 3 mantissa bits, to nearest even
  auto code = hn::ShiftRight<20>(hn::Add(a, hn::Add(hn::And(hn::ShiftRight<20>(a), k.one), k.round)));
  const auto tiny = hn::Lt(a, k.tiny);
  if (HWY_UNLIKELY(!hn::AllFalse(du, tiny)))
    code = hn::IfThenElse(tiny, hn::Sub(hn::BitCast(du, hn::Add(hn::Abs(s), k.big)), hn::BitCast(du, k.big)), code);
  (void)df;
  return hn::OrAnd(code, hn::ShiftRight<24>(u), k.sign);
}

// Stores the low bytes of u32 lanes: four vectors' worth (4 * Lanes(du) bytes, in order).
template <class DU>
HWY_INLINE void StoreLowBytes4(DU du, hn::Vec<DU> c0, hn::Vec<DU> c1, hn::Vec<DU> c2, hn::Vec<DU> c3, uint8_t* out) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(du) == 16) {  // lanes hold values < 256: unsigned saturating packs keep them
    const __m512i w01 = _mm512_packus_epi32(c0.raw, c1.raw), w23 = _mm512_packus_epi32(c2.raw, c3.raw);
    const __m512i b = _mm512_packus_epi16(w01, w23);  // per 128-bit block j: 4 bytes each of c0, c1, c2, c3
    // dword 4j + q of b holds lanes 4j..4j+3 of c_q; memory wants them at dword 4q + j
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(out, _mm512_permutexvar_epi32(order, b));
    return;
  }
#endif
  const hn::Rebind<uint8_t, DU> d8;
  const size_t N = hn::Lanes(du);
  hn::StoreU(hn::TruncateTo(d8, c0), d8, out);
  hn::StoreU(hn::TruncateTo(d8, c1), d8, out + N);
  hn::StoreU(hn::TruncateTo(d8, c2), d8, out + 2 * N);
  hn::StoreU(hn::TruncateTo(d8, c3), d8, out + 3 * N);
}

// The codes of one group of 64 finite values whose scale exponent is k (|v| / 2^k <= 448).
template <class DF>
HWY_INLINE void EncodeFp8GroupFinite(DF df, const float* v, int k, uint8_t* codes, const E4m3InRangeConsts<DF>& kc) {
  const hn::RebindToUnsigned<DF> du;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  const auto inv = hn::Set(df, math::pow2f(-k));
  for (int32_t i = 0; i < math::kFp8Block; i += 4 * N)
    StoreLowBytes4(du, E4m3CodesInRange(df, hn::Mul(hn::LoadU(df, v + i), inv), kc),
                   E4m3CodesInRange(df, hn::Mul(hn::LoadU(df, v + i + N), inv), kc),
                   E4m3CodesInRange(df, hn::Mul(hn::LoadU(df, v + i + 2 * N), inv), kc),
                   E4m3CodesInRange(df, hn::Mul(hn::LoadU(df, v + i + 3 * N), inv), kc), codes + i);
}

// One FP8 group of 64 codes and its UE8M0 scale byte decoded to f32: the e4m3 value times the
// scale (both exact, one rounding), the floats of kvrow::decode and math::fp8_block_unpack.
template <class DF>
HWY_INLINE void DecodeFp8Group(DF df, const uint8_t* codes, uint8_t scale_byte, float* out) {
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  const auto scale = hn::Set(df, math::ue8m0_decode(scale_byte));
  for (int32_t i = 0; i < math::kFp8Block; i += N) hn::StoreU(hn::Mul(LoadKv<math::KvElem::E4M3>(df, codes, i), scale), df, out + i);
}

// One FP8 group of 64 values: the UE8M0 scale from the finite amax and the 64
// codes, as kvrow::encode_group / math::fp8_block_pack compute them. The amax is
// the largest magnitude's bits (integer order is float order for magnitudes); a
// group whose largest is inf or NaN takes E4m3EncodeScaled (clamp and NaN codes),
// every other group E4m3CodesInRange: its scaled values are finite and |v| / 2^k <= 448
// (2^k >= amax / 448 exactly, and the product rounds to at most 448).
template <class DF>
HWY_INLINE void EncodeFp8Group(DF df, const float* v, uint8_t* codes, uint8_t* scale, const E4m3InRangeConsts<DF>& kc) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint8_t, DF> d8;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  auto top = hn::Zero(du);
  for (int32_t i = 0; i < math::kFp8Block; i += N) top = hn::Max(top, hn::And(hn::BitCast(du, hn::LoadU(df, v + i)), kc.magnitude));
  const uint32_t amax_bits = hn::GetLane(hn::MaxOfLanes(du, top));
  if (HWY_UNLIKELY(amax_bits >= 0x7f800000u)) {  // inf or NaN in the group: the amax of the finite values
    auto acc = hn::Zero(df);
    for (int32_t i = 0; i < math::kFp8Block; i += N) {
      const auto x = hn::LoadU(df, v + i);
      acc = hn::Max(acc, hn::IfThenElseZero(hn::IsFinite(x), hn::Abs(x)));
    }
    const int k = math::e4m3_scale_exponent(hn::GetLane(hn::MaxOfLanes(df, acc)));
    const auto inv = hn::Set(df, math::pow2f(-k));
    for (int32_t i = 0; i < math::kFp8Block; i += N)
      hn::StoreU(hn::DemoteTo(d8, E4m3EncodeScaled(df, hn::Mul(hn::LoadU(df, v + i), inv))), d8, codes + i);
    *scale = math::ue8m0_encode(k);
    return;
  }
  const int k = math::e4m3_scale_exponent(math::bits_float(amax_bits));
  EncodeFp8GroupFinite(df, v, k, codes, kc);
  *scale = math::ue8m0_encode(k);
}

HWY_INLINE void EncodeFp8Group(const float* v, uint8_t* codes, uint8_t* scale) {
  using DF = hn::ScalableTag<float>;
  EncodeFp8Group(DF(), v, codes, scale, E4m3InRangeConsts<DF>(DF()));
}

// out[g] = the largest lane of top[g], g < 8: pairs of vectors interleaved and maxed
// inside each 128-bit block (a transposition, as SumOfLanes4 does), then the blocks
// maxed, so eight maxima cost about what two MaxOfLanes do.
template <class DU>
HWY_INLINE void LaneMaxima8(DU du, const hn::Vec<DU>* top, uint32_t* out) {
#if HWY_TARGET == HWY_SCALAR
  (void)du;
  for (int g = 0; g < 8; ++g) out[g] = hn::GetLane(top[g]);
#else
  const hn::Repartition<uint64_t, DU> d64;
  const size_t N = hn::Lanes(du);
  hn::Vec<DU> w[4];  // per block: max of lanes 0,2 and 1,3 of two sources
  for (int i = 0; i < 4; ++i)
    w[i] = hn::Max(hn::InterleaveLower(du, top[2 * i], top[2 * i + 1]), hn::InterleaveUpper(du, top[2 * i], top[2 * i + 1]));
  HWY_ALIGN uint32_t lanes[2 * hn::MaxLanes(du)];
  for (int i = 0; i < 2; ++i) {  // per block: the maxima of sources 4i .. 4i + 3
    const auto a = hn::BitCast(d64, w[2 * i]), b = hn::BitCast(d64, w[2 * i + 1]);
    hn::Store(hn::Max(hn::BitCast(du, hn::InterleaveLower(d64, a, b)), hn::BitCast(du, hn::InterleaveUpper(d64, a, b))), du,
              lanes + i * N);
  }
  const hn::Full128<uint32_t> d4;
  for (size_t i = 0; i < 2; ++i) {
    auto m = hn::Load(d4, lanes + i * N);
    for (size_t j = 4; j < N; j += 4) m = hn::Max(m, hn::Load(d4, lanes + i * N + j));
    hn::StoreU(m, d4, out + 4 * i);
  }
#endif
}

// n <= 8 full groups at v + 64 g: codes to codes + 64 g, scale bytes to scales[g * scale_stride],
// the bytes of EncodeFp8Group on each. The groups' maxima are reduced together (LaneMaxima8), so
// no group's codes wait on its own reduction and scalar scale as one after another.
template <class DF>
HWY_INLINE void EncodeFp8Groups8(DF df, const float* v, int32_t n, uint8_t* codes, uint8_t* scales, int64_t scale_stride,
                                 const E4m3InRangeConsts<DF>& kc) {
  const hn::RebindToUnsigned<DF> du;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  hn::Vec<decltype(du)> top[8];
  for (int32_t g = 0; g < 8; ++g) {
    top[g] = hn::Zero(du);
    if (g >= n) continue;
    for (int32_t i = 0; i < math::kFp8Block; i += N)
      top[g] = hn::Max(top[g], hn::And(hn::BitCast(du, hn::LoadU(df, v + g * math::kFp8Block + i)), kc.magnitude));
  }
  HWY_ALIGN uint32_t amax[8];
  LaneMaxima8(du, top, amax);
  for (int32_t g = 0; g < n; ++g) {
    const float* gv = v + g * math::kFp8Block;
    uint8_t* gc = codes + g * math::kFp8Block;
    if (HWY_UNLIKELY(amax[g] >= 0x7f800000u)) {
      EncodeFp8Group(df, gv, gc, scales + g * scale_stride, kc);
      continue;
    }
    const int k = math::e4m3_scale_exponent(math::bits_float(amax[g]));
    EncodeFp8GroupFinite(df, gv, k, gc, kc);
    scales[g * scale_stride] = math::ue8m0_encode(k);
  }
}

// EncodeFp8Groups8 over any number of full groups.
template <class DF>
HWY_INLINE void EncodeFp8Groups(DF df, const float* v, int32_t n, uint8_t* codes, uint8_t* scales, int64_t scale_stride,
                                const E4m3InRangeConsts<DF>& kc) {
  for (int32_t g = 0; g < n; g += 8)
    EncodeFp8Groups8(df, v + g * math::kFp8Block, n - g < 8 ? n - g : 8, codes + g * math::kFp8Block,
                     scales + g * scale_stride, scale_stride, kc);
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
