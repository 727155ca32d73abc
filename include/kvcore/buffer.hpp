// Buffer: owns memory on one device (RAII). Host memory is aligned (64 bytes by
// default); CUDA memory comes from cudaMalloc. Move-only.
//
// Thread safety: concurrent const calls on one Buffer are safe; a Buffer that is moved,
// assigned or destroyed must not be used by another thread at the same time.
#pragma once
#include <cstddef>
#include <vector>

#include "kvcore/device.hpp"
#include "kvcore/dtype.hpp"
#include "kvcore/stream.hpp"

namespace kvcore {

class Buffer {
 public:
  Buffer() = default;
  // Throws Error(OutOfMemory) naming the size and device when allocation fails.
  Buffer(size_t bytes, Device device, size_t alignment = 64);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return bytes_; }
  Device device() const { return device_; }
  bool empty() const { return bytes_ == 0; }

  // Upload or download whole host vectors (sizes must match exactly).
  template <class T>
  static Buffer from_host(const std::vector<T>& v, Device device) {
    Buffer b(v.size() * sizeof(T), device);
    b.copy_from_host(v.data(), v.size() * sizeof(T));
    return b;
  }
  template <class T>
  std::vector<T> to_host() const {
    std::vector<T> v(bytes_ / sizeof(T));
    copy_to_host(v.data(), v.size() * sizeof(T));
    return v;
  }
  void copy_from_host(const void* src, size_t bytes);
  void copy_to_host(void* dst, size_t bytes) const;

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu();
};

}  // namespace kvcore
