// kv_store_layers entry point: check every layer as kv_store() would (before anything is
// written), then store every layer in one launch per kMaxLayers layers where the shapes allow,
// else layer by layer through kv_store's kernels (same bytes either way).
#include "kvcore/ops/kv_store_layers.hpp"

#include <algorithm>
#include <cstdint>
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

bool same_shape(const TensorRef& a, const TensorRef& b) {
  if (a.ndim() != b.ndim() || a.dtype() != b.dtype() || a.device() != b.device()) return false;
  for (int i = 0; i < a.ndim(); ++i)
    if (a.size(i) != b.size(i)) return false;
  return true;
}

// Pool l of a part must be laid out as pool 0 (checked in full by kv_store's checks): the same
// format, head dim, data and scales shapes, contiguous, with its data. O(1) per layer, no copies.
void check_like_first(std::string_view op, std::string_view part, std::span<const KvPool> pools, size_t l) {
  const KvPool& a = pools[0];
  const KvPool& b = pools[l];
  const bool ok = b.format == a.format && b.head_dim == a.head_dim && same_shape(b.data, a.data) &&
                  b.data.is_contiguous() && b.data.data() != nullptr &&
                  (!kv_format_has_scales(a.format) ||
                   (same_shape(b.scales, a.scales) && b.scales.is_contiguous() && b.scales.data() != nullptr));
  if (!ok)
    require_arg(false, op, ": ", part, "[", l, "] must be laid out as ", part, "[0] (", kv_format_name(a.format),
                ", head_dim ", a.head_dim, ", data ", described(a.data), "), got ", kv_format_name(b.format),
                ", head_dim ", b.head_dim, ", data ", described(b.data), ", scales ", described(b.scales));
}

// Can rows of this part be split into 16-dim units (one thread each)?
bool unit_ok(const KvStoreParams& p, int64_t layer_stride) {
  if (p.format == KvFormat::Dsv4Row || p.head_dim % 16 != 0) return false;
  if (p.format == KvFormat::Fp8) {  // a row's units must lie in one warp, groups of 4 or 8 lanes
    const int32_t d = p.head_dim;
    if (d != 64 && d != 128 && d != 256 && d != 512) return false;
  }
  const int64_t es = src_bytes(p.src_dtype);
  return aligned16(p.src) && (p.src_token_stride * es) % 16 == 0 && (p.src_head_stride * es) % 16 == 0 &&
         (layer_stride * es) % 16 == 0 && p.maybe_angles == nullptr;
}

// Layer l's store: layer 0's checked parameters with that layer's source and pool.
KvStoreParams layer_params(const KvStoreParams& first, const KvPool& pool, int64_t layer_stride, int64_t l) {
  KvStoreParams p = first;
  p.src = static_cast<const char*>(first.src) + l * layer_stride * src_bytes(first.src_dtype);
  p.pool = pool.data.data();
  p.maybe_scales = kv_format_has_scales(pool.format) ? pool.scales.data_as<uint8_t>() : nullptr;
  return p;
}

}  // namespace

namespace ops {

std::optional<KvStoreLayersParams> one_launch_params(const KvStoreParams& k0, const KvStoreParams* maybe_v0,
                                                     std::span<const KvPool> k_pools, std::span<const KvPool> v_pools,
                                                     int64_t k_layer_stride, int64_t v_layer_stride, int32_t first,
                                                     int32_t count) {
  if (count <= 0 || count > KvStoreLayersParams::kMaxLayers) return std::nullopt;
  const bool has_v = maybe_v0 != nullptr;
  if (!unit_ok(k0, k_layer_stride) || (has_v && !unit_ok(*maybe_v0, v_layer_stride))) return std::nullopt;
  if (has_v && (maybe_v0->n_heads != k0.n_heads || maybe_v0->num_cells != k0.num_cells || maybe_v0->maybe_positions))
    return std::nullopt;
  const bool any_fp8 = k0.format == KvFormat::Fp8 || (has_v && maybe_v0->format == KvFormat::Fp8);
  // FP8 group shuffles need every row to start at a multiple of its unit count: equal K and V dims.
  if (any_fp8 && has_v && maybe_v0->head_dim != k0.head_dim) return std::nullopt;
  for (int32_t l = first; l < first + count; ++l)
    if (!aligned16(k_pools[l].data.data()) || (has_v && !aligned16(v_pools[l].data.data()))) return std::nullopt;
  KvStoreLayersParams p;
  if (k0.maybe_positions && k0.rope.layout.n_rot > 0) {
    const math::RopeLayout& l = k0.rope.layout;
    if (l.first_dim != 0 || l.n_rot != k0.head_dim) return std::nullopt;  // whole-row rotation only
    if (!l.interleaved && k0.format == KvFormat::Fp8 && k0.head_dim < 128) return std::nullopt;
    p.rot = l.interleaved ? KvLayersRot::Interleaved : KvLayersRot::Neox;
    p.maybe_positions = k0.maybe_positions;
    p.rope = k0.rope;
  }
  // Units of one token: one grid row of at most 65535 CTAs of 256 threads.
  const int64_t units =
      static_cast<int64_t>(count) * k0.n_heads * (k0.head_dim / 16 + (has_v ? maybe_v0->head_dim / 16 : 0));
  if (units > int64_t{65535} * 256) return std::nullopt;
  const int64_t ke = src_bytes(k0.src_dtype);
  p.k_src = static_cast<const char*>(k0.src) + first * k_layer_stride * ke;
  p.k_layer_stride = k_layer_stride;
  p.k_token_stride = k0.src_token_stride;
  p.k_head_stride = k0.src_head_stride;
  p.k_dtype = k0.src_dtype;
  p.k_format = k0.format;
  p.k_dim = k0.head_dim;
  if (has_v) {
    const KvStoreParams& v0 = *maybe_v0;
    p.v_src = static_cast<const char*>(v0.src) + first * v_layer_stride * src_bytes(v0.src_dtype);
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
    const KvPool& kp = k_pools[first + i];
    p.k_pool[i] = kp.data.data();
    p.k_scales[i] = kv_format_has_scales(kp.format) ? kp.scales.data_as<uint8_t>() : nullptr;
    if (has_v) {
      const KvPool& vp = v_pools[first + i];
      p.v_pool[i] = vp.data.data();
      p.v_scales[i] = kv_format_has_scales(vp.format) ? vp.scales.data_as<uint8_t>() : nullptr;
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
  require_arg(n_layers > 0, op, ": k has no layers: ", described(k));
  require_arg(static_cast<int64_t>(k_pools.size()) == n_layers, op, ": k has ", n_layers, " layers, k_pools has ",
              k_pools.size());
  checks::non_negative_strides(op, "k", k);
  const bool has_v = !v_pools.empty();
  if (has_v) {
    checks::not_null(op, "v", v);
    checks::ndim_is(op, "v", v, 4);
    require_arg(static_cast<int64_t>(v_pools.size()) == n_layers, op, ": k has ", n_layers, " layers, v_pools has ",
                v_pools.size());
    checks::size_is(op, "v", v, 0, n_layers);
    checks::size_is(op, "v", v, 1, k.size(1));
    checks::non_negative_strides(op, "v", v);
    checks::same_device(op, "v", v, "k", k);
  } else {
    require_arg(v.empty() || v.numel() == 0, op, ": v given without v_pools: ", described(v));
  }
  // Layer 0 gets kv_store's every check; the other layers' pools must be laid out as its own
  // (and their sources are slices of the same tensors). All before anything runs: a refused
  // call writes nothing.
  const KvStoreParams k0 = ops::kv_store_checked(op, layer_of(k, 0), slots, k_pools[0], maybe_positions, maybe_rope, {});
  KvStoreParams v0;
  if (has_v) v0 = ops::kv_store_checked(op, layer_of(v, 0), slots, v_pools[0], {}, nullptr, {});
  for (size_t l = 1; l < k_pools.size(); ++l) {
    check_like_first(op, "k_pools", k_pools, l);
    if (has_v) check_like_first(op, "v_pools", v_pools, l);
  }
  if (k.size(1) == 0) return;
  const Device dev = k.device();
  const int64_t k_stride = k.stride(0), v_stride = has_v ? v.stride(0) : 0;
  std::vector<float> angles;  // CPU: the K rows' cos and sin, computed once for every layer
  KvStoreParams k_first = k0;
  if (dev.is_cpu() && n_layers > 1 && k0.maybe_positions && k0.rope.layout.n_pairs() > 0) {
    KvAnglesParams a;
    a.positions = k0.maybe_positions;
    a.n = k0.n_tokens;
    a.rope = k0.rope;
    angles.resize(static_cast<size_t>(a.n) * a.rope.layout.n_pairs() * 2);
    a.out = angles.data();
    cpu::kv_rope_angles(a);
    k_first.maybe_angles = angles.data();
  }
  for (int32_t first = 0; first < n_layers; first += KvStoreLayersParams::kMaxLayers) {
    const int32_t count = static_cast<int32_t>(std::min<int64_t>(KvStoreLayersParams::kMaxLayers, n_layers - first));
    if (dev.is_cuda()) {
#if KVCORE_WITH_CUDA
      const std::optional<KvStoreLayersParams> p =
          ops::one_launch_params(k0, has_v ? &v0 : nullptr, k_pools, v_pools, k_stride, v_stride, first, count);
      if (p) {
        ops::cuda::kv_store_layers(*p, stream);
        continue;
      }
#endif
    }
    for (int32_t l = first; l < first + count; ++l) {
      ops::kv_store_dispatch(layer_params(k_first, k_pools[l], k_stride, l), dev, stream);
      if (has_v) ops::kv_store_dispatch(layer_params(v0, v_pools[l], v_stride, l), dev, stream);
    }
  }
}

}  // namespace kvcore
