// CPU kernels of the kv_store family: one row (token, head) per iteration, OpenMP over rows.
#include <cstdint>

#include "ops/kv_store_params.hpp"
#include "ops/kv_store_row.hpp"

namespace kvcore::cpu {

// Below this many values a parallel region costs more than the work (decode steps, tests).
constexpr int64_t kParallelMin = int64_t{1} << 17;

void kv_store(const KvStoreParams& p) {
  const int64_t rows = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  const size_t elem = dtype_size(kv_format_dtype(p.format));
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
#pragma omp parallel for schedule(static) if (rows * p.head_dim >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = static_cast<int32_t>(r / p.n_heads);
    const int32_t h = static_cast<int32_t>(r % p.n_heads);
    const int32_t cell = p.slots[t];
    if (cell < 0 || cell >= p.num_cells) continue;
    float row[2 * math::RopeTable::kMaxPairs];
    const int64_t base = t * p.src_token_stride + h * p.src_head_stride;
    for (int32_t d = 0; d < p.head_dim; ++d) row[d] = kvrow::load_src(p.src, p.src_dtype, base + d);
    if (p.maybe_positions)
      math::rope_rotate_row(row, p.rope, static_cast<float>(p.maybe_positions[t]), p.rope.attention_factor);
    const int64_t row_index = static_cast<int64_t>(cell) * p.n_heads + h;
    void* dst = static_cast<uint8_t*>(p.pool) + row_index * p.row_width * static_cast<int64_t>(elem);
    uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
    kvrow::encode_row(p.format, row, dst, scales, p.head_dim);
  }
}

void kv_rotate_blocks(const KvRotateParams& p) {
  const int64_t rows = static_cast<int64_t>(p.n_blocks) * p.block_size * p.n_heads;
  const size_t elem = dtype_size(kv_format_dtype(p.format));
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
#pragma omp parallel for schedule(static) if (rows * p.head_dim >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bs_heads = static_cast<int64_t>(p.block_size) * p.n_heads;
    const int32_t b = p.blocks[r / bs_heads];
    const int32_t slot = static_cast<int32_t>((r % bs_heads) / p.n_heads);
    const int32_t h = static_cast<int32_t>(r % p.n_heads);
    const int64_t cell = static_cast<int64_t>(b) * p.block_size + slot;
    const int32_t delta = p.cell_delta[cell];
    if (delta == 0) continue;
    const int64_t row_index = cell * p.n_heads + h;
    void* dst = static_cast<uint8_t*>(p.pool) + row_index * p.row_width * static_cast<int64_t>(elem);
    uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
    float row[2 * math::RopeTable::kMaxPairs];
    for (int32_t d = 0; d < p.head_dim; ++d) row[d] = kvrow::decode(p.format, dst, scales, d);
    math::rope_rotate_row(row, p.rope, static_cast<float>(delta), 1.0f);
    kvrow::encode_rotated(p.format, row, dst, scales, p.head_dim, p.rope.layout);
  }
}

}  // namespace kvcore::cpu
