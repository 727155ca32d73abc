// Faithful CUDA port of seed 000's two Metal kernels (see seed_shift.hpp):
// one thread per K pair, one thread per f16 element for the copies, the same
// index math, frequency and angle formulas, and the same pass structure.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "seed_shift.hpp"
#include "cuda/common/check.cuh"

namespace kvcore::baselines {
namespace {

struct KParams {
  uint32_t n_keep, shift, new_seq_len, n_kv_heads, head_dim;
  float freq_base;
  int32_t delta_pos;  // -(shift as i32)
};

__global__ void kv_shift_k_to_scratch(const __half* k_cache, __half* scratch, KParams params) {
  const uint32_t gid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t half_dim = params.head_dim / 2u;
  const uint32_t retained = params.new_seq_len - params.n_keep;
  const uint32_t per_t = params.n_kv_heads * half_dim;
  const uint32_t total = retained * per_t;
  if (gid >= total) return;
  const uint32_t t_off = gid / per_t;
  const uint32_t hd = gid % per_t;
  const uint32_t h = hd / half_dim;
  const uint32_t d = hd % half_dim;
  const uint32_t kv_dim = params.n_kv_heads * params.head_dim;
  const uint32_t head_off = h * params.head_dim;
  const uint32_t t_old = params.n_keep + t_off + params.shift;
  const uint32_t src_i0 = t_old * kv_dim + head_off + d;
  const uint32_t src_i1 = src_i0 + half_dim;
  const float x0 = __half2float(k_cache[src_i0]);
  const float x1 = __half2float(k_cache[src_i1]);
  const float freq = 1.0f / powf(params.freq_base, float(2u * d) / float(params.head_dim));
  const float angle = float(params.delta_pos) * freq;
  const float c = cosf(angle);
  const float s = sinf(angle);
  const float y0 = x0 * c - x1 * s;
  const float y1 = x0 * s + x1 * c;
  const uint32_t dst_i0 = t_off * kv_dim + head_off + d;
  const uint32_t dst_i1 = dst_i0 + half_dim;
  scratch[dst_i0] = __float2half(y0);
  scratch[dst_i1] = __float2half(y1);
}

struct CopyParams {
  uint32_t n_elements, src_offset_elements, dst_offset_elements;
};

__global__ void memcpy_f16_offsets(const __half* src, __half* dst, CopyParams params) {
  const uint32_t gid = blockIdx.x * blockDim.x + threadIdx.x;
  if (gid >= params.n_elements) return;
  dst[params.dst_offset_elements + gid] = src[params.src_offset_elements + gid];
}

constexpr uint32_t kThreads = 256;
uint32_t blocks_for(uint32_t n) { return (n + kThreads - 1) / kThreads; }

}  // namespace

void seed_shift_f16(const SeedShiftLayer* layers, int n_layers, void* scratch_v, uint32_t n_keep, uint32_t shift,
                    uint32_t new_seq_len, uint32_t n_kv_heads, uint32_t head_dim, float freq_base, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const uint32_t kv_dim = n_kv_heads * head_dim;
  const uint32_t retained = new_seq_len - n_keep;
  if (shift == 0 || retained == 0) return;
  auto* scratch = static_cast<__half*>(scratch_v);
  const KParams kp{n_keep, shift, new_seq_len, n_kv_heads, head_dim, freq_base, -static_cast<int32_t>(shift)};
  const uint32_t pairs = retained * n_kv_heads * (head_dim / 2);
  const uint32_t elems = retained * kv_dim;
  for (int l = 0; l < n_layers; ++l) {
    auto* k = static_cast<__half*>(layers[l].k);
    auto* v = static_cast<__half*>(layers[l].v);
    kv_shift_k_to_scratch<<<blocks_for(pairs), kThreads, 0, s>>>(k, scratch, kp);
    memcpy_f16_offsets<<<blocks_for(elems), kThreads, 0, s>>>(scratch, k, CopyParams{elems, 0, n_keep * kv_dim});
    memcpy_f16_offsets<<<blocks_for(elems), kThreads, 0, s>>>(v, scratch, CopyParams{elems, (n_keep + shift) * kv_dim, 0});
    memcpy_f16_offsets<<<blocks_for(elems), kThreads, 0, s>>>(scratch, v, CopyParams{elems, 0, n_keep * kv_dim});
    KVCORE_CUDA_CHECK_LAUNCH("seed shift kernels");
  }
}

}  // namespace kvcore::baselines
