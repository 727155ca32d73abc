// Host versions of the PagedCache mirror kernels (src/cuda/paged/paged_blocks.cu), used by
// CPU caches built with PagedCacheConfig::debug_mirror: the same per-cell rules.
#include "cache/paged_blocks.hpp"

namespace kvcore::cpu {

void paged_scatter_cells(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* packed, int32_t n_blocks,
                         int32_t block_size) {
  const int64_t n = static_cast<int64_t>(n_blocks) * block_size;
  const int32_t* cells = packed + n_blocks;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(packed[i / block_size]) * block_size + i % block_size;
    positions[c] = cells[i];
    pending[c] = cells[n + i];
    valid[c] = static_cast<uint8_t>(cells[2 * n + i]);
  }
}

void paged_edit_cells(int32_t* positions, int32_t* pending, const uint8_t* valid, const int32_t* blocks, int32_t n_blocks,
                      int32_t block_size, int32_t delta, int32_t pending_delta, bool clear_pending,
                      const int32_t* maybe_block_delta) {
  const int64_t n = static_cast<int64_t>(n_blocks) * block_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(blocks[i / block_size]) * block_size + i % block_size;
    if (clear_pending) {
      pending[c] = 0;
    } else if (valid[c]) {
      positions[c] -= maybe_block_delta ? maybe_block_delta[i / block_size] : delta;
      pending[c] -= pending_delta;
    }
  }
}

void paged_set_cells(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* slots, const int32_t* stored,
                     int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    positions[slots[i]] = stored[i];
    pending[slots[i]] = 0;
    valid[slots[i]] = 1;
  }
}

}  // namespace kvcore::cpu
