// Split-K merge kernel shared by paged and DeepSeek-V4 attention: per (row,
// head) combine the normalized partials (o, lse) of every split, add the
// sink to the denominator, optionally rotate the output back by the query
// position (DeepSeek-V4's inverse RoPE on the tail), store in the output dtype.
#pragma once
#include <cuda_runtime.h>

#include "kvcore/math/rope.hpp"
#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::attn {

struct MergeArgs {
  const float* o_part;            // [n_rows, n_heads, splits, head_dim]
  const float* lse_part;          // [n_rows, n_heads, splits]
  int32_t n_rows, n_heads, splits, head_dim;
  const float* maybe_sinks;       // [n_heads]
  void* out;                      // [n_rows, n_heads, head_dim] of out_elem
  QElem out_elem;
  int64_t out_row_stride, out_head_stride;
  const int32_t* maybe_inverse_rope_pos;  // [n_rows]: rotate the output by -pos with `rope`
  math::RopeTable rope;
  int32_t sm_count = 0;  // > 0 (and no inverse rope): few (row, head) pairs take a CTA per 32 dims
};

void launch_merge(const MergeArgs& a, cudaStream_t stream);

}  // namespace kvcore::ops::cuda::attn
