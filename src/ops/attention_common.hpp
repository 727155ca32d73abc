// Helpers shared by the attention entry points (host side only).
#pragma once
#include <vector>

#include "kvcore/ops/attention.hpp"
#include "ops/attention_params.hpp"

namespace kvcore::ops::attn {

// Copy a contiguous i32 tensor (host or device) into a host vector, ordered on `stream`.
std::vector<int32_t> host_i32(const TensorRef& t, Stream stream = {});
QElem q_elem_of(DType t);
int cpu_threads();
// f32/f16/bf16 tensor of `ndim` dims with a contiguous last dim and non-negative strides.
void check_float_tensor(const char* op, const char* name, const TensorRef& t, int ndim);
// Validate the pools, scales, positions and valid arrays of `kv` against head_dim and the head
// count (after ops::attention_cannot_read, which owns the element-type and head-dim rule); fill
// the page part of p.
void check_pools(const char* op, const PagedKV& kv, Device dev, int64_t head_dim, int64_t n_q_heads,
                 PagedAttentionParams& p);

}  // namespace kvcore::ops::attn
