// The stores below device memory from Python (kvcore/persist/kv_store.hpp): kvcore.StoreKey,
// the KvStore interface and its HostStore, DiskStore, TieredStore (and RedisStore where kvcore
// was built with hiredis). They are what BlockOffloader(lower=...) moves evicted values into.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "host_ints.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/kv_store.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "paged.hpp"
#include "persist_args.hpp"
#if KVCORE_PY_REDIS
#include "kvcore/persist/redis_store.hpp"
#endif

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void bind_key(nb::module_& m) {
  nb::class_<StoreKey>(m, "StoreKey",
                       "The key of a value in a store: a 128-bit content hash (what the bytes hold, e.g. a token\n"
                       "prefix under a salt) and the 64-bit layout hash of the cache that made them\n"
                       "(PagedCache.layout_hash), so one store serves many layouts without mixing them.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](StoreKey* self, uint64_t content_hi, uint64_t content_lo, uint64_t layout) {
            new (self) StoreKey{content_hi, content_lo, layout};
          },
          "content_hi"_a, "content_lo"_a, "layout"_a, "A key from its three parts (unsigned 64-bit ints).")
      .def_static(
          "for_tokens",
          [](const PyPagedCache& cache, nb::handle tokens, nb::handle salt) {
            const std::vector<int32_t> t = host_i32(tokens, "tokens");
            return store_key_for_tokens(t, bytes_arg(salt, "salt"), cache.cache.config());
          },
          "cache"_a, "tokens"_a, "salt"_a = "",
          "The key of the K/V of `tokens` (token ids) in `cache`'s layout under `salt` (model, adapter,\n"
          "tenant: str or bytes): XXH3-128 of the salt and the ids. Equal tokens, salts and layouts give\n"
          "equal keys.")
      .def_ro("content_hi", &StoreKey::content_hi)
      .def_ro("content_lo", &StoreKey::content_lo)
      .def_ro("layout", &StoreKey::layout)
      .def("hex", &StoreKey::hex, "48 hex digits: layout, content hi, content lo (the name stores give the value).")
      .def("__eq__", [](const StoreKey& a, nb::handle b) { return nb::isinstance<StoreKey>(b) && a == nb::cast<StoreKey>(b); })
      .def("__hash__", [](const StoreKey& k) { return nb::hash(nb::str(k.hex().c_str())); })
      .def("__repr__", [](const StoreKey& k) { return "StoreKey('" + k.hex() + "')"; });
}

void bind_stats(nb::module_& m) {
  nb::class_<StoreStats>(m, "StoreStats", "Counts of a KvStore (of the whole chain for a TieredStore).")
      .def_ro("puts", &StoreStats::puts, "put() calls that stored.")
      .def_ro("put_failures", &StoreStats::put_failures, "put() calls that did not (full, down, I/O error).")
      .def_ro("hits", &StoreStats::hits)
      .def_ro("misses", &StoreStats::misses)
      .def_ro("rejected", &StoreStats::rejected, "Values found but refused by the seal check (misses too).")
      .def_ro("evictions", &StoreStats::evictions, "Values dropped for the size limit.")
      .def_ro("items", &StoreStats::items)
      .def_ro("bytes", &StoreStats::bytes, "Sealed bytes held now, where the store knows.")
      .def_ro("down", &StoreStats::down, "A lost connection the store is waiting to retry.")
      .def_ro("reconnects", &StoreStats::reconnects)
      .def("__repr__", [](const StoreStats& s) {
        return detail::concat("StoreStats(puts=", s.puts, ", put_failures=", s.put_failures, ", hits=", s.hits,
                              ", misses=", s.misses, ", rejected=", s.rejected, ", evictions=", s.evictions,
                              ", items=", s.items, ", bytes=", s.bytes, ", down=", s.down ? "True" : "False", ")");
      });
}

void bind_interface(nb::module_& m) {
  nb::class_<KvStore>(
      m, "KvStore",
      "A store of sealed values keyed by StoreKey (HostStore, DiskStore, TieredStore, RedisStore). A\n"
      "store is a cache: it may drop anything at any time. Every read opens the value's seal (size,\n"
      "header, key, XXH3 checksum): a damaged value is a miss, never wrong bytes. Tier trouble (a full\n"
      "disk, a lost connection) is a failed put or a miss, not an exception.")
      .def_prop_ro("name", &KvStore::name, "'host', 'disk', 'tiered' or 'redis'.")
      .def(
          "put",
          [](KvStore& s, const StoreKey& key, nb::handle data) {
            const std::string b = bytes_arg(data, "data");
            nb::gil_scoped_release g;
            return s.put(key, as_bytes(b));
          },
          "key"_a, "data"_a, "Store data (bytes) under key; True when stored.")
      .def(
          "get",
          [](KvStore& s, const StoreKey& key) -> std::optional<nb::bytes> {
            std::optional<std::vector<uint8_t>> v;
            {
              nb::gil_scoped_release g;
              v = s.get(key);
            }
            if (!v) return std::nullopt;
            return nb::bytes(v->data(), v->size());
          },
          "key"_a, "The bytes stored under key, checked; None on a miss or a refused value.")
      .def(
          "contains",
          [](KvStore& s, const StoreKey& key) {
            nb::gil_scoped_release g;
            return s.contains(key);
          },
          "key"_a, "Whether a value is stored under key (not checked: a later get may still miss).")
      .def("__contains__", [](KvStore& s, const StoreKey& key) {
        nb::gil_scoped_release g;
        return s.contains(key);
      })
      .def(
          "remove",
          [](KvStore& s, const StoreKey& key) {
            nb::gil_scoped_release g;
            return s.remove(key);
          },
          "key"_a, "Drop the value under key; True when there was one.")
      .def("stats", &KvStore::stats, "Counts (StoreStats).");
}

void bind_host_and_disk(nb::module_& m) {
  nb::class_<HostStore, KvStore>(m, "HostStore", nb::is_weak_referenceable(),
                                 "Host memory: an LRU map bounded by max_bytes of sealed values (a larger value is\n"
                                 "refused).")
      .def(nb::init<int64_t>(), "max_bytes"_a, "An empty store of at most max_bytes (> 0).");
  nb::class_<DiskStore, KvStore>(
      m, "DiskStore", nb::is_weak_referenceable(),
      "A local disk directory: one file per value, written to a temporary file, fsync'ed and renamed\n"
      "(a reader never sees half a value). Bounded by max_bytes, least recently used files first; a full\n"
      "disk fails the put and leaves the files already there readable.")
      .def(
          "__init__",
          [](DiskStore* self, nb::handle dir, int64_t max_bytes, bool fsync_each_put) {
            new (self) DiskStore(path_arg(dir, "dir"), max_bytes, fsync_each_put);
          },
          "dir"_a, "max_bytes"_a, nb::kw_only(), "fsync_each_put"_a = true,
          "Values under dir (created if missing; the files already there are kept and counted).")
      .def(
          "path_of", [](const DiskStore& s, const StoreKey& key) { return s.path_of(key); }, "key"_a,
          "The file that holds key's value.");
}

// kvcore.TieredStore: a TieredStore behind the KvStore interface plus references to its tiers,
// declared first so the tiers outlive the chain (whose destructor stops its worker, which writes
// into them, and detaches the first tier).
struct PyTieredStore : KvStore {
  nb::tuple tier_objs;
  std::optional<TieredStore> chain;

  std::string name() const override { return chain->name(); }
  bool put(const StoreKey& key, std::span<const uint8_t> payload) override { return chain->put(key, payload); }
  std::optional<std::vector<uint8_t>> get(const StoreKey& key) override { return chain->get(key); }
  bool contains(const StoreKey& key) override { return chain->contains(key); }
  bool remove(const StoreKey& key) override { return chain->remove(key); }
  StoreStats stats() const override { return chain->stats(); }
};

void bind_tiered(nb::module_& m) {
  nb::class_<PyTieredStore, KvStore>(
      m, "TieredStore", nb::is_weak_referenceable(),
      "Tiers in order, fastest first (the first a HostStore, e.g. HostStore, DiskStore, RedisStore).\n"
      "put() stores into the first tier; what its limit evicts a worker thread writes to every lower\n"
      "tier (the caller never waits for a slow one; past max_queue_bytes waiting, the oldest moves are\n"
      "dropped). get() tries the tiers in order and copies a lower hit back into the first. Keeps its\n"
      "tiers alive.")
      .def(
          "__init__",
          [](PyTieredStore* self, nb::handle tiers, int64_t max_queue_bytes) {
            require_arg(nb::isinstance<nb::sequence>(tiers) && !nb::isinstance<nb::str>(tiers),
                        "argument 'tiers' must be a sequence of KvStore objects, got ",
                        nb::type_name(tiers.type()).c_str());
            nb::tuple held = nb::tuple(nb::borrow(tiers));
            std::vector<KvStore*> ptrs;
            for (size_t i = 0; i < held.size(); ++i) {
              require_arg(nb::isinstance<KvStore>(held[i]), "argument 'tiers': tiers[", i,
                          "] must be a KvStore, got ", nb::type_name(held[i].type()).c_str());
              ptrs.push_back(nb::cast<KvStore*>(held[i]));
            }
            new (self) PyTieredStore();
            self->tier_objs = held;
            try {
              self->chain.emplace(std::move(ptrs), max_queue_bytes);
            } catch (...) {
              self->~PyTieredStore();  // nanobind does not destroy an instance whose __init__ threw
              throw;
            }
          },
          "tiers"_a, nb::kw_only(), "max_queue_bytes"_a = int64_t{1} << 30,
          "A chain over tiers (a sequence of KvStore objects, the first a HostStore).")
      .def_prop_ro("tiers", [](const PyTieredStore& s) { return s.tier_objs; }, "The tiers, in order.")
      .def(
          "flush",
          [](PyTieredStore& s) {
            nb::gil_scoped_release g;
            s.chain->flush();
          },
          "Wait until the worker has moved everything queued so far.")
      .def_prop_ro("dropped_moves", [](const PyTieredStore& s) { return s.chain->dropped_moves(); },
                   "Moves dropped because the queue was full.")
      .def(
          "tier_hits",
          [](const PyTieredStore& s, int64_t tier) {
            require_arg(tier >= 0 && tier < static_cast<int64_t>(s.tier_objs.size()), "argument 'tier' must be in [0, ",
                        s.tier_objs.size(), "), got ", tier);
            return s.chain->tier_hits(static_cast<size_t>(tier));
          },
          "tier"_a, "Hits served by tiers[tier].");
}

#if KVCORE_PY_REDIS
void bind_redis(nb::module_& m) {
  nb::class_<RedisStore, KvStore>(
      m, "RedisStore", nb::is_weak_referenceable(),
      "A Redis (or Valkey) server through hiredis. The server is not trusted: AUTH with password,\n"
      "every value's size, header and checksum checked before use. A lost connection or timeout marks\n"
      "the store down (misses at once) until a retry after a doubling backoff. Connects lazily.")
      .def(
          "__init__",
          [](RedisStore* self, const std::string& host, int port, nb::handle password, nb::handle key_prefix,
             int connect_timeout_ms, int io_timeout_ms, int64_t max_value_bytes, int backoff_initial_ms,
             int backoff_max_ms, int ttl_seconds) {
            RedisStoreOptions o;
            o.host = host;
            o.port = port;
            o.password = bytes_arg(password, "password");
            o.key_prefix = bytes_arg(key_prefix, "key_prefix");
            o.connect_timeout_ms = connect_timeout_ms;
            o.io_timeout_ms = io_timeout_ms;
            o.max_value_bytes = max_value_bytes;
            o.backoff_initial_ms = backoff_initial_ms;
            o.backoff_max_ms = backoff_max_ms;
            o.ttl_seconds = ttl_seconds;
            new (self) RedisStore(std::move(o));
          },
          "host"_a = "127.0.0.1", "port"_a = 6379, nb::kw_only(), "password"_a = "", "key_prefix"_a = "kvc:1:",
          "connect_timeout_ms"_a = 500, "io_timeout_ms"_a = 1000, "max_value_bytes"_a = int64_t{64} << 20,
          "backoff_initial_ms"_a = 50, "backoff_max_ms"_a = 2000, "ttl_seconds"_a = 0,
          "A store on the server at host:port (keys <key_prefix><StoreKey.hex()>; ttl_seconds 0: no expiry).")
      .def(
          "ping",
          [](RedisStore& s) {
            nb::gil_scoped_release g;
            return s.ping();
          },
          "Whether a connection is up now (connecting when the backoff allows).");
}
#endif

}  // namespace

void bind_stores(nb::module_& m) {
  bind_key(m);
  bind_stats(m);
  bind_interface(m);
  bind_host_and_disk(m);
  bind_tiered(m);
#if KVCORE_PY_REDIS
  bind_redis(m);
#endif
  m.def(
      "redis_compiled", [] { return KVCORE_PY_REDIS != 0; },
      "Whether this build has kvcore.RedisStore (kvcore was built with hiredis).");
}

}  // namespace kvcore::py
