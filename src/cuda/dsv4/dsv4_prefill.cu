// Prefill fast path: the windows whose candidates all lie in the chunk, for the model's row
// shapes (attention 512 = 448 + 64, indexer 128). The general one-window-a-block kernel
// (dsv4.cu) issues about twice the instructions of the pool itself (scalar loads, 64-bit index
// math per candidate, shared-memory row passes with 8 barriers) at half occupancy, so memory
// sits idle while blocks compute. Here a thread owns 4 consecutive channels (16-byte loads and
// stores) and finishes the row in registers, which keeps the loads of many windows in flight
// (bench/results, dsv4 prefill rows, has the shares of copy bandwidth of both):
//   - CSA (8 overlapping candidates): a block of 128 threads per window, all 16 loads of a
//     thread issued at once (32 KB a block in flight), one barrier (the RMSNorm sum);
//   - indexer (8 candidates, 128 dims): a warp per window, no barrier at all, the pool's channels
//     side by side (pool_cand8_joint) and FP4 codes without branches;
//   - HCA (128 candidates, one-pass pool): a block per window, candidates streamed through a
//     per-thread ring in shared memory by cp.async (7 candidates, 112 KB an SM, in flight
//     without holding registers), 4 blocks an SM so 512 windows are one wave.
// One launch a chunk: the one or two windows at its start (candidates from the state) run the
// general body in extra blocks, and at position 0 the fast blocks write the state update too
// (a launch of their own cost several microseconds each, against ~40 for all 16k indexer windows).
// Same arithmetic as emission from the state (dsv4_pool_fixed<8> / Dsv4OnlineFold, and
// dsv4_quad.cuh's finishing): prefill stays bit-identical to token-by-token emission.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/cp_async.cuh"
#include "cuda/dsv4/dsv4_prefill.cuh"
#include "cuda/dsv4/dsv4_prefill_general.cuh"
#include "cuda/dsv4/dsv4_quad.cuh"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::cp_async;
using kvcore::ops::cuda::cp_async_commit;
using kvcore::ops::cuda::cp_async_wait;
using kvcore::ops::cuda::native;

// ---- one launch for the whole chunk ---------------------------------------------------------
// Blocks [0, n_edge): the windows w0 .. wa - 1 by the general body (candidates from the state or
// before position 0); the rest: the fast windows wa .. wb - 1. With `state` set (a chunk at
// position 0: no window reads the state) the fast blocks also write the state update, a slice
// each (HCA: one element a thread; no extra blocks that would make a second wave).
struct FastGrid {
  int64_t w0, wa, wb;
  int32_t n_edge, state;
};

// True if this block is an edge block (and has done its work). Block-uniform. smem: >= head_dim
// + 33 floats.
template <bool kEight>
__device__ inline bool edge_block(const CompressorParams& p, const FastGrid& g, float* smem) {
  if (static_cast<int32_t>(blockIdx.x) >= g.n_edge) return false;
  prefill_window_body<kEight, false>(p, smem, g.w0 + blockIdx.x);  // never in the chunk: w < wa
  return true;
}

// The fast block's index among the fast blocks.
__device__ __forceinline__ int64_t fast_block(const FastGrid& g) { return static_cast<int64_t>(blockIdx.x) - g.n_edge; }

// This fast block's slice of the state update, when fused (see FastGrid).
__device__ inline void state_slice(const CompressorParams& p, const FastGrid& g) {
  if (!g.state) return;
  const int32_t rows = p.overlap ? p.ratio : p.state_rows;  // a thread per (row r < rows, column)
  const int64_t total = static_cast<int64_t>(rows) * p.width;
  const int64_t stride = static_cast<int64_t>(gridDim.x - g.n_edge) * blockDim.x;
  for (int64_t e = fast_block(g) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int32_t r = static_cast<int32_t>(e / p.width), k = static_cast<int32_t>(e % p.width);
    prefill_state_row(p, r, k);
    if (p.overlap) prefill_state_row(p, r + p.ratio, k);  // after row r: r may copy its old value
  }
}

// ---- CSA and indexer: 8 overlapping candidates ---------------------------------------------

struct Cand8 {
  float4 c[8], z[8], a[8];
};

// Candidates of quad d of window w in prefill_candidate's order: j < 4 the previous window's
// tokens at column d (lane A), j >= 4 this window's at column head_dim + d (lane B); a = ape.
__device__ __forceinline__ void load_cand8(const CompressorParams& p, int64_t w, int d, Cand8& k) {
  const int64_t ta = (w - 1) * 4 - p.pos, tb = w * 4 - p.pos;
  const int db = p.head_dim + d;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    k.c[j] = load_stream4(p.c + (ta + j) * p.c_stride + d);
    k.z[j] = load_stream4(p.z + (ta + j) * p.z_stride + d);
    k.c[4 + j] = load_stream4(p.c + (tb + j) * p.c_stride + db);
    k.z[4 + j] = load_stream4(p.z + (tb + j) * p.z_stride + db);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    k.a[j] = ape_quad(p, j, d);
    k.a[4 + j] = ape_quad(p, j, db);
  }
}

__device__ __forceinline__ void pool_cand8(const Cand8& k, float (&y)[4]) {
#pragma unroll
  for (int v = 0; v < 4; ++v)
    y[v] = math::dsv4_pool_fixed<8>([&](int j, float& z, float& c) {
      z = quad_at(k.z[j], v) + quad_at(k.a[j], v);  // the f32 add of store_one / prefill_candidate
      c = quad_at(k.c[j], v);
    });
}

// pool_cand8 without a branch between channels (the indexer's pool): each channel's quotients
// are taken by dsv4_pool_fixed<8>'s shared-reciprocal steps straight away, and only if some
// channel fails their range test (a -inf, NaN or tiny weight) is the whole quad pooled again by
// pool_cand8. The same operations per channel, so the same bits; the four channels interleave
// instead of running one after another between branches.
__device__ __forceinline__ void pool_cand8_joint(const Cand8& k, float (&y)[4]) {
#if defined(__CUDA_ARCH__)  // the shared-reciprocal steps are device code (math/dsv4.hpp)
  bool fast = true;
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    float zs[8], es[8];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      zs[j] = quad_at(k.z[j], v) + quad_at(k.a[j], v);  // the f32 add of store_one / prefill_candidate
      mx = fmaxf(mx, zs[j]);
    }
    float den = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      es[j] = expf(zs[j] - mx);
      den += es[j];
    }
    float emin = es[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) emin = fminf(emin, es[j]);
    fast = fast && mx != -INFINITY && emin >= 0x1p-64f && den >= 1.0f && den <= 256.0f;
    const float r = math::div_rn_reciprocal(den);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = __fmaf_rn(quad_at(k.c[j], v), math::div_rn_steps(es[j], den, r), acc);
    y[v] = acc;
  }
  if (!fast) pool_cand8(k, y);
#else
  pool_cand8(k, y);
#endif
}

// 4 blocks an SM fit 121 registers without spills; 5 blocks an SM spill, and 2 channels a
// thread (twice the warps) issue more instructions a channel: both were slower.
__global__ void __launch_bounds__(128, 4) prefill_csa_quad_kernel(const CompressorParams p, const FastGrid g) {
  __shared__ float smem[512 + 33];
  if (edge_block<true>(p, g, smem)) return;
  state_slice(p, g);
  float* scratch = smem;
  const int64_t w = g.wa + fast_block(g);
  const int d = 4 * static_cast<int>(threadIdx.x);
  Cand8 k;
  load_cand8(p, w, d, k);
  QuadRope r{};
  if (threadIdx.x >= 96) r = quad_rope_angles(p, w);  // warp 3 holds the tail; while the loads are in flight
  float y[4];
  pool_cand8(k, y);
  finish_attention_quad(p, w, y, r, scratch);
}

// 128 registers, no spills. The joint pool and the branch-free FP4 encoder keep the kernel
// below the issue limit (the per-candidate pool with a branchy encoder was issue-bound).
// Persistent warps walking contiguous windows, prefetching the next window's rows into L2, or
// a per-warp cp.async ring were all slower: a warp a window already keeps enough loads in
// flight.
__global__ void __launch_bounds__(128, 4) prefill_indexer_quad_kernel(const CompressorParams p, const FastGrid g) {
  __shared__ float smem[128 + 33];
  if (edge_block<true>(p, g, smem)) return;
  state_slice(p, g);
  const int64_t w = g.wa + 4 * fast_block(g) + (threadIdx.x >> 5);
  if (w >= g.wb) return;  // warp-uniform; no block barrier below
  const int d = 4 * static_cast<int>(threadIdx.x & 31);
  Cand8 k;
  load_cand8(p, w, d, k);
  const QuadRope r = quad_rope_angles(p, w);
  float y[4];
  pool_cand8_joint(k, y);
  finish_indexer_quad(p, w, y, r);
}

// ---- HCA: ratio candidates (128), one-pass pool --------------------------------------------

constexpr int kHcaThreads = 128;  // a thread per quad of the 512-dim row
constexpr int kHcaSlots = 8;      // ring slots a thread: 7 candidates in flight while one is folded

// Ring: [slot][c, z, ape][thread] float4, then 4 floats of reduction scratch.
constexpr size_t hca_smem_bytes() { return static_cast<size_t>(kHcaSlots) * 3 * kHcaThreads * sizeof(float4) + 4 * sizeof(float); }

// Each thread copies and later reads only its own ring entries: cp.async.wait_group makes
// them visible to it, so the ring needs no barrier. The fold loop is unrolled over the ring
// (ratio % kHcaSlots == 0, see fast_shape), so every slot offset is a constant: candidate
// j0 + u is read from slot u, and slot (u + 7) % 8 is refilled with candidate j0 + u + 7 just
// before, after candidate j0 + u - 1, its previous content, was folded. Constant offsets and
// the ape type as a template parameter keep the loop below the issue limit, which one
// candidate an iteration with computed offsets, or 2 channels a thread, reach first.
template <bool kApeF16>
__global__ void __launch_bounds__(kHcaThreads, 4) prefill_hca_kernel(const CompressorParams p, const FastGrid g) {
  constexpr int T = kHcaThreads;
  extern __shared__ __align__(16) unsigned char hca_smem[];
  if (edge_block<false>(p, g, reinterpret_cast<float*>(hca_smem))) return;  // the ring's space
  state_slice(p, g);
  float4* ring = reinterpret_cast<float4*>(hca_smem) + threadIdx.x;  // this thread's entries, stride T
  float* scratch = reinterpret_cast<float*>(hca_smem + kHcaSlots * 3 * T * sizeof(float4));
  const int t = static_cast<int>(threadIdx.x), d = 4 * t;
  const int64_t w = g.wa + fast_block(g);
  const int32_t m = p.ratio;
  const int64_t t0 = w * m - p.pos;
  // The next candidate's sources, advanced by a row each issue.
  const float* cn = p.c + t0 * p.c_stride + d;
  const float* zn = p.z + t0 * p.z_stride + d;
  using Ape = typename std::conditional<kApeF16, uint16_t, float>::type;
  const Ape* an = static_cast<const Ape*>(p.ape) + d;
  const auto issue = [&](int slot) {
    cp_async<16>(ring + (3 * slot) * T, cn);
    cp_async<16>(ring + (3 * slot + 1) * T, zn);
    cp_async<4 * sizeof(Ape)>(ring + (3 * slot + 2) * T, an);
    cn += p.c_stride;
    zn += p.z_stride;
    an += p.ape_stride;
  };
#pragma unroll
  for (int u = 0; u < kHcaSlots - 1; ++u) {  // m >= kHcaSlots
    issue(u);
    cp_async_commit();
  }
  QuadRope r{};
  if (t >= 96) r = quad_rope_angles(p, w);  // warp 3 holds the tail
  math::Dsv4OnlineFold fold[4];
  for (int32_t j0 = 0; j0 < m; j0 += kHcaSlots) {
#pragma unroll
    for (int u = 0; u < kHcaSlots; ++u) {
      if (j0 + u + kHcaSlots - 1 < m) issue((u + kHcaSlots - 1) % kHcaSlots);
      cp_async_commit();               // empty groups too: the wait count stays exact
      cp_async_wait<kHcaSlots - 1>();  // candidate j0 + u has landed
      const float4 c = ring[(3 * u) * T], z = ring[(3 * u + 1) * T], a_raw = ring[(3 * u + 2) * T];
      float a[4];
      if constexpr (kApeF16) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const uint32_t bits = __float_as_uint(quad_at(a_raw, v / 2));
          a[v] = math::f16_bits_to_f32(static_cast<uint16_t>(v % 2 ? bits >> 16 : bits & 0xffffu));
        }
      } else {
#pragma unroll
        for (int v = 0; v < 4; ++v) a[v] = quad_at(a_raw, v);
      }
#pragma unroll
      for (int v = 0; v < 4; ++v) fold[v].add(quad_at(z, v) + a[v], quad_at(c, v));
    }
  }
  float y[4];
#pragma unroll
  for (int v = 0; v < 4; ++v) y[v] = fold[v].result();
  finish_attention_quad(p, w, y, r, scratch);
}

template <bool kApeF16>
void launch_hca(const CompressorParams& p, const FastGrid& g, int64_t blocks, Stream s) {
  const void* k = reinterpret_cast<const void*>(prefill_hca_kernel<kApeF16>);
  smem_opt_in(k, hca_smem_bytes(), current_device());
  // The carveout is a per-device attribute too: set on every launch.
  KVCORE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  prefill_hca_kernel<kApeF16><<<static_cast<unsigned>(blocks), kHcaThreads, hca_smem_bytes(), native(s)>>>(p, g);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 prefill_hca_kernel");
}

// ---- dispatch -------------------------------------------------------------------------------

namespace {

bool aligned(const void* ptr, uintptr_t a) { return reinterpret_cast<uintptr_t>(ptr) % a == 0; }

enum class FastShape { None, Csa, Indexer, Hca };

// The model's shapes, with every pointer and stride aligned for the 16-byte accesses.
FastShape fast_shape(const CompressorParams& p) {
  const math::RopeLayout& l = p.rope.layout;
  const bool io = aligned(p.c, 16) && aligned(p.z, 16) && p.c_stride % 4 == 0 && p.z_stride % 4 == 0 &&
                  aligned(p.norm_weight, 16) && p.ape_stride % 4 == 0 && aligned(p.ape, p.ape_f16 ? 8 : 16);
  const bool rope = l.interleaved == 1 && p.n_rot == 64 && l.n_rot == 64 && l.first_dim == p.head_dim - 64;  // the tail: 16 lanes, 32 pairs
  if (!io || !rope) return FastShape::None;
  const bool eight = p.overlap && p.ratio == 4;
  if (p.kind == 0 && p.head_dim == 512) {
    const bool rows = p.rows_packed ? aligned(p.rows, 8) && p.rows_stride % 8 == 0 : aligned(p.rows, 16) && p.rows_stride % 4 == 0;
    if (!rows) return FastShape::None;
    if (eight) return FastShape::Csa;
    // 8 rows take the three-pass pool (dsv4_pool_any); the HCA kernel unrolls its loop over its ring.
    if (!p.overlap && p.state_rows != 8 && p.ratio % kHcaSlots == 0) return FastShape::Hca;
    return FastShape::None;
  }
  if (p.kind == 1 && p.head_dim == math::kHadamardDim && eight) {
    const bool rows = p.rows_packed ? aligned(p.rows, 4) && p.rows_stride % 2 == 0 : aligned(p.rows, 16) && p.rows_stride % 4 == 0;
    return rows ? FastShape::Indexer : FastShape::None;
  }
  return FastShape::None;
}

constexpr int64_t kMaxGrid = 65535LL * 1024;  // far below grid.x's 2^31 - 1

}  // namespace

bool prefill_fast(const CompressorParams& p, Stream s, bool* state_done) {
  *state_done = false;
  const FastShape shape = fast_shape(p);
  if (shape == FastShape::None) return false;
  const int64_t w0 = p.pos / p.ratio, w1 = (p.pos + p.n_tokens) / p.ratio;
  // The first window whose candidates (and, with overlap, the previous window's) are all in the chunk.
  const int64_t first = (p.pos + p.ratio - 1) / p.ratio + (p.overlap ? 1 : 0);
  const int64_t wa = first < w0 ? w0 : (first > w1 ? w1 : first);
  if (wa >= w1) return false;  // no fast window: the general kernel alone
  // At position 0 no window reads the state (candidates before the chunk are before position 0),
  // so the state update can share the launch.
  FastGrid g{w0, wa, w1, static_cast<int32_t>(wa - w0), p.pos == 0 ? 1 : 0};
  const int per_block = shape == FastShape::Indexer ? 4 : 1;  // windows a fast block
  for (int64_t w = wa; w < w1;) {
    const int64_t n = w1 - w < kMaxGrid ? w1 - w : kMaxGrid;
    g.wa = w;
    g.wb = w + n;
    const int64_t blocks = g.n_edge + (n + per_block - 1) / per_block;
    const unsigned grid = static_cast<unsigned>(blocks);
    if (shape == FastShape::Csa) {
      prefill_csa_quad_kernel<<<grid, 128, 0, native(s)>>>(p, g);
      KVCORE_CUDA_CHECK_LAUNCH("dsv4 prefill_csa_quad_kernel");
    } else if (shape == FastShape::Indexer) {
      prefill_indexer_quad_kernel<<<grid, 128, 0, native(s)>>>(p, g);
      KVCORE_CUDA_CHECK_LAUNCH("dsv4 prefill_indexer_quad_kernel");
    } else if (p.ape_f16) {
      launch_hca<true>(p, g, blocks, s);
    } else {
      launch_hca<false>(p, g, blocks, s);
    }
    if (g.state) *state_done = true;
    g.n_edge = 0;  // edge windows and the state in the first launch only
    g.state = 0;
    w += n;
  }
  return true;
}

}  // namespace kvcore::ops::cuda::dsv4
