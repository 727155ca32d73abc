// CPU kernels of the fp8 op family: OpenMP over rows, the shared block helpers per row.
// Pack and unpack of contiguous rows take the SIMD path (fp8_simd.cpp, the same bytes)
// unless the scalar path is asked for (simd_targets.hpp).
#include <cstdint>

#include "cpu/fp8_simd.hpp"
#include "cpu/simd_targets.hpp"

#include "kvcore/math/fp8_block.hpp"
#include "kvcore/math/half.hpp"
#include "ops/fp8_params.hpp"

namespace kvcore::ops::cpu {
namespace {

using math::kFp8Block;

inline int block_len(int32_t n_nope, int32_t off) { return n_nope - off < kFp8Block ? n_nope - off : kFp8Block; }

template <class T, class Tail>
void pack_rows(const Fp8PackParams& p) {
  const T* src = static_cast<const T*>(p.src);
  Tail* tail = static_cast<Tail*>(p.maybe_tail);
  const int64_t ss = p.src_rows.col_stride, cs = p.code_rows.col_stride, scs = p.scale_rows.col_stride;
  const int64_t ts = p.tail_rows.col_stride;
  const int32_t n_rot = p.cols - p.n_nope;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* s = src + p.src_rows.offset(r);
    uint8_t* c = p.codes + p.code_rows.offset(r);
    uint8_t* sc = p.scales + p.scale_rows.offset(r);
    for (int32_t off = 0, b = 0; off < p.n_nope; off += kFp8Block, ++b)
      sc[b * scs] = math::fp8_block_pack(s + off * ss, ss, block_len(p.n_nope, off), c + off * cs, cs);
    if (tail) {
      Tail* t = tail + p.tail_rows.offset(r);
      for (int32_t i = 0; i < n_rot; ++i) t[i * ts] = from_f32<Tail>(to_f32(s[(p.n_nope + i) * ss]));
    }
    if (p.maybe_pad) p.maybe_pad[p.pad_rows.offset(r)] = 0;
  }
}

template <class T, class Tail>
void unpack_rows(const Fp8UnpackParams& p) {
  T* dst = static_cast<T*>(p.dst);
  const Tail* tail = static_cast<const Tail*>(p.maybe_tail);
  const int64_t ds = p.dst_rows.col_stride, cs = p.code_rows.col_stride, scs = p.scale_rows.col_stride;
  const int64_t ts = p.tail_rows.col_stride;
  const int32_t n_rot = p.cols - p.n_nope;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    T* d = dst + p.dst_rows.offset(r);
    const uint8_t* c = p.codes + p.code_rows.offset(r);
    const uint8_t* sc = p.scales + p.scale_rows.offset(r);
    for (int32_t off = 0, b = 0; off < p.n_nope; off += kFp8Block, ++b)
      math::fp8_block_unpack(c + off * cs, cs, sc[b * scs], block_len(p.n_nope, off), d + off * ds, ds);
    if (tail) {
      const Tail* t = tail + p.tail_rows.offset(r);
      for (int32_t i = 0; i < n_rot; ++i) d[(p.n_nope + i) * ds] = from_f32<T>(to_f32(t[i * ts]));
    }
  }
}

// The explicit list of instantiations: source/destination type x tail type.
template <template <class, class> class Kernel, class P>
void by_types(DType row_type, DType tail_type, const P& p) {
  const bool b = tail_type == DType::BF16;
  switch (row_type) {
    case DType::F32: return b ? Kernel<float, bf16>::run(p) : Kernel<float, f16>::run(p);
    case DType::F16: return b ? Kernel<f16, bf16>::run(p) : Kernel<f16, f16>::run(p);
    default: return b ? Kernel<bf16, bf16>::run(p) : Kernel<bf16, f16>::run(p);
  }
}
template <class T, class Tail>
struct Pack {
  static void run(const Fp8PackParams& p) { pack_rows<T, Tail>(p); }
};
template <class T, class Tail>
struct Unpack {
  static void run(const Fp8UnpackParams& p) { unpack_rows<T, Tail>(p); }
};

}  // namespace

void fp8_round_trip_rows(const Fp8RoundTripParams& p) {
  if (simd_on() && fp8_simd_serves(p)) return fp8_round_trip_rows_simd(p);
  const int64_t ss = p.src_rows.col_stride, ds = p.dst_rows.col_stride;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* s = p.src + p.src_rows.offset(r);
    float* d = p.dst + p.dst_rows.offset(r);
    for (int32_t off = 0; off < p.n_nope; off += kFp8Block)
      math::fp8_block_round_trip(s + off * ss, ss, d + off * ds, ds, block_len(p.n_nope, off));
    if (s != d || ss != ds)
      for (int32_t i = p.n_nope; i < p.cols; ++i) d[i * ds] = s[i * ss];
  }
}

void fp8_pack_rows(const Fp8PackParams& p) {
  if (simd_on() && fp8_simd_serves(p)) return fp8_pack_rows_simd(p);
  by_types<Pack>(p.src_dtype, p.tail_dtype, p);
}
void fp8_unpack_rows(const Fp8UnpackParams& p) {
  if (simd_on() && fp8_simd_serves(p)) return fp8_unpack_rows_simd(p);
  by_types<Unpack>(p.dst_dtype, p.tail_dtype, p);
}

}  // namespace kvcore::ops::cpu
