// DeepSeek-V4 sparse decode attention: planning (the step's window lengths, ring indices and
// query positions checked once, the split-K factor, the workspace) and the per-layer run.
#include "kvcore/ops/attention_dsv4.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/runtime.hpp"
#include "ops/attention_common.hpp"
#include "ops/attention_params.hpp"
#include "ops/attention_plan_impl.hpp"
#include "ops/checks.hpp"

namespace kvcore {

namespace {

constexpr const char* kOp = "attention_dsv4_decode";
constexpr int64_t kDim = math::Dsv4RowLayout::kHeadDim;

void check_i32_vector(const TensorRef& t, const char* name, int64_t n, Device dev) {
  checks::not_null(kOp, name, t);
  checks::ndim_is(kOp, name, t, 1);
  checks::dtype_is(kOp, name, t, DType::I32);
  checks::size_is(kOp, name, t, 0, n);
  require_arg(t.device() == dev, kOp, ": ", name, " is on ", t.device().str(), ", window_kv on ", dev.str());
  require_arg(t.is_contiguous(), kOp, ": ", name, " must be contiguous");
}

// One task a CPU thread or four CTAs an SM, at least min_chunk keys a split. A CPU task takes
// a group of at least 16 heads of a row (they share each key's loads; splitting the heads
// costs less than merging key splits), a CTA 8 heads.
int32_t auto_splits(Device dev, int64_t n_rows, int64_t n_heads, int64_t n_keys) {
  int64_t base = std::max<int64_t>(1, n_rows * ((n_heads + 15) / 16)), target = ops::attn::cpu_threads(), min_chunk = 64;
#if KVCORE_WITH_CUDA
  if (dev.is_cuda())
    base = std::max<int64_t>(1, n_rows * ((n_heads + 7) / 8)), target = 4 * int64_t{ops::cuda::sm_count(dev.index)};
#endif
  (void)dev, (void)n_heads;
  int64_t s = (target + base - 1) / base;
  s = std::min(s, (n_keys + min_chunk - 1) / min_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(s, 1, 128));
}

// window_kv: f32/f16 [rings, n_window, 512], n_window <= 128, stride 1 in its last dim.
void check_window_kv(const TensorRef& w) {
  checks::not_null(kOp, "layer.window_kv", w);
  checks::ndim_is(kOp, "layer.window_kv", w, 3);
  require_arg(w.dtype() == DType::F32 || w.dtype() == DType::F16, kOp, ": layer.window_kv must be f32 or f16, got ",
              dtype_name(w.dtype()));
  checks::size_is(kOp, "layer.window_kv", w, 2, kDim);
  checks::innermost_contiguous(kOp, "layer.window_kv", w);
  checks::non_negative_strides(kOp, "layer.window_kv", w);
  require_arg(w.size(1) <= 128, kOp, ": at most 128 window rows, got ", w.size(1));
}

// The window_kv of a run: the planned dtype and sizes (strides free).
bool same_window(const TensorSignature& want, const TensorRef& w) {
  return w.ndim() == 3 && w.data() != nullptr && w.dtype() == want.dtype && w.device() == want.device &&
         w.size(0) == want.sizes[0] && w.size(1) == want.sizes[1] && w.size(2) == kDim && w.stride(2) == 1 &&
         w.stride(0) >= 0 && w.stride(1) >= 0;
}

}  // namespace

Dsv4AttentionPlan::Dsv4AttentionPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dsv4AttentionPlan::Dsv4AttentionPlan(Dsv4AttentionPlan&&) noexcept = default;
Dsv4AttentionPlan& Dsv4AttentionPlan::operator=(Dsv4AttentionPlan&&) noexcept = default;
Dsv4AttentionPlan::~Dsv4AttentionPlan() = default;

const Dsv4AttentionPlan::Impl& AttentionPlanAccess::impl(const Dsv4AttentionPlan& p) {
  require_arg(p.impl_ != nullptr, "Dsv4AttentionPlan: the plan was moved from");
  return *p.impl_;
}

int64_t Dsv4AttentionPlan::n_rows() const { return AttentionPlanAccess::impl(*this).base.n_rows; }
int32_t Dsv4AttentionPlan::num_splits() const { return AttentionPlanAccess::impl(*this).base.num_splits; }
size_t Dsv4AttentionPlan::workspace_bytes() const { return AttentionPlanAccess::impl(*this).workspace_bytes; }

Dsv4AttentionPlan Dsv4AttentionPlan::decode(const Dsv4AttentionLayer& like, int32_t n_heads, const Dsv4AttentionStep& step,
                                            const AttentionSchedule& schedule) {
  auto m = std::make_unique<Impl>();
  check_window_kv(like.window_kv);
  const Device dev = like.window_kv.device();
  checks::backend_available(kOp, dev);
  m->device = dev;
  require_arg(n_heads >= 1, kOp, ": n_heads must be >= 1, got ", n_heads);
  checks::not_null(kOp, "step.window_len", step.window_len);
  checks::ndim_is(kOp, "step.window_len", step.window_len, 1);
  const int64_t n_rows = step.window_len.size(0);
  require_arg(n_rows >= 1 && n_rows < (int64_t{1} << 31), kOp, ": step.window_len must hold 1 .. 2^31 - 1 rows, got ",
              described(step.window_len));
  check_i32_vector(step.window_len, "step.window_len", n_rows, dev);
  check_i32_vector(step.q_positions, "step.q_positions", n_rows, dev);
  const int64_t n_rings = like.window_kv.size(0), n_window = like.window_kv.size(1);
  if (step.maybe_window_index.empty())
    require_arg(n_rings == n_rows, kOp, ": layer.window_kv must have n_rows = ", n_rows,
                " rings when step.maybe_window_index is empty, got ", described(like.window_kv));
  else
    check_i32_vector(step.maybe_window_index, "step.maybe_window_index", n_rows, dev);
  int64_t k = 0;
  if (!like.comp_idx.empty()) {
    checks::ndim_is(kOp, "layer.comp_idx", like.comp_idx, 2);
    k = like.comp_idx.size(1);
  }
  if (dev.is_cpu() || schedule.check_tables) {
    if (!step.maybe_window_index.empty()) {
      const std::vector<int32_t> wi = ops::attn::host_i32(step.maybe_window_index, schedule.stream);
      for (int64_t r = 0; r < n_rows; ++r)
        require_arg(wi[r] >= 0 && wi[r] < n_rings, kOp, ": step.maybe_window_index[", r, "] = ", wi[r],
                    " must be in [0, ", n_rings, ")");
    }
    const std::vector<int32_t> wl = ops::attn::host_i32(step.window_len, schedule.stream);
    for (int64_t r = 0; r < n_rows; ++r)
      require_arg(wl[r] >= 0 && wl[r] <= n_window, kOp, ": step.window_len[", r, "] = ", wl[r], " must be in [0, ",
                  n_window, "]");
  }
  require_arg(schedule.num_splits >= 0 && schedule.num_splits <= 1024, kOp,
              ": schedule.num_splits must be in [0, 1024], got ", schedule.num_splits);

  int32_t splits = schedule.num_splits;
  const bool automatic = splits == 0;
  if (automatic) splits = auto_splits(dev, n_rows, n_heads, n_window + k);
  std::byte* ws = nullptr;
  if (!schedule.maybe_workspace.empty()) {
    const TensorRef& w = schedule.maybe_workspace;
    checks::not_null(kOp, "schedule.maybe_workspace", w);
    require_arg(w.device() == dev, kOp, ": schedule.maybe_workspace is on ", w.device().str(), ", window_kv on ", dev.str());
    require_arg(w.is_contiguous(), kOp, ": schedule.maybe_workspace must be contiguous");
    const size_t have = static_cast<size_t>(w.numel()) * w.element_size();
    while (automatic && splits > 1 && attention_workspace_bytes(n_rows, n_heads, kDim, splits) > have) --splits;
    const size_t need = attention_workspace_bytes(n_rows, n_heads, kDim, splits);
    require_arg(have >= need, kOp, ": schedule.maybe_workspace holds ", have, " bytes, ", need, " needed for ", splits,
                " splits");
    require_arg(reinterpret_cast<uintptr_t>(w.data()) % 16 == 0, kOp, ": schedule.maybe_workspace must be 16-byte aligned");
    ws = static_cast<std::byte*>(w.data());
    m->workspace_bytes = need;
  } else {
    m->workspace_bytes = attention_workspace_bytes(n_rows, n_heads, kDim, splits);
    m->owned_workspace = Buffer(m->workspace_bytes, dev, 256);
    ws = static_cast<std::byte*>(m->owned_workspace.data());
  }

  ops::Dsv4AttentionParams& p = m->base;
  p.n_rows = static_cast<int32_t>(n_rows);
  p.n_heads = n_heads;
  p.window_f16 = like.window_kv.dtype() == DType::F16 ? 1 : 0;
  p.n_window = static_cast<int32_t>(n_window);
  p.window_len = step.window_len.data_as<const int32_t>();
  p.maybe_window_index = step.maybe_window_index.empty() ? nullptr : step.maybe_window_index.data_as<const int32_t>();
  p.q_positions = step.q_positions.data_as<const int32_t>();
  p.num_splits = splits;
  p.o_part = reinterpret_cast<float*>(ws);
  p.lse_part = p.o_part + n_rows * n_heads * splits * kDim;
  p.device = dev.index;
  m->window_kv = signature_of(like.window_kv);
  m->max_comp_k = k;
  return AttentionPlanAccess::make(std::move(m));
}

void Dsv4AttentionPlan::run(const TensorRef& q, const Dsv4AttentionLayer& a, const TensorRef& out, Stream stream) const {
  const Impl& m = AttentionPlanAccess::impl(*this);
  const Device dev = m.device;
  const int64_t n_rows = m.base.n_rows, n_heads = m.base.n_heads;
  for (const auto& [name, t] : {std::pair<const char*, const TensorRef&>{"q", q}, {"out", out}}) {
    const bool ok = t.ndim() == 3 && (t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16) &&
                    t.data() != nullptr && t.device() == dev && t.size(0) == n_rows && t.size(1) == n_heads &&
                    t.size(2) == kDim && t.stride(2) == 1 && t.stride(0) >= 0 && t.stride(1) >= 0;
    if (!ok)
      require_arg(false, kOp, ": ", name, " must be f32, f16 or bf16 [n_rows = ", n_rows, ", n_heads = ", n_heads,
                  ", 512] on ", dev.str(), " with stride 1 in its last dim, got ", described(t));
  }
  if (!same_window(m.window_kv, a.window_kv)) {
    check_window_kv(a.window_kv);
    require_arg(false, kOp, ": layer.window_kv is ", described(a.window_kv), " but the plan was made for ",
                dtype_name(m.window_kv.dtype), "[", m.window_kv.sizes[0], ", ", m.window_kv.sizes[1], ", 512] on ",
                m.window_kv.device.str());
  }
  if (a.rope == nullptr) require_arg(false, kOp, ": layer.rope is required (the layer's RoPE table)");
  const math::RopeLayout& l = a.rope->layout;
  if (!(l.n_rot > 0 && l.n_rot % 2 == 0 && l.first_dim >= 0 && l.first_dim + l.n_rot <= kDim &&
        (l.interleaved == 0 || l.interleaved == 1) && std::isfinite(a.rope->attention_factor)))
    require_arg(false, kOp, ": layer.rope rotates dims [", l.first_dim, ", ", l.first_dim + l.n_rot,
                "), which is no even range inside 512 dims");
  const float scale = a.softmax_scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(kDim)) : a.softmax_scale;
  if (!(std::isfinite(scale) && scale > 0))
    require_arg(false, kOp, ": layer.softmax_scale must be finite and > 0 (or 0 for 512^-0.5), got ", a.softmax_scale);

  int64_t k = 0, n_comp = 0;
  if (!a.comp_idx.empty()) {
    checks::not_null(kOp, "layer.comp_idx", a.comp_idx);
    checks::ndim_is(kOp, "layer.comp_idx", a.comp_idx, 2);
    checks::dtype_is(kOp, "layer.comp_idx", a.comp_idx, DType::I32);
    checks::size_is(kOp, "layer.comp_idx", a.comp_idx, 0, n_rows);
    require_arg(a.comp_idx.device() == dev, kOp, ": layer.comp_idx is on ", a.comp_idx.device().str(), ", window_kv on ",
                dev.str());
    checks::innermost_contiguous(kOp, "layer.comp_idx", a.comp_idx);
    checks::non_negative_strides(kOp, "layer.comp_idx", a.comp_idx);
    k = a.comp_idx.size(1);
    require_arg(!a.comp_rows.empty(), kOp, ": layer.comp_idx is given but layer.comp_rows is empty");
    checks::not_null(kOp, "layer.comp_rows", a.comp_rows);
    checks::ndim_is(kOp, "layer.comp_rows", a.comp_rows, 2);
    require_arg(a.comp_rows.dtype() == DType::U8, kOp, ": layer.comp_rows must be u8 packed rows, got ",
                dtype_name(a.comp_rows.dtype()));
    checks::size_is(kOp, "layer.comp_rows", a.comp_rows, 1, math::Dsv4RowLayout::kBytes);
    require_arg(a.comp_rows.device() == dev, kOp, ": layer.comp_rows is on ", a.comp_rows.device().str(),
                ", window_kv on ", dev.str());
    checks::innermost_contiguous(kOp, "layer.comp_rows", a.comp_rows);
    checks::non_negative_strides(kOp, "layer.comp_rows", a.comp_rows);
    require_arg(a.comp_rows.size(0) <= 1 || a.comp_rows.stride(0) >= math::Dsv4RowLayout::kBytes, kOp,
                ": layer.comp_rows rows overlap (stride ", a.comp_rows.stride(0), ")");
    n_comp = a.comp_rows.size(0);
  }
  if (!a.maybe_sinks.empty()) {
    const TensorRef& s = a.maybe_sinks;
    if (!(s.ndim() == 1 && s.dtype() == DType::F32 && s.size(0) == n_heads && s.device() == dev && s.data() != nullptr &&
          s.stride(0) == 1))
      require_arg(false, kOp, ": layer.maybe_sinks must be contiguous f32 [n_heads = ", n_heads, "] on ", dev.str(),
                  ", got ", described(s));
  }
  if (k > 0 && (dev.is_cpu() || a.check_indices)) {
    // comp_idx may be strided by rows: copy row by row.
    std::vector<int32_t> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n_rows; ++r) {
      copy_bytes(row.data(), Device::cpu(), a.comp_idx.data_as<const int32_t>() + r * a.comp_idx.stride(0), dev,
                 row.size() * sizeof(int32_t), stream);
      for (int64_t i = 0; i < k; ++i)
        require_arg(row[i] >= -1 && row[i] < n_comp, kOp, ": layer.comp_idx[", r, ", ", i, "] = ", row[i],
                    " must be -1 or a row in [0, ", n_comp, ")");
    }
  }

  ops::Dsv4AttentionParams p = m.base;
  p.q = q.data();
  p.q_elem = ops::attn::q_elem_of(q.dtype());
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.window_kv = a.window_kv.data();
  p.win_row_stride = a.window_kv.stride(0);
  p.win_tok_stride = a.window_kv.stride(1);
  p.maybe_comp_rows = k > 0 ? a.comp_rows.data_as<const uint8_t>() : nullptr;
  p.comp_stride = k > 0 ? a.comp_rows.stride(0) : 0;
  p.maybe_comp_idx = k > 0 ? a.comp_idx.data_as<const int32_t>() : nullptr;
  p.comp_idx_stride = k > 0 ? a.comp_idx.stride(0) : 0;
  p.comp_k = static_cast<int32_t>(k);
  p.maybe_sinks = a.maybe_sinks.empty() ? nullptr : a.maybe_sinks.data_as<const float>();
  p.rope = *a.rope;
  p.softmax_scale = scale;
  p.out = out.data();
  p.out_elem = ops::attn::q_elem_of(out.dtype());
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.stream = stream;
  if (dev.is_cpu()) {
    ops::cpu::attention_dsv4(p);
  } else {
#if KVCORE_WITH_CUDA
    ops::cuda::attention_dsv4(p);
#endif
  }
}

}  // namespace kvcore
