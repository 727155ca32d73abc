// The DeepSeek-V4 CPU ops' SIMD path on every compiled target this machine
// supports against the scalar path (simd_pin), through the public ops:
//   - compressor prefill and emission: float rows within 2e-5 (1 + |scalar|) (the
//     pool's exp is Highway's, 1 ulp, and the lanes sum candidates in the scalar
//     order: the same bound the CUDA backend meets against the CPU); the state
//     bit-identical; and under every target prefill == token by token, bit for bit;
//   - indexer scores: within the worst-case summation bound 2 (D + H + 1) u M, M the
//     sum over heads of |w_h| sum_d |q_hd k_d| (the dots are summed in another order);
//     picks exactly the ordering of the target's own scores (ties to the lower row),
//     and rows that are equal score equal bits whatever their place in a vector group;
//   - sparse attention: max relative error 1e-5 against the scalar path and the
//     float64 reference, window in f32 and f16, one and several splits;
//   - the row kernels with the shared math's bits: the 584-byte row's packing and
//     decoding, the compressor's rotation (special values included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "attention_dsv4_util.hpp"
#include "attention_test_util.hpp"
#include "cpu/dsv4_simd.hpp"
#include "cpu/simd_targets.hpp"
#include "dsv4_test_util.hpp"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/ops/dsv4.hpp"

namespace {

using namespace kvcore;
using namespace kvcore::testing;
namespace cpu = kvcore::ops::cpu;

// ---- compressor ---------------------------------------------------------------------------

struct CompressorRun {
  std::vector<float> rows, kv, score;
};

// One compressor over n tokens: prefill in chunks of `chunk` (0: token by token, emitting
// at each window's end), quantization off, f32 rows.
CompressorRun run_compressor(Dsv4Compressor cc, int n, int chunk, uint64_t seed) {
  const int W = cc.width(), hd = cc.head_dim, R = cc.state_rows(), cap = n / cc.ratio + 1;
  std::vector<float> cs = randn(static_cast<size_t>(n) * W, seed, 1.3f), zs = randn(cs.size(), seed + 1, 2.0f);
  std::vector<float> ape = randn(static_cast<size_t>(cc.ratio) * W, seed + 2), norm = randn(hd, seed + 3, 0.25f);
  for (float& v : norm) v += 1.0f;
  const math::RopeTable rope = compressed_table(hd, cc.n_rot);
  CompressorRun r;
  r.rows.assign(static_cast<size_t>(cap) * hd, 0.0f);
  r.kv.assign(static_cast<size_t>(R) * W, 0.0f);
  r.score.assign(r.kv.size(), 0.0f);
  const TensorRef kv = view(r.kv, {R, W}), sc = view(r.score, {R, W}), rows = view(r.rows, {cap, hd});
  const Dsv4CompressorWeights w{view(ape, {cc.ratio, W}), view(norm, {hd}), rope};
  dsv4_compressor_reset(kv, sc, cc);
  for (int p = 0; p < n;) {
    const int len = chunk == 0 ? 1 : std::min(chunk, n - p);
    std::vector<float> c(cs.begin() + int64_t{p} * W, cs.begin() + int64_t{p + len} * W);
    std::vector<float> z(zs.begin() + int64_t{p} * W, zs.begin() + int64_t{p + len} * W);
    if (chunk == 0) {
      dsv4_compressor_store_one(view(c, {W}), view(z, {W}), w.ape, kv, sc, p, cc);
      if ((p + 1) % cc.ratio == 0) {
        dsv4_compressor_emit(kv, sc, cc, w, p / cc.ratio, Dsv4Quant::Off, rows);
        if (cc.overlap) dsv4_compressor_shift(kv, sc, cc);
      }
    } else {
      dsv4_compress_prefill(view(c, {len, W}), view(z, {len, W}), kv, sc, p, cc, w, Dsv4Quant::Off, rows);
    }
    p += len;
  }
  return r;
}

TEST(CpuSimdDsv4, CompressorPoolOnEveryTargetMatchesTheScalarPath) {
  int cases = 0;
  // The model's shapes, and head dims that leave part of a vector (48, 40).
  for (Dsv4Compressor cc : {Dsv4Compressor::csa(512, 64, 4), Dsv4Compressor::hca(512, 64, 128),
                            Dsv4Compressor::indexer(128, 64, 4), Dsv4Compressor::csa(48, 16, 3),
                            Dsv4Compressor::hca(40, 8, 8)}) {
    const int n = 3 * cc.ratio + (cc.ratio > 8 ? 5 : 2 * cc.ratio + 1);
    CompressorRun want;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      want = run_compressor(cc, n, n, 90);
    }
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      SCOPED_TRACE(::testing::Message() << t.name << " head_dim " << cc.head_dim << " ratio " << cc.ratio);
      const CompressorRun prefill = run_compressor(cc, n, n, 90);
      double worst = 0;
      for (size_t i = 0; i < want.rows.size(); ++i)
        worst = std::max(worst, std::fabs(double(prefill.rows[i]) - want.rows[i]) / (1.0 + std::fabs(want.rows[i])));
      EXPECT_LE(worst, 2e-5);
      EXPECT_EQ(std::memcmp(prefill.kv.data(), want.kv.data(), want.kv.size() * 4), 0) << "state kv";
      EXPECT_EQ(std::memcmp(prefill.score.data(), want.score.data(), want.score.size() * 4), 0) << "state score";
      for (int chunk : {0, cc.ratio + 1}) {  // token by token, and chunks that straddle windows
        const CompressorRun other = run_compressor(cc, n, chunk, 90);
        EXPECT_EQ(other.rows, prefill.rows) << "chunk " << chunk;
        EXPECT_EQ(other.kv, prefill.kv) << "chunk " << chunk;
      }
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
}

// ---- indexer ------------------------------------------------------------------------------

struct IndexerRun {
  std::vector<float> scores;
  std::vector<int32_t> picks;
};

TEST(CpuSimdDsv4, IndexerOnEveryTargetMatchesTheScalarPath) {
  const int H = 64, D = 128, nq = 3, cap = 1003, n_rows = 998, k = 64, ratio = 4;
  const int64_t first = 3990;  // visible rows 997, 998 (capped by n_rows)
  std::vector<float> q = randn(static_cast<size_t>(nq) * H * D, 81), w = randn(static_cast<size_t>(nq) * H, 82);
  std::vector<float> rows = randn(static_cast<size_t>(cap) * D, 83);
  for (int s = 5; s < cap; s += 7)  // rows equal to row 1 in every place of a group of four: equal scores
    std::copy(rows.begin() + D, rows.begin() + 2 * D, rows.begin() + static_cast<size_t>(s) * D);
  const int rb = math::dsv4_fp4_row_bytes(D);
  std::vector<uint8_t> packed(static_cast<size_t>(cap) * rb);
  for (int s = 0; s < cap; ++s) math::dsv4_pack_fp4_row(&rows[static_cast<size_t>(s) * D], D, &packed[static_cast<size_t>(s) * rb]);
  int cases = 0;
  for (bool is_packed : {false, true})
    for (Dsv4Quant quant : {Dsv4Quant::Off, Dsv4Quant::On}) {
      if (is_packed && quant == Dsv4Quant::Off) continue;  // packed rows are quantized rows
      SCOPED_TRACE(::testing::Message() << "packed " << is_packed << " quant " << int(quant));
      auto run = [&] {
        IndexerRun r{std::vector<float>(static_cast<size_t>(nq) * cap, 7.0f), std::vector<int32_t>(static_cast<size_t>(nq) * k, 9)};
        const TensorRef rv = is_packed ? host_view(packed, DType::U8, {cap, rb}) : view(rows, {cap, D});
        dsv4_indexer_topk(view(q, {nq, H, D}), view(w, {nq, H}), rv, n_rows, first, ratio, quant,
                          view(r.scores, {nq, cap}), host_view(r.picks, DType::I32, {nq, k}));
        return r;
      };
      IndexerRun want;
      {
        cpu::SimdPin pin(cpu::kSimdScalar);
        want = run();
      }
      // The bound's M per (query, row) from the values the scores are made of.
      std::vector<float> keys(static_cast<size_t>(cap) * D);
      for (int s = 0; s < cap; ++s)
        for (int d = 0; d < D; ++d)
          keys[static_cast<size_t>(s) * D + d] = is_packed ? math::dsv4_unpack_fp4_value(&packed[static_cast<size_t>(s) * rb], D, d)
                                                           : rows[static_cast<size_t>(s) * D + d];
      std::vector<float> qs = q;
      if (quant == Dsv4Quant::On)
        for (int i = 0; i < nq * H; ++i) {
          math::dsv4_hadamard(&qs[static_cast<size_t>(i) * D], D);
          math::dsv4_fp4_round_trip(&qs[static_cast<size_t>(i) * D], D);
        }
      for (const cpu::SimdTarget& t : cpu::simd_targets()) {
        cpu::SimdPin pin(t.bits);
        SCOPED_TRACE(t.name);
        const IndexerRun got = run();
        for (int i = 0; i < nq; ++i) {
          const int64_t vis = std::min<int64_t>(n_rows, (first + i + 1) / ratio);
          const float* gs = &got.scores[static_cast<size_t>(i) * cap];
          const float* ws = &want.scores[static_cast<size_t>(i) * cap];
          for (int s = 0; s < cap; ++s) {
            if (s >= vis) {
              ASSERT_EQ(gs[s], -INFINITY) << "row " << s;
              continue;
            }
            double m = 0;
            for (int h = 0; h < H; ++h) {
              double a = 0;
              for (int d = 0; d < D; ++d)
                a += std::fabs(double(qs[(static_cast<size_t>(i) * H + h) * D + d]) * keys[static_cast<size_t>(s) * D + d]);
              m += std::fabs(w[static_cast<size_t>(i) * H + h]) * a;
            }
            ASSERT_LE(std::fabs(double(gs[s]) - ws[s]), 2.0 * (D + H + 1) * 0x1p-24 * m) << "query " << i << " row " << s;
            if (s % 7 == 5) {
              ASSERT_EQ(gs[s], gs[1]) << "query " << i << " row " << s << " equals row 1";
            }
          }
          std::vector<int> order(static_cast<size_t>(vis));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gs[a] > gs[b]; });
          for (int j = 0; j < k; ++j) ASSERT_EQ(got.picks[static_cast<size_t>(i) * k + j], order[j]) << "query " << i << " pick " << j;
        }
        ++cases;
      }
    }
  EXPECT_GT(cases, 0);
}

// ---- sparse attention ---------------------------------------------------------------------

TEST(CpuSimdDsv4, SparseAttentionOnEveryTargetMatchesTheScalarPath) {
  struct Shape {
    bool f16;
    int rows, heads;
  };
  // Heads 7 and 40: padded to the lanes, partial blocks of heads; 64: four full vectors of
  // 16 heads; one row: the heads split into groups across the threads.
  const Shape shapes[] = {{false, 3, 16}, {true, 3, 7}, {false, 1, 64}, {true, 2, 40}};
  int cases = 0;
  for (const Shape& sh : shapes) {
    dsv4_test::Case c;
    c.rows = sh.rows;
    c.heads = sh.heads;
    c.n_window = 37;  // window + picks = 98 keys: partial tiles and partial blocks of keys
    c.k = 61;
    c.f16_window = sh.f16;
    c.seed = static_cast<uint64_t>(11 + sh.heads);
    dsv4_test::fill(c);
    const std::vector<double> ref = dsv4_test::reference(c);
    for (int splits : {1, 3}) {
      std::vector<float> want;
      {
        cpu::SimdPin pin(cpu::kSimdScalar);
        want = dsv4_test::run(c, Device::cpu(), splits);
      }
      for (const cpu::SimdTarget& t : cpu::simd_targets()) {
        cpu::SimdPin pin(t.bits);
        const std::vector<float> got = dsv4_test::run(c, Device::cpu(), splits);
        SCOPED_TRACE(::testing::Message() << t.name << " f16 window " << sh.f16 << " heads " << sh.heads << " rows "
                                          << sh.rows << " splits " << splits);
        EXPECT_LE(attn_test::max_rel_err(got, want), 1e-5);
        EXPECT_LE(attn_test::max_rel_err(got, ref), 1e-5);
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 0);
}

// ---- row kernels: the shared math's bits ----------------------------------------------------

float row_special(std::mt19937_64& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  switch (rng() % 24) {
    case 0: return 3.0e-39f * n(rng);                              // f32 subnormal
    case 1: return 1.0e6f * n(rng);                                // scales far from 1
    case 2: return 1.0f + 0x1p-8f;                                 // a bf16 tie
    case 3: return std::numeric_limits<float>::infinity();        // skipped by the amax
    case 4: return 0.0f;
    default: return n(rng) * (rng() % 3 == 0 ? 1e-3f : 1.0f);
  }
}

TEST(CpuSimdDsv4, RowKernelsOnEveryTargetGiveTheSharedMathsBits) {
  using L = math::Dsv4RowLayout;
  std::mt19937_64 rng(7);
  const math::RopeTable rope = compressed_table(L::kHeadDim, L::kRope);
  int cases = 0;
  for (int trial = 0; trial < 64; ++trial) {
    std::vector<float> row(L::kHeadDim);
    for (float& v : row) v = row_special(rng);
    std::vector<uint8_t> want_bytes(L::kBytes), got_bytes(L::kBytes, 0xab);
    math::dsv4_row_pack(row.data(), want_bytes.data());
    std::vector<float> want_rot = row;
    const float pos = trial == 1 ? 1e9f : static_cast<float>(rng() % 1000000);  // 1e9: the scalar fmod branch
    math::rope_rotate_row(want_rot.data(), rope, pos, 1.0f);
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      SCOPED_TRACE(::testing::Message() << t.name << " trial " << trial);
      cpu::dsv4_row_pack_simd(row.data(), got_bytes.data());
      ASSERT_EQ(got_bytes, want_bytes);
      std::vector<float> got(L::kHeadDim);
      cpu::dsv4_row_decode_simd(want_bytes.data(), got.data());
      for (int d = 0; d < L::kHeadDim; ++d) {
        const float w = math::dsv4_row_value(want_bytes.data(), d);
        ASSERT_TRUE(std::memcmp(&got[d], &w, 4) == 0 || (got[d] != got[d] && w != w)) << "decode dim " << d;
      }
      std::vector<float> rot = row;
      cpu::dsv4_rope_row_simd(rot.data(), rope, pos);
      for (int d = 0; d < L::kHeadDim; ++d)
        ASSERT_TRUE(std::memcmp(&rot[d], &want_rot[d], 4) == 0 || (rot[d] != rot[d] && want_rot[d] != want_rot[d]))
            << "rotation dim " << d << ": " << rot[d] << " vs " << want_rot[d];
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
}

// Any bytes, not only the packer's: every UE8M0 scale code (the largest ones make 256 x
// scale overflow, 0xff is NaN) and rows with and without e4m3 NaN codes.
TEST(CpuSimdDsv4, RowDecodeOnEveryTargetGivesTheSharedMathsBitsForAnyBytes) {
  using L = math::Dsv4RowLayout;
  std::mt19937_64 rng(19);
  int cases = 0;
  for (int trial = 0; trial < 128; ++trial) {
    std::vector<uint8_t> row(L::kBytes);
    for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
    for (int i = 0; i < L::kNope; ++i)  // the second 64 trials: no NaN code (|code| = 0x7f)
      if (trial >= 64 && (row[L::kNopeOffset + i] & 0x7f) == 0x7f) row[L::kNopeOffset + i] ^= 1;
    for (int b = 0; b < L::kBlocks; ++b)  // every scale code in each half
      row[L::kScaleOffset + b] = static_cast<uint8_t>((trial % 64) * 4 + b);
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      std::vector<float> got(L::kHeadDim);
      cpu::dsv4_row_decode_simd(row.data(), got.data());
      for (int d = 0; d < L::kHeadDim; ++d) {
        const float w = math::dsv4_row_value(row.data(), d);
        ASSERT_TRUE(std::memcmp(&got[d], &w, 4) == 0 || (got[d] != got[d] && w != w))
            << t.name << " trial " << trial << " dim " << d << ": " << got[d] << " vs " << w;
      }
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
}

// The indexer's packed FP4 rows: every code byte and every scale code, bit for bit.
TEST(CpuSimdDsv4, Fp4RowDecodeOnEveryTargetGivesTheSharedMathsBits) {
  const int D = 128, rb = math::dsv4_fp4_row_bytes(D), n = 64, stride = rb + 3;  // rows not aligned
  std::vector<uint8_t> rows(static_cast<size_t>(n) * stride);
  for (int r = 0; r < n; ++r) {
    uint8_t* row = &rows[static_cast<size_t>(r) * stride];
    for (int b = 0; b < D / 2; ++b) row[b] = static_cast<uint8_t>(r * 4 + b);  // every byte over the rows
    for (int b = 0; b < D / math::kFp4Block; ++b) row[D / 2 + b] = static_cast<uint8_t>(r * 4 + b);  // every scale
  }
  int cases = 0;
  for (const cpu::SimdTarget& t : cpu::simd_targets()) {
    cpu::SimdPin pin(t.bits);
    std::vector<float> got(static_cast<size_t>(n) * D);
    cpu::dsv4_fp4_rows_decode_simd(rows.data(), stride, n, D, got.data());
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < D; ++d) {
        const float w = math::dsv4_unpack_fp4_value(&rows[static_cast<size_t>(r) * stride], D, d);
        const float g = got[static_cast<size_t>(r) * D + d];
        ASSERT_TRUE(std::memcmp(&g, &w, 4) == 0 || (g != g && w != w)) << t.name << " row " << r << " dim " << d;
      }
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

// The indexer's query preparation (Hadamard, then the FP4 round trip) on transposed queries,
// bit for bit with the shared math, special values included: NaN, infinities, huge values
// (the scale's top), tiny ones (the amax floor), signed zeros and the encoder's ties.
TEST(CpuSimdDsv4, IndexerQueryPrepOnEveryTargetGivesTheSharedMathsBits) {
  std::mt19937_64 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto special = [&]() -> float {
    switch (rng() % 16) {
      case 0: return NAN;
      case 1: return (rng() % 2 ? 1 : -1) * INFINITY;
      case 2: return 3e38f * nd(rng);
      case 3: return 1e-6f * nd(rng);
      case 4: return (rng() % 2) ? 0.0f : -0.0f;
      case 5: return static_cast<float>(static_cast<int>(rng() % 25) - 12) * 0.25f;  // grid points and ties
      default: return nd(rng);
    }
  };
  int cases = 0;
  for (int dim : {64, 128, 256, 512})
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      const int H = 37, hp = (H + cpu::dsv4_head_lanes() - 1) / cpu::dsv4_head_lanes() * cpu::dsv4_head_lanes();
      std::vector<float> rows(static_cast<size_t>(hp) * dim, 0.0f);
      for (int h = 0; h < H; ++h)
        for (int x = 0; x < dim; ++x) rows[static_cast<size_t>(h) * dim + x] = h % 4 == 3 ? special() : nd(rng);
      // Heads whose transform is exact (dims 64 and 256 scale by a power of two): a few
      // multiples of 1/4, so the scaled values land on the encoder's grid points and ties.
      for (int h = 1; h < H && (dim == 64 || dim == 256); h += 4) {
        float* row = &rows[static_cast<size_t>(h) * dim];
        std::fill(row, row + dim, 0.0f);
        for (int j = 0; j < 4; ++j) row[rng() % dim] = static_cast<float>(static_cast<int>(rng() % 17) - 8) * 0.25f;
      }
      std::vector<float> qt(rows.size());
      cpu::dsv4_transpose_heads_simd(rows.data(), dim, hp, dim, 1.0f, qt.data());
      cpu::dsv4_indexer_query_prep_simd(qt.data(), hp, dim);
      for (int h = 0; h < H; ++h) {
        std::vector<float> want(rows.begin() + static_cast<size_t>(h) * dim, rows.begin() + static_cast<size_t>(h + 1) * dim);
        math::dsv4_hadamard(want.data(), dim);
        math::dsv4_fp4_round_trip(want.data(), dim);
        for (int x = 0; x < dim; ++x) {
          const float g = qt[static_cast<size_t>(x) * hp + h];
          ASSERT_TRUE(std::memcmp(&g, &want[x], 4) == 0 || (g != g && want[x] != want[x]))
              << t.name << " dim " << dim << " head " << h << " x " << x << ": " << g << " vs " << want[x];
        }
      }
      ++cases;
    }
  EXPECT_GT(cases, 0);
}

// The finalizer's row (FP8 round trip of the nope part, the f16 or f32 raw copy) on every
// target, bit for bit with the shared math, specials included: NaNs of either sign, infinities,
// values past the f16 range and at its rounding edge, f16 subnormals.
TEST(CpuSimdDsv4, FinalizeRowOnEveryTargetGivesTheSharedMathsBits) {
  using L = math::Dsv4RowLayout;
  std::mt19937_64 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto special = [&]() -> float {
    switch (rng() % 12) {
      case 0: return (rng() % 2 ? 1.0f : -1.0f) * NAN;
      case 1: return (rng() % 2 ? 1.0f : -1.0f) * INFINITY;
      case 2: return 65504.0f + static_cast<float>(rng() % 48);  // f16 max and the overflow edge (65520)
      case 3: return 3e-6f * nd(rng);                             // f16 subnormals
      case 4: return 1e30f * nd(rng);
      default: return nd(rng);
    }
  };
  int cases = 0;
  for (int trial = 0; trial < 64; ++trial) {
    std::vector<float> row(L::kHeadDim);
    for (float& v : row) v = trial % 2 ? special() : nd(rng);
    for (bool quant : {false, true})
      for (bool f16 : {false, true}) {
        std::vector<float> want_row = row, want32(L::kHeadDim);
        std::vector<uint16_t> want16(L::kHeadDim);
        if (quant) math::dsv4_fp8_round_trip_nope(want_row.data(), L::kNope);
        for (int d = 0; d < L::kHeadDim; ++d) {
          want16[d] = math::f32_to_f16_bits(want_row[d]);
          want32[d] = quant ? math::f16_bits_to_f32(want16[d]) : want_row[d];
        }
        for (const cpu::SimdTarget& t : cpu::simd_targets()) {
          cpu::SimdPin pin(t.bits);
          std::vector<float> got_row = row, got32(L::kHeadDim);
          std::vector<uint16_t> got16(L::kHeadDim);
          cpu::dsv4_finalize_row_simd(got_row.data(), L::kHeadDim, L::kNope, quant,
                                      f16 ? static_cast<void*>(got16.data()) : static_cast<void*>(got32.data()), f16);
          for (int d = 0; d < L::kHeadDim; ++d) {
            SCOPED_TRACE(::testing::Message() << t.name << " trial " << trial << " quant " << quant << " f16 " << f16
                                              << " dim " << d << " value " << row[d]);
            ASSERT_TRUE(std::memcmp(&got_row[d], &want_row[d], 4) == 0 || (got_row[d] != got_row[d] && want_row[d] != want_row[d]));
            if (f16) ASSERT_EQ(got16[d], want16[d]);
            else ASSERT_TRUE(std::memcmp(&got32[d], &want32[d], 4) == 0 || (got32[d] != got32[d] && want32[d] != want32[d]));
          }
          ++cases;
        }
      }
  }
  EXPECT_GT(cases, 0);
}

}  // namespace
