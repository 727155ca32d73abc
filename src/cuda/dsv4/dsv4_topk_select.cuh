// The radix selection shared by the compact top-k kernels of the DeepSeek-V4 indexer (one CTA a
// query: dsv4_topk_compact.cu; one cluster of CTAs a query: dsv4_topk_cluster.cu), both 512
// threads a CTA with the query's keys in shared memory: the first pass's keys and histogram
// (load_keys), the digit of a pass (find_digit_per_warp), the sweep that splits the keys around
// the first pass's threshold bin (sweep_threshold_bin), and the rest of the selection once the
// keys of that bin, or all keys, are in one CTA (finish_selection).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dsv4/dsv4_topk.cuh"

namespace kvcore::ops::cuda::dsv4::select {

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


// Pass 0 over scores sc[0, n): their keys into keys[0, n) and the histogram of the keys' top 12
// bits into hist (4096 bins, zeroed by the caller). Four scores a load where sc is 16-byte
// aligned (the usual case: a contiguous [n_q, cap] with cap a multiple of 4), else one; the rest
// past the last whole four, one a thread. Every thread calls it; keys must be 16-byte aligned.
__device__ __forceinline__ void load_keys(const float* sc, int n, uint32_t* keys, int* hist) {
  const int tid = threadIdx.x;
  const bool by_four = (reinterpret_cast<uintptr_t>(sc) & 15u) == 0;  // block-uniform
  const int n4 = by_four ? n / 4 : 0;
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
        atomicAdd(&hist[k4.x >> 20], 1);
        atomicAdd(&hist[k4.y >> 20], 1);
        atomicAdd(&hist[k4.z >> 20], 1);
        atomicAdd(&hist[k4.w >> 20], 1);
      }
    }
  }
  for (int base = 4 * n4; base < n; base += kLoadBatch * kCompactThreads) {
    float v[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int s = base + j * kCompactThreads + tid;
      v[j] = s < n ? sc[s] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int s = base + j * kCompactThreads + tid;
      if (s < n) {
        const uint32_t key = order_key(v[j]);
        keys[s] = key;
        atomicAdd(&hist[key >> 20], 1);
      }
    }
  }
}

// The sweep of keys[0, n) (16-byte aligned) around the first pass's threshold bin b0: the keys of
// higher bins are picks, those of bin b0 candidates. Four keys a thread a step. Most steps of a
// warp hold none of either (they are a small share of the keys) and skip the slot work; the
// others take their slots in one go: each lane's two counts packed in one int (picks low,
// candidates high: both stay below 2^16 where take <= kCompactMaxK and the bin holds <= kCand
// keys), a warp scan of them, and one reservation a warp: reserve(total) returns the packed
// counts taken before (an atomicAdd on a packed counter). place(is_pick, slot, key, s) then
// stores each. Every thread calls it.
template <class Reserve, class Place>
__device__ __forceinline__ void sweep_threshold_bin(const uint32_t* keys, int n, uint32_t b0, Reserve&& reserve,
                                                    Place&& place) {
  const int tid = threadIdx.x, lane = tid & 31;
  for (int base = 0; base < n; base += 4 * kCompactThreads) {  // the same trip count for every thread
    const int s4 = base + 4 * tid;
    uint32_t k4[4];
    if (s4 + 3 < n) {
      const uint4 v = *reinterpret_cast<const uint4*>(keys + s4);
      k4[0] = v.x;
      k4[1] = v.y;
      k4[2] = v.z;
      k4[3] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) k4[e] = s4 + e < n ? keys[s4 + e] : 0u;
    }
    int counts = 0;  // picks | candidates << 16
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t dg = k4[e] >> 20;
      if (s4 + e < n) counts += dg > b0 ? 1 : (dg == b0 ? 1 << 16 : 0);
    }
    if (!__any_sync(kFull, counts != 0)) continue;  // warp-uniform
    int incl = counts;  // inclusive scan over the warp's lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += t;
    }
    int first = 0;
    if (lane == 31) first = reserve(incl);
    const int at = __shfl_sync(kFull, first, 31) + incl - counts;
    int gs = at & 0xffff, cs = at >> 16;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t dg = k4[e] >> 20;
      if (s4 + e < n && dg > b0) {
        place(true, gs++, k4[e], s4 + e);
      } else if (s4 + e < n && dg == b0) {
        place(false, cs++, k4[e], s4 + e);
      }
    }
  }
}

// What finish_selection works in: one CTA's shared memory.
struct SelectSmem {
  const uint32_t* keys;      // [vis]: every visible key
  const uint32_t* cand_key;  // [kCand]: the candidates (keys of the first pass's threshold bin)
  const int32_t* cand_idx;   // [kCand]: their rows
  int* hist_a;               // >= 1024 bins: pass 2 (cleared here)
  int* hist_b;               // 1024 bins, zero on entry: pass 1
  uint32_t* sel_key;         // [kCompactMaxK], 16-byte aligned: the picks (as sort_picks_and_write takes them)
  int32_t* sel_idx;
  int (*sums)[kCompactWarps];  // [3]: per-warp bin sums of passes 0, 1, 2
  int* ties_of_warp;           // [kCompactWarps]
  int* n_sel;                  // picks placed so far
};

// The selection after the first pass, in one CTA: passes 1 (bits 19..10) and 2 (bits 9..0) over
// the source (the candidates when cand_mode, else all keys), then the picks above the threshold,
// then the keys equal to it (all at once when every one of them is needed, else the lowest rows
// among them by an ordered sweep over all keys: the CPU's tie rule), then the sort, which writes
// out[0, take) (four picks a thread where sort_four). On entry: sel holds *n_sel picks (the keys
// of higher bins, in cand_mode), and a barrier follows every write of what m holds. Every thread
// calls it.
__device__ inline void finish_selection(const SelectSmem& m, Digit d0, bool cand_mode, int vis, int take, int32_t* out,
                                        bool sort_four) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_src = cand_mode ? d0.count : vis;
  const uint32_t* src_key = cand_mode ? m.cand_key : m.keys;
  uint32_t prefix = d0.bin << 20, mask = 0xfff00000u;
  for (int b = tid; b < 1024; b += kCompactThreads) m.hist_a[b] = 0;
  for (int j = tid; j < n_src; j += kCompactThreads) {
    const uint32_t key = src_key[j];
    if ((key & mask) == prefix) atomicAdd(&m.hist_b[(key >> 10) & 1023u], 1);
  }
  __syncthreads();
  const Digit d1 = find_digit_per_warp<1024>(m.hist_b, d0.need, m.sums[1]);
  prefix |= d1.bin << 10;
  mask |= 1023u << 10;
  for (int j = tid; j < n_src; j += kCompactThreads) {
    const uint32_t key = src_key[j];
    if ((key & mask) == prefix) atomicAdd(&m.hist_a[key & 1023u], 1);
  }
  __syncthreads();
  const Digit d2 = find_digit_per_warp<1024>(m.hist_a, d1.need, m.sums[2]);
  const uint32_t kth = prefix | d2.bin;          // the take-th largest key
  const int n_ties = d2.need;                    // keys equal to kth to take, of d2.count
  const bool all_ties = n_ties == d2.count;      // then no row order is needed among them

  // The source's keys above the threshold (and equal to it when all of those are taken).
  for (int base = 0; base < n_src; base += kCompactThreads) {  // the same trip count for every thread
    const int j = base + tid;
    const uint32_t key = j < n_src ? src_key[j] : 0u;
    const bool pick = j < n_src && (key > kth || (all_ties && key == kth));
    const int slot = warp_slot(pick, m.n_sel);
    if (pick && slot < take) {
      m.sel_key[slot] = key;
      m.sel_idx[slot] = cand_mode ? m.cand_idx[j] : j;
    }
  }
  if (!all_ties) {  // the n_ties lowest rows whose key is kth: warp w owns rows [w seg, (w + 1) seg)
    const int seg = ((vis + kCompactWarps - 1) / kCompactWarps + 31) / 32 * 32;
    const int s_begin = min(vis, warp * seg), s_end = min(vis, s_begin + seg);
    int mine = 0;
    for (int s = s_begin + lane; s < s_end; s += 32) mine += m.keys[s] == kth;
    mine = __reduce_add_sync(kFull, mine);
    if (lane == 0) m.ties_of_warp[warp] = mine;
    __syncthreads();
    int rank = 0;  // ties in the warps before this one
    for (int w = 0; w < warp; ++w) rank += m.ties_of_warp[w];
    for (int base = s_begin; base < s_end && rank < n_ties; base += 32) {  // warp-uniform
      const int s = base + lane;
      const bool tie = s < s_end && m.keys[s] == kth;
      const unsigned ballot = __ballot_sync(kFull, tie);
      const int r = rank + __popc(ballot & ((1u << lane) - 1u));
      if (tie && r < n_ties) {
        m.sel_key[take - n_ties + r] = kth;
        m.sel_idx[take - n_ties + r] = s;
      }
      rank += __popc(ballot);
    }
  }
  __syncthreads();
  sort_picks_and_write(m.sel_key, m.sel_idx, take, out, sort_four);
}

}  // namespace kvcore::ops::cuda::dsv4::select
