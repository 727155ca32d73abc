// Entry points of the DeepSeek-V4 ops: validate every argument (before anything
// is written), fill the Params, dispatch on the tensors' device.
#include "kvcore/ops/dsv4.hpp"

#include <cmath>

#include "kvcore/math/dsv4.hpp"
#include "ops/dsv4_backends.hpp"
#include "ops/dsv4_checks.hpp"
#include "ops/dsv4_tuning.hpp"

namespace kvcore {

int32_t Dsv4Compressor::packed_row_bytes() const {
  if (kind == Dsv4RowKind::Attention)
    return (head_dim == math::Dsv4RowLayout::kHeadDim && n_rot == math::Dsv4RowLayout::kRope) ? math::Dsv4RowLayout::kBytes
                                                                                              : 0;
  return head_dim % math::kFp4Block == 0 ? math::dsv4_fp4_row_bytes(head_dim) : 0;
}

Dsv4Compressor Dsv4Compressor::csa(int32_t head_dim, int32_t n_rot, int32_t ratio) {
  return Dsv4Compressor{head_dim, n_rot, ratio, true, Dsv4RowKind::Attention, 1.0e-6f};
}
Dsv4Compressor Dsv4Compressor::hca(int32_t head_dim, int32_t n_rot, int32_t ratio) {
  return Dsv4Compressor{head_dim, n_rot, ratio, false, Dsv4RowKind::Attention, 1.0e-6f};
}
Dsv4Compressor Dsv4Compressor::indexer(int32_t head_dim, int32_t n_rot, int32_t ratio) {
  return Dsv4Compressor{head_dim, n_rot, ratio, true, Dsv4RowKind::Indexer, 1.0e-6f};
}

using namespace dsv4_checks;
using std::string_view;

void dsv4_kv_finalize(const TensorRef& kv, const TensorRef& raw_ring, int64_t first_raw_row, int32_t n_rot,
                      Dsv4Quant quant, Stream stream) {
  constexpr string_view op = "dsv4_kv_finalize";
  ndim_is(op, "kv", kv, 2);
  const int64_t head_dim = kv.size(1);
  KVCORE_DSV4_CHECK(head_dim > 0 && head_dim <= 65536, op, ": kv head_dim must be in [1, 65536], got ", described(kv));
  check_matrix(op, "kv", kv, DType::F32, -1, head_dim);
  ndim_is(op, "raw_ring", raw_ring, 2);
  KVCORE_DSV4_CHECK(raw_ring.dtype() == DType::F32 || raw_ring.dtype() == DType::F16, op, ": raw_ring must be f32 or f16, got ",
              dtype_name(raw_ring.dtype()));
  check_matrix(op, "raw_ring", raw_ring, raw_ring.dtype(), -1, head_dim);
  KVCORE_DSV4_CHECK(raw_ring.size(0) > 0, op, ": raw_ring must have at least one row, got ", described(raw_ring));
  same_device(op, "kv", kv, "raw_ring", raw_ring);
  KVCORE_DSV4_CHECK(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= head_dim, op, ": n_rot must be even and in [0, ", head_dim,
                    "] (rope dims come in pairs), got ", n_rot);
  check_quant(op, quant);
  KVCORE_DSV4_CHECK(first_raw_row >= 0, op, ": first_raw_row must be >= 0, got ", first_raw_row);
  KVCORE_DSV4_CHECK(kv.size(0) <= (int64_t{1} << 31) - 1, op, ": too many rows: ", kv.size(0));
  dsv4::FinalizeParams p{};
  p.kv = kv.data_as<float>();
  p.kv_stride = kv.stride(0);
  p.n_rows = static_cast<int32_t>(kv.size(0));
  p.head_dim = static_cast<int32_t>(head_dim);
  p.n_rot = n_rot;
  p.raw = raw_ring.data();
  p.raw_stride = raw_ring.stride(0);
  p.raw_f16 = raw_ring.dtype() == DType::F16 ? 1 : 0;
  p.raw_rows = static_cast<int32_t>(raw_ring.size(0));
  p.first_raw_row = first_raw_row % raw_ring.size(0);
  p.quant = quant == Dsv4Quant::On ? 1 : 0;
  if (p.n_rows == 0) return;
  dispatch(op, kv.device(), [&] { dsv4::cpu::finalize(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::finalize(p, stream);
#endif
  });
  (void)stream;
}

void dsv4_compressor_store_one(const TensorRef& c, const TensorRef& z, const TensorRef& ape, const TensorRef& state_kv,
                               const TensorRef& state_score, int64_t pos, const Dsv4Compressor& comp, Stream stream) {
  constexpr string_view op = "dsv4_compressor_store_one";
  check_comp(op, comp);
  check_state(op, state_kv, state_score, comp);
  check_vector(op, "c", c, DType::F32, comp.width());
  check_vector(op, "z", z, DType::F32, comp.width());
  same_device(op, "c", c, "state_kv", state_kv);
  same_device(op, "z", z, "state_kv", state_kv);
  check_ape(op, ape, comp, state_kv);
  KVCORE_DSV4_CHECK(pos >= 0, op, ": pos must be >= 0, got ", pos);
  dsv4::CompressorParams p = make_params(comp, state_kv, state_score, Dsv4Quant::Off);
  set_ape(p, ape);
  p.c = c.data_as<const float>();
  p.z = z.data_as<const float>();
  p.pos = pos;
  p.n_tokens = 1;
  dispatch(op, state_kv.device(), [&] { dsv4::cpu::store_one(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::store_one(p, stream);
#endif
  });
  (void)stream;
}

void dsv4_compressor_shift(const TensorRef& state_kv, const TensorRef& state_score, const Dsv4Compressor& comp,
                           Stream stream) {
  constexpr string_view op = "dsv4_compressor_shift";
  check_comp(op, comp);
  KVCORE_DSV4_CHECK(comp.overlap, op, ": only overlapping compressors (CSA, indexer) shift their state");
  check_state(op, state_kv, state_score, comp);
  const dsv4::CompressorParams p = make_params(comp, state_kv, state_score, Dsv4Quant::Off);
  dispatch(op, state_kv.device(), [&] { dsv4::cpu::shift(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::shift(p, stream);
#endif
  });
  (void)stream;
}

void dsv4_compressor_reset(const TensorRef& state_kv, const TensorRef& state_score, const Dsv4Compressor& comp,
                           Stream stream) {
  constexpr string_view op = "dsv4_compressor_reset";
  check_comp(op, comp);
  check_state(op, state_kv, state_score, comp);
  const dsv4::CompressorParams p = make_params(comp, state_kv, state_score, Dsv4Quant::Off);
  dispatch(op, state_kv.device(), [&] { dsv4::cpu::reset(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::reset(p, stream);
#endif
  });
  (void)stream;
}

void dsv4_compressor_emit(const TensorRef& state_kv, const TensorRef& state_score, const Dsv4Compressor& comp,
                          const Dsv4CompressorWeights& w, int64_t window, Dsv4Quant quant, const TensorRef& rows,
                          Stream stream) {
  constexpr string_view op = "dsv4_compressor_emit";
  check_comp(op, comp);
  check_state(op, state_kv, state_score, comp);
  check_weights(op, w, comp, state_kv);
  check_quant(op, quant);
  const int64_t cap = check_rows(op, rows, comp, quant, state_kv);
  check_quant_geometry(op, comp, quant);
  KVCORE_DSV4_CHECK(window >= 0 && window < cap, op, ": window must be in [0, ", cap, ") (the row store's capacity), got ", window);
  KVCORE_DSV4_CHECK(window * comp.ratio <= (int64_t{1} << 24), op, ": window position ", window * comp.ratio,
              " exceeds 2^24 (f32 positions are exact only below)");
  dsv4::CompressorParams p = make_params(comp, state_kv, state_score, quant);
  set_emit(p, w, rows);
  p.window = window;
  dispatch(op, state_kv.device(), [&] { dsv4::cpu::emit(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::emit(p, stream);
#endif
  });
  (void)stream;
}

void dsv4_compress_prefill(const TensorRef& c, const TensorRef& z, const TensorRef& state_kv,
                           const TensorRef& state_score, int64_t start_pos, const Dsv4Compressor& comp,
                           const Dsv4CompressorWeights& w, Dsv4Quant quant, const TensorRef& rows, Stream stream) {
  constexpr string_view op = "dsv4_compress_prefill";
  check_comp(op, comp);
  check_state(op, state_kv, state_score, comp);
  ndim_is(op, "c", c, 2);
  const int64_t n = c.size(0);
  check_matrix(op, "c", c, DType::F32, n, comp.width());
  check_matrix(op, "z", z, DType::F32, n, comp.width());
  same_device(op, "c", c, "state_kv", state_kv);
  same_device(op, "z", z, "state_kv", state_kv);
  check_ape(op, w.ape, comp, state_kv);
  check_weights(op, w, comp, state_kv);
  check_quant(op, quant);
  const int64_t cap = check_rows(op, rows, comp, quant, state_kv);
  check_quant_geometry(op, comp, quant);
  KVCORE_DSV4_CHECK(start_pos >= 0, op, ": start_pos must be >= 0, got ", start_pos);
  const int64_t end_windows = (start_pos + n) / comp.ratio;
  KVCORE_DSV4_CHECK(end_windows <= cap, op, ": tokens up to position ", start_pos + n - 1, " complete ", end_windows,
              " rows but the row store holds ", cap);
  KVCORE_DSV4_CHECK(start_pos + n <= (int64_t{1} << 24), op, ": positions must stay below 2^24, got end ", start_pos + n);
  dsv4::CompressorParams p = make_params(comp, state_kv, state_score, quant);
  set_ape(p, w.ape);
  set_emit(p, w, rows);
  p.c = c.data_as<const float>();
  p.z = z.data_as<const float>();
  p.c_stride = c.stride(0);
  p.z_stride = z.stride(0);
  p.n_tokens = n;
  p.pos = start_pos;
  if (n == 0) return;
  dispatch(op, state_kv.device(), [&] { dsv4::cpu::prefill(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::prefill(p, stream);
#endif
  });
  (void)stream;
}

void dsv4_indexer_topk(const TensorRef& q, const TensorRef& weights, const TensorRef& index_rows, int64_t n_rows,
                       int64_t first_query_pos, int32_t ratio, Dsv4Quant quant, const TensorRef& scores,
                       const TensorRef& out, Stream stream) {
  ops::dsv4_indexer_topk(q, weights, index_rows, n_rows, first_query_pos, ratio, quant, scores, out, ops::IndexerTuning{},
                         stream);
}

}  // namespace kvcore

namespace kvcore::ops {

void dsv4_indexer_topk(const TensorRef& q, const TensorRef& weights, const TensorRef& index_rows, int64_t n_rows,
                       int64_t first_query_pos, int32_t ratio, Dsv4Quant quant, const TensorRef& scores,
                       const TensorRef& out, const IndexerTuning& tuning, Stream stream) {
  constexpr string_view op = "dsv4_indexer_topk";
  check_quant(op, quant);
  ndim_is(op, "q", q, 3);
  dtype_is(op, "q", q, DType::F32);
  not_null(op, "q", q);
  innermost_contiguous(op, "q", q);
  non_negative_strides(op, "q", q);
  const int64_t n_q = q.size(0), n_heads = q.size(1), dim = q.size(2);
  KVCORE_DSV4_CHECK(n_heads > 0 && dim > 0, op, ": q must have heads and dims, got ", described(q));
  if (quant == Dsv4Quant::On)
    KVCORE_DSV4_CHECK(dim <= 1024 && (dim & (dim - 1)) == 0 && dim % math::kFp4Block == 0, op,
                ": with quant On the indexer dim must be a power of two in [32, 1024], got ", dim);
  KVCORE_DSV4_CHECK(dim <= 1024 && n_heads <= 256, op, ": indexer limits: dim <= 1024 and heads <= 256, got ", described(q));
  check_matrix(op, "weights", weights, DType::F32, n_q, n_heads);
  ndim_is(op, "index_rows", index_rows, 2);
  if (index_rows.dtype() == DType::U8) {
    KVCORE_DSV4_CHECK(quant == Dsv4Quant::On && dim % math::kFp4Block == 0, op,
                ": packed (u8) index rows need quant On and a dim that is a multiple of 32");
    check_matrix(op, "index_rows", index_rows, DType::U8, -1, math::dsv4_fp4_row_bytes(static_cast<int>(dim)));
  } else {
    check_matrix(op, "index_rows", index_rows, DType::F32, -1, dim);
  }
  const int64_t cap = index_rows.size(0);
  KVCORE_DSV4_CHECK(n_rows >= 0 && n_rows <= cap, op, ": n_rows must be in [0, ", cap, "], got ", n_rows);
  KVCORE_DSV4_CHECK(ratio >= 1, op, ": ratio must be >= 1, got ", ratio);
  KVCORE_DSV4_CHECK(first_query_pos >= 0, op, ": first_query_pos must be >= 0, got ", first_query_pos);
  check_matrix(op, "scores", scores, DType::F32, n_q, cap);
  ndim_is(op, "out", out, 2);
  check_matrix(op, "out", out, DType::I32, n_q, out.size(1));
  const int64_t k = out.size(1);
  KVCORE_DSV4_CHECK(k >= 1 && k <= cap, op, ": top-k (out.shape[1]) must be in [1, ", cap, "] (the row store's capacity), got ", k);
  KVCORE_DSV4_CHECK(k <= 2048, op, ": top-k must be <= 2048, got ", k);
  for (const auto* t : {&weights, &index_rows, &scores, &out})
    same_device(op, "q", q, "another tensor", *t);
  KVCORE_DSV4_CHECK(n_q <= (int64_t{1} << 31) - 1 && cap <= (int64_t{1} << 31) - 1, op, ": too many queries or rows");
  dsv4::IndexerParams p{};
  p.q = q.data_as<const float>();
  p.q_stride0 = q.stride(0);
  p.q_stride1 = q.stride(1);
  p.weights = weights.data_as<const float>();
  p.w_stride = weights.stride(0);
  p.rows = index_rows.data();
  p.rows_stride = index_rows.stride(0);
  p.rows_packed = index_rows.dtype() == DType::U8 ? 1 : 0;
  p.cap = cap;
  p.n_rows = n_rows;
  p.n_q = static_cast<int32_t>(n_q);
  p.n_heads = static_cast<int32_t>(n_heads);
  p.dim = static_cast<int32_t>(dim);
  p.ratio = ratio;
  p.quant = quant == Dsv4Quant::On ? 1 : 0;
  p.k = static_cast<int32_t>(k);
  p.first_query_pos = first_query_pos;
  p.scores = scores.data_as<float>();
  p.scores_stride = scores.stride(0);
  p.out = out.data_as<int32_t>();
  p.out_stride = out.stride(0);
  if (n_q == 0) return;
  dispatch(op, q.device(), [&] { dsv4::cpu::indexer_topk(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::indexer_topk(p, stream, tuning);
#endif
  });
  (void)stream;
  (void)tuning;
}

}  // namespace kvcore::ops
