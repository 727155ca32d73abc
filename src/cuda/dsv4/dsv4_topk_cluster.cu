// The cluster top-k of the DeepSeek-V4 indexer: the compact top-k (dsv4_topk_compact.cu) with the
// work that grows with the rows spread over a thread-block cluster of 8 CTAs a query (compute
// capability 9.0+), for decode steps at long contexts, where one CTA's pass over every key is
// most of the top-k's time. The same picks, in the same order.
//  - CTA r takes an eighth of the visible rows (whole fours): its keys into its shared memory
//    and their first-pass histogram (load_keys), and sends the keys to the leader (rank 0), which
//    gathers every key as the compact kernel holds them.
//  - The histograms are summed across the cluster in two exchanges: each CTA sends the 512 bins
//    of slice s of its histogram to CTA s, which sums the 8 copies and sends the sums to every
//    CTA. Every CTA then finds the first pass's threshold bin itself.
//  - In the usual case (at most kCand keys in that bin) every CTA sweeps its own keys
//    (sweep_threshold_bin) and sends its picks and candidates to the leader, taking slots from a
//    counter in the leader's shared memory by one cluster atomic a warp step.
//  - The leader waits for every byte it expects (the keys, then the picks and candidates, whose
//    number the summed histogram gives) and finishes alone, as the compact kernel does
//    (finish_selection). The other CTAs are done after their sends.
// Every transfer is an asynchronous store counted on the receiver's mbarrier (cluster.cuh), so no
// CTA waits for more than its own inputs, and no cluster barrier orders memory.
// The same kernel with kScore is the fused scores + top-k: each CTA computes its rows' scores on
// tensor cores instead of loading them (topk_cluster_kernel's comment).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/cluster.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/dsv4/dsv4_scores_mma.cuh"
#include "cuda/dsv4/dsv4_scores_mma.hpp"
#include "cuda/dsv4/dsv4_topk.cuh"
#include "cuda/dsv4/dsv4_topk_select.cuh"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::native;

namespace {

using namespace select;

constexpr int kCluster = 8;
constexpr int kSlice = 4096 / kCluster;  // histogram bins each CTA sums
static_assert(kSlice == kCompactThreads, "one bin of a slice a thread");

// Dynamic shared memory, in 32-bit words, for up to max_vis visible rows: the histogram slices
// received, the summed histogram, the candidates (keys, rows), the keys.
constexpr size_t dyn_words(int64_t max_vis) { return static_cast<size_t>(kCluster * kSlice + 4096 + 2 * kCand + max_vis); }

// The fused kernel's query and weights live in the candidate arrays: the model's 64 heads at most.
constexpr int kFusedMaxHeads = 64;
static_assert(kFusedMaxHeads * scores_mma::kQLd * 2 + kFusedMaxHeads * 4 <= 2 * kCand * 4, "query and weights over the candidates");

#if KVCORE_CLUSTER_PTX
// The rows of CTA `rank`: [lo, lo + n) of vis, in whole fours (16-byte aligned keys and scores).
struct Chunk {
  int lo, n;
};
__device__ __forceinline__ Chunk chunk_of(int vis, int rank) {
  const int per = ((vis + kCluster - 1) / kCluster + 3) / 4 * 4;
  const int lo = min(vis, rank * per);
  return {lo, min(vis, lo + per) - lo};
}
#endif

// kScore: the fused scores + top-k, which computes its rows' scores (scores_mma.cuh, the
// tensor-core scorer's arithmetic: the same bits) where the top-k loads them. The cluster's 128
// warps transform the query once (each CTA holds it in its candidate arrays, unused until every
// CTA has scored: a candidate arrives only after the histogram exchanges, which wait for every
// CTA's scores), and each CTA scores its own rows, 256 a pass (16 rows a warp), writing the scores
// out and their keys and first-pass histogram where load_keys would.
template <bool kScore>
__global__ void __launch_bounds__(kCompactThreads) topk_cluster_kernel(const IndexerParams p, bool sort_four) {
#if KVCORE_CLUSTER_PTX
  extern __shared__ __align__(16) uint32_t dyn[];  // the layout of dyn_words()
  int(*slices)[kSlice] = reinterpret_cast<int(*)[kSlice]>(dyn);  // [kCluster]: this CTA's slice of every CTA's histogram
  int* hist = reinterpret_cast<int*>(dyn + kCluster * kSlice);     // [4096]: the cluster's first-pass histogram
  uint32_t* cand_key = dyn + kCluster * kSlice + 4096;              // [kCand]
  int32_t* cand_idx = reinterpret_cast<int32_t*>(cand_key + kCand);  // [kCand]
  uint32_t* keys = cand_key + 2 * kCand;  // the leader: every visible key; the others: their own
  // kScore: the query [hp, kQLd] bf16 and the heads' weights [hp], over the candidates
  __nv_bfloat16* qb = reinterpret_cast<__nv_bfloat16*>(cand_key);
  float* ws = reinterpret_cast<float*>(qb + kFusedMaxHeads * scores_mma::kQLd);
  __shared__ int hist_a[4096];            // this CTA's first pass, then pass 2 (the leader)
  __shared__ int hist_b[1024];            // pass 1 (the leader)
  __shared__ __align__(16) uint32_t sel_key[kCompactMaxK];
  __shared__ __align__(16) int32_t sel_idx[kCompactMaxK];
  __shared__ int sums[3][kCompactWarps];
  __shared__ int ties_of_warp[kCompactWarps];
  __shared__ int s_n_sel, s_n_swept;
  __shared__ __align__(8) uint64_t bars[4];
  const ClusterInbox slices_in(&bars[0]), hist_in(&bars[1]), leader_in(&bars[2]), query_in(&bars[3]);

  const int tid = threadIdx.x, rank = cluster_rank();
  const bool leader = rank == 0;
  const int32_t i = blockIdx.x / kCluster;
  const int64_t t = p.first_query_pos + i;
  const int vis = static_cast<int>(min(p.n_rows, visible_rows(t, p.ratio)));
  float* sc = p.scores + i * p.scores_stride;
  int32_t* out = p.out + i * p.out_stride;
  const int take = p.k < vis ? p.k : vis;
  const Chunk mine = chunk_of(vis, rank);
  const int hp = scores_mma::padded_heads(p.n_heads);

  for (int b = tid; b < 4096; b += kCompactThreads) hist_a[b] = 0;
  for (int b = tid; b < 1024; b += kCompactThreads) hist_b[b] = 0;
  if (tid == 0) {
    s_n_sel = 0;
    s_n_swept = 0;  // other CTAs add to the leader's only after they received its histogram sums
    slices_in.init();
    hist_in.init();
    leader_in.init();
    slices_in.expect(kCluster * kSlice * sizeof(int));
    hist_in.expect(4096 * sizeof(int));
    if constexpr (kScore) {
      query_in.init();
      query_in.expect(static_cast<uint32_t>(hp * scores_mma::kDim * sizeof(__nv_bfloat16)));
    }
  }
  cluster_arrive_relaxed();  // its wait comes before the first send
  pdl_wait();                // the scores (kScore: the rows, query, weights) are complete and visible from here on
  pdl_allow_dependents();    // a dependent (the next layer's append) waits for this grid before its reads
  if (leader) {
    for (int j = tid; j < p.k; j += kCompactThreads)  // -1 beyond take; the sort writes [0, take)
      if (j >= take) out[j] = -1;
  }
  if constexpr (kScore) {
    using namespace scores_mma;
    for (int64_t s = vis + rank * kCompactThreads + tid; s < p.cap; s += kCluster * kCompactThreads) sc[s] = -INFINITY;
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    constexpr int kPassRows = 16 * kCompactWarps;
    RowWords ra, rb;  // this lane's rows g and g + 8 of its warp's 16 in a pass
    auto load_rows = [&](int base) {
      const int a = base + warp * 16 + g, b = a + 8;
      load_row(p, mine.lo + a, a < mine.n, ra);
      load_row(p, mine.lo + b, b < mine.n, rb);
    };
    load_rows(0);  // in flight during the query transform
    cluster_wait();
    if (take == 0) return;  // the same in every CTA of the cluster: nobody sends anything
    const float* w = p.weights + i * p.w_stride;
    for (int h = tid; h < hp; h += kCompactThreads) ws[h] = h < p.n_heads ? w[h] : 0.0f;  // padding heads: q 0, w 0
    transform_query<kCompactWarps, kCluster>(p, i, hp, qb, query_in);  // ends after a barrier
    auto put = [&](int r, float v) {  // row mine.lo + r's score: out, and its key where load_keys puts it
      sc[mine.lo + r] = v;
      const uint32_t key = order_key(v);
      keys[r] = key;
      atomicAdd(&hist_a[key >> 20], 1);
    };
    for (int s0 = 0; s0 < mine.n; s0 += kPassRows) {  // block-uniform
      uint32_t a[kSteps][4];
      row_fragments(ra, rb, tq, a);
      if (s0 + kPassRows < mine.n) load_rows(s0 + kPassRows);  // the next pass's rows, in flight during this one's math
      const float2 total = score_fragments(a, qb, ws, hp, g, tq);
      if (tq == 0) {
        const int r = s0 + warp * 16 + g;
        if (r < mine.n) put(r, total.x);
        if (r + 8 < mine.n) put(r + 8, total.y);
      }
    }
  } else {
    cluster_wait();
    if (take == 0) return;  // the same in every CTA of the cluster: nobody sends anything
    load_keys(sc + mine.lo, mine.n, keys, hist_a);
  }
  __syncthreads();
  for (int s = 0; s < kCluster; ++s) slices_in.send(&slices[rank][tid], s, static_cast<uint32_t>(hist_a[s * kSlice + tid]));
  if (!leader) {  // the keys to the leader's keys[lo, lo + n): fours, then the rest
    const int n4 = mine.n / 4;
    for (int j = tid; j < n4; j += kCompactThreads)
      leader_in.send(keys + mine.lo + 4 * j, 0, *reinterpret_cast<const uint4*>(keys + 4 * j));
    for (int j = 4 * n4 + tid; j < mine.n; j += kCompactThreads) leader_in.send(keys + mine.lo + j, 0, keys[j]);
  }
  slices_in.wait();
  int sum = 0;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) sum += slices[r][tid];
  for (int r = 0; r < kCluster; ++r) hist_in.send(&hist[rank * kSlice + tid], r, static_cast<uint32_t>(sum));
  hist_in.wait();

  const Digit d0 = find_digit_per_warp<4096>(hist, take, sums[0]);
  const bool cand_mode = d0.count <= kCand;  // the same in every warp of every CTA
  const int higher = take - d0.need;         // keys in bins above the threshold's: all picks
  if (leader && tid == 0)
    leader_in.expect(static_cast<uint32_t>((vis - mine.n) * sizeof(uint32_t) + (cand_mode ? (higher + d0.count) * 8 : 0)));
  if (cand_mode) {
    sweep_threshold_bin(
        keys, mine.n, d0.bin, [&](int total) { return cluster_atomic_add(&s_n_swept, 0, total); },
        [&](bool is_pick, int slot, uint32_t key, int s) {
          leader_in.send((is_pick ? sel_key : cand_key) + slot, 0, key);
          leader_in.send((is_pick ? sel_idx : cand_idx) + slot, 0, static_cast<uint32_t>(mine.lo + s));
        });
  }
  if (!leader) return;  // the leader's shared memory is the only one read from here on
  leader_in.wait();
  if (tid == 0 && cand_mode) s_n_sel = higher;  // the final sweep's pick slots follow these
  __syncthreads();  // past it every warp is done with pass 0's histograms: hist_a is free for pass 2
  const SelectSmem m{keys, cand_key, cand_idx, hist_a, hist_b, sel_key, sel_idx, sums, ties_of_warp, &s_n_sel};
  finish_selection(m, d0, cand_mode, vis, take, out, sort_four);
#endif
}

// Whether the kernel's code for `dev` is the cluster code (built for sm_90+, not a JIT of an
// older target's PTX, which compiles the body out) and fits its shared memory: once per device
// and kernel.
template <bool kScore>
bool cluster_kernel_fits(int dev) {
  static std::array<std::atomic<int>, 64> known{};  // 0 unknown, 1 yes, 2 no
  std::atomic<int>* slot = dev >= 0 && dev < static_cast<int>(known.size()) ? &known[static_cast<size_t>(dev)] : nullptr;
  if (slot && slot->load(std::memory_order_acquire) != 0) return slot->load(std::memory_order_relaxed) == 1;
  cudaFuncAttributes a{};
  KVCORE_CUDA_CHECK(cudaFuncGetAttributes(&a, topk_cluster_kernel<kScore>));
  int optin = 0;
  KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const size_t dyn = dyn_words(kCompactMaxRows) * sizeof(uint32_t);
  const bool fits = a.binaryVersion >= 90 && a.sharedSizeBytes + dyn <= static_cast<size_t>(optin);
  if (slot) slot->store(fits ? 1 : 2, std::memory_order_release);
  return fits;
}

template <bool kScore>
bool kernel_serves(const IndexerParams& p, int dev) {
  return p.k <= kCompactMaxK && std::min(p.n_rows, p.cap) <= kCompactMaxRows && compute_capability(dev) >= 90 &&
         cluster_kernel_fits<kScore>(dev);
}

template <bool kScore>
void launch(const IndexerParams& p, int dev, Stream s, bool pdl, bool sort_four) {
  const int64_t max_vis = std::min(p.n_rows, p.cap);
  const size_t bytes = dyn_words(max_vis) * sizeof(uint32_t);
  // Opt in to the most this kernel ever takes, so a later call with more rows cannot fail at launch.
  smem_opt_in(topk_cluster_kernel<kScore>, dyn_words(kCompactMaxRows) * sizeof(uint32_t), dev);
  launch_with(topk_cluster_kernel<kScore>, dim3(static_cast<unsigned>(p.n_q * kCluster)), dim3(kCompactThreads), bytes,
              native(s), kCluster, pdl, p, sort_four);
  if constexpr (kScore) {
    KVCORE_CUDA_CHECK_LAUNCH("dsv4 topk_cluster_kernel (fused scores)");
  } else {
    KVCORE_CUDA_CHECK_LAUNCH("dsv4 topk_cluster_kernel");
  }
}

}  // namespace

bool topk_cluster_serves(const IndexerParams& p, int dev) { return kernel_serves<false>(p, dev); }

bool topk_cluster_pays(const IndexerParams& p, int dev) {
  return std::min(p.n_rows, p.cap) >= kClusterMinRows && p.n_q * kCluster <= sm_count(dev);
}

void launch_topk_cluster(const IndexerParams& p, int dev, Stream s, bool pdl, bool sort_four) {
  launch<false>(p, dev, s, pdl, sort_four);
}

bool indexer_fused_serves(const IndexerParams& p, int dev) {
  return scores_mma_serves(p) && p.n_heads <= kFusedMaxHeads && kernel_serves<true>(p, dev);
}

void launch_indexer_fused(const IndexerParams& p, int dev, Stream s, bool pdl, bool sort_four) {
  launch<true>(p, dev, s, pdl, sort_four);
}

}  // namespace kvcore::ops::cuda::dsv4
