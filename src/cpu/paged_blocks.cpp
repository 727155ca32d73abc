// Host versions of the PagedCache block kernels (src/cuda/paged/paged_blocks.cu): CPU caches
// copy blocks with these, and caches built with PagedCacheConfig::debug_mirror edit their
// mirrors with them: the same per-cell rules.
#include <cstring>

#include "ops/paged_blocks_params.hpp"

namespace kvcore::cpu {

void paged_copy_blocks(const ops::PagedCopyBlocksParams& p) {
  for (int32_t a = 0; a < p.n_arrays; ++a) {
    const PagedPoolArray& arr = p.arrays[a];
    for (int32_t i = 0; i < p.n_pairs; ++i)
      std::memcpy(arr.base + p.pairs[2 * i + 1] * arr.block_bytes, arr.base + p.pairs[2 * i] * arr.block_bytes,
                  static_cast<size_t>(arr.block_bytes));
  }
}

void paged_scatter_cells(const ops::PagedScatterCellsParams& p) {
  const int32_t block_size = p.cells.block_size;
  const int64_t n = static_cast<int64_t>(p.n_blocks) * block_size;
  const int32_t* cells = p.packed + p.n_blocks;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(p.packed[i / block_size]) * block_size + i % block_size;
    p.cells.positions[c] = cells[i];
    p.cells.pending[c] = cells[n + i];
    p.cells.valid[c] = static_cast<uint8_t>(cells[2 * n + i]);
  }
}

void paged_edit_cells(const ops::PagedEditCellsParams& p) {
  const int32_t block_size = p.cells.block_size;
  const int64_t n = static_cast<int64_t>(p.n_blocks) * block_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(p.blocks[i / block_size]) * block_size + i % block_size;
    if (p.clear_pending) {
      p.cells.pending[c] = 0;
    } else if (p.cells.valid[c]) {
      p.cells.positions[c] -= p.maybe_block_delta ? p.maybe_block_delta[i / block_size] : p.delta;
      p.cells.pending[c] -= p.pending_delta;
    }
  }
}

void paged_set_cells(const ops::PagedSetCellsParams& p) {
  for (int32_t i = 0; i < p.n; ++i) {
    p.cells.positions[p.slots[i]] = p.stored[i];
    p.cells.pending[p.slots[i]] = 0;
    p.cells.valid[p.slots[i]] = 1;
  }
}

}  // namespace kvcore::cpu
