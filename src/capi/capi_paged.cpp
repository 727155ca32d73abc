// C API: PagedCache life cycle and edits, tickets, attention plans.
#include <memory>
#include <optional>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "capi/paged_plan.hpp"
#include "kvcore/cache/paged_cache.hpp"

using namespace kvcore;
using capi::guard;
using capi::need;

namespace {

KvFormat format(int32_t f, const char* fn, const char* field) {
  require_arg(f >= KVC_FORMAT_F32 && f <= KVC_FORMAT_DSV4ROW, fn, ": ", field, " ", f, " is not a KVC_FORMAT_*");
  return static_cast<KvFormat>(f);
}

kvc_paged_config config_defaults() {
  kvc_paged_config c;
  kvc_paged_config_init(&c);
  return c;
}

capi::PagedPlanOptions plan_options(const kvc_attention_options* opt, const char* fn) {
  kvc_attention_options d;
  kvc_attention_options_init(&d);
  const kvc_attention_options o = opt ? capi::read_versioned(opt, d, fn, "opt") : d;
  capi::PagedPlanOptions p;
  p.softmax_scale = o.softmax_scale;
  p.window = o.window;
  p.sinks = capi::tensor(o.sinks);
  p.num_splits = o.num_splits;
  p.check_tables = o.check_tables != 0;
  return p;
}

}  // namespace

PagedCacheConfig capi::paged_config(const kvc_paged_config* cfg, const char* fn) {
  const kvc_paged_config c = capi::read_versioned(cfg, config_defaults(), fn, "cfg");
  PagedCacheConfig p;
  p.n_layers = c.n_layers;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.v_head_dim = c.v_head_dim;
  p.block_size = c.block_size;
  p.num_blocks = c.num_blocks;
  p.k_format = format(c.k_format, fn, "k_format");
  p.v_format = format(c.v_format, fn, "v_format");
  require_arg(c.rope_mode == KVC_ROPE_STORED || c.rope_mode == KVC_ROPE_ON_READ, fn, ": rope_mode ", c.rope_mode,
              " is not KVC_ROPE_STORED or KVC_ROPE_ON_READ");
  p.rope_mode = c.rope_mode == KVC_ROPE_STORED ? RopeMode::RopeStored : RopeMode::RopeOnRead;
  p.strict_positions = c.strict_positions != 0;
  require_arg(c.n_rope >= 1 && c.rope, fn, ": rope must point to n_rope >= 1 specs, got n_rope ", c.n_rope);
  for (int32_t i = 0; i < c.n_rope; ++i) p.rope.push_back(capi::rope_spec(&c.rope[i], fn));
  p.stream = capi::stream(c.stream);
  p.kvcore_attention = c.kvcore_attention != 0;
  p.v_from_k_latent = c.v_from_k_latent != 0;
  return p;
}

extern "C" {

void kvc_paged_config_init(kvc_paged_config* cfg) {
  if (!cfg) return;
  const PagedCacheConfig d;
  *cfg = kvc_paged_config{};
  cfg->struct_size = sizeof(kvc_paged_config);
  cfg->n_layers = d.n_layers;
  cfg->n_kv_heads = d.n_kv_heads;
  cfg->head_dim = d.head_dim;
  cfg->v_head_dim = d.v_head_dim;
  cfg->block_size = d.block_size;
  cfg->num_blocks = d.num_blocks;
  cfg->k_format = static_cast<int32_t>(d.k_format);
  cfg->v_format = static_cast<int32_t>(d.v_format);
  cfg->rope_mode = KVC_ROPE_STORED;
  cfg->strict_positions = d.strict_positions ? 1 : 0;
  cfg->rope = nullptr;
  cfg->n_rope = 0;
  cfg->stream = nullptr;
  cfg->kvcore_attention = d.kvcore_attention ? 1 : 0;
  cfg->v_from_k_latent = d.v_from_k_latent ? 1 : 0;
}

kvc_status kvc_paged_create(const kvc_paged_config* cfg, kvc_device device, kvc_paged_cache** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_create";
    need(out, fn, "out");
    PagedCacheConfig p = capi::paged_config(cfg, fn);
    auto h = std::unique_ptr<kvc_paged_cache>(new kvc_paged_cache{PagedCache(std::move(p), capi::device(device)), 0});
    *out = h.release();
  });
}

void kvc_paged_free(kvc_paged_cache* cache) { delete cache; }

kvc_status kvc_paged_seq_create(kvc_paged_cache* cache, int64_t* out_seq) {
  return guard([&] {
    need(out_seq, "kvc_paged_seq_create", "out_seq");
    *out_seq = need(cache, "kvc_paged_seq_create", "cache")->cache.create();
    ++cache->epoch;
  });
}

kvc_status kvc_paged_seq_fork(kvc_paged_cache* cache, int64_t seq, int64_t* out_seq) {
  return guard([&] {
    need(out_seq, "kvc_paged_seq_fork", "out_seq");
    *out_seq = need(cache, "kvc_paged_seq_fork", "cache")->cache.fork(seq);
    ++cache->epoch;
  });
}

kvc_status kvc_paged_seq_erase(kvc_paged_cache* cache, int64_t seq) {
  return guard([&] {
    need(cache, "kvc_paged_seq_erase", "cache")->cache.erase(seq);
    ++cache->epoch;
  });
}

kvc_status kvc_paged_seq_shift(kvc_paged_cache* cache, int64_t seq, int32_t n_keep, int32_t n_discard) {
  return guard([&] {
    need(cache, "kvc_paged_seq_shift", "cache")->cache.shift(seq, n_keep, n_discard);
    ++cache->epoch;
  });
}

kvc_status kvc_paged_seq_truncate(kvc_paged_cache* cache, int64_t seq, int32_t n) {
  return guard([&] {
    need(cache, "kvc_paged_seq_truncate", "cache")->cache.truncate(seq, n);
    ++cache->epoch;
  });
}

kvc_status kvc_paged_seq_info(const kvc_paged_cache* cache, int64_t seq, kvc_seq_info* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_seq_info";
    need(out, fn, "out");
    require_arg(out->struct_size >= sizeof(uint32_t), fn, ": out->struct_size is ", out->struct_size);
    const SeqInfo i = need(cache, fn, "cache")->cache.info(seq);
    kvc_seq_info r{sizeof(kvc_seq_info), i.n_live, i.n_cells, i.n_blocks, i.last_position};
    const uint32_t size = std::min<uint32_t>(out->struct_size, sizeof(kvc_seq_info));
    std::memcpy(static_cast<void*>(out), &r, size);
    out->struct_size = size;
  });
}

kvc_status kvc_paged_remove_positions(kvc_paged_cache* cache, int64_t seq, int32_t p0, int32_t p1) {
  return guard([&] {
    need(cache, "kvc_paged_remove_positions", "cache")->cache.remove_positions(seq, p0, p1);
    ++cache->epoch;
  });
}

kvc_status kvc_paged_add_positions(kvc_paged_cache* cache, int64_t seq, int32_t p0, int32_t p1, int32_t delta) {
  return guard([&] {
    need(cache, "kvc_paged_add_positions", "cache")->cache.add_positions(seq, p0, p1, delta);
    ++cache->epoch;
  });
}

kvc_status kvc_paged_can_fit(const kvc_paged_cache* cache, const int64_t* seqs, const int32_t* counts, size_t n_seqs,
                             int32_t* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_can_fit";
    need(out, fn, "out");
    require_arg(n_seqs == 0 || (seqs && counts), fn, ": seqs and counts must hold n_seqs = ", n_seqs, " entries");
    *out = need(cache, fn, "cache")->cache.can_fit(std::span<const SeqId>(seqs, n_seqs),
                                                    std::span<const int32_t>(counts, n_seqs))
               ? 1
               : 0;
  });
}

kvc_status kvc_paged_prepare(kvc_paged_cache* cache) {
  return guard([&] {
    const bool pending = need(cache, "kvc_paged_prepare", "cache")->cache.needs_prepare();
    cache->cache.prepare();
    if (pending) ++cache->epoch;
  });
}

kvc_status kvc_paged_append(kvc_paged_cache* cache, int64_t seq, const int32_t* positions, int32_t n,
                            const DLTensor* k, const DLTensor* v) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_append";
    need(cache, fn, "cache");
    require_arg(n >= 0 && (n == 0 || positions), fn, ": positions must hold n >= 0 ints, got n ", n);
    need(k, fn, "k");
    cache->cache.append(seq, std::span<const int32_t>(positions, static_cast<size_t>(n)), capi::tensor(k),
                        capi::tensor(v));
    ++cache->epoch;
  });
}

kvc_status kvc_ticket_create(kvc_ticket** out) {
  return guard([&] { *need(out, "kvc_ticket_create", "out") = new kvc_ticket{}; });
}

void kvc_ticket_free(kvc_ticket* ticket) { delete ticket; }

int32_t kvc_ticket_n_tokens(const kvc_ticket* ticket) {
  return ticket ? static_cast<int32_t>(ticket->t.positions.size()) : 0;
}

kvc_status kvc_paged_reserve(kvc_paged_cache* cache, const int64_t* seqs, const int32_t* counts, size_t n_seqs,
                             const int32_t* positions, kvc_ticket* ticket) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_reserve";
    need(cache, fn, "cache");
    need(ticket, fn, "ticket");
    require_arg(n_seqs == 0 || (seqs && counts), fn, ": seqs and counts must hold n_seqs = ", n_seqs, " entries");
    int64_t total = 0;
    for (size_t i = 0; i < n_seqs; ++i) total += counts[i] > 0 ? counts[i] : 0;
    require_arg(total == 0 || positions, fn, ": positions is NULL for ", total, " tokens");
    ticket->t.reserve(cache->cache, std::span<const SeqId>(seqs, n_seqs), std::span<const int32_t>(counts, n_seqs),
                      std::span<const int32_t>(positions, static_cast<size_t>(total)));
    ++cache->epoch;
  });
}

kvc_status kvc_paged_store(kvc_paged_cache* cache, const kvc_ticket* ticket, int32_t layer, const DLTensor* k,
                           const DLTensor* v) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_store";
    need(cache, fn, "cache");
    need(ticket, fn, "ticket");
    need(k, fn, "k");
    cache->cache.store(ticket->t.t, layer, capi::tensor(k), capi::tensor(v));
  });
}

kvc_status kvc_paged_store_layers(kvc_paged_cache* cache, const kvc_ticket* ticket, const DLTensor* k,
                                  const DLTensor* v) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_store_layers";
    need(cache, fn, "cache");
    need(ticket, fn, "ticket");
    need(k, fn, "k");
    cache->cache.store_layers(ticket->t.t, capi::tensor(k), capi::tensor(v));
  });
}

kvc_status kvc_paged_read(kvc_paged_cache* cache, int64_t seq, int32_t layer, int32_t* positions, float* k, float* v,
                          int32_t cap, int32_t* n_live) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_read";
    need(cache, fn, "cache");
    need(n_live, fn, "n_live");
    const int32_t n = cache->cache.info(seq).n_live;
    *n_live = n;
    require_arg(n <= cap, fn, ": sequence ", seq, " holds ", n, " tokens, cap is ", cap);
    const bool pending = cache->cache.needs_prepare();
    const PagedReadBack r = cache->cache.read(seq, layer);
    if (pending) ++cache->epoch;  // read() ran prepare(), which moved positions
    if (positions) std::copy(r.positions.begin(), r.positions.end(), positions);
    if (k) std::copy(r.k.begin(), r.k.end(), k);
    if (v) std::copy(r.v.begin(), r.v.end(), v);
  });
}

void kvc_attention_options_init(kvc_attention_options* opt) {
  if (!opt) return;
  *opt = kvc_attention_options{};
  opt->struct_size = sizeof(kvc_attention_options);
  opt->softmax_scale = 0.0f;
  opt->window = 0;
  opt->sinks = nullptr;
  opt->num_splits = 0;
  opt->check_tables = 1;
}

kvc_status kvc_paged_plan(kvc_paged_cache* cache, const kvc_ticket* ticket, const kvc_attention_options* opt,
                          kvc_attention_plan** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_plan";
    need(cache, fn, "cache");
    need(ticket, fn, "ticket");
    need(out, fn, "out");
    const capi::PagedPlanOptions o = plan_options(opt, fn);
    *out = new kvc_attention_plan{cache, cache->epoch, capi::PagedPlan::of_ticket(cache->cache, ticket->t, o)};
  });
}

kvc_status kvc_paged_plan_seqs(kvc_paged_cache* cache, const int64_t* seqs, size_t n_seqs, const int32_t* q_positions,
                               const kvc_attention_options* opt, kvc_attention_plan** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_plan_seqs";
    need(cache, fn, "cache");
    need(out, fn, "out");
    require_arg(n_seqs == 0 || seqs, fn, ": seqs is NULL for n_seqs = ", n_seqs);
    const std::span<const SeqId> s(seqs, n_seqs);
    std::vector<int32_t> qpos(n_seqs);
    for (size_t i = 0; i < n_seqs; ++i) qpos[i] = q_positions ? q_positions[i] : cache->cache.info(s[i]).last_position;
    const std::vector<int32_t> ones(n_seqs, 1);
    const capi::PagedPlanOptions o = plan_options(opt, fn);
    *out = new kvc_attention_plan{cache, cache->epoch, capi::PagedPlan(cache->cache, s, ones, qpos, o)};
  });
}

void kvc_attention_plan_free(kvc_attention_plan* plan) { delete plan; }

kvc_status kvc_attention_run(kvc_attention_plan* plan, int32_t layer, const DLTensor* q, const DLTensor* out,
                             void* stream) {
  return guard([&] {
    constexpr const char* fn = "kvc_attention_run";
    need(plan, fn, "plan");
    need(q, fn, "q");
    need(out, fn, "out");
    require_arg(plan->epoch == plan->owner->epoch, fn,
                ": the plan is stale (its cache changed after kvc_paged_plan; make a new plan each step)");
    plan->plan.run(layer, capi::tensor(q), capi::tensor(out), capi::stream(stream));
  });
}

}  // extern "C"
