// Argument checks and Params filling shared by the DeepSeek-V4 op entry points
// (src/ops/dsv4*.cpp). Every check throws kvcore::Error(InvalidArgument) naming
// the argument.
#pragma once
#include <cmath>
#include <string_view>

#include "kvcore/math/dsv4.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "ops/checks.hpp"
#include "ops/dsv4_backends.hpp"

namespace kvcore::dsv4_checks {

using std::string_view;

// A [rows, cols] matrix of `dtype` with unit stride in its last dim and a non-negative row stride.
inline void check_matrix(string_view op, string_view name, const TensorRef& t, DType dtype, int64_t rows, int64_t cols) {
  checks::ndim_is(op, name, t, 2);
  checks::dtype_is(op, name, t, dtype);
  if (rows >= 0) checks::size_is(op, name, t, 0, rows);
  checks::size_is(op, name, t, 1, cols);
  checks::not_null(op, name, t);
  checks::innermost_contiguous(op, name, t);
  checks::non_negative_strides(op, name, t);
}

inline void check_vector(string_view op, string_view name, const TensorRef& t, DType dtype, int64_t n) {
  checks::ndim_is(op, name, t, 1);
  checks::dtype_is(op, name, t, dtype);
  checks::size_is(op, name, t, 0, n);
  checks::not_null(op, name, t);
  checks::innermost_contiguous(op, name, t);
}

inline void check_comp(string_view op, const Dsv4Compressor& c) {
  require_arg(c.head_dim > 0 && c.head_dim % 2 == 0, op, ": compressor head_dim must be even and > 0, got ", c.head_dim);
  require_arg(c.n_rot >= 0 && c.n_rot % 2 == 0 && c.n_rot <= c.head_dim, op, ": compressor n_rot must be even and in [0, ",
              c.head_dim, "], got ", c.n_rot);
  require_arg(c.ratio >= 1 && c.ratio <= 4096, op, ": compressor ratio must be in [1, 4096], got ", c.ratio);
  require_arg(std::isfinite(c.eps) && c.eps >= 0, op, ": compressor eps must be finite and >= 0, got ", c.eps);
  if (c.kind == Dsv4RowKind::Indexer)
    require_arg(c.head_dim <= 1024 && (c.head_dim & (c.head_dim - 1)) == 0, op,
                ": an indexer row's head_dim must be a power of two <= 1024 (Hadamard), got ", c.head_dim);
  require_arg(c.head_dim <= 4096, op, ": compressor head_dim must be <= 4096, got ", c.head_dim);
}

inline void check_state(string_view op, const TensorRef& kv, const TensorRef& score, const Dsv4Compressor& c) {
  check_matrix(op, "state_kv", kv, DType::F32, c.state_rows(), c.width());
  check_matrix(op, "state_score", score, DType::F32, c.state_rows(), c.width());
  require_arg(kv.is_contiguous() && score.is_contiguous(), op, ": state_kv and state_score must be contiguous");
  checks::same_device(op, "state_kv", kv, "state_score", score);
  require_arg(kv.data() != score.data(), op, ": state_kv and state_score must not alias");
}

inline void check_ape(string_view op, const TensorRef& ape, const Dsv4Compressor& c, const TensorRef& ref) {
  checks::ndim_is(op, "ape", ape, 2);
  require_arg(ape.dtype() == DType::F32 || ape.dtype() == DType::F16, op, ": ape must be f32 or f16, got ",
              dtype_name(ape.dtype()));
  checks::size_is(op, "ape", ape, 0, c.ratio);
  checks::size_is(op, "ape", ape, 1, c.width());
  checks::not_null(op, "ape", ape);
  checks::innermost_contiguous(op, "ape", ape);
  checks::non_negative_strides(op, "ape", ape);
  checks::same_device(op, "ape", ape, "state_kv", ref);
}

// Row store: f32 [cap, head_dim] or packed u8 [cap, bytes] (quant On only). Returns cap.
inline int64_t check_rows(string_view op, const TensorRef& rows, const Dsv4Compressor& c, Dsv4Quant quant, const TensorRef& ref) {
  checks::ndim_is(op, "rows", rows, 2);
  if (rows.dtype() == DType::U8) {
    require_arg(c.packed_row_bytes() > 0, op, ": no packed row format for this compressor (head_dim ", c.head_dim,
                ", n_rot ", c.n_rot, "): use f32 rows");
    require_arg(quant == Dsv4Quant::On, op, ": packed (u8) rows hold quantized values: quant must be On");
    check_matrix(op, "rows", rows, DType::U8, -1, c.packed_row_bytes());
  } else {
    require_arg(rows.dtype() == DType::F32, op, ": rows must be f32 or packed u8, got ", dtype_name(rows.dtype()));
    check_matrix(op, "rows", rows, DType::F32, -1, c.head_dim);
  }
  checks::same_device(op, "rows", rows, "state_kv", ref);
  return rows.size(0);
}

inline void check_weights(string_view op, const Dsv4CompressorWeights& w, const Dsv4Compressor& c, const TensorRef& ref) {
  check_vector(op, "norm_weight", w.norm_weight, DType::F32, c.head_dim);
  checks::same_device(op, "norm_weight", w.norm_weight, "state_kv", ref);
  const auto& l = w.rope.layout;
  require_arg(l.n_rot == c.n_rot && l.first_dim == c.head_dim - c.n_rot, op, ": rope table rotates ", l.n_rot,
              " dims from dim ", l.first_dim, ", the compressor wants its last ", c.n_rot, " of ", c.head_dim);
  require_arg(l.n_pairs() <= math::RopeTable::kMaxPairs, op, ": rope table has too many pairs: ", l.n_pairs());
}

// Quantized indexer rows are FP4 in blocks of 32.
inline void check_quant_geometry(string_view op, const Dsv4Compressor& c, Dsv4Quant quant) {
  if (quant == Dsv4Quant::On && c.kind == Dsv4RowKind::Indexer)
    require_arg(c.head_dim % math::kFp4Block == 0, op, ": quantized indexer rows need head_dim a multiple of 32, got ",
                c.head_dim);
}

inline dsv4::CompressorParams make_params(const Dsv4Compressor& c, const TensorRef& state_kv, const TensorRef& state_score,
                                   Dsv4Quant quant) {
  dsv4::CompressorParams p{};
  p.head_dim = c.head_dim;
  p.n_rot = c.n_rot;
  p.ratio = c.ratio;
  p.overlap = c.overlap ? 1 : 0;
  p.kind = c.kind == Dsv4RowKind::Attention ? 0 : 1;
  p.width = c.width();
  p.state_rows = c.state_rows();
  p.eps = c.eps;
  p.quant = quant == Dsv4Quant::On ? 1 : 0;
  p.state_kv = state_kv.data_as<float>();
  p.state_score = state_score.data_as<float>();
  return p;
}

inline void set_ape(dsv4::CompressorParams& p, const TensorRef& ape) {
  p.ape = ape.data();
  p.ape_stride = ape.stride(0);
  p.ape_f16 = ape.dtype() == DType::F16 ? 1 : 0;
}

inline void set_emit(dsv4::CompressorParams& p, const Dsv4CompressorWeights& w, const TensorRef& rows) {
  p.norm_weight = w.norm_weight.data_as<const float>();
  p.rope = w.rope;
  p.rope.attention_factor = 1.0f;  // DeepSeek-V4 applies no magnitude to compressed rows
  p.rows = rows.data();
  p.rows_stride = rows.stride(0);
  p.rows_cap = rows.size(0);
  p.rows_packed = rows.dtype() == DType::U8 ? 1 : 0;
}

template <class Cpu, class Cuda>
inline void dispatch(string_view op, Device d, Cpu&& cpu_fn, [[maybe_unused]] Cuda&& cuda_fn) {
  checks::backend_available(op, d);
  if (d.is_cpu()) {
    cpu_fn();
    return;
  }
#if KVCORE_WITH_CUDA
  cuda_fn();
#endif
}

}  // namespace kvcore::dsv4_checks
