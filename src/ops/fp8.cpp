// Entry points of the fp8 op family: validate every argument, then dispatch on the device.
#include "kvcore/ops/fp8.hpp"

#include <cstdint>
#include <string_view>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "ops/checks.hpp"
#include "ops/fp8_params.hpp"

namespace kvcore {
namespace {

using ops::RowMap;

// ---- argument checks ---------------------------------------------------------
bool is_float_row_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// A rows tensor: defined, rank 1..4, non-negative strides, data aligned to its element size.
void check_rows_tensor(std::string_view op, std::string_view name, const TensorRef& t) {
  checks::not_null(op, name, t);
  require_arg(t.ndim() >= 1 && t.ndim() <= 4, op, ": ", name, " must have 1 to 4 dims (rows..., cols), got ",
              described(t));
  checks::non_negative_strides(op, name, t);
  require_arg(reinterpret_cast<uintptr_t>(t.data()) % t.element_size() == 0, op, ": ", name, " data pointer ",
              t.data(), " is not aligned to its ", t.element_size(), "-byte elements");
}

// Outputs must not write the same element twice: unit-or-larger strides where a dim has more than one element.
void check_writable(std::string_view op, std::string_view name, const TensorRef& t) {
  if (t.numel() == 0) return;  // an empty output (e.g. no nope dims) has zero strides and writes nothing
  for (int d = 0; d < t.ndim(); ++d)
    require_arg(t.size(d) <= 1 || t.stride(d) > 0, op, ": ", name, ".stride[", d,
                "] is 0 on a dim of size ", t.size(d), ": an output cannot broadcast");
}

// Same leading (row) dims as `ref`.
void check_same_rows(std::string_view op, std::string_view name, const TensorRef& t, std::string_view ref_name,
                     const TensorRef& ref) {
  bool same = t.ndim() == ref.ndim();
  for (int d = 0; same && d + 1 < t.ndim(); ++d) same = t.size(d) == ref.size(d);
  require_arg(same, op, ": ", name, " ", described(t), " must have the row dims of ", ref_name, " ", described(ref));
}

void check_last_dim(std::string_view op, std::string_view name, const TensorRef& t, int64_t want,
                    std::string_view why) {
  require_arg(t.size(t.ndim() - 1) == want, op, ": ", name, " must have ", want, " columns (", why, "), got ",
              described(t));
}

bool spans_overlap(const TensorRef& a, const TensorRef& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data()), b0 = reinterpret_cast<uintptr_t>(b.data());
  const auto a1 = a0 + static_cast<uintptr_t>(a.span_bytes()), b1 = b0 + static_cast<uintptr_t>(b.span_bytes());
  return a0 < b1 && b0 < a1;
}

bool same_view(const TensorRef& a, const TensorRef& b) {
  if (a.data() != b.data() || a.dtype() != b.dtype() || a.ndim() != b.ndim()) return false;
  for (int d = 0; d < a.ndim(); ++d)
    if (a.size(d) != b.size(d) || (a.size(d) > 1 && a.stride(d) != b.stride(d))) return false;
  return true;
}

void check_no_overlap(std::string_view op, std::string_view in_name, const TensorRef& in, std::string_view out_name,
                      const TensorRef& out) {
  require_arg(!spans_overlap(in, out), op, ": ", out_name, " (", described(out), " at ", out.data(),
              ") overlaps ", in_name, " (", described(in), " at ", in.data(), ")");
}

void check_device(std::string_view op, std::string_view a_name, const TensorRef& a, std::string_view b_name,
                  const TensorRef& b) {
  checks::same_device(op, a_name, a, b_name, b);
}

int32_t checked_cols(std::string_view op, std::string_view name, const TensorRef& t) {
  const int64_t c = t.size(t.ndim() - 1);
  require_arg(c <= INT32_MAX, op, ": ", name, " has ", c, " columns, more than ", INT32_MAX);
  return static_cast<int32_t>(c);
}

void check_n_rot(std::string_view op, int64_t n_rot, int64_t cols) {
  require_arg(n_rot >= 0 && n_rot <= cols, op, ": n_rot must be in [0, ", cols, "] (the row has ", cols,
              " columns), got ", n_rot);
  require_arg(n_rot % 2 == 0, op, ": n_rot must be even (rope dims come in pairs), got ", n_rot);
}

// ---- views for kernels ------------------------------------------------------------
RowMap row_map(const TensorRef& t) {
  // Leading dims of size 1 never move the offset: drop them and left-align the rest into
  // (n0, n1, n2), so the common single-row-dim case takes RowMap's one-multiply path.
  int64_t n[3] = {1, 1, 1}, s[3] = {0, 0, 0};
  int k = 0;
  for (int d = 0; d + 1 < t.ndim(); ++d) {
    if (t.size(d) == 1) continue;
    n[k] = t.size(d);
    s[k] = t.stride(d);
    ++k;
  }
  RowMap m;
  m.n1 = n[1];
  m.n2 = n[2];
  m.s0 = s[0];
  m.s1 = s[1];
  m.s2 = s[2];
  m.col_stride = t.stride(t.ndim() - 1);
  return m;
}

int64_t row_count(const TensorRef& t) {
  int64_t r = 1;
  for (int d = 0; d + 1 < t.ndim(); ++d) r *= t.size(d);
  return r;
}

// Can a kernel access this tensor `vec` elements at a time (unit column stride, every row start aligned)?
bool vector_ok(const void* data, const RowMap& m, int64_t rows, size_t elem, int vec) {
  const uint64_t bytes = elem * static_cast<uint64_t>(vec);
  if (m.col_stride != 1 || reinterpret_cast<uintptr_t>(data) % bytes != 0) return false;
  auto ok = [&](int64_t s) { return (static_cast<uint64_t>(s) * elem) % bytes == 0; };
  return rows <= 1 || (ok(m.s0) && ok(m.s1) && ok(m.s2));
}

// ---- dispatch ------------------------------------------------------------------------
template <class CpuFn, class CudaFn>
void dispatch(std::string_view op, Device d, CpuFn cpu, CudaFn cuda) {
  checks::backend_available(op, d);
  if (d.is_cpu()) {
    cpu();
    return;
  }
#if KVCORE_WITH_CUDA
  cuda();
#else
  (void)cuda;
  throw Error(ErrorCode::NotSupported, std::string(op) + ": this kvcore build has no CUDA backend");
#endif
}

void run_pack(const ops::Fp8PackParams& p, Device d, Stream stream, std::string_view op) {
  const bool vec = p.cols % 4 == 0 && p.n_nope % 4 == 0 &&
                   vector_ok(p.src, p.src_rows, p.rows, dtype_size(p.src_dtype), 4) &&
                   vector_ok(p.codes, p.code_rows, p.rows, 1, 4) &&
                   (p.maybe_tail == nullptr || vector_ok(p.maybe_tail, p.tail_rows, p.rows, 2, 4));
  dispatch(op, d, [&] { ops::cpu::fp8_pack_rows(p); },
           [&] { ops::cuda::fp8_pack_rows(p, vec, d.index, stream.handle); });
}

void run_unpack(const ops::Fp8UnpackParams& p, Device d, Stream stream, std::string_view op) {
  const bool vec = p.cols % 4 == 0 && p.n_nope % 4 == 0 &&
                   vector_ok(p.dst, p.dst_rows, p.rows, dtype_size(p.dst_dtype), 4) &&
                   vector_ok(p.codes, p.code_rows, p.rows, 1, 4) &&
                   (p.maybe_tail == nullptr || vector_ok(p.maybe_tail, p.tail_rows, p.rows, 2, 4));
  dispatch(op, d, [&] { ops::cpu::fp8_unpack_rows(p); },
           [&] { ops::cuda::fp8_unpack_rows(p, vec, d.index, stream.handle); });
}

}  // namespace

void fp8_round_trip_rows(const TensorRef& src, const TensorRef& dst, int n_rot, Stream stream) {
  constexpr std::string_view op = "fp8_round_trip_rows";
  check_rows_tensor(op, "src", src);
  check_rows_tensor(op, "dst", dst);
  checks::dtype_is(op, "src", src, DType::F32);
  checks::dtype_is(op, "dst", dst, DType::F32);
  check_device(op, "src", src, "dst", dst);
  require_arg(src.ndim() == dst.ndim() && src.shape_str() == dst.shape_str(), op, ": dst ", described(dst),
              " must have the shape of src ", described(src));
  check_writable(op, "dst", dst);
  const int32_t cols = checked_cols(op, "src", src);
  check_n_rot(op, n_rot, cols);
  const bool in_place = same_view(src, dst);
  if (!in_place) check_no_overlap(op, "src", src, "dst", dst);
  checks::backend_available(op, src.device());

  ops::Fp8RoundTripParams p{};
  p.src = src.data_as<const float>();
  p.dst = dst.data_as<float>();
  p.src_rows = row_map(src);
  p.dst_rows = row_map(dst);
  p.rows = row_count(src);
  p.cols = cols;
  p.n_nope = cols - n_rot;
  if (p.rows == 0 || cols == 0) return;
  const bool vec = cols % 4 == 0 && p.n_nope % 4 == 0 && vector_ok(p.src, p.src_rows, p.rows, 4, 4) &&
                   vector_ok(p.dst, p.dst_rows, p.rows, 4, 4);
  dispatch(op, src.device(), [&] { ops::cpu::fp8_round_trip_rows(p); },
           [&] { ops::cuda::fp8_round_trip_rows(p, vec, src.device().index, stream.handle); });
}

void fp8_pack_rows(const TensorRef& src, const TensorRef& codes, const TensorRef& scales, const TensorRef& tail,
                   Stream stream) {
  constexpr std::string_view op = "fp8_pack_rows";
  check_rows_tensor(op, "src", src);
  check_rows_tensor(op, "codes", codes);
  check_rows_tensor(op, "scales", scales);
  require_arg(is_float_row_dtype(src.dtype()), op, ": src must be f32, f16 or bf16, got ", dtype_name(src.dtype()));
  checks::dtype_is(op, "codes", codes, DType::E4M3);
  checks::dtype_is(op, "scales", scales, DType::UE8M0);
  const bool has_tail = !tail.empty();
  if (has_tail) {
    check_rows_tensor(op, "tail", tail);
    require_arg(is_float16ish(tail.dtype()), op, ": tail must be f16 or bf16, got ", dtype_name(tail.dtype()));
  }
  check_device(op, "src", src, "codes", codes);
  check_device(op, "src", src, "scales", scales);
  if (has_tail) check_device(op, "src", src, "tail", tail);
  check_same_rows(op, "codes", codes, "src", src);
  check_same_rows(op, "scales", scales, "src", src);
  if (has_tail) check_same_rows(op, "tail", tail, "src", src);
  const int32_t cols = checked_cols(op, "src", src);
  const int64_t n_rot = has_tail ? tail.size(tail.ndim() - 1) : 0;
  check_n_rot(op, n_rot, cols);
  const int64_t n_nope = cols - n_rot;
  check_last_dim(op, "codes", codes, n_nope, "src columns minus the tail's n_rot");
  check_last_dim(op, "scales", scales, math::ceil_div<int64_t>(n_nope, math::kFp8Block), "one per 64 codes");
  check_writable(op, "codes", codes);
  check_writable(op, "scales", scales);
  if (has_tail) check_writable(op, "tail", tail);
  check_no_overlap(op, "src", src, "codes", codes);
  check_no_overlap(op, "src", src, "scales", scales);
  if (has_tail) check_no_overlap(op, "src", src, "tail", tail);
  checks::backend_available(op, src.device());

  ops::Fp8PackParams p{};
  p.src = src.data();
  p.codes = codes.data_as<uint8_t>();
  p.scales = scales.data_as<uint8_t>();
  p.maybe_tail = has_tail && n_rot > 0 ? tail.data() : nullptr;
  p.maybe_pad = nullptr;
  p.src_rows = row_map(src);
  p.code_rows = row_map(codes);
  p.scale_rows = row_map(scales);
  if (has_tail) p.tail_rows = row_map(tail);
  p.src_dtype = src.dtype();
  p.tail_dtype = has_tail ? tail.dtype() : DType::BF16;
  p.rows = row_count(src);
  p.cols = cols;
  p.n_nope = static_cast<int32_t>(n_nope);
  if (p.rows == 0 || cols == 0) return;
  run_pack(p, src.device(), stream, op);
}

void fp8_unpack_rows(const TensorRef& codes, const TensorRef& scales, const TensorRef& tail, const TensorRef& dst,
                     Stream stream) {
  constexpr std::string_view op = "fp8_unpack_rows";
  check_rows_tensor(op, "codes", codes);
  check_rows_tensor(op, "scales", scales);
  check_rows_tensor(op, "dst", dst);
  checks::dtype_is(op, "codes", codes, DType::E4M3);
  checks::dtype_is(op, "scales", scales, DType::UE8M0);
  require_arg(is_float_row_dtype(dst.dtype()), op, ": dst must be f32, f16 or bf16, got ", dtype_name(dst.dtype()));
  const bool has_tail = !tail.empty();
  if (has_tail) {
    check_rows_tensor(op, "tail", tail);
    require_arg(is_float16ish(tail.dtype()), op, ": tail must be f16 or bf16, got ", dtype_name(tail.dtype()));
  }
  check_device(op, "dst", dst, "codes", codes);
  check_device(op, "dst", dst, "scales", scales);
  if (has_tail) check_device(op, "dst", dst, "tail", tail);
  check_same_rows(op, "codes", codes, "dst", dst);
  check_same_rows(op, "scales", scales, "dst", dst);
  if (has_tail) check_same_rows(op, "tail", tail, "dst", dst);
  const int32_t cols = checked_cols(op, "dst", dst);
  const int64_t n_rot = has_tail ? tail.size(tail.ndim() - 1) : 0;
  check_n_rot(op, n_rot, cols);
  const int64_t n_nope = cols - n_rot;
  check_last_dim(op, "codes", codes, n_nope, "dst columns minus the tail's n_rot");
  check_last_dim(op, "scales", scales, math::ceil_div<int64_t>(n_nope, math::kFp8Block), "one per 64 codes");
  check_writable(op, "dst", dst);
  check_no_overlap(op, "codes", codes, "dst", dst);
  check_no_overlap(op, "scales", scales, "dst", dst);
  if (has_tail) check_no_overlap(op, "tail", tail, "dst", dst);
  checks::backend_available(op, dst.device());

  ops::Fp8UnpackParams p{};
  p.codes = codes.data_as<const uint8_t>();
  p.scales = scales.data_as<const uint8_t>();
  p.maybe_tail = has_tail && n_rot > 0 ? tail.data() : nullptr;
  p.dst = dst.data();
  p.code_rows = row_map(codes);
  p.scale_rows = row_map(scales);
  if (has_tail) p.tail_rows = row_map(tail);
  p.dst_rows = row_map(dst);
  p.dst_dtype = dst.dtype();
  p.tail_dtype = has_tail ? tail.dtype() : DType::BF16;
  p.rows = row_count(dst);
  p.cols = cols;
  p.n_nope = static_cast<int32_t>(n_nope);
  if (p.rows == 0 || cols == 0) return;
  run_unpack(p, dst.device(), stream, op);
}

namespace {

using L = math::Dsv4RowLayout;

void check_packed(std::string_view op, const TensorRef& packed) {
  check_rows_tensor(op, "packed", packed);
  checks::dtype_is(op, "packed", packed, DType::U8);
  check_last_dim(op, "packed", packed, L::kBytes, "one DeepSeek-V4 row");
  checks::innermost_contiguous(op, "packed", packed);
  require_arg(reinterpret_cast<uintptr_t>(packed.data()) % 2 == 0, op, ": packed data pointer ", packed.data(),
              " must be 2-byte aligned (the rope tail is bf16)");
  for (int d = 0; d + 1 < packed.ndim(); ++d)
    require_arg(packed.size(d) <= 1 || packed.stride(d) % 2 == 0, op, ": packed.stride[", d,
                "] must be even (the rope tail is bf16), got ", packed.stride(d));
}

// The 584-byte row as four views of one u8 row: codes, bf16 tail, scales, pad.
void packed_views(const TensorRef& packed, uint8_t*& base, RowMap& bytes, RowMap& halves) {
  base = packed.data_as<uint8_t>();
  bytes = row_map(packed);
  halves = bytes;  // the same rows in 2-byte elements
  halves.s0 /= 2;
  halves.s1 /= 2;
  halves.s2 /= 2;
}

}  // namespace

void dsv4_pack_rows(const TensorRef& src, const TensorRef& packed, Stream stream) {
  constexpr std::string_view op = "dsv4_pack_rows";
  check_rows_tensor(op, "src", src);
  checks::dtype_is(op, "src", src, DType::F32);
  check_last_dim(op, "src", src, L::kHeadDim, "448 nope + 64 rope");
  check_packed(op, packed);
  check_device(op, "src", src, "packed", packed);
  check_same_rows(op, "packed", packed, "src", src);
  check_writable(op, "packed", packed);
  check_no_overlap(op, "src", src, "packed", packed);
  checks::backend_available(op, src.device());

  uint8_t* base;
  ops::Fp8PackParams p{};
  packed_views(packed, base, p.code_rows, p.tail_rows);
  p.src = src.data();
  p.codes = base + L::kNopeOffset;
  p.scales = base + L::kScaleOffset;
  p.maybe_tail = base + L::kRopeOffset;
  p.maybe_pad = base + L::kPadOffset;
  p.scale_rows = p.code_rows;
  p.pad_rows = p.code_rows;
  p.src_rows = row_map(src);
  p.src_dtype = DType::F32;
  p.tail_dtype = DType::BF16;
  p.rows = row_count(src);
  p.cols = L::kHeadDim;
  p.n_nope = L::kNope;
  if (p.rows == 0) return;
  run_pack(p, src.device(), stream, op);
}

void dsv4_unpack_rows(const TensorRef& packed, const TensorRef& dst, Stream stream) {
  constexpr std::string_view op = "dsv4_unpack_rows";
  check_packed(op, packed);
  check_rows_tensor(op, "dst", dst);
  require_arg(is_float_row_dtype(dst.dtype()), op, ": dst must be f32, f16 or bf16, got ", dtype_name(dst.dtype()));
  check_last_dim(op, "dst", dst, L::kHeadDim, "448 nope + 64 rope");
  check_device(op, "packed", packed, "dst", dst);
  check_same_rows(op, "dst", dst, "packed", packed);
  check_writable(op, "dst", dst);
  check_no_overlap(op, "packed", packed, "dst", dst);
  checks::backend_available(op, dst.device());

  uint8_t* base;
  ops::Fp8UnpackParams p{};
  packed_views(packed, base, p.code_rows, p.tail_rows);
  p.codes = base + L::kNopeOffset;
  p.scales = base + L::kScaleOffset;
  p.maybe_tail = base + L::kRopeOffset;
  p.dst = dst.data();
  p.scale_rows = p.code_rows;
  p.dst_rows = row_map(dst);
  p.dst_dtype = dst.dtype();
  p.tail_dtype = DType::BF16;
  p.rows = row_count(dst);
  p.cols = L::kHeadDim;
  p.n_nope = L::kNope;
  if (p.rows == 0) return;
  run_unpack(p, dst.device(), stream, op);
}

}  // namespace kvcore
