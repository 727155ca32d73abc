// cp.async (Ampere+): copies from global to shared memory that do not pass through
// registers, grouped so a pipeline can wait for "all but the newest N groups". Shared by
// the attention kernels' per-warp rings and the DeepSeek-V4 HCA prefill ring.
#pragma once
#include <cuda_runtime.h>

namespace kvcore::ops::cuda {

// Copy kBytes (4, 8 or 16) from global `g` to shared `smem`; 16 bytes bypass L1 (.cg).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* g) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(g), "n"(kBytes) : "memory");
  }
}

// Closes the group of copies issued since the last commit (an empty group is a group too).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace kvcore::ops::cuda
