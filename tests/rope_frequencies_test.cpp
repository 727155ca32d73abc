// RopeSpec frequencies for every variant against an independent float64 computation written
// here from the formulas in specs/context-shift.md (and HF's yarn attention factor), plus the
// shared sin/cos and the spec's validation.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "kvcore/error.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "rope_reference.hpp"

using namespace kvcore;

namespace {

using namespace rope_ref;

void expect_freqs(const RopeSpec& spec, const std::vector<double>& want) {
  const std::vector<float> got = rope_frequencies(spec);
  const std::vector<double> got64 = rope_frequencies_f64(spec);
  ASSERT_EQ(got.size(), want.size()) << spec.describe();
  for (size_t i = 0; i < want.size(); ++i) {
    // double: a few ulps of reassociation; f32: one rounding of the double value (half an ulp).
    EXPECT_NEAR(got64[i], want[i], 1e-14 * want[i]) << spec.describe() << " pair " << i;
    EXPECT_NEAR(got[i], want[i], std::ldexp(want[i], -24) * 1.0001) << spec.describe() << " pair " << i;
  }
}

}  // namespace

TEST(RopeFrequencies, PlainEveryPairing) {
  for (int n_rot : {2, 64, 128, 512})
    for (RopePairing pr : {RopePairing::NeoX, RopePairing::Interleaved})
      for (double theta : {10000.0, 500000.0, 1e6}) expect_freqs(RopeSpec::plain(n_rot, theta, pr), base_freqs(n_rot, theta));
}

TEST(RopeFrequencies, Linear) {
  RopeSpec s = RopeSpec::plain(128, 10000.0);
  s.scaling = RopeScaling::Linear;
  s.factor = 4.0;
  std::vector<double> w = base_freqs(128, 10000.0);
  for (double& x : w) x /= 4.0;
  expect_freqs(s, w);
}

TEST(RopeFrequencies, Llama3EightB) {
  const RopeSpec s = RopeSpec::llama3_8b();
  const std::vector<double> w = llama3_freqs(128, 500000.0, 8.0, 1.0, 4.0, 8192.0);
  expect_freqs(s, w);
  // All three regimes occur for Llama-3-8B: kept, blended, divided.
  const std::vector<double> b = base_freqs(128, 500000.0);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == b[i]) ++kept;
    else if (std::abs(w[i] - b[i] / 8.0) < 1e-18) ++divided;
    else ++blended;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(RopeFrequencies, YarnDeepSeekV4RangeIs15To25) {
  const YarnRange r = yarn_range(64, 160000.0, 65536.0, 32.0, 1.0, true);
  EXPECT_EQ(r.low, 15.0);
  EXPECT_EQ(r.high, 25.0);
  const RopeSpec s = RopeSpec::deepseek_v4_compressed();
  const std::vector<double> w = yarn_freqs(64, 160000.0, 16.0, 65536.0, 32.0, 1.0, true);
  expect_freqs(s, w);
  const std::vector<double> b = base_freqs(64, 160000.0);
  for (int i = 0; i <= 15; ++i) EXPECT_EQ(w[i], b[i]) << i;               // extrapolated: untouched
  for (int i = 25; i < 32; ++i) EXPECT_NEAR(w[i], b[i] / 16.0, 1e-20) << i;  // interpolated: / factor
  EXPECT_EQ(s.attention_factor, 1.0);  // V4 applies no magnitude
}

TEST(RopeFrequencies, YarnUntruncatedAndOtherShapes) {
  for (bool trunc : {true, false})
    for (int n_rot : {64, 128}) {
      RopeSpec s = RopeSpec::plain(n_rot, 150000.0);
      s.scaling = RopeScaling::Yarn;
      s.factor = 32.0;
      s.original_max_position = 4096;
      s.beta_fast = 32.0;
      s.beta_slow = 1.0;
      s.yarn_truncate = trunc;
      expect_freqs(s, yarn_freqs(n_rot, 150000.0, 32.0, 4096.0, 32.0, 1.0, trunc));
    }
}

TEST(RopeFrequencies, FrequencyFactorsDivide) {
  RopeSpec s = RopeSpec::plain(8, 10000.0);
  s.freq_factors = {1.0f, 2.0f, 4.0f, 0.5f};
  std::vector<double> w = base_freqs(8, 10000.0);
  for (int i = 0; i < 4; ++i) w[i] /= s.freq_factors[i];
  expect_freqs(s, w);
}

TEST(RopeFrequencies, YarnAttentionFactorAsHF) {
  EXPECT_NEAR(yarn_attention_factor(4.0), 0.1 * std::log(4.0) + 1.0, 1e-15);
  EXPECT_NEAR(yarn_attention_factor(16.0), 1.0 + 0.1 * std::log(16.0), 1e-15);  // ~1.277, which V4 does not use
  EXPECT_NEAR(yarn_attention_factor(32.0, 1.0, 0.5), (0.1 * std::log(32.0) + 1) / (0.05 * std::log(32.0) + 1), 1e-15);
  EXPECT_EQ(yarn_attention_factor(40.0, 1.0, 1.0), 1.0);  // DeepSeek-V3: mscale == mscale_all_dim
  EXPECT_EQ(yarn_attention_factor(1.0), 1.0);
  EXPECT_EQ(yarn_attention_factor(0.5), 1.0);
}

TEST(RopeFrequencies, TableMatchesLayoutAndFrequencies) {
  const RopeSpec s = RopeSpec::deepseek_v4_compressed();
  const math::RopeTable t = make_rope_table(s, 512);
  EXPECT_EQ(t.layout.first_dim, 448);
  EXPECT_EQ(t.layout.n_rot, 64);
  EXPECT_EQ(t.layout.interleaved, 1);
  EXPECT_EQ(t.layout.dim0(3), 454);
  EXPECT_EQ(t.layout.dim1(3), 455);
  const std::vector<float> w = rope_frequencies(s);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(t.freq[i], w[i]);
  const math::RopeTable n = make_rope_table(RopeSpec::llama3_8b(), 128);
  EXPECT_EQ(n.layout.first_dim, 0);
  EXPECT_EQ(n.layout.dim0(5), 5);
  EXPECT_EQ(n.layout.dim1(5), 69);
}

// The shared sin/cos: within ~0.5 ulp of libm's double sin/cos over the angles contexts
// of up to 16M positions produce (largest relative error in units of 2^-24 of max(|v|, tiny)).
TEST(RopeSinCos, CorrectlyRoundedNearly) {
  uint64_t state = 12345;
  auto next = [&]() { state = state * 6364136223846793005ull + 1442695040888963407ull; return state >> 11; };
  double worst = 0;
  for (int n = 0; n < 200000; ++n) {
    const int e = static_cast<int>(next() % 50) - 24;  // |a| from 2^-24 to 2^25
    float a = std::ldexp(static_cast<float>(next() % (1u << 24)) / float(1u << 24), e);
    if (next() & 1) a = -a;
    float s, c;
    math::sincos_f32(a, &s, &c);
    const double rs = std::sin(double(a)), rc = std::cos(double(a));
    // error in ulps of the f32 result
    auto ulps = [](double got, double want) {
      const double m = std::max(std::abs(want), 1e-30);
      int ex;
      std::frexp(m, &ex);
      return std::abs(got - want) / std::ldexp(1.0, ex - 24);
    };
    worst = std::max({worst, ulps(s, rs), ulps(c, rc)});
  }
  std::printf("sincos_f32: worst error %.4f f32 ulps over 200000 angles\n", worst);
  EXPECT_LE(worst, 0.5001) << "worst sin/cos error in f32 ulps";
  float s, c;
  math::sincos_f32(0.0f, &s, &c);
  EXPECT_EQ(s, 0.0f);
  EXPECT_EQ(c, 1.0f);
  math::sincos_f32(INFINITY, &s, &c);
  EXPECT_TRUE(std::isnan(s) && std::isnan(c));
  math::sincos_f32(NAN, &s, &c);
  EXPECT_TRUE(std::isnan(s) && std::isnan(c));
  math::sincos_f32(3e38f, &s, &c);  // far beyond any position: finite and bounded
  EXPECT_TRUE(std::abs(s) <= 1.0f && std::abs(c) <= 1.0f);
}

TEST(RopeSpecValidate, NamesTheBadField) {
  auto expect_bad = [](const RopeSpec& s, int head_dim, const char* needle) {
    try {
      s.validate(head_dim);
      ADD_FAILURE() << "accepted " << s.describe();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_bad(RopeSpec::plain(63, 1e4), 128, "n_rot must be even");
  expect_bad(RopeSpec::plain(0, 1e4), 128, "n_rot must be even");
  expect_bad(RopeSpec::plain(256, 1e4), 128, "does not fit head_dim = 128");
  expect_bad(RopeSpec::plain(64, 1.0), 128, "theta");
  expect_bad(RopeSpec::plain(64, NAN), 128, "theta");
  RopeSpec y = RopeSpec::deepseek_v4_compressed();
  y.beta_fast = -1;
  expect_bad(y, 512, "beta_fast");
  y = RopeSpec::deepseek_v4_compressed();
  y.beta_slow = NAN;
  expect_bad(y, 512, "beta_slow");
  RopeSpec e = RopeSpec::plain(64, 1e4);  // fields its scaling does not use are checked too
  e.factor = INFINITY;
  expect_bad(e, 128, "factor");
  e = RopeSpec::plain(64, 1e4);
  e.original_max_position = 0;
  expect_bad(e, 128, "original_max_position");
  e = RopeSpec::plain(64, 1e4);
  e.scaling = static_cast<RopeScaling>(7);
  expect_bad(e, 128, "RopeSpec.scaling");
  e = RopeSpec::plain(64, 1e4);
  e.slice = static_cast<RopeSlice>(2);
  expect_bad(e, 128, "RopeSpec.slice");
  e = RopeSpec::plain(64, 1e4);
  e.pairing = static_cast<RopePairing>(9);
  expect_bad(e, 128, "RopeSpec.pairing");
  y = RopeSpec::deepseek_v4_compressed();
  y.factor = 0;
  expect_bad(y, 512, "factor");
  RopeSpec l = RopeSpec::llama3_8b();
  l.low_freq_factor = 0;
  expect_bad(l, 128, "low_freq_factor");
  l = RopeSpec::llama3_8b();
  l.high_freq_factor = 0.5;
  expect_bad(l, 128, "high_freq_factor");
  RopeSpec f = RopeSpec::plain(8, 1e4);
  f.freq_factors = {1.0f, 2.0f};
  expect_bad(f, 8, "freq_factors must have n_rot/2 = 4");
  f.freq_factors = {1.0f, 2.0f, 0.0f, 1.0f};
  expect_bad(f, 8, "freq_factors[2]");
  RopeSpec a = RopeSpec::plain(8, 1e4);
  a.attention_factor = 0;
  expect_bad(a, 8, "attention_factor");
}
