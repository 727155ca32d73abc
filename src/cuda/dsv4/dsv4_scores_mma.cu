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

#include "cuda/attention/mma_primitives.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/cluster.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/dsv4/dsv4_indexer_query.cuh"
#include "cuda/dsv4/dsv4_scores_mma.hpp"
#include "kvcore/math/dsv4.hpp"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::native;

namespace {

constexpr int kDim = math::kHadamardDim;      // 128
static_assert(kDim == 128, "8 k16 steps, 4 FP4 blocks of 32");
constexpr int kSteps = kDim / 16;             // k16 steps
constexpr int kRowWords = kDim / 8;           // u32 words of nibbles a row; the block scales follow
constexpr int kQLd = kDim + 8;                // bf16 row stride of the query in shared memory
constexpr int kHeadPass = 64;                 // heads an accumulator pass (8 n8 tiles)

__host__ __device__ constexpr int padded_heads(int n_heads) { return (n_heads + 7) / 8 * 8; }

size_t mma_smem_bytes(int n_heads) {
  const int hp = padded_heads(n_heads);
  return static_cast<size_t>(hp) * kQLd * sizeof(__nv_bfloat16) + static_cast<size_t>(hp) * sizeof(float);
}

// One stored row's packed words: kRowWords of nibbles (value d in byte d / 2, the low nibble
// for even d), then the 4 UE8M0 block scales in one word. Zeros for rows past the visible ones.
struct RowWords {
  uint32_t nib[kRowWords];
  uint32_t scales;
};

__device__ __forceinline__ void load_row(const IndexerParams& p, int64_t s, bool valid, RowWords& r) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.rows) + (valid ? s : 0) * p.rows_stride);
#pragma unroll
  for (int j = 0; j < kRowWords; ++j) r.nib[j] = valid ? src[j] : 0u;
  r.scales = valid ? src[kRowWords] : 0u;
}

// The two values of byte `byte_idx` of word w (columns 2c, 2c + 1 of its block) times the
// block's scale, as a bf16 pair (the lower column in the low half): exact.
__device__ __forceinline__ uint32_t bf16_pair(uint32_t w, int byte_idx, float scale) {
  const uint32_t b = (w >> (8 * byte_idx)) & 0xffu;
  const float lo = math::e2m1_decode(static_cast<uint8_t>(b & 0xfu)) * scale;
  const float hi = math::e2m1_decode(static_cast<uint8_t>(b >> 4)) * scale;
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float relu(float x) { return x > 0.0f ? x : 0.0f; }

// Thread-block clusters exist from compute capability 9.0. Code built for an older target
// transforms the query in every CTA (correct under any launch, cluster or not); the launcher asks
// for clusters only on devices that have them.
constexpr bool kHasClusters = KVCORE_CLUSTER_PTX != 0;

// The query of row i as the scores take it: Hadamard + FP4 rounded like the stored rows (the
// CPU's butterfly network and block scales: identical bits), exact in bf16, into qb [hp, kQLd];
// the padding heads [n_heads, hp) zero (transform_query_heads). With kCluster > 1 the heads are spread
// over the warps of the whole thread-block cluster and each is sent to every CTA's qb through
// `inbox` (expecting hp * kDim bf16s; cluster.cuh): the cluster transforms the query once instead
// of once a CTA. Ends with the CTA's barrier, after its qb is complete.
template <int kWarps, int kAskedCluster>
__device__ __forceinline__ void transform_query(const IndexerParams& p, int32_t i, int hp, __nv_bfloat16* qb,
                                                const ClusterInbox& inbox) {
  constexpr int kCluster = kHasClusters ? kAskedCluster : 1;
  constexpr int kSlots = kWarps * kCluster;
  constexpr int kGroup = kSlots >= 64 ? 1 : 4;  // the model's 64 heads: one a warp in a cluster
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int rank = 0;
  if constexpr (kCluster > 1) {
    rank = cluster_rank();
    cluster_wait();  // every CTA's inbox initialized
  }
  transform_query_heads<kGroup>(p, p.q + i * p.q_stride0, rank * kWarps + warp, kSlots, hp, [&](int h, const float (&v)[4]) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);  // exact
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    uint2* dst = reinterpret_cast<uint2*>(qb + h * kQLd + 4 * lane);  // dims 4 lane .. 4 lane + 3
    if constexpr (kCluster > 1) {
#pragma unroll
      for (int r = 0; r < kCluster; ++r) inbox.send(dst, r, packed);
    } else {
      *dst = packed;
    }
  });
  if constexpr (kCluster > 1) inbox.wait();  // every head of qb arrived
  __syncthreads();                            // and the weights in ws
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
  transform_query<kWarps, kCluster>(p, i, hp, qb, inbox);  // ends after a barrier

  for (; s0 < vis; s0 += step) {
    // A fragments of all k steps: a[k][0] row g, columns 16k + 2tq (+1); a[k][1] row g + 8;
    // a[k][2], a[k][3] the same rows at columns + 8. Column c lies in byte c / 2 = word
    // 2k (+1 for + 8), byte tq; its block scale is byte k / 2 of the scale word.
    uint32_t a[kSteps][4];
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const float sa = math::ue8m0_decode(static_cast<uint8_t>((ra.scales >> (8 * (k / 2))) & 0xffu));
      const float sb = math::ue8m0_decode(static_cast<uint8_t>((rb.scales >> (8 * (k / 2))) & 0xffu));
      a[k][0] = bf16_pair(ra.nib[2 * k], tq, sa);
      a[k][1] = bf16_pair(rb.nib[2 * k], tq, sb);
      a[k][2] = bf16_pair(ra.nib[2 * k + 1], tq, sa);
      a[k][3] = bf16_pair(rb.nib[2 * k + 1], tq, sb);
    }
    if (s0 + step < vis) load_rows(s0 + step);  // the next tile's rows, in flight during this one's math

    float total_a = 0.0f, total_b = 0.0f;  // rows g and g + 8: this lane's heads 2tq, 2tq + 1 of each n8 tile
    for (int hc = 0; hc < hp; hc += kHeadPass) {
      float acc[kHeadPass / 8][4];
#pragma unroll
      for (int n = 0; n < kHeadPass / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
#pragma unroll
        for (int n = 0; n < kHeadPass / 8; ++n) {
          if (hc + 8 * n < hp) {  // warp-uniform
            // B fragment: rows (dims) 16k + 2tq (+1) and + 8 of column (head) g of this n8 tile.
            const __nv_bfloat16* qrow = qb + (hc + 8 * n + g) * kQLd + 16 * k + 2 * tq;
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(qrow);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(qrow + 8);
            mma_attn::mma16816<true>(acc[n], a[k], b0, b1);
          }
        }
      }
      // acc[n]: [0] row g head 2tq, [1] row g head 2tq + 1, [2] and [3] the same for row g + 8.
#pragma unroll
      for (int n = 0; n < kHeadPass / 8; ++n) {
        if (hc + 8 * n < hp) {
          const int h = hc + 8 * n + 2 * tq;
          const float w0 = ws[h], w1 = ws[h + 1];
          total_a += w0 * relu(acc[n][0]) + w1 * relu(acc[n][1]);
          total_b += w0 * relu(acc[n][2]) + w1 * relu(acc[n][3]);
        }
      }
    }
    // The 4 lanes of a row group hold its other heads.
    total_a += __shfl_xor_sync(0xffffffffu, total_a, 1);
    total_a += __shfl_xor_sync(0xffffffffu, total_a, 2);
    total_b += __shfl_xor_sync(0xffffffffu, total_b, 1);
    total_b += __shfl_xor_sync(0xffffffffu, total_b, 2);
    if (tq == 0) {
      const int64_t row = s0 + warp * 16 + g;
      if (row < vis) sc[row] = total_a;
      if (row + 8 < vis) sc[row + 8] = total_b;
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
