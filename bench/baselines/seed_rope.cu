// The seed's RoPE form as a CUDA kernel (see seed_rope.hpp): the baseline of `kvcore bench rope`.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "bench/baselines/seed_rope.hpp"
#include "cuda/common/check.cuh"

namespace kvcore::bench {
namespace {

__global__ void seed_rope_kernel(__half* k_cache, const int32_t* positions, uint32_t tokens, uint32_t n_kv_heads,
                                 uint32_t head_dim, float freq_base) {
  // Same index math as the seed (32-bit), one thread per pair.
  const uint32_t half_dim = head_dim / 2u;
  const uint32_t per_t = n_kv_heads * half_dim;
  const uint32_t total = tokens * per_t;
  const uint32_t gid = blockIdx.x * blockDim.x + threadIdx.x;
  if (gid >= total) return;
  const uint32_t t = gid / per_t;
  const uint32_t hd = gid % per_t;
  const uint32_t h = hd / half_dim;
  const uint32_t d = hd % half_dim;
  const uint32_t kv_dim = n_kv_heads * head_dim;
  const uint32_t i0 = t * kv_dim + h * head_dim + d;
  const uint32_t i1 = i0 + half_dim;
  const float x0 = __half2float(k_cache[i0]);
  const float x1 = __half2float(k_cache[i1]);
  const float freq = 1.0f / powf(freq_base, float(2u * d) / float(head_dim));
  const float angle = float(positions[t]) * freq;
  const float c = cosf(angle);
  const float s = sinf(angle);
  k_cache[i0] = __float2half(x0 * c - x1 * s);
  k_cache[i1] = __float2half(x0 * s + x1 * c);
}

__global__ void fill_kernel(__half* dst, uint64_t n, uint64_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    dst[i] = __float2half(static_cast<float>(z >> 40) * (4.0f / 16777216.0f) - 2.0f);
  }
}

}  // namespace

void seed_rope_f16_inplace(void* k, const int32_t* positions, uint32_t tokens, uint32_t n_kv_heads,
                           uint32_t head_dim, float freq_base, void* stream) {
  const uint64_t total = uint64_t(tokens) * n_kv_heads * (head_dim / 2);
  constexpr uint32_t kThreads = 256;
  const uint32_t blocks = static_cast<uint32_t>((total + kThreads - 1) / kThreads);
  seed_rope_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<__half*>(k), positions, tokens, n_kv_heads, head_dim, freq_base);
  KVCORE_CUDA_CHECK_LAUNCH("seed_rope_kernel");
}

void fill_random_f16(void* dst, uint64_t n, uint64_t seed, void* stream) {
  fill_kernel<<<1024, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<__half*>(dst), n, seed);
  KVCORE_CUDA_CHECK_LAUNCH("fill_kernel");
}

}  // namespace kvcore::bench
