// The DeepSeek-V4 sparse attention's tile step with the heads in lanes
// (dsv4_heads_tile_simd in dsv4_simd.hpp).
//
// Every head of a query row reads the same key rows (MQA, K = V), so a tile's
// two products are matrix products with the heads on one side:
//   scores S[i][h] = sum_d K[i][d] Q[h][d]: lanes over heads; each key value is
//     broadcast against a vector of the transposed queries, a register block of
//     (keys x head vectors) accumulators, each lane one FMA chain over d in the
//     scalar order (no lane reductions); the dims pass in chunks whose queries
//     stay in L1, the partial sums parked in S between chunks;
//   softmax: tile max, rescale and exp2 per vector of heads;
//   sums acc[h][d] = acc[h][d] * rescale[h] + sum_i P[i][h] K[i][d]: lanes over
//     dims; each weight is broadcast, a register block of (heads x dim vectors)
//     accumulators runs over the tile's keys, loaded and stored once a tile.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/dsv4_heads_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cpu/dsv4_simd.hpp"
#include "cpu/simd_kv-inl.h"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp4.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/hadamard.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int32_t kD = math::Dsv4RowLayout::kHeadDim;
// Dims of the queries one pass of the score blocks reads: 64 x hp floats (16 KB at 64 heads).
constexpr int32_t kChunk = 64;
// Accumulator registers a block keeps (AVX-512 has 32 vector registers, the others 16),
// leaving room for the loaded vectors and the broadcast.
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
constexpr int kAcc = 24, kMaxHv = 4, kSumDv = 4;
#else
constexpr int kAcc = 12, kMaxHv = 2, kSumDv = 2;
#endif
constexpr int kSumHeads = kAcc / kSumDv;

// Scores of KB keys (rows k[j]; the first nk stored) against head vectors [hv0, hv0 + HV),
// dims [x0, x0 + kChunk): s[j * hp + h] continues the sum (first: starts it).
template <int HV, int KB>
HWY_INLINE void ScoreBlock(const float* qt, int32_t hp, int32_t hv0, const float* const* k, int32_t nk, int32_t x0,
                           bool first, float* s) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  VF a[KB][HV];
  HWY_UNROLL(32)
  for (int j = 0; j < KB; ++j) {
    HWY_UNROLL(32)
    for (int c = 0; c < HV; ++c)
      a[j][c] = first || j >= nk ? hn::Zero(d) : hn::LoadU(d, s + int64_t{j} * hp + (hv0 + c) * N);
  }
  const float* q = qt + int64_t{x0} * hp + hv0 * N;
  for (int32_t x = x0; x < x0 + kChunk; ++x, q += hp) {
    VF qv[HV];
    HWY_UNROLL(32)
    for (int c = 0; c < HV; ++c) qv[c] = hn::LoadU(d, q + c * N);
    HWY_UNROLL(32)
    for (int j = 0; j < KB; ++j) {
      const VF kb = hn::Set(d, k[j][x]);
      HWY_UNROLL(32)
      for (int c = 0; c < HV; ++c) a[j][c] = hn::MulAdd(qv[c], kb, a[j][c]);
    }
  }
  HWY_UNROLL(32)
  for (int j = 0; j < KB; ++j) {
    if (j >= nk) break;
    HWY_UNROLL(32)
    for (int c = 0; c < HV; ++c) hn::StoreU(a[j][c], d, s + int64_t{j} * hp + (hv0 + c) * N);
  }
}

// Scores of the n keys (rows of dim floats, dim a multiple of kChunk) against head vectors
// [hv0, hv0 + HV).
template <int HV>
HWY_INLINE void ScoreHeads(const float* qt, int32_t hp, int32_t hv0, const float* keys, int32_t n, int32_t dim,
                           float* s) {
  constexpr int KB = kAcc / HV;
  for (int32_t x0 = 0; x0 < dim; x0 += kChunk) {
    for (int32_t i = 0; i < n; i += KB) {
      const float* k[KB];
      for (int j = 0; j < KB; ++j) k[j] = keys + int64_t{std::min(i + j, n - 1)} * dim;  // past n: re-read, not stored
      ScoreBlock<HV, KB>(qt, hp, hv0, k, std::min(KB, n - i), x0, x0 == 0, s + int64_t{i} * hp);
    }
  }
}

// acc rows [h0, h0 + HB), dim vectors [v0, v0 + kSumDv): times rescale[h] (when scaled)
// and plus the n keys weighted by P = s[i * hp + h].
template <int HB>
HWY_INLINE void SumBlock(const float* keys, const float* s, int32_t hp, int32_t n, int32_t h0, int32_t v0,
                         const float* rescale, bool scaled, float* acc) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  VF a[HB][kSumDv];
  HWY_UNROLL(32)
  for (int h = 0; h < HB; ++h) {
    const VF r = hn::Set(d, rescale[h0 + h]);
    HWY_UNROLL(32)
    for (int v = 0; v < kSumDv; ++v) {
      a[h][v] = hn::LoadU(d, acc + int64_t{h0 + h} * kD + (v0 + v) * N);
      if (scaled) a[h][v] = hn::Mul(a[h][v], r);
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    const float* k = keys + int64_t{i} * kD + v0 * N;
    const float* w = s + int64_t{i} * hp + h0;
    VF kv[kSumDv];
    HWY_UNROLL(32)
    for (int v = 0; v < kSumDv; ++v) kv[v] = hn::LoadU(d, k + v * N);
    HWY_UNROLL(32)
    for (int h = 0; h < HB; ++h) {
      const VF wb = hn::Set(d, w[h]);
      HWY_UNROLL(32)
      for (int v = 0; v < kSumDv; ++v) a[h][v] = hn::MulAdd(wb, kv[v], a[h][v]);
    }
  }
  HWY_UNROLL(32)
  for (int h = 0; h < HB; ++h) {
    HWY_UNROLL(32)
    for (int v = 0; v < kSumDv; ++v) hn::StoreU(a[h][v], d, acc + int64_t{h0 + h} * kD + (v0 + v) * N);
  }
}

// s[i * hp + h] = the dot of key row i (dim floats) with head h's query qt[x * hp + h].
HWY_INLINE void Scores(const float* qt, int32_t hp, const float* keys, int32_t n, int32_t dim, float* s) {
  const int32_t hv = hp / static_cast<int32_t>(hn::Lanes(DF()));
  for (int32_t v = 0; v < hv; v += kMaxHv) {
    switch (std::min(kMaxHv, hv - v)) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
      case 4: ScoreHeads<4>(qt, hp, v, keys, n, dim, s); break;
      case 3: ScoreHeads<3>(qt, hp, v, keys, n, dim, s); break;
#endif
      case 2: ScoreHeads<2>(qt, hp, v, keys, n, dim, s); break;
      default: ScoreHeads<1>(qt, hp, v, keys, n, dim, s); break;
    }
  }
}

}  // namespace

int32_t Dsv4HeadLanes() { return static_cast<int32_t>(hn::Lanes(DF())); }

void Dsv4TransposeHeads(const float* q, int64_t head_stride, int32_t hp, int32_t dim, float scale, float* qt) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  const auto idx = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(head_stride)));  // lane j: head j
  const VF sv = hn::Set(d, scale);
  for (int32_t h = 0; h < hp; h += N)
    for (int32_t x = 0; x < dim; ++x)
      hn::StoreU(hn::Mul(hn::GatherIndex(d, q + h * head_stride + x, idx), sv), d, qt + int64_t{x} * hp + h);
}

void Dsv4IndexerScoresLanes(const float* qt, const float* w, int32_t hp, int32_t dim, const float* keys, int32_t n,
                            float* s, float* scores) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  Scores(qt, hp, keys, n, dim, s);
  for (int32_t i = 0; i < n; ++i) {  // the same operations for every row
    const float* si = s + int64_t{i} * hp;
    VF acc = hn::Zero(d);
    for (int32_t h = 0; h < hp; h += N) {
      const VF dot = hn::LoadU(d, si + h);
      acc = hn::MulAdd(hn::LoadU(d, w + h), hn::IfThenElseZero(hn::Gt(dot, hn::Zero(d)), dot), acc);  // NaN: 0
    }
    scores[i] = hn::GetLane(hn::SumOfLanes(d, acc));
  }
}

void Dsv4IndexerQueryPrep(float* qt, int32_t hp, int32_t dim, float hadamard_scale) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  using VI = hn::Vec<decltype(di)>;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  auto ci = [&](uint32_t v) { return hn::Set(di, static_cast<int32_t>(v)); };
  for (int32_t c = 0; c < hp; c += N) {  // a vector of heads: row x of the queries at qt + x * hp + c
    auto at = [&](int32_t x) { return qt + int64_t{x} * hp + c; };
    // math::hadamard_transform: the same butterflies in the same order, then the scale.
    for (int32_t h = 1; h < dim; h *= 2)
      for (int32_t i = 0; i < dim; i += 2 * h)
        for (int32_t j = i; j < i + h; ++j) {
          const VF a = hn::LoadU(d, at(j)), b = hn::LoadU(d, at(j + h));
          hn::StoreU(hn::Add(a, b), d, at(j));
          hn::StoreU(hn::Sub(a, b), d, at(j + h));
        }
    for (int32_t x = 0; x < dim; ++x) hn::StoreU(hn::Mul(hn::LoadU(d, at(x)), hn::Set(d, hadamard_scale)), d, at(x));
    // math::fp4_block_round_trip per block of 32 dims.
    for (int32_t x0 = 0; x0 < dim; x0 += math::kFp4Block) {
      VF amax = hn::Zero(d);  // math::finite_abs_max
      for (int32_t x = x0; x < x0 + math::kFp4Block; ++x) {
        const VF v = hn::LoadU(d, at(x)), a = hn::Abs(v);
        const auto finite = hn::RebindMask(d, hn::Ne(hn::And(hn::BitCast(di, v), ci(0x7f800000u)), ci(0x7f800000u)));
        amax = hn::IfThenElse(hn::And(finite, hn::Gt(a, amax)), a, amax);
      }
      // math::e2m1_scale_exponent: pow2_scale_exponent<0x400000, 2> of max(amax, floor).
      const VF floor = hn::Set(d, math::kScaleAmaxFloor);
      const VI ab = hn::And(hn::BitCast(di, hn::IfThenElse(hn::Ge(amax, floor), amax, floor)), ci(0x7fffffffu));
      VI k = hn::Sub(hn::ShiftRight<23>(ab), hn::Set(di, 127 + 2));
      k = hn::Sub(k, hn::VecFromMask(di, hn::Gt(hn::And(ab, ci(0x7fffffu)), ci(0x400000u))));  // + 1
      const VF inv = hn::BitCast(d, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 127), k)));  // pow2f(-k)
      const VF scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(k, hn::Set(di, 127))));  // pow2f(k)
      const VF six = hn::Set(d, math::kE2M1Max), msix = hn::Set(d, -math::kE2M1Max);
      for (int32_t x = x0; x < x0 + math::kFp4Block; ++x) {
        VF sv = hn::Mul(hn::LoadU(d, at(x)), inv);  // math::e2m1_scaled
        sv = hn::IfThenElse(hn::Gt(sv, six), six, sv);
        sv = hn::IfThenElse(hn::Lt(sv, msix), msix, sv);
        // math::e2m1_encode: the boundaries at or below |s| (bit patterns; a >= b as a > b - 1).
        const VI u = hn::BitCast(di, sv), a = hn::And(u, ci(0x7fffffffu));
        VI code = hn::Zero(di);
        for (uint32_t bound : {0x3e800000u, 0x3f3fffffu, 0x3fa00000u, 0x3fdfffffu, 0x40200000u, 0x405fffffu, 0x40a00000u})
          code = hn::Sub(code, hn::VecFromMask(di, hn::Gt(a, ci(bound))));
        const VI sign = hn::IfThenElseZero(hn::Not(hn::Gt(a, ci(0x7f800000u))), hn::And(hn::ShiftRight<28>(u), ci(8u)));
        // math::e2m1_decode of (sign | code), times pow2f(k).
        const VI normal = hn::Add(hn::ShiftLeft<22>(code), ci(126u << 23));
        const VI small = hn::IfThenElseZero(hn::Eq(code, ci(1u)), ci(0x3f000000u));
        const VI bits = hn::Or(hn::IfThenElse(hn::Gt(code, ci(1u)), normal, small), hn::ShiftLeft<28>(sign));
        hn::StoreU(hn::Mul(hn::BitCast(d, bits), scale), d, at(x));
      }
    }
  }
}

void Dsv4Fp4RowsDecode(const uint8_t* rows, int64_t stride, int32_t n, int32_t dim, float* dst) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no pair of codes a u64 lane
  for (int32_t r = 0; r < n; ++r)
    for (int32_t x = 0; x < dim; ++x)
      dst[int64_t{r} * dim + x] = math::dsv4_unpack_fp4_value(rows + r * stride, dim, x);
#else
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const hn::Repartition<uint64_t, DF> d64;
  const hn::Rebind<uint32_t, decltype(d64)> d32h;
  const hn::Rebind<uint8_t, decltype(d64)> d8;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  for (int32_t r = 0; r < n; ++r) {
    const uint8_t* row = rows + r * stride;
    float* out = dst + int64_t{r} * dim;
    for (int32_t x = 0; x < dim; x += N) {
      // N / 2 bytes, each two codes: low nibble first, as u32 lanes.
      const auto b = hn::PromoteTo(d64, hn::PromoteTo(d32h, hn::LoadU(d8, row + x / 2)));
      const auto c = hn::BitCast(du, hn::Or(hn::And(b, hn::Set(d64, 0xfu)), hn::ShiftLeft<28>(hn::And(b, hn::Set(d64, 0xf0u)))));
      // math::e2m1_decode: magnitude codes 2..7 are 2^(e - 1) (1 + m / 2), placed as f32 bits;
      // 1 is 0.5, 0 is 0; the sign from bit 3.
      const auto mag = hn::And(c, hn::Set(du, 7u));
      const auto normal = hn::Add(hn::ShiftLeft<22>(mag), hn::Set(du, 126u << 23));
      const auto small = hn::IfThenElseZero(hn::Eq(mag, hn::Set(du, 1u)), hn::Set(du, 0x3f000000u));
      const auto bits = hn::Or(hn::IfThenElse(hn::Gt(mag, hn::Set(du, 1u)), normal, small),
                               hn::ShiftLeft<28>(hn::And(c, hn::Set(du, 8u))));
      const VF scale = hn::Set(d, math::ue8m0_decode(row[dim / 2 + x / math::kFp4Block]));
      hn::StoreU(hn::Mul(hn::BitCast(d, bits), scale), d, out + x);
    }
  }
#endif
}

void Dsv4HeadsTile(const float* qt, int32_t n_heads, int32_t hp, const float* keys, const bool* live, int32_t n,
                   float* m, float* l, float* acc, float* s, float* rescale) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  Scores(qt, hp, keys, n, kD, s);
  const VF ninf = hn::Set(d, -INFINITY), one = hn::Set(d, 1.0f);
  for (int32_t i = 0; i < n; ++i)
    if (!live[i])
      for (int32_t h = 0; h < hp; h += N) hn::StoreU(ninf, d, s + int64_t{i} * hp + h);
  // Softmax: per vector of heads, math::OnlineSoftmax::begin_tile, then the weights.
  for (int32_t h = 0; h < hp; h += N) {
    VF mx = ninf;
    for (int32_t i = 0; i < n; ++i) mx = hn::Max(mx, hn::LoadU(d, s + int64_t{i} * hp + h));
    const VF m_old = hn::LoadU(d, m + h), m_new = hn::Max(m_old, mx);
    // exp2(m_old - m_new); m_old = -inf: 0, or 1 when m_new is -inf too (nothing seen yet).
    const VF r = hn::IfThenElse(hn::Eq(m_new, ninf), one, Exp2NonPositive(d, hn::Sub(m_old, m_new)));
    VF sum = hn::Zero(d);
    for (int32_t i = 0; i < n; ++i) {  // -inf scores (and every score while m_new is -inf) weigh 0
      float* si = s + int64_t{i} * hp + h;
      const VF p = Exp2NonPositive(d, hn::Sub(hn::LoadU(d, si), m_new));
      hn::StoreU(p, d, si);
      sum = hn::Add(sum, p);
    }
    hn::StoreU(hn::MulAdd(hn::LoadU(d, l + h), r, sum), d, l + h);
    hn::StoreU(m_new, d, m + h);
    hn::StoreU(r, d, rescale + h);
  }
  // Weighted sums of the real heads: a block of dims at a time (its key values stay in L1),
  // every block of heads.
  bool scaled = false;
  for (int32_t h = 0; h < n_heads; ++h) scaled |= rescale[h] != 1.0f;
  for (int32_t v0 = 0; v0 < kD / N; v0 += kSumDv) {
    for (int32_t h = 0; h < n_heads; h += kSumHeads) {
      switch (std::min(kSumHeads, n_heads - h)) {
        case 6: SumBlock<6>(keys, s, hp, n, h, v0, rescale, scaled, acc); break;
        case 5: SumBlock<5>(keys, s, hp, n, h, v0, rescale, scaled, acc); break;
        case 4: SumBlock<4>(keys, s, hp, n, h, v0, rescale, scaled, acc); break;
        case 3: SumBlock<3>(keys, s, hp, n, h, v0, rescale, scaled, acc); break;
        case 2: SumBlock<2>(keys, s, hp, n, h, v0, rescale, scaled, acc); break;
        default: SumBlock<1>(keys, s, hp, n, h, v0, rescale, scaled, acc); break;
      }
    }
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(Dsv4HeadLanes);
HWY_EXPORT(Dsv4HeadsTile);
HWY_EXPORT(Dsv4TransposeHeads);
void dsv4_transpose_heads_simd(const float* q, int64_t head_stride, int32_t hp, int32_t dim, float scale, float* qt) {
  HWY_DYNAMIC_DISPATCH(Dsv4TransposeHeads)(q, head_stride, hp, dim, scale, qt);
}
HWY_EXPORT(Dsv4IndexerScoresLanes);
void dsv4_indexer_scores_lanes_simd(const float* qt, const float* w, int32_t hp, int32_t dim, const float* keys,
                                    int32_t n, float* s, float* scores) {
  HWY_DYNAMIC_DISPATCH(Dsv4IndexerScoresLanes)(qt, w, hp, dim, keys, n, s, scores);
}
HWY_EXPORT(Dsv4IndexerQueryPrep);
void dsv4_indexer_query_prep_simd(float* qt, int32_t hp, int32_t dim) {
  float scale = 0.0f;
  switch (dim) {
    case 64: scale = math::hadamard_scale<64>(); break;
    case 128: scale = math::hadamard_scale<128>(); break;
    case 256: scale = math::hadamard_scale<256>(); break;
    case 512: scale = math::hadamard_scale<512>(); break;
    default: throw std::invalid_argument("dsv4_indexer_query_prep_simd: dim must be 64, 128, 256 or 512");
  }
  HWY_DYNAMIC_DISPATCH(Dsv4IndexerQueryPrep)(qt, hp, dim, scale);
}
HWY_EXPORT(Dsv4Fp4RowsDecode);
void dsv4_fp4_rows_decode_simd(const uint8_t* rows, int64_t stride, int32_t n, int32_t dim, float* dst) {
  HWY_DYNAMIC_DISPATCH(Dsv4Fp4RowsDecode)(rows, stride, n, dim, dst);
}
int32_t dsv4_head_lanes() { return HWY_DYNAMIC_DISPATCH(Dsv4HeadLanes)(); }
void dsv4_heads_tile_simd(const float* qt, int32_t n_heads, int32_t hp, const float* keys, const bool* live, int32_t n,
                          float* m, float* l, float* acc, float* s, float* rescale) {
  HWY_DYNAMIC_DISPATCH(Dsv4HeadsTile)(qt, n_heads, hp, keys, live, n, m, l, acc, s, rescale);
}
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
