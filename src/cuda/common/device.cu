// Per-device SM counts and shared-memory opt-ins (device.hpp).
#include "cuda/common/device.hpp"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/common/check.cuh"

namespace kvcore::ops::cuda {

namespace {

std::mutex& device_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

int sm_count(int device) {
  if (device < 0) {  // not a device: CUDA's own error, nothing cached
    int n = 0;
    KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }
  static std::vector<int> counts;  // by device; 0: not queried yet
  const std::lock_guard<std::mutex> lock(device_mutex());
  if (device >= static_cast<int>(counts.size())) counts.resize(static_cast<size_t>(device) + 1, 0);
  int& n = counts[static_cast<size_t>(device)];
  if (n == 0) KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

int current_device() {
  int device = 0;
  KVCORE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void smem_opt_in(const void* kernel, size_t bytes, int device) {
  if (bytes == 0) return;
  static std::map<std::pair<const void*, int>, size_t> limits;  // (kernel, device) -> bytes set
  const std::lock_guard<std::mutex> lock(device_mutex());
  size_t& set = limits[{kernel, device}];
  if (set >= bytes) return;
  KVCORE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  set = bytes;
}

}  // namespace kvcore::ops::cuda
