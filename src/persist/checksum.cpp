#include "persist/checksum.hpp"

#include <new>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvcore::persist {

uint64_t xxh3_64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }
Hash128 xxh3_128(const void* data, size_t bytes, uint64_t seed) {
  const XXH128_hash_t h = XXH3_128bits_withSeed(data, bytes, seed);
  return {h.high64, h.low64};
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}
uint64_t Xxh3Stream::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

}  // namespace kvcore::persist
