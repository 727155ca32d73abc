// The sweep form of shift_dense: see src/cuda/shift/shift_sweep.hpp. Each thread
// walks chunk positions t, t + T, ... of the band-major index space, kBatch at a
// time (every load of a batch before its stores), rotating K chunks in registers
// with the cos/sin its lane needs (kept in registers while the layer's table
// stays the same) and a NeoX partner's words from a shuffle; range streams
// (DeepSeek-V4 rows) rotate word by word with cos/sin from shared memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/shift/shift_sweep.hpp"

namespace kvcore::ops::cuda {
namespace {

using shift_chain::Chunk;

constexpr int kSweepThreads = 256;

// A chunk is 16 bytes, or 8 at the ends of a range. Loads may take the read-only path
// (ld.global.nc) when nothing the kernel reads is written while it runs.
__device__ __forceinline__ Chunk load_chunk(const uint8_t* g, int bytes, bool read_only) {
  if (bytes == 8) {
    const uint2 v = read_only ? __ldg(reinterpret_cast<const uint2*>(g)) : *reinterpret_cast<const uint2*>(g);
    return Chunk{{v.x, v.y, 0u, 0u}};
  }
  const uint4 v = read_only ? __ldg(reinterpret_cast<const uint4*>(g)) : *reinterpret_cast<const uint4*>(g);
  return Chunk{{v.x, v.y, v.z, v.w}};
}

__device__ __forceinline__ void store_chunk(uint8_t* g, const Chunk& c, int bytes) {
  if (bytes == 8) *reinterpret_cast<uint2*>(g) = make_uint2(c.w[0], c.w[1]);
  else *reinterpret_cast<uint4*>(g) = make_uint4(c.w[0], c.w[1], c.w[2], c.w[3]);
}

// This lane's cos/sin, for the (pair0, half) they were loaded for.
struct TrigCache {
  float c[8], s[8];
  int32_t key = INT_MIN;
};

// Loads a batch of chunks, rotates the K ones, stores them. Every branch depends on the warp
// only (stream), never on the lane, except src == nullptr (padding), which only skips a load
// or a store: the shuffles see all 32 lanes.
template <int kBatch, bool kRange>
__device__ __forceinline__ void move_batch(const shift_sweep::Params& p, const shift_sweep::Item (&it)[kBatch], int32_t lane,
                                           bool read_only, const float* s_cos, const float* s_sin, TrigCache& trig) {
  Chunk a[kBatch];
#pragma unroll
  for (int k = 0; k < kBatch; ++k)
    a[k] = it[k].src ? load_chunk(it[k].src, kRange ? it[k].bytes : 16, read_only) : Chunk{};
#pragma unroll
  for (int k = 0; k < kBatch; ++k) {
    if (it[k].s < 0) continue;
    const shift_sweep::Stream& st = p.streams[it[k].s];
    if constexpr (kRange) {
      if (it[k].src) shift_sweep::rotate_range_any(st, it[k], a[k], s_cos, s_sin);
    } else if (st.elem != shift_chain::kCopy) {
      const shift_sweep::Role r = shift_sweep::lane_role(st, lane);
      Chunk b{};
      if (st.half != 0) {
#pragma unroll
        for (int w = 0; w < 4; ++w) b.w[w] = __shfl_sync(0xffffffffu, a[k].w[w], lane + r.partner);
      }
      if (r.pair0 >= 0) {
        const int32_t key = 2 * r.pair0 + (r.partner > 0);
        if (key != trig.key) {
          shift_sweep::lane_trig(r, s_cos, s_sin, p.n_pairs, trig.c, trig.s);
          trig.key = key;
        }
        shift_sweep::rotate_any(st.elem, a[k], b, st.half != 0, trig.c, trig.s);
      }
    }
    if (it[k].src) store_chunk(it[k].src - st.band_step, a[k], kRange ? it[k].bytes : 16);
  }
}

__device__ __forceinline__ void load_tables(const shift_sweep::Params& p, float* s_cos, float* s_sin) {
  for (int i = threadIdx.x; i < p.n_pairs; i += kSweepThreads) {
    s_cos[i] = p.cos_t[i];
    s_sin[i] = p.sin_t[i];
  }
}

// Shifts without overlap (one band): blocks take tickets of kSweepThreads * kDynBatch
// contiguous chunk positions from a counter (zeroed by the caller), so blocks that run
// faster take more of them (the tile kernel's reason for its counter); the next ticket is
// taken while the current one moves. Nothing the kernel reads is written while it runs, so
// loads take the read-only path.
using shift_sweep::kDynBatch;
static_assert(shift_sweep::kDynThreads == kSweepThreads);
constexpr uint32_t kDynTicket = kSweepThreads * kDynBatch;

template <bool kRange>
__global__ void __launch_bounds__(kSweepThreads, 4)
    shift_sweep_dyn_kernel(const __grid_constant__ shift_sweep::Params p, int* counter) {
  __shared__ float s_cos[shift_sweep::kMaxPairs], s_sin[shift_sweep::kMaxPairs];
  __shared__ uint32_t s_ticket[2];
  load_tables(p, s_cos, s_sin);
  if (threadIdx.x == 0) s_ticket[0] = static_cast<uint32_t>(atomicAdd(counter, 1));
  __syncthreads();
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  const uint32_t n_tickets = p.band_len / kDynTicket;
  shift_sweep::Cursor cur;  // band 0; its stream only grows: a block's tickets increase
  TrigCache trig;
  for (int slot = 0;; slot ^= 1) {
    const uint32_t t = s_ticket[slot];
    if (t >= n_tickets) break;
    // s_ticket[slot ^ 1] was last read before the previous barrier
    if (threadIdx.x == 0) s_ticket[slot ^ 1] = static_cast<uint32_t>(atomicAdd(counter, 1));
    shift_sweep::Item it[kDynBatch];
#pragma unroll
    for (int k = 0; k < kDynBatch; ++k) {
      cur.pos = t * kDynTicket + k * kSweepThreads + threadIdx.x;
      it[k] = shift_sweep::locate(p, cur);
    }
    move_batch<kDynBatch, kRange>(p, it, lane, true, s_cos, s_sin, trig);
    __syncthreads();  // the next ticket is visible; every thread has read this one
  }
}

// Blocks of `kernel` resident on the whole device (cached per kernel and device).
int64_t resident_blocks(const void* kernel, int device) {
  static std::mutex m;
  static std::map<std::pair<const void*, int>, int64_t> cache;
  const std::lock_guard<std::mutex> lock(m);
  int64_t& n = cache[{kernel, device}];
  if (n == 0) {
    int per_sm = 0;
    KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kSweepThreads, 0));
    n = int64_t{std::max(per_sm, 1)} * sm_count(device);
  }
  return n;
}

}  // namespace

bool shift_sweep::launch(const shift_plan::Plan& plan, int device, void* stream, int* counters) {
  if (plan.n_bands != 1 || counters == nullptr) return false;  // overlap: the chunks of a band wait on the previous one
  auto launches = make_launches(plan);
  if (launches.empty()) return false;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (size_t g = 0; g < launches.size(); ++g) {
    shift_sweep::Params& P = *launches[g];
    const bool range = P.range != 0;
    P.band_len = static_cast<uint32_t>(round_up(P.width, kDynTicket));
    const void* k = range ? reinterpret_cast<const void*>(shift_sweep_dyn_kernel<true>)
                          : reinterpret_cast<const void*>(shift_sweep_dyn_kernel<false>);
    const int64_t blocks = std::min<int64_t>(resident_blocks(k, device), P.band_len / kDynTicket);
    if (range) shift_sweep_dyn_kernel<true><<<static_cast<unsigned>(blocks), kSweepThreads, 0, s>>>(P, counters + g);
    else shift_sweep_dyn_kernel<false><<<static_cast<unsigned>(blocks), kSweepThreads, 0, s>>>(P, counters + g);
    KVCORE_CUDA_CHECK_LAUNCH("shift_sweep_dyn_kernel");
  }
  return true;
}

}  // namespace kvcore::ops::cuda
