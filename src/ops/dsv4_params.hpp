// Plain parameter structs of the DeepSeek-V4 ops, shared by the CPU and CUDA
// kernels. The entry points (src/ops/dsv4*.cpp) fill them after validation;
// kernels trust them. Strides are in elements (bytes for packed u8 rows).
#pragma once
#include <cstdint>

#include "kvcore/math/rope.hpp"

namespace kvcore::dsv4 {

struct FinalizeParams {
  float* kv;               // [n_rows, head_dim], row stride kv_stride, in/out
  int64_t kv_stride;
  int32_t n_rows, head_dim, n_rot;
  void* raw;               // [raw_rows, head_dim] f32 or f16 (raw_f16), row stride raw_stride
  int64_t raw_stride;
  int32_t raw_f16;
  int32_t raw_rows;
  int64_t first_raw_row;   // row i goes to (first_raw_row + i) % raw_rows
  int32_t quant;           // 1: FP8 round trip of the nope dims, f16-rounded ring rows
};

// Everything one compressor op needs. Ops use the fields their comment names.
struct CompressorParams {
  // geometry
  int32_t head_dim, n_rot, ratio, overlap, kind /* 0 attention, 1 indexer */, width, state_rows;
  float eps;
  int32_t quant;
  // weights
  const void* ape;         // [ratio, width] f32 or f16 (ape_f16), row stride ape_stride
  int64_t ape_stride;
  int32_t ape_f16;
  const float* norm_weight;  // [head_dim]
  math::RopeTable rope;
  // state: [state_rows, width] f32, contiguous
  float* state_kv;
  float* state_score;
  // row store: [rows_cap, head_dim] f32 or [rows_cap, packed bytes] u8
  void* rows;
  int64_t rows_stride;
  int64_t rows_cap;
  int32_t rows_packed;
  // token inputs: [n_tokens, width] f32, row strides c_stride / z_stride
  const float* c;
  const float* z;
  int64_t c_stride, z_stride;
  int64_t n_tokens;
  int64_t pos;             // store_one: the token's position; prefill: start_pos
  int64_t window;          // emit: the row to emit
};

// A fused decode step of one layer: finalize, then per compressor store / emit / shift.
struct DecodeParams {
  FinalizeParams fin;
  CompressorParams comp, idx;  // pos, c, z set; window = pos / ratio
  int32_t has_comp, has_idx;
  int32_t comp_due, idx_due;   // the token completes a window
};

struct IndexerParams {
  const float* q;          // [n_q, n_heads, dim], strides q_stride0 (query), q_stride1 (head)
  int64_t q_stride0, q_stride1;
  const float* weights;    // [n_q, n_heads], row stride w_stride
  int64_t w_stride;
  const void* rows;        // [cap, dim] f32 or [cap, packed bytes] u8
  int64_t rows_stride;
  int32_t rows_packed;
  int64_t cap, n_rows;
  int32_t n_q, n_heads, dim, ratio, quant, k;
  int64_t first_query_pos;
  float* scores;           // [n_q, cap], row stride scores_stride
  int64_t scores_stride;
  int32_t* out;            // [n_q, k], row stride out_stride
  int64_t out_stride;
};

// Visible compressed rows for a query at position t: rows w < (t + 1) / ratio.
constexpr int64_t visible_rows(int64_t t, int32_t ratio) { return (t + 1) / ratio; }

}  // namespace kvcore::dsv4
