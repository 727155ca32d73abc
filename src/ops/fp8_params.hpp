// Kernel parameters of the fp8 op family, shared by the CPU and CUDA backends.
// Entry points (src/ops/fp8.cpp) validate; kernels trust these.
#pragma once
#include <cstdint>

#include "kvcore/dtype.hpp"
#include "kvcore/math/hd.hpp"

namespace kvcore::ops {

// The rows of a tensor with up to 3 leading dims [n0, n1, n2, cols]: row r is
// (i0, i1, i2) with i2 fastest; offsets are in elements of the tensor's dtype.
struct RowMap {
  int64_t n1 = 1, n2 = 1;          // sizes of leading dims 1 and 2 (dim 0 follows from the row count)
  int64_t s0 = 0, s1 = 0, s2 = 0;  // element strides of the leading dims
  int64_t col_stride = 1;          // element stride of the last dim

  KVCORE_HD int64_t offset(int64_t r) const {
    if (n1 == 1 && n2 == 1) return r * s0;
    const int64_t i2 = r % n2;
    const int64_t t = r / n2;
    return (t / n1) * s0 + (t % n1) * s1 + i2 * s2;
  }
};

// fp8_round_trip_rows: dst[r, :n_nope] = FP8 round trip (blocks of 64), dst[r, n_nope:] = src[r, n_nope:].
struct Fp8RoundTripParams {
  const float* src;  // [rows, cols] through src_rows
  float* dst;        // [rows, cols] through dst_rows; may equal src (same map)
  RowMap src_rows, dst_rows;
  int64_t rows;
  int32_t cols, n_nope;
};

// fp8_pack_rows / fp8_unpack_rows (and the DeepSeek-V4 row, a fixed instance of them).
struct Fp8PackParams {
  const void* src;       // pack: [rows, cols] of src_dtype (f32/f16/bf16)
  uint8_t* codes;        // [rows, n_nope] e4m3
  uint8_t* scales;       // [rows, ceil(n_nope / 64)] ue8m0
  void* maybe_tail;      // [rows, cols - n_nope] of tail_dtype (f16/bf16); null when cols == n_nope
  uint8_t* maybe_pad;    // [rows] one byte per row written as 0 (DeepSeek-V4 row); null otherwise
  RowMap src_rows, code_rows, scale_rows, tail_rows, pad_rows;
  DType src_dtype, tail_dtype;
  int64_t rows;
  int32_t cols, n_nope;
};

struct Fp8UnpackParams {
  const uint8_t* codes;     // [rows, n_nope] e4m3
  const uint8_t* scales;    // [rows, ceil(n_nope / 64)] ue8m0
  const void* maybe_tail;   // [rows, cols - n_nope] of tail_dtype; null when cols == n_nope
  void* dst;                // [rows, cols] of dst_dtype (f32/f16/bf16)
  RowMap code_rows, scale_rows, tail_rows, dst_rows;
  DType dst_dtype, tail_dtype;
  int64_t rows;
  int32_t cols, n_nope;
};

namespace cpu {
void fp8_round_trip_rows(const Fp8RoundTripParams& p);
void fp8_pack_rows(const Fp8PackParams& p);
void fp8_unpack_rows(const Fp8UnpackParams& p);
}  // namespace cpu

namespace cuda {
// `vector`: every tensor qualifies for 16-byte (f32) / 8-byte (16-bit) / 4-byte (codes) accesses
// (the entry point checks alignment, unit column strides, cols % 4 == 0 and n_nope % 4 == 0).
void fp8_round_trip_rows(const Fp8RoundTripParams& p, bool vector, int device, void* stream);
void fp8_pack_rows(const Fp8PackParams& p, bool vector, int device, void* stream);
void fp8_unpack_rows(const Fp8UnpackParams& p, bool vector, int device, void* stream);
}  // namespace cuda

}  // namespace kvcore::ops
