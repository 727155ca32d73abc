// Replays the HF transformers 5.17 RoPE fixtures (tests/fixtures/make_rope_fixtures.py):
// default, linear, Llama-3 (8B), YaRN (derived, mscale and explicit attention factors,
// truncated and not), partial rotary on the head slice (Phi-3), and DeepSeek-V4's
// interleaved tail rotary ("main" and YaRN "compress"), each through the model's own
// rotary module and apply_rotary_pos_emb.
//
// Tolerances (r = |x0| + |x1| of the input pair, m the attention factor, a = |p * w_i|):
// - inv_freq: relative 1e-6. HF computes in f32 (a pow, a division, and for YaRN/Llama-3
//   a blend, each rounding, plus pow's own ulp error); ours is the double value rounded
//   once. 1e-6 is about 8 f32 ulps; the measured worst is printed.
// - attention factor: relative 1e-12 (both are double formulas; HF's is a Python float).
// - rope_apply with our spec vs HF's output: r * m * (a * 1.5e-6 + 2^-20). The angle term
//   grows with position: the two f32 frequencies differ by up to 1e-6 relative (measured
//   2.8e-7), and each side rounds the product p * w once (2^-24 relative each); at
//   p = 131071 and w = 1 the bound is 0.2 per unit of r. The constant term covers sin/cos
//   (torch's f32 ~1 ulp, ours ~0.5 ulp), the scaling by m and the rotation's roundings.
// - rope_apply with HF's own inv_freq in the table: r * m * (a * 2^-23 + 2^-21). Same angle
//   bits on both sides, so only sin/cos of (possibly large) f32 angles and arithmetic differ.
// Measured on the committed fixtures (CPU torch): worst err/tol 0.17 and 0.31.
// - dims outside the rotated slice: bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvcore/ops/rope.hpp"

using namespace kvcore;
using nlohmann::json;

namespace {

RopeSpec spec_from(const json& s) {
  RopeSpec r;
  r.n_rot = s.at("n_rot").get<int>();
  r.slice = s.at("slice") == "tail" ? RopeSlice::Tail : RopeSlice::Head;
  r.pairing = s.at("pairing") == "interleaved" ? RopePairing::Interleaved : RopePairing::NeoX;
  r.theta = s.at("theta").get<double>();
  const std::string scaling = s.at("scaling");
  r.scaling = scaling == "linear" ? RopeScaling::Linear : scaling == "llama3" ? RopeScaling::Llama3
              : scaling == "yarn" ? RopeScaling::Yarn : RopeScaling::None;
  if (s.contains("factor")) r.factor = s["factor"].get<double>();
  if (s.contains("low_freq_factor")) r.low_freq_factor = s["low_freq_factor"].get<double>();
  if (s.contains("high_freq_factor")) r.high_freq_factor = s["high_freq_factor"].get<double>();
  if (s.contains("original_max_position")) r.original_max_position = s["original_max_position"].get<int>();
  if (s.contains("beta_fast")) r.beta_fast = s["beta_fast"].get<double>();
  if (s.contains("beta_slow")) r.beta_slow = s["beta_slow"].get<double>();
  if (s.contains("truncate")) r.yarn_truncate = s["truncate"].get<bool>();
  if (r.scaling == RopeScaling::Yarn) {
    // Our rule for HF's default: yarn_attention_factor from factor and the optional mscales.
    const auto num = [&](const char* k) { return s.contains(k) && !s[k].is_null() ? s[k].get<double>() : 0.0; };
    r.attention_factor = s.contains("attention_factor") && !s["attention_factor"].is_null()
                             ? s["attention_factor"].get<double>()
                             : yarn_attention_factor(r.factor, num("mscale"), num("mscale_all_dim"));
  }
  return r;
}

std::vector<float> floats(const json& a) {
  std::vector<float> v;
  for (const auto& x : a) v.push_back(static_cast<float>(x.get<double>()));
  return v;
}

struct Measured {
  double freq_rel = 0, spec_ratio = 0, spec_abs = 0, table_ratio = 0, table_abs = 0;
};

// Runs rope_apply (out of place, f32) on the fixture's x and compares with its y.
void compare_apply(const json& f, const RopeSpec& spec, const math::RopeTable& table, double angle_k, double const_k, double* worst_ratio,
                   double* worst_abs) {
  const int heads = f.at("heads"), hd = f.at("head_dim");
  const std::vector<int64_t> pos = f.at("positions").get<std::vector<int64_t>>();
  const int64_t tokens = static_cast<int64_t>(pos.size());
  const std::vector<float> x = floats(f.at("x")), want = floats(f.at("y"));
  ASSERT_EQ(x.size(), size_t(tokens) * heads * hd);
  std::vector<float> y(x.size(), NAN);
  rope_apply(TensorRef(const_cast<float*>(x.data()), DType::F32, Device::cpu(), {tokens, heads, hd}),
             TensorRef(const_cast<int64_t*>(pos.data()), DType::I64, Device::cpu(), {tokens}), table,
             RopeAttentionFactor::Apply, TensorRef(y.data(), DType::F32, Device::cpu(), {tokens, heads, hd}));
  const math::RopeLayout& l = table.layout;
  const double m = table.attention_factor;
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * hd;
      for (int d = 0; d < hd; ++d) {
        if (!l.rotates(d)) {
          ASSERT_EQ(y[base + d], want[base + d]) << f["name"] << " pass-through dim " << d;
        }
      }
      for (int i = 0; i < l.n_pairs(); ++i) {
        const int64_t a = base + l.dim0(i), b = base + l.dim1(i);
        const double r = std::abs(x[a]) + std::abs(x[b]);
        const double ang = std::abs(double(pos[t]) * table.freq[i]);
        const double tol = r * m * (ang * angle_k + const_k) + 1e-30;
        for (int64_t k : {a, b}) {
          const double err = std::abs(double(y[k]) - want[k]);
          *worst_ratio = std::max(*worst_ratio, err / tol);
          *worst_abs = std::max(*worst_abs, err);
          ASSERT_LE(err, tol) << f["name"] << " (" << spec.describe() << ") token " << t << " pos " << pos[t] << " head "
                              << h << " pair " << i << " dim " << (k - base) << ": ours " << y[k] << " HF " << want[k];
        }
      }
    }
}

}  // namespace

TEST(RopeFixtures, EveryHFVariant) {
  const std::filesystem::path dir = std::filesystem::path(KVCORE_FIXTURE_DIR) / "rope";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 9u) << "fixtures missing: run tests/fixtures/make_rope_fixtures.py";
  for (const auto& path : files) {
    std::ifstream in(path);
    const json f = json::parse(in);
    const RopeSpec spec = spec_from(f.at("spec"));
    const int hd = f.at("head_dim");
    Measured me;

    // frequencies
    const std::vector<float> hf = floats(f.at("inv_freq"));
    const std::vector<float> ours = rope_frequencies(spec);
    ASSERT_EQ(ours.size(), hf.size()) << path;
    for (size_t i = 0; i < hf.size(); ++i) {
      const double rel = std::abs(double(ours[i]) - hf[i]) / hf[i];
      me.freq_rel = std::max(me.freq_rel, rel);
      EXPECT_LE(rel, 1e-6) << path.filename() << " pair " << i << ": ours " << ours[i] << " HF " << hf[i];
    }
    // attention factor
    const double hf_af = f.at("attention_factor");
    EXPECT_NEAR(spec.attention_factor, hf_af, 1e-12 * hf_af) << path.filename();

    // rope_apply with our table, then with HF's frequencies in the table
    const math::RopeTable ours_t = make_rope_table(spec, hd);
    compare_apply(f, spec, ours_t, 1.5e-6, std::ldexp(1.0, -20), &me.spec_ratio, &me.spec_abs);
    math::RopeTable hf_t = ours_t;
    for (size_t i = 0; i < hf.size(); ++i) hf_t.freq[i] = hf[i];
    compare_apply(f, spec, hf_t, std::ldexp(1.0, -23), std::ldexp(1.0, -21), &me.table_ratio, &me.table_abs);
    if (HasFailure()) return;
    std::printf("%-32s freq rel %.2e | apply: max |err| %.2e (err/tol %.3f); with HF freqs %.2e (%.3f) | af %.6f\n",
                path.filename().string().c_str(), me.freq_rel, me.spec_abs, me.spec_ratio, me.table_abs, me.table_ratio,
                hf_af);
  }
}
