// Whole-block copies between blocks of every pool array of a PagedCache (copy
// on write): one launch copies block src -> dst of every array for every pair.
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
}  // namespace cuda

}  // namespace kvcore
