// What an attention plan holds, and the internal ways to make and read one: benches and tests
// plan with non-default AttentionTuning and reach the Params a run launches.
#pragma once
#include <memory>

#include "kvcore/buffer.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/ops/attention_dsv4.hpp"
#include "ops/attention_params.hpp"
#include "ops/attention_tuning.hpp"

namespace kvcore {

// Dtype, shape and contiguity of one tensor: runs compare their pages with the planned ones.
struct TensorSignature {
  bool present = false;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t sizes[4] = {0, 0, 0, 0};
  bool contiguous = false;
  int64_t strides[4] = {0, 0, 0, 0};  // V may be rows of a wider pool (K's latent): the plan fixes its stride
  Device device = Device::cpu();
  bool operator==(const TensorSignature&) const = default;
};

struct PagesSignature {
  TensorSignature k, v, k_scale, v_scale, positions, valid;
  RopeMode rope_mode = RopeMode::RopeStored;
  bool operator==(const PagesSignature&) const = default;
};

TensorSignature signature_of(const TensorRef& t);
PagesSignature signature_of(const PagedKV& pages);

struct AttentionPlan::Impl {
  const char* op = "";      // "attention_decode" or "attention_prefill"
  bool prefill = false;
  // Everything but the per-layer fields (pages, rope table, q, out, sinks, scale, window).
  ops::PagedAttentionParams base{};
  ops::AttentionTuning tuning;
  PagesSignature pages;     // what every run's pages must match
  int64_t head_dim = 0;     // of K and q
  int64_t v_head_dim = 0;   // of V and the output
  Device device = Device::cpu();
  Buffer owned_workspace;   // when the schedule gave none
  size_t workspace_bytes = 0;
};

struct Dsv4AttentionPlan::Impl {
  ops::Dsv4AttentionParams base{};
  TensorSignature window_kv;  // planned window_kv (its strides may differ per layer)
  int64_t max_comp_k = 0;
  Device device = Device::cpu();
  Buffer owned_workspace;
  size_t workspace_bytes = 0;
};

// Friend of the plans: the internal constructors and views.
struct AttentionPlanAccess {
  static AttentionPlan make(std::unique_ptr<AttentionPlan::Impl> m) { return AttentionPlan(std::move(m)); }
  static Dsv4AttentionPlan make(std::unique_ptr<Dsv4AttentionPlan::Impl> m) { return Dsv4AttentionPlan(std::move(m)); }
  static const AttentionPlan::Impl& impl(const AttentionPlan& p);
  static const Dsv4AttentionPlan::Impl& impl(const Dsv4AttentionPlan& p);
};

namespace ops::attn {

// AttentionPlan::decode / ::prefill with launch choices other than the defaults.
AttentionPlan plan_paged(bool prefill, const PagedKV& pages, int32_t n_q_heads, const AttentionStep& step,
                         const AttentionSchedule& schedule, const AttentionTuning& tuning);
// The checks of run() and the Params it would launch, without launching (benches time the
// wrapper; tests count its allocations).
void run_params(const AttentionPlan& plan, const TensorRef& q, const PagedKV& pages, const TensorRef& out,
                const AttentionLayer& layer, Stream stream, PagedAttentionParams& p);
// The backend call of run() (CPU or CUDA) for Params from run_params.
void launch_paged(Device device, const PagedAttentionParams& p, const AttentionTuning& tuning);

}  // namespace ops::attn

}  // namespace kvcore
