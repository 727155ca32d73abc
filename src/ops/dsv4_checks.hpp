// Argument checks and Params filling shared by the DeepSeek-V4 op entry points
// (src/ops/dsv4*.cpp). Every check throws kvcore::Error(InvalidArgument) naming
// the argument.
#pragma once
#include <cmath>
#include <string_view>

#include "kvcore/error.hpp"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "ops/dsv4_backends.hpp"

namespace kvcore::dsv4_checks {

using std::string_view;

// Lazy twins of ops/checks.hpp: their messages (describe(), str()) are built only
// on failure. The shared helpers build them eagerly, which costs ~20 us a call,
// too much for a per-token decode path that runs 43 layers.
#define KVCORE_DSV4_CHECK(cond, ...)                          \
  do {                                                        \
    if (!(cond)) ::kvcore::require_arg(false, __VA_ARGS__);   \
  } while (0)

inline void dtype_is(string_view op, string_view name, const TensorRef& t, DType want) {
  KVCORE_DSV4_CHECK(t.dtype() == want, op, ": ", name, " must be ", dtype_name(want), ", got ", dtype_name(t.dtype()));
}
inline void ndim_is(string_view op, string_view name, const TensorRef& t, int want) {
  KVCORE_DSV4_CHECK(t.ndim() == want, op, ": ", name, " must have ", want, " dims, got ", described(t));
}
inline void size_is(string_view op, string_view name, const TensorRef& t, int dim, int64_t want) {
  KVCORE_DSV4_CHECK(t.size(dim) == want, op, ": ", name, ".shape[", dim, "] must be ", want, ", got ", described(t));
}
inline void same_device(string_view op, string_view a_name, const TensorRef& a, string_view b_name, const TensorRef& b) {
  KVCORE_DSV4_CHECK(a.device() == b.device(), op, ": ", a_name, " is on ", a.device().str(), " but ", b_name, " is on ",
                    b.device().str());
}
inline void not_null(string_view op, string_view name, const TensorRef& t) {
  KVCORE_DSV4_CHECK(t.data() != nullptr || t.numel() == 0, op, ": ", name, " has no data pointer");
}
inline void innermost_contiguous(string_view op, string_view name, const TensorRef& t) {
  KVCORE_DSV4_CHECK(t.ndim() == 0 || t.stride(t.ndim() - 1) == 1, op, ": ", name,
                    " must have stride 1 in its last dim, got ", t.stride(t.ndim() - 1));
}
inline void non_negative_strides(string_view op, string_view name, const TensorRef& t) {
  for (int d = 0; d < t.ndim(); ++d)
    KVCORE_DSV4_CHECK(t.stride(d) >= 0, op, ": ", name, ".stride[", d, "] must be >= 0, got ", t.stride(d));
}
inline void backend_available(string_view op, Device d) {
#if !KVCORE_WITH_CUDA
  if (!d.is_cpu())
    require(false, ErrorCode::NotSupported, op, ": tensors are on ", d.str(), " but this kvcore build has no CUDA backend");
#else
  (void)op;
  (void)d;
#endif
}

// A [rows, cols] matrix of `dtype` with unit stride in its last dim and a non-negative row stride.
inline void check_matrix(string_view op, string_view name, const TensorRef& t, DType dtype, int64_t rows, int64_t cols) {
  ndim_is(op, name, t, 2);
  dtype_is(op, name, t, dtype);
  if (rows >= 0) size_is(op, name, t, 0, rows);
  size_is(op, name, t, 1, cols);
  not_null(op, name, t);
  innermost_contiguous(op, name, t);
  non_negative_strides(op, name, t);
}

inline void check_vector(string_view op, string_view name, const TensorRef& t, DType dtype, int64_t n) {
  ndim_is(op, name, t, 1);
  dtype_is(op, name, t, dtype);
  size_is(op, name, t, 0, n);
  not_null(op, name, t);
  innermost_contiguous(op, name, t);
}

inline void check_quant(string_view op, Dsv4Quant q) {
  KVCORE_DSV4_CHECK(q == Dsv4Quant::Off || q == Dsv4Quant::On, op, ": quant must be Off or On, got ", static_cast<int>(q));
}

inline void check_comp(string_view op, const Dsv4Compressor& c) {
  KVCORE_DSV4_CHECK(c.kind == Dsv4RowKind::Attention || c.kind == Dsv4RowKind::Indexer, op,
                    ": compressor kind must be Attention or Indexer, got ", static_cast<int>(c.kind));
  KVCORE_DSV4_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, op, ": compressor head_dim must be even and > 0, got ", c.head_dim);
  KVCORE_DSV4_CHECK(c.n_rot >= 0 && c.n_rot % 2 == 0 && c.n_rot <= c.head_dim, op, ": compressor n_rot must be even and in [0, ",
              c.head_dim, "], got ", c.n_rot);
  KVCORE_DSV4_CHECK(c.ratio >= 1 && c.ratio <= 4096, op, ": compressor ratio must be in [1, 4096], got ", c.ratio);
  KVCORE_DSV4_CHECK(std::isfinite(c.eps) && c.eps >= 0, op, ": compressor eps must be finite and >= 0, got ", c.eps);
  if (c.kind == Dsv4RowKind::Indexer)
    KVCORE_DSV4_CHECK(c.head_dim <= 1024 && (c.head_dim & (c.head_dim - 1)) == 0, op,
                ": an indexer row's head_dim must be a power of two <= 1024 (Hadamard), got ", c.head_dim);
  KVCORE_DSV4_CHECK(c.head_dim <= 4096, op, ": compressor head_dim must be <= 4096, got ", c.head_dim);
}

inline void check_state(string_view op, const TensorRef& kv, const TensorRef& score, const Dsv4Compressor& c) {
  check_matrix(op, "state_kv", kv, DType::F32, c.state_rows(), c.width());
  check_matrix(op, "state_score", score, DType::F32, c.state_rows(), c.width());
  KVCORE_DSV4_CHECK(kv.is_contiguous() && score.is_contiguous(), op, ": state_kv and state_score must be contiguous");
  same_device(op, "state_kv", kv, "state_score", score);
  KVCORE_DSV4_CHECK(kv.data() != score.data(), op, ": state_kv and state_score must not alias");
}

inline void check_ape(string_view op, const TensorRef& ape, const Dsv4Compressor& c, const TensorRef& ref) {
  ndim_is(op, "ape", ape, 2);
  KVCORE_DSV4_CHECK(ape.dtype() == DType::F32 || ape.dtype() == DType::F16, op, ": ape must be f32 or f16, got ",
              dtype_name(ape.dtype()));
  size_is(op, "ape", ape, 0, c.ratio);
  size_is(op, "ape", ape, 1, c.width());
  not_null(op, "ape", ape);
  innermost_contiguous(op, "ape", ape);
  non_negative_strides(op, "ape", ape);
  same_device(op, "ape", ape, "state_kv", ref);
}

// Row store: f32 [cap, head_dim] or packed u8 [cap, bytes] (quant On only). Returns cap.
inline int64_t check_rows(string_view op, const TensorRef& rows, const Dsv4Compressor& c, Dsv4Quant quant, const TensorRef& ref) {
  ndim_is(op, "rows", rows, 2);
  if (rows.dtype() == DType::U8) {
    KVCORE_DSV4_CHECK(c.packed_row_bytes() > 0, op, ": no packed row format for this compressor (head_dim ", c.head_dim,
                ", n_rot ", c.n_rot, "): use f32 rows");
    KVCORE_DSV4_CHECK(quant == Dsv4Quant::On, op, ": packed (u8) rows hold quantized values: quant must be On");
    check_matrix(op, "rows", rows, DType::U8, -1, c.packed_row_bytes());
  } else {
    KVCORE_DSV4_CHECK(rows.dtype() == DType::F32, op, ": rows must be f32 or packed u8, got ", dtype_name(rows.dtype()));
    check_matrix(op, "rows", rows, DType::F32, -1, c.head_dim);
  }
  same_device(op, "rows", rows, "state_kv", ref);
  return rows.size(0);
}

inline void check_weights(string_view op, const Dsv4CompressorWeights& w, const Dsv4Compressor& c, const TensorRef& ref) {
  check_vector(op, "norm_weight", w.norm_weight, DType::F32, c.head_dim);
  same_device(op, "norm_weight", w.norm_weight, "state_kv", ref);
  const auto& l = w.rope.layout;
  KVCORE_DSV4_CHECK(l.n_rot == c.n_rot && l.first_dim == c.head_dim - c.n_rot, op, ": rope table rotates ", l.n_rot,
              " dims from dim ", l.first_dim, ", the compressor wants its last ", c.n_rot, " of ", c.head_dim);
  KVCORE_DSV4_CHECK(l.n_pairs() <= math::RopeTable::kMaxPairs, op, ": rope table has too many pairs: ", l.n_pairs());
}

// Quantized indexer rows are FP4 in blocks of 32.
inline void check_quant_geometry(string_view op, const Dsv4Compressor& c, Dsv4Quant quant) {
  if (quant == Dsv4Quant::On && c.kind == Dsv4RowKind::Indexer)
    KVCORE_DSV4_CHECK(c.head_dim % math::kFp4Block == 0, op, ": quantized indexer rows need head_dim a multiple of 32, got ",
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
  backend_available(op, d);
  if (d.is_cpu()) {
    cpu_fn();
    return;
  }
#if KVCORE_WITH_CUDA
  cuda_fn();
#endif
}

}  // namespace kvcore::dsv4_checks
