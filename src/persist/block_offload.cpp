// BlockOffloader (kvcore/persist/block_offload.hpp): the pinned-host tier of a PagedCache, its
// event ordering on CUDA, and the worker that moves evicted values down to a KvStore.
#include "kvcore/persist/block_offload.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/paged_export.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "kvcore/runtime.hpp"
#include "persist/async_copy.hpp"
#include "persist/pinned_arena.hpp"
#include "persist/snapshot_format.hpp"
#include "transfer/block_copy.hpp"

namespace kvcore {

namespace {

struct KeyHash {
  size_t operator()(const StoreKey& k) const {
    return static_cast<size_t>(k.content_lo ^ (k.content_hi * 0x9e3779b97f4a7c15ull) ^ (k.layout * 0xc2b2ae3d27d4eb4full));
  }
};

// A recorded CUDA event, destroyed when the last holder lets go (a load's event is held by its
// entry and by its scratch block list).
using Event = std::shared_ptr<void>;

[[maybe_unused]] Event new_event() {
#if KVCORE_WITH_CUDA
  return Event(persist::gpu::event_create(), [](void* e) { persist::gpu::event_destroy(e); });
#else
  return {};
#endif
}
bool done(const Event& e) {
#if KVCORE_WITH_CUDA
  return !e || persist::gpu::event_done(e.get());
#else
  (void)e;
  return true;
#endif
}
void wait_host(const Event& e) {
#if KVCORE_WITH_CUDA
  if (e) persist::gpu::event_wait_host(e.get());
#else
  (void)e;
#endif
}

int64_t aligned(int64_t n) { return (n + persist::PinnedArena::kAlign - 1) / persist::PinnedArena::kAlign * persist::PinnedArena::kAlign; }

// Cells of each export block that its widest holder spans; the cells past it hold bytes the
// value does not own (zeroed wherever the value leaves pinned memory).
std::vector<int32_t> export_spans(const PagedExport& ex) {
  std::vector<int32_t> span(static_cast<size_t>(ex.n_blocks), 0);
  const int32_t bs = ex.block_size;
  for (const PagedExport::Seq& s : ex.seqs)
    for (size_t bi = 0; bi < s.blocks.size(); ++bi)
      span[s.blocks[bi]] = std::max(span[s.blocks[bi]], std::min(bs, s.n_cells - static_cast<int32_t>(bi) * bs));
  return span;
}

// One value in pinned memory: its payload (array-major, export order, as PagedExport holds it)
// at `offset`, then room for a block list (what the offload copy reads on the device).
struct Entry {
  StoreKey key;
  PagedExport manifest;  // payload empty: the bytes are in the arena
  std::vector<int32_t> spans;
  int64_t offset = 0, payload_bytes = 0, list_offset = 0;
  Event copied;              // after the offload copy (empty: complete)
  std::vector<Event> reads;  // after each load's copy out of this range
  SeqId holder = -1;         // fork keeping the blocks until `copied` completes
  bool demoting = false;     // handed to the reader (engine thread's view)
  bool demoted = false;      // the reader copied it out: the range may go (guarded by State::mu)
  bool promoted = false;     // just brought back from below (counts the load as a lower hit)
};

}  // namespace

void OffloadConfig::validate() const {
  require_arg(pinned_bytes > 0, "OffloadConfig: pinned_bytes must be positive, got ", pinned_bytes);
  require_arg(max_queue_bytes >= 0, "OffloadConfig: max_queue_bytes must be >= 0, got ", max_queue_bytes);
}

struct BlockOffloader::State {
  PagedCache* cache = nullptr;
  OffloadConfig cfg;
  Device dev = Device::cpu();
  bool cuda = false;
  uint64_t layout = 0;
  std::string fingerprint;
  std::unique_ptr<persist::PinnedArena> arena;
  Stream side;
  std::list<Entry> entries;  // front: most recently used
  std::unordered_map<StoreKey, std::list<Entry>::iterator, KeyHash> index;
  struct Scratch {
    int64_t offset = 0;
    Event done;
  };
  std::vector<Scratch> scratch;  // loads' block lists, released when their copies complete
  OffloadStats st;

  Stream cache_stream() const { return cache->config().stream; }

  // Two workers: the reader waits for a value's offload copy, copies it out of pinned memory
  // (so its range can be reused at host-memory speed) and hands it to the writer, which puts it
  // into `lower` at whatever speed that tier has. Neither ever makes the caller wait for `lower`.
  struct Pending {
    StoreKey key;
    PagedExport ex;  // with its payload, past-span cells zeroed
  };
  std::mutex mu;  // guards everything below and Entry::demoted
  std::condition_variable cv_read, cv_write, cv_released, idle;
  std::deque<Entry*> to_read;
  std::deque<std::shared_ptr<Pending>> to_write;
  std::unordered_map<StoreKey, std::shared_ptr<Pending>, KeyHash> pending;  // values on their way down
  int64_t queued_bytes = 0;
  int reading = 0, writing = 0;
  bool stop = false;
  std::thread reader, writer;

  void reader_loop() {
    for (;;) {
      Entry* e = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_read.wait(lock, [&] { return stop || !to_read.empty(); });
        if (to_read.empty()) return;
        e = to_read.front();
        to_read.pop_front();
        ++reading;
      }
      auto p = std::make_shared<Pending>();
      bool ok = true;
      try {
        wait_host(e->copied);  // the pinned bytes are read only once the offload copy completed
        p->key = e->key;
        p->ex = e->manifest;
        const uint8_t* src = arena->host(e->offset);
        p->ex.payload.assign(src, src + e->payload_bytes);
        zero_past_spans(p->ex.payload.data(), *e);
      } catch (...) {  // a device fault: the value is lost, a miss later
        ok = false;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (ok) {
          queued_bytes += p->ex.payload_bytes();
          to_write.push_back(p);
          pending[p->key] = p;
          while (queued_bytes > cfg.max_queue_bytes && to_write.size() > 1) {  // the oldest go first
            std::shared_ptr<Pending> old = to_write.front();
            to_write.pop_front();
            queued_bytes -= old->ex.payload_bytes();
            if (auto it = pending.find(old->key); it != pending.end() && it->second == old) pending.erase(it);
            ++st.dropped;
          }
        } else {
          ++st.demote_failures;
        }
        e->demoted = true;
        --reading;
      }
      cv_write.notify_one();
      cv_released.notify_all();
      idle.notify_all();
    }
  }

  void writer_loop() {
    for (;;) {
      std::shared_ptr<Pending> p;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_write.wait(lock, [&] { return stop || !to_write.empty(); });
        if (to_write.empty()) return;
        p = to_write.front();
        to_write.pop_front();
        queued_bytes -= p->ex.payload_bytes();
        ++writing;
      }
      bool ok = false;
      try {
        ok = cfg.lower->put(p->key, persist::encode_snapshot(p->ex, fingerprint, cfg.model_id).concat());
      } catch (...) {  // a store is a cache: a value it cannot take is a miss later, not an error
        ok = false;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        ++(ok ? st.demoted : st.demote_failures);
        if (auto it = pending.find(p->key); it != pending.end() && it->second == p) pending.erase(it);
        --writing;
      }
      idle.notify_all();
    }
  }

  // Zeroes, in a host copy of e's payload, the cells past each block's span.
  static void zero_past_spans(uint8_t* payload, const Entry& e) {
    const int32_t bs = e.manifest.block_size, n = e.manifest.n_blocks;
    for (int64_t bb : e.manifest.array_block_bytes) {
      const int64_t cell = bb / bs;
      for (int32_t b = 0; b < n; ++b)
        if (e.spans[b] < bs) std::memset(payload + b * bb + e.spans[b] * cell, 0, static_cast<size_t>((bs - e.spans[b]) * cell));
      payload += n * bb;
    }
  }

  void touch(std::list<Entry>::iterator it) { entries.splice(entries.begin(), entries, it); }

  void release_holder(Entry& e) {
    if (e.holder < 0) return;
    cache->erase(e.holder);
    e.holder = -1;
  }

  bool demoted(const Entry& e) {
    std::lock_guard<std::mutex> lock(mu);
    return e.demoted;
  }

  void remove(std::list<Entry>::iterator it) {
    arena->release(it->offset);
    index.erase(it->key);
    entries.erase(it);
  }

  void poll() {
    for (auto it = entries.begin(); it != entries.end();) {
      Entry& e = *it;
      if (e.holder >= 0 && done(e.copied)) release_holder(e);
      e.reads.erase(std::remove_if(e.reads.begin(), e.reads.end(), [](const Event& r) { return done(r); }), e.reads.end());
      auto next = std::next(it);
      if (e.demoting && e.reads.empty() && demoted(e)) remove(it);
      it = next;
    }
    for (size_t i = 0; i < scratch.size();) {
      if (done(scratch[i].done)) {
        arena->release(scratch[i].offset);
        scratch[i] = std::move(scratch.back());
        scratch.pop_back();
      } else {
        ++i;
      }
    }
  }

  // Takes `it` out of pinned memory: down to `lower` through the workers, or dropped. Without a
  // lower store the range is released at once, after waiting for the copies that touch it.
  void evict(std::list<Entry>::iterator it) {
    Entry& e = *it;
    if (cfg.lower) {
      e.demoting = true;
      {
        std::lock_guard<std::mutex> lock(mu);
        to_read.push_back(&e);
      }
      cv_read.notify_one();
      return;
    }
    wait_host(e.copied);
    release_holder(e);
    for (const Event& r : e.reads) wait_host(r);
    ++st.dropped;
    remove(it);
  }

  // An arena range of `bytes`, evicting least recently used values. Waits only for the reader to
  // copy evicted values out (and for loads still reading them), never for `lower`.
  std::optional<int64_t> make_room(int64_t bytes) {
    for (;;) {
      if (std::optional<int64_t> off = arena->allocate(bytes)) return off;
      auto victim = entries.end();
      for (auto it = entries.rbegin(); it != entries.rend(); ++it)
        if (!it->demoting) {
          victim = std::prev(it.base());
          break;
        }
      if (victim != entries.end()) {
        evict(victim);
        poll();
        continue;
      }
      if (entries.empty()) return std::nullopt;
      // Everything left is on its way out: wait until the reader has copied it, then for its loads.
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_released.wait(lock, [&] { return to_read.empty() && reading == 0; });
      }
      for (Entry& e : entries)
        for (const Event& r : e.reads) wait_host(r);
      poll();
    }
  }

  // A new entry over [offset, offset + payload + list) for `manifest`.
  std::list<Entry>::iterator add(const StoreKey& key, PagedExport manifest, int64_t offset) {
    Entry& e = entries.emplace_front();
    e.key = key;
    e.spans = export_spans(manifest);
    e.payload_bytes = manifest.payload_bytes();
    e.manifest = std::move(manifest);
    e.manifest.payload.clear();
    e.offset = offset;
    e.list_offset = offset + aligned(e.payload_bytes);
    index[key] = entries.begin();
    return entries.begin();
  }

  int64_t footprint(const PagedExport& ex) const { return aligned(ex.payload_bytes()) + 4 * int64_t{ex.n_blocks}; }

  // Copies e's payload into `blocks` of the cache on `stream`, then zeroes the cells past the spans.
  void write_blocks(Entry& e, std::span<const int32_t> blocks, Stream stream) {
    const std::vector<PagedPoolArray> arrays = paged_pool_arrays(*cache);
    const int32_t n = e.manifest.n_blocks, bs = e.manifest.block_size;
    const int32_t* list = blocks.data();
    Event finished;
    std::optional<int64_t> scratch_off;
    if (cuda) {
      // The block list must stay readable until the copy ran: a scratch range of the arena, or,
      // when none is free, the entry's own list slot once nothing else reads it.
      scratch_off = arena->allocate(4 * int64_t{n});
      int64_t list_off = e.list_offset;
      if (scratch_off) {
        list_off = *scratch_off;
      } else {
        wait_host(e.copied);
        for (const Event& r : e.reads) wait_host(r);
      }
      std::memcpy(arena->host(list_off), blocks.data(), 4 * static_cast<size_t>(n));
      list = reinterpret_cast<const int32_t*>(arena->device(list_off));
#if KVCORE_WITH_CUDA
      Event reserved = new_event();  // after everything the cache queued, the reservation included
      persist::gpu::event_record(reserved.get(), cache_stream());
      persist::gpu::stream_wait(stream, reserved.get());
      if (e.copied) persist::gpu::stream_wait(stream, e.copied.get());  // never before the bytes are whole
#endif
    }
    int64_t at = e.offset;
    for (const PagedPoolArray& a : arrays) {
      xfer::BlockCopy c{a.base, a.block_bytes, list, n, cuda ? arena->device(at) : arena->host(at)};
      xfer::scatter_blocks(c, dev, stream);
      const int64_t cell = a.block_bytes / bs;
      for (int32_t b = 0; b < n; ++b)
        if (e.spans[b] < bs)
          fill_bytes(a.base + blocks[b] * a.block_bytes + e.spans[b] * cell, dev, 0, static_cast<size_t>((bs - e.spans[b]) * cell),
                     stream);
      at += n * a.block_bytes;
    }
#if KVCORE_WITH_CUDA
    if (cuda) {
      finished = new_event();
      persist::gpu::event_record(finished.get(), stream);
      persist::gpu::stream_wait(cache_stream(), finished.get());  // later cache work on these blocks follows the copy
      e.reads.push_back(finished);
      if (scratch_off) scratch.push_back({*scratch_off, finished});
    }
#endif
  }

  void flush() {
    for (Entry& e : entries) {
      wait_host(e.copied);
      release_holder(e);
      for (const Event& r : e.reads) wait_host(r);
    }
    for (const Scratch& s : scratch) wait_host(s.done);
    {
      std::unique_lock<std::mutex> lock(mu);
      idle.wait(lock, [&] { return to_read.empty() && to_write.empty() && reading == 0 && writing == 0; });
    }
    poll();
  }
};

BlockOffloader::BlockOffloader(PagedCache& cache, OffloadConfig config) : s_(std::make_unique<State>()) {
  config.validate();
  State& s = *s_;
  s.cache = &cache;
  s.cfg = std::move(config);
  s.dev = cache.device();
  s.cuda = s.dev.is_cuda();
  s.layout = layout_fingerprint_hash(cache.config());
  s.fingerprint = layout_fingerprint(cache.config());
  s.arena = std::make_unique<persist::PinnedArena>(s.cfg.pinned_bytes, s.dev);
#if KVCORE_WITH_CUDA
  if (s.cuda) s.side = persist::gpu::stream_create(s.dev.index);
#endif
  if (s.cfg.lower) {
    s.reader = std::thread([&s] { s.reader_loop(); });
    s.writer = std::thread([&s] { s.writer_loop(); });
  }
}

BlockOffloader::~BlockOffloader() {
  State& s = *s_;
  try {
    s.flush();
  } catch (...) {  // a device fault: holders and ranges go with the cache and the arena
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stop = true;
  }
  s.cv_read.notify_all();
  s.cv_write.notify_all();
  if (s.reader.joinable()) s.reader.join();
  if (s.writer.joinable()) s.writer.join();
  for (Entry& e : s.entries) {
    try {
      s.release_holder(e);
    } catch (...) {
    }
  }
  s.entries.clear();
  s.scratch.clear();
#if KVCORE_WITH_CUDA
  if (s.cuda) persist::gpu::stream_destroy(s.side);
#endif
}

bool BlockOffloader::offload(SeqId seq, const StoreKey& key) {
  State& s = *s_;
  require_arg(key.layout == s.layout, "BlockOffloader::offload: key layout ", key.layout, " is not the cache's layout hash ",
              s.layout);
  (void)s.cache->info(seq);  // InvalidArgument for an unknown id
  s.poll();
  if (auto it = s.index.find(key); it != s.index.end()) {
    s.touch(it->second);
    return true;
  }
  const SeqId one[1] = {seq};
  PagedExportPlan plan = paged_export_plan(*s.cache, one);
  const int64_t bytes = s.footprint(plan.manifest);
  std::optional<int64_t> off = bytes <= s.arena->capacity() ? s.make_room(bytes) : std::nullopt;
  if (!off) {
    ++s.st.refused;
    return false;
  }
  auto it = s.add(key, std::move(plan.manifest), *off);
  Entry& e = *it;
  try {
    const int32_t n = e.manifest.n_blocks;
    std::memcpy(s.arena->host(e.list_offset), plan.cache_blocks.data(), 4 * static_cast<size_t>(n));
    const int32_t* list = reinterpret_cast<const int32_t*>(s.cuda ? s.arena->device(e.list_offset) : s.arena->host(e.list_offset));
    Stream copy_on{};
#if KVCORE_WITH_CUDA
    if (s.cuda) {
      e.holder = s.cache->fork(seq);  // the blocks stay allocated and unchanged until the copy completed
      Event ready = new_event();      // after the work that wrote the blocks
      persist::gpu::event_record(ready.get(), s.cache_stream());
      persist::gpu::stream_wait(s.side, ready.get());
      copy_on = s.side;
    }
#endif
    int64_t at = e.offset;
    for (const PagedPoolArray& a : paged_pool_arrays(*s.cache)) {
      xfer::BlockCopy c{a.base, a.block_bytes, list, n, s.cuda ? s.arena->device(at) : s.arena->host(at)};
      xfer::gather_blocks(c, s.dev, copy_on);
      at += n * a.block_bytes;
    }
#if KVCORE_WITH_CUDA
    if (s.cuda) {
      e.copied = new_event();
      persist::gpu::event_record(e.copied.get(), s.side);
    }
#endif
  } catch (...) {
    try {
      s.flush();  // whatever was queued completes before the range goes back
      s.release_holder(e);
    } catch (...) {
    }
    s.remove(it);
    throw;
  }
  ++s.st.offloads;
  return true;
}

std::optional<SeqId> BlockOffloader::load(const StoreKey& key, Stream stream) {
  State& s = *s_;
  require_arg(key.layout == s.layout, "BlockOffloader::load: key layout ", key.layout, " is not the cache's layout hash ",
              s.layout);
  s.poll();
  auto found = s.index.find(key);
  if (found == s.index.end()) {
    // Not in pinned memory: a value on its way down, else `lower` (checked: a bad value is a miss).
    std::shared_ptr<State::Pending> p;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (auto it = s.pending.find(key); it != s.pending.end()) p = it->second;
    }
    std::optional<persist::ParsedSnapshot> parsed;
    const PagedExport* ex = p ? &p->ex : nullptr;
    if (!ex) {
      std::optional<std::vector<uint8_t>> v = s.cfg.lower ? s.cfg.lower->get(key) : std::nullopt;
      if (v) {
        try {
          parsed = persist::parse_snapshot(*v);
        } catch (const Error&) {  // sealed but not a whole snapshot: a miss
        }
      }
      if (parsed && parsed->summary.fingerprint == s.fingerprint && parsed->summary.model_id == s.cfg.model_id &&
          parsed->ex.seqs.size() == 1 && parsed->ex.array_block_bytes == paged_array_block_bytes(*s.cache))
        ex = &parsed->ex;
    }
    if (!ex) {
      ++s.st.misses;
      return std::nullopt;
    }
    const int64_t bytes = s.footprint(*ex);
    std::optional<int64_t> off = bytes <= s.arena->capacity() ? s.make_room(bytes) : std::nullopt;
    if (!off) {  // no pinned room: straight from host memory, on the cache's stream
      const std::vector<SeqId> ids = paged_import(*s.cache, *ex);
      ++s.st.lower_hits;
      return ids[0];
    }
    PagedExport manifest = *ex;
    manifest.payload.clear();
    auto it = s.add(key, std::move(manifest), *off);
    std::memcpy(s.arena->host(it->offset), ex->payload.data(), ex->payload.size());
    it->promoted = true;
    found = s.index.find(key);
  }
  auto it = found->second;
  s.touch(it);
  const std::vector<SeqId> ids =
      paged_import_with(*s.cache, it->manifest, 0, [&](std::span<const int32_t> blocks) { s.write_blocks(*it, blocks, stream); });
  if (it->promoted) {
    it->promoted = false;
    ++s.st.lower_hits;
  } else {
    ++s.st.pinned_hits;
  }
  return ids[0];
}

bool BlockOffloader::contains(const StoreKey& key) {
  State& s = *s_;
  if (s.index.count(key)) return true;
  {
    // Copied out of the arena, not yet in `lower` (load serves it from here): the writer takes
    // it out of `pending` only after its put, so one of the two holds it.
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.pending.count(key)) return true;
  }
  return s.cfg.lower && s.cfg.lower->contains(key);
}

void BlockOffloader::poll() { s_->poll(); }
void BlockOffloader::flush() { s_->flush(); }

OffloadStats BlockOffloader::stats() const {
  State& s = *s_;
  OffloadStats st;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    st = s.st;
  }
  st.entries = static_cast<int64_t>(s.entries.size());
  st.pinned_used = s.arena->used();
  st.holders = 0;
  for (const Entry& e : s.entries) st.holders += e.holder >= 0 ? 1 : 0;
  return st;
}

Stream BlockOffloader::copy_stream() const { return s_->side; }

}  // namespace kvcore
