// The flat form of shift_dense for shifts without overlap: see src/cuda/shift/shift_flat.hpp.
// A 2-D grid, blockIdx.y = tensor; each thread walks its tensor's items grid-stride,
// kFlatBatch at a time (every load of a batch before its stores), rotating in
// registers with the layer's cos/sin from shared memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "cuda/common/check.cuh"
#include "cuda/shift/shift_chunk_io.cuh"
#include "cuda/shift/shift_flat.hpp"

namespace kvcore::cuda {
namespace {

constexpr int kFlatThreads = 256;
constexpr int kFlatMinBlocks = 4;  // 1024 threads per SM, <= 64 registers

__global__ void __launch_bounds__(kFlatThreads, kFlatMinBlocks)
    shift_flat_kernel(const __grid_constant__ shift_flat::Params p) {
  using shift_flat::kFlatBatch;
  __shared__ float s_cos[shift_plan::kMaxPairsTotal], s_sin[shift_plan::kMaxPairsTotal];
  for (int i = threadIdx.x; i < p.n_pairs; i += kFlatThreads) {
    s_cos[i] = p.cos_t[i];
    s_sin[i] = p.sin_t[i];
  }
  __syncthreads();  // the only barrier
  const shift_flat::Stream& st = p.streams[blockIdx.y];
  const int64_t stride = int64_t{gridDim.x} * kFlatThreads;
  for (int64_t i0 = int64_t{blockIdx.x} * kFlatThreads + threadIdx.x; i0 < st.n_items; i0 += kFlatBatch * stride) {
    shift_flat::Item it[kFlatBatch];
    Chunk a[kFlatBatch], b[kFlatBatch];
#pragma unroll
    for (int k = 0; k < kFlatBatch; ++k) {
      const int64_t i = i0 + k * stride;
      if (i < st.n_items) {
        it[k] = shift_flat::decode(st, i);
        a[k] = load_chunk(it[k].src, it[k].bytes);
        b[k] = it[k].partner ? load_chunk(it[k].src + it[k].partner, it[k].bytes) : Chunk{};
      }
    }
#pragma unroll
    for (int k = 0; k < kFlatBatch; ++k) {
      if (i0 + k * stride < st.n_items) {
        shift_flat::rotate(st, it[k], a[k], b[k], s_cos, s_sin);
        uint8_t* dst = it[k].src - st.shift;
        store_chunk(dst, a[k], it[k].bytes);
        if (it[k].partner) store_chunk(dst + it[k].partner, b[k], it[k].bytes);
      }
    }
  }
}

int flat_resident_blocks(int device) {
  static std::mutex m;
  static std::map<int, int> cache;
  const std::lock_guard<std::mutex> lock(m);
  int& n = cache[device];
  if (n == 0) {
    int per_sm = 0, sms = 0;
    KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, shift_flat_kernel, kFlatThreads, 0));
    KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    n = std::max(per_sm, 1) * sms;
  }
  return n;
}

}  // namespace

bool shift_flat::launch(const shift_plan::Plan& plan, int device, void* stream) {
  const auto launches = make_launches(plan);
  if (launches.empty()) return false;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int resident = flat_resident_blocks(device);
  for (const auto& P : launches) {
    // one wave: every tensor gets the same number of blocks (tensors of a launch move
    // about the same bytes), each thread about the same number of items
    int64_t most = 0;
    for (int32_t k = 0; k < P->n_streams; ++k) most = std::max(most, P->streams[k].n_items);
    const int64_t per_stream = std::max<int64_t>(1, resident / P->n_streams);
    const int64_t needed = (most + kFlatThreads - 1) / kFlatThreads;
    const dim3 grid(static_cast<unsigned>(std::min(per_stream, needed)), static_cast<unsigned>(P->n_streams));
    shift_flat_kernel<<<grid, kFlatThreads, 0, s>>>(*P);
    KVCORE_CUDA_CHECK_LAUNCH("shift_flat_kernel");
  }
  return true;
}

}  // namespace kvcore::cuda
