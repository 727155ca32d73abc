// Device building blocks of the DeepSeek-V4 kernels: block reductions and the
// row finishing steps (RMSNorm, RoPE, FP8 / Hadamard + FP4 quantization) on a
// row held in shared memory. Per-element math comes from kvcore/math/dsv4.hpp,
// the same functions the CPU kernels call.
#pragma once
#include <cuda_runtime.h>

#include "cuda/common/fp8_hw.cuh"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/math/fp4_hadamard.hpp"
#include "kvcore/math/half.hpp"
#include "ops/dsv4_candidates.hpp"
#include "ops/dsv4_params.hpp"

namespace kvcore::ops::cuda::dsv4 {

using namespace ::kvcore::dsv4;  // the ops layer's Params

constexpr int kThreads = 256;  // threads of the row kernels (8 warps)

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- RMSNorm in one summation order for every CUDA row path ---------------------------------
// Prefill (any kernel) must give the bits of token-by-token emission, so every CUDA kernel
// that finishes a row sums its squares in this one order, whatever its thread layout:
// quads of 4 consecutive channels (channels past head_dim count 0), each summed in order;
// groups of 32 quads by the xor butterfly of warp_sum_rn (quad 32 g + l on lane l); the
// group sums in group order. Explicit _rn operations: no FMA contraction can differ
// between kernels. (The CPU sums in index order: float tolerance, see the tests.)
__device__ __forceinline__ float warp_sum_rn(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float quad_sumsq(float a, float b, float c, float d) {
  return __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(a, a), __fmul_rn(b, b)), __fmul_rn(c, c)), __fmul_rn(d, d));
}

// 1 / sqrt(ss / n + eps), and the normalized, weighted value: the same IEEE operations everywhere.
__device__ __forceinline__ float rms_inv_scale(float ss, int n, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), eps)));
}
__device__ __forceinline__ float rms_apply(float x, float s, float weight) { return __fmul_rn(weight, __fmul_rn(x, s)); }

// The sum of squares of buf[0, n) (shared memory) in that order; every thread gets it.
// scratch: >= 32 floats (n <= 4096: at most 32 groups).
__device__ inline float row_sumsq_smem(const float* buf, int n, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int n_quads = (n + 3) / 4, n_groups = (n_quads + 31) / 32;
  for (int g = warp; g < n_groups; g += n_warps) {
    const int q = 32 * g + lane;
    float v = 0.0f;
    if (q < n_quads) {
      float x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = 4 * q + i < n ? buf[4 * q + i] : 0.0f;
      v = quad_sumsq(x[0], x[1], x[2], x[3]);
    }
    v = warp_sum_rn(v);
    if (lane == 0) scratch[g] = v;
  }
  __syncthreads();
  float ss = scratch[0];
  for (int g = 1; g < n_groups; ++g) ss = __fadd_rn(ss, scratch[g]);
  __syncthreads();  // scratch may be reused
  return ss;
}

// FP8 round trip of row[0, n_nope) in blocks of 64 (shared or global memory); one warp per
// block, two values per lane. The block's scale is the max over finite |v|, an
// order-independent reduction: identical to the CPU's sequential one.
// If maybe_packed is set (448 + 64 layout), writes codes and scales there instead
// of rounding `row` in place; otherwise each(d, v) also receives every rounded value v of
// dim d, from the thread that stored it (no barrier needed to use it).
template <class Each>
__device__ inline void fp8_nope_blocks(float* row, int n_nope, uint8_t* maybe_packed, Each&& each) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int b = warp; b * 64 < n_nope; b += n_warps) {
    const int off = b * 64, n = min(64, n_nope - off);
    const float v0 = lane < n ? row[off + lane] : 0.0f;
    const float v1 = lane + 32 < n ? row[off + lane + 32] : 0.0f;
    float a = math::finite_abs_max(math::finite_abs_max(0.0f, v0), v1);
    a = warp_max(a);
    const int k = math::e4m3_scale_exponent(a);
    // the codes of math::e4m3_encode(e4m3_scaled(v, 2^-k)), two at once (fp8_hw: bit-identical)
    const uint32_t codes = fp8_hw::encode2_scaled(v0, v1, math::pow2f(-k));
    if (maybe_packed) {
      if (lane < n) maybe_packed[off + lane] = static_cast<uint8_t>(codes & 0xffu);
      if (lane + 32 < n) maybe_packed[off + lane + 32] = static_cast<uint8_t>(codes >> 8);
      if (lane == 0) maybe_packed[math::Dsv4RowLayout::kScaleOffset + b] = math::ue8m0_encode(k);
    } else {  // math::e4m3_round_trip(v, k): the codes' values (the shared decoder: NaN bits too) times 2^k
      const float scale = math::pow2f(k);
      const float r0 = math::e4m3_decode(static_cast<uint8_t>(codes & 0xffu)) * scale;
      const float r1 = math::e4m3_decode(static_cast<uint8_t>(codes >> 8)) * scale;
      if (lane < n) {
        row[off + lane] = r0;
        each(off + lane, r0);
      }
      if (lane + 32 < n) {
        row[off + lane + 32] = r1;
        each(off + lane + 32, r1);
      }
    }
  }
}
__device__ inline void fp8_nope_blocks(float* row, int n_nope, uint8_t* maybe_packed) {
  fp8_nope_blocks(row, n_nope, maybe_packed, [](int, float) {});
}

// In-place Hadamard of `count` consecutive vectors of n values (n a power of two),
// the same butterflies as the CPU; one barrier per stage for all vectors.
__device__ inline void hadamard_smem(float* rows, int n, int count = 1) {
  const int half = n / 2, pairs = half * count;
  for (int h = 1; h < n; h <<= 1) {
    for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
      const int v = idx / half, i = idx % half;
      float* row = rows + v * n;
      const int j = (i / h) * 2 * h + i % h;
      const float a = row[j], b = row[j + h];
      row[j] = a + b;
      row[j + h] = a - b;
    }
    __syncthreads();
  }
  const float s = math::dsv4_hadamard_scale(n);
  for (int i = threadIdx.x; i < n * count; i += blockDim.x) rows[i] = rows[i] * s;
  __syncthreads();
}

// FP4 blocks of 32 over row[0, n): one warp per block, one value per lane.
// Rounds in place, or packs nibbles + scales into maybe_packed.
__device__ inline void fp4_blocks(float* row, int n, uint8_t* maybe_packed) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int b = warp; b * 32 < n; b += n_warps) {
    const float v = row[b * 32 + lane];
    const float a = warp_max(math::finite_abs_max(0.0f, v));
    const int k = math::e2m1_scale_exponent(a);
    if (maybe_packed) {
      const uint8_t code = math::e2m1_encode_scaled(v, k);
      const uint8_t hi = static_cast<uint8_t>(__shfl_down_sync(0xffffffffu, code, 1));
      if ((lane & 1) == 0) maybe_packed[(b * 32 + lane) / 2] = static_cast<uint8_t>(code | (hi << 4));
      if (lane == 0) maybe_packed[n / 2 + b] = math::ue8m0_encode(k);
    } else {
      row[b * 32 + lane] = math::e2m1_round_trip(v, k);
    }
  }
}

// Lane l of a warp holding a row's values 4l .. 4l + 3 (all 32 lanes call it): the E2M1 scale
// exponent of the FP4 block of 32 values its quad belongs to (lanes 8b .. 8b + 7), exact maxima.
__device__ __forceinline__ int fp4_quad_block_exponent(const float (&v)[4]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = math::finite_abs_max(amax, v[i]);
#pragma unroll
  for (int m = 1; m < math::kFp4Block / 4; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  return math::e2m1_scale_exponent(amax);
}

// Indexer rows of 128 dims (the model's): Hadamard + FP4 by warp 0 alone, in registers (the
// same network and block scales as hadamard_smem + fp4_blocks, so the same bits, without the
// eight block barriers). Writes the packed row (codes + scales) or rounds buf in place.
__device__ inline void fp4_hadamard128_row(float* buf, uint8_t* maybe_packed) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    float v[4] = {buf[4 * lane], buf[4 * lane + 1], buf[4 * lane + 2], buf[4 * lane + 3]};
    math::hadamard128_warp(v, lane);
    const int k = fp4_quad_block_exponent(v);
    if (maybe_packed) {
#pragma unroll
      for (int i = 0; i < 4; i += 2)
        maybe_packed[2 * lane + i / 2] =
            static_cast<uint8_t>(math::e2m1_encode_scaled(v[i], k) | (math::e2m1_encode_scaled(v[i + 1], k) << 4));
      if ((lane & 7) == 0) maybe_packed[math::kHadamardDim / 2 + lane / 8] = math::ue8m0_encode(k);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) buf[4 * lane + i] = math::e2m1_round_trip(v[i], k);
    }
  }
  __syncthreads();
}

// RMSNorm with weight, RoPE at w * ratio, quantization, store: the row is in
// shared memory `buf` (head_dim floats). All threads of the block call this.
__device__ inline void finish_row(const CompressorParams& p, int64_t w, float* buf, float* scratch) {
  const float s = rms_inv_scale(row_sumsq_smem(buf, p.head_dim, scratch), p.head_dim, p.eps);
  for (int k = threadIdx.x; k < p.head_dim; k += blockDim.x) buf[k] = rms_apply(buf[k], s, p.norm_weight[k]);
  __syncthreads();
  const float pos = static_cast<float>(w * p.ratio);
  for (int i = threadIdx.x; i < p.rope.layout.n_pairs(); i += blockDim.x) {
    float sn, cs;
    math::sincos_f32(math::rope_angle(pos, p.rope.freq[i]), &sn, &cs);
    math::rotate_pair(buf[p.rope.layout.dim0(i)], buf[p.rope.layout.dim1(i)], cs, sn);
  }
  __syncthreads();
  if (p.rows_packed) {
    uint8_t* out = static_cast<uint8_t*>(p.rows) + w * p.rows_stride;
    if (p.kind == 0) {
      using L = math::Dsv4RowLayout;
      fp8_nope_blocks(buf, L::kNope, out);
      for (int i = threadIdx.x; i < L::kRope; i += blockDim.x) {
        const uint16_t h = math::f32_to_bf16_bits(buf[L::kNope + i]);
        out[L::kRopeOffset + 2 * i] = static_cast<uint8_t>(h & 0xffu);
        out[L::kRopeOffset + 2 * i + 1] = static_cast<uint8_t>(h >> 8);
      }
      if (threadIdx.x == 0) out[L::kPadOffset] = 0;
    } else if (p.head_dim == math::kHadamardDim) {
      fp4_hadamard128_row(buf, out);
    } else {
      hadamard_smem(buf, p.head_dim);
      fp4_blocks(buf, p.head_dim, out);
    }
    return;
  }
  if (p.quant) {
    if (p.kind == 0) {
      fp8_nope_blocks(buf, p.head_dim - p.n_rot, nullptr);
    } else if (p.head_dim == math::kHadamardDim) {
      fp4_hadamard128_row(buf, nullptr);
    } else {
      hadamard_smem(buf, p.head_dim);
      fp4_blocks(buf, p.head_dim, nullptr);
    }
    __syncthreads();
  }
  float* out = static_cast<float*>(p.rows) + w * p.rows_stride;
  for (int k = threadIdx.x; k < p.head_dim; k += blockDim.x) out[k] = buf[k];
}

}  // namespace kvcore::ops::cuda::dsv4
