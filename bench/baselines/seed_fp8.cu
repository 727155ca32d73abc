// CUDA port of seed 002's kernel_dsv4_fp8_kv_quantize_f32 (see seed_fp8.hpp). Metal's
// threadgroup memory and barriers become __shared__ and __syncthreads; log2/exp2/ceil
// become the full-precision CUDA library calls; everything else is line for line.
#include <cuda_runtime.h>

#include "bench/baselines/seed_fp8.hpp"
#include "cuda/common/check.cuh"

namespace kvcore::baselines {
namespace {

__constant__ float dsv4_e4m3fn_exp_scale[16] = {
    0.0f, 0.015625f, 0.03125f, 0.0625f, 0.125f, 0.25f, 0.5f, 1.0f,
    2.0f, 4.0f, 8.0f, 16.0f, 32.0f, 64.0f, 128.0f, 256.0f,
};

__device__ inline float dsv4_e4m3fn_value(int i) {
  const int exp = (i >> 3) & 0x0f;
  const int mant = i & 0x07;
  return exp == 0 ? float(mant) * 0.001953125f : (1.0f + float(mant) * 0.125f) * dsv4_e4m3fn_exp_scale[exp];
}

__device__ inline float dsv4_e4m3fn_dequant(float x) {
  const float sign = x < 0.0f ? -1.0f : 1.0f;
  const float ax = fminf(fabsf(x), 448.0f);
  int lo = 0;
  int hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (dsv4_e4m3fn_value(mid) <= ax) lo = mid;
    else hi = mid - 1;
  }
  int best = lo;
  if (best < 126) {
    const float best_diff = fabsf(ax - dsv4_e4m3fn_value(best));
    const float next_diff = fabsf(ax - dsv4_e4m3fn_value(best + 1));
    if (next_diff < best_diff || (next_diff == best_diff && ((best + 1) & 1) == 0 && (best & 1) != 0)) best = best + 1;
  }
  return sign * dsv4_e4m3fn_value(best);
}

__global__ void kernel_dsv4_fp8_kv_quantize_f32(const SeedFp8Args args, const char* src0, char* dst) {
  __shared__ float scratch[64];
  const unsigned row = blockIdx.x;
  const unsigned tid = threadIdx.x;
  const int64_t n_rows = args.ne01 * args.ne02 * args.ne03;
  if ((int64_t)row >= n_rows) return;

  const int64_t i1 = row % args.ne01;
  const int64_t i2 = (row / args.ne01) % args.ne02;
  const int64_t i3 = row / (args.ne01 * args.ne02);

  const char* src_base = src0 + i1 * args.nb01 + i2 * args.nb02 + i3 * args.nb03;
  char* dst_base = dst + i1 * args.nb1 + i2 * args.nb2 + i3 * args.nb3;

  const int64_t n_nope = args.ne00 - args.n_rot;

  for (int64_t off = 0; off < n_nope; off += 64) {
    float v = 0.0f;
    if (tid < 64) {
      v = *((const float*)(src_base + (off + tid) * args.nb00));
      scratch[tid] = fabsf(v);
    }
    __syncthreads();

    for (unsigned stride = 32; stride > 0; stride >>= 1) {
      if (tid < stride) scratch[tid] = fmaxf(scratch[tid], scratch[tid + stride]);
      __syncthreads();
    }

    const float amax = fmaxf(scratch[0], 1.0e-4f);
    const float scale = exp2f(ceilf(log2f(amax / 448.0f)));
    if (tid < 64) {
      const float q = dsv4_e4m3fn_dequant(fminf(fmaxf(v / scale, -448.0f), 448.0f)) * scale;
      *((float*)(dst_base + (off + tid) * args.nb0)) = q;
    }
    __syncthreads();
  }

  for (int64_t i = n_nope + tid; i < args.ne00; i += 64)
    *((float*)(dst_base + i * args.nb0)) = *((const float*)(src_base + i * args.nb00));
}

}  // namespace

void seed_fp8_kv_quantize_cuda(const SeedFp8Args& args, const void* src, void* dst, void* stream) {
  const int64_t rows = args.ne01 * args.ne02 * args.ne03;
  if (rows == 0) return;
  kernel_dsv4_fp8_kv_quantize_f32<<<static_cast<unsigned>(rows), 64, 0, static_cast<cudaStream_t>(stream)>>>(
      args, static_cast<const char*>(src), static_cast<char*>(dst));
  KVCORE_CUDA_CHECK_LAUNCH("seed kernel_dsv4_fp8_kv_quantize_f32");
}

}  // namespace kvcore::baselines
