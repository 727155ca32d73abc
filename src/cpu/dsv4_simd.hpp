// SIMD kernels of the DeepSeek-V4 CPU ops (Highway, every target of
// simd_config.hpp): the compressor's softmax pool, the indexer's scores and query
// preparation, the sparse attention's tile with the heads in lanes, and the row
// codecs. Float sums in another order than the scalar path and Highway's exp (1 ulp):
// results agree with the scalar path to the tolerances the tests state; the row
// decoding, packing, rotation, query preparation and finalizer row are exact.
#pragma once
#include <cstdint>

#include "kvcore/math/rope.hpp"

namespace kvcore::ops::cpu {

// Most candidates dsv4_pool_rows_simd takes (HCA pools 128).
inline constexpr int32_t kDsv4PoolMaxCandidates = 256;

// out[k] = the compressor pool (math::dsv4_pool_any: HF's three-pass softmax for 8
// candidates, the online fold otherwise) of channel k over n_cand candidates: logit
// z[j][k] (-inf: none) plus ape[j][k] where ape and ape[j] are not null (f32 values, or f16
// with ape_f16: the scalar path's single add), value c[j][k], k in [0, n_ch). Rows are read
// only in [0, n_ch).
void dsv4_pool_rows_simd(const float* const* z, const void* const* ape, bool ape_f16, const float* const* c,
                         int32_t n_cand, int32_t n_ch, float* out);

// The indexer's score of each of n_keys f32 rows keys[s * dim ..]: sum over heads h
// (in order) of w[h] * relu(q[h * dim ..] . key). dim a multiple of 16.
void dsv4_indexer_scores_simd(const float* q, const float* w, int32_t n_heads, int32_t dim, const float* keys,
                              int64_t n_keys, float* scores);

// The lanes of a vector of floats on the dispatched target: dsv4_heads_tile_simd's heads
// are padded to a multiple of it.
int32_t dsv4_head_lanes();

// One tile of the sparse attention for every head of a query row at once (heads in lanes;
// MQA: each head reads the same key rows). hp: n_heads rounded up to dsv4_head_lanes().
//   qt[d * hp + h]: head h's query times the softmax scale in log2 units (padding heads: any
//     finite values); keys: n rows of 512 f32 (a dead row, !live[i], must hold finite values:
//     it weighs 0); m[hp], l[hp]: each head's math::OnlineSoftmax state, updated;
//   acc[h * 512 + d], h < n_heads: the un-normalized weighted sums, rescaled and summed;
//   s: scratch of n * hp floats (left holding the tile's weights), rescale: of hp floats.
// Each score sums d in the scalar order (FMA); the exp2 is Exp2NonPositive (within 1e-7
// relative); the weighted sums add the keys in the scalar order.
void dsv4_heads_tile_simd(const float* qt, int32_t n_heads, int32_t hp, const float* keys, const bool* live, int32_t n,
                          float* m, float* l, float* acc, float* s, float* rescale);

// qt[x * hp + h] = q[h * head_stride + x] * scale: hp rows of dim floats transposed (hp a
// multiple of dsv4_head_lanes(); head_stride * hp below 2^31).
void dsv4_transpose_heads_simd(const float* q, int64_t head_stride, int32_t hp, int32_t dim, float scale, float* qt);

// The indexer's score of each of n f32 key rows keys[i * dim ..] with the heads in lanes:
// sum over heads h of w[h] * relu(q_h . key), qt[x * hp + h] the transposed queries and w[hp]
// the weights (padding heads: weight 0). Each dot sums x in order (FMA), the heads are summed
// in lanes, then across lanes: every row through the same operations, so equal rows score
// equal bits. dim a multiple of 64; s: scratch of n * hp floats.
void dsv4_indexer_scores_lanes_simd(const float* qt, const float* w, int32_t hp, int32_t dim, const float* keys,
                                    int32_t n, float* s, float* scores);

// The indexer's quantized query preparation on transposed queries (qt[x * hp + h], hp a
// multiple of dsv4_head_lanes()): each head's math::dsv4_hadamard then
// math::dsv4_fp4_round_trip, the same operations lane by lane, so the same bits. dim 64, 128,
// 256 or 512.
void dsv4_indexer_query_prep_simd(float* qt, int32_t hp, int32_t dim);

// n packed FP4 indexer rows (dim e2m1 codes, two a byte, low nibble first, then dim / 32
// UE8M0 scales; rows stride bytes apart) as f32: math::e2m1_decode(code) x scale, the same bits.
void dsv4_fp4_rows_decode_simd(const uint8_t* rows, int64_t stride, int32_t n, int32_t dim, float* dst);

// The attention row (math::Dsv4RowLayout) as 512 f32 values, the bits of math::dsv4_row_value.
void dsv4_row_decode_simd(const uint8_t* row, float* dst);

// n f16 values as f32 (exact).
void dsv4_f16_decode_simd(const uint16_t* src, int32_t n, float* dst);

// sum of x[i]^2 (lanes, then across lanes: not the scalar order).
float dsv4_sum_squares_simd(const float* x, int32_t n);

// math::rope_rotate_row(row, t, position, 1), the same bits.
void dsv4_rope_row_simd(float* row, const math::RopeTable& t, float position);

// The finalizer's row (dsv4::cpu::finalize), the same bits: with quant, the first n_nope
// values (a multiple of 64) through math::dsv4_fp8_round_trip_nope; then, where raw is not
// null, the row stored to raw as f16 (math::f32_to_f16_bits; raw_f16) or f32 (with quant,
// through f16 and back).
void dsv4_finalize_row_simd(float* row, int32_t head_dim, int32_t n_nope, bool quant, void* raw, bool raw_f16);

// math::dsv4_row_pack(src, row), the same bytes.
void dsv4_row_pack_simd(const float* src, uint8_t* row);

}  // namespace kvcore::ops::cpu
