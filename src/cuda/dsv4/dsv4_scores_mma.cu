// Tensor-core scores of the DeepSeek-V4 lightning indexer, score(s) = sum_h w_h relu(q_h . k_s),
// for the model's stored rows: packed FP4 (Hadamard domain) of dim 128, and the query Hadamard +
// FP4 rounded like them. Both operands are then FP4 values times power-of-two block scales, which
// bf16 holds exactly (e2m1 has 2 significant bits; the scales' exponents are f32's, and bf16 has
// f32's exponent range), so mma.sync m16n8k16 bf16 with f32 accumulators takes them as they are:
// every product is exact, and so is each dot's sum wherever a row's and a head's block scales
// keep the partial sums within f32's 24 bits (Hadamard-spread rows do); elsewhere it rounds
// within the f32 bound the tests check. The heads' terms are summed in f32.
// Layout: a CTA of kWarps warps (4, 8 or 16) takes tiles of 16 kWarps rows (16 a warp: the
// mma's m16) x all heads (n8 tiles, 64 heads an accumulator pass) x dim 128 (8 k16 steps). A
// warp reads its rows' packed words straight from global memory into registers (each lane the
// bytes of its own fragment elements), issued before the query transform so the two overlap, and
// the next tile's during this tile's math. The query transform (a warp a head, in registers) is
// the serial part of a decode step's scoring, where a CTA has one tile: it is ALU work, so the
// automatic form spreads it over a cluster of 8 CTAs, each transforming 8 of the 64 heads and
// writing them to all 8 CTAs' shared memory. The query is held there as bf16, rows padded so
// that the B-fragment loads are free of bank conflicts.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/dsv4/dsv4_scores_mma.cuh"
#include "cuda/dsv4/dsv4_scores_mma.hpp"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::native;

namespace {

using namespace scores_mma;

size_t mma_smem_bytes(int n_heads) {
  const int hp = padded_heads(n_heads);
  return static_cast<size_t>(hp) * kQLd * sizeof(__nv_bfloat16) + static_cast<size_t>(hp) * sizeof(float);
}

// grid (blocks per query, n_q); a block scores tiles blockIdx.x, blockIdx.x + gridDim.x, ... of
// its query's visible rows and writes -inf to the invisible rest of [0, cap).
// With kCluster > 1, clusters of kCluster CTAs along x share the query transform; a CTA without
// tiles still takes its part of it. Launched as a programmatic dependent (of the layer's cache
// append, in a decode step), it sets up its shared memory while that kernel drains and waits for
// it before its first global access.
template <int kWarps, int kCluster>
__global__ void __launch_bounds__(32 * kWarps) score_mma_kernel(const IndexerParams p) {
  constexpr int kTileRows = 16 * kWarps;
  pdl_allow_dependents();  // the top-k may launch now; it waits for this grid before reading
  extern __shared__ __align__(16) float smem[];
  __shared__ __align__(8) uint64_t inbox_bar;
  const int n_heads = p.n_heads, hp = padded_heads(n_heads);
  const ClusterInbox inbox(&inbox_bar);
  if constexpr (kCluster > 1 && kHasClusters) {
    if (threadIdx.x == 0) {
      inbox.init();
      inbox.expect(static_cast<uint32_t>(hp * kDim * sizeof(__nv_bfloat16)));
    }
    cluster_arrive_relaxed();  // its wait comes before the first send, after the loads below are issued
  }
  pdl_wait();  // the rows, the query and the weights are complete and visible from here on
  const int32_t i = blockIdx.y;
  const int64_t vis = mask_invisible_scores(p, i);
  float* sc = p.scores + i * p.scores_stride;
  if ((kCluster == 1 || !kHasClusters) && static_cast<int64_t>(blockIdx.x) * kTileRows >= vis) return;  // block-uniform

  __nv_bfloat16* qb = reinterpret_cast<__nv_bfloat16*>(smem);                                 // [hp, kQLd]
  float* ws = reinterpret_cast<float*>(qb + static_cast<size_t>(hp) * kQLd);                 // [hp]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kTileRows;
  int64_t s0 = static_cast<int64_t>(blockIdx.x) * kTileRows;

  // This lane's rows of the tile: rows g and g + 8 of the warp's 16 (the A fragment's rows).
  RowWords ra, rb;
  auto load_rows = [&](int64_t base) {
    const int64_t a = base + warp * 16 + g, b = a + 8;
    load_row(p, a, a < vis, ra);
    load_row(p, b, b < vis, rb);
  };
  load_rows(s0);  // in flight during the query transform

  const float* w = p.weights + i * p.w_stride;
  for (int h = threadIdx.x; h < hp; h += blockDim.x) ws[h] = h < n_heads ? w[h] : 0.0f;  // padding heads: q 0, w 0
  if constexpr (kCluster > 1 && kHasClusters) cluster_wait();  // every CTA's inbox initialized
  transform_query<kWarps, kCluster>(p, i, hp, qb, inbox);      // ends after a barrier

  for (; s0 < vis; s0 += step) {
    uint32_t a[kSteps][4];
    row_fragments(ra, rb, tq, a);
    if (s0 + step < vis) load_rows(s0 + step);  // the next tile's rows, in flight during this one's math

    const float2 total = score_fragments(a, qb, ws, hp, g, tq);
    if (tq == 0) {
      const int64_t row = s0 + warp * 16 + g;
      if (row < vis) sc[row] = total.x;
      if (row + 8 < vis) sc[row + 8] = total.y;
    }
  }
}

}  // namespace

bool scores_mma_serves(const IndexerParams& p) {
  return p.quant && p.rows_packed && p.dim == kDim && p.rows_stride % 4 == 0 &&
         reinterpret_cast<uintptr_t>(p.rows) % 4 == 0 && mma_smem_bytes(p.n_heads) <= 200 * 1024;
}

template <int kWarps, int kCluster>
void launch_warps(const IndexerParams& p, int dev, Stream s, bool pdl) {
  const size_t bytes = mma_smem_bytes(p.n_heads);
  const auto kernel = score_mma_kernel<kWarps, kCluster>;
  smem_opt_in(kernel, bytes, dev);
  const int64_t sms = sm_count(dev), rows = std::min(p.n_rows, p.cap);
  const int64_t want = std::max<int64_t>(1, 8 * sms / (kWarps * p.n_q));  // ~8 warps an SM in all
  const int64_t tiles = (rows + 16 * kWarps - 1) / (16 * kWarps);
  const int64_t x = (std::max<int64_t>(1, std::min(tiles, want)) + kCluster - 1) / kCluster * kCluster;
  launch_with(kernel, dim3(static_cast<unsigned>(x), static_cast<unsigned>(p.n_q)), dim3(32 * kWarps), bytes, native(s),
                 kCluster, pdl, p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 score_mma_kernel");
}

// Automatic: 8 warps a CTA, the fastest plain width on the model's decode shapes, 8k and 64k
// tokens (bench dsv4's sweep: 4 warps pay a longer transform, 16 fill fewer SMs), in clusters
// of 8 sharing the query transform where the rows fill at least one cluster. Asked-for widths
// (warps 4, 8, 16) run without clusters unless cluster is 8.
void launch_scores_mma(const IndexerParams& p, int dev, Stream s, int warps, int cluster, bool pdl) {
  const int64_t rows = std::min(p.n_rows, p.cap);
  if (warps == 0 && cluster == 0 && rows >= 8 * 16 * 8) cluster = 8;
  if (cluster == 8 && compute_capability(dev) >= 90) return launch_warps<8, 8>(p, dev, s, pdl);
  if (warps == 4) return launch_warps<4, 1>(p, dev, s, pdl);
  if (warps == 16) return launch_warps<16, 1>(p, dev, s, pdl);
  launch_warps<8, 1>(p, dev, s, pdl);
}

}  // namespace kvcore::ops::cuda::dsv4
