// Merge of split-K partials on the CPU (the CUDA merge kernel computes the same).
#pragma once
#include "kvcore/math/softmax.hpp"

namespace kvcore::ops::cpu {

// o[n][D] normalized partials with log2-sum-exp2 lse[n]; sink is a natural-log logit
// (-inf: none). Writes the merged row to out[D].
inline void merge_partials(const float* o, const float* lse, int32_t n, int32_t D, float sink, float* out) {
  const float sink2 = math::is_neg_inf(sink) ? sink : sink * math::kLog2e;
  float m = sink2;
  for (int32_t i = 0; i < n; ++i) m = math::max_f32(m, lse[i]);
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) sum += math::partials_weight(lse[i], m);
  const float inv = math::partials_inv_denominator(sum, sink2, m);
  for (int32_t d = 0; d < D; ++d) out[d] = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    const float w = math::partials_weight(lse[i], m) * inv;
    if (w == 0.0f) continue;
    for (int32_t d = 0; d < D; ++d) out[d] += w * o[int64_t{i} * D + d];
  }
}

}  // namespace kvcore::ops::cpu
