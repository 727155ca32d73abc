// CUDA row jobs of the DeepSeek-V4 context shift (ops/dsv4_shift.hpp): one warp per row.
// Plain rows (raw rings, f32 indexer rows): lanes copy the dims that do not rotate and
// rotate the pairs that do, each element read and written by one lane (rows may be shifted
// in place). FP4 indexer rows: the row is dequantized into shared memory, then the same
// Hadamard butterfly network as math::hadamard_transform (stage by stage, a warp barrier
// between stages), the same rotate_pair, the Hadamard again and the FP4 codec per block of
// 32 (block amax by a warp max: max is exact in any order). Every value is computed by the
// same operations as the CPU's (src/cpu/dsv4_shift.cpp): the same bits.
//
// The job table and the cos/sin travel in the kernel parameters (no upload, no host sync):
// a call with more jobs than one launch carries is split into several launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "cuda/common/check.cuh"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/math/shift_rotate.hpp"
#include "ops/dsv4_shift.hpp"

namespace kvcore::ops::cuda {
namespace {

using ops::Dsv4ShiftJob;
using ops::Dsv4ShiftRowKind;

constexpr int kWarps = 4;                // rows per block
constexpr int kJobsPerLaunch = 20;
constexpr int kMaxPairsPerLaunch = 192;  // three tables of up to 64 pairs
constexpr int kMaxFp4Dim = 1024;         // index_dim limit of the config

struct Batch {
  Dsv4ShiftJob jobs[kJobsPerLaunch];
  int32_t row_start[kJobsPerLaunch + 1];
  int32_t n_jobs;
  float cos_t[kMaxPairsPerLaunch], sin_t[kMaxPairsPerLaunch];
};
static_assert(sizeof(Batch) <= 4000, "kernel parameters must stay under CUDA's 4 KB");

__device__ __forceinline__ int64_t wrap(int64_t row, int32_t modulus) { return modulus > 0 ? row % modulus : row; }

template <class T>
__device__ void plain_row(const Dsv4ShiftJob& j, const uint8_t* src, uint8_t* dst, const float* c, const float* s, int lane) {
  const T* from = reinterpret_cast<const T*>(src);
  T* to = reinterpret_cast<T*>(dst);
  const math::RopeLayout& l = j.layout;
  if (src != dst)  // in place, the dims that do not rotate are already where they belong
    for (int d = lane; d < j.dim; d += 32)
      if (!l.rotates(d)) to[d] = from[d];
  for (int i = lane; i < l.n_pairs(); i += 32) {
    float x0 = to_f32(from[l.dim0(i)]), x1 = to_f32(from[l.dim1(i)]);
    math::rotate_pair(x0, x1, c[i], s[i]);
    to[l.dim0(i)] = from_f32<T>(x0);
    to[l.dim1(i)] = from_f32<T>(x1);
  }
}

// x <- H x over n values in shared memory, the butterfly network of math::hadamard_transform.
__device__ void hadamard_warp(float* x, int n, int lane) {
  for (int h = 1; h < n; h *= 2) {
    for (int p = lane; p < n / 2; p += 32) {
      const int j = (p / h) * 2 * h + p % h;
      const float a = x[j], b = x[j + h];
      x[j] = a + b;
      x[j + h] = a - b;
    }
    __syncwarp();
  }
  const float sc = math::dsv4_hadamard_scale(n);
  for (int d = lane; d < n; d += 32) x[d] *= sc;
  __syncwarp();
}

__device__ float warp_amax(float v) {
  float a = math::finite_abs_max(0.0f, v);
  for (int o = 16; o > 0; o /= 2) a = math::finite_abs_max(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

__device__ void fp4_row(const Dsv4ShiftJob& j, const uint8_t* src, uint8_t* dst, const float* c, const float* s, float* x,
                        int lane) {
  const int n = j.dim;
  const bool packed = j.kind == Dsv4ShiftRowKind::Fp4Packed;
  for (int d = lane; d < n; d += 32)
    x[d] = packed ? math::dsv4_unpack_fp4_value(src, n, d) : reinterpret_cast<const float*>(src)[d];
  __syncwarp();
  hadamard_warp(x, n, lane);
  const math::RopeLayout& l = j.layout;
  for (int i = lane; i < l.n_pairs(); i += 32) math::rotate_pair(x[l.dim0(i)], x[l.dim1(i)], c[i], s[i]);
  __syncwarp();
  hadamard_warp(x, n, lane);
  for (int b = 0; b < n / math::kFp4Block; ++b) {  // kFp4Block == 32: lane = element of the block
    const float v = x[b * 32 + lane];
    const int k = math::e2m1_scale_exponent(warp_amax(v));
    if (packed) {
      const uint8_t code = math::e2m1_encode_scaled(v, k);
      const uint8_t hi = static_cast<uint8_t>(__shfl_down_sync(0xffffffffu, static_cast<uint32_t>(code), 1));
      if ((lane & 1) == 0) dst[(b * 32 + lane) / 2] = static_cast<uint8_t>(code | (hi << 4));
      if (lane == 0) dst[n / 2 + b] = math::ue8m0_encode(k);
    } else {
      reinterpret_cast<float*>(dst)[b * 32 + lane] = math::e2m1_round_trip(v, k);
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) shift_jobs_kernel(const Batch p) {
  __shared__ float smem[kWarps][kMaxFp4Dim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t g = blockIdx.x * kWarps + warp;
  if (g >= p.row_start[p.n_jobs]) return;
  int ji = 0;
  while (p.row_start[ji + 1] <= g) ++ji;
  const Dsv4ShiftJob& j = p.jobs[ji];
  const int64_t r = g - p.row_start[ji];
  const uint8_t* src = j.src + wrap(j.src_row0 + r, j.modulus) * j.row_bytes;
  uint8_t* dst = j.dst + wrap(j.dst_row0 + r, j.modulus) * j.row_bytes;
  if (!j.rotate) {
    if (src == dst) return;
    if (j.row_bytes % 4 == 0) {
      for (int64_t w = lane; w < j.row_bytes / 4; w += 32)
        reinterpret_cast<uint32_t*>(dst)[w] = reinterpret_cast<const uint32_t*>(src)[w];
    } else {
      for (int64_t b = lane; b < j.row_bytes; b += 32) dst[b] = src[b];
    }
    return;
  }
  const float* c = p.cos_t + j.pair_offset;
  const float* s = p.sin_t + j.pair_offset;
  switch (j.kind) {
    case Dsv4ShiftRowKind::F32: plain_row<float>(j, src, dst, c, s, lane); break;
    case Dsv4ShiftRowKind::F16: plain_row<f16>(j, src, dst, c, s, lane); break;
    case Dsv4ShiftRowKind::Fp4Packed:
    case Dsv4ShiftRowKind::Fp4F32: fp4_row(j, src, dst, c, s, smem[warp], lane); break;
  }
}

}  // namespace

void dsv4_shift_jobs(const ops::Dsv4ShiftJobsParams& p, Stream stream) {
  KVCORE_CUDA_CHECK(cudaSetDevice(p.device_index));
  // The tables the jobs use, renumbered per launch (a launch carries at most three).
  for (int32_t first = 0; first < p.n_jobs; first += kJobsPerLaunch) {
    Batch b{};
    b.n_jobs = std::min(kJobsPerLaunch, p.n_jobs - first);
    int32_t pairs = 0;
    int32_t seen_offset[kJobsPerLaunch], seen_at[kJobsPerLaunch], n_seen = 0;
    b.row_start[0] = 0;
    for (int32_t i = 0; i < b.n_jobs; ++i) {
      Dsv4ShiftJob j = p.jobs[first + i];
      int32_t at = -1;
      for (int32_t k = 0; k < n_seen; ++k)
        if (seen_offset[k] == j.pair_offset) at = seen_at[k];
      if (at < 0) {
        const int32_t n = j.layout.n_pairs();
        if (pairs + n > kMaxPairsPerLaunch)
          throw Error(ErrorCode::NotSupported, detail::concat("dsv4 shift: more than ", kMaxPairsPerLaunch, " RoPE pairs in one launch"));
        std::copy(p.cos_t + j.pair_offset, p.cos_t + j.pair_offset + n, b.cos_t + pairs);
        std::copy(p.sin_t + j.pair_offset, p.sin_t + j.pair_offset + n, b.sin_t + pairs);
        seen_offset[n_seen] = j.pair_offset;
        seen_at[n_seen++] = pairs;
        at = pairs;
        pairs += n;
      }
      j.pair_offset = at;
      b.jobs[i] = j;
      b.row_start[i + 1] = b.row_start[i] + j.n_rows;
    }
    const int32_t rows = b.row_start[b.n_jobs];
    if (rows == 0) continue;
    shift_jobs_kernel<<<(rows + kWarps - 1) / kWarps, kWarps * 32, 0, native(stream)>>>(b);
    KVCORE_CUDA_CHECK_LAUNCH("dsv4 shift_jobs_kernel");
  }
}

}  // namespace kvcore::ops::cuda
