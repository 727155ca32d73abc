// Trace stamps of the tensor-core decode kernel (Path::LeanTrace in attention_mma.cuh, run by
// `kvcore bench decode_trace`): lane 0 of each warp stamps %globaltimer at kTraceStamps points of
// the warp's life (entry, prologue issued, q ready, first tile ready, loop done, partial written)
// and its SM id, at trace[(cta * W + warp) * kTraceSlots + point]: a timeline of where CTAs spend
// time. With ON false a mark compiles to nothing.
#pragma once
#include <cstdint>

namespace kvcore::ops::cuda::mma_attn {

constexpr int kTraceStamps = 6;
constexpr int kTraceSlots = 8;  // the stamps, the SM id, a spare

template <bool ON, int W>
__device__ __forceinline__ void trace_mark(unsigned long long* trace, int point) {
  if constexpr (ON) {
    if (threadIdx.x % 32 != 0) return;
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns)::"memory");
    unsigned long long* w = trace + (int64_t{blockIdx.x} * W + threadIdx.x / 32) * kTraceSlots;
    w[point] = ns;
    if (point == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      w[kTraceStamps] = sm;
    }
  } else {
    (void)trace, (void)point;
  }
}

}  // namespace kvcore::ops::cuda::mma_attn
