// The ops-layer entry points of PagedCache's block kernels (src/ops/paged_blocks_params.hpp) on
// host memory, against the per-cell rules written out directly.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "ops/paged_blocks_params.hpp"

using namespace kvcore;

namespace {

constexpr int32_t kBlocks = 6, kBlockSize = 4, kCells = kBlocks * kBlockSize;

struct Cells {
  std::vector<int32_t> positions = std::vector<int32_t>(kCells), pending = std::vector<int32_t>(kCells);
  std::vector<uint8_t> valid = std::vector<uint8_t>(kCells);
  Cells() {
    for (int32_t c = 0; c < kCells; ++c) {
      positions[c] = 100 + c;
      pending[c] = c % 5;
      valid[c] = static_cast<uint8_t>(c % 3 != 0);
    }
  }
  ops::PagedCellArrays arrays() { return {positions.data(), pending.data(), valid.data(), kBlockSize}; }
};

}  // namespace

TEST(PagedBlocksOps, CopyBlocksCopiesEveryPairInEveryArray) {
  std::vector<uint8_t> a(kBlocks * 8), b(kBlocks * 3);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 100);
  const std::vector<uint8_t> a0 = a, b0 = b;
  const PagedPoolArray arrays[] = {{a.data(), 8}, {b.data(), 3}};
  const int32_t pairs[] = {1, 4, 2, 0};
  ops::PagedCopyBlocksParams p;
  p.arrays = arrays;
  p.n_arrays = 2;
  p.pairs = pairs;
  p.n_pairs = 2;
  ops::paged_copy_blocks(p, Device::cpu(), {});
  for (int32_t blk = 0; blk < kBlocks; ++blk) {
    const int32_t from = blk == 4 ? 1 : blk == 0 ? 2 : blk;
    for (int i = 0; i < 8; ++i) EXPECT_EQ(a[blk * 8 + i], a0[from * 8 + i]) << "array 0 block " << blk;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[blk * 3 + i], b0[from * 3 + i]) << "array 1 block " << blk;
  }
}

TEST(PagedBlocksOps, EditCellsShiftsValidCellsOfListedBlocksOnly) {
  Cells c;
  const Cells before;
  const int32_t blocks[] = {3, 1};
  ops::PagedEditCellsParams p;
  p.cells = c.arrays();
  p.blocks = blocks;
  p.n_blocks = 2;
  p.delta = 7;
  p.pending_delta = 2;
  ops::paged_edit_cells(p, Device::cpu(), {});
  for (int32_t cell = 0; cell < kCells; ++cell) {
    const int32_t blk = cell / kBlockSize;
    const bool edited = (blk == 3 || blk == 1) && before.valid[cell];
    EXPECT_EQ(c.positions[cell], before.positions[cell] - (edited ? 7 : 0)) << cell;
    EXPECT_EQ(c.pending[cell], before.pending[cell] - (edited ? 2 : 0)) << cell;
    EXPECT_EQ(c.valid[cell], before.valid[cell]) << cell;
  }
  // per-block deltas; then clearing the pending deltas of one block
  const int32_t per_block[] = {-5, 11};
  p.maybe_block_delta = per_block;
  Cells d;
  p.cells = d.arrays();
  ops::paged_edit_cells(p, Device::cpu(), {});
  for (int32_t cell = 0; cell < kCells; ++cell) {
    const int32_t blk = cell / kBlockSize;
    const int32_t delta = !before.valid[cell] ? 0 : blk == 3 ? -5 : blk == 1 ? 11 : 0;
    EXPECT_EQ(d.positions[cell], before.positions[cell] - delta) << cell;
  }
  p.clear_pending = true;
  p.n_blocks = 1;
  ops::paged_edit_cells(p, Device::cpu(), {});
  for (int32_t cell = 0; cell < kCells; ++cell) {
    if (cell / kBlockSize == 3) {
      EXPECT_EQ(d.pending[cell], 0) << cell;
    }
  }
}

TEST(PagedBlocksOps, ScatterAndSetCellsWriteTheGivenValues) {
  Cells c;
  const Cells before;
  // block 5: positions 1..4, pending 9, validity 1, 0, 1, 0
  std::vector<int32_t> packed = {5, 1, 2, 3, 4, 9, 9, 9, 9, 1, 0, 1, 0};
  ops::PagedScatterCellsParams s;
  s.cells = c.arrays();
  s.packed = packed.data();
  s.n_blocks = 1;
  ops::paged_scatter_cells(s, Device::cpu(), {});
  for (int32_t j = 0; j < kBlockSize; ++j) {
    EXPECT_EQ(c.positions[5 * kBlockSize + j], j + 1);
    EXPECT_EQ(c.pending[5 * kBlockSize + j], 9);
    EXPECT_EQ(c.valid[5 * kBlockSize + j], j % 2 == 0 ? 1 : 0);
  }
  for (int32_t cell = 0; cell < 5 * kBlockSize; ++cell) EXPECT_EQ(c.positions[cell], before.positions[cell]) << cell;

  const int32_t slots[] = {0, 9}, stored[] = {42, 43};
  ops::PagedSetCellsParams t;
  t.cells = c.arrays();
  t.slots = slots;
  t.stored = stored;
  t.n = 2;
  ops::paged_set_cells(t, Device::cpu(), {});
  EXPECT_EQ(c.positions[0], 42);
  EXPECT_EQ(c.positions[9], 43);
  EXPECT_EQ(c.valid[0], 1);
  EXPECT_EQ(c.valid[9], 1);
  EXPECT_EQ(c.pending[0], 0);
  EXPECT_EQ(c.pending[9], 0);
}
