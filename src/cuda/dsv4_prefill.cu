// Prefill fast path: the windows whose candidates all lie in the chunk, for the model's row
// shapes (attention 512 = 448 + 64, indexer 128). The one-window-a-block kernel (dsv4.cu)
// reached 50-58% of copy on 64k tokens (GPU run 7): it issued about twice the instructions of
// the pool itself (scalar loads, 64-bit index math per candidate, shared-memory row passes
// with 8 barriers) at half occupancy, so memory sat idle while blocks computed; persistent
// blocks that prefetched the next window (4108a32) had fewer warps to hide that and were
// slower still. Here a thread owns 4 consecutive channels (16-byte loads and stores) and
// finishes the row in registers:
//   - CSA (8 overlapping candidates): a block of 128 threads per window, all 16 loads of a
//     thread issued at once (32 KB a block in flight), one barrier (the RMSNorm sum);
//   - indexer (8 candidates, 128 dims): a warp per window, no barrier at all;
//   - HCA (128 candidates, one-pass pool): a block per window, candidates streamed through a
//     per-thread ring in shared memory by cp.async (7 candidates, 112 KB an SM, in flight
//     without holding registers), 4 blocks an SM so 512 windows are one wave.
// One launch a chunk: the one or two windows at its start (candidates from the state) run the
// general body in extra blocks, and at position 0 the state update too (a launch of their own
// cost several microseconds each, against ~40 for all 16k indexer windows).
// Same arithmetic as emission from the state (dsv4_pool_fixed<8> / Dsv4OnlineFold, and
// dsv4_quad.cuh's finishing): prefill stays bit-identical to token-by-token emission.
// KVCORE_DSV4_PREFILL=generic turns the fast path off (A/B runs; see variant() below).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda/check.cuh"
#include "cuda/dsv4_pair.cuh"
#include "cuda/dsv4_prefill.cuh"
#include "cuda/dsv4_prefill_general.cuh"
#include "cuda/dsv4_quad.cuh"

namespace kvcore::dsv4::cuda {

using kvcore::cuda::native;

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

// kMinBlocks: 4 (default) fits 120 registers without spills; 5 (KVCORE_DSV4_PREFILL=fast5, an
// A/B variant) caps them at 102, spilling a few, for a fifth block an SM.
template <int kMinBlocks>
__global__ void __launch_bounds__(128, kMinBlocks) prefill_csa_quad_kernel(const CompressorParams p, const FastGrid g) {
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

// A/B variant (KVCORE_DSV4_PREFILL=pair3 / pair4): 2 channels a thread, 256 threads a window
// (8-byte loads), half the registers a thread of the quad kernel, so 24-32 warps an SM
// instead of 16; the same candidates, pool and finishing arithmetic (dsv4_pair.cuh).
__device__ __forceinline__ float2 ape_pair(const CompressorParams& p, int32_t r, int32_t col) {
  if (p.ape_f16) {
    const uint32_t h = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p.ape) + r * p.ape_stride + col));
    return make_float2(math::f16_bits_to_f32(static_cast<uint16_t>(h & 0xffffu)), math::f16_bits_to_f32(static_cast<uint16_t>(h >> 16)));
  }
  return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(p.ape) + r * p.ape_stride + col));
}

template <int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) prefill_csa_pair_kernel(const CompressorParams p, const FastGrid g) {
  __shared__ float smem[512 + 33];
  if (edge_block<true>(p, g, smem)) return;
  state_slice(p, g);
  const int64_t w = g.wa + fast_block(g);
  const int t = static_cast<int>(threadIdx.x), d = 2 * t, db = p.head_dim + d;
  const int64_t ta = (w - 1) * 4 - p.pos, tb = w * 4 - p.pos;
  float2 c[8], z[8], a[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    c[j] = __ldcs(reinterpret_cast<const float2*>(p.c + (ta + j) * p.c_stride + d));
    z[j] = __ldcs(reinterpret_cast<const float2*>(p.z + (ta + j) * p.z_stride + d));
    c[4 + j] = __ldcs(reinterpret_cast<const float2*>(p.c + (tb + j) * p.c_stride + db));
    z[4 + j] = __ldcs(reinterpret_cast<const float2*>(p.z + (tb + j) * p.z_stride + db));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j] = ape_pair(p, j, d);
    a[4 + j] = ape_pair(p, j, db);
  }
  float sn = 0.0f, cs = 0.0f;
  if (t >= 224) math::sincos_f32(math::rope_angle(static_cast<float>(w * p.ratio), p.rope.freq[t - 224]), &sn, &cs);
  float y[2];
#pragma unroll
  for (int v = 0; v < 2; ++v)
    y[v] = math::dsv4_pool_fixed<8>([&](int j, float& zz, float& cc) {
      zz = (v ? z[j].y : z[j].x) + (v ? a[j].y : a[j].x);
      cc = v ? c[j].y : c[j].x;
    });
  finish_attention_pair(p, w, y, sn, cs, smem);
}

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
  pool_cand8(k, y);
  finish_indexer_quad(p, w, y, r);
}

// ---- HCA: ratio candidates (128), one-pass pool --------------------------------------------

__device__ __forceinline__ void cp_async16(void* smem, const void* g) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

constexpr int kHcaSlots = 8;  // ring slots per thread: 7 candidates in flight while one is folded

// V channels a thread (4: 128 threads a window, the default; 2: 256 threads, KVCORE_DSV4_PREFILL
// =hca2, twice the warps for the same bytes in flight). A ring entry is V floats (c, z) and V ape
// values; each copy is 4 V bytes (2 V for f16 ape).
template <int V>
struct HcaRing {
  static constexpr int kThreads = 512 / V;
  using Vec = typename std::conditional<V == 4, float4, float2>::type;
  // [slot][c, z, ape][thread] Vec, then the finishing's shared floats (128 quad sums + 4).
  static constexpr size_t bytes() { return static_cast<size_t>(kHcaSlots) * 3 * kThreads * sizeof(Vec) + 132 * sizeof(float); }
};

template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* g) {
  if constexpr (kBytes == 16) {
    cp_async16(smem, g);
  } else {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(g), "n"(kBytes) : "memory");
  }
}

__device__ __forceinline__ float vec_at(const float4& v, int i) { return quad_at(v, i); }
__device__ __forceinline__ float vec_at(const float2& v, int i) { return i == 0 ? v.x : v.y; }

// Each thread copies and later reads only its own ring entries: cp.async.wait_group makes
// them visible to it, so the ring needs no barrier. Slot j % S is refilled (candidate
// j + S - 1, issued in iteration j) only after candidate j - 1, its previous content, was
// read and folded in iteration j - 1.
template <int V>
__global__ void __launch_bounds__(HcaRing<V>::kThreads, 4) prefill_hca_kernel(const CompressorParams p, const FastGrid g) {
  using R = HcaRing<V>;
  using Vec = typename R::Vec;
  constexpr int T = R::kThreads;
  extern __shared__ __align__(16) unsigned char hca_smem[];
  if (edge_block<false>(p, g, reinterpret_cast<float*>(hca_smem))) return;  // the ring's space
  state_slice(p, g);
  Vec* ring = reinterpret_cast<Vec*>(hca_smem);
  float* scratch = reinterpret_cast<float*>(ring + kHcaSlots * 3 * T);
  const int t = static_cast<int>(threadIdx.x), d = V * t;
  const int64_t w = g.wa + fast_block(g);
  const int32_t m = p.ratio;
  const int64_t t0 = w * m - p.pos;
  // Next candidate to issue: its sources (advanced by a stride each) and its ring slot.
  const float* cn = p.c + t0 * p.c_stride + d;
  const float* zn = p.z + t0 * p.z_stride + d;
  const char* an = static_cast<const char*>(p.ape) + (p.ape_f16 ? 2 : 4) * static_cast<int64_t>(d);
  const int64_t a_step = (p.ape_f16 ? 2 : 4) * p.ape_stride;
  int32_t next = 0;
  const auto issue = [&]() {
    Vec* slot = ring + (next % kHcaSlots) * 3 * T + t;
    cp_async<4 * V>(slot, cn);
    cp_async<4 * V>(slot + T, zn);
    if (p.ape_f16) {
      cp_async<2 * V>(slot + 2 * T, an);
    } else {
      cp_async<4 * V>(slot + 2 * T, an);
    }
    cn += p.c_stride;
    zn += p.z_stride;
    an += a_step;
    ++next;
  };
#pragma unroll
  for (int j = 0; j < kHcaSlots - 1; ++j) {
    if (j < m) issue();
    cp_async_commit();  // empty groups too: the wait count below stays exact
  }
  // Rope angles of the tail's pairs, by the warp that holds the tail (the last one).
  QuadRope r{};
  float sn = 0.0f, cs = 0.0f;
  if (t >= T - 32) {
    if constexpr (V == 4) {
      r = quad_rope_angles(p, w);
    } else {
      math::sincos_f32(math::rope_angle(static_cast<float>(w * m), p.rope.freq[t - (T - 32)]), &sn, &cs);
    }
  }
  math::Dsv4OnlineFold fold[V];
  for (int32_t j = 0; j < m; ++j) {
    if (next < m) issue();  // candidate j + kHcaSlots - 1
    cp_async_commit();
    cp_async_wait<kHcaSlots - 1>();  // candidate j has landed
    const Vec* slot = ring + (j % kHcaSlots) * 3 * T + t;
    const Vec c = slot[0], z = slot[T], a_raw = slot[2 * T];
    float a[V];
    if (p.ape_f16) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const uint32_t bits = __float_as_uint(vec_at(a_raw, v / 2));
        a[v] = math::f16_bits_to_f32(static_cast<uint16_t>(v % 2 ? bits >> 16 : bits & 0xffffu));
      }
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) a[v] = vec_at(a_raw, v);
    }
#pragma unroll
    for (int v = 0; v < V; ++v) fold[v].add(vec_at(z, v) + a[v], vec_at(c, v));
  }
  float y[V];
#pragma unroll
  for (int v = 0; v < V; ++v) y[v] = fold[v].result();
  if constexpr (V == 4) {
    finish_attention_quad(p, w, y, r, scratch);
  } else {
    finish_attention_pair(p, w, y, sn, cs, scratch);
  }
}

template <int V>
void launch_hca(const CompressorParams& p, const FastGrid& g, int64_t blocks, Stream s) {
  const void* k = reinterpret_cast<const void*>(prefill_hca_kernel<V>);  // per device: set on every launch
  const size_t bytes = HcaRing<V>::bytes();
  KVCORE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  KVCORE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  prefill_hca_kernel<V><<<static_cast<unsigned>(blocks), HcaRing<V>::kThreads, bytes, native(s)>>>(p, g);
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
    if (!p.overlap && p.state_rows != 8) return FastShape::Hca;  // 8 rows: the three-pass pool (dsv4_pool_any)
    return FastShape::None;
  }
  if (p.kind == 1 && p.head_dim == math::kHadamardDim && eight) {
    const bool rows = p.rows_packed ? aligned(p.rows, 4) && p.rows_stride % 2 == 0 : aligned(p.rows, 16) && p.rows_stride % 4 == 0;
    return rows ? FastShape::Indexer : FastShape::None;
  }
  return FastShape::None;
}

// KVCORE_DSV4_PREFILL: unset or "fast" (default), "generic" (fast path off), and CSA variants:
// "fast5" (the quad kernel at 5 blocks an SM), "pair3" / "pair4" (2 channels a thread, 3 or 4
// blocks of 256 an SM); HCA: "hca2" (2 channels a thread).
const char* variant() {
  const char* v = std::getenv("KVCORE_DSV4_PREFILL");
  return v ? v : "fast";
}
bool fast_path_enabled() { return std::strcmp(variant(), "generic") != 0; }

constexpr int64_t kMaxGrid = 65535LL * 1024;  // far below grid.x's 2^31 - 1

}  // namespace

bool prefill_fast(const CompressorParams& p, Stream s, bool* state_done) {
  *state_done = false;
  const FastShape shape = fast_shape(p);
  if (!fast_path_enabled() || shape == FastShape::None) return false;
  const int64_t w0 = p.pos / p.ratio, w1 = (p.pos + p.n_tokens) / p.ratio;
  // The first window whose candidates (and, with overlap, the previous window's) are all in the chunk.
  const int64_t first = (p.pos + p.ratio - 1) / p.ratio + (p.overlap ? 1 : 0);
  const int64_t wa = first < w0 ? w0 : (first > w1 ? w1 : first);
  if (wa >= w1) return false;  // no fast window: the general kernel alone
  const char* v = variant();
  const bool hca2 = shape == FastShape::Hca && std::strcmp(v, "hca2") == 0;
  const bool pair = shape == FastShape::Csa && std::strncmp(v, "pair", 4) == 0;
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
      if (std::strcmp(v, "fast5") == 0) {
        prefill_csa_quad_kernel<5><<<grid, 128, 0, native(s)>>>(p, g);
      } else if (std::strcmp(v, "pair3") == 0) {
        prefill_csa_pair_kernel<3><<<grid, 256, 0, native(s)>>>(p, g);
      } else if (pair) {
        prefill_csa_pair_kernel<4><<<grid, 256, 0, native(s)>>>(p, g);
      } else {
        prefill_csa_quad_kernel<4><<<grid, 128, 0, native(s)>>>(p, g);
      }
      KVCORE_CUDA_CHECK_LAUNCH("dsv4 prefill_csa kernel");
    } else if (shape == FastShape::Indexer) {
      prefill_indexer_quad_kernel<<<grid, 128, 0, native(s)>>>(p, g);
      KVCORE_CUDA_CHECK_LAUNCH("dsv4 prefill_indexer_quad_kernel");
    } else if (hca2) {
      launch_hca<2>(p, g, blocks, s);
    } else {
      launch_hca<4>(p, g, blocks, s);
    }
    if (g.state) *state_done = true;
    g.n_edge = 0;  // edge windows and the state in the first launch only
    g.state = 0;
    w += n;
  }
  return true;
}

}  // namespace kvcore::dsv4::cuda
