// The memory contract between a paged cache and whatever reads it (kvcore's
// attention kernels, or an engine's own). PagedCache produces these views;
// attention ops consume them. Plain data: index math is constexpr KVCORE_HD so
// host code, CPU kernels and CUDA kernels share it.
//
// Per layer:
//   K pool, V pool: [num_blocks, block_size, n_kv_heads, head_dim] of the storage dtype
//     (f32, f16, bf16, or e4m3 codes). FP8 pools carry scales beside them:
//     per-64 UE8M0 bytes [num_blocks, block_size, n_kv_heads, head_dim / 64], or
//     per-token-head f32 [num_blocks, block_size, n_kv_heads].
//   token metadata (shared by all layers of one cache):
//     positions [num_blocks, block_size] i32: the RoPE position of the token in that cell;
//     valid     [num_blocks, block_size] u8 : 1 = live token, 0 = dead cell (cut by a shift,
//               or not yet written).
// Per batch (block tables in CSR form, as FlashInfer takes them):
//   indptr [batch + 1] i32, indices [indptr[batch]] i32 block ids, last_page_len [batch] i32
//   (cells used in each sequence's last block, 1..block_size; a sequence with no block has
//   indptr[b] == indptr[b+1]). Cell j of sequence b lives in block indices[indptr[b] + j / block_size]
//   at slot j % block_size. Dead cells may sit anywhere; readers skip them.
//
// Thread safety: plain data and constexpr index math; safe to use concurrently.
#pragma once
#include <cstdint>

#include "kvcore/math/hd.hpp"

namespace kvcore {

struct PagedLayout {
  int32_t block_size = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;

  // Element offset of (block, slot, head, dim 0) in a pool.
  constexpr KVCORE_HD int64_t row_offset(int32_t block, int32_t slot, int32_t head) const {
    return ((static_cast<int64_t>(block) * block_size + slot) * n_kv_heads + head) * head_dim;
  }
  constexpr KVCORE_HD int64_t block_elems() const { return static_cast<int64_t>(block_size) * n_kv_heads * head_dim; }
  constexpr KVCORE_HD int64_t cell(int32_t block, int32_t slot) const {
    return static_cast<int64_t>(block) * block_size + slot;
  }
  // Number of cells a CSR sequence spans (live or dead).
  static constexpr KVCORE_HD int32_t seq_cells(const int32_t* indptr, const int32_t* last_page_len, int32_t b,
                                               int32_t block_size) {
    const int32_t nb = indptr[b + 1] - indptr[b];
    return nb == 0 ? 0 : (nb - 1) * block_size + last_page_len[b];
  }
};

}  // namespace kvcore
