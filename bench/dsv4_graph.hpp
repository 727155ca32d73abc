// CUDA-graph timing for the DeepSeek-V4 decode benchmark (bench/dsv4_graph.cu).
#pragma once
#include <functional>

#include "bench/harness.hpp"
#include "kvcore/stream.hpp"

namespace kvcore::cli {

// Records record(stream) once into a CUDA graph (on a fresh stream), then times
// `reps` replays (after `warmup`) with CUDA events.
Timing dsv4_time_graph(int device, int reps, int warmup, const std::function<void(Stream)>& record);

}  // namespace kvcore::cli
