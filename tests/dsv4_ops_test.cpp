// DeepSeek-V4 ops on the CPU: codecs against exact references, emission against a
// float64 reference, prefill against token-by-token decode (bit-exact), the
// indexer against a float64 reference, and bad inputs (Error, nothing written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "dsv4_test_util.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/ops/dsv4.hpp"

using namespace kvcore;
using namespace kvcore::testing;

namespace {

// ---- codecs ---------------------------------------------------------------------------

TEST(Dsv4Math, Fp8NopeRoundTripMatchesExactReference) {
  const std::vector<double> grid = e4m3_grid();
  for (int trial = 0; trial < 40; ++trial) {
    const int n_nope = trial % 3 == 0 ? 448 : 24 + 8 * trial;  // partial last blocks too
    std::vector<float> row = randn(n_nope + 8, 100 + trial, std::ldexp(1.0f, trial % 20 - 10));
    if (trial % 5 == 1) row[3] = 0.0f;
    if (trial % 7 == 2) std::fill(row.begin(), row.begin() + std::min(64, n_nope), 0.0f);  // all-zero block: amax floor
    std::vector<double> ref(row.begin(), row.end());
    for (int off = 0; off < n_nope; off += 64) block_round_trip_ref(ref, off, std::min(64, n_nope - off), 448.0, grid);
    std::vector<float> ours = row;
    math::dsv4_fp8_round_trip_nope(ours.data(), n_nope);
    for (int i = 0; i < n_nope + 8; ++i) {
      const double want = i < n_nope ? ref[i] : row[i];
      ASSERT_EQ(static_cast<double>(ours[i]), want) << "trial " << trial << " dim " << i << " in " << row[i];
    }
  }
}

TEST(Dsv4Math, Fp4CodecIsExactNearestEven) {
  const std::vector<double> grid = e2m1_grid();
  for (int c = 0; c < 16; ++c) {
    const float v = math::e2m1_decode(static_cast<uint8_t>(c));
    EXPECT_EQ(math::e2m1_decode(math::e2m1_encode(v)), v) << "code " << c;
  }
  // Every f32 step between the grid points, ties included.
  for (float x = -7.0f; x <= 7.0f; x += 0.0625f) {
    const double want = grid_round(std::clamp<double>(x, -6, 6), grid);
    EXPECT_EQ(static_cast<double>(math::e2m1_decode(math::e2m1_encode(x))), want) << x;
  }
  EXPECT_EQ(math::e2m1_decode(math::e2m1_encode(0.25f)), 0.0f);   // tie -> even code 0
  EXPECT_EQ(math::e2m1_decode(math::e2m1_encode(0.75f)), 1.0f);   // tie -> even code 2
  EXPECT_EQ(math::e2m1_decode(math::e2m1_encode(2.5f)), 2.0f);    // tie -> even code 4
  EXPECT_EQ(math::e2m1_decode(math::e2m1_encode(5.0f)), 4.0f);    // tie -> even code 6
  EXPECT_EQ(math::e2m1_decode(math::e2m1_encode(INFINITY)), 6.0f);
  EXPECT_EQ(math::e2m1_encode(NAN), 0x7);  // NaN -> +6, as CUDA's __nv_cvt_float_to_fp4 (shared fp4.hpp)
  // Block scales: 2^ceil(log2(amax / 6)).
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<float> x = randn(128, 300 + trial, std::ldexp(1.0f, trial - 15));
    std::vector<double> ref(x.begin(), x.end());
    for (int off = 0; off < 128; off += 32) block_round_trip_ref(ref, off, 32, 6.0, grid);
    math::dsv4_fp4_round_trip(x.data(), 128);
    for (int i = 0; i < 128; ++i) ASSERT_EQ(static_cast<double>(x[i]), ref[i]) << trial << " " << i;
  }
}

TEST(Dsv4Math, HadamardIsTheOrthonormalSylvesterMatrix) {
  for (int n : {32, 64, 128, 256}) {
    std::vector<float> x = randn(n, n);
    std::vector<double> ref(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) ref[i] += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * x[j] / std::sqrt(double(n));
    math::dsv4_hadamard(x.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(x[i], ref[i], 2e-6 * std::sqrt(double(n))) << n << " " << i;
  }
  for (int n = 32; n <= 1024; n *= 2)  // the runtime-size scale is n^-0.5 rounded to f32
    EXPECT_EQ(math::dsv4_hadamard_scale(n), static_cast<float>(1.0 / std::sqrt(double(n)))) << n;
}

TEST(Dsv4Math, PackedRowsDecodeToTheRoundTrip) {
  std::vector<float> row = randn(512, 7, 3.0f);
  std::vector<uint8_t> packed(math::Dsv4RowLayout::kBytes);
  math::dsv4_row_pack(row.data(), packed.data());
  std::vector<float> rt = row;
  math::dsv4_fp8_round_trip_nope(rt.data(), 448);
  for (int d = 0; d < 512; ++d) {
    const float want = d < 448 ? rt[d] : math::bf16_bits_to_f32(math::f32_to_bf16_bits(row[d]));
    ASSERT_EQ(math::dsv4_unpack_attention_value(packed.data(), d), want) << d;
  }
  EXPECT_EQ(packed[math::Dsv4RowLayout::kPadOffset], 0);
  std::vector<float> x = randn(128, 8);
  std::vector<uint8_t> p4(math::dsv4_fp4_row_bytes(128));
  ASSERT_EQ(p4.size(), 68u);
  math::dsv4_pack_fp4_row(x.data(), 128, p4.data());
  math::dsv4_fp4_round_trip(x.data(), 128);
  for (int d = 0; d < 128; ++d) ASSERT_EQ(math::dsv4_unpack_fp4_value(p4.data(), 128, d), x[d]) << d;
  // Non-finite inputs follow the shared codec: NaN -> +6 times the block scale, inf -> +-6 (finite amax sets the scale).
  std::vector<float> y = randn(128, 9);
  y[5] = NAN;
  y[40] = -INFINITY;
  math::dsv4_pack_fp4_row(y.data(), 128, p4.data());
  math::dsv4_fp4_round_trip(y.data(), 128);
  for (int d = 0; d < 128; ++d) ASSERT_EQ(math::dsv4_unpack_fp4_value(p4.data(), 128, d), y[d]) << d;
  EXPECT_GT(y[5], 0.0f);
  EXPECT_LT(y[40], 0.0f);
}

// ---- finalizer ----------------------------------------------------------------------------

// The pools' fast forms do the same float operations in the same order as their plain
// forms: the register pool (each exp once) equals the three-pass pool, the batched online
// pool equals the candidate-at-a-time online loop, bit for bit, -inf candidates included.
float online_pool_one_at_a_time(int n, const std::vector<float>& z, const std::vector<float>& c) {
  float mx = -INFINITY, den = 0.0f, acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (z[j] == -INFINITY) continue;
    if (z[j] > mx) {
      const float r = std::exp(mx - z[j]);
      den = den * r + 1.0f;
      acc = acc * r + c[j];
      mx = z[j];
    } else {
      const float e = std::exp(z[j] - mx);
      den += e;
      acc += c[j] * e;
    }
  }
  return mx == -INFINITY ? 0.0f : acc / den;
}

TEST(Dsv4Math, FastPoolsAreBitIdenticalToTheirPlainForms) {
  for (int trial = 0; trial < 200; ++trial) {
    const int n = trial < 150 ? 1 + trial % 40 : 128;
    std::vector<float> z = randn(static_cast<size_t>(n), 500 + trial, 3.0f), c = randn(static_cast<size_t>(n), 900 + trial);
    for (int j = 0; j < n; ++j)
      if ((j + trial) % 5 == 0) z[j] = -INFINITY;
    if (trial % 17 == 3) std::fill(z.begin(), z.end(), -INFINITY);
    auto at = [&](int j, float& zz, float& cc) {
      zz = z[j];
      cc = c[j];
    };
    const float online = math::dsv4_pool_online(n, at), ref = online_pool_one_at_a_time(n, z, c);
    EXPECT_EQ(std::memcmp(&online, &ref, 4), 0) << "n " << n << " trial " << trial << ": " << online << " vs " << ref;
    if (n >= 8) {
      const float fixed = math::dsv4_pool_fixed<8>(at), plain = math::dsv4_pool(8, at);
      EXPECT_EQ(std::memcmp(&fixed, &plain, 4), 0) << "trial " << trial << ": " << fixed << " vs " << plain;
    }
  }
}

TEST(Dsv4Ops, FinalizerMatchesTheSeed) {
  const int hd = 512, n_rot = 64, R = 5, n = 7;  // n > R: only the last R rows reach the ring
  for (bool f16_ring : {false, true}) {
    for (Dsv4Quant q : {Dsv4Quant::On, Dsv4Quant::Off}) {
      std::vector<float> kv = randn(n * hd, 11, 2.0f), orig = kv;
      std::vector<float> ring32(R * hd, -1.0f);
      std::vector<uint16_t> ring16(R * hd, 0xffff);
      TensorRef ring = f16_ring ? host_view(ring16, DType::F16, {R, hd}) : view(ring32, {R, hd});
      dsv4_kv_finalize(view(kv, {n, hd}), ring, 3, n_rot, q);
      for (int i = 0; i < n; ++i) {
        std::vector<float> want(orig.begin() + i * hd, orig.begin() + (i + 1) * hd);
        if (q == Dsv4Quant::On) math::dsv4_fp8_round_trip_nope(want.data(), hd - n_rot);
        for (int d = 0; d < hd; ++d) ASSERT_EQ(kv[i * hd + d], want[d]);
        if (i < n - R) continue;
        const int r = (3 + i) % R;
        for (int d = 0; d < hd; ++d) {
          const bool round = f16_ring || q == Dsv4Quant::On;
          const float w = round ? math::f16_bits_to_f32(math::f32_to_f16_bits(want[d])) : want[d];
          const float got = f16_ring ? math::f16_bits_to_f32(ring16[r * hd + d]) : ring32[r * hd + d];
          ASSERT_EQ(got, w) << "row " << i << " dim " << d;
        }
      }
    }
  }
}

// ---- store, shift, emission ---------------------------------------------------------------

struct Comp {
  Dsv4Compressor c;
  std::vector<float> ape, norm, kv, score;
  std::vector<uint16_t> ape16;
  math::RopeTable rope;
  Comp(Dsv4Compressor cc, uint64_t seed, bool f16_ape = false) : c(cc) {
    ape = randn(static_cast<size_t>(c.ratio) * c.width(), seed, 1.0f);
    if (f16_ape) {
      for (float& v : ape) v = math::f16_bits_to_f32(math::f32_to_f16_bits(v));
      for (float v : ape) ape16.push_back(math::f32_to_f16_bits(v));
    }
    norm = randn(c.head_dim, seed + 1, 0.25f);
    for (float& v : norm) v += 1.0f;
    kv.assign(static_cast<size_t>(c.state_rows()) * c.width(), 0.0f);
    score.assign(kv.size(), 0.0f);
    rope = compressed_table(c.head_dim, c.n_rot);
    dsv4_compressor_reset(skv(), ssc(), c);
  }
  TensorRef skv() { return view(kv, {c.state_rows(), c.width()}); }
  TensorRef ssc() { return view(score, {c.state_rows(), c.width()}); }
  TensorRef ape_t() {
    return ape16.empty() ? view(ape, {c.ratio, c.width()}) : host_view(ape16, DType::F16, {c.ratio, c.width()});
  }
  Dsv4CompressorWeights w() { return {ape_t(), view(norm, {c.head_dim}), rope}; }
};

TEST(Dsv4Ops, StoreOneAndShiftFollowTheSeed) {
  for (bool f16 : {false, true}) {
    Comp s(Dsv4Compressor::csa(64, 16, 4), 21, f16);
    std::vector<float> c = randn(s.c.width(), 22), z = randn(s.c.width(), 23);
    dsv4_compressor_store_one(view(c, {s.c.width()}), view(z, {s.c.width()}), s.ape_t(), s.skv(), s.ssc(), 6, s.c);
    const int row = 4 + 6 % 4;
    for (int k = 0; k < s.c.width(); ++k) {
      ASSERT_EQ(s.kv[row * s.c.width() + k], c[k]);
      ASSERT_EQ(s.score[row * s.c.width() + k], z[k] + s.ape[(6 % 4) * s.c.width() + k]);
    }
    const std::vector<float> before = s.kv;
    dsv4_compressor_shift(s.skv(), s.ssc(), s.c);
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < s.c.width(); ++k) ASSERT_EQ(s.kv[r * s.c.width() + k], before[(r + 4) * s.c.width() + k]);
  }
  Comp h(Dsv4Compressor::hca(32, 8, 8), 24);
  std::vector<float> c = randn(32, 25), z = randn(32, 26);
  dsv4_compressor_store_one(view(c, {32}), view(z, {32}), h.ape_t(), h.skv(), h.ssc(), 13, h.c);
  for (int k = 0; k < 32; ++k) ASSERT_EQ(h.kv[5 * 32 + k], c[k]);
}

// Emission of window w from a state filled by store_one, against the float64 reference.
void check_emission(Dsv4Compressor cc, int64_t window) {
  SCOPED_TRACE(cc.overlap ? "overlap" : "plain");
  Comp s(cc, 31);
  const int m = cc.ratio, W = cc.width(), hd = cc.head_dim;
  std::vector<float> cs = randn(static_cast<size_t>(2 * m) * W, 32, 1.5f), zs = randn(cs.size(), 33, 2.0f);
  const int64_t first = std::max<int64_t>(0, (window - 1) * m);
  for (int64_t p = first; p < (window + 1) * m; ++p) {
    const int64_t i = p - (window - 1) * m;
    const int64_t ii = i < 0 ? i + m : i;
    std::vector<float> c(cs.begin() + ii * W, cs.begin() + (ii + 1) * W), z(zs.begin() + ii * W, zs.begin() + (ii + 1) * W);
    dsv4_compressor_store_one(view(c, {W}), view(z, {W}), s.ape_t(), s.skv(), s.ssc(), p, cc);
    if ((p + 1) % m == 0 && p + 1 < (window + 1) * m && cc.overlap) dsv4_compressor_shift(s.skv(), s.ssc(), cc);
  }
  // Candidates in double straight from the state.
  const int nc = cc.state_rows();
  std::vector<double> z(nc * hd), c(nc * hd);
  for (int j = 0; j < nc; ++j)
    for (int k = 0; k < hd; ++k) {
      const int col = math::dsv4_candidate_col(j, k, m, hd, cc.overlap);
      z[j * hd + k] = s.score[j * W + col];
      c[j * hd + k] = s.kv[j * W + col];
    }
  const std::vector<double> ref = emit_ref(z, c, nc, hd, s.norm, s.rope, window * m, cc.eps);
  std::vector<float> rows(static_cast<size_t>(window + 2) * hd, 7.0f);
  dsv4_compressor_emit(s.skv(), s.ssc(), cc, s.w(), window, Dsv4Quant::Off, view(rows, {window + 2, hd}));
  double worst = 0;
  for (int k = 0; k < hd; ++k) worst = std::max(worst, std::fabs(rows[window * hd + k] - ref[k]));
  EXPECT_LT(worst, 2e-5) << "max abs error against float64";
  EXPECT_EQ(rows[(window + 1) * hd], 7.0f) << "only row `window` is written";
  // Quant On = the quantizer applied to exactly the values quant Off produced.
  std::vector<float> q_rows(rows.size(), 0.0f);
  dsv4_compressor_emit(s.skv(), s.ssc(), cc, s.w(), window, Dsv4Quant::On, view(q_rows, {window + 2, hd}));
  std::vector<float> want(rows.begin() + window * hd, rows.begin() + (window + 1) * hd);
  if (cc.kind == Dsv4RowKind::Attention) {
    math::dsv4_fp8_round_trip_nope(want.data(), hd - cc.n_rot);
  } else {
    math::dsv4_hadamard(want.data(), hd);
    math::dsv4_fp4_round_trip(want.data(), hd);
  }
  for (int k = 0; k < hd; ++k) ASSERT_EQ(q_rows[window * hd + k], want[k]) << k;
  if (cc.packed_row_bytes() > 0) {
    const int pb = cc.packed_row_bytes();
    std::vector<uint8_t> packed(static_cast<size_t>(window + 1) * pb);
    dsv4_compressor_emit(s.skv(), s.ssc(), cc, s.w(), window, Dsv4Quant::On,
                         host_view(packed, DType::U8, {window + 1, pb}));
    for (int k = 0; k < hd; ++k) {
      const uint8_t* pr = packed.data() + window * pb;
      const float got = cc.kind == Dsv4RowKind::Attention ? math::dsv4_unpack_attention_value(pr, k)
                                                          : math::dsv4_unpack_fp4_value(pr, hd, k);
      const float w = (cc.kind == Dsv4RowKind::Attention && k >= hd - cc.n_rot)
                          ? math::bf16_bits_to_f32(math::f32_to_bf16_bits(rows[window * hd + k]))
                          : want[k];
      ASSERT_EQ(got, w) << k;
    }
  }
}

TEST(Dsv4Ops, EmissionMatchesFloat64) {
  check_emission(Dsv4Compressor::csa(512, 64, 4), 0);  // window 0: lane A has no candidate
  check_emission(Dsv4Compressor::csa(512, 64, 4), 37);
  check_emission(Dsv4Compressor::hca(512, 64, 128), 3);
  check_emission(Dsv4Compressor::hca(48, 16, 8), 5);
  check_emission(Dsv4Compressor::indexer(128, 64, 4), 9);
  check_emission(Dsv4Compressor::indexer(64, 16, 4), 0);
}

// ---- prefill == token by token ------------------------------------------------------------

void check_prefill_equals_decode(Dsv4Compressor cc, Dsv4Quant quant, bool packed, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "ratio " << cc.ratio << " overlap " << cc.overlap << " quant " << int(quant)
                                  << " packed " << packed << " seed " << seed);
  const int n = 3 * cc.ratio * 2 + 3, W = cc.width(), hd = cc.head_dim;
  std::vector<float> cs = randn(static_cast<size_t>(n) * W, seed, 1.3f), zs = randn(cs.size(), seed + 1, 2.0f);
  const int cap = n / cc.ratio + 1;
  const int rb = packed ? cc.packed_row_bytes() : hd * 4;
  auto rows_view = [&](std::vector<uint8_t>& b) {
    return packed ? host_view(b, DType::U8, {cap, rb}) : TensorRef(b.data(), DType::F32, Device::cpu(), {cap, hd});
  };
  // Token by token.
  Comp a(cc, seed + 2, seed % 2 == 0);
  std::vector<uint8_t> rows_a(static_cast<size_t>(cap) * rb, 0);
  for (int p = 0; p < n; ++p) {
    std::vector<float> c(cs.begin() + p * W, cs.begin() + (p + 1) * W), z(zs.begin() + p * W, zs.begin() + (p + 1) * W);
    dsv4_compressor_store_one(view(c, {W}), view(z, {W}), a.ape_t(), a.skv(), a.ssc(), p, cc);
    if ((p + 1) % cc.ratio == 0) {
      dsv4_compressor_emit(a.skv(), a.ssc(), cc, a.w(), p / cc.ratio, quant, rows_view(rows_a));
      if (cc.overlap) dsv4_compressor_shift(a.skv(), a.ssc(), cc);
    }
  }
  // Random chunkings.
  std::mt19937 g(static_cast<unsigned>(seed));
  for (int trial = 0; trial < 4; ++trial) {
    Comp b(cc, seed + 2, seed % 2 == 0);
    std::vector<uint8_t> rows_b(rows_a.size(), 0);
    int p = 0;
    while (p < n) {
      int len = trial == 0 ? n : 1 + static_cast<int>(g() % (2 * cc.ratio + 3));
      len = std::min(len, n - p);
      std::vector<float> c(cs.begin() + p * W, cs.begin() + (p + len) * W), z(zs.begin() + p * W, zs.begin() + (p + len) * W);
      dsv4_compress_prefill(view(c, {len, W}), view(z, {len, W}), b.skv(), b.ssc(), p, cc, b.w(), quant, rows_view(rows_b));
      p += len;
    }
    ASSERT_EQ(rows_a, rows_b) << "rows, chunking trial " << trial;
    ASSERT_EQ(std::memcmp(a.kv.data(), b.kv.data(), a.kv.size() * 4), 0) << "state kv, trial " << trial;
    ASSERT_EQ(std::memcmp(a.score.data(), b.score.data(), a.score.size() * 4), 0) << "state score, trial " << trial;
  }
}

TEST(Dsv4Ops, PrefillEqualsTokenByTokenForAnyChunking) {
  for (Dsv4Quant q : {Dsv4Quant::Off, Dsv4Quant::On}) {
    check_prefill_equals_decode(Dsv4Compressor::csa(64, 16, 4), q, false, 41);
    check_prefill_equals_decode(Dsv4Compressor::hca(32, 8, 8), q, false, 42);
    check_prefill_equals_decode(Dsv4Compressor::indexer(32, 8, 4), q, false, 43);
    check_prefill_equals_decode(Dsv4Compressor::csa(48, 16, 3), q, false, 44);  // overlap at another ratio
  }
  check_prefill_equals_decode(Dsv4Compressor::csa(512, 64, 4), Dsv4Quant::On, true, 45);
  check_prefill_equals_decode(Dsv4Compressor::indexer(128, 64, 4), Dsv4Quant::On, true, 46);
  check_prefill_equals_decode(Dsv4Compressor::hca(512, 64, 16), Dsv4Quant::On, true, 47);
}

// ---- indexer --------------------------------------------------------------------------------

// Dims that are not a multiple of any vector width too (30, 36, 9): the SIMD dot products' last
// partial vector must not read the next head's query or the next row.
TEST(Dsv4Ops, IndexerScoresAndTopKMatchFloat64) {
  for (const int D : {32, 30, 36, 9})
  for (Dsv4Quant quant : {Dsv4Quant::Off, Dsv4Quant::On}) {
    if (quant == Dsv4Quant::On && D % 32 != 0) continue;  // FP4 blocks of 32 dims
    SCOPED_TRACE(::testing::Message() << "D " << D << " quant " << int(quant));
    const int H = 5, cap = 20, n_rows = 17, nq = 9, k = 6, ratio = 4;
    const int64_t first = 58;  // queries 58..66: visible rows grow from 14 to 16 and then are capped by n_rows
    std::vector<float> q = randn(nq * H * D, 51), w = randn(nq * H, 52), rows = randn(cap * D, 53);
    std::vector<float> sc(nq * cap, 123.0f);
    std::vector<int32_t> out(nq * k, 99);
    dsv4_indexer_topk(view(q, {nq, H, D}), view(w, {nq, H}), view(rows, {cap, D}), n_rows, first, ratio, quant,
                      view(sc, {nq, cap}), host_view(out, DType::I32, {nq, k}));
    for (int i = 0; i < nq; ++i) {
      const int64_t vis = std::min<int64_t>(n_rows, (first + i + 1) / ratio);
      for (int s = 0; s < cap; ++s) {
        if (s >= vis) {
          ASSERT_EQ(sc[i * cap + s], -INFINITY);
          continue;
        }
        double ref = 0;
        for (int h = 0; h < H; ++h) {
          std::vector<float> qh(q.begin() + (i * H + h) * D, q.begin() + (i * H + h + 1) * D);
          if (quant == Dsv4Quant::On) {  // the query gets the same transform the stored rows had
            math::dsv4_hadamard(qh.data(), D);
            math::dsv4_fp4_round_trip(qh.data(), D);
          }
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qh[d]) * rows[s * D + d];
          ref += w[i * H + h] * std::max(dot, 0.0);
        }
        ASSERT_NEAR(sc[i * cap + s], ref, 1e-5 * (1 + std::fabs(ref)));
      }
      std::vector<int> order(vis);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[i * cap + a] > sc[i * cap + b]; });
      for (int j = 0; j < k; ++j) ASSERT_EQ(out[i * k + j], j < vis ? order[j] : -1) << "query " << i << " pick " << j;
    }
  }
}

// NaN scores have defined picks: every NaN counts as one value above +inf, ties broken by row.
// A NaN weight makes every score of its query NaN; an infinite weight makes a score +inf where
// its head's dot is > 0 and NaN (inf * relu 0) where it is not; weights of +-3e38 on two heads
// overflow to +inf, -inf or NaN (inf - inf) where their dots exceed about 1.1, and stay finite
// where they do not: all four kinds of scores in one query.
TEST(Dsv4Ops, IndexerNanScoresRankAboveInfinity) {
  const int H = 4, D = 32, cap = 40, nq = 3, k = 24, ratio = 4;
  const int64_t first = 4 * cap;  // every query sees every row
  std::vector<float> q = randn(nq * H * D, 54), w = randn(nq * H, 55), rows = randn(cap * D, 56);
  w[0 * H + 1] = NAN;
  w[1 * H + 2] = INFINITY;
  w[2 * H + 0] = 3e38f;
  w[2 * H + 3] = -3e38f;
  for (Dsv4Quant quant : {Dsv4Quant::Off, Dsv4Quant::On}) {
    std::vector<float> sc(nq * cap, 0.0f);
    std::vector<int32_t> out(nq * k, 99);
    dsv4_indexer_topk(view(q, {nq, H, D}), view(w, {nq, H}), view(rows, {cap, D}), cap, first, ratio, quant,
                      view(sc, {nq, cap}), host_view(out, DType::I32, {nq, k}));
    int n_nan[nq] = {0, 0, 0}, n_pinf[nq] = {0, 0, 0}, n_ninf[nq] = {0, 0, 0};
    for (int i = 0; i < nq; ++i) {
      const float* s = sc.data() + i * cap;
      for (int r = 0; r < cap; ++r) {
        n_nan[i] += std::isnan(s[r]);
        n_pinf[i] += s[r] == INFINITY;
        n_ninf[i] += s[r] == -INFINITY;
      }
      // The rule written out: NaNs first (by row), then the rest by value, descending (by row).
      std::vector<int> order(cap);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        if (std::isnan(s[a]) || std::isnan(s[b])) return std::isnan(s[a]) && !std::isnan(s[b]);
        return s[a] > s[b];
      });
      for (int j = 0; j < k; ++j) ASSERT_EQ(out[i * k + j], order[j]) << "quant " << int(quant) << " query " << i << " pick " << j;
    }
    // The cases the rule is for actually occur: all NaN; NaN and +inf only; NaN, +inf, -inf and finite.
    EXPECT_EQ(n_nan[0], cap);
    for (int j = 0; j < k; ++j) EXPECT_EQ(out[j], j);
    EXPECT_GT(n_nan[1], 0);
    EXPECT_GT(n_pinf[1], 0);
    EXPECT_EQ(n_nan[1] + n_pinf[1], cap);
    EXPECT_GT(n_nan[2], 0);
    EXPECT_GT(n_pinf[2], 0);
    EXPECT_GT(n_ninf[2], 0);
    EXPECT_GT(cap - n_nan[2] - n_pinf[2] - n_ninf[2], 0);
  }
}

// ---- bad inputs --------------------------------------------------------------------------------

template <class F>
void expect_error(ErrorCode code, F&& f, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << what << ": " << e.what();
  }
}

TEST(Dsv4Ops, BadInputsThrowAndWriteNothing) {
  Comp s(Dsv4Compressor::csa(64, 16, 4), 61);
  const int W = s.c.width(), hd = 64, cap = 4;
  std::vector<float> c = randn(W, 62), z = randn(W, 63), rows(cap * hd, 5.0f);
  std::vector<float> c_short(W - 1), ape_bad(3 * W);
  std::vector<uint16_t> ape_bf16(4 * W);
  const std::vector<float> kv0 = s.kv, sc0 = s.score, rows0 = rows;
  auto unchanged = [&](const char* what) {
    EXPECT_EQ(s.kv, kv0) << what;
    EXPECT_EQ(std::memcmp(s.score.data(), sc0.data(), sc0.size() * 4), 0) << what;
    EXPECT_EQ(rows, rows0) << what;
  };
  const ErrorCode IA = ErrorCode::InvalidArgument;
  expect_error(IA, [&] { dsv4_compressor_store_one(view(c_short, {W - 1}), view(z, {W}), s.ape_t(), s.skv(), s.ssc(), 0, s.c); }, "c width");
  expect_error(IA, [&] { dsv4_compressor_store_one(view(c, {W}), view(z, {W}), view(ape_bad, {3, W}), s.skv(), s.ssc(), 0, s.c); }, "ape rows");
  expect_error(IA, [&] { dsv4_compressor_store_one(view(c, {W}), view(z, {W}), host_view(ape_bf16, DType::BF16, {4, W}), s.skv(), s.ssc(), 0, s.c); }, "ape dtype");
  expect_error(IA, [&] { dsv4_compressor_store_one(view(c, {W}), view(z, {W}), s.ape_t(), s.skv(), s.ssc(), -1, s.c); }, "negative pos");
  Dsv4Compressor other = s.c;
  other.ratio = 8;  // a ratio that does not match the state and ape
  expect_error(IA, [&] { dsv4_compressor_store_one(view(c, {W}), view(z, {W}), s.ape_t(), s.skv(), s.ssc(), 0, other); }, "ratio");
  expect_error(IA, [&] { dsv4_compressor_shift(s.skv(), s.ssc(), Dsv4Compressor::hca(64, 16, 8)); }, "shift of HCA");
  expect_error(IA, [&] { dsv4_compressor_emit(s.skv(), s.ssc(), s.c, s.w(), cap, Dsv4Quant::Off, view(rows, {cap, hd})); }, "window past capacity");
  std::vector<uint8_t> packed(cap * 584);
  expect_error(IA, [&] { dsv4_compressor_emit(s.skv(), s.ssc(), s.c, s.w(), 0, Dsv4Quant::On, host_view(packed, DType::U8, {cap, 584})); }, "no packed format for 64 dims");
  Dsv4CompressorWeights bad_rope = s.w();
  bad_rope.rope = compressed_table(128, 16);
  expect_error(IA, [&] { dsv4_compressor_emit(s.skv(), s.ssc(), s.c, bad_rope, 0, Dsv4Quant::Off, view(rows, {cap, hd})); }, "rope layout");
  std::vector<float> norm_bad(hd - 2, 1.0f);
  Dsv4CompressorWeights bad_norm = s.w();
  bad_norm.norm_weight = view(norm_bad, {hd - 2});
  expect_error(IA, [&] { dsv4_compressor_emit(s.skv(), s.ssc(), s.c, bad_norm, 0, Dsv4Quant::Off, view(rows, {cap, hd})); }, "norm size");
  std::vector<float> cc = randn(20 * W, 64), zz = randn(20 * W, 65);
  expect_error(IA, [&] { dsv4_compress_prefill(view(cc, {20, W}), view(zz, {20, W}), s.skv(), s.ssc(), 0, s.c, s.w(), Dsv4Quant::Off, view(rows, {cap, hd})); }, "prefill past capacity");
  expect_error(IA, [&] { dsv4_compress_prefill(view(cc, {3, W}), view(zz, {2, W}), s.skv(), s.ssc(), 0, s.c, s.w(), Dsv4Quant::Off, view(rows, {cap, hd})); }, "prefill c/z rows");
  unchanged("compressor ops");

  // Fused decode step: a window row past the store, or more than one kv row.
  std::vector<float> kv = randn(2 * 64, 66);
  {
    std::vector<float> kv1 = randn(64, 70), ring1(4 * 64, 0.0f);
    const std::vector<float> kv1_0 = kv1, ring1_0 = ring1;
    Dsv4DecodeCompressor d{s.c, view(c, {W}), view(z, {W}), s.skv(), s.ssc(), s.w(), view(rows, {cap, hd})};
    expect_error(IA, [&] { dsv4_decode_layer(view(kv1, {1, 64}), view(ring1, {4, 64}), 16, 4 * cap + 3, Dsv4Quant::Off, &d, nullptr); },
                 "decode row past capacity");
    expect_error(IA, [&] { dsv4_decode_layer(view(kv, {2, 64}), view(ring1, {4, 64}), 16, 3, Dsv4Quant::Off, &d, nullptr); },
                 "decode of two rows");
    EXPECT_EQ(kv1, kv1_0);
    EXPECT_EQ(ring1, ring1_0);
  }
  unchanged("decode step");

  // Finalizer.
  std::vector<float> ring(4 * 64, 1.0f);
  const std::vector<float> kv0b = kv, ring0 = ring;
  expect_error(IA, [&] { dsv4_kv_finalize(view(kv, {2, 64}), view(ring, {4, 64}), 0, 66, Dsv4Quant::On); }, "n_rot > head_dim");
  expect_error(IA, [&] { dsv4_kv_finalize(view(kv, {2, 64}), view(ring, {2, 128}), 0, 16, Dsv4Quant::On); }, "ring width");
  expect_error(IA, [&] { dsv4_kv_finalize(view(kv, {2, 64}), view(ring, {4, 64}), -1, 16, Dsv4Quant::On); }, "negative raw row");
  EXPECT_EQ(kv, kv0b);
  EXPECT_EQ(ring, ring0);

  // Indexer.
  std::vector<float> q = randn(2 * 3 * 32, 67), w = randn(2 * 3, 68), ir = randn(8 * 32, 69), sc(2 * 8, 1.0f);
  std::vector<int32_t> out(2 * 9, 7);
  const std::vector<float> sc0b = sc;
  const std::vector<int32_t> out0 = out;
  expect_error(IA, [&] { dsv4_indexer_topk(view(q, {2, 3, 32}), view(w, {2, 3}), view(ir, {8, 32}), 8, 0, 4, Dsv4Quant::Off, view(sc, {2, 8}), host_view(out, DType::I32, {2, 9})); }, "top-k > capacity");
  expect_error(IA, [&] { dsv4_indexer_topk(view(q, {2, 3, 32}), view(w, {2, 3}), view(ir, {8, 32}), 9, 0, 4, Dsv4Quant::Off, view(sc, {2, 8}), host_view(out, DType::I32, {2, 4})); }, "n_rows > capacity");
  expect_error(IA, [&] { dsv4_indexer_topk(view(q, {2, 3, 32}), view(w, {3, 2}), view(ir, {8, 32}), 8, 0, 4, Dsv4Quant::Off, view(sc, {2, 8}), host_view(out, DType::I32, {2, 4})); }, "weights shape");
  EXPECT_EQ(sc, sc0b);
  EXPECT_EQ(out, out0);
}

}  // namespace
