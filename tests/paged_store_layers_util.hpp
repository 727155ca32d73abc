// PagedCache::store_layers against store() per layer, shared by the CPU test
// (tests/paged_store_layers_test.cpp) and the CUDA one (tests/cuda/kv_store_layers_cuda_test.cpp):
// the same reservations on two caches, one stored layer by layer, one with store_layers.
#pragma once
#include <random>
#include <vector>

#include "paged_configs.hpp"
#include "paged_model.hpp"

namespace paged_test {

// Three sequences reserve `step_counts` tokens per step (a decode step when all are 1), for
// `steps` steps; each step's K/V are stored in `cache` with store_layers (fused) or layer by
// layer. Sources come from `seed` only: two caches given the same arguments get the same rows.
inline void drive_steps(PagedCache& cache, bool fused, int steps, const std::vector<int32_t>& step_counts,
                        uint64_t seed) {
  const PagedCacheConfig& cfg = cache.config();
  std::mt19937_64 rng(seed);
  std::vector<SeqId> ids;
  for (size_t i = 0; i < step_counts.size(); ++i) ids.push_back(cache.create());
  std::vector<int32_t> next(step_counts.size(), 0);
  AppendTicket t;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> positions;
    int32_t total = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int32_t j = 0; j < step_counts[i]; ++j) positions.push_back(next[i] += 1 + static_cast<int32_t>(rng() % 50));
      total += step_counts[i];
    }
    cache.reserve(t, ids, step_counts, positions);
    Source k = make_source(rng, cfg.n_layers, total, cfg.n_kv_heads, cfg.head_dim, DType::F16, cache.device(), false);
    Source v = cfg.v_head_dim > 0
                   ? make_source(rng, cfg.n_layers, total, cfg.n_kv_heads, cfg.v_head_dim, DType::F16, cache.device(), false)
                   : Source{};
    if (fused) {
      cache.store_layers(t, k.tensor, v.tensor);
    } else {
      for (int32_t l = 0; l < cfg.n_layers; ++l) {
        const int64_t H = cfg.n_kv_heads;
        auto slice = [&](const Source& x, int32_t D) {
          if (D == 0) return TensorRef();
          return TensorRef(static_cast<char*>(x.buffer.data()) + static_cast<int64_t>(l) * total * H * D * 2, DType::F16,
                           cache.device(), {total, H, D});
        };
        cache.store(t, l, slice(k, cfg.head_dim), slice(v, cfg.v_head_dim));
      }
    }
  }
}

}  // namespace paged_test
