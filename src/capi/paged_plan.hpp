// Attention over one step of a PagedCache, planned once and run per layer: the block tables of
// the batch (copied out of the cache, so later block_tables() calls do not disturb them), query
// rows and positions, the options and a workspace sized on the first run. Shared by the C API
// and the Python module. The caller must not run a plan after the cache's sequences changed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/ops/attention.hpp"

namespace kvcore::capi {

struct PagedPlanOptions {
  float softmax_scale = 0.0f;  // 0: head_dim^-0.5
  int32_t window = 0;
  TensorRef sinks;
  int32_t num_splits = 0;
  bool check_tables = true;
};

class PagedPlan {
 public:
  // counts[b] query rows of seqs[b] (all 1: decode; else causal prefill), at q_positions (one a row).
  PagedPlan(PagedCache& cache, std::span<const SeqId> seqs, std::span<const int32_t> counts,
            std::span<const int32_t> q_positions, const PagedPlanOptions& opt);
  // The plan of a ticket's step: its sequences, counts and positions.
  static PagedPlan of_ticket(PagedCache& cache, const AppendTicket& ticket, const PagedPlanOptions& opt);

  // out = attention(q) over `layer`'s pages; q, out [n_rows, n_q_heads, head_dim].
  void run(int32_t layer, const TensorRef& q, const TensorRef& out, Stream stream);

  int32_t batch() const { return batch_; }
  int64_t n_rows() const { return n_rows_; }
  bool prefill() const { return prefill_; }
  float softmax_scale() const { return opt_.softmax_scale; }

 private:
  PagedCache* cache_;
  int32_t batch_ = 0;
  int64_t n_rows_ = 0;
  bool prefill_ = false;
  Buffer tables_;  // i32: indptr | last_page_len | pos_offset | qo_indptr | q_positions | indices
  BlockTable table_;
  TensorRef qo_indptr_;
  AttentionOptions opt_;
  Buffer workspace_;
  int64_t workspace_q_heads_ = -1, workspace_head_dim_ = -1;
};

}  // namespace kvcore::capi
