// Argument checks of a block rotation (kv_rotate_blocks and the all-layer rotation of
// paged_rotate share them): the tables, blocks i32[n] contiguous with n <= the pool's
// blocks, cell_delta i32[num_blocks, block_size] contiguous, both beside the pool; the
// pool and its rope table.
#pragma once
#include <string_view>

#include "kvcore/ops/kv_store.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore::ops {

void check_rotate_tables(std::string_view op, const TensorRef& blocks, const TensorRef& cell_delta,
                         const TensorRef& pool_data);

// kv_rotate_blocks' checks of a pool (layout, dtype, shape, FP8 scales) and of the rope table
// against it (n_rot even, the rotated dims inside the head, finite frequencies).
void check_rotate_pool(std::string_view op, const KvPool& pool, const math::RopeTable& rope);

}  // namespace kvcore::ops
