// Every layer's pending rotation of a CPU PagedCache in one pass (Highway, every target
// of simd_config.hpp): f32 / f16 / bf16 / Fp8 / Dsv4Row pools sharing one table, the
// bytes of kv_rotate_blocks' SIMD path applied layer by layer.
#pragma once
#include "ops/paged_rotate.hpp"

namespace kvcore::ops::cpu {
inline bool paged_rotate_layers_cpu_serves(KvFormat f) {
  return f == KvFormat::F32 || f == KvFormat::F16 || f == KvFormat::BF16 || f == KvFormat::Fp8 ||
         f == KvFormat::Dsv4Row;
}
void paged_rotate_layers_simd(const PagedRotateParams& p);
}  // namespace kvcore::ops::cpu
