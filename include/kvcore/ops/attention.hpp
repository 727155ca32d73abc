// Attention over a paged KV cache: decode (one query token per sequence),
// prefill (a chunk of new tokens per sequence, causal by position) and
// DeepSeek-V4's sparse decode attention over raw window rows plus selected
// packed compressed rows.
//
// The cache is read through the memory contract of kvcore/paged_layout.hpp
// (raw TensorRefs), so the ops work with PagedCache and with an engine's own
// pages alike. Every op validates all arguments before writing anything and
// throws kvcore::Error naming the bad one; the output is then untouched.
//
// Semantics shared by decode and prefill, per query row r of sequence b and
// query head h (kv head h / (n_q_heads / n_kv_heads)):
//   keys: the cells j < seq_cells(b) of b's block table whose valid byte is 1
//   (all cells when `valid` is empty), further restricted by
//     - the sliding window: q_pos - k_pos < window (window > 0),
//     - causality (prefill only): k_pos <= q_pos;
//   s_j = softmax_scale * q . K_j  (K_j rotated at k_pos first in rope-on-read mode)
//   out = sum_j softmax_j V_j, where the softmax denominator also holds
//   exp(sink_h) when sinks are given (a raw logit, not scaled, with no value).
//   A row that sees no key outputs zeros.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>

#include "kvcore/math/rope_spec.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// One layer's pages (kvcore/paged_layout.hpp).
struct PagedKV {
  TensorRef k, v;              // [num_blocks, block_size, n_kv_heads, head_dim]: f32, f16, bf16 or e4m3
  TensorRef k_scale, v_scale;  // e4m3 only: UE8M0 (or u8) [num_blocks, block_size, n_kv_heads, head_dim / 64]
                               //            or f32 [num_blocks, block_size, n_kv_heads]
  TensorRef positions;         // i32 [num_blocks, block_size]; needed for window, causal, rope-on-read
  TensorRef valid;             // u8 [num_blocks, block_size]; empty: every spanned cell is live
};

// Block tables in CSR form.
struct BlockTable {
  TensorRef indptr;         // i32 [batch + 1]
  TensorRef indices;        // i32 [indptr[batch]] block ids
  TensorRef last_page_len;  // i32 [batch], 1..block_size for a sequence with blocks
  // Optional i32 [batch]: the key position in a cell of sequence b is positions[cell] -
  // pos_offset[b] (PagedCache::block_tables(.., PagedPositions::Offsets) exports it, so a
  // rope-on-read shift needs no per-cell work). Empty: 0.
  TensorRef pos_offset;
};

struct AttentionOptions {
  float softmax_scale = 0.0f;  // required, > 0 (usually head_dim^-0.5)
  TensorRef sinks;             // optional f32 [n_q_heads]: per-head sink logits
  int32_t window = 0;          // 0: no sliding window; else keys with q_pos - k_pos < window
  TensorRef q_positions;       // i32 [n_rows]: the query's position (window, rotate_query; prefill: required)
  // Rope-on-read: K is stored unrotated; keys are rotated at their cached
  // positions while read (cos and sin scaled by rope.attention_factor, as at write).
  std::optional<RopeSpec> rope_on_read;
  bool rotate_query = false;   // also rotate q at q_positions (needs rope_on_read); else q comes rotated
  int32_t num_splits = 0;      // split-K factor per sequence; 0: chosen from the batch and the device
  int64_t max_seq_cells = 0;   // hint for that choice (cells of the longest sequence) when check_tables is off
  // Scratch for split-K partials (attention_workspace_bytes). Empty: the op allocates one per call
  // (a synchronous allocation on CUDA: pass one when timing matters).
  TensorRef workspace;
  // Check table contents (indices in range, indptr monotone, last_page_len in range). On CUDA
  // this copies the tables to the host (a synchronization); engines that trust their tables
  // may turn it off. Shapes and dtypes are always checked.
  bool check_tables = true;
  // CUDA tuning and testing: 0 automatic (the tensor-core kernel where it is built, else the
  // SIMT kernel), 1 the SIMT register-load kernel, 2 the SIMT cp.async pipeline (head_dim 128
  // with 16-bit and FP8 pages; elsewhere 2 means 1), 3 the tensor-core kernel (head_dim 64 and
  // 128, 16-bit and FP8 pages; rope-on-read where the rotated dims fill whole 8-dim chunks;
  // elsewhere 3 means 0), 4 the tensor-core prefill kernel whatever the call's size (prefill
  // with 16-bit pages, head_dim 64 or 128, no rope on read; elsewhere 4 means 0).
  int32_t kernel_variant = 0;
  Stream stream;
};

// q [batch, n_q_heads, head_dim] f32/f16/bf16 -> out [batch, n_q_heads, head_dim] f32/f16/bf16.
// One query token per sequence of `table`. head_dim 64, 128, 256 or 512;
// n_q_heads a multiple of n_kv_heads (GQA of any group size, MQA).
void attention_decode(const TensorRef& q, const PagedKV& kv, const BlockTable& table, const TensorRef& out,
                      const AttentionOptions& opt);

// q [n_tokens, n_q_heads, head_dim]: rows qo_indptr[b] .. qo_indptr[b+1] belong to sequence b
// (i32 [batch + 1]); opt.q_positions is required. The chunk's own keys must already be in the
// pages; a key is visible iff its position <= the query's (causal by position).
void attention_prefill(const TensorRef& q, const TensorRef& qo_indptr, const PagedKV& kv, const BlockTable& table,
                       const TensorRef& out, const AttentionOptions& opt);

// Bytes of workspace a call with these sizes needs; num_splits >= 1 as the call resolves it:
// the value given in AttentionOptions, or attention_auto_splits(...) for the automatic choice.
size_t attention_workspace_bytes(int64_t n_rows, int64_t n_q_heads, int64_t head_dim, int32_t num_splits);

// The split-K factor `num_splits = 0` resolves to (device-dependent: on CUDA it fills the
// GPU in whole waves of the kernel chosen for this shape; max_seq_cells 0 = unknown;
// rope_on_read as the call's AttentionOptions::rope_on_read is set).
int32_t attention_auto_splits(Device device, int64_t n_rows, int64_t n_kv_heads, int64_t n_q_heads, int64_t head_dim,
                              DType kv_dtype, int64_t max_seq_cells, int32_t kernel_variant = 0,
                              bool rope_on_read = false);

// ---- DeepSeek-V4 sparse decode attention ----------------------------------------------
// MQA with 64 query heads of 512 dims (any n_heads works); the key and the value are the same row.
// Per query row r, one softmax per head over:
//   window rows window_kv[r, 0 .. window_len[r]) (f32 or f16, 512 dims; at most 128),
//   compressed rows comp_rows[comp_idx[r, i]] for every i with comp_idx >= 0 (packed 584-byte
//   rows, math/dsv4_row.hpp), and the per-head sink logit.
// The output's last 64 dims are then rotated back by the query position (RoPE at -q_pos).
struct Dsv4AttentionArgs {
  TensorRef q;           // [n_rows, n_heads, 512] f32/f16/bf16, RoPE applied at q_positions
  TensorRef window_kv;   // [n_rows, n_window, 512] f32/f16 (row strides free), n_window <= 128;
                         // or a pool of rings [n_seqs, n_window, 512] with window_index
  TensorRef window_index;  // optional i32 [n_rows]: which window_kv[i] each query reads (empty: row r reads [r])
  TensorRef window_len;  // i32 [n_rows]: live window rows, 0..n_window
  TensorRef comp_rows;   // u8 [n_comp, 584] packed rows (may be empty when comp_idx is)
  TensorRef comp_idx;    // i32 [n_rows, k]: row ids into comp_rows, -1 = none (may be empty)
  TensorRef sinks;       // optional f32 [n_heads]
  TensorRef q_positions; // i32 [n_rows]
  RopeSpec rope;         // the layer's RoPE (tail 64, interleaved)
  float softmax_scale = 0.0f;
  int32_t num_splits = 0;  // 0: automatic
  TensorRef workspace;     // attention_workspace_bytes(n_rows, n_heads, 512, splits)
  bool check_indices = true;  // comp_idx in [-1, n_comp) (a host copy on CUDA)
  Stream stream;
};
void attention_dsv4_decode(const Dsv4AttentionArgs& args, const TensorRef& out);

}  // namespace kvcore
