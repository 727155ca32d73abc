// Plain parameter structs of the kv_store family, shared by the CPU and CUDA
// backends. The entry point (src/ops/kv_store.cpp) validates; kernels trust.
#pragma once
#include <cstdint>
#include <string_view>

#include "kvcore/dtype.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/ops/kv_store.hpp"

namespace kvcore {

struct KvStoreParams {
  const void* src = nullptr;         // [n_tokens, n_heads, head_dim] of src_dtype, strides below
  int64_t src_token_stride = 0;      // elements
  int64_t src_head_stride = 0;       // elements
  DType src_dtype = DType::F32;      // F32, F16 or BF16
  const int32_t* slots = nullptr;    // [n_tokens] cell ids; < 0 or >= num_cells: skip
  const int32_t* maybe_positions = nullptr;  // [n_tokens]; null: no rotation
  void* pool = nullptr;              // [num_cells, n_heads, row_width] of the format's dtype
  uint8_t* maybe_scales = nullptr;   // Fp8: [num_cells, n_heads, head_dim / 64]
  KvFormat format = KvFormat::F16;
  int32_t n_tokens = 0, n_heads = 0, head_dim = 0, row_width = 0;
  int64_t num_cells = 0;
  math::RopeTable rope{};            // used when maybe_positions is set
  const float* maybe_angles = nullptr;  // [n_tokens, rope.n_pairs, 2] cos, sin (unscaled); null: computed
};

struct KvAnglesParams {
  const int32_t* positions = nullptr;  // [n]
  float* out = nullptr;                // [n, rope.n_pairs, 2]
  int32_t n = 0;
  math::RopeTable rope{};
};

struct KvRotateParams {
  void* pool = nullptr;              // [num_blocks * block_size, n_heads, row_width]
  uint8_t* maybe_scales = nullptr;   // Fp8: [num_blocks * block_size, n_heads, head_dim / 64]
  KvFormat format = KvFormat::F16;
  int32_t n_heads = 0, head_dim = 0, row_width = 0, block_size = 0;
  const int32_t* blocks = nullptr;   // [n_blocks]
  int32_t n_blocks = 0;
  const int32_t* cell_delta = nullptr;  // [num_blocks * block_size]
  math::RopeTable rope{};
};

namespace ops {
// kv_store's checks (errors name `op`); returns the call's parameters. Changes nothing.
KvStoreParams kv_store_checked(std::string_view op, const TensorRef& src, const TensorRef& slots, const KvPool& pool,
                               const TensorRef& maybe_positions, const math::RopeTable* maybe_rope,
                               const TensorRef& maybe_angles);
// Runs checked parameters on `device` (nothing for zero tokens).
void kv_store_dispatch(const KvStoreParams& p, Device device, Stream stream);
}  // namespace ops

namespace cpu {
void kv_store(const KvStoreParams& p);
void kv_rope_angles(const KvAnglesParams& p);
void kv_rotate_blocks(const KvRotateParams& p);
}  // namespace cpu

namespace ops::cuda {
void kv_store(const KvStoreParams& p, Stream stream);
void kv_rope_angles(const KvAnglesParams& p, Stream stream);
void kv_rotate_blocks(const KvRotateParams& p, Stream stream);
}  // namespace ops::cuda

}  // namespace kvcore
