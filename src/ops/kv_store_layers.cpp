// kv_store_layers entry point: check every layer as kv_store() would (before anything is
// written), then store every layer in one launch per kMaxLayers layers where the shapes allow,
// else layer by layer through kv_store's kernels (same bytes either way).
#include "kvcore/ops/kv_store_layers.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/checks.hpp"
#include "ops/kv_store_layers_params.hpp"

namespace kvcore {

namespace {

TensorRef layer_of(const TensorRef& t, int64_t l) {
  const int64_t shape[3] = {t.size(1), t.size(2), t.size(3)};
  const int64_t strides[3] = {t.stride(1), t.stride(2), t.stride(3)};
  char* base = static_cast<char*>(t.data()) + l * t.stride(0) * static_cast<int64_t>(t.element_size());
  return TensorRef(base, t.dtype(), t.device(), 3, shape, strides);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t src_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// Do all layers' stores of one part (K or V) share what the one-launch kernel assumes?
bool uniform(std::span<const KvStoreParams> ps, int32_t first, int32_t count) {
  const KvStoreParams& a = ps[first];
  for (int32_t l = first; l < first + count; ++l) {
    const KvStoreParams& b = ps[l];
    if (b.format != a.format || b.head_dim != a.head_dim || b.row_width != a.row_width || b.n_heads != a.n_heads ||
        b.num_cells != a.num_cells || b.src_dtype != a.src_dtype || b.src_token_stride != a.src_token_stride ||
        b.src_head_stride != a.src_head_stride || b.maybe_angles != nullptr)
      return false;
    if (!aligned16(b.pool) || !aligned16(b.src)) return false;
    if (b.format == KvFormat::Fp8 && b.maybe_scales == nullptr) return false;
  }
  return true;
}

// Can rows of this part be split into 16-dim units (one thread each)?
bool unit_ok(const KvStoreParams& p, int64_t layer_stride) {
  if (p.format == KvFormat::Dsv4Row || p.head_dim % 16 != 0) return false;
  if (p.format == KvFormat::Fp8) {  // a row's units must lie in one warp, groups of 4 or 8 lanes
    const int32_t d = p.head_dim;
    if (d != 64 && d != 128 && d != 256 && d != 512) return false;
  }
  const int64_t es = src_bytes(p.src_dtype);
  return (p.src_token_stride * es) % 16 == 0 && (p.src_head_stride * es) % 16 == 0 && (layer_stride * es) % 16 == 0;
}

}  // namespace

namespace ops {

std::optional<KvStoreLayersParams> one_launch_params(std::span<const KvStoreParams> k, std::span<const KvStoreParams> v,
                                                     int64_t k_layer_stride, int64_t v_layer_stride, int32_t first,
                                                     int32_t count) {
  if (count <= 0 || count > KvStoreLayersParams::kMaxLayers) return std::nullopt;
  const bool has_v = !v.empty();
  if (!uniform(k, first, count) || !unit_ok(k[first], k_layer_stride)) return std::nullopt;
  if (has_v && (!uniform(v, first, count) || !unit_ok(v[first], v_layer_stride))) return std::nullopt;
  const KvStoreParams& k0 = k[first];
  if (has_v && (v[first].n_heads != k0.n_heads || v[first].num_cells != k0.num_cells || v[first].maybe_positions))
    return std::nullopt;
  const bool any_fp8 = k0.format == KvFormat::Fp8 || (has_v && v[first].format == KvFormat::Fp8);
  // FP8 group shuffles need every row to start at a multiple of its unit count: equal K and V dims.
  if (any_fp8 && has_v && v[first].head_dim != k0.head_dim) return std::nullopt;
  KvStoreLayersParams p;
  if (k0.maybe_positions && k0.rope.layout.n_rot > 0) {
    const math::RopeLayout& l = k0.rope.layout;
    if (l.first_dim != 0 || l.n_rot != k0.head_dim) return std::nullopt;  // whole-row rotation only
    if (!l.interleaved && k0.format == KvFormat::Fp8 && k0.head_dim < 128) return std::nullopt;
    p.rot = l.interleaved ? KvLayersRot::Interleaved : KvLayersRot::Neox;
    p.maybe_positions = k0.maybe_positions;
    p.rope = k0.rope;
  }
  // Units of one token: one CTA row of the grid must stay within 65535 CTAs of 256 threads.
  const int64_t units = static_cast<int64_t>(count) * k0.n_heads *
                        (k0.head_dim / 16 + (has_v ? v[first].head_dim / 16 : 0));
  if (units > int64_t{65535} * 256) return std::nullopt;
  p.k_src = k0.src;
  p.k_layer_stride = k_layer_stride;
  p.k_token_stride = k0.src_token_stride;
  p.k_head_stride = k0.src_head_stride;
  p.k_dtype = k0.src_dtype;
  p.k_format = k0.format;
  p.k_dim = k0.head_dim;
  if (has_v) {
    const KvStoreParams& v0 = v[first];
    p.v_src = v0.src;
    p.v_layer_stride = v_layer_stride;
    p.v_token_stride = v0.src_token_stride;
    p.v_head_stride = v0.src_head_stride;
    p.v_dtype = v0.src_dtype;
    p.v_format = v0.format;
    p.v_dim = v0.head_dim;
  }
  p.n_layers = count;
  p.n_tokens = k0.n_tokens;
  p.n_heads = k0.n_heads;
  p.any_fp8 = any_fp8 ? 1 : 0;
  p.num_cells = k0.num_cells;
  p.slots = k0.slots;
  for (int32_t i = 0; i < count; ++i) {
    p.k_pool[i] = k[first + i].pool;
    p.k_scales[i] = k[first + i].maybe_scales;
    if (has_v) {
      p.v_pool[i] = v[first + i].pool;
      p.v_scales[i] = v[first + i].maybe_scales;
    }
  }
  return p;
}

}  // namespace ops

void kv_store_layers(const TensorRef& k, const TensorRef& v, const TensorRef& slots, std::span<const KvPool> k_pools,
                     std::span<const KvPool> v_pools, const TensorRef& maybe_positions,
                     const math::RopeTable* maybe_rope, Stream stream) {
  constexpr std::string_view op = "kv_store_layers";
  checks::not_null(op, "k", k);
  checks::ndim_is(op, "k", k, 4);
  const int64_t n_layers = k.size(0);
  require_arg(static_cast<int64_t>(k_pools.size()) == n_layers, op, ": k has ", n_layers, " layers, k_pools has ",
              k_pools.size());
  checks::non_negative_strides(op, "k", k);
  const bool has_v = !v_pools.empty();
  if (has_v) {
    checks::not_null(op, "v", v);
    checks::ndim_is(op, "v", v, 4);
    require_arg(static_cast<int64_t>(v_pools.size()) == n_layers, op, ": k has ", n_layers, " layers, v_pools has ",
                v_pools.size());
    checks::size_is(op, "v", v, 1, k.size(1));
    checks::non_negative_strides(op, "v", v);
  } else {
    require_arg(v.empty() || v.numel() == 0, op, ": v given without v_pools: ", described(v));
  }
  // Every layer is checked before anything runs: a refused call writes nothing.
  std::vector<KvStoreParams> kp(static_cast<size_t>(n_layers)), vp(has_v ? static_cast<size_t>(n_layers) : 0);
  if (has_v) checks::same_device(op, "v", v, "k", k);
  for (int64_t l = 0; l < n_layers; ++l) {
    const char* part = "k";
    try {  // the per-layer checks name the argument; the layer and part are added here
      kp[l] = ops::kv_store_checked(op, layer_of(k, l), slots, k_pools[l], maybe_positions, maybe_rope, {});
      part = "v";
      if (has_v) vp[l] = ops::kv_store_checked(op, layer_of(v, l), slots, v_pools[l], {}, nullptr, {});
    } catch (const Error& e) {
      throw Error(e.code(), std::string(e.what()) + " (layer " + std::to_string(l) + ", " + part + ")");
    }
  }
  if (n_layers == 0 || k.size(1) == 0) return;
  const Device dev = k.device();
  std::vector<float> angles;  // CPU: the K rows' cos and sin, computed once for every layer
  if (dev.is_cpu() && n_layers > 1 && kp[0].maybe_positions && kp[0].rope.layout.n_pairs() > 0) {
    KvAnglesParams a;
    a.positions = kp[0].maybe_positions;
    a.n = kp[0].n_tokens;
    a.rope = kp[0].rope;
    angles.resize(static_cast<size_t>(a.n) * a.rope.layout.n_pairs() * 2);
    a.out = angles.data();
    cpu::kv_rope_angles(a);
    for (KvStoreParams& p : kp) p.maybe_angles = angles.data();
  }
  for (int32_t first = 0; first < n_layers; first += KvStoreLayersParams::kMaxLayers) {
    const int32_t count = static_cast<int32_t>(std::min<int64_t>(KvStoreLayersParams::kMaxLayers, n_layers - first));
    if (dev.is_cuda()) {
#if KVCORE_WITH_CUDA
      const std::optional<KvStoreLayersParams> p =
          ops::one_launch_params(kp, vp, k.stride(0), has_v ? v.stride(0) : 0, first, count);
      if (p) {
        ops::cuda::kv_store_layers(*p, stream);
        continue;
      }
#endif
    }
    for (int32_t l = first; l < first + count; ++l) {
      ops::kv_store_dispatch(kp[l], dev, stream);
      if (has_v) ops::kv_store_dispatch(vp[l], dev, stream);
    }
  }
}

}  // namespace kvcore
