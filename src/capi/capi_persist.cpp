// C API: snapshots of PagedCache and Dsv4Cache sequences, and prefix caching.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "kvcore/persist/dsv4_snapshot.hpp"
#include "kvcore/persist/prefix_cache.hpp"
#include "kvcore/persist/snapshot.hpp"

using namespace kvcore;
using capi::guard;
using capi::need;

// A prefix cache bumps its PagedCache handle's edit count, so plans made before its edits go stale.
struct kvc_prefix_cache {
  kvc_paged_cache* owner;
  PrefixCache prefix;
};

namespace {

std::string_view salt_of(const char* salt, size_t len, const char* fn) {
  require_arg(len == 0 || salt, fn, ": salt is NULL for salt_len ", len);
  return len ? std::string_view(salt, len) : std::string_view();
}

template <class T>
std::span<const T> span_of(const T* p, size_t n, const char* fn, const char* what) {
  require_arg(n == 0 || p, fn, ": ", what, " is NULL for ", n, " entries");
  return {p, n};
}

}  // namespace

extern "C" {

kvc_status kvc_snapshot_save(kvc_paged_cache* cache, const char* path, const char* model_id, const int64_t* seqs,
                             size_t n_seqs) {
  return guard([&] {
    constexpr const char* fn = "kvc_snapshot_save";
    need(cache, fn, "cache");
    need(path, fn, "path");
    need(model_id, fn, "model_id");
    const bool pending = cache->cache.needs_prepare();
    snapshot_save(cache->cache, path, model_id, span_of(seqs, n_seqs, fn, "seqs"));
    if (pending && !cache->cache.needs_prepare()) ++cache->epoch;  // the save applied pending rotations
  });
}

kvc_status kvc_snapshot_load(kvc_paged_cache* cache, const char* path, const char* model_id, int32_t position_delta,
                             int64_t* out_ids, size_t cap, size_t* n_loaded) {
  return guard([&] {
    constexpr const char* fn = "kvc_snapshot_load";
    need(cache, fn, "cache");
    need(path, fn, "path");
    need(model_id, fn, "model_id");
    need(n_loaded, fn, "n_loaded");
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    const SnapshotSummary summary = snapshot_inspect(bytes);  // everything a load checks without a cache
    *n_loaded = summary.seqs.size();
    require_arg(summary.seqs.size() <= cap, fn, ": ", path, " holds ", summary.seqs.size(), " sequences, cap is ", cap);
    require_arg(summary.seqs.empty() || out_ids, fn, ": out_ids is NULL");
    SnapshotLoadOptions o;
    o.model_id = model_id;
    o.position_delta = position_delta;
    const SnapshotLoaded loaded = snapshot_decode(cache->cache, bytes, o);
    ++cache->epoch;
    std::copy(loaded.ids.begin(), loaded.ids.end(), out_ids);
    *n_loaded = loaded.ids.size();
  });
}

void kvc_snapshot_info_init(kvc_snapshot_info* info) {
  if (!info) return;
  *info = kvc_snapshot_info{};
  info->struct_size = sizeof(kvc_snapshot_info);
}

kvc_status kvc_snapshot_inspect(const char* path, kvc_snapshot_info* info, char* text, size_t cap, size_t* text_len) {
  return guard([&] {
    constexpr const char* fn = "kvc_snapshot_inspect";
    need(path, fn, "path");
    need(info, fn, "info");
    require_arg(info->struct_size >= sizeof(uint32_t), fn, ": info->struct_size is ", info->struct_size,
                " (fill it with kvc_snapshot_info_init first)");
    const SnapshotSummary s = snapshot_inspect(read_file_bytes(path));
    kvc_snapshot_info r{};
    r.struct_size = std::min<uint32_t>(info->struct_size, sizeof(kvc_snapshot_info));
    r.major = s.major;
    r.minor = s.minor;
    r.kind = s.kind;
    r.file_bytes = s.file_bytes;
    r.n_chunks = s.n_chunks;
    r.n_seqs = static_cast<int64_t>(s.seqs.size());
    r.block_size = s.block_size;
    r.n_blocks = s.n_blocks;
    r.bytes_per_block = s.bytes_per_block;
    const std::string d = snapshot_describe(s);
    std::memcpy(static_cast<void*>(info), &r, r.struct_size);
    if (text_len) *text_len = d.size();
    if (text && cap > 0) {
      const size_t n = std::min(cap - 1, d.size());
      std::memcpy(text, d.data(), n);
      text[n] = '\0';
    }
  });
}

kvc_status kvc_dsv4_snapshot_save(kvc_dsv4_cache* cache, int64_t seq, const char* path, const char* model_id) {
  return guard([&] {
    constexpr const char* fn = "kvc_dsv4_snapshot_save";
    snapshot_save(need(cache, fn, "cache")->cache, seq, need(path, fn, "path"), need(model_id, fn, "model_id"));
  });
}

kvc_status kvc_dsv4_snapshot_load(kvc_dsv4_cache* cache, int64_t seq, const char* path, const char* model_id) {
  return guard([&] {
    constexpr const char* fn = "kvc_dsv4_snapshot_load";
    snapshot_load(need(cache, fn, "cache")->cache, seq, need(path, fn, "path"), need(model_id, fn, "model_id"));
  });
}

kvc_status kvc_prefix_create(kvc_paged_cache* cache, uint64_t seed, kvc_prefix_cache** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_prefix_create";
    need(cache, fn, "cache");
    need(out, fn, "out");
    *out = new kvc_prefix_cache{cache, PrefixCache(cache->cache, seed)};
  });
}

void kvc_prefix_free(kvc_prefix_cache* prefix) {
  if (!prefix) return;
  ++prefix->owner->epoch;  // its holders are erased
  delete prefix;
}

kvc_status kvc_prefix_seq_create(kvc_prefix_cache* prefix, const int32_t* prompt, size_t n, const char* salt,
                                 size_t salt_len, int64_t* out_seq, int32_t* reused_tokens) {
  return guard([&] {
    constexpr const char* fn = "kvc_prefix_seq_create";
    need(prefix, fn, "prefix");
    need(out_seq, fn, "out_seq");
    int32_t reused = 0;
    *out_seq = prefix->prefix.create(span_of(prompt, n, fn, "prompt"), salt_of(salt, salt_len, fn), &reused);
    ++prefix->owner->epoch;
    if (reused_tokens) *reused_tokens = reused;
  });
}

kvc_status kvc_prefix_publish(kvc_prefix_cache* prefix, int64_t seq, const int32_t* tokens, size_t n, const char* salt,
                              size_t salt_len, int32_t* published) {
  return guard([&] {
    constexpr const char* fn = "kvc_prefix_publish";
    need(prefix, fn, "prefix");
    const int32_t p = prefix->prefix.publish(seq, span_of(tokens, n, fn, "tokens"), salt_of(salt, salt_len, fn));
    ++prefix->owner->epoch;
    if (published) *published = p;
  });
}

kvc_status kvc_prefix_shift(kvc_prefix_cache* prefix, int64_t seq, int32_t n_keep, int32_t n_discard) {
  return guard([&] {
    need(prefix, "kvc_prefix_shift", "prefix")->prefix.shift(seq, n_keep, n_discard);
    ++prefix->owner->epoch;
  });
}

kvc_status kvc_prefix_truncate(kvc_prefix_cache* prefix, int64_t seq, int32_t n) {
  return guard([&] {
    need(prefix, "kvc_prefix_truncate", "prefix")->prefix.truncate(seq, n);
    ++prefix->owner->epoch;
  });
}

kvc_status kvc_prefix_note_edit(kvc_prefix_cache* prefix, int64_t seq, int32_t first_token) {
  return guard([&] { need(prefix, "kvc_prefix_note_edit", "prefix")->prefix.note_edit(seq, first_token); });
}

kvc_status kvc_prefix_erase(kvc_prefix_cache* prefix, int64_t seq) {
  return guard([&] {
    need(prefix, "kvc_prefix_erase", "prefix")->prefix.erase(seq);
    ++prefix->owner->epoch;
  });
}

kvc_status kvc_prefix_evict(kvc_prefix_cache* prefix, int32_t free_blocks, int32_t* ok) {
  return guard([&] {
    const bool r = need(prefix, "kvc_prefix_evict", "prefix")->prefix.evict(free_blocks);
    ++prefix->owner->epoch;
    if (ok) *ok = r ? 1 : 0;
  });
}

kvc_status kvc_prefix_clear(kvc_prefix_cache* prefix) {
  return guard([&] {
    need(prefix, "kvc_prefix_clear", "prefix")->prefix.clear();
    ++prefix->owner->epoch;
  });
}

kvc_status kvc_prefix_stats_get(const kvc_prefix_cache* prefix, kvc_prefix_stats* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_prefix_stats_get";
    need(out, fn, "out");
    require_arg(out->struct_size >= sizeof(uint32_t), fn, ": out->struct_size is ", out->struct_size);
    const PrefixStats s = need(prefix, fn, "prefix")->prefix.stats();
    kvc_prefix_stats r{sizeof(kvc_prefix_stats), s.queries, s.hit_queries, s.blocks_hit, s.blocks_missed,
                       s.blocks_published, s.holders, s.evictions};
    r.struct_size = std::min<uint32_t>(out->struct_size, sizeof(kvc_prefix_stats));
    std::memcpy(static_cast<void*>(out), &r, r.struct_size);
  });
}

}  // extern "C"
