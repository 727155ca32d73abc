// C API: the Redis store (kvc_redis_*). Compiled into libkvcore.so only, beside RedisStore and
// linked with hiredis where the build found it (KVCORE_CAPI_REDIS=1), so libkvcore.a links
// nothing new; without hiredis every kvc_redis_store_* call is KVC_E_NOT_SUPPORTED.
#include <memory>
#include <string>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "kvcore/kvcore.h"
#if KVCORE_CAPI_REDIS
#include "kvcore/persist/redis_store.hpp"
#endif

using namespace kvcore;
using capi::guard;
using capi::need;

namespace {

#if KVCORE_CAPI_REDIS
kvc_redis_config redis_defaults() {
  const RedisStoreOptions o;
  kvc_redis_config c{};
  c.struct_size = sizeof c;
  c.host = nullptr;  // "127.0.0.1" (RedisStoreOptions); NULL keeps it
  c.port = o.port;
  c.password = nullptr;
  c.key_prefix = nullptr;
  c.connect_timeout_ms = o.connect_timeout_ms;
  c.io_timeout_ms = o.io_timeout_ms;
  c.max_value_bytes = o.max_value_bytes;
  c.backoff_initial_ms = o.backoff_initial_ms;
  c.backoff_max_ms = o.backoff_max_ms;
  c.ttl_seconds = o.ttl_seconds;
  return c;
}
#else
[[noreturn]] void built_without_redis(const char* fn) {
  throw Error(ErrorCode::NotSupported,
              std::string(fn) + ": libkvcore was built without Redis (hiredis was not found at build time; "
                                "Debian: libhiredis-dev)");
}
#endif

}  // namespace

extern "C" {

int32_t kvc_redis_compiled(void) { return KVCORE_CAPI_REDIS ? 1 : 0; }

void kvc_redis_config_init(kvc_redis_config* cfg) {
  if (!cfg) return;
#if KVCORE_CAPI_REDIS
  *cfg = redis_defaults();
#else
  *cfg = kvc_redis_config{};
  cfg->struct_size = sizeof *cfg;
#endif
}

kvc_status kvc_redis_store_create(const kvc_redis_config* cfg, kvc_store** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_redis_store_create";
#if KVCORE_CAPI_REDIS
    need(out, fn, "out");
    const kvc_redis_config c = capi::read_versioned(cfg, redis_defaults(), fn, "cfg");
    RedisStoreOptions o;
    if (c.host) o.host = c.host;
    require_arg(!o.host.empty(), fn, ": cfg->host is empty");
    o.port = c.port;
    if (c.password) o.password = c.password;
    if (c.key_prefix) o.key_prefix = c.key_prefix;
    o.connect_timeout_ms = c.connect_timeout_ms;
    o.io_timeout_ms = c.io_timeout_ms;
    o.max_value_bytes = c.max_value_bytes;
    o.backoff_initial_ms = c.backoff_initial_ms;
    o.backoff_max_ms = c.backoff_max_ms;
    o.ttl_seconds = c.ttl_seconds;
    auto s = std::make_unique<kvc_store>();
    s->store = std::make_unique<RedisStore>(std::move(o));  // checks the options (naming each)
    *out = s.release();
#else
    (void)cfg;
    (void)out;
    built_without_redis(fn);
#endif
  });
}

kvc_status kvc_redis_store_ping(kvc_store* store) {
  bool up = false;
  std::string why;
  const kvc_status st = guard([&] {
    constexpr const char* fn = "kvc_redis_store_ping";
#if KVCORE_CAPI_REDIS
    auto* redis = dynamic_cast<RedisStore*>(need(store, fn, "store")->store.get());
    require_arg(redis != nullptr, fn, ": store is a '", store->store->name(), "' store, not a Redis store");
    up = redis->ping();
    if (!up) why = redis->last_error();
#else
    (void)store;
    built_without_redis(fn);
#endif
  });
  if (st != KVC_OK || up) return st;
  capi::set_last_error(("Unavailable: kvc_redis_store_ping: " + why).c_str());
  return KVC_E_UNAVAILABLE;
}

}  // extern "C"
