// The compact top-k of the DeepSeek-V4 indexer: the exact top-k of one query's visible scores
// in (score descending, row ascending) order, one CTA of 512 threads a query, for the model's
// decode shapes (k <= 1024, at most 32768 visible rows). It selects the same picks as the
// ordered kernel (dsv4_indexer.cu) with fewer steps on the critical path, which is what a
// decode step's single query waits on:
//  - every visible key read once from global memory (several loads in flight a thread) into
//    shared memory, its first-pass histogram built on the way;
//  - a radix select of the threshold key, MSB first (12, 10, 10 bits); each pass's digit is
//    found by every warp on its own from per-warp bin sums (no block-wide scan);
//  - after the first pass the keys of the threshold's 12-bit bin are usually few: when at most
//    kCand, one sweep places the keys of higher bins (picks) and those of the bin (candidates),
//    and the last two passes run over the candidates only; otherwise over all keys;
//  - picks take slots by warp-aggregated atomics, in any order (the bitonic sort orders them);
//    the keys equal to the threshold are all taken at once when every one of them is needed,
//    else the lowest rows among them by an ordered sweep over all keys (the CPU's tie rule);
//  - launched as a programmatic dependent of the scores, it clears its histograms while the
//    scores drain and waits for them before its first read of scores (or any global write).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/dsv4/dsv4_topk.cuh"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::native;

namespace {

constexpr int kCompactThreads = 512;
constexpr int kCompactWarps = kCompactThreads / 32;
constexpr int kCand = 4096;     // keys of the threshold's 12-bit bin held as candidates (32 KB)
constexpr int kLoadBatch = 16;  // score loads in flight a thread
constexpr unsigned kFull = 0xffffffffu;

// Sum of v over lanes >= this lane.
__device__ __forceinline__ int suffix_sum(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_down_sync(kFull, v, o);
    if (lane + o < 32) v += t;
  }
  return v;
}

// A radix pass's outcome: the threshold's bin, how many keys still to take from it, its count.
struct Digit {
  uint32_t bin;
  int need;
  int count;
};

// The digit of a radix pass: the bin b of hist[0, kBins) with above(b) < need <= above(b) +
// hist[b], above(b) = the keys in higher bins; needs 1 <= need <= the histogram's total. Every
// warp sums its kBins / kCompactWarps bins into sums[warp]; one barrier; then each warp on its
// own scans the warp sums and the bins of the chunk that holds the threshold, so all warps get
// the same answer without a second barrier. Called by every thread after a barrier that follows
// the histogram's last update; hist and sums must not change until every warp has returned (the
// callers' next writes to them come after a later barrier).
template <int kBins>
__device__ Digit find_digit_per_warp(const int* hist, int need, int* sums) {
  constexpr int kChunk = kBins / kCompactWarps, kPerLane = kChunk / 32;
  static_assert(kPerLane >= 1 && kChunk % 32 == 0, "whole bins a lane");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) mine += hist[warp * kChunk + lane * kPerLane + j];
  mine = __reduce_add_sync(kFull, mine);
  if (lane == 0) sums[warp] = mine;
  __syncthreads();
  // The chunk that holds the threshold (higher chunks hold larger keys).
  const int c = lane < kCompactWarps ? sums[lane] : 0;
  const int chunk_incl = suffix_sum(c, lane);
  const int chunk_above = chunk_incl - c;
  unsigned hit = __ballot_sync(kFull, lane < kCompactWarps && chunk_above < need && chunk_incl >= need);
  const int w = hit ? __ffs(static_cast<int>(hit)) - 1 : 0;
  const int above = __shfl_sync(kFull, chunk_above, w);
  // The lane of that chunk whose bins hold it, then its bins from high to low.
  int bins[kPerLane];
  int ls = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    bins[j] = hist[w * kChunk + lane * kPerLane + j];
    ls += bins[j];
  }
  const int lane_above = above + suffix_sum(ls, lane) - ls;
  hit = __ballot_sync(kFull, lane_above < need && lane_above + ls >= need);
  const int owner = hit ? __ffs(static_cast<int>(hit)) - 1 : 0;
  Digit d{0u, 0, 0};
  int run = lane_above;
#pragma unroll
  for (int j = kPerLane - 1; j >= 0; --j) {
    if (run < need && run + bins[j] >= need) {
      d.bin = static_cast<uint32_t>(w * kChunk + lane * kPerLane + j);
      d.need = need - run;
      d.count = bins[j];
    }
    run += bins[j];
  }
  d.bin = __shfl_sync(kFull, d.bin, owner);
  d.need = __shfl_sync(kFull, d.need, owner);
  d.count = __shfl_sync(kFull, d.count, owner);
  return d;
}

// Slots for this warp's lanes that set `take_it`, from a shared counter: the slot of this lane
// (meaningful where take_it). All lanes of the warp call it.
__device__ __forceinline__ int warp_slot(bool take_it, int* counter) {
  const int lane = threadIdx.x & 31;
  const unsigned ballot = __ballot_sync(kFull, take_it);
  int first = 0;
  if (lane == 0 && ballot) first = atomicAdd(counter, __popc(ballot));
  first = __shfl_sync(kFull, first, 0);
  return first + __popc(ballot & ((1u << lane) - 1u));
}

__global__ void __launch_bounds__(kCompactThreads) topk_compact_kernel(const IndexerParams p) {
  extern __shared__ uint32_t dyn[];  // candidates: [kCand] keys, [kCand] rows; then [vis] keys
  uint32_t* cand_key = dyn;
  int32_t* cand_idx = reinterpret_cast<int32_t*>(dyn + kCand);
  uint32_t* keys = dyn + 2 * kCand;
  __shared__ int hist_a[4096];  // pass 0 (12 bits), then pass 2 (its first 1024 bins)
  __shared__ int hist_b[1024];  // pass 1
  __shared__ uint32_t sel_key[kCompactMaxK];
  __shared__ int32_t sel_idx[kCompactMaxK];
  __shared__ int sums[3][kCompactWarps];
  __shared__ int ties_of_warp[kCompactWarps];
  __shared__ int s_n_sel, s_n_swept;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t i = blockIdx.x;
  const int64_t t = p.first_query_pos + i;
  const int vis = static_cast<int>(min(p.n_rows, visible_rows(t, p.ratio)));
  const float* sc = p.scores + i * p.scores_stride;
  int32_t* out = p.out + i * p.out_stride;
  const int take = p.k < vis ? p.k : vis;

  for (int b = tid; b < 4096; b += kCompactThreads) hist_a[b] = 0;
  for (int b = tid; b < 1024; b += kCompactThreads) hist_b[b] = 0;
  if (tid == 0) {
    s_n_sel = 0;
    s_n_swept = 0;
  }
  pdl_wait();  // the scores are complete and visible from here on
  for (int j = tid; j < p.k; j += kCompactThreads)  // -1 beyond take; the sort writes [0, take)
    if (j >= take) out[j] = -1;
  if (take == 0) return;  // block-uniform
  __syncthreads();

  // Pass 0: keys into shared memory and the histogram of their top 12 bits. Four scores a load
  // where the row of scores is 16-byte aligned (the usual case: a contiguous [n_q, cap] with cap
  // a multiple of 4), else one; the rest past the last whole four, one a thread.
  auto take_key = [&](int s, float v) {
    const uint32_t key = order_key(v);
    keys[s] = key;
    atomicAdd(&hist_a[key >> 20], 1);
  };
  const bool by_four = (reinterpret_cast<uintptr_t>(sc) & 15u) == 0;  // block-uniform
  const int n4 = by_four ? vis / 4 : 0;
  const float4* sc4 = reinterpret_cast<const float4*>(sc);
  for (int base = 0; base < n4; base += kLoadBatch / 4 * kCompactThreads) {
    float4 v[kLoadBatch / 4];
#pragma unroll
    for (int j = 0; j < kLoadBatch / 4; ++j) {
      const int s = base + j * kCompactThreads + tid;
      v[j] = s < n4 ? sc4[s] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch / 4; ++j) {
      const int s = base + j * kCompactThreads + tid;
      if (s < n4) {
        const uint4 k4 = make_uint4(order_key(v[j].x), order_key(v[j].y), order_key(v[j].z), order_key(v[j].w));
        *reinterpret_cast<uint4*>(keys + 4 * s) = k4;
        atomicAdd(&hist_a[k4.x >> 20], 1);
        atomicAdd(&hist_a[k4.y >> 20], 1);
        atomicAdd(&hist_a[k4.z >> 20], 1);
        atomicAdd(&hist_a[k4.w >> 20], 1);
      }
    }
  }
  for (int base = 4 * n4; base < vis; base += kLoadBatch * kCompactThreads) {
    float v[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int s = base + j * kCompactThreads + tid;
      v[j] = s < vis ? sc[s] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int s = base + j * kCompactThreads + tid;
      if (s < vis) take_key(s, v[j]);
    }
  }
  __syncthreads();
  const Digit d0 = find_digit_per_warp<4096>(hist_a, take, sums[0]);
  const bool cand_mode = d0.count <= kCand;  // the same in every warp

  if (cand_mode) {  // keys of higher bins to the picks, the threshold's bin to the candidates
    // Four keys a thread a step. Most steps of a warp hold none of either (the picks and the
    // candidates are a small share of the keys) and skip the slot work; the others take their
    // slots in one go: each lane's two counts packed in one int (picks low, candidates high:
    // both stay below 2^16, take <= kCompactMaxK and the bin holds <= kCand keys), a warp
    // scan of them and one shared atomic a warp.
    const uint32_t b0 = d0.bin;
    for (int base = 0; base < vis; base += 4 * kCompactThreads) {  // the same trip count for every thread
      const int s4 = base + 4 * tid;
      uint32_t k4[4];
      if (s4 + 3 < vis) {
        const uint4 v = *reinterpret_cast<const uint4*>(keys + s4);
        k4[0] = v.x;
        k4[1] = v.y;
        k4[2] = v.z;
        k4[3] = v.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) k4[e] = s4 + e < vis ? keys[s4 + e] : 0u;
      }
      int counts = 0;  // picks | candidates << 16
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t dg = k4[e] >> 20;
        if (s4 + e < vis) counts += dg > b0 ? 1 : (dg == b0 ? 1 << 16 : 0);
      }
      if (!__any_sync(kFull, counts != 0)) continue;  // warp-uniform
      int incl = counts;  // inclusive scan over the warp's lanes
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
      }
      int first = 0;
      if (lane == 31) first = atomicAdd(&s_n_swept, incl);
      const int at = __shfl_sync(kFull, first, 31) + incl - counts;
      int gs = at & 0xffff, cs = at >> 16;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t dg = k4[e] >> 20;
        if (s4 + e < vis && dg > b0) {
          sel_key[gs] = k4[e];
          sel_idx[gs++] = s4 + e;
        } else if (s4 + e < vis && dg == b0) {
          cand_key[cs] = k4[e];
          cand_idx[cs++] = s4 + e;
        }
      }
    }
    // The final sweep's pick slots follow the picks of the higher bins.
    if (tid == 0) s_n_sel = take - d0.need;
  }
  // Past this barrier every warp is done with pass 0's histogram: hist_a is free for pass 2.
  __syncthreads();

  // Passes 1 (bits 19..10) and 2 (bits 9..0) over the source: the candidates, or all keys.
  const int n_src = cand_mode ? d0.count : vis;
  const uint32_t* src_key = cand_mode ? cand_key : keys;
  uint32_t prefix = d0.bin << 20, mask = 0xfff00000u;
  for (int b = tid; b < 1024; b += kCompactThreads) hist_a[b] = 0;
  for (int j = tid; j < n_src; j += kCompactThreads) {
    const uint32_t key = src_key[j];
    if ((key & mask) == prefix) atomicAdd(&hist_b[(key >> 10) & 1023u], 1);
  }
  __syncthreads();
  const Digit d1 = find_digit_per_warp<1024>(hist_b, d0.need, sums[1]);
  prefix |= d1.bin << 10;
  mask |= 1023u << 10;
  for (int j = tid; j < n_src; j += kCompactThreads) {
    const uint32_t key = src_key[j];
    if ((key & mask) == prefix) atomicAdd(&hist_a[key & 1023u], 1);
  }
  __syncthreads();
  const Digit d2 = find_digit_per_warp<1024>(hist_a, d1.need, sums[2]);
  const uint32_t kth = prefix | d2.bin;          // the take-th largest key
  const int n_ties = d2.need;                    // keys equal to kth to take, of d2.count
  const bool all_ties = n_ties == d2.count;      // then no row order is needed among them

  // The source's keys above the threshold (and equal to it when all of those are taken).
  for (int base = 0; base < n_src; base += kCompactThreads) {  // the same trip count for every thread
    const int j = base + tid;
    const uint32_t key = j < n_src ? src_key[j] : 0u;
    const bool pick = j < n_src && (key > kth || (all_ties && key == kth));
    const int slot = warp_slot(pick, &s_n_sel);
    if (pick && slot < take) {
      sel_key[slot] = key;
      sel_idx[slot] = cand_mode ? cand_idx[j] : j;
    }
  }
  if (!all_ties) {  // the n_ties lowest rows whose key is kth: warp w owns rows [w seg, (w + 1) seg)
    const int seg = ((vis + kCompactWarps - 1) / kCompactWarps + 31) / 32 * 32;
    const int s_begin = min(vis, warp * seg), s_end = min(vis, s_begin + seg);
    int mine = 0;
    for (int s = s_begin + lane; s < s_end; s += 32) mine += keys[s] == kth;
    mine = __reduce_add_sync(kFull, mine);
    if (lane == 0) ties_of_warp[warp] = mine;
    __syncthreads();
    int rank = 0;  // ties in the warps before this one
    for (int w = 0; w < warp; ++w) rank += ties_of_warp[w];
    for (int base = s_begin; base < s_end && rank < n_ties; base += 32) {  // warp-uniform
      const int s = base + lane;
      const bool tie = s < s_end && keys[s] == kth;
      const unsigned ballot = __ballot_sync(kFull, tie);
      const int r = rank + __popc(ballot & ((1u << lane) - 1u));
      if (tie && r < n_ties) {
        sel_key[take - n_ties + r] = kth;
        sel_idx[take - n_ties + r] = s;
      }
      rank += __popc(ballot);
    }
  }
  __syncthreads();
  sort_picks_and_write(sel_key, sel_idx, take, out);
}

}  // namespace

void launch_topk_compact(const IndexerParams& p, int dev, Stream s, bool pdl) {
  const int64_t max_vis = std::min(p.n_rows, p.cap);
  const size_t bytes = static_cast<size_t>(2 * kCand + max_vis) * sizeof(uint32_t);
  // The static shared memory (about 28 KB) counts against the same limit: opt in to the most
  // this kernel ever takes, so a later call with more rows cannot fail at launch.
  smem_opt_in(topk_compact_kernel, static_cast<size_t>(2 * kCand + kCompactMaxRows) * sizeof(uint32_t), dev);
  const dim3 grid(static_cast<unsigned>(p.n_q)), block(kCompactThreads);
  if (pdl) {
    launch_dependent(topk_compact_kernel, grid, block, bytes, native(s), p);
  } else {
    topk_compact_kernel<<<grid, block, bytes, native(s)>>>(p);
  }
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 topk_compact_kernel");
}

}  // namespace kvcore::ops::cuda::dsv4
