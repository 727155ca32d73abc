// Thread-block clusters (Hopper, compute capability 9.0+): the CTAs of a cluster write into each
// other's shared memory by asynchronous stores (st.async) whose bytes each count on an mbarrier of
// the receiving CTA, so a receiver waits for exactly the bytes it expects. A cluster barrier would
// also make such writes visible, but its release semantics compile to a GPU-scope memory barrier
// (MEMBAR.ALL.GPU), which also waits for the CTA's outstanding global loads and stores. The only
// cluster barrier these helpers use is relaxed: it orders the mbarriers' initialization
// (fence.mbarrier_init) before the first store to them.
// Below sm_90 every helper compiles to nothing (rank 0): kernels built for older targets must not
// run in clusters, and their launchers ask for clusters (pdl.cuh's launch_with) only on devices
// that have them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/tma.cuh"  // the mbarrier's arrive.expect_tx, which TMA copies count on too

namespace kvcore::ops::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KVCORE_CLUSTER_PTX 0
#else
#define KVCORE_CLUSTER_PTX 1
#endif

// This CTA's rank in its cluster.
__device__ __forceinline__ int cluster_rank() {
  uint32_t r = 0;
#if KVCORE_CLUSTER_PTX
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return static_cast<int>(r);
}

// The two halves of a relaxed cluster barrier; every thread of every CTA calls both, in order.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if KVCORE_CLUSTER_PTX
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if KVCORE_CLUSTER_PTX
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// The address in CTA `rank`'s shared memory of what shared-memory address `addr` is in this CTA's.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, int rank) {
  uint32_t dst = 0;
#if KVCORE_CLUSTER_PTX
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(addr), "r"(rank));
#endif
  return dst;
}
__device__ __forceinline__ uint32_t cluster_map(const void* local, int rank) {
  return cluster_map(static_cast<uint32_t>(__cvta_generic_to_shared(local)), rank);
}

// atomicAdd on CTA `rank`'s counterpart of `local` (relaxed, cluster scope); returns the old value.
__device__ __forceinline__ int cluster_atomic_add(int* local, int rank, int v) {
  int old = 0;
#if KVCORE_CLUSTER_PTX
  asm volatile("atom.relaxed.cluster.shared::cluster.add.s32 %0, [%1], %2;" : "=r"(old) : "r"(cluster_map(local, rank)), "r"(v)
               : "memory");
#endif
  return old;
}

// One mbarrier of this CTA that counts the bytes the cluster sends it, for one use (phase 0).
// Setup: one thread calls init() and expect(bytes) (expect may come later, even after bytes have
// arrived), then every thread the cluster's relaxed barrier, whose wait must come before any CTA
// sends. Every thread that reads what arrived calls wait().
struct ClusterInbox {
  uint32_t bar;  // the mbarrier's shared-memory address

  __device__ __forceinline__ explicit ClusterInbox(uint64_t* mbar) : bar(static_cast<uint32_t>(__cvta_generic_to_shared(mbar))) {}

  __device__ __forceinline__ void init() const {
#if KVCORE_CLUSTER_PTX
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __device__ __forceinline__ void expect(uint32_t bytes) const { tma::arrive_expect_tx(bar, bytes); }
  // v into CTA `rank` (this one included) at the address that `local` has here; it counts on
  // that CTA's counterpart of this inbox.
  __device__ __forceinline__ void send(void* local, int rank, uint32_t v) const {
#if KVCORE_CLUSTER_PTX
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(cluster_map(local, rank)),
                 "r"(v), "r"(cluster_map(bar, rank))
                 : "memory");
#endif
  }
  __device__ __forceinline__ void send(void* local, int rank, uint2 v) const {
#if KVCORE_CLUSTER_PTX
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(
                     cluster_map(local, rank)),
                 "r"(v.x), "r"(v.y), "r"(cluster_map(bar, rank))
                 : "memory");
#endif
  }
  __device__ __forceinline__ void send(void* local, int rank, uint4 v) const {
#if KVCORE_CLUSTER_PTX
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                     cluster_map(local, rank)),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(cluster_map(bar, rank))
                 : "memory");
#endif
  }
  // Until every expected byte has arrived; what arrived is then visible to this thread.
  __device__ __forceinline__ void wait() const {
#if KVCORE_CLUSTER_PTX
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
          : "=r"(done)
          : "r"(bar)
          : "memory");
    }
#endif
  }
};

}  // namespace kvcore::ops::cuda
