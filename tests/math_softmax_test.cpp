// The online softmax of include/kvcore/math/softmax.hpp against float64: a row's keys streamed
// in tiles, masked keys and wholly masked tiles and rows among them, in both forms the kernels
// take (scores scaled first and weighed by softmax_weight; raw scores with the scale folded
// into exp2's argument and the row offset by softmax_offset, as the wgmma prefill kernels do),
// then two partial states merged and normalized partials combined with a sink.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvcore/math/softmax.hpp"

namespace {

using namespace kvcore::math;

constexpr int kTile = 64;
constexpr int kDim = 4;

struct Row {
  std::vector<float> s;  // raw scores q.k
  std::vector<bool> seen;
  std::vector<float> v;  // kDim values a key
};

// A row of n keys; mask_kind 0: every key seen, 1: random keys masked, 2: the first tiles
// masked whole (the running max stays -inf across tiles), 3: every key masked.
Row make_row(std::mt19937& rng, int n, int mask_kind) {
  std::normal_distribution<float> score(0.0f, 6.0f), value(0.0f, 1.0f);
  std::bernoulli_distribution coin(0.3);
  Row r;
  for (int i = 0; i < n; ++i) {
    r.s.push_back(score(rng));
    bool seen = true;
    if (mask_kind == 1) seen = !coin(rng);
    if (mask_kind == 2) seen = i >= 2 * kTile;
    if (mask_kind == 3) seen = false;
    r.seen.push_back(seen);
    for (int d = 0; d < kDim; ++d) r.v.push_back(value(rng));
  }
  return r;
}

// softmax(scale * s) . v in float64 over the seen keys; false where none is seen.
bool reference(const Row& r, double scale, double (&out)[kDim]) {
  double m = -INFINITY;
  for (size_t i = 0; i < r.s.size(); ++i)
    if (r.seen[i]) m = std::fmax(m, scale * r.s[i]);
  for (double& o : out) o = 0.0;
  if (std::isinf(m)) return false;
  double l = 0.0;
  for (size_t i = 0; i < r.s.size(); ++i) {
    if (!r.seen[i]) continue;
    const double w = std::exp(scale * r.s[i] - m);
    l += w;
    for (int d = 0; d < kDim; ++d) out[d] += w * r.v[i * kDim + d];
  }
  for (double& o : out) o /= l;
  return true;
}

// Un-normalized state over keys [begin, end): m, l and acc as a kernel keeps them.
struct State {
  float m = neg_inf_f32();
  float l = 0.0f;
  float acc[kDim] = {};
};

// Tile by tile, raw scores: the max over a tile's raw scores, scaled once; each weight
// exp2(s * sl2 - softmax_offset(m)), a masked score -inf.
State stream_folded(const Row& r, float sl2, int begin, int end) {
  State st;
  for (int t = begin; t < end; t += kTile) {
    const int stop = std::min(end, t + kTile);
    float mx = neg_inf_f32();
    for (int i = t; i < stop; ++i) mx = max_f32(mx, r.seen[i] ? r.s[i] : neg_inf_f32());
    const float mn = max_f32(st.m, mx * sl2);
    const float rs = softmax_rescale(st.m, mn);
    st.m = mn;
    const float off = softmax_offset(mn);
    st.l *= rs;
    for (float& a : st.acc) a *= rs;
    for (int i = t; i < stop; ++i) {
      const float w = exp2_f32(std::fma(r.seen[i] ? r.s[i] : neg_inf_f32(), sl2, -off));
      st.l += w;
      for (int d = 0; d < kDim; ++d) st.acc[d] += w * r.v[i * kDim + d];
    }
  }
  return st;
}

// Tile by tile, scores scaled first: OnlineSoftmax's begin_tile and weight.
State stream_scaled(const Row& r, float sl2, int begin, int end) {
  OnlineSoftmax os;
  State st;
  for (int t = begin; t < end; t += kTile) {
    const int stop = std::min(end, t + kTile);
    float mx = neg_inf_f32();
    for (int i = t; i < stop; ++i) mx = max_f32(mx, r.seen[i] ? r.s[i] * sl2 : neg_inf_f32());
    const float rs = os.begin_tile(mx);
    for (float& a : st.acc) a *= rs;
    for (int i = t; i < stop; ++i) {
      const float w = os.weight(r.seen[i] ? r.s[i] * sl2 : neg_inf_f32());
      os.add(w);
      for (int d = 0; d < kDim; ++d) st.acc[d] += w * r.v[i * kDim + d];
    }
  }
  st.m = os.m;
  st.l = os.l;
  return st;
}

void expect_matches(const State& st, bool any_seen, const double (&ref)[kDim], const char* form, int row) {
  ASSERT_FALSE(std::isnan(st.m) || std::isnan(st.l)) << form << " row " << row;
  if (!any_seen) {
    EXPECT_TRUE(is_neg_inf(st.m)) << form << " row " << row;
    EXPECT_EQ(st.l, 0.0f) << form << " row " << row;
    for (float a : st.acc) EXPECT_EQ(a, 0.0f) << form << " row " << row;
    return;
  }
  for (int d = 0; d < kDim; ++d)
    EXPECT_NEAR(st.acc[d] / st.l, ref[d], 2e-5 * (1.0 + std::fabs(ref[d]))) << form << " row " << row << " dim " << d;
}

TEST(MathSoftmax, StreamedTilesMatchFloat64InBothForms) {
  std::mt19937 rng(20261206);
  const float scale = 1.0f / std::sqrt(128.0f), sl2 = scale * kLog2e;
  int row = 0;
  for (int mask_kind = 0; mask_kind < 4; ++mask_kind)
    for (int n : {1, 63, 64, 65, 200, 640}) {
      const Row r = make_row(rng, n, mask_kind);
      double ref[kDim];
      const bool any_seen = reference(r, scale, ref);
      expect_matches(stream_folded(r, sl2, 0, n), any_seen, ref, "folded", row);
      expect_matches(stream_scaled(r, sl2, 0, n), any_seen, ref, "scaled", row);
      ++row;
    }
}

TEST(MathSoftmax, OffsetFormIsTheWeightFormOnAMaskedRow) {
  // The running max is -inf only while every score is -inf: both forms weigh them 0, no NaN.
  const float m = neg_inf_f32();
  EXPECT_EQ(softmax_offset(m), 0.0f);
  EXPECT_EQ(exp2_f32(neg_inf_f32() - softmax_offset(m)), softmax_weight(neg_inf_f32(), m));
  EXPECT_EQ(softmax_offset(3.5f), 3.5f);
  EXPECT_EQ(exp2_f32(1.0f - softmax_offset(3.5f)), softmax_weight(1.0f, 3.5f));
}

TEST(MathSoftmax, MergedPartialStatesMatchOneStream) {
  std::mt19937 rng(7);
  const float sl2 = 0.125f * kLog2e;
  for (int mask_kind = 0; mask_kind < 4; ++mask_kind)
    for (int split : {0, 64, 128, 192, 320}) {
      const int n = 320;
      const Row r = make_row(rng, n, mask_kind);
      const State a = stream_folded(r, sl2, 0, split), b = stream_folded(r, sl2, split, n);
      State merged = a;
      const MergeFactors f = merge_states(merged.m, merged.l, b.m, b.l);
      for (int d = 0; d < kDim; ++d) merged.acc[d] = a.acc[d] * f.a + b.acc[d] * f.b;
      double ref[kDim];
      const bool any_seen = reference(r, 0.125, ref);
      expect_matches(merged, any_seen, ref, "merged", split);
    }
}

TEST(MathSoftmax, NormalizedPartialsWithASinkMatchFloat64) {
  // Partials (o_i, lse_i) in the log2 domain, one of them empty, plus a sink logit: out = sum
  // exp2(lse_i) o_i / (sum exp2(lse_i) + exp2(sink)).
  const float lse[] = {3.0f, neg_inf_f32(), -1.5f, 2.25f};
  const float o[] = {0.5f, 7.0f, -2.0f, 1.0f};
  for (float sink : {neg_inf_f32(), 0.0f, 4.0f}) {
    float lmax = sink;
    for (float x : lse) lmax = max_f32(lmax, x);
    float sum = 0.0f;
    for (float x : lse) sum += partials_weight(x, lmax);
    const float inv = partials_inv_denominator(sum, sink, lmax);
    float out = 0.0f;
    for (int i = 0; i < 4; ++i) out += partials_weight(lse[i], lmax) * inv * o[i];
    double num = 0.0, den = std::isinf(sink) ? 0.0 : std::exp2(double{sink});
    for (int i = 0; i < 4; ++i)
      if (!std::isinf(lse[i])) {
        num += std::exp2(double{lse[i]}) * o[i];
        den += std::exp2(double{lse[i]});
      }
    EXPECT_NEAR(out, num / den, 1e-6) << "sink " << sink;
  }
  // No partial sees a key: zeros, whatever the sink.
  EXPECT_EQ(partials_inv_denominator(0.0f, 1.0f, neg_inf_f32()), 0.0f);
}

}  // namespace
