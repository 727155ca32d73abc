// CUDA-graph timing for the DeepSeek-V4 decode benchmark: one capture, many replays.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "bench/dsv4_graph.hpp"
#include "cuda/check.cuh"

namespace kvcore::cli {

Timing dsv4_time_graph(int device, int reps, int warmup, const std::function<void(Stream)>& record) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  KVCORE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  Timing t;
  try {
    KVCORE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    record(Stream::from_native(s));
    KVCORE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    KVCORE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    KVCORE_CUDA_CHECK(cudaEventCreate(&a));
    KVCORE_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warmup; ++i) KVCORE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
      KVCORE_CUDA_CHECK(cudaEventRecord(a, s));
      KVCORE_CUDA_CHECK(cudaGraphLaunch(exec, s));
      KVCORE_CUDA_CHECK(cudaEventRecord(b, s));
      KVCORE_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      KVCORE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      us.push_back(ms * 1e3);
    }
    std::sort(us.begin(), us.end());
    t.reps = static_cast<int>(us.size());
    t.min_us = us.front();
    t.median_us = us[us.size() / 2];
  } catch (...) {
    cudaStreamEndCapture(s, &graph);  // no-op when capture already ended
    cudaGetLastError();
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaStreamDestroy(s);
    throw;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return t;
}

}  // namespace kvcore::cli
