// kv_store_layers: one decode step's K and V rows of every layer stored in one pass (one CUDA
// launch per kMaxLayersPerLaunch layers). It computes exactly what a kv_store() call per layer
// and per K / V would (same bytes), without paying a launch per layer: a step's rows of one
// layer are a few KB, so per-layer launches are bound by launch latency, not by memory.
//
// Thread safety: as kv_store's.
#pragma once
#include <cstdint>
#include <span>

#include "kvcore/math/rope.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// Layers one CUDA launch stores (the pools' addresses travel in the kernel's parameters).
constexpr int32_t kKvStoreLayersPerLaunch = 64;

// For every layer l: kv_store(k[l], slots, k_pools[l], maybe_positions, maybe_rope) and, when
// v_pools is not empty, kv_store(v[l], slots, v_pools[l], {}, nullptr).
//   k:       [n_layers, n_tokens, n_heads, head_dim] f32, f16 or bf16 (any strides, last stride 1)
//   v:       [n_layers, n_tokens, n_heads, v_head_dim] (empty when v_pools is empty)
//   slots:   i32 [n_tokens] cell ids, shared by every layer (negative: skip the token)
//   k_pools, v_pools: one pool per layer, all of one format, head dim and shape (v_pools may be empty;
//                    a pool laid out otherwise than the part's first is refused, naming it)
//   maybe_positions, maybe_rope: as kv_store's, one table for every layer's K
// Every argument is checked before anything is written: a refused call changes nothing.
void kv_store_layers(const TensorRef& k, const TensorRef& v, const TensorRef& slots, std::span<const KvPool> k_pools,
                     std::span<const KvPool> v_pools, const TensorRef& maybe_positions,
                     const math::RopeTable* maybe_rope, Stream stream = {});

}  // namespace kvcore
