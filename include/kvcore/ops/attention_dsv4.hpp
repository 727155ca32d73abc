// DeepSeek-V4 sparse decode attention, planned once per step and run once per layer
// (as AttentionPlan in ops/attention.hpp).
//
// MQA with 64 query heads of 512 dims (any n_heads works); the key and the value are the same
// row. Per query row r, one softmax per head over:
//   window rows window_kv[w, 0 .. window_len[r]) with w = window_index[r] (or r) (f32 or f16,
//   512 dims; at most 128),
//   compressed rows comp_rows[comp_idx[r, i]] for every i with comp_idx >= 0 (packed 584-byte
//   rows, math/dsv4_row.hpp), and the per-head sink logit.
// The output's last 64 dims are then rotated back by the query position (RoPE at -q_pos) with
// the layer's table.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvcore/math/rope.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// Per-step data every layer shares.
struct Dsv4AttentionStep {
  TensorRef window_len;    // i32 [n_rows]: live window rows, 0..n_window
  TensorRef maybe_window_index;  // i32 [n_rows]: which window_kv ring each row reads (empty: row r reads [r])
  TensorRef q_positions;   // i32 [n_rows]
};

// One layer's inputs.
struct Dsv4AttentionLayer {
  TensorRef window_kv;     // [n_rows, n_window, 512] f32/f16 (row strides free), n_window <= 128;
                           // or a pool of rings [n_rings, n_window, 512] read through maybe_window_index
  TensorRef comp_rows;     // u8 [n_comp, 584] packed rows (may be empty when comp_idx is)
  TensorRef comp_idx;      // i32 [n_rows, k]: row ids into comp_rows, -1 = none (may be empty)
  TensorRef maybe_sinks;   // f32 [n_heads] (empty: none)
  // The layer's RoPE table (tail 64, interleaved; make_rope_table(spec, 512), built once).
  const math::RopeTable* rope = nullptr;
  float softmax_scale = 0.0f;  // > 0; 0: 512^-0.5
  // comp_idx in [-1, n_comp): per layer data, so checked per run (a host copy and a
  // synchronization on CUDA: turn it off for CUDA graphs and trusted indices).
  bool check_indices = true;
};

class Dsv4AttentionPlan {
 public:
  // `like` is any layer's inputs: every layer run with this plan must have its window_kv shape
  // and dtype and at most its comp_idx width. Checks the step's arrays once (their contents
  // when schedule.check_tables) and resolves the split-K factor.
  static Dsv4AttentionPlan decode(const Dsv4AttentionLayer& like, int32_t n_heads, const Dsv4AttentionStep& step,
                                  const AttentionSchedule& schedule = {});
  // q [n_rows, n_heads, 512] f32/f16/bf16, RoPE applied at q_positions -> out of q's shape.
  void run(const TensorRef& q, const Dsv4AttentionLayer& layer, const TensorRef& out, Stream stream = {}) const;

  int64_t n_rows() const;
  int32_t num_splits() const;
  size_t workspace_bytes() const;

  Dsv4AttentionPlan(Dsv4AttentionPlan&&) noexcept;
  Dsv4AttentionPlan& operator=(Dsv4AttentionPlan&&) noexcept;
  Dsv4AttentionPlan(const Dsv4AttentionPlan&) = delete;
  Dsv4AttentionPlan& operator=(const Dsv4AttentionPlan&) = delete;
  ~Dsv4AttentionPlan();

  struct Impl;

 private:
  explicit Dsv4AttentionPlan(std::unique_ptr<Impl> impl);
  friend struct AttentionPlanAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcore
