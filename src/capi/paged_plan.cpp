#include "capi/paged_plan.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore::capi {

PagedPlan::PagedPlan(PagedCache& cache, std::span<const SeqId> seqs, std::span<const int32_t> counts,
                     std::span<const int32_t> q_positions, const PagedPlanOptions& o)
    : cache_(&cache) {
  const PagedCacheConfig& cfg = cache.config();
  const Device dev = cache.device();
  require_arg(counts.size() == seqs.size(), "plan: ", counts.size(), " counts for ", seqs.size(), " sequences");
  require_arg(o.softmax_scale >= 0.0f && std::isfinite(o.softmax_scale),
              "plan: softmax_scale must be finite and >= 0 (0: head_dim^-0.5), got ", o.softmax_scale);
  batch_ = static_cast<int32_t>(seqs.size());
  std::vector<int32_t> rows(seqs.size() + 1, 0);
  for (size_t b = 0; b < seqs.size(); ++b) {
    require_arg(counts[b] >= 0, "plan: counts[", b, "] must be >= 0, got ", counts[b]);
    rows[b + 1] = rows[b] + counts[b];
  }
  n_rows_ = rows.back();
  prefill_ = std::any_of(counts.begin(), counts.end(), [](int32_t c) { return c != 1; });
  require_arg(static_cast<int64_t>(q_positions.size()) == n_rows_, "plan: ", q_positions.size(), " q_positions for ",
              n_rows_, " query rows");
  rows.insert(rows.end(), q_positions.begin(), q_positions.end());
  rows_ = Buffer::from_host(rows, dev);
  step_.table = cache.block_tables(seqs, tables_, PagedPositions::Offsets);
  if (prefill_) step_.qo_indptr = TensorRef(rows_.as<int32_t>(), DType::I32, dev, {batch_ + 1});
  step_.q_positions = TensorRef(rows_.as<int32_t>() + batch_ + 1, DType::I32, dev, {n_rows_});
  schedule_.num_splits = o.num_splits;
  schedule_.check_tables = o.check_tables;
  layer_.softmax_scale = o.softmax_scale;
  layer_.window = o.window;
  layer_.maybe_sinks = o.sinks;
  scale_ = o.softmax_scale > 0.0f ? o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
}

void PagedPlan::run(int32_t layer, const TensorRef& q, const TensorRef& out, Stream stream) {
  const PagedKV pages = cache_->paged_kv(layer);
  require_arg(q.ndim() == 3, "run: q must be [n_rows, n_q_heads, head_dim], got ", described(q));
  const int32_t hq = static_cast<int32_t>(q.size(1));
  if (!plan_ || hq != plan_q_heads_) {  // the first run (of this head count) plans the step
    AttentionSchedule s = schedule_;
    s.stream = stream;
    plan_.emplace(prefill_ ? AttentionPlan::prefill(pages, hq, step_, s) : AttentionPlan::decode(pages, hq, step_, s));
    plan_q_heads_ = hq;
  }
  plan_->run(q, pages, out, layer_, stream);
}

}  // namespace kvcore::capi
