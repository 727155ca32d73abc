// Keys and payloads the store tests (and their writer process) agree on: payload_n(i, n) is a
// fixed pseudo-random byte string, so any reader can tell a right value from a wrong one.
#pragma once
#include <cstdint>
#include <vector>

#include "kvcore/persist/kv_store.hpp"

namespace persist_test {

inline kvcore::StoreKey key_n(int i) {
  const int32_t t[2] = {i, 7 * i};
  kvcore::PagedCacheConfig c;
  c.num_blocks = 1;
  c.rope = {kvcore::RopeSpec::plain(128, 10000.0)};
  return kvcore::store_key_for_tokens(t, "tenant-a", c);
}

inline std::vector<uint8_t> payload_n(int i, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

}  // namespace persist_test
