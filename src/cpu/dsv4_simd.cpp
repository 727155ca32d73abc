// The DeepSeek-V4 CPU kernels' SIMD parts (see dsv4_simd.hpp).
//
// Pool: channels in lanes; each lane runs the scalar pool's operations in the
// scalar order (candidate by candidate), with Highway's exp. Indexer scores (dims
// the heads-in-lanes path does not take, dsv4_heads_simd.cpp): four key rows at a
// time against one query vector, two accumulators per row (the even and odd vectors
// of the dims, eight independent FMA chains), reduced across lanes by SumOfLanes4;
// every row goes through the same operations whatever its place in the group, so
// equal rows score equal bits (the indexer's top-k breaks ties by row). The row
// kernels (decode, pack, rotation, the finalizer's row) give the shared math's bits.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/dsv4_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/dsv4_simd.hpp"
#include "cpu/simd_kv-inl.h"
#include "cpu/simd_rope-inl.h"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/rope.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Candidate j's logits at channel k: z[j][k], plus the ape row a[j] where it has one (f32 or
// f16 values, widened exactly: the scalar path's single float add).
struct Ape {
  const void* const* a;
  bool f16;
  HWY_INLINE VF Logit(DF d, const float* const* z, int32_t j, int32_t k) const {
    const VF zv = hn::LoadU(d, z[j] + k);
    if (a == nullptr || a[j] == nullptr) return zv;
    return hn::Add(zv, f16 ? LoadF16(d, static_cast<const uint16_t*>(a[j]) + k)
                           : hn::LoadU(d, static_cast<const float*>(a[j]) + k));
  }
};

// math::dsv4_pool_fixed<8> per lane.
HWY_INLINE VF PoolFixed8(DF d, const float* const* z, const Ape& ape, const float* const* c, int32_t k) {
  const VF ninf = hn::Set(d, -INFINITY);
  VF zs[8], cs[8], es[8];
  VF mx = ninf;
  for (int j = 0; j < 8; ++j) {
    zs[j] = ape.Logit(d, z, j, k);
    cs[j] = hn::LoadU(d, c[j] + k);
    mx = hn::IfThenElse(hn::Gt(zs[j], mx), zs[j], mx);  // z > mx ? z : mx (a NaN logit is skipped)
  }
  VF den = hn::Zero(d);
  for (int j = 0; j < 8; ++j) {
    es[j] = hn::IfThenElseZero(hn::Ne(zs[j], ninf), hn::Exp(d, hn::Sub(zs[j], mx)));
    den = hn::Add(den, es[j]);
  }
  VF acc = hn::Zero(d);
  for (int j = 0; j < 8; ++j) {
    const VF t = hn::Add(acc, hn::Mul(cs[j], hn::Div(es[j], den)));
    acc = hn::IfThenElse(hn::Ne(zs[j], ninf), t, acc);
  }
  return hn::IfThenElseZero(hn::Ne(mx, ninf), acc);
}

// math::Dsv4OnlineFold per lane over n candidates.
HWY_INLINE VF PoolOnline(DF d, const float* const* z, const Ape& ape, const float* const* c, int32_t n, int32_t k) {
  const VF ninf = hn::Set(d, -INFINITY), one = hn::Set(d, 1.0f);
  VF mx = ninf, den = hn::Zero(d), acc = hn::Zero(d);
  for (int32_t j = 0; j < n; ++j) {
    const VF zv = ape.Logit(d, z, j, k), cv = hn::LoadU(d, c[j] + k);
    const auto up = hn::Gt(zv, mx);
    const VF e = hn::Exp(d, hn::Neg(hn::Abs(hn::Sub(zv, mx))));  // exp(-inf) and exp(NaN) give 0
    const VF den_up = hn::Add(hn::Mul(den, e), one), acc_up = hn::Add(hn::Mul(acc, e), cv);
    const VF den_in = hn::Add(den, e), acc_in = hn::Add(acc, hn::Mul(cv, e));
    const auto live = hn::Ne(zv, ninf);
    den = hn::IfThenElse(live, hn::IfThenElse(up, den_up, den_in), den);
    acc = hn::IfThenElse(live, hn::IfThenElse(up, acc_up, acc_in), acc);
    mx = hn::IfThenElse(up, zv, mx);
  }
  return hn::IfThenElseZero(hn::Ne(mx, ninf), hn::Div(acc, den));
}

// Dots of q with rows r[0..4) over dim floats (dim a multiple of 2 vectors or of 1).
HWY_INLINE void Dot4(const float* q, const float* r0, const float* r1, const float* r2, const float* r3, int32_t dim,
                     float* out) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int32_t i = 0;
  for (; i + 2 * N <= dim; i += 2 * N) {
    const VF qa = hn::LoadU(d, q + i), qb = hn::LoadU(d, q + i + N);
    a0 = hn::MulAdd(qa, hn::LoadU(d, r0 + i), a0);
    a1 = hn::MulAdd(qa, hn::LoadU(d, r1 + i), a1);
    a2 = hn::MulAdd(qa, hn::LoadU(d, r2 + i), a2);
    a3 = hn::MulAdd(qa, hn::LoadU(d, r3 + i), a3);
    b0 = hn::MulAdd(qb, hn::LoadU(d, r0 + i + N), b0);
    b1 = hn::MulAdd(qb, hn::LoadU(d, r1 + i + N), b1);
    b2 = hn::MulAdd(qb, hn::LoadU(d, r2 + i + N), b2);
    b3 = hn::MulAdd(qb, hn::LoadU(d, r3 + i + N), b3);
  }
  for (; i + N <= dim; i += N) {
    const VF qa = hn::LoadU(d, q + i);
    a0 = hn::MulAdd(qa, hn::LoadU(d, r0 + i), a0);
    a1 = hn::MulAdd(qa, hn::LoadU(d, r1 + i), a1);
    a2 = hn::MulAdd(qa, hn::LoadU(d, r2 + i), a2);
    a3 = hn::MulAdd(qa, hn::LoadU(d, r3 + i), a3);
  }
  SumOfLanes4(d, hn::Add(a0, b0), hn::Add(a1, b1), hn::Add(a2, b2), hn::Add(a3, b3), out);
  // The last dim % N dims one at a time: a vector load there would read the next head's query
  // and the next row (or past the last one).
  for (; i < dim; ++i) {
    out[0] += q[i] * r0[i];
    out[1] += q[i] * r1[i];
    out[2] += q[i] * r2[i];
    out[3] += q[i] * r3[i];
  }
}

}  // namespace

void Dsv4PoolRows(const float* const* z, const void* const* ape, bool ape_f16, const float* const* c, int32_t n_cand,
                  int32_t n_ch, float* out) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  auto pool = [&](const float* const* zr, const Ape& a, const float* const* cr, int32_t k) {
    return n_cand == 8 ? PoolFixed8(d, zr, a, cr, k) : PoolOnline(d, zr, a, cr, n_cand, k);
  };
  const Ape with{ape, ape_f16};
  int32_t k = 0;
  for (; k + N <= n_ch; k += N) hn::StoreU(pool(z, with, c, k), d, out + k);
  if (k == n_ch) return;
  // The last channels through the same lane arithmetic: copied into rows of one vector,
  // the lanes past n_ch holding no candidate (computed and dropped).
  HWY_ALIGN float zt[kDsv4PoolMaxCandidates][hn::MaxLanes(DF())], ct[kDsv4PoolMaxCandidates][hn::MaxLanes(DF())];
  const float* zp[kDsv4PoolMaxCandidates];
  const float* cp[kDsv4PoolMaxCandidates];
  for (int32_t j = 0; j < n_cand; ++j) {
    for (int32_t i = 0; i < N; ++i) {
      float a = 0.0f;
      if (ape != nullptr && ape[j] != nullptr && k + i < n_ch)
        a = ape_f16 ? math::f16_bits_to_f32(static_cast<const uint16_t*>(ape[j])[k + i])
                    : static_cast<const float*>(ape[j])[k + i];
      zt[j][i] = k + i < n_ch ? (ape != nullptr && ape[j] != nullptr ? z[j][k + i] + a : z[j][k + i]) : -INFINITY;
      ct[j][i] = k + i < n_ch ? c[j][k + i] : 0.0f;
    }
    zp[j] = zt[j], cp[j] = ct[j];
  }
  HWY_ALIGN float lanes[hn::MaxLanes(DF())];
  hn::Store(pool(zp, Ape{nullptr, false}, cp, 0), d, lanes);
  for (int32_t i = 0; k + i < n_ch; ++i) out[k + i] = lanes[i];
}

void Dsv4IndexerScores(const float* q, const float* w, int32_t n_heads, int32_t dim, const float* keys, int64_t n_keys,
                       float* scores) {
  constexpr int32_t kMaxDim = 1024;
  HWY_ALIGN float tail[4 * kMaxDim];
  for (int64_t s0 = 0; s0 < n_keys; s0 += 4) {
    const float* rows = keys + s0 * dim;
    const int64_t n = std::min<int64_t>(4, n_keys - s0);
    if (n < 4) {  // the last rows through the same four-row path (zero rows beside them)
      std::fill(tail, tail + 4 * dim, 0.0f);
      std::memcpy(tail, rows, sizeof(float) * static_cast<size_t>(n * dim));
      rows = tail;
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dots[4];
    for (int32_t h = 0; h < n_heads; ++h) {
      Dot4(q + int64_t{h} * dim, rows, rows + dim, rows + 2 * dim, rows + 3 * dim, dim, dots);
      for (int i = 0; i < 4; ++i) acc[i] += w[h] * (dots[i] > 0.0f ? dots[i] : 0.0f);
    }
    for (int64_t i = 0; i < n; ++i) scores[s0 + i] = acc[i];
  }
}

void Dsv4RowDecode(const uint8_t* row, float* dst) {
  using L = math::Dsv4RowLayout;
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));  // divides 64: one scale per vector
  // Without NaN codes, e4m3 / 256 times (256 x scale) in one product: the same bits as
  // (e4m3 / 256 x 256) x scale, both single roundings of one exact product, while 256 x scale
  // is finite (UE8M0 codes below 0xf8; a NaN scale gives its NaN either way).
  const bool nan_codes = E4m3RowHasNan(row + L::kNopeOffset, L::kNope);
  for (int32_t b = 0; b < L::kBlocks; ++b) {
    const float scale = math::ue8m0_decode(row[L::kScaleOffset + b]), scale256 = scale * 256.0f;
    const int32_t i1 = (b + 1) * math::kFp8Block;
    if (!nan_codes && !std::isinf(scale256)) {
      const VF f = hn::Set(d, scale256);
      for (int32_t i = b * math::kFp8Block; i < i1; i += N)
        hn::StoreU(hn::Mul(LoadE4m3Over256Finite(d, row + L::kNopeOffset, i), f), d, dst + i);
    } else {
      const VF f = hn::Set(d, scale);
      for (int32_t i = b * math::kFp8Block; i < i1; i += N)
        hn::StoreU(hn::Mul(LoadKv<math::KvElem::E4M3>(d, row + L::kNopeOffset, i), f), d, dst + i);
    }
  }
  for (int32_t i = 0; i < L::kRope; i += N)
    hn::StoreU(LoadKv<math::KvElem::BF16>(d, row + L::kRopeOffset, i), d, dst + L::kNope + i);
}

void Dsv4F16Decode(const uint16_t* src, int32_t n, float* dst) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  int32_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadF16(d, src + i), d, dst + i);
  for (; i < n; ++i) dst[i] = math::f16_bits_to_f32(src[i]);
}

float Dsv4SumSquares(const float* x, int32_t n) {
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  VF a = hn::Zero(d), b = hn::Zero(d);
  int32_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const VF u = hn::LoadU(d, x + i), v = hn::LoadU(d, x + i + N);
    a = hn::MulAdd(u, u, a);
    b = hn::MulAdd(v, v, b);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(a, b)));
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

void Dsv4RopeRow(float* row, const math::RopeTable& t, float position) {
  const int32_t n_pairs = t.layout.n_pairs();
  constexpr int32_t kPadded = math::RopeTable::kMaxPairs + 16;
  HWY_ALIGN float freq[kPadded] = {}, cs[kPadded], sn[kPadded];
  std::memcpy(freq, t.freq, sizeof(float) * static_cast<size_t>(n_pairs));
  RopeCosSinRow(freq, n_pairs, position, 1.0f, cs, sn);
  RotatePairs(t.layout, row, row, cs, sn);
}

void Dsv4FinalizeRow(float* row, int32_t head_dim, int32_t n_nope, bool quant, void* raw, bool raw_f16) {
  const DF d;
  if (quant)  // math::dsv4_fp8_round_trip_nope: fp8_block_unpack(fp8_block_pack(x)), n_nope a multiple of 64
    for (int32_t off = 0; off < n_nope; off += math::kFp8Block) {
      HWY_ALIGN uint8_t codes[math::kFp8Block];
      uint8_t scale_byte;
      EncodeFp8Group(row + off, codes, &scale_byte);
      DecodeFp8Group(d, codes, scale_byte, row + off);
    }
  if (raw == nullptr) return;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // math::f32_to_f16_bits by the hardware conversion (round to nearest even, overflow to inf,
  // subnormals exact); NaN lanes first made the +quiet NaN the scalar code returns (0x7e00).
  const hn::Rebind<hwy::float16_t, DF> dh;
  const VF qnan = hn::BitCast(d, hn::Set(hn::RebindToUnsigned<DF>(), 0x7fc00000u));
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  int32_t x = 0;
  for (; x + N <= head_dim; x += N) {
    VF v = hn::LoadU(d, row + x);
    v = hn::IfThenElse(hn::IsNaN(v), qnan, v);
    const auto h = hn::DemoteTo(dh, v);
    if (raw_f16) hn::StoreU(h, dh, reinterpret_cast<hwy::float16_t*>(static_cast<uint16_t*>(raw) + x));
    else hn::StoreU(quant ? hn::PromoteTo(d, h) : hn::LoadU(d, row + x), d, static_cast<float*>(raw) + x);
  }
#else
  int32_t x = 0;
#endif
  for (; x < head_dim; ++x) {
    if (raw_f16) static_cast<uint16_t*>(raw)[x] = math::f32_to_f16_bits(row[x]);
    else static_cast<float*>(raw)[x] = quant ? math::f16_bits_to_f32(math::f32_to_f16_bits(row[x])) : row[x];
  }
}

void Dsv4RowPack(const float* src, uint8_t* row) {
  using L = math::Dsv4RowLayout;
  for (int32_t b = 0; b < L::kBlocks; ++b)
    EncodeFp8Group(src + b * math::kFp8Block, row + L::kNopeOffset + b * math::kFp8Block, row + L::kScaleOffset + b);
  const DF d;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d));
  HWY_ALIGN bf16 tail[L::kRope];
  for (int32_t i = 0; i < L::kRope; i += N) StoreFromF32(d, hn::LoadU(d, src + L::kNope + i), tail + i);
  std::memcpy(row + L::kRopeOffset, tail, sizeof(tail));  // little endian, as the scalar byte stores
  row[L::kPadOffset] = 0;
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(Dsv4PoolRows);
HWY_EXPORT(Dsv4IndexerScores);
HWY_EXPORT(Dsv4RowDecode);
HWY_EXPORT(Dsv4F16Decode);
HWY_EXPORT(Dsv4SumSquares);
HWY_EXPORT(Dsv4RopeRow);
HWY_EXPORT(Dsv4RowPack);
HWY_EXPORT(Dsv4FinalizeRow);
void dsv4_finalize_row_simd(float* row, int32_t head_dim, int32_t n_nope, bool quant, void* raw, bool raw_f16) {
  HWY_DYNAMIC_DISPATCH(Dsv4FinalizeRow)(row, head_dim, n_nope, quant, raw, raw_f16);
}
float dsv4_sum_squares_simd(const float* x, int32_t n) { return HWY_DYNAMIC_DISPATCH(Dsv4SumSquares)(x, n); }
void dsv4_rope_row_simd(float* row, const math::RopeTable& t, float position) {
  HWY_DYNAMIC_DISPATCH(Dsv4RopeRow)(row, t, position);
}
void dsv4_row_pack_simd(const float* src, uint8_t* row) { HWY_DYNAMIC_DISPATCH(Dsv4RowPack)(src, row); }
void dsv4_pool_rows_simd(const float* const* z, const void* const* ape, bool ape_f16, const float* const* c,
                         int32_t n_cand, int32_t n_ch, float* out) {
  HWY_DYNAMIC_DISPATCH(Dsv4PoolRows)(z, ape, ape_f16, c, n_cand, n_ch, out);
}
void dsv4_indexer_scores_simd(const float* q, const float* w, int32_t n_heads, int32_t dim, const float* keys,
                              int64_t n_keys, float* scores) {
  HWY_DYNAMIC_DISPATCH(Dsv4IndexerScores)(q, w, n_heads, dim, keys, n_keys, scores);
}
void dsv4_row_decode_simd(const uint8_t* row, float* dst) { HWY_DYNAMIC_DISPATCH(Dsv4RowDecode)(row, dst); }
void dsv4_f16_decode_simd(const uint16_t* src, int32_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(Dsv4F16Decode)(src, n, dst);
}
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
