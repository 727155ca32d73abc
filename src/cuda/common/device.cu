// Per-device SM counts, compute capabilities and shared-memory opt-ins (device.hpp). All are asked for on
// every launch, so the answers already known are read without a lock (a few atomic loads); the
// driver is called, under a lock, only the first time for a device or a larger size.
#include "cuda/common/device.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/check.cuh"

namespace kvcore::ops::cuda {

namespace {

constexpr int kCachedDevices = 16;  // devices past these are answered under the lock
constexpr size_t kSlots = 1024;     // kernels with an opt-in (a power of two)

std::mutex& device_mutex() {
  static std::mutex m;
  return m;
}

std::atomic<int> g_sm_counts[kCachedDevices];  // 0: not queried yet
std::atomic<int> g_capabilities[kCachedDevices];  // 0: not queried yet

// A kernel's opt-in per device, in an open-addressed table keyed by the kernel's address:
// `kernel` is published once (never changed), `bytes` only grows.
struct OptIn {
  std::atomic<const void*> kernel{nullptr};
  std::atomic<size_t> bytes[kCachedDevices];
};
OptIn g_opt_ins[kSlots];
std::map<std::pair<const void*, int>, size_t> g_other_opt_ins;  // table full or device not cached; under the lock

size_t first_slot(const void* kernel) {
  return static_cast<size_t>((static_cast<uint64_t>(reinterpret_cast<uintptr_t>(kernel)) * 0x9E3779B97F4A7C15ull) >> 54);
}
static_assert(kSlots == size_t{1} << 10, "first_slot keeps 10 bits");

// The slot holding `kernel`, or (insert) the empty one it takes; nullptr when the table is full
// (or, without insert, when the kernel has none).
OptIn* find_slot(const void* kernel, bool insert) {
  for (size_t i = 0, s = first_slot(kernel); i < kSlots; ++i, s = (s + 1) % kSlots) {
    const void* k = g_opt_ins[s].kernel.load(std::memory_order_acquire);
    if (k == kernel) return &g_opt_ins[s];
    if (k == nullptr) {
      if (!insert) return nullptr;
      g_opt_ins[s].kernel.store(kernel, std::memory_order_release);  // inserts happen under the lock
      return &g_opt_ins[s];
    }
  }
  return nullptr;
}

}  // namespace

int sm_count(int device) {
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    const int n = g_sm_counts[device].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (cached) g_sm_counts[device].store(n, std::memory_order_relaxed);
  return n;
}

int compute_capability(int device) {
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    const int cc = g_capabilities[device].load(std::memory_order_relaxed);
    if (cc > 0) return cc;
  }
  int major = 0, minor = 0;
  KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int cc = 10 * major + minor;
  if (cached) g_capabilities[device].store(cc, std::memory_order_relaxed);
  return cc;
}

int current_device() {
  int device = 0;
  KVCORE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void smem_opt_in(const void* kernel, size_t bytes, int device) {
  if (bytes == 0) return;
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached)
    if (const OptIn* slot = find_slot(kernel, false); slot && slot->bytes[device].load(std::memory_order_acquire) >= bytes)
      return;
  const std::lock_guard<std::mutex> lock(device_mutex());
  OptIn* slot = cached ? find_slot(kernel, true) : nullptr;
  size_t* other = slot ? nullptr : &g_other_opt_ins[{kernel, device}];
  const size_t set = slot ? slot->bytes[device].load(std::memory_order_relaxed) : *other;
  if (set >= bytes) return;
  KVCORE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  if (slot) slot->bytes[device].store(bytes, std::memory_order_release);
  else *other = bytes;
}

}  // namespace kvcore::ops::cuda
