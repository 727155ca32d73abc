// Parameters of the one-launch store of every layer's K and V rows (ops/kv_store_layers.hpp),
// shared by the entry point (src/ops/kv_store_layers.cpp) and the CUDA kernel
// (src/cuda/kv_store_layers.cu). The entry point validates each layer as kv_store() would and
// builds these only when every layer has the same shapes and formats (one_launch_params()).
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "kvcore/dtype.hpp"
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

namespace ops {
// The parameters of one launch over layers [first, first + count) of checked per-layer stores
// (k[l], v[l]: what kv_store_checked returned for layer l; v empty without V), or nothing when
// the one-launch kernel cannot take them (then each layer is stored by kv_store's kernels).
// k_layer_stride, v_layer_stride: elements between consecutive layers of the sources.
std::optional<KvStoreLayersParams> one_launch_params(std::span<const KvStoreParams> k, std::span<const KvStoreParams> v,
                                                     int64_t k_layer_stride, int64_t v_layer_stride, int32_t first,
                                                     int32_t count);
}  // namespace ops

namespace ops::cuda {
void kv_store_layers(const KvStoreLayersParams& p, Stream stream);
}  // namespace ops::cuda

}  // namespace kvcore
