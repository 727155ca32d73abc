// Entry point of DeepSeek-V4 sparse decode attention: validate, fill Params, dispatch.
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <vector>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/runtime.hpp"
#include "ops/attention_common.hpp"
#include "ops/attention_params.hpp"
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
  require_arg(t.device() == dev, kOp, ": ", name, " is on ", t.device().str(), ", q on ", dev.str());
  require_arg(t.is_contiguous(), kOp, ": ", name, " must be contiguous");
}

int32_t auto_splits(Device dev, int64_t n_rows, int64_t n_heads, int64_t n_keys) {
  // KVCORE_ATTN_SPLITS=N forces N splits, as for paged attention (A/B benchmarks of the choice below).
  static const int forced = [] {
    const char* v = std::getenv("KVCORE_ATTN_SPLITS");
    return v ? std::atoi(v) : 0;
  }();
  if (forced > 0) return static_cast<int32_t>(std::clamp<int64_t>(forced, 1, std::max<int64_t>(1, n_keys)));
  const int64_t base = std::max<int64_t>(1, n_rows * ((n_heads + 7) / 8));
  int64_t target = 2 * int64_t{ops::attn::cpu_threads()}, min_chunk = 128;
#if KVCORE_WITH_CUDA
  if (dev.is_cuda()) target = 4 * int64_t{ops::cuda::sm_count(dev.index)}, min_chunk = 64;
#endif
  (void)dev;
  int64_t s = (target + base - 1) / base;
  s = std::min(s, (n_keys + min_chunk - 1) / min_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(s, 1, 128));
}

}  // namespace

void attention_dsv4_decode(const Dsv4AttentionArgs& a, const TensorRef& out) {
  const Device dev = a.q.device();
  checks::backend_available(kOp, dev);
  ops::attn::check_float_tensor(kOp, "q", a.q, 3);
  ops::attn::check_float_tensor(kOp, "out", out, 3);
  checks::same_device(kOp, "q", a.q, "out", out);
  const int64_t n_rows = a.q.size(0), n_heads = a.q.size(1);
  require_arg(n_rows >= 1, kOp, ": the batch is empty (q is ", described(a.q), ")");
  require_arg(n_heads >= 1, kOp, ": q must have at least one head, got ", described(a.q));
  require_arg(a.q.size(2) == kDim, kOp, ": q must have head_dim 512, got ", described(a.q));
  for (int d = 0; d < 3; ++d)
    require_arg(out.size(d) == a.q.size(d), kOp, ": out must have q's shape ", shape_of(a.q), ", got ", described(out));

  checks::not_null(kOp, "window_kv", a.window_kv);
  checks::ndim_is(kOp, "window_kv", a.window_kv, 3);
  require_arg(a.window_kv.dtype() == DType::F32 || a.window_kv.dtype() == DType::F16, kOp,
              ": window_kv must be f32 or f16, got ", dtype_name(a.window_kv.dtype()));
  checks::same_device(kOp, "q", a.q, "window_kv", a.window_kv);
  if (a.window_index.empty()) checks::size_is(kOp, "window_kv", a.window_kv, 0, n_rows);
  else check_i32_vector(a.window_index, "window_index", n_rows, dev);
  checks::size_is(kOp, "window_kv", a.window_kv, 2, kDim);
  checks::innermost_contiguous(kOp, "window_kv", a.window_kv);
  checks::non_negative_strides(kOp, "window_kv", a.window_kv);
  const int64_t n_window = a.window_kv.size(1);
  require_arg(n_window <= 128, kOp, ": at most 128 window rows, got ", n_window);
  check_i32_vector(a.window_len, "window_len", n_rows, dev);
  check_i32_vector(a.q_positions, "q_positions", n_rows, dev);

  int64_t k = 0, n_comp = 0;
  if (!a.comp_idx.empty()) {
    checks::not_null(kOp, "comp_idx", a.comp_idx);
    checks::ndim_is(kOp, "comp_idx", a.comp_idx, 2);
    checks::dtype_is(kOp, "comp_idx", a.comp_idx, DType::I32);
    checks::size_is(kOp, "comp_idx", a.comp_idx, 0, n_rows);
    checks::same_device(kOp, "q", a.q, "comp_idx", a.comp_idx);
    checks::innermost_contiguous(kOp, "comp_idx", a.comp_idx);
    checks::non_negative_strides(kOp, "comp_idx", a.comp_idx);
    k = a.comp_idx.size(1);
    require_arg(!a.comp_rows.empty(), kOp, ": comp_idx is given but comp_rows is empty");
    checks::not_null(kOp, "comp_rows", a.comp_rows);
    checks::ndim_is(kOp, "comp_rows", a.comp_rows, 2);
    require_arg(a.comp_rows.dtype() == DType::U8, kOp, ": comp_rows must be u8 packed rows, got ",
                dtype_name(a.comp_rows.dtype()));
    checks::size_is(kOp, "comp_rows", a.comp_rows, 1, math::Dsv4RowLayout::kBytes);
    checks::same_device(kOp, "q", a.q, "comp_rows", a.comp_rows);
    checks::innermost_contiguous(kOp, "comp_rows", a.comp_rows);
    checks::non_negative_strides(kOp, "comp_rows", a.comp_rows);
    require_arg(a.comp_rows.size(0) <= 1 || a.comp_rows.stride(0) >= math::Dsv4RowLayout::kBytes, kOp,
                ": comp_rows rows overlap (stride ", a.comp_rows.stride(0), ")");
    n_comp = a.comp_rows.size(0);
  }
  if (!a.sinks.empty()) {
    checks::not_null(kOp, "sinks", a.sinks);
    checks::ndim_is(kOp, "sinks", a.sinks, 1);
    checks::dtype_is(kOp, "sinks", a.sinks, DType::F32);
    checks::size_is(kOp, "sinks", a.sinks, 0, n_heads);
    checks::same_device(kOp, "q", a.q, "sinks", a.sinks);
    require_arg(a.sinks.is_contiguous(), kOp, ": sinks must be contiguous");
  }
  require_arg(std::isfinite(a.softmax_scale) && a.softmax_scale > 0, kOp, ": softmax_scale must be finite and > 0, got ",
              a.softmax_scale);
  require_arg(a.num_splits >= 0 && a.num_splits <= 1024, kOp, ": num_splits must be in [0, 1024], got ", a.num_splits);
  const math::RopeTable rope = make_rope_table(a.rope, static_cast<int>(kDim));  // validates the spec

  if (dev.is_cpu() || a.check_indices) {
    if (!a.window_index.empty()) {
      const std::vector<int32_t> wi = ops::attn::host_i32(a.window_index);
      for (int64_t r = 0; r < n_rows; ++r)
        require_arg(wi[r] >= 0 && wi[r] < a.window_kv.size(0), kOp, ": window_index[", r, "] = ", wi[r],
                    " must be in [0, ", a.window_kv.size(0), ")");
    }
    const std::vector<int32_t> wl = ops::attn::host_i32(a.window_len);
    for (int64_t r = 0; r < n_rows; ++r)
      require_arg(wl[r] >= 0 && wl[r] <= n_window, kOp, ": window_len[", r, "] = ", wl[r], " must be in [0, ", n_window,
                  "]");
    if (k > 0) {
      // comp_idx may be strided by rows: copy row by row.
      std::vector<int32_t> row(static_cast<size_t>(k));
      for (int64_t r = 0; r < n_rows; ++r) {
        copy_bytes(row.data(), Device::cpu(), a.comp_idx.data_as<const int32_t>() + r * a.comp_idx.stride(0), dev,
                   row.size() * sizeof(int32_t));
        for (int64_t i = 0; i < k; ++i)
          require_arg(row[i] >= -1 && row[i] < n_comp, kOp, ": comp_idx[", r, ", ", i, "] = ", row[i],
                      " must be -1 or a row in [0, ", n_comp, ")");
      }
    }
  }

  ops::Dsv4AttentionParams p{};
  p.q = a.q.data();
  p.q_elem = ops::attn::q_elem_of(a.q.dtype());
  p.q_row_stride = a.q.stride(0);
  p.q_head_stride = a.q.stride(1);
  p.n_rows = static_cast<int32_t>(n_rows);
  p.n_heads = static_cast<int32_t>(n_heads);
  p.window_kv = a.window_kv.data();
  p.window_f16 = a.window_kv.dtype() == DType::F16 ? 1 : 0;
  p.win_row_stride = a.window_kv.stride(0);
  p.win_tok_stride = a.window_kv.stride(1);
  p.n_window = static_cast<int32_t>(n_window);
  p.window_len = a.window_len.data_as<const int32_t>();
  p.maybe_window_index = a.window_index.empty() ? nullptr : a.window_index.data_as<const int32_t>();
  p.maybe_comp_rows = k > 0 ? a.comp_rows.data_as<const uint8_t>() : nullptr;
  p.comp_stride = k > 0 ? a.comp_rows.stride(0) : 0;
  p.maybe_comp_idx = k > 0 ? a.comp_idx.data_as<const int32_t>() : nullptr;
  p.comp_idx_stride = k > 0 ? a.comp_idx.stride(0) : 0;
  p.comp_k = static_cast<int32_t>(k);
  p.maybe_sinks = a.sinks.empty() ? nullptr : a.sinks.data_as<const float>();
  p.q_positions = a.q_positions.data_as<const int32_t>();
  p.rope = rope;
  p.softmax_scale = a.softmax_scale;
  p.out = out.data();
  p.out_elem = ops::attn::q_elem_of(out.dtype());
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.stream = a.stream;
  p.device = dev.index;

  int32_t splits = a.num_splits;
  const bool automatic = splits == 0;
  if (automatic) splits = auto_splits(dev, n_rows, n_heads, n_window + k);
  Buffer owned;
  std::byte* ws = nullptr;
  if (!a.workspace.empty()) {
    checks::same_device(kOp, "q", a.q, "workspace", a.workspace);
    checks::not_null(kOp, "workspace", a.workspace);
    require_arg(a.workspace.is_contiguous(), kOp, ": workspace must be contiguous");
    const size_t have = static_cast<size_t>(a.workspace.numel()) * a.workspace.element_size();
    while (automatic && splits > 1 && attention_workspace_bytes(n_rows, n_heads, kDim, splits) > have) --splits;
    const size_t need = attention_workspace_bytes(n_rows, n_heads, kDim, splits);
    require_arg(have >= need, kOp, ": workspace holds ", have, " bytes, ", need, " needed for ", splits, " splits");
    require_arg(reinterpret_cast<uintptr_t>(a.workspace.data()) % 16 == 0, kOp, ": workspace must be 16-byte aligned");
    ws = static_cast<std::byte*>(a.workspace.data());
  } else {
    owned = Buffer(attention_workspace_bytes(n_rows, n_heads, kDim, splits), dev, 256);
    ws = static_cast<std::byte*>(owned.data());
  }
  p.num_splits = splits;
  p.o_part = reinterpret_cast<float*>(ws);
  p.lse_part = p.o_part + n_rows * n_heads * splits * kDim;
  if (dev.is_cpu()) {
    ops::cpu::attention_dsv4(p);
  } else {
#if KVCORE_WITH_CUDA
    ops::cuda::attention_dsv4(p);
    if (a.workspace.empty()) synchronize(dev, a.stream);
#endif
  }
}

}  // namespace kvcore
