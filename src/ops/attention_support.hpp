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
//   - head dims: 64, 80, 96, 112, 128, 192, 256 or 512 with V's equal to K's, or K 576 with
//     V 512 (DeepSeek-V2/V3 MLA: latent plus rope dims in K, the latent alone in V); each pair
//     is a CUDA kernel instantiation;
//   - e4m3 pages: head dims that are multiples of 64 (a UE8M0 scale covers 64 values; 80, 96
//     and 112 are refused, also with per-row f32 scales, so that one rule serves both).
// The rule is the same on the CPU and on CUDA.
std::string attention_cannot_read(Device device, const AttentionPagesFormat& f);

}  // namespace kvcore::ops
