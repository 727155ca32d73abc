// The transfer's block gather / scatter (src/transfer/block_copy.hpp): grid (block, slice),
// each CTA moving one slice of up to kSliceBytes of one block, 16 bytes per thread and step
// when the block size and both base addresses allow it, else byte by byte.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "transfer/block_copy.hpp"

namespace kvcore::xfer::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kSliceBytes = 16 * kThreads * 4;  // 16 KiB: four 16-byte steps per thread

template <bool kGather>
__global__ void block_copy_kernel(uint8_t* pool, int64_t block_bytes, const int32_t* blocks, uint8_t* staging,
                                  bool vec16) {
  const int64_t i = blockIdx.x;
  const int64_t lo = static_cast<int64_t>(blockIdx.y) * kSliceBytes;
  const int64_t hi = lo + kSliceBytes < block_bytes ? lo + kSliceBytes : block_bytes;
  uint8_t* p = pool + static_cast<int64_t>(blocks[i]) * block_bytes;
  uint8_t* s = staging + i * block_bytes;
  uint8_t* dst = kGather ? s : p;
  const uint8_t* src = kGather ? p : s;
  if (vec16) {
    for (int64_t b = lo + 16 * threadIdx.x; b < hi; b += 16 * kThreads)
      *reinterpret_cast<uint4*>(dst + b) = *reinterpret_cast<const uint4*>(src + b);
  } else {
    for (int64_t b = lo + threadIdx.x; b < hi; b += kThreads) dst[b] = src[b];
  }
}

template <bool kGather>
void launch(const BlockCopy& c, Stream stream) {
  const bool vec16 = c.block_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(c.pool) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(c.staging) % 16 == 0;
  const int64_t slices = (c.block_bytes + kSliceBytes - 1) / kSliceBytes;
  require_arg(slices <= 65535, "transfer: block of ", c.block_bytes, " bytes is too large for the block copy kernel");
  const dim3 grid(static_cast<unsigned>(c.n), static_cast<unsigned>(slices));
  block_copy_kernel<kGather><<<grid, kThreads, 0, ops::cuda::native(stream)>>>(c.pool, c.block_bytes, c.blocks, c.staging, vec16);
  KVCORE_CUDA_CHECK_LAUNCH("block_copy_kernel");
}

}  // namespace

void gather_blocks(const BlockCopy& c, Stream stream) { launch<true>(c, stream); }
void scatter_blocks(const BlockCopy& c, Stream stream) { launch<false>(c, stream); }
void use_device(int index) { KVCORE_CUDA_CHECK(cudaSetDevice(index)); }

}  // namespace kvcore::xfer::cuda
