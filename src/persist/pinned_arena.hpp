// One block of host memory (pinned and mapped for a CUDA device, ordinary for the CPU) cut into
// ranges first fit, freed ranges merged with their neighbours. Not thread safe.
#pragma once
#include <cstdint>
#include <map>
#include <optional>

#include "kvcore/device.hpp"

namespace kvcore::persist {

class PinnedArena {
 public:
  static constexpr int64_t kAlign = 256;  // every range starts 256-byte aligned (vector copies)
  PinnedArena(int64_t bytes, Device device);
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  std::optional<int64_t> allocate(int64_t bytes);  // an offset, or nullopt when no free range fits
  void release(int64_t offset);
  uint8_t* host(int64_t offset) const { return base_ + offset; }
  uint8_t* device(int64_t offset) const { return device_base_ + offset; }  // what kernels address
  int64_t capacity() const { return bytes_; }
  int64_t used() const { return used_; }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* device_base_ = nullptr;
  int64_t bytes_ = 0, used_ = 0;
  bool pinned_ = false;
  std::map<int64_t, int64_t> free_;  // offset -> size
  std::map<int64_t, int64_t> taken_;
};

}  // namespace kvcore::persist
