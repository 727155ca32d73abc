#include "kvcore/runtime.hpp"

#include <cstring>

#include "core/cuda_backend.hpp"
#include "kvcore/error.hpp"

namespace kvcore {

const char* version() { return KVCORE_VERSION_STRING; }

bool cuda_compiled() {
#if KVCORE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if KVCORE_WITH_CUDA
  return cuda_backend::device_count();
#else
  return 0;
#endif
}

namespace {
[[noreturn, maybe_unused]] void no_cuda(const char* what) {
  throw Error(ErrorCode::NotSupported,
              detail::concat(what, ": this kvcore build has no CUDA backend (configure with -DKVCORE_CUDA=ON)"));
}
}  // namespace

std::string device_name(Device d) {
  if (d.is_cpu()) return "cpu";
#if KVCORE_WITH_CUDA
  return cuda_backend::device_name(d.index);
#else
  no_cuda("device_name");
#endif
}

Device default_device() { return cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu(); }

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
#if KVCORE_WITH_CUDA
  using K = cuda_backend::CopyKind;
  const K kind = dst_dev.is_cpu() ? K::DeviceToHost : (src_dev.is_cpu() ? K::HostToDevice : K::DeviceToDevice);
  cuda_backend::copy(dst, src, bytes, kind, stream.handle);
#else
  (void)stream;
  no_cuda("copy_bytes");
#endif
}

void fill_bytes(void* dst, Device dev, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (dev.is_cpu()) {
    std::memset(dst, value, bytes);
    return;
  }
#if KVCORE_WITH_CUDA
  cuda_backend::fill(dst, value, bytes, stream.handle);
#else
  (void)stream;
  no_cuda("fill_bytes");
#endif
}

void synchronize(Device d, Stream stream) {
  if (d.is_cpu()) return;
#if KVCORE_WITH_CUDA
  cuda_backend::synchronize(d.index, stream.handle);
#else
  (void)stream;
  no_cuda("synchronize");
#endif
}

}  // namespace kvcore
