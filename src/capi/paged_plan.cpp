#include "capi/paged_plan.hpp"

#include <algorithm>
#include <cmath>

#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore::capi {

namespace {
std::vector<int32_t> host_copy(const TensorRef& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size() * 4);
  return v;
}
}  // namespace

PagedPlan PagedPlan::of_ticket(PagedCache& cache, const AppendTicket& ticket, const PagedPlanOptions& opt) {
  require_arg(ticket.n_tokens == 0 || !ticket.positions.empty(), "plan: the ticket was never filled by reserve()");
  const std::vector<int32_t> pos = host_copy(ticket.position_view());
  return PagedPlan(cache, ticket.seqs, ticket.counts, pos, opt);
}

PagedPlan::PagedPlan(PagedCache& cache, std::span<const SeqId> seqs, std::span<const int32_t> counts,
                     std::span<const int32_t> q_positions, const PagedPlanOptions& o)
    : cache_(&cache) {
  const PagedCacheConfig& cfg = cache.config();
  const Device dev = cache.device();
  require_arg(counts.size() == seqs.size(), "plan: ", counts.size(), " counts for ", seqs.size(), " sequences");
  require_arg(o.softmax_scale >= 0.0f && std::isfinite(o.softmax_scale),
              "plan: softmax_scale must be finite and >= 0 (0: head_dim^-0.5), got ", o.softmax_scale);
  batch_ = static_cast<int32_t>(seqs.size());
  std::vector<int32_t> qo(seqs.size() + 1, 0);
  for (size_t b = 0; b < seqs.size(); ++b) {
    require_arg(counts[b] >= 0, "plan: counts[", b, "] must be >= 0, got ", counts[b]);
    qo[b + 1] = qo[b] + counts[b];
  }
  n_rows_ = qo.back();
  prefill_ = std::any_of(counts.begin(), counts.end(), [](int32_t c) { return c != 1; });
  require_arg(static_cast<int64_t>(q_positions.size()) == n_rows_, "plan: ", q_positions.size(), " q_positions for ",
              n_rows_, " query rows");
  std::optional<RopeSpec> rope_on_read;
  if (cfg.rope_mode == RopeMode::RopeOnRead) {
    require(cfg.rope.size() == 1, ErrorCode::NotSupported,
            "plan: rope-on-read attention over a cache with per-layer RoPE specs (", cfg.rope.size(),
            " specs) is not supported");
    rope_on_read = cfg.rope[0];
  }

  const PagedCsr csr = cache.block_tables(seqs, PagedPositions::Offsets);
  const std::vector<int32_t> indptr = host_copy(csr.indptr), last = host_copy(csr.last_page_len);
  const std::vector<int32_t> offs = host_copy(csr.pos_offset);
  const int64_t n_idx = csr.indices.numel(), B = batch_;
  int64_t max_cells = 0;
  for (int64_t b = 0; b < B; ++b)
    max_cells = std::max<int64_t>(
        max_cells, PagedLayout::seq_cells(indptr.data(), last.data(), static_cast<int32_t>(b), cfg.block_size));

  std::vector<int32_t> host;
  host.reserve(static_cast<size_t>(4 * B + 2 + n_rows_));
  for (const std::vector<int32_t>* part : {&indptr, &last, &offs, static_cast<const std::vector<int32_t>*>(&qo)}) host.insert(host.end(), part->begin(), part->end());
  host.insert(host.end(), q_positions.begin(), q_positions.end());
  const int64_t head = static_cast<int64_t>(host.size());
  tables_ = Buffer(static_cast<size_t>(head + n_idx + 1) * 4, dev);
  copy_bytes(tables_.data(), dev, host.data(), Device::cpu(), host.size() * 4);
  int32_t* base = tables_.as<int32_t>();
  if (n_idx) copy_bytes(base + head, dev, csr.indices.data(), csr.indices.device(), static_cast<size_t>(n_idx) * 4);
  int64_t at = 0;
  auto view = [&](int64_t n) {
    TensorRef t(base + at, DType::I32, dev, {n});
    at += n;
    return t;
  };
  table_.indptr = view(B + 1);
  table_.last_page_len = view(B);
  table_.pos_offset = view(B);
  qo_indptr_ = view(B + 1);
  opt_.q_positions = view(n_rows_);
  table_.indices = TensorRef(base + head, DType::I32, dev, {n_idx});

  opt_.softmax_scale = o.softmax_scale > 0.0f ? o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  opt_.window = o.window;
  opt_.sinks = o.sinks;
  opt_.rope_on_read = std::move(rope_on_read);
  opt_.rotate_query = opt_.rope_on_read.has_value();
  opt_.num_splits = o.num_splits;
  opt_.max_seq_cells = max_cells;
  opt_.check_tables = o.check_tables;
}

void PagedPlan::run(int32_t layer, const TensorRef& q, const TensorRef& out, Stream stream) {
  PagedCache& cache = *cache_;
  const KvPool kp = cache.k_pool(layer), vp = cache.v_pool(layer);
  const PagedKV kv{kp.data, vp.data, kp.scales, vp.scales, cache.positions(), cache.valid()};
  AttentionOptions opt = opt_;
  opt.stream = stream;
  if (!prefill_ && q.ndim() == 3 && q.size(1) > 0 && q.size(2) > 0) {
    const int64_t hq = q.size(1), hd = q.size(2);
    if (hq != workspace_q_heads_ || hd != workspace_head_dim_) {  // the first run of this shape
      const int32_t splits =
          opt.num_splits > 0 ? opt.num_splits
                             : attention_auto_splits(cache.device(), n_rows_, cache.config().n_kv_heads, hq, hd,
                                                     kp.data.dtype(), opt.max_seq_cells, 0, opt.rope_on_read.has_value());
      workspace_ = Buffer(attention_workspace_bytes(n_rows_, hq, hd, std::max(splits, 1)), cache.device(), 256);
      workspace_q_heads_ = hq;
      workspace_head_dim_ = hd;
    }
    opt.workspace = TensorRef(workspace_.data(), DType::U8, cache.device(), {static_cast<int64_t>(workspace_.size())});
  }
  if (prefill_) attention_prefill(q, qo_indptr_, kv, table_, out, opt);
  else attention_decode(q, kv, table_, out, opt);
}

}  // namespace kvcore::capi
