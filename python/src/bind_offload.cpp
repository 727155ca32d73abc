// kvcore.BlockOffloader (kvcore/persist/block_offload.hpp): a PagedCache's sequences copied to a
// pinned host arena and back, with a KvStore below it for what the arena evicts.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "bindings.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/block_offload.hpp"
#include "paged.hpp"
#include "persist_args.hpp"
#include "tensors.hpp"

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The C++ offloader plus references to its cache and lower store, declared first so both outlive
// it (its destructor waits for every copy and demotion, then erases its holder sequences).
struct PyBlockOffloader {
  nb::object cache_obj, lower_obj;
  PyPagedCache* cache = nullptr;
  std::optional<BlockOffloader> off;
};

constexpr const char* kDoc =
    "A PagedCache's sequences copied to pinned host memory and back (the device and pinned-host tiers),\n"
    "with a KvStore below for what pinned memory evicts.\n\n"
    "    lower = kvcore.TieredStore([kvcore.HostStore(8 << 30), kvcore.DiskStore('/var/kv', 200 << 30)])\n"
    "    off = kvcore.BlockOffloader(cache, pinned_bytes=4 << 30, lower=lower, model_id='llama-3-8b')\n"
    "    key = kvcore.StoreKey.for_tokens(cache, prompt, salt='tenant-a')\n"
    "    off.offload(seq, key); cache.erase(seq)          # blocks free at once, bytes kept\n"
    "    seq = off.load(key)                               # a new sequence, or None on a miss\n\n"
    "On CUDA offload() queues the copy on a side stream after the work already queued on `stream` and\n"
    "returns at once (a holder sequence keeps the blocks until the copy ran); load() copies on\n"
    "`stream` after the value's own offload copy. The least recently used values go down to `lower`\n"
    "through two worker threads (the caller never waits for a slow tier); a value of another model_id\n"
    "or failing its checksums is a miss, never wrong K/V. On the CPU every call is synchronous.\n"
    "Keeps its cache and lower store alive; calls must not overlap calls on the cache.";

OffloadConfig make_config(int64_t pinned_bytes, nb::handle lower, nb::handle model_id, int64_t max_queue_bytes) {
  require_arg(lower.is_none() || nb::isinstance<KvStore>(lower),
              "argument 'lower' must be None or a kvcore.KvStore (HostStore, DiskStore, TieredStore, ...), got ",
              nb::type_name(lower.type()).c_str());
  OffloadConfig cfg;
  cfg.pinned_bytes = pinned_bytes;
  cfg.lower = lower.is_none() ? nullptr : nb::cast<KvStore*>(lower);
  cfg.model_id = bytes_arg(model_id, "model_id");
  cfg.max_queue_bytes = max_queue_bytes;
  cfg.validate();
  return cfg;
}

}  // namespace

void bind_offload(nb::module_& m) {
  nb::class_<OffloadStats>(m, "OffloadStats", "Counts of a BlockOffloader.")
      .def_ro("offloads", &OffloadStats::offloads, "Values copied into pinned memory.")
      .def_ro("refused", &OffloadStats::refused, "offload() calls whose value was larger than the whole arena.")
      .def_ro("pinned_hits", &OffloadStats::pinned_hits)
      .def_ro("lower_hits", &OffloadStats::lower_hits)
      .def_ro("misses", &OffloadStats::misses)
      .def_ro("demoted", &OffloadStats::demoted, "Values the worker moved to the lower store.")
      .def_ro("demote_failures", &OffloadStats::demote_failures, "Values the lower store refused.")
      .def_ro("dropped", &OffloadStats::dropped, "Evicted values dropped (no lower store, or its queue full).")
      .def_ro("entries", &OffloadStats::entries, "Values in pinned memory now.")
      .def_ro("pinned_used", &OffloadStats::pinned_used, "Arena bytes in use now.")
      .def_ro("holders", &OffloadStats::holders, "Holder sequences alive now (CUDA copies in flight).")
      .def("__repr__", [](const OffloadStats& s) {
        return detail::concat("OffloadStats(offloads=", s.offloads, ", refused=", s.refused,
                              ", pinned_hits=", s.pinned_hits, ", lower_hits=", s.lower_hits, ", misses=", s.misses,
                              ", demoted=", s.demoted, ", demote_failures=", s.demote_failures,
                              ", dropped=", s.dropped, ", entries=", s.entries, ", pinned_used=", s.pinned_used,
                              ", holders=", s.holders, ")");
      });

  nb::class_<PyBlockOffloader>(m, "BlockOffloader", kDoc)
      .def(
          "__init__",
          [](PyBlockOffloader* self, nb::handle cache, int64_t pinned_bytes, nb::handle lower, nb::handle model_id,
             int64_t max_queue_bytes) {
            require_arg(nb::isinstance<PyPagedCache>(cache), "argument 'cache' must be a kvcore.PagedCache, got ",
                        nb::type_name(cache.type()).c_str());
            const OffloadConfig cfg = make_config(pinned_bytes, lower, model_id, max_queue_bytes);
            PyPagedCache* c = nb::cast<PyPagedCache*>(cache);
            new (self) PyBlockOffloader{nb::borrow(cache), nb::borrow(lower), c, std::nullopt};
            try {
              self->off.emplace(c->cache, cfg);
            } catch (...) {
              self->~PyBlockOffloader();  // nanobind does not destroy an instance whose __init__ threw
              throw;
            }
          },
          "cache"_a, nb::kw_only(), "pinned_bytes"_a = int64_t{1} << 30, "lower"_a = nb::none(),
          "model_id"_a = "", "max_queue_bytes"_a = int64_t{1} << 30,
          "pinned_bytes: the arena (values and their block lists; pinned with cudaHostAlloc on CUDA).\n"
          "lower: a KvStore for what the arena evicts (None: evicted values are dropped).\n"
          "model_id (str or bytes): recorded in every value; a value of another model is a miss.\n"
          "max_queue_bytes: values copied out, waiting for `lower`; past it the oldest are dropped.")
      .def(
          "offload",
          [](PyBlockOffloader& o, SeqId seq, const StoreKey& key, nb::handle stream) {
            use_stream(*o.cache, stream);
            const bool pending = o.cache->cache.needs_prepare();
            bool stored = false;
            {
              nb::gil_scoped_release g;
              stored = o.off->offload(seq, key);
            }
            // An offload applies pending rotations first (its bytes leave rotated): plans go stale then.
            if (pending && !o.cache->cache.needs_prepare()) ++o.cache->epoch;
            return stored;
          },
          "seq"_a, "key"_a, nb::kw_only(), "stream"_a = nb::none(),
          "Start copying seq (every layer, K and V, scales) into pinned memory under key (key.layout must\n"
          "be the cache's layout_hash). True when the value is (or already was) there; False when it is\n"
          "larger than the whole arena. The sequence stays as it was: erase it to free its blocks.")
      .def(
          "load",
          [](PyBlockOffloader& o, const StoreKey& key, nb::handle stream) -> std::optional<SeqId> {
            use_stream(*o.cache, stream);
            const Stream s = resolve_stream(stream, o.cache->cache.device());
            std::optional<SeqId> got;
            {
              nb::gil_scoped_release g;
              got = o.off->load(key, s);
            }
            if (got) ++o.cache->epoch;  // a new sequence: plans made before go stale
            return got;
          },
          "key"_a, nb::kw_only(), "stream"_a = nb::none(),
          "A new sequence holding the value stored under key (pinned memory, then the lower store, whose\n"
          "hit is promoted), its copy queued on stream; None on a miss. OutOfMemoryError (nothing\n"
          "changed, the value kept) when the cache has too few free blocks.")
      .def(
          "contains",
          [](PyBlockOffloader& o, const StoreKey& key) {
            nb::gil_scoped_release g;
            return o.off->contains(key);
          },
          "key"_a, "Whether key's value is in pinned memory or in the lower store.")
      .def(
          "__contains__",
          [](PyBlockOffloader& o, const StoreKey& key) {
            nb::gil_scoped_release g;
            return o.off->contains(key);
          },
          "key"_a)
      .def(
          "poll", [](PyBlockOffloader& o) { o.off->poll(); },
          "Release holder sequences whose copies completed and pinned ranges nothing reads any more\n"
          "(every other call does this too).")
      .def(
          "flush",
          [](PyBlockOffloader& o) {
            nb::gil_scoped_release g;
            o.off->flush();
          },
          "Wait for every offload copy and every demotion to the lower store queued so far.")
      .def("stats", [](const PyBlockOffloader& o) { return o.off->stats(); }, "Counts (OffloadStats).")
      .def_prop_ro("cache", [](const PyBlockOffloader& o) { return o.cache_obj; }, "The PagedCache.")
      .def_prop_ro("lower", [](const PyBlockOffloader& o) { return o.lower_obj; }, "The lower KvStore (or None).");
}

}  // namespace kvcore::py
