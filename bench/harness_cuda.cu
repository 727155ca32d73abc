// CUDA side of the harness: event timing, CUDA-graph replay timing and the two bandwidth ceilings.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/harness.hpp"
#include "cuda/common/check.cuh"

namespace kvcore::cli {

Timing time_cuda(int device, int reps, int warmup, const std::function<void(int)>& fn) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  for (int i = 0; i < warmup; ++i) fn(i);
  KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  KVCORE_CUDA_CHECK(cudaEventCreate(&a));
  KVCORE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    KVCORE_CUDA_CHECK(cudaEventRecord(a));
    fn(i);
    KVCORE_CUDA_CHECK(cudaEventRecord(b));
    KVCORE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KVCORE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3);
  }
  KVCORE_CUDA_CHECK(cudaEventDestroy(a));
  KVCORE_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), reps};
}

double host_time_us(int device, const std::function<void()>& call) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  std::vector<double> us;
  for (int i = 0; i < 5; ++i) {
    KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

Stream make_blocking_stream(int device) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  KVCORE_CUDA_CHECK(cudaStreamCreate(&s));
  return Stream::from_native(s);
}

void destroy_stream(Stream s) {
  if (s.handle) cudaStreamDestroy(static_cast<cudaStream_t>(s.handle));
}

Timing time_graph(int device, int reps, int warmup, const std::function<void(Stream)>& record, Stream capture) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  const bool own = capture.handle == nullptr;
  cudaStream_t s = static_cast<cudaStream_t>(capture.handle);
  if (own) KVCORE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
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
    if (own) cudaStreamDestroy(s);
    throw;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (own) cudaStreamDestroy(s);
  return t;
}

namespace {

__global__ void copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) dst[i] = src[i];
}

__global__ void read_kernel(const int4* __restrict__ src, size_t n, int* __restrict__ out) {
  int acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *out = acc;  // practically never: keeps the loads alive
}

__global__ void fill_kernel(int4* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = make_int4(int(i * 2654435761u), int(i), int(~i), 7);
}

}  // namespace

Ceilings measure_cuda_ceilings(int device) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  KVCORE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const size_t bytes = size_t{2} << 30;  // 2 GiB each: ~35x the H200's L2
  const size_t n = bytes / sizeof(int4);
  int4 *a = nullptr, *b = nullptr;
  int* out = nullptr;
  KVCORE_CUDA_CHECK(cudaMalloc(&a, bytes));
  KVCORE_CUDA_CHECK(cudaMalloc(&b, bytes));
  KVCORE_CUDA_CHECK(cudaMalloc(&out, sizeof(int)));
  const int blocks = prop.multiProcessorCount * 8, threads = 512;
  fill_kernel<<<blocks, threads>>>(a, n);
  fill_kernel<<<blocks, threads>>>(b, n);
  KVCORE_CUDA_CHECK_LAUNCH("fill_kernel");
  const Timing tc = time_cuda(device, 20, 3, [&](int rep) {
    if (rep % 2) copy_kernel<<<blocks, threads>>>(a, b, n);
    else copy_kernel<<<blocks, threads>>>(b, a, n);
  });
  // The copy ceiling is the better of a plain grid-stride kernel and the driver's own copy.
  const Timing tm = time_cuda(device, 20, 3, [&](int rep) {
    KVCORE_CUDA_CHECK(cudaMemcpyAsync(rep % 2 ? b : a, rep % 2 ? a : b, bytes, cudaMemcpyDeviceToDevice));
  });
  const Timing tr = time_cuda(device, 20, 3, [&](int rep) { read_kernel<<<blocks, threads>>>(rep % 2 ? a : b, n, out); });
  KVCORE_CUDA_CHECK_LAUNCH("ceiling kernels");
  KVCORE_CUDA_CHECK(cudaFree(a));
  KVCORE_CUDA_CHECK(cudaFree(b));
  KVCORE_CUDA_CHECK(cudaFree(out));
  return {2.0 * bytes / std::min(tc.median_us, tm.median_us) / 1e3, 1.0 * bytes / tr.median_us / 1e3};
}

}  // namespace kvcore::cli
