// Trace stamps of the tensor-core decode kernel (Path::LeanTrace in attention_mma.cuh, run by
// `kvcore bench decode_trace`): lane 0 of each warp stamps %globaltimer at the points of
// TracePoint in the warp's life and its SM id, at trace[(cta * W + warp) * kTraceSlots + point]:
// a timeline of where CTAs spend time. With ON false a mark compiles to nothing.
#pragma once
#include <cstdint>

namespace kvcore::ops::cuda::mma_attn {

enum TracePoint : int {
  kTraceEntry,           // first instruction
  kTraceSeqKnown,        // the sequence's indptr / last_page_len arrived (its cell count is known)
  kTracePrologueIssued,  // the first tiles' copies are issued (their block ids arrived)
  kTraceQReady,          // the query fragments are in registers
  kTraceFirstTile,       // the first tile's bytes are in shared memory
  kTraceLoopDone,        // the warp's last tile is consumed
  kTraceWarpsMerged,     // the CTA's per-column rescale factors are in shared memory (epilogue)
  kTraceWritten,         // the partial (or output) is stored
  kTraceStamps
};
constexpr int kTraceSmSlot = kTraceStamps;  // the SM id
constexpr int kTraceSlots = kTraceStamps + 1;

// `dep`: a value the stamp waits for (the mark is taken once it has arrived), so a mark after
// a load times the load, not its issue.
template <bool ON, int W>
__device__ __forceinline__ void trace_mark(unsigned long long* trace, TracePoint point, int dep = 0) {
  if constexpr (ON) {
    if (threadIdx.x % 32 != 0) return;
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns) : "r"(dep) : "memory");
    unsigned long long* w = trace + (int64_t{blockIdx.x} * W + threadIdx.x / 32) * kTraceSlots;
    w[point] = ns;
    if (point == kTraceEntry) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      w[kTraceSmSlot] = sm;
    }
  } else {
    (void)trace, (void)point, (void)dep;
  }
}

}  // namespace kvcore::ops::cuda::mma_attn
