// XXH3 (libxxhash, inlined: no library to link) over byte ranges.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace kvcore::persist {

uint64_t xxh3_64(const void* data, size_t bytes);
inline uint64_t xxh3_64(std::span<const uint8_t> s) { return xxh3_64(s.data(), s.size()); }
struct Hash128 {
  uint64_t hi = 0, lo = 0;
};
Hash128 xxh3_128(const void* data, size_t bytes, uint64_t seed = 0);

// Incremental XXH3-64 over pieces; equals xxh3_64 of their concatenation.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  void* state_;
};

}  // namespace kvcore::persist
