// Parameters of the one-launch store of every layer's K and V rows (ops/kv_store_layers.hpp),
// shared by the entry point (src/ops/kv_store_layers.cpp) and the CUDA kernel
// (src/cuda/kv_store_layers.cu). The entry point validates layer 0 as kv_store() would and every
// other layer's pools against layer 0's, then builds these where the kernel takes the shapes
// (one_launch_params()).
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "kvcore/dtype.hpp"
#include "kvcore/math/hd.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/ops/kv_store_layers.hpp"
#include "ops/kv_store_params.hpp"

namespace kvcore {

// Rows are split into units of 16 dims (one thread each); `Rot` says how a rotated K row's
// 16 dims are chosen: NeoX pairs (i, i + D/2) take dims [8u, 8u + 8) and [D/2 + 8u, D/2 + 8u + 8),
// interleaved pairs and unrotated rows take [16u, 16u + 16).
enum class KvLayersRot : int32_t { None = 0, Neox = 1, Interleaved = 2 };

struct KvStoreLayersParams {
  static constexpr int32_t kMaxLayers = kKvStoreLayersPerLaunch;
  const void* k_src = nullptr;  // layer l, token t, head h at k_src + l * k_layer_stride + t * k_token_stride + h * k_head_stride
  const void* v_src = nullptr;
  int64_t k_layer_stride = 0, k_token_stride = 0, k_head_stride = 0;  // elements
  int64_t v_layer_stride = 0, v_token_stride = 0, v_head_stride = 0;
  DType k_dtype = DType::F16, v_dtype = DType::F16;
  KvFormat k_format = KvFormat::F16, v_format = KvFormat::F16;
  KvLayersRot rot = KvLayersRot::None;
  int32_t n_layers = 0, n_tokens = 0, n_heads = 0;
  int32_t k_dim = 0, v_dim = 0;  // v_dim 0: no V
  int32_t any_fp8 = 0;           // some pool is Fp8: every lane takes part in the group amax shuffles
  int64_t num_cells = 0;
  const int32_t* slots = nullptr;
  const int32_t* maybe_positions = nullptr;  // null: K is not rotated
  math::RopeTable rope{};
  void* k_pool[kMaxLayers] = {};
  uint8_t* k_scales[kMaxLayers] = {};
  void* v_pool[kMaxLayers] = {};
  uint8_t* v_scales[kMaxLayers] = {};
};

// Which 16 dims of which row thread `idx` of a token's units stores: per layer its K rows then
// its V rows, each row split into dim / 16 units, the unit fastest. d0 and d1 are the first dims
// of its two 8-dim chunks. Host and device (the CUDA kernel uses it; a CPU test checks that every
// dim of every row is covered once and that FP8 rows keep their lane groups inside one warp).
struct KvLayersUnit {
  bool active = false;  // idx < the token's units
  bool is_k = true;
  int32_t layer = 0, head = 0, u = 0, dim = 0, d0 = 0, d1 = 0;
};

KVCORE_HD KvLayersUnit locate_unit(const KvStoreLayersParams& p, int64_t idx) {
  KvLayersUnit w;
  const int32_t rk = p.k_dim / 16, rv = p.v_dim / 16;
  const int32_t per_layer = p.n_heads * (rk + rv);
  w.active = idx < static_cast<int64_t>(p.n_layers) * per_layer;
  // 32-bit division (a 64-bit one is a long subroutine on a GPU): a token's units fit in one grid
  // row of at most 65535 x 256 (one_launch_params), so an active idx does too.
  const int32_t i = w.active ? static_cast<int32_t>(idx) : 0;
  w.layer = i / per_layer;
  int32_t r = i - w.layer * per_layer;
  w.is_k = r < p.n_heads * rk;
  if (!w.is_k) r -= p.n_heads * rk;
  const int32_t units = w.is_k ? rk : rv;
  w.head = r / (units > 0 ? units : 1);
  w.u = r - w.head * units;
  w.dim = w.is_k ? p.k_dim : p.v_dim;
  const bool neox = w.is_k && p.rot == KvLayersRot::Neox;
  w.d0 = neox ? 8 * w.u : 16 * w.u;
  w.d1 = neox ? w.dim / 2 + 8 * w.u : w.d0 + 8;
  return w;
}

// Units of one token (threads of its grid row, rounded up to whole CTAs by the launch).
KVCORE_HD int64_t token_units(const KvStoreLayersParams& p) {
  return static_cast<int64_t>(p.n_layers) * p.n_heads * (p.k_dim / 16 + p.v_dim / 16);
}

namespace ops {
// The parameters of one launch over layers [first, first + count), or nothing when the
// one-launch kernel cannot take them (then each layer is stored by kv_store's kernels).
// k0, maybe_v0: the checked stores of layer 0 (kv_store_checked; maybe_v0 null without V); the
// pools of every layer are laid out as layer 0's; k_layer_stride, v_layer_stride: elements
// between consecutive layers of the sources.
std::optional<KvStoreLayersParams> one_launch_params(const KvStoreParams& k0, const KvStoreParams* maybe_v0,
                                                     std::span<const KvPool> k_pools, std::span<const KvPool> v_pools,
                                                     int64_t k_layer_stride, int64_t v_layer_stride, int32_t first,
                                                     int32_t count);
}  // namespace ops

namespace ops::cuda {
void kv_store_layers(const KvStoreLayersParams& p, Stream stream);
}  // namespace ops::cuda

}  // namespace kvcore
