// Entry points of paged decode and prefill attention: validate every
// argument (nothing is written before all checks pass), fill the Params,
// dispatch on the device.
#include "kvcore/ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvcore/runtime.hpp"
#include "ops/attention_common.hpp"
#include "ops/attention_params.hpp"
#include "ops/checks.hpp"

namespace kvcore {

using ops::attn::host_i32;

size_t attention_workspace_bytes(int64_t n_rows, int64_t n_q_heads, int64_t head_dim, int32_t num_splits) {
  require_arg(n_rows >= 0 && n_q_heads >= 0 && head_dim >= 0, "attention_workspace_bytes: sizes must be >= 0, got n_rows ",
              n_rows, ", n_q_heads ", n_q_heads, ", head_dim ", head_dim);
  require_arg(num_splits >= 1, "attention_workspace_bytes: num_splits must be >= 1 (see attention_auto_splits), got ",
              num_splits);
  const int64_t parts = n_rows * n_q_heads * num_splits;
  return static_cast<size_t>(parts * head_dim + parts) * sizeof(float);
}

int32_t attention_auto_splits(Device device, int64_t n_rows, int64_t n_kv_heads, int64_t n_q_heads, int64_t head_dim,
                              DType kv_dtype, int64_t max_seq_cells, int32_t kernel_variant, bool rope_on_read) {
  const int64_t group = n_kv_heads > 0 ? std::max<int64_t>(1, n_q_heads / n_kv_heads) : 1;
#if KVCORE_WITH_CUDA
  if (device.is_cuda() && (head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512)) {
    const math::KvElem kv = kv_dtype == DType::F32    ? math::KvElem::F32
                            : kv_dtype == DType::F16  ? math::KvElem::F16
                            : kv_dtype == DType::BF16 ? math::KvElem::BF16
                                                      : math::KvElem::E4M3;
    return ops::cuda::attention_choose_splits(device.index, n_rows, static_cast<int>(n_kv_heads), static_cast<int>(group),
                                              static_cast<int>(head_dim), kv, kernel_variant, max_seq_cells,
                                              rope_on_read);
  }
#endif
  (void)head_dim;
  (void)kv_dtype;
  (void)kernel_variant;
  (void)rope_on_read;
  const int64_t base = std::max<int64_t>(1, n_rows * n_kv_heads * ((group + 7) / 8));
  int64_t target;
  int64_t min_chunk;
  if (device.is_cuda()) {
#if KVCORE_WITH_CUDA
    target = 4 * int64_t{ops::cuda::sm_count(device.index)};  // ~4 resident CTAs of 4 warps per SM
#else
    target = 4;
#endif
    min_chunk = 128;
  } else {
    target = 2 * int64_t{ops::attn::cpu_threads()};
    min_chunk = 512;
  }
  int64_t s = (target + base - 1) / base;
  if (max_seq_cells > 0) s = std::min(s, (max_seq_cells + min_chunk - 1) / min_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(s, 1, 128));
}

namespace {

constexpr const char* kDecode = "attention_decode";
constexpr const char* kPrefill = "attention_prefill";


// Validates kv + table + options; fills everything in p except q/out/rows.
struct Validated {
  ops::PagedAttentionParams p{};
  int64_t max_seq_cells = 0;  // known when the tables were read on the host
};

void validate_and_fill(const char* op, const TensorRef& q, const TensorRef& out, const PagedKV& kv,
                       const BlockTable& table, const AttentionOptions& opt, int64_t n_rows, bool prefill,
                       const TensorRef* qo_indptr, Validated& v) {
  const Device dev = q.device();
  checks::backend_available(op, dev);
  ops::attn::check_float_tensor(op, "q", q, 3);
  ops::attn::check_float_tensor(op, "out", out, 3);
  checks::same_device(op, "q", q, "out", out);
  require_arg(n_rows >= 1, op, ": the batch is empty (q has ", q.size(0), " rows)");
  for (int d = 0; d < 3; ++d)
    require_arg(out.size(d) == q.size(d), op, ": out must have q's shape ", shape_of(q), ", got ", described(out));
  const int64_t n_q_heads = q.size(1), head_dim = q.size(2);
  require_arg(n_q_heads >= 1, op, ": q must have at least one head, got ", described(q));

  // ---- pools
  ops::attn::check_pools(op, kv, dev, head_dim, n_q_heads, v.p);
  const int32_t block_size = v.p.layout.block_size;
  const int32_t num_blocks = v.p.num_blocks;

  // ---- block table
  const int64_t batch = table.indptr.defined() && table.indptr.ndim() == 1 ? table.indptr.size(0) - 1 : -1;
  checks::not_null(op, "table.indptr", table.indptr);
  checks::ndim_is(op, "table.indptr", table.indptr, 1);
  checks::dtype_is(op, "table.indptr", table.indptr, DType::I32);
  checks::same_device(op, "q", q, "table.indptr", table.indptr);
  require_arg(batch >= 1, op, ": table.indptr must have batch + 1 >= 2 entries, got ", described(table.indptr));
  require_arg(table.indptr.is_contiguous(), op, ": table.indptr must be contiguous");
  checks::not_null(op, "table.last_page_len", table.last_page_len);
  checks::ndim_is(op, "table.last_page_len", table.last_page_len, 1);
  checks::dtype_is(op, "table.last_page_len", table.last_page_len, DType::I32);
  checks::same_device(op, "q", q, "table.last_page_len", table.last_page_len);
  checks::size_is(op, "table.last_page_len", table.last_page_len, 0, batch);
  require_arg(table.last_page_len.is_contiguous(), op, ": table.last_page_len must be contiguous");
  checks::not_null(op, "table.indices", table.indices);
  checks::ndim_is(op, "table.indices", table.indices, 1);
  checks::dtype_is(op, "table.indices", table.indices, DType::I32);
  checks::same_device(op, "q", q, "table.indices", table.indices);
  require_arg(table.indices.is_contiguous(), op, ": table.indices must be contiguous");
  if (!prefill)
    require_arg(batch == n_rows, op, ": q has ", n_rows, " rows but the block table holds ", batch, " sequences");
  if (!table.pos_offset.empty()) {
    checks::not_null(op, "table.pos_offset", table.pos_offset);
    checks::ndim_is(op, "table.pos_offset", table.pos_offset, 1);
    checks::dtype_is(op, "table.pos_offset", table.pos_offset, DType::I32);
    checks::size_is(op, "table.pos_offset", table.pos_offset, 0, batch);
    checks::same_device(op, "q", q, "table.pos_offset", table.pos_offset);
    require_arg(table.pos_offset.is_contiguous(), op, ": table.pos_offset must be contiguous");
    require_arg(!kv.positions.empty(), op, ": table.pos_offset needs kv.positions");
  }

  if (opt.check_tables || dev.is_cpu()) {
    const std::vector<int32_t> ip = host_i32(table.indptr);
    const std::vector<int32_t> lp = host_i32(table.last_page_len);
    require_arg(ip[0] == 0, op, ": table.indptr[0] must be 0, got ", ip[0]);
    for (int64_t b = 0; b < batch; ++b) {
      require_arg(ip[b + 1] >= ip[b], op, ": table.indptr must be non-decreasing, indptr[", b + 1, "] = ", ip[b + 1],
                  " < indptr[", b, "] = ", ip[b]);
      if (ip[b + 1] > ip[b]) {
        require_arg(lp[b] >= 1 && lp[b] <= block_size, op, ": table.last_page_len[", b, "] = ", lp[b],
                    " must be in [1, block_size = ", block_size, "]");
        v.max_seq_cells = std::max<int64_t>(v.max_seq_cells, int64_t{ip[b + 1] - ip[b] - 1} * block_size + lp[b]);
      }
    }
    require_arg(table.indices.size(0) >= ip[batch], op, ": table.indices has ", table.indices.size(0),
                " entries but indptr[batch] = ", ip[batch]);
    const std::vector<int32_t> ix = host_i32(table.indices);
    for (int64_t i = 0; i < ip[batch]; ++i)
      require_arg(ix[i] >= 0 && ix[i] < num_blocks, op, ": table.indices[", i, "] = ", ix[i],
                  " is not a block id in [0, ", num_blocks, ")");
  }

  // ---- options
  require_arg(std::isfinite(opt.softmax_scale) && opt.softmax_scale > 0, op, ": softmax_scale must be finite and > 0, got ",
              opt.softmax_scale);
  require_arg(opt.window >= 0, op, ": window must be >= 0, got ", opt.window);
  if (!opt.sinks.empty()) {
    checks::not_null(op, "sinks", opt.sinks);
    checks::ndim_is(op, "sinks", opt.sinks, 1);
    checks::dtype_is(op, "sinks", opt.sinks, DType::F32);
    checks::size_is(op, "sinks", opt.sinks, 0, n_q_heads);
    checks::same_device(op, "q", q, "sinks", opt.sinks);
    require_arg(opt.sinks.is_contiguous(), op, ": sinks must be contiguous");
  }
  const bool need_qpos = prefill || opt.window > 0 || opt.rotate_query;
  if (!opt.q_positions.empty() || need_qpos) {
    require_arg(!opt.q_positions.empty(), op, ": q_positions is required (", prefill ? "prefill" : "window or rotate_query",
                ")");
    checks::not_null(op, "q_positions", opt.q_positions);
    checks::ndim_is(op, "q_positions", opt.q_positions, 1);
    checks::dtype_is(op, "q_positions", opt.q_positions, DType::I32);
    checks::size_is(op, "q_positions", opt.q_positions, 0, n_rows);
    checks::same_device(op, "q", q, "q_positions", opt.q_positions);
    require_arg(opt.q_positions.is_contiguous(), op, ": q_positions must be contiguous");
  }
  const bool need_kpos = prefill || opt.window > 0 || opt.rope_on_read.has_value();
  require_arg(!need_kpos || !kv.positions.empty(), op, ": kv.positions is required (",
              opt.rope_on_read ? "rope-on-read" : (prefill ? "causal prefill" : "window"), ")");
  require_arg(!opt.rotate_query || opt.rope_on_read.has_value(), op, ": rotate_query needs rope_on_read");
  if (opt.rope_on_read) v.p.rope = make_rope_table(*opt.rope_on_read, static_cast<int>(head_dim));  // validates
  require_arg(opt.num_splits >= 0 && opt.num_splits <= 1024, op, ": num_splits must be in [0, 1024], got ",
              opt.num_splits);

  // ---- prefill rows
  if (prefill) {
    const TensorRef& qi = *qo_indptr;
    checks::not_null(op, "qo_indptr", qi);
    checks::ndim_is(op, "qo_indptr", qi, 1);
    checks::dtype_is(op, "qo_indptr", qi, DType::I32);
    checks::size_is(op, "qo_indptr", qi, 0, batch + 1);
    checks::same_device(op, "q", q, "qo_indptr", qi);
    require_arg(qi.is_contiguous(), op, ": qo_indptr must be contiguous");
    if (opt.check_tables || dev.is_cpu()) {
      const std::vector<int32_t> h = host_i32(qi);
      require_arg(h[0] == 0 && h[batch] == n_rows, op, ": qo_indptr must run from 0 to n_tokens = ", n_rows, ", got ",
                  h[0], " .. ", h[batch]);
      for (int64_t b = 0; b < batch; ++b)
        require_arg(h[b + 1] >= h[b], op, ": qo_indptr must be non-decreasing at ", b + 1);
    }
  }

  // ---- fill the rest
  auto& p = v.p;
  p.indptr = table.indptr.data_as<const int32_t>();
  p.indices = table.indices.data_as<const int32_t>();
  p.n_indices = table.indices.size(0);
  p.last_page_len = table.last_page_len.data_as<const int32_t>();
  p.maybe_seq_pos_offset = table.pos_offset.empty() ? nullptr : table.pos_offset.data_as<const int32_t>();
  p.batch = static_cast<int32_t>(batch);
  p.q = q.data();
  p.q_elem = ops::attn::q_elem_of(q.dtype());
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.n_rows = static_cast<int32_t>(n_rows);
  p.n_q_heads = static_cast<int32_t>(n_q_heads);
  p.group = static_cast<int32_t>(n_q_heads / v.p.layout.n_kv_heads);
  p.maybe_qo_indptr = prefill ? qo_indptr->data_as<const int32_t>() : nullptr;
  p.maybe_q_positions = opt.q_positions.empty() ? nullptr : opt.q_positions.data_as<const int32_t>();
  p.causal = prefill ? 1 : 0;
  p.window = opt.window;
  p.maybe_sinks = opt.sinks.empty() ? nullptr : opt.sinks.data_as<const float>();
  p.softmax_scale = opt.softmax_scale;
  p.rope_on_read = opt.rope_on_read ? 1 : 0;
  p.rotate_query = opt.rotate_query ? 1 : 0;
  p.out = out.data();
  p.out_elem = ops::attn::q_elem_of(out.dtype());
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.stream = opt.stream;
  p.device = dev.index;
  require_arg(opt.kernel_variant >= 0 && opt.kernel_variant <= 4, op, ": kernel_variant must be 0 to 4, got ",
              opt.kernel_variant);
  p.kernel_variant = opt.kernel_variant;
  (void)num_blocks;
}

DType q_kv_dtype(const ops::PagedAttentionParams& p) {
  switch (p.kv_elem) {
    case math::KvElem::F32: return DType::F32;
    case math::KvElem::F16: return DType::F16;
    case math::KvElem::BF16: return DType::BF16;
    case math::KvElem::E4M3: return DType::E4M3;
  }
  return DType::F16;
}

void run(const char* op, Validated& v, const TensorRef& q, const AttentionOptions& opt) {
  auto& p = v.p;
  const Device dev = q.device();
  const int64_t head_dim = q.size(2);
  // Split-K: the automatic choice shrinks to what a given workspace holds.
  int32_t splits = opt.num_splits;
  const bool automatic = splits == 0;
  int64_t cells_for_split = v.max_seq_cells > 0 ? v.max_seq_cells : opt.max_seq_cells;
  if (automatic)
    splits = attention_auto_splits(dev, p.n_rows, p.layout.n_kv_heads, p.n_q_heads, head_dim, q_kv_dtype(p),
                                   cells_for_split, p.kernel_variant, p.rope_on_read);
  Buffer owned;
  std::byte* ws = nullptr;
  if (!opt.workspace.empty()) {
    const TensorRef& w = opt.workspace;
    checks::same_device(op, "q", q, "workspace", w);
    checks::not_null(op, "workspace", w);
    require_arg(w.is_contiguous(), op, ": workspace must be contiguous");
    const size_t have = static_cast<size_t>(w.numel()) * w.element_size();
    while (automatic && splits > 1 && attention_workspace_bytes(p.n_rows, p.n_q_heads, head_dim, splits) > have) --splits;
    const size_t need = attention_workspace_bytes(p.n_rows, p.n_q_heads, head_dim, splits);
    require_arg(have >= need, op, ": workspace holds ", have, " bytes, ", need, " needed for ", splits, " splits");
    require_arg(reinterpret_cast<uintptr_t>(w.data()) % 16 == 0, op, ": workspace must be 16-byte aligned");
    ws = static_cast<std::byte*>(w.data());
  } else {
    owned = Buffer(attention_workspace_bytes(p.n_rows, p.n_q_heads, head_dim, splits), dev, 256);
    ws = static_cast<std::byte*>(owned.data());
  }
  p.num_splits = splits;
  p.max_seq_cells = cells_for_split;
  p.o_part = reinterpret_cast<float*>(ws);
  p.lse_part = p.o_part + int64_t{p.n_rows} * p.n_q_heads * splits * head_dim;
  if (dev.is_cpu()) {
    ops::cpu::attention_paged(p);
  } else {
#if KVCORE_WITH_CUDA
    ops::cuda::attention_paged(p);
    if (!opt.workspace.empty()) return;
    synchronize(dev, opt.stream);  // the owned workspace dies here
#endif
  }
}

}  // namespace

void attention_decode(const TensorRef& q, const PagedKV& kv, const BlockTable& table, const TensorRef& out,
                      const AttentionOptions& opt) {
  Validated v;
  validate_and_fill(kDecode, q, out, kv, table, opt, q.ndim() == 3 ? q.size(0) : 0, false, nullptr, v);
  run(kDecode, v, q, opt);
}

void attention_prefill(const TensorRef& q, const TensorRef& qo_indptr, const PagedKV& kv, const BlockTable& table,
                       const TensorRef& out, const AttentionOptions& opt) {
  Validated v;
  validate_and_fill(kPrefill, q, out, kv, table, opt, q.ndim() == 3 ? q.size(0) : 0, true, &qo_indptr, v);
  run(kPrefill, v, q, opt);
}

}  // namespace kvcore
