// Online softmax: the running max / sum / rescale of flash-style attention,
// and the merge of two partial states, shared by every attention kernel.
//
// Scores live in the log2 domain (softmax_scale * log2(e) folded into the
// query), so weights are exp2(s - m). A partial state over a set of keys is
// either (m, l, acc) with acc = sum exp2(s - m) * v and l = sum exp2(s - m), or,
// once normalized, (o = acc / l, lse = m + log2(l)). The empty set has
// m = lse = -inf, l = 0, acc = 0, and every helper here treats it so that it
// never produces a NaN: it merges as "no contribution".
#pragma once
#include <cmath>

#include "kvcore/math/hd.hpp"

namespace kvcore::math {

inline constexpr float kLog2e = 1.4426950408889634f;

KVCORE_HD float neg_inf_f32() { return bits_float(0xff800000u); }
KVCORE_HD bool is_neg_inf(float x) { return x == neg_inf_f32(); }

KVCORE_HD float exp2_f32(float x) {
#if defined(__CUDA_ARCH__)
  return exp2f(x);
#else
  return std::exp2(x);
#endif
}

KVCORE_HD float log2_f32(float x) {
#if defined(__CUDA_ARCH__)
  return log2f(x);
#else
  return std::log2(x);
#endif
}

KVCORE_HD float max_f32(float a, float b) { return a > b ? a : b; }

// The exp2 of the two helpers below unless a kernel passes its own (a kernel bound by
// instruction issue may take the SFU's, denormal results flushed).
struct Exp2F32 {
  KVCORE_HD float operator()(float x) const { return exp2_f32(x); }
};

// Weight of a key with score s under running max m (m >= s). A masked key
// (s == -inf) weighs 0 even when m is still -inf.
template <class Exp2 = Exp2F32>
KVCORE_HD float softmax_weight(float s, float m, Exp2 exp2 = {}) {
  return is_neg_inf(s) ? 0.0f : exp2(s - m);
}

// What a row's scores are offset by before their exp2 once the row's running max is m: m, or 0
// where m is -inf (every score so far masked, so each is -inf too, and exp2(-inf - 0) = 0 where
// -inf - -inf would be NaN). exp2(s - softmax_offset(m)) is softmax_weight(s, m) with one test a
// row instead of one a score; kernels bound by instruction issue take it so.
KVCORE_HD float softmax_offset(float m) { return is_neg_inf(m) ? 0.0f : m; }

// Factor that rescales a state kept under max m_old to max m_new >= m_old.
// Both -inf (nothing seen yet): 1, the state is all zeros anyway.
template <class Exp2 = Exp2F32>
KVCORE_HD float softmax_rescale(float m_old, float m_new, Exp2 exp2 = {}) {
  return is_neg_inf(m_old) ? (is_neg_inf(m_new) ? 1.0f : 0.0f) : exp2(m_old - m_new);
}

// Running state of one query head over a stream of keys.
struct OnlineSoftmax {
  float m = neg_inf_f32();  // running max of scores seen (log2 domain)
  float l = 0.0f;           // sum of exp2(s - m)

  // Start a tile whose largest score is tile_max: returns the factor the
  // accumulator must be multiplied by; afterwards add weight(s) per key.
  KVCORE_HD float begin_tile(float tile_max) {
    const float m_new = max_f32(m, tile_max);
    const float r = softmax_rescale(m, m_new);
    l *= r;
    m = m_new;
    return r;
  }
  KVCORE_HD float weight(float s) const { return softmax_weight(s, m); }
  KVCORE_HD void add(float w) { l += w; }
  // log2-sum-exp2 of the keys seen; -inf when none.
  KVCORE_HD float lse() const { return l > 0.0f ? m + log2_f32(l) : neg_inf_f32(); }
};

// Merge two un-normalized states (m_a, l_a, acc_a) += (m_b, l_b, acc_b):
// returns the factors for a's and b's accumulators; updates m_a and l_a.
struct MergeFactors {
  float a, b;
};
KVCORE_HD MergeFactors merge_states(float& m_a, float& l_a, float m_b, float l_b) {
  const float m = max_f32(m_a, m_b);
  const MergeFactors f{softmax_rescale(m_a, m), softmax_rescale(m_b, m)};
  l_a = l_a * f.a + l_b * f.b;
  m_a = m;
  return f;
}

// Merge of normalized partials (o_i, lse_i), i < n, plus an optional sink
// logit (log2 domain; -inf = none) that adds exp2(sink) to the denominator
// without a value. Weights w_i = exp2(lse_i - M) / D with M the largest lse
// (sink included) and D = sum exp2(lse_i - M) + exp2(sink - M): out = sum w_i o_i.
// lse_max() and denominator() let a kernel compute the weights in two passes.
KVCORE_HD float partials_weight(float lse_i, float lse_max) { return softmax_weight(lse_i, lse_max); }

// The weight of the empty state set to 0 everywhere: a query that sees no live
// key (and maybe a sink) outputs zeros.
KVCORE_HD float partials_inv_denominator(float sum_weights, float sink, float lse_max) {
  if (is_neg_inf(lse_max)) return 0.0f;
  const float d = sum_weights + softmax_weight(sink, lse_max);
  return d > 0.0f ? 1.0f / d : 0.0f;
}

}  // namespace kvcore::math
