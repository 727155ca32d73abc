// Stores below device memory, behind one interface: host memory, a local disk directory, a
// remote Redis server (kvcore/persist/redis_store.hpp), and a tiered chain of them.
//
// Keys: a 128-bit content hash (what the bytes hold, e.g. a token prefix and a caller salt:
// store_key_for_tokens) and the 64-bit layout fingerprint hash (layout_fingerprint_hash), so
// one store serves many layouts without mixing them.
//
// Values are sealed: a 64-byte header (magic, version, the key, payload length, XXH3-64 of the
// payload, XXH3-64 of the header) then the payload. Every read opens the seal and checks the
// size, the header, the key and the checksum; any mismatch is a miss (counted as `rejected`),
// never wrong bytes. A store is a cache: it may drop anything at any time; a failed put or a
// tier that is down is not an error for the caller, only a miss later. Store calls therefore do
// not throw for tier trouble (I/O errors, lost connections, full disks); they throw
// kvcore::Error only for bad arguments.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"

namespace kvcore {

struct StoreKey {
  uint64_t content_hi = 0, content_lo = 0;  // 128-bit content hash
  uint64_t layout = 0;                      // layout_fingerprint_hash()
  bool operator==(const StoreKey&) const = default;
  std::string hex() const;  // 48 hex digits: layout, content hi, content lo
};

// XXH3-128 of (u32 salt length, salt bytes, the token ids as i32 little-endian), with the
// config's layout hash. Equal tokens under equal salts and layouts give equal keys.
StoreKey store_key_for_tokens(std::span<const int32_t> tokens, std::string_view salt, const PagedCacheConfig& config);

struct StoreStats {
  int64_t puts = 0, put_failures = 0;  // put() calls that stored / that did not
  int64_t hits = 0, misses = 0;
  int64_t rejected = 0;                // values found but refused by the seal check (counted as misses too)
  int64_t evictions = 0;               // values dropped for the size limit
  int64_t items = 0, bytes = 0;        // what the store holds now (sealed bytes), where it knows
  bool down = false;                   // a lost connection the store is waiting to retry
  int64_t reconnects = 0;
};

class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual std::string name() const = 0;
  // true when the value was stored (and, for durable tiers, is on stable storage).
  virtual bool put(const StoreKey& key, std::span<const uint8_t> payload) = 0;
  // The payload, checked; nullopt on a miss, a refused value or a tier that is down.
  virtual std::optional<std::vector<uint8_t>> get(const StoreKey& key) = 0;
  virtual bool contains(const StoreKey& key) = 0;
  virtual bool remove(const StoreKey& key) = 0;
  virtual StoreStats stats() const = 0;
};

// ---- sealing (what every store keeps) ----
inline constexpr size_t kSealHeaderBytes = 64;
std::vector<uint8_t> store_seal(const StoreKey& key, std::span<const uint8_t> payload);
// The payload of a sealed value if it is intact and sealed under `key`; nullopt otherwise.
std::optional<std::span<const uint8_t>> store_open(const StoreKey& key, std::span<const uint8_t> sealed);

// ---- host memory ----
// An LRU map bounded by max_bytes (sealed bytes); a value larger than the limit is refused.
// `on_evict` (optional) receives every key and sealed value the limit pushes out: a tiered
// store moves them down.
class HostStore : public KvStore {
 public:
  explicit HostStore(int64_t max_bytes);
  ~HostStore() override;
  std::string name() const override { return "host"; }
  bool put(const StoreKey& key, std::span<const uint8_t> payload) override;
  std::optional<std::vector<uint8_t>> get(const StoreKey& key) override;
  bool contains(const StoreKey& key) override;
  bool remove(const StoreKey& key) override;
  StoreStats stats() const override;
  // Stores an already sealed value (tiers pass values down without re-sealing).
  bool put_sealed(const StoreKey& key, std::vector<uint8_t> sealed);
  void set_on_evict(std::function<void(const StoreKey&, std::vector<uint8_t>&&)> f);

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// ---- a local disk directory ----
// One file per value, <dir>/<2 hex>/<48 hex>.kvo, written with a temporary file, fsync and
// rename (a reader never sees half a value; two processes writing one key leave one whole
// file). Bounded by max_bytes: the least recently used files go first. A full disk or any I/O
// error fails the put (no partial file stays), and the files already there stay readable.
class DiskStore : public KvStore {
 public:
  DiskStore(std::string dir, int64_t max_bytes, bool fsync_each_put = true);
  ~DiskStore() override;
  std::string name() const override { return "disk"; }
  bool put(const StoreKey& key, std::span<const uint8_t> payload) override;
  std::optional<std::vector<uint8_t>> get(const StoreKey& key) override;
  bool contains(const StoreKey& key) override;
  bool remove(const StoreKey& key) override;
  StoreStats stats() const override;
  bool put_sealed(const StoreKey& key, std::span<const uint8_t> sealed);
  std::string path_of(const StoreKey& key) const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// ---- tiers ----
// Tiers in order, fastest first (e.g. host, disk, redis). put() stores into the first tier only;
// values the first tier's limit evicts are written to every lower tier by a worker thread (the
// local disk keeps them for this machine, a shared server for all; the caller never waits for a
// slower tier; when the worker's queue holds more than max_queue_bytes the oldest moves are
// dropped and counted). get() tries the tiers in order (values on their way down included) and
// copies a hit from a lower tier back into the first one. The first tier must be a HostStore; lower tiers evict for good.
class TieredStore : public KvStore {
 public:
  TieredStore(std::vector<KvStore*> tiers, int64_t max_queue_bytes = int64_t{1} << 30);
  ~TieredStore() override;
  std::string name() const override { return "tiered"; }
  bool put(const StoreKey& key, std::span<const uint8_t> payload) override;
  std::optional<std::vector<uint8_t>> get(const StoreKey& key) override;
  bool contains(const StoreKey& key) override;
  bool remove(const StoreKey& key) override;
  StoreStats stats() const override;  // of the chain: hits anywhere, misses everywhere
  // Blocks until the worker has moved everything queued so far (tests, shutdown).
  void flush();
  int64_t dropped_moves() const;
  int64_t tier_hits(size_t tier) const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// ---- sequences in a store ----
// Stores `seq` of `cache` (its snapshot encoding: a second, inner layer of checksums) under
// `key`; false when the store did not take it.
bool store_sequence(KvStore& store, const StoreKey& key, PagedCache& cache, SeqId seq, std::string_view model_id);
// Loads the sequence stored under `key` as a new sequence of `cache`; nullopt on a miss or a
// value that fails any check (the cache is then unchanged). OutOfMemory when the cache has too
// few free blocks.
std::optional<SeqId> load_sequence(KvStore& store, const StoreKey& key, PagedCache& cache, std::string_view model_id,
                                   int32_t position_delta = 0);

}  // namespace kvcore
