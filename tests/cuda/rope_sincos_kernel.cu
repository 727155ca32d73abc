// Device side of rope_sincos_identity_test.cpp: math::sincos_f32 of consecutive f32 bit
// patterns, evaluated on the GPU into host vectors.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "kvcore/math/rope.hpp"

namespace {

__global__ void sincos_kernel(uint32_t first_bits, uint32_t n, float* s, float* c) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    kvcore::math::sincos_f32(kvcore::math::bits_float(first_bits + i), &s[i], &c[i]);
}

}  // namespace

// s, c: host arrays of n floats. Throws kvcore::Error on a CUDA failure.
void rope_test_device_sincos(uint32_t first_bits, uint32_t n, float* s, float* c) {
  float *ds = nullptr, *dc = nullptr;
  KVCORE_CUDA_CHECK(cudaMalloc(&ds, size_t(n) * sizeof(float)));
  KVCORE_CUDA_CHECK(cudaMalloc(&dc, size_t(n) * sizeof(float)));
  sincos_kernel<<<2048, 256>>>(first_bits, n, ds, dc);
  KVCORE_CUDA_CHECK_LAUNCH("sincos_kernel");
  KVCORE_CUDA_CHECK(cudaMemcpy(s, ds, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaMemcpy(c, dc, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaFree(ds));
  KVCORE_CUDA_CHECK(cudaFree(dc));
}
