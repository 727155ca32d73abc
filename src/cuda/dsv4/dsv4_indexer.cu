// CUDA kernels of the DeepSeek-V4 lightning indexer, and the choice among them (IndexerTuning:
// by default the tensor-core scorer and the compact top-k wherever they serve):
//  - scores I(t, s) = sum_h w_h relu(q_h . k_s): the tensor-core scorer for the model's packed
//    FP4 rows of dim 128 (dsv4_scores_mma.cu); here the SIMT ones: a tiled kernel (64 rows x all
//    heads a CTA, the transformed query once a CTA in shared memory, register tiles of 8 rows x
//    2 heads a thread, rows split across CTAs over all SMs), and a general warp-per-row kernel for
//    dims the tiled one does not take (dim % 4 != 0, or a query too large for shared memory);
//  - an exact causal top-k per query: the compact kernel for k <= 1024 and up to 32768 visible
//    rows (dsv4_topk_compact.cu); here the ordered one for any shape: one CTA, the keys
//    (order-preserving u32 of the scores) in shared memory when they fit, a 3-pass radix select
//    (12 + 10 + 10 bits) with a block-wide suffix scan to find the digit, the keys above the
//    threshold in any order plus the ties in row order (lowest rows first), then the bitonic
//    sort of the picks (dsv4_topk.cuh). Both order by (score descending, row ascending) as the
//    CPU does, so identical scores give identical picks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/dsv4/dsv4_common.cuh"
#include "cuda/dsv4/dsv4_indexer_query.cuh"
#include "cuda/dsv4/dsv4_scores_mma.hpp"
#include "cuda/dsv4/dsv4_topk.cuh"
#include "kvcore/error.hpp"
#include "kvcore/math/fp4_hadamard.hpp"
#include "ops/dsv4_backends.hpp"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::native;


constexpr int kRowsPerBlock = 128;  // score rows per block of the general kernel (16 per warp)
constexpr int kMaxPerLane = 32;     // dim <= 1024

// ---- scores, the general kernel (any dim; used when the tiled one does not apply) -------------

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
  pdl_allow_dependents();  // the top-k may launch now; it waits for this grid before reading
  extern __shared__ float smem[];
  score_body(p, smem, blockIdx.y, static_cast<int64_t>(blockIdx.x) * kRowsPerBlock);
}

// ---- scores, the tiled kernel -------------------------------------------------------------

constexpr int kRowSlots = 8;                          // lane & 7: rows slot + 8 i of the tile
constexpr int kMaxTileRows = 64;                      // tiles of 64 rows (8 a thread) or 32 (4 a thread)
constexpr int kHeadSlots = 4 * (kThreads / 32);       // lane >> 3 and the warp: 32 head slots
constexpr int kHeadChunk = 2 * kHeadSlots;            // heads slot and slot + 32 of each chunk of 64

// Shared memory of the tiled kernel: the query [heads, dim], one tile of rows [kTileRows, dim + 4]
// (padded: the 8 rows a quarter warp reads hit 8 different bank groups), the per-warp row sums.
__host__ __device__ constexpr size_t tiled_smem_floats(int n_heads, int dim, int tile_rows) {
  return static_cast<size_t>(n_heads) * dim + static_cast<size_t>(tile_rows) * (dim + 4) +
         static_cast<size_t>(kThreads / 32) * tile_rows;
}

// Rows s0 .. s0 + n - 1 into ks [kTileRows, ld] as f32 (the CPU's unpacked values); rows >= n zero.
template <int kTileRows>
__device__ inline void load_tile(const IndexerParams& p, float* ks, int ld, int64_t s0, int n) {
  if (p.rows_packed) {  // 8 nibbles (one u32 of codes) a thread step; dim % 32 == 0
    const int words = p.dim / 8;
    for (int idx = threadIdx.x; idx < kTileRows * words; idx += blockDim.x) {
      const int r = idx / words, wd = idx - r * words;
      float* dst = ks + r * ld + wd * 8;
      if (r >= n) {
#pragma unroll
        for (int j = 0; j < 8; ++j) dst[j] = 0.0f;
        continue;
      }
      const uint8_t* row = static_cast<const uint8_t*>(p.rows) + (s0 + r) * p.rows_stride;
      const float scale = math::ue8m0_decode(row[p.dim / 2 + (wd * 8) / math::kFp4Block]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint8_t b = row[wd * 4 + j];
        dst[2 * j] = math::e2m1_decode(static_cast<uint8_t>(b & 0xfu)) * scale;
        dst[2 * j + 1] = math::e2m1_decode(static_cast<uint8_t>(b >> 4)) * scale;
      }
    }
  } else {
    const float* rows = static_cast<const float*>(p.rows);
    for (int idx = threadIdx.x; idx < kTileRows * p.dim; idx += blockDim.x) {
      const int r = idx / p.dim, d = idx - r * p.dim;
      ks[r * ld + d] = r < n ? rows[(s0 + r) * p.rows_stride + d] : 0.0f;
    }
  }
}

// grid (blocks per query, n_q); a block scores tiles blockIdx.x, blockIdx.x + gridDim.x, ... of
// its query's visible rows and writes -inf to the invisible rest of [0, cap).
template <int kTileRowsPerThread>
__global__ void __launch_bounds__(kThreads) score_tiled_kernel(const IndexerParams p) {
  constexpr int kTileRows = kRowSlots * kTileRowsPerThread;
  pdl_allow_dependents();  // the top-k may launch now; it waits for this grid before reading
  extern __shared__ __align__(16) float smem[];
  const int32_t i = blockIdx.y;
  const int64_t vis = mask_invisible_scores(p, i);
  float* sc = p.scores + i * p.scores_stride;
  if (static_cast<int64_t>(blockIdx.x) * kTileRows >= vis) return;  // block-uniform

  const int ld = p.dim + 4;
  float* qs = smem;
  float* ks = qs + static_cast<size_t>(p.n_heads) * p.dim;
  float* red = ks + static_cast<size_t>(kTileRows) * ld;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kTileRows;
  load_query(p, qs, i);
  const float* w = p.weights + i * p.w_stride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rs = lane & (kRowSlots - 1), hs = warp * 4 + (lane >> 3);

  for (int64_t s0 = static_cast<int64_t>(blockIdx.x) * kTileRows; s0 < vis; s0 += step) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kTileRows), vis - s0));
    load_tile<kTileRows>(p, ks, ld, s0, n);
    __syncthreads();
    float row_acc[kTileRowsPerThread];
#pragma unroll
    for (int r = 0; r < kTileRowsPerThread; ++r) row_acc[r] = 0.0f;
    for (int hc = 0; hc < p.n_heads; hc += kHeadChunk) {
      const int h0 = hc + hs, h1 = hc + hs + kHeadSlots;
      const bool v0 = h0 < p.n_heads, v1 = h1 < p.n_heads;
      const float* q0 = qs + (v0 ? h0 : 0) * p.dim;
      const float* q1 = qs + (v1 ? h1 : 0) * p.dim;
      float acc[kTileRowsPerThread][2];
#pragma unroll
      for (int r = 0; r < kTileRowsPerThread; ++r) acc[r][0] = acc[r][1] = 0.0f;
      for (int d = 0; d < p.dim; d += 4) {
        const float4 a = *reinterpret_cast<const float4*>(q0 + d);
        const float4 b = *reinterpret_cast<const float4*>(q1 + d);
#pragma unroll
        for (int r = 0; r < kTileRowsPerThread; ++r) {
          const float4 k = *reinterpret_cast<const float4*>(ks + (rs + kRowSlots * r) * ld + d);
          acc[r][0] = fmaf(a.x, k.x, acc[r][0]);
          acc[r][0] = fmaf(a.y, k.y, acc[r][0]);
          acc[r][0] = fmaf(a.z, k.z, acc[r][0]);
          acc[r][0] = fmaf(a.w, k.w, acc[r][0]);
          acc[r][1] = fmaf(b.x, k.x, acc[r][1]);
          acc[r][1] = fmaf(b.y, k.y, acc[r][1]);
          acc[r][1] = fmaf(b.z, k.z, acc[r][1]);
          acc[r][1] = fmaf(b.w, k.w, acc[r][1]);
        }
      }
      const float w0 = v0 ? w[h0] : 0.0f, w1 = v1 ? w[h1] : 0.0f;
#pragma unroll
      for (int r = 0; r < kTileRowsPerThread; ++r) {
        float part = 0.0f;
        if (v0) part += w0 * (acc[r][0] > 0.0f ? acc[r][0] : 0.0f);
        if (v1) part += w1 * (acc[r][1] > 0.0f ? acc[r][1] : 0.0f);
        row_acc[r] += part;
      }
    }
    // Sum the 32 head slots of each row: the 4 of a warp by shuffles, the 8 warps in shared memory.
#pragma unroll
    for (int r = 0; r < kTileRowsPerThread; ++r) {
      row_acc[r] += __shfl_xor_sync(0xffffffffu, row_acc[r], 8);
      row_acc[r] += __shfl_xor_sync(0xffffffffu, row_acc[r], 16);
    }
    if (lane < kRowSlots)
#pragma unroll
      for (int r = 0; r < kTileRowsPerThread; ++r) red[warp * kTileRows + rs + kRowSlots * r] = row_acc[r];
    __syncthreads();
    if (threadIdx.x < n) {
      float total = 0.0f;
      for (int wp = 0; wp < kThreads / 32; ++wp) total += red[wp * kTileRows + threadIdx.x];
      sc[s0 + threadIdx.x] = total;
    }
    // The next tile's loads write ks only; red is rewritten after the barrier that follows them.
  }
}

// ---- top-k ----------------------------------------------------------------------------------

constexpr int kTopkThreads = 1024;
constexpr int kMaxK = 2048;
static_assert(kMaxK <= 2 * kTopkThreads, "the bitonic sort holds two picks a thread");
constexpr int kSmemKeysMax = 32768;  // visible rows whose keys are cached in shared memory (128 KB)
constexpr int kCandMax = 4096;       // keys of the threshold's 12-bit bin held as candidates (32 KB)

// Block-wide inclusive scan of v over threads, forward (threads <= me) or backward (threads
// >= me). scratch: >= 33 ints. Ends with a barrier, so scratch can be reused at once.
__device__ inline int block_scan(int v, bool backward, int* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, v, o), down = __shfl_down_sync(0xffffffffu, v, o);
    if (backward) {
      if (lane + o < 32) v += down;
    } else {
      if (lane >= o) v += up;
    }
  }
  if (lane == (backward ? 0 : 31)) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int x = lane < n_warps ? scratch[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, x, o), down = __shfl_down_sync(0xffffffffu, x, o);
      if (backward) {
        if (lane + o < 32) x += down;
      } else {
        if (lane >= o) x += up;
      }
    }
    if (lane < n_warps) scratch[lane] = x;  // inclusive over warps
  }
  __syncthreads();
  if (backward) {
    if (warp + 1 < n_warps) v += scratch[warp + 1];
  } else {
    if (warp > 0) v += scratch[warp - 1];
  }
  __syncthreads();
  return v;
}

// The digit of a radix pass: the bin b with above(b) < need <= above(b) + hist[b], above(b) =
// keys in higher bins (hist[0, n_bins), n_bins a multiple of blockDim.x). Sets s_prefix (prefix
// with the digit), s_need (need minus above(b)) and s_cnt (hist[b]); ends after a barrier.
__device__ inline void find_digit(const int* hist, int n_bins, int shift, uint32_t prefix, int need, int* scratch,
                                  uint32_t* s_prefix, int* s_need, int* s_cnt) {
  const int per = n_bins / static_cast<int>(blockDim.x), tid = threadIdx.x;
  int local = 0;
  for (int j = 0; j < per; ++j) local += hist[tid * per + j];
  int above = block_scan(local, true, scratch) - local;
  for (int j = per - 1; j >= 0; --j) {
    const int b = tid * per + j, c = hist[b];
    if (above < need && above + c >= need) {
      *s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
      *s_need = need - above;
      *s_cnt = c;
    }
    above += c;
  }
  __syncthreads();
}

// Histogram of digit (key >> shift) & (n_bins - 1) over the n keys key_of(0 .. n-1) whose masked
// bits equal prefix, into hist; ends after a barrier.
template <class KeyOf>
__device__ inline void radix_histogram(const KeyOf& key_of, int n, int bits, int shift, uint32_t mask, uint32_t prefix,
                                       int* hist) {
  const int n_bins = 1 << bits;
  for (int b = threadIdx.x; b < n_bins; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const uint32_t key = key_of(s);
    if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & static_cast<uint32_t>(n_bins - 1)], 1);
  }
  __syncthreads();
}

// Exact top-k of one query's visible scores, in (score descending, row ascending) order.
// Radix select of the take-th largest key, MSB first (12, 10, 10 bits). After the first pass the
// keys of the threshold's 12-bit bin are usually few: when at most kCandMax, one ordered sweep
// places the keys of higher bins (picks) and those of the bin (candidates, in row order), and the
// last two passes and the ties run over the candidates only (two sweeps over all keys instead of
// five). Otherwise every pass sweeps all keys.
template <bool kKeysInSmem>
__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const IndexerParams p) {
  extern __shared__ uint32_t dyn[];  // candidates [kCandMax] keys, [kCandMax] rows; then [vis] keys when kKeysInSmem
  uint32_t* cand_key = dyn;
  int32_t* cand_idx = reinterpret_cast<int32_t*>(dyn + kCandMax);
  uint32_t* keys = dyn + 2 * kCandMax;
  __shared__ int hist[4096];
  __shared__ uint32_t sel_key[kMaxK];
  __shared__ int32_t sel_idx[kMaxK];
  __shared__ int scratch[33];
  __shared__ uint32_t s_prefix;
  __shared__ int s_need, s_cnt, s_n_gt, s_total;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
  const int32_t i = blockIdx.x;
  const int64_t t = p.first_query_pos + i;
  const int vis = static_cast<int>(min(p.n_rows, visible_rows(t, p.ratio)));
  const float* sc = p.scores + i * p.scores_stride;
  int32_t* out = p.out + i * p.out_stride;
  const int take = p.k < vis ? p.k : vis;
  for (int j = tid; j < p.k; j += blockDim.x)  // -1 beyond take; the picks overwrite the rest below
    if (j >= take) out[j] = -1;
  if (take == 0) return;

  if constexpr (kKeysInSmem) {
    for (int s = tid; s < vis; s += blockDim.x) keys[s] = order_key(sc[s]);
  }
  if (tid == 0) s_n_gt = 0;
  __syncthreads();
  auto key_at = [&](int s) -> uint32_t {
    if constexpr (kKeysInSmem) {
      return keys[s];
    } else {
      return order_key(sc[s]);
    }
  };

  // Pass 0 over all keys: the threshold's top 12 bits.
  radix_histogram(key_at, vis, 12, 20, 0u, 0u, hist);
  find_digit(hist, 4096, 20, 0u, take, scratch, &s_prefix, &s_need, &s_cnt);
  uint32_t prefix = s_prefix, mask = 0xfff00000u;
  int need = s_need;
  const int n_cand = s_cnt, n_gt0 = take - need;  // keys in the threshold's bin, keys above it
  // Rows [w seg, (w + 1) seg) belong to warp w (ordered sweeps).
  const int seg = ((vis + n_warps - 1) / n_warps + 31) / 32 * 32;
  const int s_begin = min(vis, warp * seg), s_end = min(vis, s_begin + seg);
  const unsigned lower = (1u << lane) - 1u;
  uint32_t kth = 0;
  int n_ties = 0;
  // Passes 1 and 2 (bits 19..10, 9..0) over n keys read by key_fn: the exact threshold key
  // kth and how many keys equal to it are taken (n_ties).
  auto low_passes = [&](auto key_fn, int n) {
    for (int pass = 1; pass < 3; ++pass) {
      const int shift = pass == 1 ? 10 : 0;
      radix_histogram(key_fn, n, 10, shift, mask, prefix, hist);
      find_digit(hist, 1024, shift, prefix, need, scratch, &s_prefix, &s_need, &s_cnt);
      prefix = s_prefix;
      need = s_need;
      mask |= 1023u << shift;
    }
    kth = prefix;
    n_ties = need;
  };

  if (n_cand <= kCandMax) {  // block-uniform
    const uint32_t b0 = prefix >> 20;
    int my_gt = 0, my_in = 0;
    for (int s = s_begin + lane; s < s_end; s += 32) {
      const uint32_t d = key_at(s) >> 20;
      my_gt += d > b0;
      my_in += d == b0;
    }
    my_gt = __reduce_add_sync(0xffffffffu, my_gt);
    my_in = __reduce_add_sync(0xffffffffu, my_in);
    const int packed = lane == 0 ? (my_gt << 16) | my_in : 0;  // both totals < 2^16 (<= kMaxK, <= kCandMax)
    int before = block_scan(packed, false, scratch) - packed;
    before = __shfl_sync(0xffffffffu, before, 0);
    int gt_rank = before >> 16, in_rank = before & 0xffff;
    for (int base = s_begin; base < s_end; base += 32) {
      const int s = base + lane;
      const uint32_t key = s < s_end ? key_at(s) : 0u, d = key >> 20;
      const bool g = s < s_end && d > b0, c = s < s_end && d == b0;
      const unsigned bg = __ballot_sync(0xffffffffu, g), bc = __ballot_sync(0xffffffffu, c);
      if (g) {
        const int slot = gt_rank + __popc(bg & lower);
        sel_key[slot] = key;
        sel_idx[slot] = s;
      }
      if (c) {
        const int slot = in_rank + __popc(bc & lower);
        cand_key[slot] = key;
        cand_idx[slot] = s;
      }
      gt_rank += __popc(bg);
      in_rank += __popc(bc);
    }
    if (tid == 0) s_n_gt = n_gt0;
    __syncthreads();
    auto cand_at = [&](int j) -> uint32_t { return cand_key[j]; };
    low_passes(cand_at, n_cand);
    // Candidates above the threshold: any slot order (sorted below).
    for (int j = tid; j < n_cand; j += blockDim.x) {
      const uint32_t key = cand_key[j];
      if (key > kth) {
        const int slot = atomicAdd(&s_n_gt, 1);
        sel_key[slot] = key;
        sel_idx[slot] = cand_idx[j];
      }
    }
    // Ties in candidate order (row order): the first n_ties of them.
    int running = 0;
    for (int base = 0; base < n_cand; base += blockDim.x) {  // the same trip count for every thread
      const int j = base + tid;
      const int f = j < n_cand && cand_key[j] == kth ? 1 : 0;
      const int incl = block_scan(f, false, scratch);
      if (tid == blockDim.x - 1) s_total = incl;
      __syncthreads();
      const int r = running + incl - f;
      if (f && r < n_ties) {
        sel_key[take - n_ties + r] = kth;
        sel_idx[take - n_ties + r] = cand_idx[j];
      }
      running += s_total;
      __syncthreads();  // s_total is rewritten next round
    }
  } else {
    low_passes(key_at, vis);
    const int n_gt = take - need;  // picks above the threshold key, ties to take
    // Keys above the threshold: any slot order (sorted below).
    for (int base = 0; base < vis; base += blockDim.x) {  // warp-aggregated slots
      const int s = base + tid;
      const uint32_t key = s < vis ? key_at(s) : 0u;
      const bool above = s < vis && key > kth;
      const unsigned ballot = __ballot_sync(0xffffffffu, above);
      int first = 0;
      if (lane == 0 && ballot) first = atomicAdd(&s_n_gt, __popc(ballot));
      first = __shfl_sync(0xffffffffu, first, 0);
      if (above) {
        const int slot = first + __popc(ballot & lower);
        sel_key[slot] = key;
        sel_idx[slot] = s;
      }
    }
    // Ties in row order: warp w owns the rows [w seg, (w + 1) seg); count, scan over warps, place.
    int mine = 0;
    for (int s = s_begin + lane; s < s_end; s += 32) mine += key_at(s) == kth;
    mine = __reduce_add_sync(0xffffffffu, mine);
    const int lane_total = lane == 0 ? mine : 0;
    int rank = block_scan(lane_total, false, scratch) - lane_total;  // ties in the warps before this one
    rank = __shfl_sync(0xffffffffu, rank, 0);
    for (int base = s_begin; base < s_end && rank < n_ties; base += 32) {
      const int s = base + lane;
      const bool tie = s < s_end && key_at(s) == kth;
      const unsigned ballot = __ballot_sync(0xffffffffu, tie);
      const int r = rank + __popc(ballot & lower);
      if (tie && r < n_ties) {
        sel_key[n_gt + r] = kth;
        sel_idx[n_gt + r] = s;
      }
      rank += __popc(ballot);
    }
  }
  __syncthreads();

  sort_picks_and_write(sel_key, sel_idx, take, out);
}

static void indexer_check(const IndexerParams& p) {
  require(p.k <= kMaxK, ErrorCode::NotSupported, "dsv4_indexer_topk on CUDA: top-k ", p.k, " exceeds ", kMaxK);
  require(p.n_q <= 65535, ErrorCode::NotSupported, "dsv4_indexer_topk on CUDA: at most 65535 queries a call, got ", p.n_q);
  require(p.cap <= (int64_t{1} << 31) - 1, ErrorCode::NotSupported, "dsv4_indexer_topk on CUDA: too many rows: ", p.cap);
}

void launch_tiled(int per_thread, dim3 grid, size_t bytes, int dev, const IndexerParams& p, Stream s) {
  if (per_thread == 4) {
    smem_opt_in(score_tiled_kernel<4>, bytes, dev);
    score_tiled_kernel<4><<<grid, kThreads, bytes, native(s)>>>(p);
  } else {
    smem_opt_in(score_tiled_kernel<8>, bytes, dev);
    score_tiled_kernel<8><<<grid, kThreads, bytes, native(s)>>>(p);
  }
}

void indexer_scores(const IndexerParams& p, Stream s, const IndexerTuning& tuning) {
  indexer_check(p);
  const int dev = current_device();
  if (tuning.scorer != IndexerScorer::Simt && scores_mma_serves(p)) {
    launch_scores_mma(p, dev, s, tuning.scorer_warps, tuning.scorer_cluster, tuning.pdl);
    return;
  }
  const size_t tiled_bytes = tiled_smem_floats(p.n_heads, p.dim, kMaxTileRows) * sizeof(float);
  if (p.dim % 4 == 0 && tiled_bytes <= 200 * 1024) {
    const int64_t sms = sm_count(dev), rows = std::min(p.n_rows, p.cap);
    const int64_t want = std::max<int64_t>(1, 2 * sms / p.n_q);  // ~2 CTAs an SM in all
    // Few rows (fewer 64-row tiles than SMs): 32-row tiles, twice the CTAs.
    const bool small = (rows + kMaxTileRows - 1) / kMaxTileRows * p.n_q < sms;
    const int tile_rows = small ? kMaxTileRows / 2 : kMaxTileRows;
    const size_t bytes = tiled_smem_floats(p.n_heads, p.dim, tile_rows) * sizeof(float);
    const int64_t tiles = (rows + tile_rows - 1) / tile_rows;
    const dim3 grid(static_cast<unsigned>(std::max<int64_t>(1, std::min(tiles, want))), static_cast<unsigned>(p.n_q));
    const int per_thread = tile_rows / kRowSlots;
    launch_tiled(per_thread, grid, bytes, dev, p, s);
    KVCORE_CUDA_CHECK_LAUNCH("dsv4 score_tiled_kernel");
  } else {
    const size_t q_smem = static_cast<size_t>(p.n_heads) * p.dim * sizeof(float);
    require(q_smem <= 200 * 1024, ErrorCode::NotSupported, "dsv4_indexer_topk on CUDA: heads x dim = ", p.n_heads, " x ",
            p.dim, " exceeds the shared memory of one block");
    smem_opt_in(score_kernel, q_smem, dev);
    const dim3 grid(static_cast<unsigned>((p.cap + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(p.n_q));
    score_kernel<<<grid, kThreads, q_smem, native(s)>>>(p);
    KVCORE_CUDA_CHECK_LAUNCH("dsv4 score_kernel");
  }
}

// Launches topk_kernel for the query count, keys in shared memory when they fit.
void launch_topk(const IndexerParams& p, int dev, Stream s) {
  const int64_t max_vis = std::min(p.n_rows, p.cap);
  const size_t cand_bytes = static_cast<size_t>(2 * kCandMax) * sizeof(uint32_t);
  if (max_vis <= kSmemKeysMax) {
    // The kernel's static shared memory (32 KB) counts against the same limit: raise the dynamic
    // limit to the most this kernel ever takes, once per device (an opt-in smaller than static +
    // dynamic makes a launch with more keys fail with cudaErrorInvalidValue).
    const size_t bytes = cand_bytes + static_cast<size_t>(max_vis) * sizeof(uint32_t);
    smem_opt_in(topk_kernel<true>, cand_bytes + static_cast<size_t>(kSmemKeysMax) * sizeof(uint32_t), dev);
    topk_kernel<true><<<p.n_q, kTopkThreads, bytes, native(s)>>>(p);
  } else {
    // static 32 KB + dynamic 32 KB: over the 48 KB default
    smem_opt_in(topk_kernel<false>, cand_bytes, dev);
    topk_kernel<false><<<p.n_q, kTopkThreads, cand_bytes, native(s)>>>(p);
  }
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 topk_kernel");
}

void indexer_select(const IndexerParams& p, Stream s, const IndexerTuning& tuning) {
  indexer_check(p);
  const int dev = current_device();
  const IndexerTopk asked = tuning.topk;
  const bool cluster = asked == IndexerTopk::Cluster || (asked == IndexerTopk::Auto && topk_cluster_pays(p, dev));
  if (cluster && topk_cluster_serves(p, dev)) {
    launch_topk_cluster(p, dev, s, tuning.pdl, tuning.sort_four);
  } else if (asked != IndexerTopk::Ordered && topk_compact_serves(p)) {
    launch_topk_compact(p, dev, s, tuning.pdl, tuning.sort_four);
  } else {
    launch_topk(p, dev, s);
  }
}

void indexer_topk(const IndexerParams& p, Stream s, const IndexerTuning& tuning) {
  indexer_check(p);  // before any launch: nothing written on a refusal
  if (tuning.fused) {
    const int dev = current_device();
    if (indexer_fused_serves(p, dev)) return launch_indexer_fused(p, dev, s, tuning.pdl, tuning.sort_four);
  }
  indexer_scores(p, s, tuning);
  indexer_select(p, s, tuning);
}

}  // namespace kvcore::ops::cuda::dsv4
