// Baselines for the paged shift cases of `kvcore bench paged`, on the same geometry in the
// same run: the seed's algorithm ported (bench/baselines/seed_shift.hpp) and shift_dense
// (kvcore/ops/shift.hpp), each shifting a dense f16 cache [context, n_kv_heads * head_dim]
// per layer. Both come from the shift branch: this file activates itself once they are
// present (__has_include), so it builds before and after the merge.
#if __has_include("bench/baselines/seed_shift.hpp") && __has_include("kvcore/ops/shift.hpp")
#include <cuda_runtime.h>

#include <vector>

#include "bench/baselines/seed_shift.hpp"
#include "bench/paged_bench.hpp"
#include "cuda/common/check.cuh"
#include "kvcore/buffer.hpp"
#include "kvcore/ops/shift.hpp"
#include "kvcore/runtime.hpp"

namespace {

using namespace kvcore;

// Dense per-layer K and V [context, H, D] f16, filled with a non-zero pattern (never time on zeros).
struct DenseCache {
  std::vector<Buffer> k, v;
  DenseCache(const cli::PagedShiftCase& c, Device dev) {
    const size_t bytes = static_cast<size_t>(c.context) * c.n_kv_heads * c.head_dim * 2;
    for (int32_t l = 0; l < c.n_layers; ++l) {
      k.emplace_back(bytes, dev);
      v.emplace_back(bytes, dev);
      fill_bytes(k.back().data(), dev, 0x2a, bytes);
      fill_bytes(v.back().data(), dev, 0x31, bytes);
    }
  }
};

}  // namespace

KVCORE_PAGED_SHIFT_BASELINE(seed_port) {
  DenseCache d(c, opt.device);
  std::vector<baselines::SeedShiftLayer> layers;
  for (int32_t l = 0; l < c.n_layers; ++l) layers.push_back({d.k[l].data(), d.v[l].data()});
  const int64_t new_len = c.context - c.n_discard;
  Buffer scratch(static_cast<size_t>(new_len - c.n_keep) * c.n_kv_heads * c.head_dim * 2, opt.device);
  return opt.time([&](int) {
    baselines::seed_shift_f16(layers.data(), c.n_layers, scratch.data(), static_cast<uint32_t>(c.n_keep),
                              static_cast<uint32_t>(c.n_discard), static_cast<uint32_t>(new_len),
                              static_cast<uint32_t>(c.n_kv_heads), static_cast<uint32_t>(c.head_dim), 500000.0f, nullptr);
  });
}

KVCORE_PAGED_SHIFT_BASELINE(shift_dense) {
  DenseCache d(c, opt.device);
  std::vector<ShiftDenseLayer> layers;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    ShiftDenseLayer s;
    s.k = TensorRef(d.k[l].data(), DType::F16, opt.device, {c.context, c.n_kv_heads, c.head_dim});
    s.maybe_v = TensorRef(d.v[l].data(), DType::F16, opt.device, {c.context, c.n_kv_heads, c.head_dim});
    s.rope = RopeSpec::llama3_8b();
    layers.push_back(std::move(s));
  }
  return opt.time([&](int) { shift_dense(layers, c.context, c.n_keep, c.n_discard); });
}

#endif
