// Plain parameters of the attention kernels, shared by the CPU and CUDA
// backends. Filled and validated by src/ops/attention*.cpp; kernels trust them.
#pragma once
#include <cstdint>

#include "kvcore/paged_layout.hpp"
#include "kvcore/dtype.hpp"
#include "kvcore/math/attention_rows.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/stream.hpp"

namespace kvcore::ops {

// Float element kinds of queries and outputs.
enum class QElem : int32_t { F32 = 0, F16 = 1, BF16 = 2 };

struct PagedAttentionParams {
  // ---- pages (one layer)
  const void* k;                      // [num_blocks, block_size, n_kv_heads, head_dim] of kv_elem
  const void* v;                      // [num_blocks, block_size, n_kv_heads, v_head_dim] of kv_elem
  math::KvElem kv_elem;
  math::KvScaleMode scale_mode;
  const uint8_t* maybe_k_scale_u8;    // Ue8m0Per64: [num_blocks, block_size, n_kv_heads, head_dim / 64]
  const uint8_t* maybe_v_scale_u8;    //             [num_blocks, block_size, n_kv_heads, v_head_dim / 64]
  const float* maybe_k_scale_f32;     // F32PerRow: [num_blocks, block_size, n_kv_heads]
  const float* maybe_v_scale_f32;
  const int32_t* maybe_positions;     // [num_blocks, block_size]
  const uint8_t* maybe_valid;         // [num_blocks, block_size]
  PagedLayout layout;                 // block_size, n_kv_heads, head_dim (of K and of q)
  int32_t v_head_dim;                 // width of V rows, of the output and of the partials
  // Elements from one V row (cell, head) to the next: v_head_dim for a V pool of its own, K's
  // head_dim when V is K's latent (the first v_head_dim dims of each K row, MLA's shared layout);
  // Ue8m0Per64 V scales likewise advance v_scale_row_stride bytes a row (v_head_dim / 64 or
  // head_dim / 64). V row (cell, head) starts at (cell * n_kv_heads + head) * v_row_stride.
  int64_t v_row_stride;
  int64_t v_scale_row_stride;
  int32_t num_blocks;
  // ---- block tables (CSR)
  const int32_t* indptr;              // [batch + 1]
  const int32_t* indices;             // [indptr[batch]]
  int64_t n_indices;                  // entries of indices (>= indptr[batch]); 0: unknown
  const int32_t* last_page_len;       // [batch]
  int32_t batch;
  // [batch] or null (= all 0): the key position of sequence b's cell is maybe_positions[cell] -
  // maybe_seq_pos_offset[b] (PagedCache's block_tables(.., PagedPositions::Offsets) exports it as
  // BlockTable::pos_offset; rope-on-read shifts then cost O(1) in the context length). Readers of
  // maybe_positions must subtract it wherever they use a key position (rope-on-read rotation,
  // causal and window masks); attention_key_position() below does.
  const int32_t* maybe_seq_pos_offset = nullptr;
  // ---- queries
  const void* q;                      // [n_rows, n_q_heads, head_dim] of q_elem, strides below
  QElem q_elem;
  int64_t q_row_stride, q_head_stride;
  int32_t n_rows;
  int32_t n_q_heads;
  int32_t group;                      // n_q_heads / n_kv_heads
  const int32_t* maybe_qo_indptr;     // [batch + 1] prefill: rows of each sequence; null: row r is sequence r
  const int32_t* maybe_q_positions;   // [n_rows]
  int32_t causal;                     // 1: keys with k_pos > q_pos are masked (prefill)
  int32_t window;                     // > 0: keys with q_pos - k_pos >= window are masked
  const float* maybe_sinks;           // [n_q_heads], natural-log logits
  float softmax_scale;
  int32_t rope_on_read;               // rotate K at its position while reading
  int32_t rotate_query;               // rotate q at q_positions first
  math::RopeTable rope;               // valid when rope_on_read
  // ---- output and split-K scratch
  void* out;                          // [n_rows, n_q_heads, v_head_dim] of out_elem
  QElem out_elem;
  int64_t out_row_stride, out_head_stride;
  int32_t num_splits;                 // >= 1
  int64_t max_seq_cells;              // planning hint: cells of the longest sequence (0: unknown)
  int32_t kernel_variant;             // CUDA: an ops::AttentionKernel (attention_tuning.hpp)
  float* o_part;                      // [n_rows, n_q_heads, num_splits, v_head_dim] normalized partial outputs
  float* lse_part;                    // [n_rows, n_q_heads, num_splits] log2-sum-exp2 of each partial
  int32_t device;                     // CUDA device index of every tensor
  Stream stream;
};

// Row r's sequence: r itself (decode) or the b with qo_indptr[b] <= r < qo_indptr[b+1].
KVCORE_HD int32_t attention_row_seq(const PagedAttentionParams& p, int32_t r) {
  if (!p.maybe_qo_indptr) return r;
  int32_t lo = 0, hi = p.batch;  // qo_indptr[lo] <= r < qo_indptr[hi]
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (p.maybe_qo_indptr[mid] <= r) lo = mid;
    else hi = mid;
  }
  return lo;
}

// The most splits the CUDA planner gives a decode call: at least 128 cells a split and at most
// 1024 splits (1024 when the length is unknown, max_seq_cells 0).
inline int64_t attention_split_limit(int64_t max_seq_cells) {
  const int64_t s = max_seq_cells > 0 ? (max_seq_cells + 127) / 128 : 1024;
  return s < 1 ? 1 : s > 1024 ? 1024 : s;
}

// Cells [begin, end) of split `s` out of `n_splits` over `n_cells` (chunks rounded to 16 cells).
struct CellRange {
  int32_t begin, end;
};
KVCORE_HD CellRange attention_split_range(int32_t n_cells, int32_t s, int32_t n_splits) {
  int32_t chunk = (n_cells + n_splits - 1) / n_splits;
  chunk = (chunk + 15) / 16 * 16;
  int32_t b = s * chunk;
  int32_t e = b + chunk;
  b = b < n_cells ? b : n_cells;
  e = e < n_cells ? e : n_cells;
  return {b, e};
}

// Position of the key in `cell` of sequence b (maybe_positions must be set).
KVCORE_HD int32_t attention_key_position(const PagedAttentionParams& p, int64_t cell, int32_t b) {
  return p.maybe_positions[cell] - (p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[b] : 0);
}

// Is cell (block, slot) a key of a query at q_pos? (Ignores maybe_seq_pos_offset: callers that
// accept offsets pass q_pos + maybe_seq_pos_offset[b], which is equivalent.)
KVCORE_HD bool attention_cell_visible(const PagedAttentionParams& p, int64_t cell, int32_t q_pos) {
  if (p.maybe_valid && p.maybe_valid[cell] == 0) return false;
  if (p.window > 0 || p.causal) {
    const int32_t k_pos = p.maybe_positions[cell];
    if (p.causal && k_pos > q_pos) return false;
    if (p.window > 0 && static_cast<int64_t>(q_pos) - k_pos >= p.window) return false;
  }
  return true;
}

KVCORE_HD float q_elem_to_f32(const void* base, int64_t i, QElem e) {
  switch (e) {
    case QElem::F32: return static_cast<const float*>(base)[i];
    case QElem::F16: return math::f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case QElem::BF16: return math::bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.0f;
}

KVCORE_HD void store_q_elem(void* base, int64_t i, QElem e, float x) {
  switch (e) {
    case QElem::F32: static_cast<float*>(base)[i] = x; break;
    case QElem::F16: static_cast<uint16_t*>(base)[i] = math::f32_to_f16_bits(x); break;
    case QElem::BF16: static_cast<uint16_t*>(base)[i] = math::f32_to_bf16_bits(x); break;
  }
}

// DeepSeek-V4 sparse decode.
struct Dsv4AttentionParams {
  const void* q;                 // [n_rows, n_heads, 512] of q_elem
  QElem q_elem;
  int64_t q_row_stride, q_head_stride;
  int32_t n_rows, n_heads;
  const void* window_kv;         // [n_rows, n_window, 512] f32 (window_f16 = 0) or f16
  int32_t window_f16;
  int64_t win_row_stride, win_tok_stride;
  int32_t n_window;
  const int32_t* window_len;     // [n_rows]
  const int32_t* maybe_window_index;  // [n_rows]: window_kv ring of each row (null: row r)
  const uint8_t* maybe_comp_rows;  // [n_comp, 584]
  int64_t comp_stride;           // bytes between packed rows (>= 584)
  const int32_t* maybe_comp_idx; // [n_rows, k]
  int64_t comp_idx_stride;
  int32_t comp_k;
  const float* maybe_sinks;      // [n_heads]
  const int32_t* q_positions;    // [n_rows]
  math::RopeTable rope;          // output inverse rotation (tail 64)
  float softmax_scale;
  void* out;                     // [n_rows, n_heads, 512]
  QElem out_elem;
  int64_t out_row_stride, out_head_stride;
  int32_t num_splits;
  float* o_part;                 // [n_rows, n_heads, num_splits, 512]
  float* lse_part;               // [n_rows, n_heads, num_splits]
  int32_t device;                // CUDA device index of every tensor
  Stream stream;
};

// Element offset of row r's window rows in window_kv.
KVCORE_HD int64_t dsv4_window_base(const Dsv4AttentionParams& p, int32_t r) {
  return int64_t{p.maybe_window_index ? p.maybe_window_index[r] : r} * p.win_row_stride;
}

struct AttentionTuning;  // ops/attention_tuning.hpp

// Backends.
namespace cpu {
void attention_paged(const PagedAttentionParams& p);
void attention_dsv4(const Dsv4AttentionParams& p);
}  // namespace cpu
namespace cuda {
void attention_paged(const PagedAttentionParams& p, const AttentionTuning& tuning);
void attention_dsv4(const Dsv4AttentionParams& p);
int sm_count(int device);
// Split-K factor that fills the device in whole waves (uses the kernel's occupancy); fat_ctas
// as AttentionTuning::fat_ctas.
int32_t attention_choose_splits(int device, int64_t n_rows, int n_kv_heads, int group, int head_dim, int v_head_dim,
                                math::KvElem kv,
                                int kernel_variant, int64_t max_seq_cells, bool rope_on_read, bool fat_ctas);
}  // namespace cuda

}  // namespace kvcore::ops
