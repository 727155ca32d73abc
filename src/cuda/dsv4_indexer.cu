// CUDA kernels of the DeepSeek-V4 lightning indexer: scores
// I(t, s) = sum_h w_h relu(q_h . k_s) (a warp per row), then an exact causal
// top-k per query (radix select on order-preserving keys, ties to the lower row,
// a bitonic sort of the picks), matching the CPU's order for identical scores.
#include <cuda_runtime.h>

#include "cuda/check.cuh"
#include "cuda/dsv4_common.cuh"
#include "kvcore/error.hpp"
#include "ops/dsv4_backends.hpp"

namespace kvcore::dsv4::cuda {

using kvcore::cuda::native;

constexpr int kRowsPerBlock = 128;  // score rows per block (16 per warp)
constexpr int kMaxPerLane = 32;     // dim <= 1024

// ---- scores -------------------------------------------------------------------------------

__device__ inline void score_body(const IndexerParams& p, float* qs /* [n_heads * dim] */, int32_t i, int64_t s0) {
  // The query, Hadamard + FP4 transformed like the stored rows when quantized.
  for (int h = 0; h < p.n_heads; ++h)
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x) qs[h * p.dim + d] = p.q[i * p.q_stride0 + h * p.q_stride1 + d];
  __syncthreads();
  if (p.quant) {  // all heads at once: FP4 blocks of 32 never straddle two heads (dim % 32 == 0)
    hadamard_smem(qs, p.dim, p.n_heads);
    fp4_blocks(qs, p.n_heads * p.dim, nullptr);
    __syncthreads();
  }
  const int64_t t = p.first_query_pos + i;
  const int64_t vis = min(p.n_rows, visible_rows(t, p.ratio));
  const float* w = p.weights + i * p.w_stride;
  float* sc = p.scores + i * p.scores_stride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int per_lane = p.dim / 32, rem = p.dim % 32;
  for (int64_t s = s0 + warp; s < min(s0 + kRowsPerBlock, p.cap); s += n_warps) {
    if (s >= vis) {
      if (lane == 0) sc[s] = -INFINITY;
      continue;
    }
    float kr[kMaxPerLane + 1];
#pragma unroll
    for (int j = 0; j <= kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      float v = 0.0f;
      if (j < per_lane || (j == per_lane && lane < rem)) {
        if (p.rows_packed) {
          v = math::dsv4_unpack_fp4_value(static_cast<const uint8_t*>(p.rows) + s * p.rows_stride, p.dim, d);
        } else {
          v = static_cast<const float*>(p.rows)[s * p.rows_stride + d];
        }
      }
      kr[j] = v;
    }
    float acc = 0.0f;
    for (int h = 0; h < p.n_heads; ++h) {
      const float* qh = qs + h * p.dim;
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j <= kMaxPerLane; ++j) {
        const int d = lane + 32 * j;
        if (j < per_lane || (j == per_lane && lane < rem)) dot += qh[d] * kr[j];
      }
      dot = warp_sum(dot);
      acc += w[h] * (dot > 0.0f ? dot : 0.0f);
    }
    if (lane == 0) sc[s] = acc;
  }
}

__global__ void __launch_bounds__(kThreads) score_kernel(const IndexerParams p) {
  extern __shared__ float smem[];
  score_body(p, smem, blockIdx.y, static_cast<int64_t>(blockIdx.x) * kRowsPerBlock);
}

// ---- top-k ----------------------------------------------------------------------------------

constexpr int kTopkThreads = 1024;
constexpr int kMaxK = 2048;

// Larger float -> larger key; -0 counts as +0 (the CPU compares them equal).
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block-wide exclusive prefix count of `flag` in thread order; returns this thread's
// offset and writes the block total to *total.
__device__ inline int block_prefix_count(bool flag, int* warp_counts /* >= 33 */, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int w = 0; w < n_warps; ++w) {
      const int c = warp_counts[w];
      warp_counts[w] = acc;
      acc += c;
    }
    warp_counts[32] = acc;
  }
  __syncthreads();
  const int off = warp_counts[warp] + in_warp;
  *total = warp_counts[32];
  __syncthreads();
  return off;
}

__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const IndexerParams p) {
  __shared__ uint32_t sel_key[kMaxK];
  __shared__ int32_t sel_idx[kMaxK];
  __shared__ int hist[256];
  __shared__ int counts[33];
  __shared__ uint32_t s_prefix;
  __shared__ int s_need, s_n_gt;

  const int32_t i = blockIdx.x;
  const int64_t t = p.first_query_pos + i;
  const int64_t vis = min(p.n_rows, visible_rows(t, p.ratio));
  const float* sc = p.scores + i * p.scores_stride;
  int32_t* out = p.out + i * p.out_stride;
  const int take = static_cast<int>(p.k < vis ? p.k : vis);

  // Radix select of the take-th largest key: MSB first, 8 bits a pass.
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_need = take;
  }
  __syncthreads();
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0 && take > 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int64_t s = threadIdx.x; s < vis; s += blockDim.x) {
      const uint32_t key = order_key(sc[s]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int need = s_need, b = 255;
      for (; b > 0; --b) {
        if (hist[b] >= need) break;
        need -= hist[b];
      }
      s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
      s_need = need;  // how many keys equal to the final threshold still to take (after the last pass)
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  const uint32_t kth = s_prefix;
  const int n_ties = s_need;  // ties with the threshold key to take, lowest rows first
  if (threadIdx.x == 0) s_n_gt = 0;
  __syncthreads();
  // Keys above the threshold: any slot order (sorted below).
  for (int64_t s = threadIdx.x; s < vis && take > 0; s += blockDim.x) {
    const uint32_t key = order_key(sc[s]);
    if (key > kth) {
      const int slot = atomicAdd(&s_n_gt, 1);
      sel_key[slot] = key;
      sel_idx[slot] = static_cast<int32_t>(s);
    }
  }
  __syncthreads();
  const int n_gt = s_n_gt;
  // Ties in row order until n_ties are taken.
  int taken = 0;
  for (int64_t base = 0; base < vis && taken < n_ties; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    const bool tie = s < vis && order_key(sc[s]) == kth;
    int total = 0;
    const int off = block_prefix_count(tie, counts, &total);
    if (tie && taken + off < n_ties) {
      sel_key[n_gt + taken + off] = kth;
      sel_idx[n_gt + taken + off] = static_cast<int32_t>(s);
    }
    taken += total;
  }
  __syncthreads();
  // Bitonic sort of the picks: key descending, row ascending.
  int n_sort = 1;
  while (n_sort < take) n_sort <<= 1;
  for (int j = take + threadIdx.x; j < n_sort; j += blockDim.x) {
    sel_key[j] = 0;
    sel_idx[j] = 0x7fffffff;
  }
  __syncthreads();
  for (int size = 2; size <= n_sort; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int a = threadIdx.x; a < n_sort; a += blockDim.x) {
        const int b = a ^ stride;
        if (b <= a) continue;
        const bool up = (a & size) == 0;  // this pair sorts "best first"
        const bool a_first = sel_key[a] > sel_key[b] || (sel_key[a] == sel_key[b] && sel_idx[a] < sel_idx[b]);
        if (a_first != up) {
          const uint32_t tk = sel_key[a];
          sel_key[a] = sel_key[b];
          sel_key[b] = tk;
          const int32_t ti = sel_idx[a];
          sel_idx[a] = sel_idx[b];
          sel_idx[b] = ti;
        }
      }
      __syncthreads();
    }
  }
  for (int j = threadIdx.x; j < p.k; j += blockDim.x) out[j] = j < take ? sel_idx[j] : -1;
}

void indexer_topk(const IndexerParams& p, Stream s) {
  const size_t q_smem = static_cast<size_t>(p.n_heads) * p.dim * sizeof(float);
  require(q_smem <= 200 * 1024, ErrorCode::NotSupported, "dsv4_indexer_topk on CUDA: heads x dim = ", p.n_heads, " x ",
          p.dim, " exceeds the shared memory of one block");
  require(p.k <= kMaxK, ErrorCode::NotSupported, "dsv4_indexer_topk on CUDA: top-k ", p.k, " exceeds ", kMaxK);
  if (q_smem > 48 * 1024)
    KVCORE_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(score_kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(q_smem)));
  const dim3 grid(static_cast<unsigned>((p.cap + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(p.n_q));
  require(p.n_q <= 65535, ErrorCode::NotSupported, "dsv4_indexer_topk on CUDA: at most 65535 queries a call, got ", p.n_q);
  score_kernel<<<grid, kThreads, q_smem, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 score_kernel");
  topk_kernel<<<p.n_q, kTopkThreads, 0, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 topk_kernel");
}

}  // namespace kvcore::dsv4::cuda
