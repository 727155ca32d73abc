// Row finishing in registers with 2 channels a thread (d = 2 t, 256 threads for a
// 512-dim attention row): the A/B variant of dsv4_quad.cuh's 4 a thread, with half the
// registers a thread and so more warps an SM. The same arithmetic: the RMSNorm sum in
// the quad order of dsv4_common.cuh (each quad's two halves meet on its even thread),
// the same RoPE pairs, FP8 blocks (a block = a warp) and codes: the same bits.
#pragma once
#include <cuda_runtime.h>

#include "cuda/dsv4_common.cuh"
#include "kvcore/math/fp8_block.hpp"

namespace kvcore::dsv4::cuda {

// All 256 threads call it; y holds channels 2 t, 2 t + 1. Warp 7 holds the rope tail: its
// lane l rotates pair l with (sn, cs) it computed (only warp 7's values are used).
// smem: 128 + 4 floats.
__device__ inline void finish_attention_pair(const CompressorParams& p, int64_t w, float (&y)[2], float sn, float cs,
                                             float* smem) {
  using L = math::Dsv4RowLayout;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, d = 2 * t;
  float* quad = smem;  // 128 quad partials
  const float y2 = __shfl_down_sync(0xffffffffu, y[0], 1), y3 = __shfl_down_sync(0xffffffffu, y[1], 1);
  if ((t & 1) == 0) quad[t / 2] = quad_sumsq(y[0], y[1], y2, y3);
  __syncthreads();
  // Every warp sums the 4 groups itself (the same butterflies, the same bits): no second barrier.
  float ss = 0.0f;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    const float v = warp_sum_rn(quad[32 * g + lane]);
    ss = g == 0 ? v : __fadd_rn(ss, v);
  }
  const float s = rms_inv_scale(ss, L::kHeadDim, p.eps);
  const float2 nw = __ldg(reinterpret_cast<const float2*>(p.norm_weight + d));
  y[0] = rms_apply(y[0], s, nw.x);
  y[1] = rms_apply(y[1], s, nw.y);
  const bool nope = d < L::kNope;  // warp-uniform: warps 0..6 are the 7 FP8 blocks
  if (!nope) math::rotate_pair(y[0], y[1], cs, sn);
  float amax = math::finite_abs_max(math::finite_abs_max(0.0f, y[0]), y[1]);
  amax = warp_max(amax);
  const int k = math::e4m3_scale_exponent(amax);
  if (p.rows_packed) {
    uint8_t* out = static_cast<uint8_t*>(p.rows) + w * p.rows_stride;
    if (nope) {
      const float inv = math::pow2f(-k);
      const uint32_t codes = math::e4m3_encode_clamped(y[0] * inv) | (static_cast<uint32_t>(math::e4m3_encode_clamped(y[1] * inv)) << 8);
      *reinterpret_cast<uint16_t*>(out + L::kNopeOffset + d) = static_cast<uint16_t>(codes);
      if (lane == 0) out[L::kScaleOffset + warp] = math::ue8m0_encode(k);
    } else {
      const uint32_t h = math::f32_to_bf16_bits(y[0]) | (static_cast<uint32_t>(math::f32_to_bf16_bits(y[1])) << 16);
      *reinterpret_cast<uint32_t*>(out + L::kRopeOffset + 2 * (d - L::kNope)) = h;
      if (d == L::kNope) out[L::kPadOffset] = 0;
    }
    return;
  }
  if (p.quant && nope) {
    const float inv = math::pow2f(-k), scale = math::pow2f(k);
    y[0] = math::e4m3_round_value(y[0] * inv) * scale;
    y[1] = math::e4m3_round_value(y[1] * inv) * scale;
  }
  *reinterpret_cast<float2*>(static_cast<float*>(p.rows) + w * p.rows_stride + d) = make_float2(y[0], y[1]);
}

}  // namespace kvcore::dsv4::cuda
