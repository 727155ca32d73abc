// Paged decode and prefill attention: planning (every check of the step's tables and
// shapes, the split-K choice, the workspace) and the per-layer run (O(1) checks of its
// arguments against the plan, then the backend).
#include "kvcore/ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvcore/runtime.hpp"
#include "ops/attention_common.hpp"
#include "ops/attention_plan_impl.hpp"
#include "ops/attention_support.hpp"
#include "ops/checks.hpp"

namespace kvcore {

using ops::attn::host_i32;

size_t attention_workspace_bytes(int64_t n_rows, int64_t n_q_heads, int64_t head_dim, int32_t num_splits) {
  require_arg(n_rows >= 0 && n_q_heads >= 0 && head_dim >= 0, "attention_workspace_bytes: sizes must be >= 0, got n_rows ",
              n_rows, ", n_q_heads ", n_q_heads, ", head_dim ", head_dim);
  require_arg(num_splits >= 1, "attention_workspace_bytes: num_splits must be >= 1, got ", num_splits);
  int64_t parts = 0, floats = 0, bytes = 0;
  const bool overflow = __builtin_mul_overflow(n_rows, n_q_heads, &parts) || __builtin_mul_overflow(parts, num_splits, &parts) ||
                        __builtin_mul_overflow(parts, head_dim + 1, &floats) ||
                        __builtin_mul_overflow(floats, int64_t{sizeof(float)}, &bytes);
  require_arg(!overflow, "attention_workspace_bytes: n_rows ", n_rows, " x n_q_heads ", n_q_heads, " x num_splits ",
              num_splits, " x (head_dim ", head_dim, " + 1) floats overflow");
  return static_cast<size_t>(bytes);
}

// ---- plan ------------------------------------------------------------------------------------

AttentionPlan::AttentionPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AttentionPlan::AttentionPlan(AttentionPlan&&) noexcept = default;
AttentionPlan& AttentionPlan::operator=(AttentionPlan&&) noexcept = default;
AttentionPlan::~AttentionPlan() = default;

const AttentionPlan::Impl& AttentionPlanAccess::impl(const AttentionPlan& p) {
  require_arg(p.impl_ != nullptr, "AttentionPlan: the plan was moved from");
  return *p.impl_;
}

int64_t AttentionPlan::n_rows() const { return AttentionPlanAccess::impl(*this).base.n_rows; }
int32_t AttentionPlan::num_splits() const { return AttentionPlanAccess::impl(*this).base.num_splits; }
int64_t AttentionPlan::max_seq_cells() const { return AttentionPlanAccess::impl(*this).base.max_seq_cells; }
size_t AttentionPlan::workspace_bytes() const { return AttentionPlanAccess::impl(*this).workspace_bytes; }

AttentionPlan AttentionPlan::decode(const PagedKV& pages, int32_t n_q_heads, const AttentionStep& step,
                                    const AttentionSchedule& schedule) {
  return ops::attn::plan_paged(false, pages, n_q_heads, step, schedule, ops::AttentionTuning{});
}

AttentionPlan AttentionPlan::prefill(const PagedKV& pages, int32_t n_q_heads, const AttentionStep& step,
                                     const AttentionSchedule& schedule) {
  return ops::attn::plan_paged(true, pages, n_q_heads, step, schedule, ops::AttentionTuning{});
}

TensorSignature signature_of(const TensorRef& t) {
  TensorSignature s;
  s.present = !t.empty();
  if (!s.present) return s;
  s.dtype = t.dtype();
  s.ndim = t.ndim();
  for (int d = 0; d < std::min(t.ndim(), 4); ++d) s.sizes[d] = t.size(d);
  s.contiguous = t.is_contiguous() && (t.data() != nullptr || t.numel() == 0);
  if (!s.contiguous)  // (contiguous views of one shape are laid out alike, whatever their size-1 strides)
    for (int d = 0; d < std::min(t.ndim(), 4); ++d) s.strides[d] = t.stride(d);
  s.device = t.device();
  return s;
}

PagesSignature signature_of(const PagedKV& pages) {
  PagesSignature s;
  s.k = signature_of(pages.k);
  s.v = signature_of(pages.v);
  s.k_scale = signature_of(pages.k_scale);
  s.v_scale = signature_of(pages.v_scale);
  s.positions = signature_of(pages.positions);
  s.valid = signature_of(pages.valid);
  s.rope_mode = pages.rope_mode;
  return s;
}

namespace {

constexpr const char* kDecode = "attention_decode";
constexpr const char* kPrefill = "attention_prefill";

void check_i32_vector(const char* op, const char* name, const TensorRef& t, int64_t n, Device dev) {
  checks::not_null(op, name, t);
  checks::ndim_is(op, name, t, 1);
  checks::dtype_is(op, name, t, DType::I32);
  if (n >= 0) checks::size_is(op, name, t, 0, n);
  require_arg(t.device() == dev, op, ": ", name, " is on ", t.device().str(), ", the pages on ", dev.str());
  require_arg(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

// The layout of a RoPE table fits head_dim (O(1): runs check it for every layer's table).
void check_rope_layout(const char* op, const math::RopeTable& t, int64_t head_dim) {
  const math::RopeLayout& l = t.layout;
  if (!(l.n_rot > 0 && l.n_rot % 2 == 0 && l.n_pairs() <= math::RopeTable::kMaxPairs && l.first_dim >= 0 &&
        l.first_dim + l.n_rot <= head_dim && (l.interleaved == 0 || l.interleaved == 1)))
    require_arg(false, op, ": pages.maybe_rope rotates dims [", l.first_dim, ", ", l.first_dim + l.n_rot,
                ") (interleaved ", l.interleaved, "), which is no even range inside head_dim = ", head_dim);
  if (!(std::isfinite(t.attention_factor) && t.attention_factor > 0))
    require_arg(false, op, ": pages.maybe_rope.attention_factor must be finite and > 0, got ", t.attention_factor);
}

// Tables: shapes always; contents (and the longest sequence) when read on the host.
int64_t check_tables(const char* op, const BlockTable& table, Device dev, int64_t num_blocks, int64_t block_size,
                     bool read_contents, bool has_positions, Stream stream) {
  checks::not_null(op, "table.indptr", table.indptr);
  checks::ndim_is(op, "table.indptr", table.indptr, 1);
  const int64_t batch = table.indptr.size(0) - 1;
  require_arg(batch >= 1, op, ": table.indptr must have batch + 1 >= 2 entries, got ", described(table.indptr));
  check_i32_vector(op, "table.indptr", table.indptr, batch + 1, dev);
  check_i32_vector(op, "table.last_page_len", table.last_page_len, batch, dev);
  check_i32_vector(op, "table.indices", table.indices, -1, dev);
  if (!table.pos_offset.empty()) {
    check_i32_vector(op, "table.pos_offset", table.pos_offset, batch, dev);
    require_arg(has_positions, op, ": table.pos_offset needs pages.positions");
  }
  if (!read_contents) return 0;
  int64_t max_cells = 0;
  const std::vector<int32_t> ip = host_i32(table.indptr, stream);
  const std::vector<int32_t> lp = host_i32(table.last_page_len, stream);
  require_arg(ip[0] == 0, op, ": table.indptr[0] must be 0, got ", ip[0]);
  for (int64_t b = 0; b < batch; ++b) {
    require_arg(ip[b + 1] >= ip[b], op, ": table.indptr must be non-decreasing, indptr[", b + 1, "] = ", ip[b + 1],
                " < indptr[", b, "] = ", ip[b]);
    if (ip[b + 1] > ip[b]) {
      require_arg(lp[b] >= 1 && lp[b] <= block_size, op, ": table.last_page_len[", b, "] = ", lp[b],
                  " must be in [1, block_size = ", block_size, "]");
      max_cells = std::max<int64_t>(max_cells, int64_t{ip[b + 1] - ip[b] - 1} * block_size + lp[b]);
    }
  }
  require_arg(table.indices.size(0) >= ip[batch], op, ": table.indices has ", table.indices.size(0),
              " entries but indptr[batch] = ", ip[batch]);
  const std::vector<int32_t> ix = host_i32(table.indices, stream);
  for (int64_t i = 0; i < ip[batch]; ++i)
    require_arg(ix[i] >= 0 && ix[i] < num_blocks, op, ": table.indices[", i, "] = ", ix[i],
                " is not a block id in [0, ", num_blocks, ")");
  return max_cells;
}

// The split-K factor `num_splits = 0` resolves to: on CUDA it fills the GPU in whole waves of
// the kernel chosen for this shape; on the CPU about two tasks a thread.
int32_t auto_splits(Device device, int64_t n_rows, int64_t n_kv_heads, int64_t n_q_heads, int64_t head_dim,
                    int64_t v_head_dim, math::KvElem kv, int64_t max_seq_cells, const ops::AttentionTuning& tuning,
                    bool rope_on_read) {
  const int64_t group = std::max<int64_t>(1, n_q_heads / n_kv_heads);
#if KVCORE_WITH_CUDA
  if (device.is_cuda())
    return ops::cuda::attention_choose_splits(device.index, n_rows, static_cast<int>(n_kv_heads), static_cast<int>(group),
                                              static_cast<int>(head_dim), static_cast<int>(v_head_dim), kv,
                                              static_cast<int>(tuning.kernel), max_seq_cells, rope_on_read,
                                              tuning.fat_ctas);
#endif
  (void)device;
  (void)head_dim;
  (void)v_head_dim;
  (void)kv;
  (void)tuning;
  (void)rope_on_read;
  const int64_t base = std::max<int64_t>(1, n_rows * n_kv_heads * ((group + 7) / 8));
  const int64_t target = 2 * int64_t{ops::attn::cpu_threads()};
  const int64_t min_chunk = 512;
  int64_t s = (target + base - 1) / base;
  if (max_seq_cells > 0) s = std::min(s, (max_seq_cells + min_chunk - 1) / min_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(s, 1, 128));
}

std::string describe(const TensorSignature& s) {
  if (!s.present) return "empty";
  std::string out = detail::concat(dtype_name(s.dtype), "[");
  for (int d = 0; d < s.ndim; ++d) out += detail::concat(d ? ", " : "", d < 4 ? s.sizes[d] : -1);
  out += detail::concat("] on ", s.device.str());
  if (s.contiguous) return out;
  out += " (strides [";
  for (int d = 0; d < s.ndim && d < 4; ++d) out += detail::concat(d ? ", " : "", s.strides[d]);
  return out + "])";
}

[[noreturn]] void pages_mismatch(const char* op, const PagesSignature& want, const PagesSignature& got) {
  auto name = [](RopeMode m) { return m == RopeMode::RopeOnRead ? "RopeOnRead" : "RopeStored"; };
  if (want.rope_mode != got.rope_mode)
    require_arg(false, op, ": pages.rope_mode is ", name(got.rope_mode), " but the plan was made for ",
                name(want.rope_mode), " pages");
  const struct {
    const char* name;
    const TensorSignature &want, &got;
  } fields[] = {{"pages.k", want.k, got.k},
                {"pages.v", want.v, got.v},
                {"pages.k_scale", want.k_scale, got.k_scale},
                {"pages.v_scale", want.v_scale, got.v_scale},
                {"pages.positions", want.positions, got.positions},
                {"pages.valid", want.valid, got.valid}};
  for (const auto& f : fields)
    if (!(f.want == f.got))
      require_arg(false, op, ": ", f.name, " is ", describe(f.got), " but the plan was made for ", describe(f.want));
  throw Error(ErrorCode::InvalidArgument, detail::concat(op, ": the pages do not match the plan"));
}

// Fills the per-layer page fields of p from pages whose signature equals the plan's.
void fill_pages(const PagedKV& pages, ops::PagedAttentionParams& p) {
  p.k = pages.k.data();
  p.v = pages.v.data();
  p.maybe_k_scale_u8 = p.maybe_v_scale_u8 = nullptr;
  p.maybe_k_scale_f32 = p.maybe_v_scale_f32 = nullptr;
  if (p.scale_mode == math::KvScaleMode::F32PerRow) {
    p.maybe_k_scale_f32 = pages.k_scale.data_as<const float>();
    p.maybe_v_scale_f32 = pages.v_scale.data_as<const float>();
  } else if (p.scale_mode == math::KvScaleMode::Ue8m0Per64) {
    p.maybe_k_scale_u8 = pages.k_scale.data_as<const uint8_t>();
    p.maybe_v_scale_u8 = pages.v_scale.data_as<const uint8_t>();
  }
  p.maybe_positions = pages.positions.empty() ? nullptr : pages.positions.data_as<const int32_t>();
  p.maybe_valid = pages.valid.empty() ? nullptr : pages.valid.data_as<const uint8_t>();
}

// q [n_rows, n_q_heads, head_dim] or out [n_rows, n_q_heads, v_head_dim] of a run: f32/f16/bf16 on
// the plan's device.
void check_rows(const char* op, const char* name, const TensorRef& t, const AttentionPlan::Impl& m, bool is_out) {
  const int64_t width = is_out ? m.v_head_dim : m.head_dim;
  const bool ok = t.ndim() == 3 && (t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16) &&
                  t.data() != nullptr && t.device() == m.device && t.size(0) == m.base.n_rows &&
                  t.size(1) == m.base.n_q_heads && t.size(2) == width && t.stride(2) == 1 && t.stride(1) >= 0 &&
                  t.stride(0) >= 0;
  if (!ok)
    require_arg(false, op, ": ", name, " must be f32, f16 or bf16 [n_rows = ", m.base.n_rows, ", n_q_heads = ",
                m.base.n_q_heads, is_out ? ", v_head_dim = " : ", head_dim = ", width, "] on ", m.device.str(),
                " with stride 1 in its last dim and no negative strides, got ", described(t));
}

}  // namespace

namespace ops::attn {

AttentionPlan plan_paged(bool prefill, const PagedKV& pages, int32_t n_q_heads, const AttentionStep& step,
                         const AttentionSchedule& schedule, const AttentionTuning& tuning) {
  const char* op = prefill ? kPrefill : kDecode;
  auto m = std::make_unique<AttentionPlan::Impl>();
  m->op = op;
  m->prefill = prefill;
  m->tuning = tuning;
  const Device dev = pages.k.device();
  m->device = dev;
  checks::backend_available(op, dev);
  require_arg(n_q_heads >= 1, op, ": n_q_heads must be >= 1, got ", n_q_heads);
  const int kernel = static_cast<int>(tuning.kernel);
  require_arg(kernel >= 0 && kernel <= 10, op, ": tuning.kernel must be 0 to 10, got ", kernel);
  require_arg(pages.rope_mode == RopeMode::RopeStored || pages.rope_mode == RopeMode::RopeOnRead, op,
              ": pages.rope_mode must be RopeStored or RopeOnRead, got ", static_cast<int>(pages.rope_mode));

  // ---- pages: the shared rule first (what attention reads at all), then every array
  checks::not_null(op, "pages.k", pages.k);
  checks::ndim_is(op, "pages.k", pages.k, 4);
  checks::not_null(op, "pages.v", pages.v);
  checks::ndim_is(op, "pages.v", pages.v, 4);
  const int64_t head_dim = pages.k.size(3);
  const std::string unreadable =
      ops::attention_cannot_read(dev, {pages.k.dtype(), pages.v.dtype(), head_dim, pages.v.size(3)});
  require_arg(unreadable.empty(), op, ": pages: ", unreadable);
  ops::PagedAttentionParams& p = m->base;
  ops::attn::check_pools(op, pages, dev, head_dim, n_q_heads, p);
  m->head_dim = head_dim;
  m->v_head_dim = p.v_head_dim;
  const int64_t v_head_dim = p.v_head_dim;  // the width of the partials and the output
  m->pages = signature_of(pages);
  const bool rope_on_read = pages.rope_mode == RopeMode::RopeOnRead;
  if (rope_on_read) {
    require_arg(pages.maybe_rope != nullptr, op, ": RopeOnRead pages need pages.maybe_rope (the layer's RoPE table)");
    check_rope_layout(op, *pages.maybe_rope, head_dim);
    for (int i = 0; i < pages.maybe_rope->layout.n_pairs(); ++i)
      require_arg(std::isfinite(pages.maybe_rope->freq[i]), op, ": pages.maybe_rope.freq[", i, "] must be finite, got ",
                  pages.maybe_rope->freq[i]);
  }
  const bool has_positions = !pages.positions.empty();
  require_arg(has_positions || !(prefill || rope_on_read), op, ": pages.positions is required (",
              rope_on_read ? "rope-on-read pages" : "causal prefill", ")");

  // ---- tables and rows
  const bool read_tables = schedule.check_tables || dev.is_cpu();
  const int64_t measured =
      check_tables(op, step.table, dev, p.num_blocks, p.layout.block_size, read_tables, has_positions, schedule.stream);
  const int64_t batch = step.table.indptr.size(0) - 1;
  int64_t n_rows = batch;
  if (prefill) {
    require_arg(!step.q_positions.empty(), op, ": step.q_positions is required (prefill)");
    checks::ndim_is(op, "step.q_positions", step.q_positions, 1);
    n_rows = step.q_positions.size(0);
    require_arg(n_rows >= 1 && n_rows < (int64_t{1} << 31), op, ": step.q_positions must hold 1 .. 2^31 - 1 rows, got ",
                described(step.q_positions));
    check_i32_vector(op, "step.qo_indptr", step.qo_indptr, batch + 1, dev);
    if (read_tables) {
      const std::vector<int32_t> h = host_i32(step.qo_indptr, schedule.stream);
      require_arg(h[0] == 0 && h[batch] == n_rows, op, ": step.qo_indptr must run from 0 to n_rows = ", n_rows,
                  " (step.q_positions' length), got ", h[0], " .. ", h[batch]);
      for (int64_t b = 0; b < batch; ++b)
        require_arg(h[b + 1] >= h[b], op, ": step.qo_indptr must be non-decreasing at ", b + 1);
    }
  } else {
    require_arg(step.qo_indptr.empty(), op, ": step.qo_indptr is for prefill; a decode step has one row a sequence");
  }
  require_arg(!rope_on_read || !step.q_positions.empty(), op,
              ": step.q_positions is required (rope-on-read pages: attention rotates the query)");
  if (!step.q_positions.empty()) check_i32_vector(op, "step.q_positions", step.q_positions, n_rows, dev);

  // ---- schedule
  require_arg(schedule.num_splits >= 0 && schedule.num_splits <= 1024, op, ": schedule.num_splits must be in [0, 1024], got ",
              schedule.num_splits);
  require_arg(schedule.max_seq_cells >= 0, op, ": schedule.max_seq_cells must be >= 0, got ", schedule.max_seq_cells);
  const int64_t cells = measured > 0 ? measured : schedule.max_seq_cells;
  int32_t splits = schedule.num_splits;
  const bool automatic = splits == 0;
  if (automatic)
    splits = auto_splits(dev, n_rows, p.layout.n_kv_heads, n_q_heads, head_dim, v_head_dim, p.kv_elem, cells, tuning, rope_on_read);
  std::byte* ws = nullptr;
  if (!schedule.maybe_workspace.empty()) {
    const TensorRef& w = schedule.maybe_workspace;
    checks::not_null(op, "schedule.maybe_workspace", w);
    require_arg(w.device() == dev, op, ": schedule.maybe_workspace is on ", w.device().str(), ", the pages on ", dev.str());
    require_arg(w.is_contiguous(), op, ": schedule.maybe_workspace must be contiguous");
    const size_t have = static_cast<size_t>(w.numel()) * w.element_size();
    while (automatic && splits > 1 && attention_workspace_bytes(n_rows, n_q_heads, v_head_dim, splits) > have) --splits;
    const size_t need = attention_workspace_bytes(n_rows, n_q_heads, v_head_dim, splits);
    require_arg(have >= need, op, ": schedule.maybe_workspace holds ", have, " bytes, ", need, " needed for ", splits,
                " splits");
    require_arg(reinterpret_cast<uintptr_t>(w.data()) % 16 == 0, op, ": schedule.maybe_workspace must be 16-byte aligned");
    ws = static_cast<std::byte*>(w.data());
    m->workspace_bytes = need;
  } else {
    m->workspace_bytes = attention_workspace_bytes(n_rows, n_q_heads, v_head_dim, splits);
    m->owned_workspace = Buffer(m->workspace_bytes, dev, 256);
    ws = static_cast<std::byte*>(m->owned_workspace.data());
  }

  // ---- everything a run shares
  p.indptr = step.table.indptr.data_as<const int32_t>();
  p.indices = step.table.indices.data_as<const int32_t>();
  p.n_indices = step.table.indices.size(0);
  p.last_page_len = step.table.last_page_len.data_as<const int32_t>();
  p.maybe_seq_pos_offset = step.table.pos_offset.empty() ? nullptr : step.table.pos_offset.data_as<const int32_t>();
  p.batch = static_cast<int32_t>(batch);
  p.n_rows = static_cast<int32_t>(n_rows);
  p.n_q_heads = n_q_heads;
  p.group = static_cast<int32_t>(n_q_heads / p.layout.n_kv_heads);
  p.maybe_qo_indptr = prefill ? step.qo_indptr.data_as<const int32_t>() : nullptr;
  p.maybe_q_positions = step.q_positions.empty() ? nullptr : step.q_positions.data_as<const int32_t>();
  p.causal = prefill ? 1 : 0;
  p.rope_on_read = rope_on_read ? 1 : 0;
  p.rotate_query = rope_on_read ? 1 : 0;
  p.num_splits = splits;
  p.max_seq_cells = cells;
  p.kernel_variant = kernel;
  p.o_part = reinterpret_cast<float*>(ws);
  p.lse_part = p.o_part + n_rows * n_q_heads * splits * v_head_dim;
  p.device = dev.index;
  return AttentionPlanAccess::make(std::move(m));
}

void run_params(const AttentionPlan& plan, const TensorRef& q, const PagedKV& pages, const TensorRef& out,
                const AttentionLayer& layer, Stream stream, PagedAttentionParams& p) {
  const AttentionPlan::Impl& m = AttentionPlanAccess::impl(plan);
  const char* op = m.op;
  check_rows(op, "q", q, m, false);
  check_rows(op, "out", out, m, true);
  const PagesSignature sig = signature_of(pages);
  if (!(sig == m.pages)) pages_mismatch(op, m.pages, sig);
  p = m.base;
  fill_pages(pages, p);
  if (p.rope_on_read) {
    if (pages.maybe_rope == nullptr)
      require_arg(false, op, ": RopeOnRead pages need pages.maybe_rope (the layer's RoPE table)");
    check_rope_layout(op, *pages.maybe_rope, m.head_dim);
    p.rope = *pages.maybe_rope;
  }
  // ---- the layer's semantics
  const float scale = layer.softmax_scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(m.head_dim)) : layer.softmax_scale;
  if (!(std::isfinite(scale) && scale > 0))
    require_arg(false, op, ": layer.softmax_scale must be finite and > 0 (or 0 for head_dim^-0.5), got ",
                layer.softmax_scale);
  if (layer.window < 0) require_arg(false, op, ": layer.window must be >= 0, got ", layer.window);
  if (layer.window > 0 && (p.maybe_q_positions == nullptr || p.maybe_positions == nullptr))
    require_arg(false, op, ": a layer with a window needs step.q_positions and pages.positions");
  p.maybe_sinks = nullptr;
  if (!layer.maybe_sinks.empty()) {
    const TensorRef& s = layer.maybe_sinks;
    if (!(s.ndim() == 1 && s.dtype() == DType::F32 && s.size(0) == m.base.n_q_heads && s.device() == m.device &&
          s.data() != nullptr && s.stride(0) == 1))
      require_arg(false, op, ": layer.maybe_sinks must be contiguous f32 [n_q_heads = ", m.base.n_q_heads, "] on ",
                  m.device.str(), ", got ", described(s));
    p.maybe_sinks = s.data_as<const float>();
  }
  p.softmax_scale = scale;
  p.window = layer.window;
  // ---- rows
  p.q = q.data();
  p.q_elem = ops::attn::q_elem_of(q.dtype());
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.out = out.data();
  p.out_elem = ops::attn::q_elem_of(out.dtype());
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.stream = stream;
}

void launch_paged(Device device, const PagedAttentionParams& p, const AttentionTuning& tuning) {
  if (device.is_cpu()) {
    ops::cpu::attention_paged(p);
    return;
  }
#if KVCORE_WITH_CUDA
  ops::cuda::attention_paged(p, tuning);
#else
  (void)tuning;
#endif
}

}  // namespace ops::attn

void AttentionPlan::run(const TensorRef& q, const PagedKV& pages, const TensorRef& out, const AttentionLayer& layer,
                        Stream stream) const {
  const Impl& m = AttentionPlanAccess::impl(*this);
  ops::PagedAttentionParams p;
  ops::attn::run_params(*this, q, pages, out, layer, stream, p);
  ops::attn::launch_paged(m.device, p, m.tuning);
}

}  // namespace kvcore
