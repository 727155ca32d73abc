#include "kvcore/buffer.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <utility>

#include "core/cuda_backend.hpp"
#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore {

Buffer::Buffer(size_t bytes, Device device, size_t alignment) : bytes_(bytes), device_(device) {
  require_arg(alignment > 0 && (alignment & (alignment - 1)) == 0, "Buffer: alignment must be a power of two, got ", alignment);
  if (bytes == 0) return;
  if (device.is_cpu()) {
    // Large buffers (K/V pools, read block by block in any order) go on 2 MiB pages where
    // the kernel gives them on request (transparent huge pages in "madvise" mode): with
    // 4 KiB pages every scattered block costs TLB misses and the hardware prefetchers
    // stop at each page.
    constexpr size_t kHuge = size_t{2} << 20;
    const bool huge = bytes >= 2 * kHuge;
    if (huge) alignment = std::max(alignment, kHuge);
    const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    data_ = std::aligned_alloc(alignment, rounded);
    require(data_ != nullptr, ErrorCode::OutOfMemory, "Buffer: cannot allocate ", bytes, " bytes on cpu");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge) (void)madvise(data_, rounded, MADV_HUGEPAGE);  // a hint: where refused, small pages serve
#endif
    return;
  }
#if KVCORE_WITH_CUDA
  data_ = cuda_backend::allocate(bytes, device.index);
#else
  throw Error(ErrorCode::NotSupported, detail::concat("Buffer: device ", device.str(), " requested but this build has no CUDA backend"));
#endif
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (!data_) return;
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
#if KVCORE_WITH_CUDA
    cuda_backend::release(data_, device_.index);
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
}

void Buffer::copy_from_host(const void* src, size_t bytes) {
  require_arg(bytes == bytes_, "Buffer::copy_from_host: ", bytes, " bytes given for a buffer of ", bytes_);
  copy_bytes(data_, device_, src, Device::cpu(), bytes);
}

void Buffer::copy_to_host(void* dst, size_t bytes) const {
  require_arg(bytes == bytes_, "Buffer::copy_to_host: ", bytes, " bytes asked of a buffer of ", bytes_);
  copy_bytes(dst, Device::cpu(), data_, device_, bytes);
}

}  // namespace kvcore
