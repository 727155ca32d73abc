// What kvcore's paged attention can read, on one device: the one rule that PagedCache checks at
// construction and the attention plan checks at planning, so a cache never accepts pages its
// attention would refuse later. Widen it here when a backend learns a new shape.
#pragma once
#include <cstdint>
#include <string>

#include "kvcore/device.hpp"
#include "kvcore/dtype.hpp"

namespace kvcore::ops {

// Pages as attention sees them: element types of K and V and their head dims.
struct AttentionPagesFormat {
  DType k, v;               // f32, f16, bf16 or e4m3
  int64_t head_dim, v_head_dim;
};

// Empty when attention on `device` reads such pages; else why not, naming the field and its
// value (callers prefix the op or config name).
//   - element types: f32, f16, bf16 or e4m3, K and V of one type (the kernels read both
//     with one element decoder);
//   - head dims: 64, 128, 256 or 512, V's equal to K's (the kernels keep one row width).
// The rule is the same on the CPU and on CUDA today.
std::string attention_cannot_read(Device device, const AttentionPagesFormat& f);

}  // namespace kvcore::ops
