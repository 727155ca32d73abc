// The Tensor Memory Accelerator (Hopper, compute capability 9.0+) from device code: a box of a
// tensor (tma.hpp's maps) copied into shared memory by one instruction, its bytes counted on an
// mbarrier of the CTA. Below sm_90 these compile to nothing (no kernel built for older targets
// may call them; the launchers check the device).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kvcore::ops::cuda::tma {

// Box {c0, c1, c2} of the 3-D tensor `map` (a __grid_constant__ kernel parameter) into shared
// memory at dst (128-byte swizzled where the map says so: then dst must be 1024-byte aligned),
// its bytes completing on the mbarrier at `bar`.
__device__ __forceinline__ void load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#endif
}

// One arrival on the mbarrier at `bar`, which also expects `bytes` more bytes before its phase
// completes (bytes may land before or after this call): TMA copies and cluster.cuh's st.async
// stores both count on it.
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

}  // namespace kvcore::ops::cuda::tma
