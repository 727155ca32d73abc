// Store keys, sealed values, and sequences kept in a store.
#include <cstdio>
#include <cstring>

#include "kvcore/persist/kv_store.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "persist/bytes.hpp"
#include "persist/checksum.hpp"

namespace kvcore {

namespace {
constexpr char kSealMagic[8] = {'K', 'V', 'C', 'O', 'B', 'J', '1', '\0'};
constexpr uint16_t kSealMajor = 1, kSealMinor = 0;
}  // namespace

std::string StoreKey::hex() const {
  char buf[49];
  std::snprintf(buf, sizeof buf, "%016llx%016llx%016llx", static_cast<unsigned long long>(layout),
                static_cast<unsigned long long>(content_hi), static_cast<unsigned long long>(content_lo));
  return buf;
}

StoreKey store_key_for_tokens(std::span<const int32_t> tokens, std::string_view salt, const PagedCacheConfig& config) {
  persist::ByteWriter w;
  w.put(static_cast<uint32_t>(salt.size()));
  w.bytes(salt.data(), salt.size());
  w.bytes(tokens.data(), tokens.size() * sizeof(int32_t));
  const persist::Hash128 h = persist::xxh3_128(w.out.data(), w.out.size());
  return {h.hi, h.lo, layout_fingerprint_hash(config)};
}

std::vector<uint8_t> store_seal(const StoreKey& key, std::span<const uint8_t> payload) {
  persist::ByteWriter w;
  w.out.reserve(kSealHeaderBytes + payload.size());
  w.bytes(kSealMagic, 8);
  w.put(kSealMajor);
  w.put(kSealMinor);
  w.put(uint32_t{0});
  w.put(key.layout);
  w.put(key.content_hi);
  w.put(key.content_lo);
  w.put(static_cast<uint64_t>(payload.size()));
  w.put(persist::xxh3_64(payload));
  w.put(persist::xxh3_64(w.out.data(), w.out.size()));
  w.bytes(payload.data(), payload.size());
  return std::move(w.out);
}

std::optional<std::span<const uint8_t>> store_open(const StoreKey& key, std::span<const uint8_t> sealed) {
  if (sealed.size() < kSealHeaderBytes) return std::nullopt;
  uint64_t f[7];
  std::memcpy(f, sealed.data() + 8, sizeof f);
  if (std::memcmp(sealed.data(), kSealMagic, 8) != 0) return std::nullopt;
  if (persist::xxh3_64(sealed.data(), 56) != f[6]) return std::nullopt;
  if ((f[0] & 0xffff) != kSealMajor) return std::nullopt;
  if (f[1] != key.layout || f[2] != key.content_hi || f[3] != key.content_lo) return std::nullopt;
  if (f[4] != sealed.size() - kSealHeaderBytes) return std::nullopt;
  const std::span<const uint8_t> payload = sealed.subspan(kSealHeaderBytes);
  if (persist::xxh3_64(payload) != f[5]) return std::nullopt;
  return payload;
}

bool store_sequence(KvStore& store, const StoreKey& key, PagedCache& cache, SeqId seq, std::string_view model_id) {
  require_arg(key.layout == layout_fingerprint_hash(cache.config()), "store_sequence: key layout ", key.layout,
              " is not the cache's layout hash");
  const SeqId one[1] = {seq};
  const std::vector<uint8_t> bytes = snapshot_encode(cache, one, model_id);
  return store.put(key, bytes);
}

std::optional<SeqId> load_sequence(KvStore& store, const StoreKey& key, PagedCache& cache, std::string_view model_id,
                                   int32_t position_delta) {
  require_arg(key.layout == layout_fingerprint_hash(cache.config()), "load_sequence: key layout ", key.layout,
              " is not the cache's layout hash");
  const std::optional<std::vector<uint8_t>> v = store.get(key);
  if (!v) return std::nullopt;
  try {
    const SnapshotLoaded got = snapshot_decode(cache, *v, {std::string(model_id), position_delta});
    if (got.ids.size() != 1) {  // a sealed value of the right key always holds one sequence; refuse anything else
      for (SeqId id : got.ids) cache.erase(id);
      return std::nullopt;
    }
    return got.ids[0];
  } catch (const Error& e) {
    if (e.code() == ErrorCode::OutOfMemory) throw;
    return std::nullopt;  // a value that passed the seal but not the snapshot's checks: a miss
  }
}

}  // namespace kvcore
