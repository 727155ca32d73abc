// Helpers the offload tier's tests share (CPU and CUDA): filling sequences with random K/V,
// and comparing two sequences bit for bit through their exports.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cache/paged_export.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "paged_model.hpp"

namespace offload_test {

// n tokens of random f32 K/V at positions first, first + 1, ... (first -1: after the last one).
inline void append_random(kvcore::PagedCache& c, kvcore::SeqId id, int32_t n, std::mt19937_64& rng, int32_t first = -1) {
  using namespace kvcore;
  const PagedCacheConfig& cfg = c.config();
  if (first < 0) first = c.info(id).last_position + 1;
  std::vector<int32_t> pos(n);
  for (int32_t i = 0; i < n; ++i) pos[i] = first + i;
  paged_test::Source k =
      paged_test::make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), false);
  paged_test::Source v = cfg.v_head_dim && !cfg.v_from_k_latent ? paged_test::make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.v_head_dim,
                                                                  DType::F32, c.device(), false)
                                        : paged_test::Source{};
  c.append(id, pos, k.tensor, v.tensor);
}

// Everything a sequence holds, as the persistence export sees it: pool bytes of its cells (past
// its span zeroed), positions, validity, counts.
struct SeqBytes {
  std::vector<uint8_t> payload, valid;
  std::vector<int32_t> positions;
  int32_t n_cells = 0, n_live = 0;
  bool operator==(const SeqBytes&) const = default;
};
inline SeqBytes seq_bytes(kvcore::PagedCache& c, kvcore::SeqId id) {
  const kvcore::SeqId one[1] = {id};
  kvcore::PagedExport ex = kvcore::paged_export(c, one);
  return {std::move(ex.payload), std::move(ex.valid), std::move(ex.positions), ex.seqs[0].n_cells, ex.seqs[0].n_live};
}

// The pool bytes past `id`'s span in its last block, in every array (what a loaded sequence must
// hold as zeros: no bytes of whoever wrote that block before).
inline std::vector<uint8_t> bytes_past_span(kvcore::PagedCache& c, kvcore::SeqId id) {
  using namespace kvcore;
  const SeqId one[1] = {id};
  const PagedExportPlan plan = paged_export_plan(c, one);
  std::vector<uint8_t> out;
  if (plan.cache_blocks.empty()) return out;
  const int32_t bs = c.config().block_size;
  const int32_t last = plan.cache_blocks.back(), span = plan.spans.back();
  for (const PagedPoolArray& a : paged_pool_arrays(c)) {
    const int64_t cell = a.block_bytes / bs;
    std::vector<uint8_t> b(static_cast<size_t>((bs - span) * cell));
    copy_bytes(b.data(), Device::cpu(), a.base + last * a.block_bytes + span * cell, c.device(), b.size(), c.config().stream);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

}  // namespace offload_test
