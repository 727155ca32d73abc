// A kernel that keeps one SM busy for a given number of clock cycles: the offload tier's CUDA
// test runs it on the compute stream to see whether an offload copy overlaps it.
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void test_spin(long long cycles, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(cycles);
  KVCORE_CUDA_CHECK_LAUNCH("spin_kernel");
}
