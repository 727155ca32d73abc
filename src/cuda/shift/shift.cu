// CUDA shift kernels.
//
// shift_dense: one persistent kernel per group of layers moves every retained
// byte once (one read, one write), whatever the overlap, without a scratch
// copy of the cache. Token j moves from n_keep + D + j to n_keep + j
// (D = n_discard), so writing token j overwrites the source of token j - D
// and nothing else. Split the moved tokens into bands of D tokens: a write in
// band b only clobbers sources of band b - 1. Work is cut into tiles (a token
// range inside one band x a range of heads of one tensor, <= 16 KB) numbered
// band-major; each block takes a ticket (atomic counter), reads its tile into
// shared memory, counts the tile as read for its band, takes its next ticket,
// rotates K heads in shared memory, waits until every tile of band b - 1 has
// been read, then writes. Every ticket below one a block holds was taken by a
// block that is running (blocks never yield), a block's tickets come in
// increasing order and reading never waits, so the lowest unfinished tile can
// always finish: no deadlock, no co-residency assumption, one launch for all
// bands (plus one memset of the counters). tests/shift_tiling_test.cpp
// replays this protocol under random interleavings.
//
// The single tile kernel keeps its ticket counter even without overlap: the counter
// balances blocks that run at different speeds, which static dealing cannot.
//
// Which kernel runs is one rule, src/cuda/shift/shift_kernel_choice.hpp. The chain kernel
// (src/cuda/shift/shift_chain.hpp) needs no ordering between threads at all:
// a thread owns the units at one row position u of the tokens r, r + D,
// r + 2D, ... and walks them in order, so whatever it overwrites it has read
// itself. No shared-memory staging, no atomics, no barriers after the first,
// no counters to clear: loads go straight into registers (kItems units per
// thread in flight), rotations happen there with the layer's cos/sin from
// shared memory; FP8 keys (64- or 128-dim heads, fully rotated) get a thread per
// head in a second launch. Other layouts (FP8 keys with partial rotary or bigger
// heads, interleaved pairs in rows aligned to one element) take the single tile
// kernel. The sweep kernel (src/cuda/shift/shift_sweep.hpp) is written like a plain
// copy: one index of 16-byte chunks over all tensors that blocks walk in 16 KB tickets,
// K rotated in registers (NeoX partners by warp shuffle); it serves 16-bit rows
// without overlap.
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

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/shift/shift_chain.hpp"
#include "cuda/shift/shift_kernel_choice.hpp"
#include "cuda/shift/shift_sweep.hpp"
#include "cuda/shift/shift_tiling.hpp"
#include "kvcore/math/shift_rotate.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::ops::cuda {
namespace {

using math::RopeLayout;
using ops::ShiftKind;
using ops::ShiftTensorParams;
using shift_plan::kTileBytes;
using shift_plan::LaunchParams;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMinBlocks = 8;  // resident blocks per SM we ask registers for: 128 KB of tiles in flight

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
  __shared__ float s_scratch[kFp8 ? kWarps * ops::kShiftFp8ScratchDims : 1];
  __shared__ int s_ticket, s_layer;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) s_layer = -1;
  const int64_t D = p.n_discard;

  if (tid == 0) s_ticket = atomicAdd(p.counters, 1);
  for (;;) {
    __syncthreads();  // ticket visible; the previous tile's stores have read their shared memory
    const int ticket = s_ticket;
    if (ticket >= p.total_tiles) break;

    const shift_plan::Tile tl = shift_plan::decode_ticket(p, ticket);
    const int b = tl.band, nt = tl.nt, h0 = tl.h0, nh = tl.nh;
    const int64_t t0 = tl.t0;
    const shift_plan::TileStream& st = p.streams[tl.stream];
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
    int next_ticket = 0;
    if (tid == 0) {
      if (new_layer) s_layer = st.t.layer;
      atomicAdd(p.counters + 1 + b, 1);  // this tile's sources may now be overwritten
      // Take the next ticket now: its latency hides behind the rotation and the stores. Still
      // deadlock-free: a block's next ticket is above its current one, so the lowest unfinished
      // tile is always either running or held by a block whose current tile is done.
      next_ticket = atomicAdd(p.counters, 1);
    }

    if (rotates) {
      const RopeLayout l = p.layout[st.t.layer];
      const WarpLanes lanes{lane};
      float* scratch = kFp8 ? s_scratch + warp * ops::kShiftFp8ScratchDims : nullptr;
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
    if (tid == 0) s_ticket = next_ticket;  // every thread read s_ticket before the last barrier
  }
}


template <class Kernel>
int resident_blocks(Kernel* k, int device) {
  // Ask for the largest shared-memory carveout: the occupancy below is what the launch gets.
  KVCORE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  int per_sm = 0;
  KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, 0));
  return std::max(per_sm, 1) * sm_count(device);
}

// Resident blocks of the tile kernel on the whole device (cached with the kernel's
// attributes, which are per device; call under workspace_mutex()).
int blocks_per_sm(int device, bool fp8) {
  static std::map<std::pair<int, bool>, int> cache;
  int& n = cache[{device, fp8}];
  if (n == 0) n = fp8 ? resident_blocks(shift_dense_kernel<true>, device) : resident_blocks(shift_dense_kernel<false>, device);
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
  __shared__ float s_scratch[kFp8 ? kWarps * ops::kShiftFp8ScratchDims : 1];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const RopeLayout l = p.table.layout;
  for (int i = tid; i < l.n_pairs(); i += kThreads) s_freq[i] = p.table.freq[i];
  const WarpLanes lanes{lane};
  float* scratch = kFp8 ? s_scratch + warp * ops::kShiftFp8ScratchDims : nullptr;
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

}  // namespace

void shift_dense(const ops::ShiftDenseParams& p, Stream stream) {
  KVCORE_CUDA_CHECK(cudaSetDevice(p.device_index));
  const cudaStream_t s = native(stream);
  const shift_plan::Plan plan = shift_plan::make_plan(p);  // throws before any work is queued
  const int64_t counters_per_launch = 1 + plan.n_bands;
  const size_t ws_bytes = sizeof(int) * static_cast<size_t>(counters_per_launch) * plan.launches.size();
  const std::lock_guard<std::mutex> lock(workspace_mutex());
  ShiftKernel kernel = choose_shift_kernel(p.kernel, ShiftCall{plan.any_fp8, p.n_discard < p.n_moved, plan.any_dsv4});
  if (kernel == ShiftKernel::Sweep) {
    int* counters = nullptr;  // the sweep kernel's tickets (one counter per launch)
    if (plan.n_bands == 1) {
      const size_t bytes = sizeof(int) * 2 * plan.launches.size();
      counters = workspace(p.device_index, s, bytes);
      KVCORE_CUDA_CHECK(cudaMemsetAsync(counters, 0, bytes, s));
    }
    if (shift_sweep::launch(plan, p.device_index, s, counters)) return;
    kernel = ShiftKernel::Single;  // overlap, or a layout the sweep kernel does not handle
  }
  if (kernel == ShiftKernel::Chain) {
    if (shift_chain::launch(plan, p.device_index, s)) return;
    kernel = ShiftKernel::Single;  // a layout the chain kernels do not handle (or too many columns for 32 bits)
  }
  const int max_blocks = blocks_per_sm(p.device_index, plan.any_fp8);
  int* ws = workspace(p.device_index, s, ws_bytes);
  KVCORE_CUDA_CHECK(cudaMemsetAsync(ws, 0, ws_bytes, s));
  for (size_t g = 0; g < plan.launches.size(); ++g) {
    LaunchParams& L = *plan.launches[g];
    L.counters = ws + g * counters_per_launch;
    const int grid = static_cast<int>(std::min<int64_t>(L.total_tiles, max_blocks));
    if (plan.any_fp8) shift_dense_kernel<true><<<grid, kThreads, 0, s>>>(L);
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

}  // namespace kvcore::ops::cuda
