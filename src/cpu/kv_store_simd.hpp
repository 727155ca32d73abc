// SIMD paths of the kv_store family on the CPU (Highway, every target of
// simd_config.hpp): the same bytes as the scalar kernels in kv_store.cpp.
#pragma once
#include "ops/kv_store_params.hpp"

namespace kvcore::ops::cpu {
void kv_store_simd(const KvStoreParams& p);
void kv_rotate_blocks_simd(const KvRotateParams& p);
void kv_rope_angles_simd(const KvAnglesParams& p);
}  // namespace kvcore::ops::cpu
