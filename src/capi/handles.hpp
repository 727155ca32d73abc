// The C API's cache handles, shared by the files that implement its entry points.
#pragma once
#include <cstdint>
#include <memory>

#include "capi/paged_plan.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/kvcore.h"
#include "kvcore/persist/kv_store.hpp"

// epoch counts the metadata changes made through the C API, so a plan can tell it went stale.
struct kvc_paged_cache {
  kvcore::PagedCache cache;
  uint64_t epoch = 0;
};
struct kvc_ticket {
  kvcore::capi::Ticket t;
};
struct kvc_attention_plan {
  kvc_paged_cache* owner;
  uint64_t epoch;
  kvcore::capi::PagedPlan plan;
};

struct kvc_dsv4_cache {
  kvcore::Dsv4Cache cache;
};

// Any store (host, disk, tiered); `tiered` is set for a TieredStore (flush).
struct kvc_store {
  std::unique_ptr<kvcore::KvStore> store;
  kvcore::TieredStore* tiered = nullptr;
};

namespace kvcore::capi {
// The caller's kvc_paged_config (versioned) as the C++ config; throws InvalidArgument naming `fn`.
PagedCacheConfig paged_config(const kvc_paged_config* cfg, const char* fn);
}  // namespace kvcore::capi
