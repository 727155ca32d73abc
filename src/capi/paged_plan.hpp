// Attention over one step of a PagedCache for the C API and the Python module: the batch's block
// tables (in storage of the plan's own, so later block_tables() calls do not disturb them), the
// query rows and positions, and the per-layer options, fixed when the step is planned; then
// run(layer, q, out) once per layer over the cache's paged_kv(layer). The kvcore::AttentionPlan
// behind it is made on the first run, when the query's head count is known (and again only if
// a later run brings another head count). The caller must not run a plan after the cache's
// sequences changed (both bindings count edits and refuse stale plans).
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "capi/ticket.hpp"
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
  static PagedPlan of_ticket(PagedCache& cache, const Ticket& ticket, const PagedPlanOptions& opt) {
    return PagedPlan(cache, ticket.seqs, ticket.counts, ticket.positions, opt);
  }

  // out = attention(q) over `layer`'s pages; q, out [n_rows, n_q_heads, head_dim].
  void run(int32_t layer, const TensorRef& q, const TensorRef& out, Stream stream);

  int32_t batch() const { return batch_; }
  int64_t n_rows() const { return n_rows_; }
  bool prefill() const { return prefill_; }
  float softmax_scale() const { return scale_; }

 private:
  PagedCache* cache_;
  int32_t batch_ = 0;
  int64_t n_rows_ = 0;
  bool prefill_ = false;
  float scale_ = 0.0f;
  Buffer tables_;  // the block tables (PagedCache::block_tables into caller storage)
  Buffer rows_;    // i32: qo_indptr [batch + 1] | q_positions [n_rows]
  AttentionStep step_;
  AttentionSchedule schedule_;
  AttentionLayer layer_;
  std::optional<AttentionPlan> plan_;
  int32_t plan_q_heads_ = -1;
};

}  // namespace kvcore::capi
