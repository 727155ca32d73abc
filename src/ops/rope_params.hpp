// Kernel parameters of rope_apply, shared by the CPU and CUDA backends. Filled and
// validated by src/ops/rope.cpp; kernels trust them.
#pragma once
#include <cstdint>

#include "kvcore/dtype.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/stream.hpp"

namespace kvcore {

struct RopeApplyParams {
  const void* x = nullptr;          // [tokens, heads, head_dim] of `dtype`; strides below, last dim contiguous
  void* out = nullptr;              // [tokens, heads, head_dim] of `dtype`; == x when in_place
  const void* positions = nullptr;  // [tokens] of `pos_dtype` (i32 or i64), stride pos_stride
  int64_t tokens = 0;
  int64_t heads = 0;
  int32_t head_dim = 0;
  int64_t x_stride_token = 0, x_stride_head = 0;      // elements
  int64_t out_stride_token = 0, out_stride_head = 0;  // elements
  int64_t pos_stride = 1;                             // elements
  DType dtype = DType::F32;
  DType pos_dtype = DType::I32;
  bool in_place = true;    // true: only the rotated dims are read and written
  float magnitude = 1.0f;  // multiplies cos and sin: the attention factor, or 1
  math::RopeTable table;   // layout fits head_dim; by value, so kernels need no table in memory
};

namespace cpu {
void rope_apply(const RopeApplyParams& p);
}
namespace ops::cuda {
void rope_apply(const RopeApplyParams& p, int device, Stream stream);
}

}  // namespace kvcore
