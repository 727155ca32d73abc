// Row finishing in registers for the prefill fast path: a thread holds a "quad", 4
// consecutive channels d .. d + 3 (d = 4 q), of one compressed row, loaded and stored
// 16 bytes at a time. The steps and their arithmetic are finish_row's (dsv4_common.cuh):
// the RMSNorm sum in the shared quad order, the same RoPE pair math, the same FP8 / FP4
// codes and block scales (exact maxima; the branch-free FP8 codec of fp8_block.hpp, equal to
// e4m3_encode / e4m3_round_trip for every f32), so the same bits as emission from the state.
// Only the model's row shapes take this path (see fast_shape in dsv4_prefill.cu).
#pragma once
#include <cuda_runtime.h>

#include "cuda/dsv4/dsv4_common.cuh"
#include "kvcore/math/fp8_block.hpp"

namespace kvcore::ops::cuda::dsv4 {

__device__ __forceinline__ float quad_at(const float4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// 16-byte loads of inputs read exactly once (evict-first), and of ape (kept cached).
__device__ __forceinline__ float4 load_stream4(const float* p) { return __ldcs(reinterpret_cast<const float4*>(p)); }

__device__ __forceinline__ float4 ape_quad(const CompressorParams& p, int32_t r, int32_t col) {
  if (p.ape_f16) {
    const uint2 h = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.ape) + r * p.ape_stride + col));
    return make_float4(math::f16_bits_to_f32(static_cast<uint16_t>(h.x & 0xffffu)), math::f16_bits_to_f32(static_cast<uint16_t>(h.x >> 16)),
                       math::f16_bits_to_f32(static_cast<uint16_t>(h.y & 0xffffu)), math::f16_bits_to_f32(static_cast<uint16_t>(h.y >> 16)));
  }
  return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.ape) + r * p.ape_stride + col));
}

// sin and cos of the two rope pairs held by this lane, at the row's position. The rope tail is
// the last 64 dims, i.e. the upper 16 lanes of the warp that holds it (first_dim % 4 == 0,
// interleaved pairs, n_rot == 64: 32 pairs); called by all 32 lanes of that warp: lane l computes
// pair l (one sincos a lane, not two in a row on 16 lanes), lane 16 + i takes pairs 2 i, 2 i + 1.
// Done before the row is pooled, while its loads are in flight.
struct QuadRope {
  float sn[2], cs[2];
};

__device__ __forceinline__ QuadRope quad_rope_angles(const CompressorParams& p, int64_t w) {
  const int lane = threadIdx.x & 31;
  float sn, cs;
  math::sincos_f32(math::rope_angle(static_cast<float>(w * p.ratio), p.rope.freq[lane]), &sn, &cs);
  QuadRope r;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int src = (2 * lane + i) & 31;  // lanes >= 16: pair 2 (lane - 16) + i
    r.sn[i] = __shfl_sync(0xffffffffu, sn, src);
    r.cs[i] = __shfl_sync(0xffffffffu, cs, src);
  }
  return r;
}

// RMSNorm scale applied with the weights of quad d, then RoPE when the quad is in the tail.
__device__ __forceinline__ void quad_norm_rope(const CompressorParams& p, int d, float s, const QuadRope& r, float (&y)[4]) {
  const float4 nw = __ldg(reinterpret_cast<const float4*>(p.norm_weight + d));
#pragma unroll
  for (int i = 0; i < 4; ++i) y[i] = rms_apply(y[i], s, quad_at(nw, i));
  if (d >= p.rope.layout.first_dim) {
    math::rotate_pair(y[0], y[1], r.cs[0], r.sn[0]);
    math::rotate_pair(y[2], y[3], r.cs[1], r.sn[1]);
  }
}

// ---- attention rows: 512 = 448 nope + 64 rope, 128 threads (thread t holds quad t) ----------
// All 128 threads call it. scratch: 4 floats of shared memory.
__device__ inline void finish_attention_quad(const CompressorParams& p, int64_t w, float (&y)[4], const QuadRope& r,
                                             float* scratch) {
  using L = math::Dsv4RowLayout;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, d = 4 * t;
  const float part = warp_sum_rn(quad_sumsq(y[0], y[1], y[2], y[3]));
  if (lane == 0) scratch[warp] = part;
  __syncthreads();
  const float ss = __fadd_rn(__fadd_rn(__fadd_rn(scratch[0], scratch[1]), scratch[2]), scratch[3]);
  quad_norm_rope(p, d, rms_inv_scale(ss, L::kHeadDim, p.eps), r, y);
  // FP8 block b = channels 64 b .. 64 b + 63 = the 16 quads of a half warp; the tail lanes
  // (t >= 112) join the shuffles and drop the result.
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = math::finite_abs_max(amax, y[i]);
#pragma unroll
  for (int m = 1; m < 16; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  const int k = math::e4m3_scale_exponent(amax);
  const bool nope = d < L::kNope;
  if (p.rows_packed) {
    uint8_t* out = static_cast<uint8_t*>(p.rows) + w * p.rows_stride;
    if (nope) {
      const float inv = math::pow2f(-k);
      uint32_t codes = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) codes |= static_cast<uint32_t>(math::e4m3_encode_clamped(y[i] * inv)) << (8 * i);
      *reinterpret_cast<uint32_t*>(out + L::kNopeOffset + d) = codes;
      if ((t & 15) == 0) out[L::kScaleOffset + t / 16] = math::ue8m0_encode(k);
    } else {
      uint2 h;
      h.x = math::f32_to_bf16_bits(y[0]) | (static_cast<uint32_t>(math::f32_to_bf16_bits(y[1])) << 16);
      h.y = math::f32_to_bf16_bits(y[2]) | (static_cast<uint32_t>(math::f32_to_bf16_bits(y[3])) << 16);
      *reinterpret_cast<uint2*>(out + L::kRopeOffset + 2 * (d - L::kNope)) = h;
      if (d == L::kNope) out[L::kPadOffset] = 0;
    }
    return;
  }
  if (p.quant && nope) {
    const float inv = math::pow2f(-k), scale = math::pow2f(k);
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = math::e4m3_round_value(y[i] * inv) * scale;
  }
  *reinterpret_cast<float4*>(static_cast<float*>(p.rows) + w * p.rows_stride + d) = make_float4(y[0], y[1], y[2], y[3]);
}

// ---- indexer rows: 128 dims, one warp (lane l holds quad l) -------------------------------
// No block barrier: each warp finishes its own row.
__device__ inline void finish_indexer_quad(const CompressorParams& p, int64_t w, float (&y)[4], const QuadRope& r) {
  const int lane = threadIdx.x & 31, d = 4 * lane;
  const float ss = warp_sum_rn(quad_sumsq(y[0], y[1], y[2], y[3]));  // one group of 32 quads
  quad_norm_rope(p, d, rms_inv_scale(ss, math::kHadamardDim, p.eps), r, y);
  if (p.rows_packed || p.quant) {
    math::hadamard128_warp(y, lane);
    const int k = fp4_quad_block_exponent(y);
    if (p.rows_packed) {
      uint8_t* out = static_cast<uint8_t*>(p.rows) + w * p.rows_stride;
      const uint32_t lo = math::e2m1_encode_scaled(y[0], k) | (math::e2m1_encode_scaled(y[1], k) << 4);
      const uint32_t hi = math::e2m1_encode_scaled(y[2], k) | (math::e2m1_encode_scaled(y[3], k) << 4);
      *reinterpret_cast<uint16_t*>(out + 2 * lane) = static_cast<uint16_t>(lo | (hi << 8));
      if ((lane & 7) == 0) out[math::kHadamardDim / 2 + lane / 8] = math::ue8m0_encode(k);
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = math::e2m1_round_trip(y[i], k);
  }
  *reinterpret_cast<float4*>(static_cast<float*>(p.rows) + w * p.rows_stride + d) = make_float4(y[0], y[1], y[2], y[3]);
}

}  // namespace kvcore::ops::cuda::dsv4
