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
//    scores drain and waits for them before its first read of scores (or any global write);
//    then lets its own dependent launch (the next layer's cache append, which waits for it).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/dsv4/dsv4_topk.cuh"
#include "cuda/dsv4/dsv4_topk_select.cuh"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::native;

namespace {

using namespace select;

__global__ void __launch_bounds__(kCompactThreads) topk_compact_kernel(const IndexerParams p, bool sort_four) {
  extern __shared__ __align__(16) uint32_t dyn[];  // candidates: [kCand] keys, [kCand] rows; then [vis] keys
  uint32_t* cand_key = dyn;
  int32_t* cand_idx = reinterpret_cast<int32_t*>(dyn + kCand);
  uint32_t* keys = dyn + 2 * kCand;
  __shared__ int hist_a[4096];  // pass 0 (12 bits), then pass 2 (its first 1024 bins)
  __shared__ int hist_b[1024];  // pass 1
  __shared__ __align__(16) uint32_t sel_key[kCompactMaxK];
  __shared__ __align__(16) int32_t sel_idx[kCompactMaxK];
  __shared__ int sums[3][kCompactWarps];
  __shared__ int ties_of_warp[kCompactWarps];
  __shared__ int s_n_sel, s_n_swept;

  const int tid = threadIdx.x;
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
  pdl_allow_dependents();  // a dependent (the next layer's append, in a decode step) waits for this grid before its reads
  for (int j = tid; j < p.k; j += kCompactThreads)  // -1 beyond take; the sort writes [0, take)
    if (j >= take) out[j] = -1;
  if (take == 0) return;  // block-uniform
  __syncthreads();

  load_keys(sc, vis, keys, hist_a);
  __syncthreads();
  const Digit d0 = find_digit_per_warp<4096>(hist_a, take, sums[0]);
  const bool cand_mode = d0.count <= kCand;  // the same in every warp
  if (cand_mode) {  // keys of higher bins to the picks, the threshold's bin to the candidates
    sweep_threshold_bin(
        keys, vis, d0.bin, [&](int total) { return atomicAdd(&s_n_swept, total); },
        [&](bool is_pick, int slot, uint32_t key, int s) {
          (is_pick ? sel_key : cand_key)[slot] = key;
          (is_pick ? sel_idx : cand_idx)[slot] = s;
        });
    if (tid == 0) s_n_sel = take - d0.need;  // the final sweep's pick slots follow these
  }
  __syncthreads();  // past it every warp is done with pass 0's histogram: hist_a is free for pass 2
  const SelectSmem m{keys, cand_key, cand_idx, hist_a, hist_b, sel_key, sel_idx, sums, ties_of_warp, &s_n_sel};
  finish_selection(m, d0, cand_mode, vis, take, out, sort_four);
}

}  // namespace

void launch_topk_compact(const IndexerParams& p, int dev, Stream s, bool pdl, bool sort_four) {
  const int64_t max_vis = std::min(p.n_rows, p.cap);
  const size_t bytes = static_cast<size_t>(2 * kCand + max_vis) * sizeof(uint32_t);
  // The static shared memory (about 28 KB) counts against the same limit: opt in to the most
  // this kernel ever takes, so a later call with more rows cannot fail at launch.
  smem_opt_in(topk_compact_kernel, static_cast<size_t>(2 * kCand + kCompactMaxRows) * sizeof(uint32_t), dev);
  launch_with(topk_compact_kernel, dim3(static_cast<unsigned>(p.n_q)), dim3(kCompactThreads), bytes, native(s), 1, pdl, p, sort_four);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 topk_compact_kernel");
}

}  // namespace kvcore::ops::cuda::dsv4
