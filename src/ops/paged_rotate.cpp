// kv_rotate_blocks_layers: every layer's pending rotation in one launch where
// the layers allow it (ops/paged_rotate.hpp), on the CPU in one pass that computes each
// cell's cos/sin once for all layers (cpu/paged_rotate_simd.hpp), else kv_rotate_blocks
// per layer.
#include "ops/paged_rotate.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/paged_rotate_simd.hpp"
#include "cpu/simd_targets.hpp"
#include "ops/checks.hpp"
#include "ops/kv_rotate_checks.hpp"
#include "ops/kv_store_params.hpp"

namespace kvcore {

namespace {

bool same_table(const math::RopeTable& a, const math::RopeTable& b) {
  const math::RopeLayout &x = a.layout, &y = b.layout;
  if (x.n_rot != y.n_rot || x.first_dim != y.first_dim || x.interleaved != y.interleaved) return false;
  return std::memcmp(a.freq, b.freq, sizeof(float) * static_cast<size_t>(std::max(x.n_pairs(), 0))) == 0;
}

// The params kv_rotate_blocks would build for one layer (only what vec_rotate_ok reads).
KvRotateParams layer_params(const KvPool& pool, const math::RopeTable& rope) {
  KvRotateParams p;
  p.pool = pool.data.data();
  p.format = pool.format;
  p.head_dim = pool.head_dim;
  p.row_width = kv_row_width(pool.format, pool.head_dim);
  p.rope = rope;
  return p;
}

// Pools of one format and shape on one device, contiguous, with one table whose layout
// fits the head (else kv_rotate_blocks reports it).
bool layers_alike(std::span<const KvPool> pools, std::span<const math::RopeTable> ropes) {
  if (pools.empty() || pools.size() != ropes.size()) return false;
  const KvPool& p0 = pools[0];
  for (size_t l = 0; l < pools.size(); ++l) {
    const KvPool& p = pools[l];
    if (p.format != p0.format || p.head_dim != p0.head_dim || p.data.ndim() != 4 || p0.data.ndim() != 4) return false;
    for (int d = 0; d < 4; ++d)
      if (p.data.size(d) != p0.data.size(d)) return false;
    if (p.data.device() != p0.data.device() || !p.data.is_contiguous() || p.data.dtype() != kv_format_dtype(p.format))
      return false;
    if (!same_table(ropes[l], ropes[0])) return false;
    const math::RopeLayout& rl = ropes[l].layout;
    if (rl.first_dim < 0 || rl.first_dim + rl.n_rot > p.head_dim) return false;  // kv_rotate_blocks reports it
  }
  return true;
}

}  // namespace

// The CPU's pass over every layer at once (cpu/paged_rotate_simd.hpp): SIMD on, a format it
// serves, pools of one shape with one table (each pool and table has passed kv_rotate_blocks'
// checks before: check_rotate_pool).
bool paged_rotate_cpu_ok(std::span<const KvPool> pools, std::span<const math::RopeTable> ropes) {
  return !pools.empty() && pools[0].data.device().is_cpu() && ops::cpu::simd_on() &&
         ops::cpu::paged_rotate_layers_cpu_serves(pools[0].format) && layers_alike(pools, ropes);
}

bool paged_rotate_fused_ok(std::span<const KvPool> pools, std::span<const math::RopeTable> ropes) {
  if (pools.empty() || !pools[0].data.device().is_cuda() || !layers_alike(pools, ropes)) return false;
  for (size_t l = 0; l < pools.size(); ++l)
    if (!kvvec::vec_rotate_ok(layer_params(pools[l], ropes[l]))) return false;
  return true;
}

void kv_rotate_blocks_layers(std::span<const KvPool> pools, const TensorRef& blocks, const TensorRef& cell_delta,
                             std::span<const math::RopeTable> ropes, Stream stream) {
  constexpr std::string_view op = "kv_rotate_blocks_layers";
  require_arg(pools.size() == ropes.size(), op, ": ", pools.size(), " pools but ", ropes.size(), " rope tables");
  if (pools.empty()) return;
  // every layer checked before any is rotated: bad input changes nothing
  for (size_t l = 0; l < pools.size(); ++l) ops::check_rotate_pool(op, pools[l], ropes[l]);
  const bool cpu = paged_rotate_cpu_ok(pools, ropes);
  if (!cpu && !paged_rotate_fused_ok(pools, ropes)) {
    for (const KvPool& p : pools) ops::check_rotate_tables(op, blocks, cell_delta, p.data);
    for (size_t l = 0; l < pools.size(); ++l) kv_rotate_blocks(pools[l], blocks, cell_delta, ropes[l], stream);
    return;
  }
  // The fused path: the checks kv_rotate_blocks makes (pools and tables were compared above).
  const TensorRef& d = pools[0].data;
  ops::check_rotate_tables(op, blocks, cell_delta, d);
  checks::backend_available(op, d.device());
  for (const KvPool& p : pools) require_arg(p.data.data() != nullptr, op, ": a pool has no data pointer");
  if (blocks.size(0) == 0 || ropes[0].layout.n_rot == 0) return;
  PagedRotateParams p;
  p.format = pools[0].format;
  p.n_heads = static_cast<int32_t>(d.size(2));
  p.row_width = kv_row_width(pools[0].format, pools[0].head_dim);
  p.block_size = static_cast<int32_t>(d.size(1));
  p.blocks = blocks.data_as<const int32_t>();
  p.n_blocks = static_cast<int32_t>(blocks.size(0));
  p.cell_delta = cell_delta.data_as<const int32_t>();
  p.rope = ropes[0];
  if (cpu) {
    p.head_dim = pools[0].head_dim;
    for (size_t l0 = 0; l0 < pools.size(); l0 += kRotateMaxLayers) {
      p.n_layers = static_cast<int32_t>(std::min<size_t>(kRotateMaxLayers, pools.size() - l0));
      for (int32_t l = 0; l < p.n_layers; ++l) {
        p.pools[l] = pools[l0 + l].data.data();
        p.scales[l] = kv_format_has_scales(p.format) ? pools[l0 + l].scales.data_as<uint8_t>() : nullptr;
      }
      ops::cpu::paged_rotate_layers_simd(p);
    }
    return;
  }
#if KVCORE_WITH_CUDA
  for (size_t l0 = 0; l0 < pools.size(); l0 += kRotateMaxLayers) {
    p.n_layers = static_cast<int32_t>(std::min<size_t>(kRotateMaxLayers, pools.size() - l0));
    for (int32_t l = 0; l < p.n_layers; ++l) p.pools[l] = pools[l0 + l].data.data();
    ops::cuda::paged_rotate_layers(p, stream);
  }
#else
  (void)p;
  (void)stream;
#endif
}

}  // namespace kvcore
