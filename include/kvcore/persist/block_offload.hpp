// BlockOffloader: the device and pinned-host tiers of a PagedCache, below which any KvStore
// (host, disk, Redis, a TieredStore chain) takes what pinned memory evicts.
//
// offload(seq, key) copies the sequence's blocks (every layer, K and V, scales) into a pinned
// host arena (cudaHostAlloc) without blocking the cache's stream or waiting for the copy:
//   - an event recorded on the cache's stream orders the copy after the work that wrote the
//     blocks; the copy runs on the offloader's own side stream, and an event recorded after it
//     marks the bytes complete;
//   - until that event completes, a holder sequence (a fork of `seq`) keeps the blocks: they are
//     never freed, and never changed (a write to a shared block copies it first), while the copy
//     reads them. poll() (called by every method) erases holders whose copies completed.
// load(key, stream) reserves fresh blocks, then copies the value into them on the caller's
// stream, ordered after the blocks were reserved (the caller's stream waits for an event on the
// cache's stream) and after the value's own offload copy completed (it waits for that event),
// so a block is never served before its bytes are whole. The cache's stream then waits for the
// load, so later cache work on those blocks follows it.
// Pinned memory is bounded: the least recently used values go down to `lower` through two
// worker threads. The reader waits for the value's offload-copy event, then copies the pinned
// bytes out (host-memory speed); the writer puts them into `lower` at that tier's speed, from a
// queue bounded by max_queue_bytes (the oldest are dropped past it). A pinned range is reused
// only after its offload copy, the reader's copy and every load reading it completed; offload()
// may wait for those, never for `lower`. A lookup that misses in pinned memory tries the values
// on their way down, then `lower` (values checked by the store's seal and by the snapshot's
// checksums: a bad value is a miss, never wrong K/V), and promotes a hit into pinned memory.
//
// On the CPU the same API runs synchronously (the arena is ordinary memory, copies are memcpy,
// no holder is needed). Values in `lower` use the snapshot encoding of one sequence, so
// load_sequence() reads them too, and they are keyed like store_sequence()'s.
//
// Thread safety: calls must not overlap each other or any call on the cache (the cache is not
// thread safe); the worker touches only pinned bytes and `lower`. The offloader must not outlive
// its cache; its destructor waits for every copy and demotion and erases its holders.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/persist/kv_store.hpp"
#include "kvcore/stream.hpp"

namespace kvcore {

struct OffloadConfig {
  int64_t pinned_bytes = int64_t{1} << 30;  // the pinned arena (values and their block lists)
  KvStore* lower = nullptr;                 // where evicted values go (nullptr: dropped)
  std::string model_id;                     // recorded in every value; a value of another model is a miss
  int64_t max_queue_bytes = int64_t{1} << 30;  // values copied out, waiting for `lower`: past it the oldest are dropped
  void validate() const;                    // InvalidArgument naming the field
};

struct OffloadStats {
  int64_t offloads = 0;       // values copied into pinned memory
  int64_t refused = 0;        // offload() calls whose value is larger than the whole arena
  int64_t pinned_hits = 0, lower_hits = 0, misses = 0;
  int64_t demoted = 0, demote_failures = 0;  // values the worker moved to `lower` / that `lower` refused
  int64_t dropped = 0;        // evicted values dropped (no lower store, or the queue to it full)
  int64_t entries = 0;        // values in pinned memory now
  int64_t pinned_used = 0;    // arena bytes in use now
  int64_t holders = 0;        // holder sequences alive now (copies in flight)
};

class BlockOffloader {
 public:
  BlockOffloader(PagedCache& cache, OffloadConfig config);
  ~BlockOffloader();
  BlockOffloader(const BlockOffloader&) = delete;
  BlockOffloader& operator=(const BlockOffloader&) = delete;

  // Starts copying `seq` into pinned memory under `key` (key.layout must be the cache's layout
  // hash). true when the value is (or already was) in pinned memory; false when it was refused
  // (larger than the arena).
  bool offload(SeqId seq, const StoreKey& key);
  // A new sequence holding the value stored under `key`, its copy queued on `stream` (CUDA);
  // nullopt on a miss. OutOfMemory (nothing changed) when the cache has too few free blocks.
  std::optional<SeqId> load(const StoreKey& key, Stream stream = {});
  bool contains(const StoreKey& key);  // in pinned memory, on its way down, or in `lower`
  // Releases holders whose copies completed and pinned ranges nothing reads any more.
  void poll();
  // Waits for every offload copy and every demotion queued so far (tests, shutdown).
  void flush();
  OffloadStats stats() const;
  // The cache's device side stream the offload copies run on (CUDA; empty on the CPU).
  Stream copy_stream() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace kvcore
