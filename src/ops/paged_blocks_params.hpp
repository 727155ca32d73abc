// Plain parameters of PagedCache's block kernels: whole-block copies between blocks of every
// pool array (copy on write: one launch copies block src -> dst of every array for every
// pair), and edits of the per-cell mirrors (positions, pending deltas, validity) of listed
// blocks. The entry points (src/ops/paged_blocks.cpp) run the backend of the memory the
// arrays live in; the cache fills these from state it has checked, so nothing is
// validated again. Lists (blocks, pairs, slots) live in the same memory as the arrays.
#pragma once
#include <cstdint>

#include "kvcore/device.hpp"
#include "kvcore/stream.hpp"

namespace kvcore {

// One pool array: its base and the bytes one block takes in it.
struct PagedPoolArray {
  uint8_t* base = nullptr;
  int64_t block_bytes = 0;
};

namespace ops {

// The per-cell mirrors of a cache: [num_blocks * block_size] each.
struct PagedCellArrays {
  int32_t* positions = nullptr;
  int32_t* pending = nullptr;
  uint8_t* valid = nullptr;
  int32_t block_size = 0;
};

// For every pair i and every array a: block pairs[2i] -> block pairs[2i + 1] of a.
struct PagedCopyBlocksParams {
  const PagedPoolArray* arrays = nullptr;  // [n_arrays]
  int32_t n_arrays = 0;
  const int32_t* pairs = nullptr;          // i32 [n_pairs, 2]: (src block, dst block)
  int32_t n_pairs = 0;
};

// Writes packed cell values into the mirrors: packed = i32 [n_blocks block ids | n_blocks *
// block_size positions | the same of pending deltas | the same of validity (0/1)].
struct PagedScatterCellsParams {
  PagedCellArrays cells;
  const int32_t* packed = nullptr;
  int32_t n_blocks = 0;
};

// Cells of the listed blocks: with clear_pending, pending = 0 for every cell; otherwise valid
// cells get positions -= delta (maybe_block_delta[i] instead for the i-th listed block when
// given) and pending -= pending_delta.
struct PagedEditCellsParams {
  PagedCellArrays cells;
  const int32_t* blocks = nullptr;  // i32 [n_blocks]
  int32_t n_blocks = 0;
  int32_t delta = 0;
  int32_t pending_delta = 0;
  bool clear_pending = false;
  const int32_t* maybe_block_delta = nullptr;  // i32 [n_blocks]
};

// Cells of new tokens: positions[slots[i]] = stored[i], valid = 1, pending = 0.
struct PagedSetCellsParams {
  PagedCellArrays cells;
  const int32_t* slots = nullptr;   // i32 [n]
  const int32_t* stored = nullptr;  // i32 [n]
  int32_t n = 0;
};

// Entry points: `device` is where the arrays live; CUDA work is queued on `stream`.
void paged_copy_blocks(const PagedCopyBlocksParams& p, Device device, Stream stream);
void paged_scatter_cells(const PagedScatterCellsParams& p, Device device, Stream stream);
void paged_edit_cells(const PagedEditCellsParams& p, Device device, Stream stream);
void paged_set_cells(const PagedSetCellsParams& p, Device device, Stream stream);

namespace cuda {
void paged_copy_blocks(const PagedCopyBlocksParams& p, Stream stream);
void paged_scatter_cells(const PagedScatterCellsParams& p, Stream stream);
void paged_edit_cells(const PagedEditCellsParams& p, Stream stream);
void paged_set_cells(const PagedSetCellsParams& p, Stream stream);
}  // namespace cuda

}  // namespace ops

namespace cpu {
void paged_copy_blocks(const ops::PagedCopyBlocksParams& p);
void paged_scatter_cells(const ops::PagedScatterCellsParams& p);
void paged_edit_cells(const ops::PagedEditCellsParams& p);
void paged_set_cells(const ops::PagedSetCellsParams& p);
}  // namespace cpu

}  // namespace kvcore
