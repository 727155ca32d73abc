// The indexer top-k's shared pieces: the order both kernels select by and the bitonic sort
// that puts their picks in it. The order is the CPU's: score descending, then row ascending,
// so identical scores give identical picks whichever kernel runs. Keys are order-preserving
// u32s of the scores (-0 counts as +0, as the CPU's comparison does; every NaN counts as one
// value above +inf, as on the CPU).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device.hpp"
#include "kvcore/stream.hpp"
#include "ops/dsv4_params.hpp"

namespace kvcore::ops::cuda::dsv4 {

using ::kvcore::dsv4::IndexerParams;
using ::kvcore::dsv4::visible_rows;

// Larger float -> larger key; -0 counts as +0 (the CPU compares them equal); every NaN is one
// key above +inf's (the CPU's rule for NaN scores).
__device__ __forceinline__ uint32_t order_key(float f) {
  if (f != f) return 0xffffffffu;
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (key a, row a) before (key b, row b): key descending, row ascending.
__device__ __forceinline__ bool comes_first(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// The most picks the compact and cluster top-k kernels take (their pick arrays' length).
constexpr int kCompactMaxK = 1024;

// One bitonic compare-exchange for the element at index e holding (k, i) against (ok, oi).
__device__ __forceinline__ void bitonic_keep(uint32_t& k, int32_t& i, uint32_t ok, int32_t oi, int e, int size, int stride) {
  const bool up = (e & size) == 0, lower = (e & stride) == 0;
  if (comes_first(k, i, ok, oi) != (up == lower)) {
    k = ok;
    i = oi;
  }
}

// A pick (key, row) as one u64 whose descending order is the picks' order: key descending, then
// row ascending (~row grows as row falls). Rows are >= 0, so the padding (key 0, row INT_MAX)
// sorts after every real pick (real keys are >= order_key(-inf) > 0).
__device__ __forceinline__ uint64_t pick_order(uint32_t key, int32_t row) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~row);
}

// The bitonic sort of sort_picks_and_write with one pick a thread (kSort = n_sort <=
// blockDim.x), unrolled (the stage masks are constants): each compare-exchange is a max or a min
// of two u64s, without branches; strides < 32 by shuffles, larger ones through shared memory,
// alternating between two halves of sel_key / sel_idx (the pick's high and low words) so that one
// barrier a stage suffices.
template <int kSort>
__device__ inline void sort_one_a_thread(uint32_t* sel_key, int32_t* sel_idx, int take, int32_t* out) {
  const int e = threadIdx.x;
  const bool active = e < kSort;  // whole warps: kSort is a multiple of 64
  uint64_t c = e < take ? pick_order(sel_key[e], sel_idx[e]) : pick_order(0u, 0x7fffffff);
  __syncthreads();  // every pick read before the first exchange overwrites them
  int half = 0;     // which half of the arrays the next exchange through shared memory writes
#pragma unroll
  for (int size = 2; size <= kSort; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      uint64_t o = c;
      if (stride < 32) {
        o = __shfl_xor_sync(0xffffffffu, c, stride);
      } else {
        uint32_t* hi = sel_key + half * kSort;
        uint32_t* lo = reinterpret_cast<uint32_t*>(sel_idx) + half * kSort;
        if (active) {
          hi[e] = static_cast<uint32_t>(c >> 32);
          lo[e] = static_cast<uint32_t>(c);
        }
        __syncthreads();  // the other half was last read before this barrier: next stage may write it
        if (active) o = (static_cast<uint64_t>(hi[e ^ stride]) << 32) | lo[e ^ stride];
        half ^= 1;
      }
      const bool keep_larger = ((e & size) == 0) == ((e & stride) == 0);
      c = keep_larger ? (o > c ? o : c) : (o < c ? o : c);
    }
  }
  if (e < take) out[e] = static_cast<int32_t>(~static_cast<uint32_t>(c));
}

// The bitonic sort of sort_picks_and_write with four consecutive picks a thread (kSort / 4
// threads; kSort >= 128, so whole warps): the stages of strides 1 and 2 within a thread's
// registers, strides 4-64 by shuffles (the partner is stride / 4 lanes away), 128 and up through
// shared memory (16-byte accesses: sel_key and sel_idx 16-byte aligned, kCompactMaxK elements
// each). A shared stage writes one half of the arrays and reads it after one barrier, the next
// one the other half, where two kSort fit (kSort <= 512); at kSort = 1024 every shared stage
// takes a second barrier instead. Fewer warps and barriers than one pick a thread, and no
// shuffles for the two smallest strides.
template <int kSort>
__device__ inline void sort_four_a_thread(uint32_t* sel_key, int32_t* sel_idx, int take, int32_t* out) {
  constexpr int kThreads = kSort / 4;
  constexpr bool kHalves = 2 * kSort <= kCompactMaxK;
  static_assert(kSort >= 128 && kSort <= kCompactMaxK, "whole warps, at most kCompactMaxK picks");
  const int t = threadIdx.x;
  const bool active = t < kThreads;  // warp-uniform
  const uint64_t pad = pick_order(0u, 0x7fffffff);
  uint64_t c[4] = {pad, pad, pad, pad};
  if (active) {
    const uint4 k4 = reinterpret_cast<const uint4*>(sel_key)[t];
    const uint4 i4 = reinterpret_cast<const uint4*>(sel_idx)[t];
    const uint32_t ks[4] = {k4.x, k4.y, k4.z, k4.w}, is[4] = {i4.x, i4.y, i4.z, i4.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * t + j < take) c[j] = pick_order(ks[j], static_cast<int32_t>(is[j]));
  }
  __syncthreads();  // every pick read before the first shared stage overwrites them
  int half = 0;
#pragma unroll
  for (int size = 2; size <= kSort; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride < 4) {  // pairs (j, j + stride) of this thread's picks
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (j & stride) continue;
          const bool up = ((4 * t + j) & size) == 0;  // the lower element keeps the larger
          const uint64_t a = c[j], b = c[j | stride];
          const uint64_t larger = a > b ? a : b, smaller = a > b ? b : a;
          c[j] = up ? larger : smaller;
          c[j | stride] = up ? smaller : larger;
        }
        continue;
      }
      uint64_t o[4] = {c[0], c[1], c[2], c[3]};
      if (stride < 128) {
        if (active) {
#pragma unroll
          for (int j = 0; j < 4; ++j) o[j] = __shfl_xor_sync(0xffffffffu, c[j], stride >> 2);
        }
      } else {
        uint4* hi = reinterpret_cast<uint4*>(sel_key + half * kSort);
        uint4* lo = reinterpret_cast<uint4*>(sel_idx + half * kSort);
        if (active) {
          hi[t] = make_uint4(static_cast<uint32_t>(c[0] >> 32), static_cast<uint32_t>(c[1] >> 32),
                             static_cast<uint32_t>(c[2] >> 32), static_cast<uint32_t>(c[3] >> 32));
          lo[t] = make_uint4(static_cast<uint32_t>(c[0]), static_cast<uint32_t>(c[1]), static_cast<uint32_t>(c[2]),
                             static_cast<uint32_t>(c[3]));
        }
        __syncthreads();
        if (active) {
          const int other = t ^ (stride >> 2);  // the thread holding the partners of this one's picks
          const uint4 h = hi[other], l = lo[other];
          o[0] = (static_cast<uint64_t>(h.x) << 32) | l.x;
          o[1] = (static_cast<uint64_t>(h.y) << 32) | l.y;
          o[2] = (static_cast<uint64_t>(h.z) << 32) | l.z;
          o[3] = (static_cast<uint64_t>(h.w) << 32) | l.w;
        }
        if (kHalves) {
          half ^= 1;  // the next shared stage writes the other half: this one's reads need no barrier
        } else {
          __syncthreads();  // every read of this stage before the next one's writes
        }
      }
      const bool keep_larger = (((4 * t) & size) == 0) == (((4 * t) & stride) == 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) c[j] = keep_larger ? (o[j] > c[j] ? o[j] : c[j]) : (o[j] < c[j] ? o[j] : c[j]);
    }
  }
  if (active) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * t + j < take) out[4 * t + j] = static_cast<int32_t>(~static_cast<uint32_t>(c[j]));
  }
}

// Sorts the `take` picks in sel_key / sel_idx (key descending, row ascending) and writes their
// rows to out[0, take). n_sort, the sort's padded size, is the next power of two >= max(take,
// 64); sel_key and sel_idx must hold 2 n_sort elements. With `four` (the compact and cluster
// kernels' choice: arrays of kCompactMaxK, 16-byte aligned), four consecutive picks a thread
// from 128 picks up (sort_four_a_thread). Otherwise one pick a thread where n_sort <=
// blockDim.x (sort_one_a_thread), else two consecutive picks a thread (needs 2 * blockDim.x >=
// take): strides <= 32 by shuffles, larger ones through shared memory. Called by every thread of
// the block after a barrier that follows the last write of the picks; `four` is block-uniform.
__device__ inline void sort_picks_and_write(uint32_t* sel_key, int32_t* sel_idx, int take, int32_t* out, bool four = false) {
  const int tid = threadIdx.x;
  int n_sort = 64;  // whole warps
  while (n_sort < take) n_sort <<= 1;
  if (four && n_sort / 4 <= static_cast<int>(blockDim.x)) {  // block-uniform
    switch (n_sort) {
      case 128: return sort_four_a_thread<128>(sel_key, sel_idx, take, out);
      case 256: return sort_four_a_thread<256>(sel_key, sel_idx, take, out);
      case 512: return sort_four_a_thread<512>(sel_key, sel_idx, take, out);
      case 1024: return sort_four_a_thread<1024>(sel_key, sel_idx, take, out);
      default: break;  // 64 picks (or more than kCompactMaxK): as without `four`
    }
  }
  if (n_sort <= static_cast<int>(blockDim.x)) {  // block-uniform
    switch (n_sort) {
      case 64: return sort_one_a_thread<64>(sel_key, sel_idx, take, out);
      case 128: return sort_one_a_thread<128>(sel_key, sel_idx, take, out);
      case 256: return sort_one_a_thread<256>(sel_key, sel_idx, take, out);
      case 512: return sort_one_a_thread<512>(sel_key, sel_idx, take, out);
      case 1024: return sort_one_a_thread<1024>(sel_key, sel_idx, take, out);
      default: break;  // wider blocks than the kernels launch: the two-a-thread sort below
    }
  }
  const bool active = tid < n_sort / 2;
  const int e0 = 2 * tid, e1 = e0 + 1;
  uint32_t k0 = 0, k1 = 0;
  int32_t i0 = 0x7fffffff, i1 = 0x7fffffff;  // padding sorts last
  if (active) {
    if (e0 < take) {
      k0 = sel_key[e0];
      i0 = sel_idx[e0];
    }
    if (e1 < take) {
      k1 = sel_key[e1];
      i1 = sel_idx[e1];
    }
  }
  __syncthreads();
  for (int size = 2; size <= n_sort; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride == 1) {
        if (active && comes_first(k0, i0, k1, i1) != ((e0 & size) == 0)) {
          const uint32_t tk = k0;
          k0 = k1;
          k1 = tk;
          const int32_t ti = i0;
          i0 = i1;
          i1 = ti;
        }
      } else if (stride <= 32) {
        if (active) {  // whole warps: n_sort / 2 is a multiple of 32
          const int m = stride >> 1;
          const uint32_t ok0 = __shfl_xor_sync(0xffffffffu, k0, m), ok1 = __shfl_xor_sync(0xffffffffu, k1, m);
          const int32_t oi0 = __shfl_xor_sync(0xffffffffu, i0, m), oi1 = __shfl_xor_sync(0xffffffffu, i1, m);
          bitonic_keep(k0, i0, ok0, oi0, e0, size, stride);
          bitonic_keep(k1, i1, ok1, oi1, e1, size, stride);
        }
      } else {
        if (active) {
          sel_key[e0] = k0;
          sel_idx[e0] = i0;
          sel_key[e1] = k1;
          sel_idx[e1] = i1;
        }
        __syncthreads();
        if (active) {
          const uint32_t ok0 = sel_key[e0 ^ stride], ok1 = sel_key[e1 ^ stride];
          const int32_t oi0 = sel_idx[e0 ^ stride], oi1 = sel_idx[e1 ^ stride];
          bitonic_keep(k0, i0, ok0, oi0, e0, size, stride);
          bitonic_keep(k1, i1, ok1, oi1, e1, size, stride);
        }
        __syncthreads();
      }
    }
  }
  if (active) {
    if (e0 < take) out[e0] = i0;
    if (e1 < take) out[e1] = i1;
  }
}

// The compact top-k (dsv4_topk_compact.cu): one 512-thread CTA a query, every visible key in
// shared memory. Serves k <= kCompactMaxK and at most kCompactMaxRows visible rows.
constexpr int64_t kCompactMaxRows = 32768;
inline bool topk_compact_serves(const IndexerParams& p) {
  const int64_t max_vis = p.n_rows < p.cap ? p.n_rows : p.cap;
  return p.k <= kCompactMaxK && max_vis <= kCompactMaxRows;
}
// Launches it (as a programmatic dependent of the stream's previous kernel when pdl; sorting
// four picks a thread when sort_four).
void launch_topk_compact(const IndexerParams& p, int dev, Stream s, bool pdl, bool sort_four);

// The cluster top-k (dsv4_topk_cluster.cu): the compact kernel's selection with each query's rows
// spread over a cluster of 8 CTAs. Serves what the compact kernel serves, on devices of compute
// capability 9.0+ (and code built for them).
bool topk_cluster_serves(const IndexerParams& p, int dev);
// Where the automatic choice takes it over the compact kernel: rows enough that an eighth of them
// outweighs the cluster's exchanges, and queries few enough that their clusters fit in one wave
// (decode steps at long contexts).
constexpr int64_t kClusterMinRows = 8192;
bool topk_cluster_pays(const IndexerParams& p, int dev);
// Launches it (as launch_topk_compact does).
void launch_topk_cluster(const IndexerParams& p, int dev, Stream s, bool pdl, bool sort_four);

// The fused scores + top-k (dsv4_topk_cluster.cu): the cluster top-k computing its rows' scores
// itself with the tensor-core scorer's arithmetic (identical scores, written out too), one
// launch instead of two and no round trip of the scores through memory. Serves where both the
// tensor-core scorer and the cluster top-k serve, for at most 64 query heads.
bool indexer_fused_serves(const IndexerParams& p, int dev);
// Launches it (as a programmatic dependent of the stream's previous kernel when pdl).
void launch_indexer_fused(const IndexerParams& p, int dev, Stream s, bool pdl, bool sort_four);

}  // namespace kvcore::ops::cuda::dsv4
