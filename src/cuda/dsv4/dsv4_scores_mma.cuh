// Device pieces of the DeepSeek-V4 indexer's tensor-core scores, shared by the scorer
// (dsv4_scores_mma.cu) and the fused scores + top-k (dsv4_topk_cluster.cu): the packed rows as
// mma.sync A fragments, the query transform into shared memory (bf16, exact), and one warp's 16
// rows scored against every head. The rules of the arithmetic are in dsv4_scores_mma.cu's header.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/mma_primitives.cuh"
#include "cuda/common/cluster.cuh"
#include "cuda/dsv4/dsv4_indexer_query.cuh"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/math/fp4_bf16.hpp"

namespace kvcore::ops::cuda::dsv4::scores_mma {

constexpr int kDim = math::kHadamardDim;      // 128
static_assert(kDim == 128, "8 k16 steps, 4 FP4 blocks of 32");
constexpr int kSteps = kDim / 16;             // k16 steps
constexpr int kRowWords = kDim / 8;           // u32 words of nibbles a row; the block scales follow
constexpr int kQLd = kDim + 8;                // bf16 row stride of the query in shared memory
constexpr int kHeadPass = 64;                 // heads an accumulator pass (8 n8 tiles)

__host__ __device__ constexpr int padded_heads(int n_heads) { return (n_heads + 7) / 8 * 8; }

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

__device__ __forceinline__ float relu(float x) { return x > 0.0f ? x : 0.0f; }

// Thread-block clusters exist from compute capability 9.0. Code built for an older target
// transforms the query in every CTA (correct under any launch, cluster or not); the launcher asks
// for clusters only on devices that have them.
constexpr bool kHasClusters = KVCORE_CLUSTER_PTX != 0;

// The query of row i as the scores take it: Hadamard + FP4 rounded like the stored rows (the
// CPU's butterfly network and block scales: identical bits), exact in bf16, into qb [hp, kQLd];
// the padding heads [n_heads, hp) zero (transform_query_heads). With kCluster > 1 the heads are
// spread over the warps of the whole thread-block cluster and each is sent to every CTA's qb
// through `inbox` (expecting hp * kDim bf16s; cluster.cuh): the cluster transforms the query once
// instead of once a CTA; the caller has waited for the cluster barrier that follows every CTA's
// inbox initialization. Ends with the CTA's barrier, after its qb is complete.
template <int kWarps, int kAskedCluster>
__device__ __forceinline__ void transform_query(const IndexerParams& p, int32_t i, int hp, __nv_bfloat16* qb,
                                                const ClusterInbox& inbox) {
  constexpr int kCluster = kHasClusters ? kAskedCluster : 1;
  constexpr int kSlots = kWarps * kCluster;
  constexpr int kGroup = kSlots >= 64 ? 1 : 4;  // the model's 64 heads: one a warp in a cluster
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int rank = 0;
  if constexpr (kCluster > 1) rank = cluster_rank();
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

// Lane (g, tq)'s A fragments of all k steps for its rows g (ra) and g + 8 (rb) of a warp's 16:
// a[k][0] row g, columns 16k + 2tq (+1); a[k][1] row g + 8; a[k][2], a[k][3] the same rows at
// columns + 8. Column c lies in byte c / 2 = word 2k (+1 for + 8), byte tq; its block scale is
// byte k / 2 of the scale word. One byte_perm gathers a row's 4 codes of a step (byte tq of its
// two words), which math/fp4_bf16.hpp turns into the two pairs, exactly as f32 would.
__device__ __forceinline__ void row_fragments(const RowWords& ra, const RowWords& rb, int tq, uint32_t (&a)[kSteps][4]) {
  const uint32_t gather = static_cast<uint32_t>(tq | ((tq + 4) << 4));  // byte tq of the first word, then of the second
#pragma unroll
  for (int blk = 0; blk < kSteps / 2; ++blk) {
    const uint32_t sa = math::ue8m0_bf16x2(ra.scales, blk), sb = math::ue8m0_bf16x2(rb.scales, blk);
#pragma unroll
    for (int k = 2 * blk; k < 2 * blk + 2; ++k) {
      math::e2m1x4_scaled_bf16(math::byte_perm(ra.nib[2 * k], ra.nib[2 * k + 1], gather), sa, a[k][0], a[k][2]);
      math::e2m1x4_scaled_bf16(math::byte_perm(rb.nib[2 * k], rb.nib[2 * k + 1], gather), sb, a[k][1], a[k][3]);
    }
  }
}

// The scores of rows g (.x) and g + 8 (.y) of the warp's 16 from their fragments, against the hp
// heads of qb (weights ws); every lane of a row group (g) gets them. Heads in passes of 64, terms
// summed in one order whatever the CTA's shape, so every kernel that calls it gives the same bits.
__device__ __forceinline__ float2 score_fragments(const uint32_t (&a)[kSteps][4], const __nv_bfloat16* qb, const float* ws,
                                                  int hp, int g, int tq) {
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
  return make_float2(total_a, total_b);
}

}  // namespace kvcore::ops::cuda::dsv4::scores_mma
