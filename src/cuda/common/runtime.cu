#include <cuda_runtime.h>

#include "core/cuda_backend.hpp"
#include "cuda/common/check.cuh"

namespace kvcore::cuda_backend {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: report none
    return 0;
  }
  return n;
}

std::string device_name(int index) {
  cudaDeviceProp p{};
  KVCORE_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  return p.name;
}

void* allocate(size_t bytes, int index) {
  KVCORE_CUDA_CHECK(cudaSetDevice(index));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::OutOfMemory : ErrorCode::DeviceError,
                detail::concat("Buffer: cudaMalloc of ", bytes, " bytes on cuda:", index, " failed: ", cudaGetErrorString(e)));
  }
  return p;
}

void release(void* ptr, int index) noexcept {
  cudaSetDevice(index);
  cudaFree(ptr);
}

void copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) {
  const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
  auto s = static_cast<cudaStream_t>(stream);
  KVCORE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, s));
  if (kind != CopyKind::DeviceToDevice) KVCORE_CUDA_CHECK(cudaStreamSynchronize(s));
}

void fill(void* dst, int value, size_t bytes, void* stream) {
  KVCORE_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
}

void synchronize(int index, void* stream) {
  KVCORE_CUDA_CHECK(cudaSetDevice(index));
  if (stream) KVCORE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  else KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace kvcore::cuda_backend
