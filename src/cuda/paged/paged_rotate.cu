// The one-launch rotation of every layer's K pool (ops/paged_rotate.hpp): a thin
// kernel over paged_rotate_unit, one thread per (layer run, listed cell, group of 8 pairs).
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "ops/paged_rotate.hpp"

namespace kvcore::ops::cuda {

namespace {

constexpr int kThreads = 256;

// A thread's 8 cos/sin in a column of shared memory (conflict-free: consecutive threads,
// consecutive words).
struct SharedAngles {
  float* base;  // s_cs[0][threadIdx.x]
  __device__ float& cos(int k) { return base[k * kThreads]; }
  __device__ float& sin(int k) { return base[(8 + k) * kThreads]; }
};

// <= 64 registers: the batch's 8 vectors (32), addresses, one angle's double temporaries.
template <KvFormat F>
__global__ void __launch_bounds__(kThreads, 4) paged_rotate_kernel(const __grid_constant__ PagedRotateParams p) {
  __shared__ float s_angles[16 * kThreads];
  SharedAngles ang{s_angles + threadIdx.x};
  paged_rotate_unit<F>(p, static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x, ang);
}

}  // namespace

void paged_rotate_layers(const PagedRotateParams& p, Stream stream) {
  const int64_t threads = paged_rotate_threads(p);
  if (threads == 0) return;
  const unsigned grid = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  const cudaStream_t s = native(stream);
  if (p.format == KvFormat::F16) paged_rotate_kernel<KvFormat::F16><<<grid, kThreads, 0, s>>>(p);
  else if (p.format == KvFormat::BF16) paged_rotate_kernel<KvFormat::BF16><<<grid, kThreads, 0, s>>>(p);
  else paged_rotate_kernel<KvFormat::F32><<<grid, kThreads, 0, s>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("paged_rotate_kernel");
}

}  // namespace kvcore::ops::cuda
