// CUDA shift kernels.
//
// shift_dense: one persistent kernel per group of layers moves every retained
// byte once (one read, one write), whatever the overlap, without a scratch
// copy of the cache. Token j moves from n_keep + D + j to n_keep + j
// (D = n_discard), so writing token j overwrites the source of token j - D
// and nothing else. Split the moved tokens into bands of D tokens: a write in
// band b only clobbers sources of band b - 1. Work is cut into tiles (a token
// range inside one band x a range of heads of one tensor, <= 16 KB) numbered
// band-major; each block takes the next ticket (atomic counter), reads its
// tile into shared memory, counts the tile as read for its band, rotates K
// heads in shared memory, waits until every tile of band b - 1 has been read,
// then writes. Every ticket below the one a block holds was taken by a block
// that is running (blocks never yield), and reading never waits, so the
// lowest unfinished tile can always finish: no deadlock, no co-residency
// assumption, one launch for all bands (plus one memset of the counters).
//
// rope_shift_rows: one block per row (grid-stride), one warp per head,
// rotating in place in global memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/check.cuh"
#include "kvcore/math/shift_rotate.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::cuda {
namespace {

using math::RopeLayout;
using ops::ShiftKind;
using ops::ShiftTensorParams;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileBytes = 16384;
constexpr int kMinBlocks = 8;       // resident blocks per SM we ask registers for: 128 KB of tiles in flight
constexpr int kMaxStreams = 80;      // tensors per launch
constexpr int kMaxLayers = 64;       // layers per launch
constexpr int kMaxPairsTotal = 2048;  // cos/sin entries per launch

// A warp as the Lanes of math/shift_rotate.hpp.
struct WarpLanes {
  int32_t lane;
  static constexpr int32_t count = 32;
  KVCORE_HD void sync() const {
#if defined(__CUDA_ARCH__)
    __syncwarp();
#endif
  }
  KVCORE_HD float reduce_max(float v) const {
#if defined(__CUDA_ARCH__)
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
    return v;
  }
};

// One tensor of a launch plus how it is cut into tiles.
struct TileStream {
  ShiftTensorParams t;
  int32_t heads_per_chunk, n_chunks, tokens_per_tile;
  int32_t vec, scale_vec;  // widest aligned access, bytes
};

// Everything a launch needs, passed by value (__grid_constant__, < 32 KB).
struct LaunchParams {
  int64_t n_keep, n_discard, n_moved;
  int32_t n_streams, n_bands;
  int32_t tiles_full, tiles_last;  // tiles of a full band / of the last band, all streams
  int64_t total_tiles;
  int* counters;  // [0]: next ticket; [1 + b]: tiles of band b already read
  int32_t prefix_full[kMaxStreams + 1], prefix_last[kMaxStreams + 1];  // tile offsets per stream in a band
  TileStream streams[kMaxStreams];
  RopeLayout layout[kMaxLayers];
  int32_t pair_offset[kMaxLayers];
  float cos_t[kMaxPairsTotal], sin_t[kMaxPairsTotal];
};
static_assert(sizeof(LaunchParams) < 32000, "kernel parameters are limited to 32764 bytes");

// ---- tile copies between global and shared memory -----------------------------------
// Loads go global -> shared with cp.async (no register staging, so a block
// keeps its whole 16 KB tile in flight); 1- and 2-byte rows use plain loads.
template <int N>
__device__ __forceinline__ void cp_async(uint8_t* smem, const uint8_t* g) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(g), "n"(N) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void load_rows(uint8_t* smem, const uint8_t* g, int64_t stride, int rows, int row_bytes) {
  const int per_row = row_bytes / N;
  const int n = rows * per_row;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int row = i / per_row, col = i - row * per_row;
    const uint8_t* from = g + row * stride + col * N;
    if constexpr (N >= 4) cp_async<N>(smem + i * N, from);
    else if constexpr (N == 2) reinterpret_cast<uint16_t*>(smem)[i] = *reinterpret_cast<const uint16_t*>(from);
    else smem[i] = *from;
  }
}

template <class V>
__device__ __forceinline__ void store_rows(uint8_t* g, const uint8_t* smem, int64_t stride, int rows, int row_bytes) {
  const int per_row = row_bytes / static_cast<int>(sizeof(V));
  const int n = rows * per_row;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int row = i / per_row, col = i - row * per_row;
    *reinterpret_cast<V*>(g + row * stride + col * static_cast<int>(sizeof(V))) = reinterpret_cast<const V*>(smem)[i];
  }
}

// Issues the loads; cp_async_wait_all() + __syncthreads() make them visible.
__device__ __forceinline__ void load_rows_any(int vec, uint8_t* s, const uint8_t* g, int64_t stride, int rows, int bytes) {
  switch (vec) {
    case 16: load_rows<16>(s, g, stride, rows, bytes); break;
    case 8: load_rows<8>(s, g, stride, rows, bytes); break;
    case 4: load_rows<4>(s, g, stride, rows, bytes); break;
    case 2: load_rows<2>(s, g, stride, rows, bytes); break;
    default: load_rows<1>(s, g, stride, rows, bytes); break;
  }
}

__device__ __forceinline__ void store_rows_any(int vec, uint8_t* g, const uint8_t* s, int64_t stride, int rows, int bytes) {
  switch (vec) {
    case 16: store_rows<uint4>(g, s, stride, rows, bytes); break;
    case 8: store_rows<uint2>(g, s, stride, rows, bytes); break;
    case 4: store_rows<uint32_t>(g, s, stride, rows, bytes); break;
    case 2: store_rows<uint16_t>(g, s, stride, rows, bytes); break;
    default: store_rows<uint8_t>(g, s, stride, rows, bytes); break;
  }
}

// Rotate one head (codes at `head`, FP8 scales at `scales`) in any K format.
__device__ __forceinline__ void rotate_head(ShiftKind kind, uint8_t* head, uint8_t* scales, const RopeLayout& l,
                                            const float* c, const float* s, float* scratch, const WarpLanes& lanes) {
  switch (kind) {
    case ShiftKind::Copy: break;
    case ShiftKind::F32: math::shift_rotate_head_plain(reinterpret_cast<float*>(head), 0, l, c, s, lanes); break;
    case ShiftKind::F16: math::shift_rotate_head_plain(reinterpret_cast<f16*>(head), 0, l, c, s, lanes); break;
    case ShiftKind::BF16: math::shift_rotate_head_plain(reinterpret_cast<bf16*>(head), 0, l, c, s, lanes); break;
    case ShiftKind::Dsv4: math::shift_rotate_head_dsv4(head, l, c, s, lanes); break;
    case ShiftKind::Fp8: math::shift_rotate_head_fp8(head, scales, l, c, s, scratch, lanes); break;
  }
}

constexpr int align16(int x) { return (x + 15) & ~15; }

// ---- shift_dense -----------------------------------------------------------------------
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, kMinBlocks) shift_dense_kernel(const __grid_constant__ LaunchParams p) {
  __shared__ __align__(16) uint8_t tile[kTileBytes];
  __shared__ float s_cos[math::RopeTable::kMaxPairs], s_sin[math::RopeTable::kMaxPairs];
  __shared__ float s_scratch[kFp8 ? kWarps * ops::kShiftMaxFp8HeadDim : 1];
  __shared__ int s_ticket, s_layer;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) s_layer = -1;
  const int64_t D = p.n_discard;

  for (;;) {
    if (tid == 0) s_ticket = atomicAdd(p.counters, 1);
    __syncthreads();  // ticket visible; the previous tile's stores have read their shared memory
    const int ticket = s_ticket;
    if (ticket >= p.total_tiles) break;

    // ticket -> (band, stream, token tile, head chunk)
    int b, o;
    bool last;
    if (p.n_bands == 1) {
      b = 0, o = ticket, last = true;
    } else {
      b = ticket / p.tiles_full;
      last = b >= p.n_bands - 1;
      if (last) b = p.n_bands - 1;
      o = ticket - b * p.tiles_full;
    }
    const int32_t* prefix = last ? p.prefix_last : p.prefix_full;
    int lo = 0, hi = p.n_streams;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (prefix[mid] <= o) lo = mid;
      else hi = mid;
    }
    const TileStream& st = p.streams[lo];
    const int j = o - prefix[lo];
    const int jt = j / st.n_chunks, c = j - jt * st.n_chunks;
    const int64_t band_begin = b * D;
    const int64_t band_end = last ? p.n_moved : band_begin + D;
    const int64_t t0 = band_begin + int64_t{jt} * st.tokens_per_tile;
    const int nt = static_cast<int>(min(int64_t{st.tokens_per_tile}, band_end - t0));
    const int h0 = c * st.heads_per_chunk;
    const int nh = min(st.heads_per_chunk, st.t.n_heads - h0);
    const int chunk_bytes = nh * st.t.head_bytes;
    const int scale_off = align16(nt * chunk_bytes);
    const int scale_chunk = nh * st.t.scale_head_bytes;
    const bool rotates = st.t.kind != ShiftKind::Copy;

    // read the tile (and cos/sin of its layer when they are not in shared memory yet)
    const int64_t src = p.n_keep + D + t0, dst = p.n_keep + t0;
    load_rows_any(st.vec, tile, st.t.base + src * st.t.token_stride + int64_t{h0} * st.t.head_bytes, st.t.token_stride,
                  nt, chunk_bytes);
    if (kFp8 && st.t.kind == ShiftKind::Fp8)
      load_rows_any(st.scale_vec, tile + scale_off,
                    st.t.maybe_scales + src * st.t.scale_token_stride + int64_t{h0} * st.t.scale_head_bytes,
                    st.t.scale_token_stride, nt, scale_chunk);
    const bool new_layer = rotates && st.t.layer != s_layer;
    if (new_layer) {
      const int n_pairs = p.layout[st.t.layer].n_pairs();
      const int off = p.pair_offset[st.t.layer];
      for (int i = tid; i < n_pairs; i += kThreads) {
        s_cos[i] = p.cos_t[off + i];
        s_sin[i] = p.sin_t[off + i];
      }
    }
    cp_async_wait_all();
    __syncthreads();  // every load of this tile has landed in shared memory
    if (tid == 0) {
      if (new_layer) s_layer = st.t.layer;
      atomicAdd(p.counters + 1 + b, 1);  // this tile's sources may now be overwritten
    }

    if (rotates) {
      const RopeLayout l = p.layout[st.t.layer];
      const WarpLanes lanes{lane};
      float* scratch = kFp8 ? s_scratch + warp * ops::kShiftMaxFp8HeadDim : nullptr;
      for (int u = warp; u < nt * nh; u += kWarps)
        rotate_head(st.t.kind, tile + u * st.t.head_bytes, tile + scale_off + u * st.t.scale_head_bytes, l, s_cos, s_sin,
                    scratch, lanes);
    }

    // wait until band b - 1 (whose sources these writes overwrite) has been read
    if (tid == 0 && b > 0) {
      const volatile int* done = p.counters + b;
      while (*done < p.tiles_full) __nanosleep(64);
      __threadfence();
    }
    __syncthreads();
    store_rows_any(st.vec, st.t.base + dst * st.t.token_stride + int64_t{h0} * st.t.head_bytes, tile, st.t.token_stride,
                   nt, chunk_bytes);
    if (kFp8 && st.t.kind == ShiftKind::Fp8)
      store_rows_any(st.scale_vec, st.t.maybe_scales + dst * st.t.scale_token_stride + int64_t{h0} * st.t.scale_head_bytes,
                     tile + scale_off, st.t.scale_token_stride, nt, scale_chunk);
  }
}

int widest_access(uintptr_t base, int64_t stride, int32_t head_bytes) {
  for (int v = 16; v > 1; v /= 2)
    if (base % v == 0 && stride % v == 0 && head_bytes % v == 0) return v;
  return 1;
}

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tiling of one stream: whole heads, as many tokens as fit in a tile (at most one band).
TileStream make_stream(const ShiftTensorParams& t, int64_t band_tokens) {
  TileStream s{};
  s.t = t;
  const int per_head = t.head_bytes + t.scale_head_bytes;
  const int budget = kTileBytes - (t.scale_head_bytes ? 16 : 0);  // room for the scales' alignment
  s.heads_per_chunk = std::max(1, std::min(t.n_heads, budget / per_head));
  s.n_chunks = static_cast<int32_t>(ceil_div64(t.n_heads, s.heads_per_chunk));
  s.tokens_per_tile = static_cast<int32_t>(std::clamp<int64_t>(budget / (s.heads_per_chunk * per_head), 1, band_tokens));
  s.vec = widest_access(reinterpret_cast<uintptr_t>(t.base), t.token_stride, t.head_bytes);
  s.scale_vec = t.maybe_scales ? widest_access(reinterpret_cast<uintptr_t>(t.maybe_scales), t.scale_token_stride, t.scale_head_bytes) : 1;
  return s;
}

int32_t tiles_in_band(const TileStream& s, int64_t band_tokens) {
  return static_cast<int32_t>(ceil_div64(band_tokens, s.tokens_per_tile) * s.n_chunks);
}

int sm_count(int device);

// Resident blocks of the shift kernel on the whole device (cached; call under workspace_mutex()).
int blocks_per_sm(int device, bool fp8) {
  static std::map<std::pair<int, bool>, int> cache;
  int& n = cache[{device, fp8}];
  if (n == 0) {
    int per_sm = 0;
    if (fp8) KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, shift_dense_kernel<true>, kThreads, 0));
    else KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, shift_dense_kernel<false>, kThreads, 0));
    n = std::max(per_sm, 1) * sm_count(device);
  }
  return n;
}

// ---- rope_shift_rows ----------------------------------------------------------------------
struct RowsLaunch {
  ShiftTensorParams k;
  int64_t rows;
  const int32_t* delta;
  math::RopeTable table;
};

template <bool kFp8>
__global__ void __launch_bounds__(kThreads) rope_shift_rows_kernel(const __grid_constant__ RowsLaunch p) {
  __shared__ float s_freq[math::RopeTable::kMaxPairs];
  __shared__ float s_cos[math::RopeTable::kMaxPairs], s_sin[math::RopeTable::kMaxPairs];
  __shared__ float s_scratch[kFp8 ? kWarps * ops::kShiftMaxFp8HeadDim : 1];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const RopeLayout l = p.table.layout;
  for (int i = tid; i < l.n_pairs(); i += kThreads) s_freq[i] = p.table.freq[i];
  const WarpLanes lanes{lane};
  float* scratch = kFp8 ? s_scratch + warp * ops::kShiftMaxFp8HeadDim : nullptr;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int32_t delta = p.delta[r];
    __syncthreads();  // s_freq ready; the previous row is done with s_cos / s_sin
    if (delta == 0) continue;
    for (int i = tid; i < l.n_pairs(); i += kThreads) math::shift_sincos(delta, s_freq[i], &s_sin[i], &s_cos[i]);
    __syncthreads();
    for (int h = warp; h < p.k.n_heads; h += kWarps) {
      uint8_t* head = p.k.base + r * p.k.token_stride + int64_t{h} * p.k.head_bytes;
      uint8_t* scales = kFp8 ? p.k.maybe_scales + r * p.k.scale_token_stride + int64_t{h} * p.k.scale_head_bytes : nullptr;
      rotate_head(p.k.kind, head, scales, l, s_cos, s_sin, scratch, lanes);
    }
  }
}

// The band counters live in a workspace kept per (device, stream): calls on one
// stream run in order, so they can share it; the lock also keeps one call's
// memset and kernels together in the stream. Never freed (a few KB per stream).
std::mutex& workspace_mutex() {
  static std::mutex m;
  return m;
}

int* workspace(int device, cudaStream_t s, size_t bytes) {
  static std::map<std::pair<int, cudaStream_t>, std::pair<int*, size_t>> cache;
  auto& e = cache[{device, s}];
  if (e.second < bytes) {
    if (e.first) {
      KVCORE_CUDA_CHECK(cudaStreamSynchronize(s));  // earlier shifts on this stream are done with it
      KVCORE_CUDA_CHECK(cudaFree(e.first));
      e = {nullptr, 0};
    }
    const size_t grown = std::max(bytes, size_t{1} << 16);
    KVCORE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&e.first), grown));
    e.second = grown;
  }
  return e.first;
}

int sm_count(int device) {
  int n = 0;
  KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

}  // namespace

void shift_dense(const ops::ShiftDenseParams& p, Stream stream) {
  KVCORE_CUDA_CHECK(cudaSetDevice(p.device_index));
  const cudaStream_t s = native(stream);
  const int64_t D = p.n_discard;
  const int64_t n_bands = ceil_div64(p.n_moved, D);
  KVCORE_CUDA_CHECK(n_bands < (int64_t{1} << 30) ? cudaSuccess : cudaErrorInvalidValue);
  const int64_t full_len = std::min(D, p.n_moved);
  const int64_t last_len = p.n_moved - (n_bands - 1) * D;

  // Group layers into launches that fit the parameter block.
  std::vector<std::unique_ptr<LaunchParams>> launches;
  std::vector<int32_t> layer_to_local(p.n_layers, -1);
  int32_t n_layers_here = 0, n_pairs_here = 0;
  LaunchParams* cur = nullptr;
  bool any_fp8 = false;
  for (int32_t i = 0; i < p.n_tensors; ++i) {
    const ShiftTensorParams& t = p.tensors[i];
    const int32_t layer = t.layer;
    const int32_t pairs = p.layouts[layer].n_pairs();
    // tensors of one layer are adjacent: count how many the layer has
    int32_t layer_tensors = 0;
    for (int32_t k = i; k < p.n_tensors && p.tensors[k].layer == layer; ++k) ++layer_tensors;
    if (layer_to_local[layer] < 0) {
      if (!cur || cur->n_streams + layer_tensors > kMaxStreams || n_layers_here + 1 > kMaxLayers ||
          n_pairs_here + pairs > kMaxPairsTotal) {
        launches.push_back(std::make_unique<LaunchParams>());
        cur = launches.back().get();
        *cur = LaunchParams{};
        n_layers_here = 0;
        n_pairs_here = 0;
      }
      layer_to_local[layer] = n_layers_here;
      cur->layout[n_layers_here] = p.layouts[layer];
      cur->pair_offset[n_layers_here] = n_pairs_here;
      for (int32_t q = 0; q < pairs; ++q) {
        cur->cos_t[n_pairs_here + q] = p.cos_t[p.pair_offset[layer] + q];
        cur->sin_t[n_pairs_here + q] = p.sin_t[p.pair_offset[layer] + q];
      }
      n_pairs_here += pairs;
      ++n_layers_here;
    }
    TileStream ts = make_stream(t, full_len);
    ts.t.layer = layer_to_local[layer];
    any_fp8 = any_fp8 || t.kind == ShiftKind::Fp8;
    cur->streams[cur->n_streams++] = ts;
  }

  for (auto& Lp : launches) {  // finish every launch's tiling first: errors come before any work is queued
    LaunchParams& L = *Lp;
    L.n_keep = p.n_keep;
    L.n_discard = D;
    L.n_moved = p.n_moved;
    L.n_bands = static_cast<int32_t>(n_bands);
    L.prefix_full[0] = L.prefix_last[0] = 0;
    for (int32_t k = 0; k < L.n_streams; ++k) {
      L.prefix_full[k + 1] = L.prefix_full[k] + tiles_in_band(L.streams[k], full_len);
      L.prefix_last[k + 1] = L.prefix_last[k] + tiles_in_band(L.streams[k], last_len);
    }
    L.tiles_full = L.prefix_full[L.n_streams];
    L.tiles_last = L.prefix_last[L.n_streams];
    L.total_tiles = (n_bands - 1) * int64_t{L.tiles_full} + L.tiles_last;
    if (L.total_tiles >= (int64_t{1} << 31) - kThreads * 1024)
      throw Error(ErrorCode::InvalidArgument, detail::concat("shift_dense: ", L.total_tiles,
                                                             " tiles exceed one launch; shift fewer tokens or layers per call"));
  }
  const int64_t counters_per_launch = 1 + n_bands;
  const size_t ws_bytes = sizeof(int) * static_cast<size_t>(counters_per_launch) * launches.size();
  const std::lock_guard<std::mutex> lock(workspace_mutex());
  const int max_blocks = blocks_per_sm(p.device_index, any_fp8);
  int* ws = workspace(p.device_index, s, ws_bytes);
  KVCORE_CUDA_CHECK(cudaMemsetAsync(ws, 0, ws_bytes, s));
  for (size_t g = 0; g < launches.size(); ++g) {
    LaunchParams& L = *launches[g];
    L.counters = ws + g * counters_per_launch;
    const int grid = static_cast<int>(std::min<int64_t>(L.total_tiles, max_blocks));
    if (any_fp8) shift_dense_kernel<true><<<grid, kThreads, 0, s>>>(L);
    else shift_dense_kernel<false><<<grid, kThreads, 0, s>>>(L);
    KVCORE_CUDA_CHECK_LAUNCH("shift_dense_kernel");
  }
}

void rope_shift_rows(const ops::RopeShiftRowsParams& p, Stream stream) {
  KVCORE_CUDA_CHECK(cudaSetDevice(p.device_index));
  const cudaStream_t s = native(stream);
  RowsLaunch L{};
  L.k = p.k;
  L.rows = p.rows;
  L.delta = p.delta;
  L.table = p.table;
  const int grid = static_cast<int>(std::min<int64_t>(p.rows, int64_t{sm_count(p.device_index)} * 8));
  if (p.k.kind == ShiftKind::Fp8) rope_shift_rows_kernel<true><<<grid, kThreads, 0, s>>>(L);
  else rope_shift_rows_kernel<false><<<grid, kThreads, 0, s>>>(L);
  KVCORE_CUDA_CHECK_LAUNCH("rope_shift_rows_kernel");
}

}  // namespace kvcore::cuda
