// Device helpers of PagedCache: whole-block copies between blocks of every pool
// array (copy on write: one launch copies block src -> dst of every array for
// every pair), and edits of the per-cell mirrors of listed blocks.
#pragma once
#include <cstdint>

#include "kvcore/stream.hpp"

namespace kvcore {

// One pool array: its base and the bytes one block takes in it.
struct PagedPoolArray {
  uint8_t* base = nullptr;
  int64_t block_bytes = 0;
};

namespace cuda {
// arrays: device [n_arrays]; pairs: device i32 [n_pairs, 2] (src block, dst block).
void paged_copy_blocks(const PagedPoolArray* arrays, int32_t n_arrays, const int32_t* pairs, int32_t n_pairs,
                       Stream stream);
// Scatter packed cell arrays into the mirrors: packed = i32 [n_blocks block ids | n_blocks *
// block_size positions | the same of pending deltas | the same of validity (0/1)].
void paged_scatter_cells(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* packed, int32_t n_blocks,
                         int32_t block_size, Stream stream);
// Cell arrays of the listed blocks (device i32 [n_blocks]): with clear_pending, pending = 0 for
// every cell; otherwise valid cells get positions -= delta (maybe_block_delta[i] instead for the
// i-th listed block when given: device i32 [n_blocks]) and pending -= pending_delta.
void paged_edit_cells(int32_t* positions, int32_t* pending, const uint8_t* valid, const int32_t* blocks, int32_t n_blocks,
                      int32_t block_size, int32_t delta, int32_t pending_delta, bool clear_pending, Stream stream,
                      const int32_t* maybe_block_delta = nullptr);
// Cells of new tokens: positions[slots[i]] = stored[i], valid = 1, pending = 0 (device i32 [n]).
void paged_set_cells(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* slots, const int32_t* stored,
                     int32_t n, Stream stream);
}  // namespace cuda

namespace cpu {  // the same on host memory (PagedCacheConfig::debug_mirror)
void paged_scatter_cells(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* packed, int32_t n_blocks,
                         int32_t block_size);
void paged_edit_cells(int32_t* positions, int32_t* pending, const uint8_t* valid, const int32_t* blocks, int32_t n_blocks,
                      int32_t block_size, int32_t delta, int32_t pending_delta, bool clear_pending,
                      const int32_t* maybe_block_delta = nullptr);
void paged_set_cells(int32_t* positions, int32_t* pending, uint8_t* valid, const int32_t* slots, const int32_t* stored,
                     int32_t n);
}  // namespace cpu

}  // namespace kvcore
