// Argument checks of a block rotation's tables (kv_rotate_blocks and the fused all-layer
// rotation of paged_rotate share them): blocks i32[n] contiguous with n <= the pool's
// blocks, cell_delta i32[num_blocks, block_size] contiguous, both beside the pool.
#pragma once
#include <string_view>

#include "kvcore/tensor.hpp"

namespace kvcore::ops {

void check_rotate_tables(std::string_view op, const TensorRef& blocks, const TensorRef& cell_delta,
                         const TensorRef& pool_data);

}  // namespace kvcore::ops
