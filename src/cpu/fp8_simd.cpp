// fp8 pack / unpack with SIMD: OpenMP over rows; full 64-value blocks a vector
// at a time, a row's blocks eight at a time (EncodeFp8Groups: amax, the UE8M0
// exponent, the E4M3 codes by the integer rounding of math::e4m3_encode per lane;
// decoding through the exact f16 widening), the 16-bit tail converted a vector at
// a time; partial blocks by the shared scalar helpers (math/fp8_block.hpp); the f32
// round trip rounds finite blocks on the e4m3 grid in f32 lanes, other blocks as
// pack then unpack. Bytes equal the scalar kernels'.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/fp8_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <type_traits>

#include "cpu/fp8_simd.hpp"
#include "cpu/simd_kv-inl.h"
#include "cpu/simd_rope-inl.h"
#include "kvcore/math/fp8_block.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

using math::kFp8Block;

// dst[0, n) = src[0, n) converted through f32 (to_f32, then from_f32: exact or round to nearest even).
template <class From, class To>
void Convert(const From* src, int32_t n, To* dst) {
  const hn::ScalableTag<float> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  int32_t i = 0;
  for (; i + N <= n; i += N) StoreFromF32(df, LoadAsF32(df, src + i), dst + i);
  for (; i < n; ++i) dst[i] = from_f32<To>(to_f32(src[i]));
}

template <class T, class Tail>
void PackRows(const Fp8PackParams& p) {
  const T* src = static_cast<const T*>(p.src);
  Tail* tail = static_cast<Tail*>(p.maybe_tail);
  uint8_t* const pad = p.maybe_pad;
  // the row maps and sizes in locals: the byte stores below may alias any memory, p's included
  const RowMap src_rows = p.src_rows, code_rows = p.code_rows, scale_rows = p.scale_rows, tail_rows = p.tail_rows,
               pad_rows = p.pad_rows;
  const int64_t scs = scale_rows.col_stride, rows = p.rows;
  const int32_t n_nope = p.n_nope, n_rot = p.cols - p.n_nope;
  using DF = hn::ScalableTag<float>;
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  const E4m3InRangeConsts<DF> kc(df);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + src_rows.offset(r);
    uint8_t* c = p.codes + code_rows.offset(r);
    uint8_t* sc = p.scales + scale_rows.offset(r);
    const int32_t full = n_nope / kFp8Block;
    if constexpr (std::is_same_v<T, float>) {
      EncodeFp8Groups(df, s, full, c, sc, scs, kc);
    } else {  // widened to f32 first (exact), 8 groups at a time
      HWY_ALIGN float groups[8 * kFp8Block];
      for (int32_t g = 0; g < full; g += 8) {
        const int32_t n = full - g < 8 ? full - g : 8;
        for (int32_t i = 0; i < n * kFp8Block; i += N) hn::Store(LoadAsF32(df, s + g * kFp8Block + i), df, groups + i);
        EncodeFp8Groups8(df, groups, n, c + g * kFp8Block, sc + g * scs, scs, kc);
      }
    }
    if (full * kFp8Block < n_nope)  // a partial last block: the shared scalar helper
      sc[full * scs] = math::fp8_block_pack(s + full * kFp8Block, 1, n_nope - full * kFp8Block, c + full * kFp8Block, 1);
    if (tail) Convert(s + n_nope, n_rot, tail + tail_rows.offset(r));
    if (pad) pad[pad_rows.offset(r)] = 0;
  }
}

template <class T, class Tail>
void UnpackRows(const Fp8UnpackParams& p) {
  T* dst = static_cast<T*>(p.dst);
  const Tail* tail = static_cast<const Tail*>(p.maybe_tail);
  const int64_t scs = p.scale_rows.col_stride;
  const int32_t n_rot = p.cols - p.n_nope;
  const hn::ScalableTag<float> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    T* d = dst + p.dst_rows.offset(r);
    const uint8_t* c = p.codes + p.code_rows.offset(r);
    const uint8_t* sc = p.scales + p.scale_rows.offset(r);
    for (int32_t off = 0, b = 0; off < p.n_nope; off += kFp8Block, ++b) {
      if (p.n_nope - off < kFp8Block) {
        math::fp8_block_unpack(c + off, 1, sc[b * scs], p.n_nope - off, d + off, 1);
        continue;
      }
      // math::fp8_decode_scaled: the e4m3 value (exact: 2^8 times the widened f16) times the scale
      const auto scale = hn::Set(df, math::ue8m0_decode(sc[b * scs]));
      for (int32_t i = 0; i < kFp8Block; i += N) {
        const auto v = hn::Mul(LoadE4m3Over256(df, c, off + i), hn::Set(df, 256.0f));
        StoreFromF32(df, hn::Mul(v, scale), d + off + i);
      }
    }
    if (tail) Convert(tail + p.tail_rows.offset(r), n_rot, d + p.n_nope);
  }
}

// One full block's round trip (math::fp8_block_round_trip). Blocks without inf or NaN
// round each scaled value |s| <= 448 on the e4m3 grid directly: normal values by the
// integer round-to-nearest-even of E4m3CodesInRange, kept in place as an f32 (the
// exponent is not rebased; the sign bit is untouched: no carry reaches it); values
// below 2^-6 by the float add at the subnormal step, the sign put back. That is
// math::e4m3_round_value, so unpack(pack(x)) bit for bit. Other blocks encode and decode.
template <class DF>
HWY_INLINE void RoundTripFp8Group(DF df, const float* s, float* d, const E4m3InRangeConsts<DF>& kc) {
  const hn::RebindToUnsigned<DF> du;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  auto top = hn::Zero(du);
  for (int32_t i = 0; i < kFp8Block; i += N) top = hn::Max(top, hn::And(hn::BitCast(du, hn::LoadU(df, s + i)), kc.magnitude));
  const uint32_t amax_bits = hn::GetLane(hn::MaxOfLanes(du, top));
  if (HWY_UNLIKELY(amax_bits >= 0x7f800000u)) {
    HWY_ALIGN uint8_t codes[kFp8Block];
    uint8_t sc;
    EncodeFp8Group(df, s, codes, &sc, kc);
    const auto scale = hn::Set(df, math::ue8m0_decode(sc));
    for (int32_t i = 0; i < kFp8Block; i += N)
      hn::StoreU(hn::Mul(hn::Mul(LoadE4m3Over256(df, codes, i), hn::Set(df, 256.0f)), scale), df, d + i);
    return;
  }
  const int k = math::e4m3_scale_exponent(math::bits_float(amax_bits));
  const auto inv = hn::Set(df, math::pow2f(-k)), scale = hn::Set(df, math::pow2f(k));
  const auto keep = hn::Set(du, 0xfff00000u);  // sign, exponent and 3 mantissa bits
  for (int32_t i = 0; i < kFp8Block; i += N) {
    const auto x = hn::Mul(hn::LoadU(df, s + i), inv);
    const auto u = hn::BitCast(du, x);
    const auto a = hn::And(u, kc.magnitude);
    auto r = hn::And(hn::Add(u, hn::Add(hn::And(hn::ShiftRight<20>(a), kc.one), hn::Set(du, 0x7ffffu))), keep);
    const auto tiny = hn::Lt(a, kc.tiny);
    if (HWY_UNLIKELY(!hn::AllFalse(du, tiny))) {
      const auto sub = hn::Sub(hn::Add(hn::Abs(x), kc.big), kc.big);  // on the 2^-9 grid, nearest even
      r = hn::IfThenElse(tiny, hn::Or(hn::BitCast(du, sub), hn::AndNot(kc.magnitude, u)), r);
    }
    hn::StoreU(hn::Mul(hn::BitCast(df, r), scale), df, d + i);
  }
}

// fp8_round_trip_rows: full blocks by RoundTripFp8Group, partial blocks by the shared
// scalar helper; the tail copied unless it is the same memory.
void RoundTripRows(const Fp8RoundTripParams& p) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const E4m3InRangeConsts<DF> kc(df);
  const RowMap src_rows = p.src_rows, dst_rows = p.dst_rows;
  const int32_t n_nope = p.n_nope, cols = p.cols;
  const int64_t rows = p.rows;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = p.src + src_rows.offset(r);
    float* d = p.dst + dst_rows.offset(r);
    for (int32_t off = 0; off < n_nope; off += kFp8Block) {
      if (n_nope - off < kFp8Block) {
        math::fp8_block_round_trip(s + off, 1, d + off, 1, n_nope - off);
        continue;
      }
      RoundTripFp8Group(df, s + off, d + off, kc);
    }
    if (s != d)
      for (int32_t i = n_nope; i < cols; ++i) d[i] = s[i];
  }
}

template <template <class, class> class Kernel, class P>
void ByTypes(DType row_type, DType tail_type, const P& p) {
  const bool b = tail_type == DType::BF16;
  switch (row_type) {
    case DType::F32: return b ? Kernel<float, bf16>::Run(p) : Kernel<float, f16>::Run(p);
    case DType::F16: return b ? Kernel<f16, bf16>::Run(p) : Kernel<f16, f16>::Run(p);
    default: return b ? Kernel<bf16, bf16>::Run(p) : Kernel<bf16, f16>::Run(p);
  }
}
template <class T, class Tail>
struct Pack {
  static void Run(const Fp8PackParams& p) { PackRows<T, Tail>(p); }
};
template <class T, class Tail>
struct Unpack {
  static void Run(const Fp8UnpackParams& p) { UnpackRows<T, Tail>(p); }
};

}  // namespace

void Fp8PackRows(const Fp8PackParams& p) { ByTypes<Pack>(p.src_dtype, p.tail_dtype, p); }
void Fp8UnpackRows(const Fp8UnpackParams& p) { ByTypes<Unpack>(p.dst_dtype, p.tail_dtype, p); }
void Fp8RoundTripRows(const Fp8RoundTripParams& p) { RoundTripRows(p); }

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(Fp8PackRows);
HWY_EXPORT(Fp8UnpackRows);
HWY_EXPORT(Fp8RoundTripRows);

bool fp8_simd_serves(const Fp8PackParams& p) {
  return p.src_rows.col_stride == 1 && p.code_rows.col_stride == 1 && (!p.maybe_tail || p.tail_rows.col_stride == 1);
}
bool fp8_simd_serves(const Fp8UnpackParams& p) {
  return p.dst_rows.col_stride == 1 && p.code_rows.col_stride == 1 && (!p.maybe_tail || p.tail_rows.col_stride == 1);
}
void fp8_pack_rows_simd(const Fp8PackParams& p) { HWY_DYNAMIC_DISPATCH(Fp8PackRows)(p); }
void fp8_unpack_rows_simd(const Fp8UnpackParams& p) { HWY_DYNAMIC_DISPATCH(Fp8UnpackRows)(p); }
bool fp8_simd_serves(const Fp8RoundTripParams& p) { return p.src_rows.col_stride == 1 && p.dst_rows.col_stride == 1; }
void fp8_round_trip_rows_simd(const Fp8RoundTripParams& p) { HWY_DYNAMIC_DISPATCH(Fp8RoundTripRows)(p); }
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
