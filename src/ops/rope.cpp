// rope_apply entry points: validate every argument, fill RopeApplyParams, dispatch on device.
#include "kvcore/ops/rope.hpp"

#include <algorithm>
#include <cmath>

#include "ops/checks.hpp"
#include "ops/rope_params.hpp"

namespace kvcore {
namespace {

constexpr const char* kOp = "rope_apply";

bool is_rope_storage(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// The rows [tokens, heads] x head_dim contiguous elements of t never share an element:
// sorted by stride, each dim must step past everything the dims inside it cover.
bool rows_disjoint(const TensorRef& t) {
  struct Dim { int64_t stride, extent; };
  Dim d[2] = {{t.stride(0), t.size(0)}, {t.stride(1), t.size(1)}};
  if (d[0].stride > d[1].stride) std::swap(d[0], d[1]);
  int64_t covered = t.size(2);  // elements a row spans
  for (const Dim& k : d) {
    if (k.extent <= 1) continue;
    if (k.stride < covered) return false;
    covered = k.stride * (k.extent - 1) + covered;
  }
  return true;
}

void check_rows(const char* name, const TensorRef& t) {
  checks::not_null(kOp, name, t);
  checks::ndim_is(kOp, name, t, 3);
  require_arg(is_rope_storage(t.dtype()), kOp, ": ", name, " must be f32, f16 or bf16, got ", dtype_name(t.dtype()));
  checks::innermost_contiguous(kOp, name, t);
  checks::non_negative_strides(kOp, name, t);
}

void check_table(const math::RopeTable& table, int64_t head_dim) {
  const math::RopeLayout& l = table.layout;
  require_arg(l.n_rot > 0 && l.n_rot % 2 == 0, kOp, ": table.layout.n_rot must be even and > 0, got ", l.n_rot);
  require_arg(l.n_pairs() <= math::RopeTable::kMaxPairs, kOp, ": table.layout.n_rot = ", l.n_rot, " exceeds ",
              2 * math::RopeTable::kMaxPairs);
  require_arg(l.first_dim >= 0 && l.first_dim + l.n_rot <= head_dim, kOp, ": table rotates dims [", l.first_dim, ", ",
              l.first_dim + l.n_rot, ") which do not fit head_dim = ", head_dim);
  require_arg(l.interleaved == 0 || l.interleaved == 1, kOp, ": table.layout.interleaved must be 0 or 1, got ",
              l.interleaved);
  for (int i = 0; i < l.n_pairs(); ++i)
    require_arg(std::isfinite(table.freq[i]), kOp, ": table.freq[", i, "] must be finite, got ", table.freq[i]);
  require_arg(std::isfinite(table.attention_factor) && table.attention_factor > 0, kOp,
              ": table.attention_factor must be finite and > 0, got ", table.attention_factor);
}

void run(const TensorRef& x, const TensorRef& positions, const math::RopeTable& table, RopeAttentionFactor factor,
         const TensorRef& out, Stream stream) {
  check_rows("x", x);
  const int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
  check_table(table, head_dim);
  require_arg(factor == RopeAttentionFactor::Skip || factor == RopeAttentionFactor::Apply, kOp,
              ": factor must be Skip or Apply, got ", static_cast<int>(factor));

  checks::not_null(kOp, "positions", positions);
  checks::ndim_is(kOp, "positions", positions, 1);
  require_arg(positions.dtype() == DType::I32 || positions.dtype() == DType::I64, kOp,
              ": positions must be i32 or i64, got ", dtype_name(positions.dtype()));
  checks::size_is(kOp, "positions", positions, 0, tokens);
  checks::non_negative_strides(kOp, "positions", positions);
  checks::same_device(kOp, "x", x, "positions", positions);

  const bool in_place = out.data() == x.data() && out.ndim() == 3 && out.stride(0) == x.stride(0) &&
                        out.stride(1) == x.stride(1) && out.dtype() == x.dtype() && out.device() == x.device() &&
                        out.size(0) == tokens && out.size(1) == heads && out.size(2) == head_dim;
  if (!in_place) {
    check_rows("out", out);
    checks::dtype_is(kOp, "out", out, x.dtype());
    for (int d = 0; d < 3; ++d) checks::size_is(kOp, "out", out, d, x.size(d));
    checks::same_device(kOp, "x", x, "out", out);
    if (x.numel() > 0) {
      const auto* xb = static_cast<const char*>(x.data());
      const auto* ob = static_cast<const char*>(out.data());
      const bool overlap = xb < ob + out.span_bytes() && ob < xb + x.span_bytes();
      require_arg(!overlap, kOp, ": out ", described(out), " overlaps x ", described(x),
                  " without being the same view (pass x itself to rotate in place)");
    }
  }
  const TensorRef& written = in_place ? x : out;
  require_arg(rows_disjoint(written), kOp, ": the rows of ", in_place ? "x" : "out", " ", described(written),
              " with strides [", written.stride(0), ", ", written.stride(1), ", 1] overlap, so writes would race");
  if (written.numel() > 0 && positions.numel() > 0) {
    const auto* wb = static_cast<const char*>(written.data());
    const auto* pb = static_cast<const char*>(positions.data());
    require_arg(!(pb < wb + written.span_bytes() && wb < pb + positions.span_bytes()), kOp, ": positions ",
                described(positions), " overlap the rows being written");
  }
  checks::backend_available(kOp, x.device());
  if (tokens == 0 || heads == 0) return;

  RopeApplyParams p;
  p.x = x.data();
  p.out = written.data();
  p.positions = positions.data();
  p.tokens = tokens;
  p.heads = heads;
  p.head_dim = static_cast<int32_t>(head_dim);
  p.x_stride_token = x.stride(0);
  p.x_stride_head = x.stride(1);
  p.out_stride_token = written.stride(0);
  p.out_stride_head = written.stride(1);
  p.pos_stride = positions.stride(0);
  p.dtype = x.dtype();
  p.pos_dtype = positions.dtype();
  p.in_place = in_place;
  p.magnitude = factor == RopeAttentionFactor::Apply ? table.attention_factor : 1.0f;
  p.table = table;

  if (x.device().is_cpu()) {
    cpu::rope_apply(p);
    return;
  }
#if KVCORE_WITH_CUDA
  ops::cuda::rope_apply(p, x.device().index, stream);
#else
  (void)stream;
  throw Error(ErrorCode::NotSupported, "rope_apply: no CUDA backend in this build");
#endif
}

math::RopeTable table_for(const RopeSpec& spec, const TensorRef& x) {
  require_arg(x.ndim() == 3, kOp, ": x must have 3 dims [tokens, heads, head_dim], got ", described(x));
  require_arg(x.size(2) <= (int64_t{1} << 30), kOp, ": head_dim = ", x.size(2), " is too large");
  return make_rope_table(spec, static_cast<int>(x.size(2)));  // validates the spec against head_dim
}

}  // namespace

void rope_apply(const TensorRef& x, const TensorRef& positions, const RopeSpec& spec, RopeAttentionFactor factor,
                Stream stream) {
  run(x, positions, table_for(spec, x), factor, x, stream);
}

void rope_apply(const TensorRef& x, const TensorRef& positions, const RopeSpec& spec, RopeAttentionFactor factor,
                const TensorRef& out, Stream stream) {
  run(x, positions, table_for(spec, x), factor, out, stream);
}

void rope_apply(const TensorRef& x, const TensorRef& positions, const math::RopeTable& table,
                RopeAttentionFactor factor, Stream stream) {
  run(x, positions, table, factor, x, stream);
}

void rope_apply(const TensorRef& x, const TensorRef& positions, const math::RopeTable& table,
                RopeAttentionFactor factor, const TensorRef& out, Stream stream) {
  run(x, positions, table, factor, out, stream);
}

}  // namespace kvcore
