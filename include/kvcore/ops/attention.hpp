// Attention over a paged KV cache: decode (one query token per sequence) and
// prefill (a chunk of new tokens per sequence, causal by position).
//
// Plan once per step, run once per layer. AttentionPlan::decode / ::prefill take
// what every layer of a step shares -- the block tables, the query positions, the
// pages' shapes and formats, the scheduling choices -- check the tables once,
// resolve the split-K factor and size the workspace. plan.run(q, layer_pages, out)
// then serves each layer: it checks only O(1) shapes of its arguments, never
// synchronizes nor allocates, and can be captured in a CUDA graph (the plan must
// outlive every run that uses it, captured ones included).
//
// The pages are read through the memory contract of kvcore/paged_layout.hpp (raw
// TensorRefs), so the ops work with PagedCache (PagedCache::paged_kv(layer) and
// block_tables()) and with an engine's own pages alike. Every call validates all
// its arguments before writing anything and throws kvcore::Error naming the bad
// one; the output is then untouched.
//
// Semantics, per query row r of sequence b and query head h (kv head h / (n_q_heads / n_kv_heads)):
//   keys: the cells j < seq_cells(b) of b's block table whose valid byte is 1
//   (all cells when `valid` is empty), further restricted by
//     - the sliding window: q_pos - k_pos < window (window > 0),
//     - causality (prefill only): k_pos <= q_pos;
//   s_j = softmax_scale * q . K_j
//   out = sum_j softmax_j V_j, where the softmax denominator also holds
//   exp(sink_h) when sinks are given (a raw logit, not scaled, with no value).
//   A row that sees no key outputs zeros.
// RoPE follows the pages' mode (PagedKV::rope_mode), so q and K cannot disagree:
//   RopeStored: K was rotated when written; q comes rotated by the caller.
//   RopeOnRead: K is stored unrotated and q comes unrotated; attention rotates each key
//     at its position and each query at its q_positions entry with the pages' table
//     (cos and sin scaled by the table's attention_factor, as rope_apply does).
//
// Thread safety: a plan is immutable after planning; concurrent run() calls on one
// plan are safe only with distinct outputs and (when splits > 1) on one stream, since
// they share the plan's workspace. Plans are movable, not copyable.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvcore/math/rope.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// How K is stored in the pages (see above).
enum class RopeMode : uint8_t { RopeStored, RopeOnRead };

// One layer's pages (kvcore/paged_layout.hpp). PagedCache::paged_kv(layer) fills every field.
struct PagedKV {
  // [num_blocks, block_size, n_kv_heads, head_dim] (K) and [.., v_head_dim] (V): f32, f16, bf16 or
  // e4m3, both of one type. Head dims: 64, 80, 96, 112, 128, 192, 256 or 512 with V as wide as K,
  // or K 576 with V 512 (DeepSeek-V2/V3 MLA); e4m3 needs multiples of 64. K is contiguous; V is
  // contiguous or rows of a wider pool read in place -- strides [block_size * n_kv_heads * s,
  // n_kv_heads * s, s, 1] with s >= v_head_dim -- as MLA's shared layout hands out V: the first
  // v_head_dim dims of each K row (s = head_dim; PagedCacheConfig::v_from_k_latent).
  TensorRef k, v;
  // e4m3 only: UE8M0 (or u8) [num_blocks, block_size, n_kv_heads, head_dim / 64] (v_scale: v_head_dim / 64,
  //            contiguous or, like v, rows of a wider array: K's scales in the shared layout)
  //            or f32 [num_blocks, block_size, n_kv_heads]
  TensorRef k_scale, v_scale;
  TensorRef positions;         // i32 [num_blocks, block_size]; needed for window, causal, rope-on-read
  TensorRef valid;             // u8 [num_blocks, block_size]; empty: every spanned cell is live
  RopeMode rope_mode = RopeMode::RopeStored;
  // RopeOnRead: the layer's table (make_rope_table(spec, head_dim), built once; it must outlive
  // the runs that read it). Ignored for RopeStored.
  const math::RopeTable* maybe_rope = nullptr;
};

// Block tables of a batch in CSR form: the one table type of the cache and of attention.
struct BlockTable {
  TensorRef indptr;         // i32 [batch + 1]
  TensorRef indices;        // i32 [indptr[batch]] block ids
  TensorRef last_page_len;  // i32 [batch], 1..block_size for a sequence with blocks
  // Optional i32 [batch]: the key position in a cell of sequence b is positions[cell] -
  // pos_offset[b] (PagedCache::block_tables(.., PagedPositions::Offsets) exports it, so a
  // rope-on-read shift needs no per-cell work). Empty: 0.
  TensorRef pos_offset;
};

// Per-step data every layer of the step shares.
struct AttentionStep {
  BlockTable table;
  // i32 [n_rows]: each query row's position. Required by prefill, by layers with a window and
  // by rope-on-read pages; optional otherwise.
  TensorRef q_positions;
  // Prefill only: i32 [batch + 1], rows qo_indptr[b] .. qo_indptr[b+1] of q belong to sequence b.
  TensorRef qo_indptr;
};

// How the step is scheduled.
struct AttentionSchedule {
  int32_t num_splits = 0;      // split-K factor per sequence, 1..1024; 0: chosen from the batch and the device
  int64_t max_seq_cells = 0;   // hint for that choice (cells of the longest sequence) when check_tables is off
  // Read the tables on the host at planning: check their contents (indices in range, indptr
  // monotone, last_page_len in range) and measure the longest sequence. On CUDA this copies the
  // tables to the host (a synchronization of `stream`, once per plan); engines that trust their
  // tables may turn it off (and give max_seq_cells). Shapes and dtypes are always checked.
  bool check_tables = true;
  // Scratch for split-K partials, at least attention_workspace_bytes(...) for the splits wanted
  // (an automatic split count shrinks to what it holds). Empty: the plan allocates its own once.
  TensorRef maybe_workspace;
  Stream stream;               // the stream the planning's table copies are ordered on (the tables' writer's)
};

// What the model fixes for a layer (it may differ between layers of one plan).
struct AttentionLayer {
  float softmax_scale = 0.0f;  // > 0; 0: head_dim^-0.5 (K's head dim)
  int32_t window = 0;          // 0: no sliding window; else keys with q_pos - k_pos < window
  TensorRef maybe_sinks;       // f32 [n_q_heads]: per-head sink logits (empty: none)
};

class AttentionPlan {
 public:
  // Decode: one query row per sequence of step.table (n_rows = batch). `pages` is any layer's
  // pages: every layer run with this plan must have its shapes, formats and RoPE mode.
  static AttentionPlan decode(const PagedKV& pages, int32_t n_q_heads, const AttentionStep& step,
                              const AttentionSchedule& schedule = {});
  // Prefill: step.qo_indptr and step.q_positions are required (n_rows = q_positions' length).
  // The chunk's own keys must already be in the pages; a key is visible iff its position <=
  // the query's (causal by position).
  static AttentionPlan prefill(const PagedKV& pages, int32_t n_q_heads, const AttentionStep& step,
                               const AttentionSchedule& schedule = {});

  // q [n_rows, n_q_heads, head_dim] f32/f16/bf16 -> out [n_rows, n_q_heads, v_head_dim] f32/f16/bf16.
  // `pages` must match the planned shapes, formats and RoPE mode (Error otherwise).
  // The step's tables must not change between planning and the last run (re-plan after any
  // cache change); runs do not re-read them on the host.
  void run(const TensorRef& q, const PagedKV& pages, const TensorRef& out, const AttentionLayer& layer = {},
           Stream stream = {}) const;

  int64_t n_rows() const;
  int32_t num_splits() const;    // as resolved
  int64_t max_seq_cells() const; // measured (check_tables) or the hint; 0: unknown
  size_t workspace_bytes() const;

  AttentionPlan(AttentionPlan&&) noexcept;
  AttentionPlan& operator=(AttentionPlan&&) noexcept;
  AttentionPlan(const AttentionPlan&) = delete;
  AttentionPlan& operator=(const AttentionPlan&) = delete;
  ~AttentionPlan();

  struct Impl;  // src/ops/attention_plan_impl.hpp

 private:
  explicit AttentionPlan(std::unique_ptr<Impl> impl);
  friend struct AttentionPlanAccess;
  std::unique_ptr<Impl> impl_;
};

// Bytes of workspace a plan with these sizes needs for num_splits >= 1 splits; head_dim is the
// output's (V's) head dim.
size_t attention_workspace_bytes(int64_t n_rows, int64_t n_q_heads, int64_t head_dim, int32_t num_splits);

}  // namespace kvcore
