// C API: BlockOffloader, the pinned-host offload tier of a PagedCache.
#include <algorithm>
#include <cstring>
#include <optional>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "kvcore/persist/block_offload.hpp"

using namespace kvcore;
using capi::guard;
using capi::need;

// A load adds a sequence, an offload may apply pending rotations: both bump the PagedCache handle's
// edit count then, so earlier plans go stale.
struct kvc_offloader {
  kvc_paged_cache* owner;
  BlockOffloader off;
};

namespace {

StoreKey key_of(const kvc_store_key* key, const char* fn) {
  need(key, fn, "key");
  return StoreKey{key->content_hi, key->content_lo, key->layout};
}

kvc_offload_config defaults() {
  const OffloadConfig d;
  kvc_offload_config c{};
  c.struct_size = sizeof(kvc_offload_config);
  c.pinned_bytes = d.pinned_bytes;
  c.lower = nullptr;
  c.model_id = nullptr;
  c.max_queue_bytes = d.max_queue_bytes;
  return c;
}

}  // namespace

extern "C" {

void kvc_offload_config_init(kvc_offload_config* cfg) {
  if (cfg) *cfg = defaults();
}

kvc_status kvc_offloader_create(kvc_paged_cache* cache, const kvc_offload_config* cfg, kvc_offloader** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_offloader_create";
    need(cache, fn, "cache");
    need(out, fn, "out");
    const kvc_offload_config c = capi::read_versioned(cfg, defaults(), fn, "cfg");
    OffloadConfig o;
    o.pinned_bytes = c.pinned_bytes;
    o.lower = c.lower ? c.lower->store.get() : nullptr;
    o.model_id = c.model_id ? c.model_id : "";
    o.max_queue_bytes = c.max_queue_bytes;
    o.validate();
    *out = new kvc_offloader{cache, BlockOffloader(cache->cache, std::move(o))};
  });
}

void kvc_offloader_free(kvc_offloader* off) { delete off; }

kvc_status kvc_offloader_offload(kvc_offloader* off, int64_t seq, const kvc_store_key* key, int32_t* stored) {
  return guard([&] {
    constexpr const char* fn = "kvc_offloader_offload";
    need(off, fn, "off");
    const bool pending = off->owner->cache.needs_prepare();
    const bool ok = off->off.offload(seq, key_of(key, fn));
    if (pending && !off->owner->cache.needs_prepare()) ++off->owner->epoch;  // it applied pending rotations
    if (stored) *stored = ok ? 1 : 0;
  });
}

kvc_status kvc_offloader_load(kvc_offloader* off, const kvc_store_key* key, void* stream, int64_t* out_seq,
                              int32_t* hit) {
  return guard([&] {
    constexpr const char* fn = "kvc_offloader_load";
    need(off, fn, "off");
    need(out_seq, fn, "out_seq");
    need(hit, fn, "hit");
    const std::optional<SeqId> got = off->off.load(key_of(key, fn), capi::stream(stream));
    *hit = got ? 1 : 0;
    *out_seq = got ? *got : -1;
    if (got) ++off->owner->epoch;
  });
}

kvc_status kvc_offloader_contains(kvc_offloader* off, const kvc_store_key* key, int32_t* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_offloader_contains";
    need(off, fn, "off");
    need(out, fn, "out");
    *out = off->off.contains(key_of(key, fn)) ? 1 : 0;
  });
}

kvc_status kvc_offloader_poll(kvc_offloader* off) {
  return guard([&] { need(off, "kvc_offloader_poll", "off")->off.poll(); });
}

kvc_status kvc_offloader_flush(kvc_offloader* off) {
  return guard([&] { need(off, "kvc_offloader_flush", "off")->off.flush(); });
}

kvc_status kvc_offloader_stats_get(const kvc_offloader* off, kvc_offload_stats* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_offloader_stats_get";
    need(out, fn, "out");
    require_arg(out->struct_size >= sizeof(uint32_t), fn, ": out->struct_size is ", out->struct_size);
    const OffloadStats s = need(off, fn, "off")->off.stats();
    kvc_offload_stats r{sizeof(kvc_offload_stats), s.offloads, s.refused, s.pinned_hits, s.lower_hits, s.misses,
                        s.demoted, s.demote_failures, s.dropped, s.entries, s.pinned_used, s.holders};
    r.struct_size = std::min<uint32_t>(out->struct_size, sizeof(kvc_offload_stats));
    std::memcpy(static_cast<void*>(out), &r, r.struct_size);
  });
}

}  // extern "C"
