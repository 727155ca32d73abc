// The Python-side PagedCache: the C++ cache plus an edit counter, so an attention plan can tell
// it went stale (any metadata change after plan()) instead of reading freed blocks.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/ops/attention.hpp"
#include "tensors.hpp"

namespace kvcore::py {

struct PyPagedCache {
  PagedCache cache;
  uint64_t epoch = 0;  // bumped by every call that changes metadata
};

// Attention over one step's batch: the block tables (copied, so later block_tables() calls do
// not disturb them), query positions, row layout and options, built once per step by
// PagedCache.plan() and run once per layer. Holds a reference to its cache.
struct PyAttentionPlan {
  nb::object cache_obj;
  PyPagedCache* cache = nullptr;
  uint64_t epoch = 0;
  int32_t batch = 0;
  int64_t n_rows = 0;
  bool prefill = false;
  Buffer tables;  // i32: indptr | last_page_len | pos_offset | qo_indptr | q_positions | indices
  BlockTable table;
  TensorRef qo_indptr;
  AttentionOptions opt;
  Buffer workspace;
  int64_t workspace_q_heads = -1, workspace_head_dim = -1;
  Tensor sinks;
  std::vector<int64_t> seq_cells;  // host: cells each sequence spans
};

}  // namespace kvcore::py
