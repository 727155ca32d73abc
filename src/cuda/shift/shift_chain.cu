// The chain form of shift_dense (the default kernel): see src/cuda/shift/shift_chain.hpp
// for why threads need no ordering between them. Each thread walks its columns
// with kItems items in flight: loads straight into registers, a rotation there
// for units that hold pairs, stores. One barrier (the cos/sin table into shared
// memory), no atomics, no counters.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/fp8_hw.cuh"
#include "cuda/shift/shift_chain.hpp"
#include "cuda/shift/shift_chunk_io.cuh"

namespace kvcore::ops::cuda {
namespace {

constexpr int kChainThreads = 256;
constexpr int kChainMinBlocks = 3;  // 768 threads x kItems units in flight per SM; <= 85 registers

// f(std::integral_constant<int, i>) for i = 0 .. kItems - 1, unrolled.
template <class F, int... I>
__device__ __forceinline__ void each_item_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <class F>
__device__ __forceinline__ void each_item(F&& f) {
  each_item_impl(f, std::make_integer_sequence<int, shift_chain::kItems>{});
}

__global__ void __launch_bounds__(kChainThreads, kChainMinBlocks)
    shift_chain_kernel(const __grid_constant__ shift_chain::Params p) {
  using shift_chain::kItems;
  __shared__ float s_cos[shift_plan::kMaxPairsTotal], s_sin[shift_plan::kMaxPairsTotal];
  for (int i = threadIdx.x; i < p.n_pairs; i += kChainThreads) {
    s_cos[i] = p.cos_t[i];
    s_sin[i] = p.sin_t[i];
  }
  __syncthreads();  // the only barrier
  const uint32_t n_threads = gridDim.x * kChainThreads;  // <= total_cols < 2^31
  shift_chain::Cursor cur = shift_chain::first_cursor(p, blockIdx.x * kChainThreads + threadIdx.x);
  // Items live in registers: every array below is indexed by compile-time constants only
  // (each_item unrolls by hand; a loop the compiler declined to unroll put them in local memory).
  for (;;) {
    shift_chain::Item it[kItems];
    bool ok[kItems];
    Chunk a[kItems], b[kItems];
    each_item([&](auto I) { ok[I] = shift_chain::next_item(p, n_threads, cur, it[I]); });
    if (!ok[0]) break;
    // every load of the group before any store: the steps of one column come in order, and a
    // step's store only overwrites the source of the step before it, loaded above or earlier
    each_item([&](auto I) {
      a[I] = b[I] = Chunk{};
      if (ok[I]) {
        const int vec = p.streams[it[I].stream].vec;
        a[I] = load_chunk(it[I].src, vec);
        if (it[I].partner) b[I] = load_chunk(it[I].src + it[I].partner, vec);
      }
    });
    each_item([&](auto I) {
      if (ok[I]) {
        const shift_chain::Stream& st = p.streams[it[I].stream];
        if (it[I].pair0 >= 0) shift_chain::rotate_item(st, it[I], a[I], b[I], s_cos, s_sin);
        uint8_t* dst = it[I].src - p.n_discard * st.token_stride;
        store_chunk(dst, a[I], st.vec);
        if (it[I].partner) store_chunk(dst + it[I].partner, b[I], st.vec);
      }
    });
  }
}

// ---- FP8 keys: one thread per head (shift_chain.hpp) ----------------------------------------
constexpr int kFp8MinBlocks = 2;  // <= 128 registers: 32 hold the head, the rest its two passes

struct Fp8HwCodec {  // hardware conversions: the same codes as math/fp8.hpp (fp8_hw.cuh)
  __device__ static void decode2(uint32_t two, float& a, float& b) {
    const float2 f = fp8_hw::decode2(two);
    a = f.x, b = f.y;
  }
  __device__ static uint32_t encode2(float a, float b, float inv) { return fp8_hw::encode2_scaled(a, b, inv); }
};

template <int HD, bool kInterleaved>
__global__ void __launch_bounds__(kChainThreads, kFp8MinBlocks)
    shift_chain_fp8_kernel(const __grid_constant__ shift_chain::Params p) {
  __shared__ float s_cos[shift_plan::kMaxPairsTotal], s_sin[shift_plan::kMaxPairsTotal];
  for (int i = threadIdx.x; i < p.n_pairs; i += kChainThreads) {
    s_cos[i] = p.cos_t[i];
    s_sin[i] = p.sin_t[i];
  }
  __syncthreads();  // the only barrier
  const uint32_t n_threads = gridDim.x * kChainThreads;
  shift_chain::Fp8Cursor cur = shift_chain::first_fp8_cursor(p, blockIdx.x * kChainThreads + threadIdx.x);
  uint8_t* src;
  uint8_t* sc;
  int32_t stream;
  // One head at a time: its HD / 16 loads are in flight together. A step's store only
  // overwrites the head this thread loaded one step before.
  while (shift_chain::next_fp8(p, n_threads, cur, src, sc, stream)) {
    uint32_t w[HD / 4];
    uint8_t scales[HD / 64];
#pragma unroll
    for (int v = 0; v < HD / 16; ++v) {
      const uint4 x = *reinterpret_cast<const uint4*>(src + 16 * v);  // cached: the warp's loads share lines
      w[4 * v] = x.x, w[4 * v + 1] = x.y, w[4 * v + 2] = x.z, w[4 * v + 3] = x.w;
    }
#pragma unroll
    for (int b = 0; b < HD / 64; ++b) scales[b] = sc[b];
    const shift_chain::Stream& st = p.streams[stream];
    shift_chain::rotate_fp8_head<HD, kInterleaved, Fp8HwCodec>(w, scales, s_cos + st.pair_base, s_sin + st.pair_base);
    uint8_t* dst = src - p.n_discard * st.token_stride;
    uint8_t* sc_dst = sc - p.n_discard * st.scale_stride;
#pragma unroll
    for (int v = 0; v < HD / 16; ++v)
      *reinterpret_cast<uint4*>(dst + 16 * v) = make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
#pragma unroll
    for (int b = 0; b < HD / 64; ++b) sc_dst[b] = scales[b];
  }
}

template <class Kernel>
int64_t resident_threads(Kernel* k, int device) {
  int per_sm = 0;
  KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kChainThreads, 0));
  return int64_t{std::max(per_sm, 1)} * sm_count(device) * kChainThreads;
}

// Threads of a chain kernel resident on the whole device (fp8_hd 0: the main kernel).
int64_t chain_resident_threads(int device, int fp8_hd, bool interleaved) {
  static std::mutex m;
  static std::map<std::tuple<int, int, bool>, int64_t> cache;
  const std::lock_guard<std::mutex> lock(m);
  int64_t& n = cache[{device, fp8_hd, interleaved}];
  if (n == 0) {
    if (fp8_hd == 0) n = resident_threads(shift_chain_kernel, device);
    else if (fp8_hd == 64) n = interleaved ? resident_threads(shift_chain_fp8_kernel<64, true>, device)
                                           : resident_threads(shift_chain_fp8_kernel<64, false>, device);
    else n = interleaved ? resident_threads(shift_chain_fp8_kernel<128, true>, device)
                         : resident_threads(shift_chain_fp8_kernel<128, false>, device);
  }
  return n;
}

}  // namespace

bool shift_chain::launch(const shift_plan::Plan& plan, int device, void* stream) {
  const auto launches = make_launches(plan);
  if (launches.empty()) return false;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (const auto& P : launches) {
    if (P->total_cols == 0) continue;
    const int hd = P->fp8_head_dim;
    const bool il = P->fp8_interleaved != 0;
    const int64_t resident = chain_resident_threads(device, hd, il);
    // as many threads as fit, each with the same number of columns (no straggler round)
    const int64_t rounds = (P->total_cols + resident - 1) / resident;
    const int64_t threads = (P->total_cols + rounds - 1) / rounds;
    const int grid = static_cast<int>((threads + kChainThreads - 1) / kChainThreads);
    if (hd == 0) shift_chain_kernel<<<grid, kChainThreads, 0, s>>>(*P);
    else if (hd == 64 && il) shift_chain_fp8_kernel<64, true><<<grid, kChainThreads, 0, s>>>(*P);
    else if (hd == 64) shift_chain_fp8_kernel<64, false><<<grid, kChainThreads, 0, s>>>(*P);
    else if (il) shift_chain_fp8_kernel<128, true><<<grid, kChainThreads, 0, s>>>(*P);
    else shift_chain_fp8_kernel<128, false><<<grid, kChainThreads, 0, s>>>(*P);
    KVCORE_CUDA_CHECK_LAUNCH("shift_chain_kernel");
  }
  return true;
}

}  // namespace kvcore::ops::cuda
