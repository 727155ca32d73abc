// The offload tier's host arena (pinned_arena.hpp).
#include "persist/pinned_arena.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "kvcore/error.hpp"
#include "persist/async_copy.hpp"

namespace kvcore::persist {

PinnedArena::PinnedArena(int64_t bytes, Device device) : bytes_((bytes + kAlign - 1) / kAlign * kAlign) {
  require_arg(bytes > 0, "PinnedArena: bytes must be positive, got ", bytes);
#if KVCORE_WITH_CUDA
  if (device.is_cuda()) {
    gpu::set_device(device.index);
    base_ = static_cast<uint8_t*>(gpu::pinned_alloc(static_cast<size_t>(bytes_)));
    device_base_ = static_cast<uint8_t*>(gpu::device_pointer(base_));
    pinned_ = true;
  }
#endif
  (void)device;  // CPU: ordinary memory whatever the device says
  if (!pinned_) {
    base_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, static_cast<size_t>(bytes_)));
    require(base_ != nullptr, ErrorCode::OutOfMemory, "PinnedArena: cannot allocate ", bytes_, " host bytes");
    device_base_ = base_;
  }
  free_[0] = bytes_;
}

PinnedArena::~PinnedArena() {
#if KVCORE_WITH_CUDA
  if (pinned_) {
    gpu::pinned_free(base_);
    return;
  }
#endif
  std::free(base_);
}

std::optional<int64_t> PinnedArena::allocate(int64_t bytes) {
  const int64_t want = (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const int64_t off = it->first, rest = it->second - want;
    free_.erase(it);
    if (rest > 0) free_[off + want] = rest;
    taken_[off] = want;
    used_ += want;
    return off;
  }
  return std::nullopt;
}

void PinnedArena::release(int64_t offset) {
  auto t = taken_.find(offset);
  require(t != taken_.end(), ErrorCode::InvalidArgument, "PinnedArena: release of offset ", offset, " that is not taken");
  int64_t off = offset, size = t->second;
  used_ -= size;
  taken_.erase(t);
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[off] = size;
}

}  // namespace kvcore::persist
