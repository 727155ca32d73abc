// FP8 E4M3 rows with UE8M0 block scales (seed 002; DeepSeek-V4's KV format).
//
// A row of `cols` values splits into n_nope = cols - n_rot "nope" values, FP8
// in blocks of 64 (one power-of-two scale each; a partial last block takes the
// amax of its own values), and an n_rot rope tail that is never quantized.
// Rows: tensors of rank 1..4 whose leading dims are rows (any strides >= 0;
// the last dim may be strided too). Every op checks every argument and throws
// kvcore::Error(InvalidArgument) naming it before anything is written; CPU and
// CUDA give bit-identical results. Codec details: kvcore/math/fp8.hpp and
// kvcore/math/fp8_block.hpp (which also holds the per-row helpers kernels reuse).
//
// Scale of a block: 2^k, k = ceil(log2(max(amax, 1e-4) / 448)) computed exactly, amax over
// the block's finite values. Seed 002 evaluates it with float log2/exp2, which picks 2^(k-1)
// when amax lies a few ulps above 448 * 2^(k-1); that changes only the block's values below
// 2^-5 of the scale (tests/codec_fp8_test.cpp shows it). Values: round to nearest, ties to
// the even code, equal to the seed's binary search for every finite input (exhaustive test).
// Non-finite values: a NaN stays NaN (code 0x7f; payload not kept), +-inf becomes +-448 * 2^k
// (codes 0x7e / 0xfe). A -0.0 stays -0.0 (code 0x80), where the seed returns +0.0.
//
// Thread safety: calls may come from several threads at once (what they cache per device is
// guarded) as long as no call writes memory that another one reads or writes.
#pragma once
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// The seed's kernel_dsv4_fp8_kv_quantize_f32: dst = src with the nope part
// FP8-rounded (quantize, then dequantize to f32) and the tail copied.
// src, dst: f32, same shape [..., cols]; dst == src (same view) runs in place;
// otherwise they must not overlap. n_rot: even, 0 <= n_rot <= cols.
void fp8_round_trip_rows(const TensorRef& src, const TensorRef& dst, int n_rot, Stream stream = {});

// Real FP8 storage of rows.
//   src    [..., cols]             f32, f16 or bf16
//   codes  [..., n_nope]           e4m3 (one byte per value)
//   scales [..., ceil(n_nope/64)]  ue8m0 (byte b: scale 2^(b - 127))
//   tail   [..., n_rot]            f16 or bf16 (the rope dims rounded to nearest even), or an
//                                  empty TensorRef{} when n_rot == 0
// cols = n_nope + n_rot; n_rot is taken from tail and must be even. Outputs must not overlap src.
// fp8_unpack_rows(fp8_pack_rows(x)) equals fp8_round_trip_rows(x) bit for bit on the nope dims
// (f32 out; f16/bf16 out: that value rounded) and the 16-bit rounding of the tail.
void fp8_pack_rows(const TensorRef& src, const TensorRef& codes, const TensorRef& scales, const TensorRef& tail,
                   Stream stream = {});
//   dst [..., cols] f32, f16 or bf16.
void fp8_unpack_rows(const TensorRef& codes, const TensorRef& scales, const TensorRef& tail, const TensorRef& dst,
                     Stream stream = {});

// DeepSeek-V4's 584-byte row (kvcore/math/dsv4_row.hpp): 448 e4m3 | 64 x bf16 rope | 7 ue8m0 | 1 pad (0).
//   src [..., 512] f32 (strides free); packed [..., 584] u8 (bytes of a row contiguous,
//   data 2-byte aligned, even row strides).
void dsv4_pack_rows(const TensorRef& src, const TensorRef& packed, Stream stream = {});
//   dst [..., 512] f32, f16 or bf16.
void dsv4_unpack_rows(const TensorRef& packed, const TensorRef& dst, Stream stream = {});

}  // namespace kvcore
