// PagedCache's block kernels (src/ops/paged_blocks_params.hpp): copy-on-write block copies,
// grid (pair, array), each CTA copying one block of one array 16 bytes at a time when the
// block size allows it; and the mirror edits, a thread per cell.
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "ops/paged_blocks_params.hpp"

namespace kvcore::ops::cuda {

namespace {

__global__ void paged_copy_blocks_kernel(const PagedPoolArray* arrays, const int32_t* pairs) {
  const PagedPoolArray a = arrays[blockIdx.y];
  const int64_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  const uint8_t* s = a.base + src * a.block_bytes;
  uint8_t* d = a.base + dst * a.block_bytes;
  if (a.block_bytes % 16 == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    for (int64_t i = threadIdx.x; i < a.block_bytes / 16; i += blockDim.x) d4[i] = s4[i];
  } else {
    for (int64_t i = threadIdx.x; i < a.block_bytes; i += blockDim.x) d[i] = s[i];
  }
}

__global__ void paged_edit_cells_kernel(int32_t* positions, int32_t* pending, const uint8_t* valid, const int32_t* blocks,
                                        int64_t n_cells, int32_t block_size, int32_t delta, int32_t pending_delta,
                                        bool clear_pending, const int32_t* maybe_block_delta) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_cells) return;
  const int64_t c = static_cast<int64_t>(blocks[i / block_size]) * block_size + i % block_size;
  if (clear_pending) {
    pending[c] = 0;
  } else if (valid[c]) {
    positions[c] -= maybe_block_delta ? maybe_block_delta[i / block_size] : delta;
    pending[c] -= pending_delta;
  }
}

__global__ void paged_scatter_cells_kernel(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* packed,
                                           int64_t n_cells, int32_t n_blocks, int32_t block_size) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_cells) return;
  const int64_t c = static_cast<int64_t>(packed[i / block_size]) * block_size + i % block_size;
  const int32_t* cells = packed + n_blocks;
  positions[c] = cells[i];
  pending[c] = cells[n_cells + i];
  valid[c] = static_cast<uint8_t>(cells[2 * n_cells + i]);
}

__global__ void paged_set_cells_kernel(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* slots,
                                       const int32_t* stored, int32_t n) {
  const int32_t i = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const int32_t c = slots[i];
  positions[c] = stored[i];
  pending[c] = 0;
  valid[c] = 1;
}

}  // namespace

void paged_set_cells(const PagedSetCellsParams& p, Stream stream) {
  if (p.n == 0) return;
  const PagedCellArrays& c = p.cells;
  paged_set_cells_kernel<<<static_cast<unsigned>((p.n + 255) / 256), 256, 0, native(stream)>>>(c.positions, c.pending, c.valid,
                                                                                                p.slots, p.stored, p.n);
  KVCORE_CUDA_CHECK_LAUNCH("paged_set_cells_kernel");
}

void paged_scatter_cells(const PagedScatterCellsParams& p, Stream stream) {
  const PagedCellArrays& c = p.cells;
  const int64_t n = static_cast<int64_t>(p.n_blocks) * c.block_size;
  if (n == 0) return;
  paged_scatter_cells_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, native(stream)>>>(
      c.positions, c.pending, c.valid, p.packed, n, p.n_blocks, c.block_size);
  KVCORE_CUDA_CHECK_LAUNCH("paged_scatter_cells_kernel");
}

void paged_edit_cells(const PagedEditCellsParams& p, Stream stream) {
  const PagedCellArrays& c = p.cells;
  const int64_t n = static_cast<int64_t>(p.n_blocks) * c.block_size;
  if (n == 0) return;
  paged_edit_cells_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, native(stream)>>>(
      c.positions, c.pending, c.valid, p.blocks, n, c.block_size, p.delta, p.pending_delta, p.clear_pending,
      p.maybe_block_delta);
  KVCORE_CUDA_CHECK_LAUNCH("paged_edit_cells_kernel");
}

void paged_copy_blocks(const PagedCopyBlocksParams& p, Stream stream) {
  if (p.n_arrays == 0 || p.n_pairs == 0) return;
  const dim3 grid(static_cast<unsigned>(p.n_pairs), static_cast<unsigned>(p.n_arrays));
  paged_copy_blocks_kernel<<<grid, 256, 0, native(stream)>>>(p.arrays, p.pairs);
  KVCORE_CUDA_CHECK_LAUNCH("paged_copy_blocks_kernel");
}

}  // namespace kvcore::ops::cuda
