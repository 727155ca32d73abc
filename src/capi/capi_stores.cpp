// C API: the stores below device memory (host, disk, tiered) and their keys.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "kvcore/persist/kv_store.hpp"

using namespace kvcore;
using capi::guard;
using capi::need;

extern "C" {

kvc_status kvc_store_key_for_tokens(const kvc_paged_cache* cache, const int32_t* tokens, size_t n, const char* salt,
                                    size_t salt_len, kvc_store_key* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_store_key_for_tokens";
    need(cache, fn, "cache");
    need(out, fn, "out");
    require_arg(n == 0 || tokens, fn, ": tokens is NULL for ", n, " entries");
    require_arg(salt_len == 0 || salt, fn, ": salt is NULL for salt_len ", salt_len);
    const StoreKey k = store_key_for_tokens(std::span<const int32_t>(tokens, n),
                                            salt_len ? std::string_view(salt, salt_len) : std::string_view(),
                                            cache->cache.config());
    *out = kvc_store_key{k.content_hi, k.content_lo, k.layout};
  });
}

kvc_status kvc_host_store_create(int64_t max_bytes, kvc_store** out) {
  return guard([&] {
    need(out, "kvc_host_store_create", "out");
    auto s = std::make_unique<kvc_store>();
    s->store = std::make_unique<HostStore>(max_bytes);
    *out = s.release();
  });
}

kvc_status kvc_disk_store_create(const char* dir, int64_t max_bytes, int32_t fsync_each_put, kvc_store** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_disk_store_create";
    need(dir, fn, "dir");
    need(out, fn, "out");
    auto s = std::make_unique<kvc_store>();
    s->store = std::make_unique<DiskStore>(dir, max_bytes, fsync_each_put != 0);
    *out = s.release();
  });
}

kvc_status kvc_tiered_store_create(kvc_store* const* tiers, size_t n_tiers, int64_t max_queue_bytes, kvc_store** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_tiered_store_create";
    need(out, fn, "out");
    require_arg(n_tiers > 0, fn, ": n_tiers is 0");
    need(tiers, fn, "tiers");
    std::vector<KvStore*> ptrs;
    for (size_t i = 0; i < n_tiers; ++i) {
      require_arg(tiers[i] != nullptr, fn, ": tiers[", i, "] is NULL");
      ptrs.push_back(tiers[i]->store.get());
    }
    auto s = std::make_unique<kvc_store>();
    auto t = std::make_unique<TieredStore>(std::move(ptrs), max_queue_bytes);
    s->tiered = t.get();
    s->store = std::move(t);
    *out = s.release();
  });
}

void kvc_store_free(kvc_store* store) { delete store; }

kvc_status kvc_store_contains(kvc_store* store, const kvc_store_key* key, int32_t* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_store_contains";
    need(store, fn, "store");
    need(key, fn, "key");
    need(out, fn, "out");
    *out = store->store->contains(StoreKey{key->content_hi, key->content_lo, key->layout}) ? 1 : 0;
  });
}

kvc_status kvc_store_flush(kvc_store* store) {
  return guard([&] {
    if (need(store, "kvc_store_flush", "store")->tiered) store->tiered->flush();
  });
}

kvc_status kvc_store_stats_get(const kvc_store* store, kvc_store_stats* out) {
  return guard([&] {
    constexpr const char* fn = "kvc_store_stats_get";
    need(out, fn, "out");
    require_arg(out->struct_size >= sizeof(uint32_t), fn, ": out->struct_size is ", out->struct_size);
    const StoreStats s = need(store, fn, "store")->store->stats();
    kvc_store_stats r{};
    r.puts = s.puts;
    r.put_failures = s.put_failures;
    r.hits = s.hits;
    r.misses = s.misses;
    r.rejected = s.rejected;
    r.evictions = s.evictions;
    r.items = s.items;
    r.bytes = s.bytes;
    r.down = s.down ? 1 : 0;
    r.reconnects = s.reconnects;
    r.struct_size = std::min<uint32_t>(out->struct_size, sizeof(kvc_store_stats));
    std::memcpy(static_cast<void*>(out), &r, r.struct_size);
  });
}

}  // extern "C"
