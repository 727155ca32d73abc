// SIMD kernels of the DeepSeek-V4 CPU ops (Highway, every target of
// simd_config.hpp): the compressor's softmax pool, the indexer's scores and the
// sparse attention's per-head tile. Float sums in another order than the scalar
// path (lanes, then across lanes) and Highway's exp (1 ulp): results agree with
// the scalar path to the tolerances the tests state; the row decoding is exact.
#pragma once
#include <cstdint>

namespace kvcore::ops::cpu {

// Lane multiple the row buffers of these kernels are padded to (the widest target's floats).
inline constexpr int32_t kDsv4SimdPad = 16;

// out[k] = the compressor pool (math::dsv4_pool_any: HF's three-pass softmax for 8
// candidates, the online fold otherwise) of channel k over n_cand candidates:
// logit z[j * stride + k] (-inf: none), value c[j * stride + k]; k in [0, n_ch).
// stride and the buffers' rows are padded to a multiple of kDsv4SimdPad.
void dsv4_pool_rows_simd(const float* z, const float* c, int32_t n_cand, int64_t stride, int32_t n_ch, float* out);

// The indexer's score of each of n_keys f32 rows keys[s * dim ..]: sum over heads h
// (in order) of w[h] * relu(q[h * dim ..] . key). dim a multiple of kDsv4SimdPad.
void dsv4_indexer_scores_simd(const float* q, const float* w, int32_t n_heads, int32_t dim, const float* keys,
                              int64_t n_keys, float* scores);

// s[i] = q . keys[i * dim ..] for live[i], else -inf, i in [0, n); keys rows past n may be read
// (the caller pads the tile to a multiple of 4 rows). dim a multiple of kDsv4SimdPad.
void dsv4_tile_dots_simd(const float* q, const float* keys, const bool* live, int32_t n, int32_t dim, float* s);

// acc[d] = acc[d] * rescale + sum_i w[i] * keys[i * dim + d] (terms with w[i] == 0 skipped).
void dsv4_tile_accumulate_simd(float* acc, float rescale, const float* keys, const float* w, int32_t n, int32_t dim);

// The attention row (math::Dsv4RowLayout) as 512 f32 values, the bits of math::dsv4_row_value.
void dsv4_row_decode_simd(const uint8_t* row, float* dst);

// n f16 values as f32 (exact).
void dsv4_f16_decode_simd(const uint16_t* src, int32_t n, float* dst);

}  // namespace kvcore::ops::cpu
