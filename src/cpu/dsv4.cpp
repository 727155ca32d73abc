// CPU kernels of the DeepSeek-V4 ops (OpenMP across rows / windows / queries and
// the indexer's row blocks). With SIMD on (simd_targets.hpp) the compressor's pool
// and the indexer's scores run in vectors (dsv4_simd.hpp): channels in lanes for
// the pool, gathered a candidate row at a time; the codecs, RMSNorm, rotation and
// the top-k stay the scalar code (shared math, the CUDA backend's bits).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "cpu/dsv4_simd.hpp"
#include "cpu/simd_targets.hpp"
#include "kvcore/math/dsv4.hpp"
#include "ops/dsv4_backends.hpp"
#include "ops/dsv4_candidates.hpp"

namespace kvcore::dsv4::cpu {

void finalize(const FinalizeParams& p) {
  const int32_t n_nope = p.head_dim - p.n_rot;
  const int64_t first_stored = std::max<int64_t>(0, p.n_rows - p.raw_rows);
  const bool simd = ops::cpu::simd_on() && n_nope % math::kFp8Block == 0;
#pragma omp parallel for if (p.n_rows > 64)
  for (int64_t i = 0; i < p.n_rows; ++i) {
    float* row = p.kv + i * p.kv_stride;
    if (simd) {
      void* raw = nullptr;
      if (i >= first_stored) {
        const int64_t r = (p.first_raw_row + i) % p.raw_rows;
        raw = p.raw_f16 ? static_cast<void*>(static_cast<uint16_t*>(p.raw) + r * p.raw_stride)
                        : static_cast<void*>(static_cast<float*>(p.raw) + r * p.raw_stride);
      }
      ops::cpu::dsv4_finalize_row_simd(row, p.head_dim, n_nope, p.quant != 0, raw, p.raw_f16 != 0);
      continue;
    }
    if (p.quant) math::dsv4_fp8_round_trip_nope(row, n_nope);
    if (i < first_stored) continue;
    const int64_t r = (p.first_raw_row + i) % p.raw_rows;
    if (p.raw_f16) {
      uint16_t* dst = static_cast<uint16_t*>(p.raw) + r * p.raw_stride;
      for (int32_t d = 0; d < p.head_dim; ++d) dst[d] = math::f32_to_f16_bits(row[d]);
    } else {
      float* dst = static_cast<float*>(p.raw) + r * p.raw_stride;
      for (int32_t d = 0; d < p.head_dim; ++d)
        dst[d] = p.quant ? math::f16_bits_to_f32(math::f32_to_f16_bits(row[d])) : row[d];
    }
  }
}

void store_one(const CompressorParams& p) {
  const int64_t r = p.pos % p.ratio;
  const int64_t row = (p.overlap ? p.ratio : 0) + r;
  for (int32_t k = 0; k < p.width; ++k) {
    p.state_kv[row * p.width + k] = p.c[k];
    p.state_score[row * p.width + k] = p.z[k] + ape_value(p, r, k);
  }
}

void shift(const CompressorParams& p) {
  const int64_t n = static_cast<int64_t>(p.ratio) * p.width;
  std::memmove(p.state_kv, p.state_kv + n, n * sizeof(float));
  std::memmove(p.state_score, p.state_score + n, n * sizeof(float));
}

void reset(const CompressorParams& p) {
  const int64_t n = static_cast<int64_t>(p.state_rows) * p.width;
  std::fill(p.state_kv, p.state_kv + n, 0.0f);
  std::fill(p.state_score, p.state_score + n, -INFINITY);
}

namespace {

// RMSNorm with weight, RoPE at the window's first position, quantization, store.
// With SIMD the sum of squares runs in lanes (a float sum: the pool's tolerance), the
// rotation and the attention row's packing with the scalar bits.
void finish_row(const CompressorParams& p, int64_t w, float* buf, bool simd) {
  const float s = simd ? 1.0f / std::sqrt(ops::cpu::dsv4_sum_squares_simd(buf, p.head_dim) / static_cast<float>(p.head_dim) + p.eps)
                       : math::dsv4_rms_scale(buf, p.head_dim, p.eps);
  for (int32_t k = 0; k < p.head_dim; ++k) buf[k] = p.norm_weight[k] * (buf[k] * s);
  if (simd) ops::cpu::dsv4_rope_row_simd(buf, p.rope, static_cast<float>(w * p.ratio));
  else math::rope_rotate_row(buf, p.rope, static_cast<float>(w * p.ratio), 1.0f);
  if (p.rows_packed) {
    uint8_t* out = static_cast<uint8_t*>(p.rows) + w * p.rows_stride;
    if (p.kind == 0) {
      if (simd) ops::cpu::dsv4_row_pack_simd(buf, out);
      else math::dsv4_row_pack(buf, out);
    } else {
      math::dsv4_hadamard(buf, p.head_dim);
      math::dsv4_pack_fp4_row(buf, p.head_dim, out);
    }
    return;
  }
  if (p.quant) {
    if (p.kind == 0) {
      math::dsv4_fp8_round_trip_nope(buf, p.head_dim - p.n_rot);
    } else {
      math::dsv4_hadamard(buf, p.head_dim);
      math::dsv4_fp4_round_trip(buf, p.head_dim);
    }
  }
  std::memcpy(static_cast<float*>(p.rows) + w * p.rows_stride, buf, p.head_dim * sizeof(float));
}

// The pool's candidates for the SIMD pool: row j holds candidate j of every channel,
// pointed to where it lies (the state, the chunk's c) or built in z_buf (a chunk
// token's logit plus its ape).
struct CandidateRows {
  std::vector<const float*> z, c;
  std::vector<const void*> ape;  // a chunk token's ape row (added to z in the pool), else null
  std::vector<float> z_buf;
  explicit CandidateRows(const CompressorParams& p)
      : z(p.state_rows), c(p.state_rows), ape(p.state_rows, nullptr), z_buf(static_cast<size_t>(p.state_rows) * p.head_dim) {}
  static bool serves(const CompressorParams& p) {
    return ops::cpu::simd_on() && p.state_rows <= ops::cpu::kDsv4PoolMaxCandidates;
  }
  void pool(const CompressorParams& p, float* out) const {
    ops::cpu::dsv4_pool_rows_simd(z.data(), ape.data(), p.ape_f16 != 0, c.data(), p.state_rows, p.head_dim, out);
  }
  // Candidate j of every channel when emitting from the state (state_candidate's values).
  void state_row(const CompressorParams& p, int32_t j) {
    const int32_t col0 = math::dsv4_candidate_col(j, 0, p.ratio, p.head_dim, p.overlap != 0);
    z[j] = p.state_score + static_cast<int64_t>(j) * p.width + col0;
    c[j] = p.state_kv + static_cast<int64_t>(j) * p.width + col0;
    ape[j] = nullptr;
  }
  // Candidate j of every channel of window w during prefill: prefill_candidate's values,
  // with the token and lane worked out once per row (the column is col0 + k).
  void prefill_row(const CompressorParams& p, int64_t w, int32_t j) {
    const int32_t m = p.ratio;
    int64_t tok;
    int32_t col0, jm;
    if (p.overlap && j >= m) {
      tok = w * m + (j - m), col0 = p.head_dim, jm = j - m;
    } else {
      tok = (p.overlap ? w - 1 : w) * m + j, col0 = 0, jm = j;
    }
    ape[j] = nullptr;
    if (tok < 0) {  // no candidate: -inf logits (the pool computes their terms and never takes them)
      float* zb = z_buf.data() + static_cast<size_t>(j) * p.head_dim;
      std::fill(zb, zb + p.head_dim, -INFINITY);
      z[j] = c[j] = zb;
      return;
    }
    if (tok >= p.pos) {  // a chunk token: its logit row, the ape added in the pool
      const int64_t i = tok - p.pos;
      z[j] = p.z + i * p.z_stride + col0;
      ape[j] = p.ape_f16 ? static_cast<const void*>(static_cast<const uint16_t*>(p.ape) + jm * p.ape_stride + col0)
                         : static_cast<const void*>(static_cast<const float*>(p.ape) + jm * p.ape_stride + col0);
      c[j] = p.c + i * p.c_stride + col0;
      return;
    }
    const int64_t cw = p.pos / m;
    const int64_t row = (p.overlap && tok / m == cw) ? m + jm : jm;
    z[j] = p.state_score + row * p.width + col0;
    c[j] = p.state_kv + row * p.width + col0;
  }
};

}  // namespace

void emit(const CompressorParams& p) {
  std::vector<float> buf(p.head_dim);
  if (CandidateRows::serves(p)) {
    CandidateRows cand(p);
    for (int32_t j = 0; j < p.state_rows; ++j) cand.state_row(p, j);
    cand.pool(p, buf.data());
  } else {
    for (int32_t k = 0; k < p.head_dim; ++k)
      buf[k] = math::dsv4_pool_any(p.state_rows, [&](int j, float& z, float& c) { state_candidate(p, j, k, z, c); });
  }
  finish_row(p, p.window, buf.data(), ops::cpu::simd_on());
}

void prefill(const CompressorParams& p) {
  const int64_t m = p.ratio;
  const int64_t w0 = p.pos / m, w1 = (p.pos + p.n_tokens) / m;  // windows [w0, w1) complete in this chunk
  const bool big = (w1 - w0) * p.head_dim * p.state_rows > (1 << 16);  // threads only pay off on large chunks
  const bool simd = CandidateRows::serves(p), simd_on = ops::cpu::simd_on();
#pragma omp parallel if (big)
  {
    std::vector<float> buf(p.head_dim);
    CandidateRows cand(p);
#pragma omp for schedule(static)
    for (int64_t w = w0; w < w1; ++w) {
      if (simd) {
        for (int32_t j = 0; j < p.state_rows; ++j) cand.prefill_row(p, w, j);
        cand.pool(p, buf.data());
      } else {
        for (int32_t k = 0; k < p.head_dim; ++k)
          buf[k] = math::dsv4_pool_any(p.state_rows, [&](int j, float& z, float& c) { prefill_candidate(p, w, j, k, z, c); });
      }
      finish_row(p, w, buf.data(), simd_on);
    }
  }
  // State as token-by-token storing leaves it: rows < m first (they may copy rows >= m).
  for (int32_t r = 0; r < p.state_rows; ++r) {
    int64_t tok = 0;
    int32_t src = 0;
    const int how = prefill_state_source(p, r, &tok, &src);
    float* kv = p.state_kv + static_cast<int64_t>(r) * p.width;
    float* sc = p.state_score + static_cast<int64_t>(r) * p.width;
    if (how == 1) {
      const int64_t t = p.pos + tok;
      for (int32_t k = 0; k < p.width; ++k) {
        kv[k] = p.c[tok * p.c_stride + k];
        sc[k] = p.z[tok * p.z_stride + k] + ape_value(p, t % m, k);
      }
    } else if (how == 2) {
      std::memcpy(kv, p.state_kv + static_cast<int64_t>(src) * p.width, p.width * sizeof(float));
      std::memcpy(sc, p.state_score + static_cast<int64_t>(src) * p.width, p.width * sizeof(float));
    }
  }
}

namespace {

constexpr int64_t kIndexerRowBlock = 256;  // key rows per scoring task (decoded once, scored by every head)

// math::e2m1_decode of the 16 codes, looked up instead of decoded per value.
const std::array<float, 16> kE2m1Values = [] {
  std::array<float, 16> v{};
  for (int c = 0; c < 16; ++c) v[c] = math::e2m1_decode(static_cast<uint8_t>(c));
  return v;
}();

// Rows [s0, s1) of the indexer's keys as f32 (packed rows: the values of math::dsv4_unpack_fp4_value).
void indexer_decode_rows(const IndexerParams& p, int64_t s0, int64_t s1, float* keys) {
  for (int64_t s = s0; s < s1; ++s) {
    float* key = keys + (s - s0) * p.dim;
    if (!p.rows_packed) {
      const float* row = static_cast<const float*>(p.rows) + s * p.rows_stride;
      std::copy(row, row + p.dim, key);
      continue;
    }
    const uint8_t* row = static_cast<const uint8_t*>(p.rows) + s * p.rows_stride;
    for (int32_t b = 0; b < p.dim / math::kFp4Block; ++b) {
      const float scale = math::ue8m0_decode(row[p.dim / 2 + b]);
      for (int32_t d = b * math::kFp4Block; d < (b + 1) * math::kFp4Block; d += 2) {
        const uint8_t byte = row[d / 2];
        key[d] = kE2m1Values[byte & 0xfu] * scale;
        key[d + 1] = kE2m1Values[byte >> 4] * scale;
      }
    }
  }
}

// The scalar path's scores: dots in index order, heads summed in order.
void indexer_scores_scalar(const IndexerParams& p, const float* qh, const float* w, const float* keys, int64_t n,
                           float* sc) {
  for (int64_t s = 0; s < n; ++s) {
    const float* key = keys + s * p.dim;
    float acc = 0.0f;
    for (int32_t h = 0; h < p.n_heads; ++h) {
      const float* qv = qh + static_cast<size_t>(h) * p.dim;
      float dot = 0.0f;
      for (int32_t d = 0; d < p.dim; ++d) dot += qv[d] * key[d];
      acc += w[h] * (dot > 0.0f ? dot : 0.0f);
    }
    sc[s] = acc;
  }
}

}  // namespace

void indexer_topk(const IndexerParams& p) {
  const bool simd = ops::cpu::simd_on();
  const size_t q_floats = static_cast<size_t>(p.n_heads) * p.dim;
  const bool big = static_cast<double>(p.n_q) * p.n_rows * p.n_heads * p.dim > 1e6;  // threads pay off
  // With SIMD and dims in whole chunks of 64: the heads in lanes (zero-padded queries and
  // weights), each query transposed once (and prepared there, below).
  const bool lanes = simd && (p.dim == 64 || p.dim == 128 || p.dim == 256 || p.dim == 512);
  // The queries as scored: copied, and with quantization Hadamard-rotated and FP4 round-tripped.
  std::vector<float> qall(lanes ? 0 : static_cast<size_t>(p.n_q) * q_floats);
#pragma omp parallel for schedule(static) if (big && p.n_q > 1)
  for (int32_t i = 0; i < (lanes ? 0 : p.n_q); ++i)
    for (int32_t h = 0; h < p.n_heads; ++h) {
      float* dst = qall.data() + i * q_floats + static_cast<size_t>(h) * p.dim;
      const float* src = p.q + i * p.q_stride0 + h * p.q_stride1;
      std::copy(src, src + p.dim, dst);
      if (p.quant) {
        math::dsv4_hadamard(dst, p.dim);
        math::dsv4_fp4_round_trip(dst, p.dim);
      }
    }
  const int32_t hp = lanes ? (p.n_heads + ops::cpu::dsv4_head_lanes() - 1) / ops::cpu::dsv4_head_lanes() *
                                 ops::cpu::dsv4_head_lanes()
                           : 0;
  std::vector<float> qt(lanes ? static_cast<size_t>(p.n_q) * hp * p.dim : 0), wt(static_cast<size_t>(p.n_q) * hp, 0.0f);
  if (lanes) {
    std::vector<float> rows(static_cast<size_t>(hp) * p.dim, 0.0f);
    for (int32_t i = 0; i < p.n_q; ++i) {
      for (int32_t h = 0; h < p.n_heads; ++h) {
        const float* src = p.q + i * p.q_stride0 + h * p.q_stride1;
        std::copy(src, src + p.dim, rows.begin() + static_cast<size_t>(h) * p.dim);
      }
      float* qi = qt.data() + static_cast<size_t>(i) * hp * p.dim;
      ops::cpu::dsv4_transpose_heads_simd(rows.data(), p.dim, hp, p.dim, 1.0f, qi);
      if (p.quant) ops::cpu::dsv4_indexer_query_prep_simd(qi, hp, p.dim);
      std::copy(p.weights + i * p.w_stride, p.weights + i * p.w_stride + p.n_heads, wt.begin() + i * hp);
    }
  }
  // Scores: one task per (query, block of key rows); rows a query cannot see score -inf.
  const int64_t n_blocks = (p.cap + kIndexerRowBlock - 1) / kIndexerRowBlock;
#pragma omp parallel if (big)
  {
    thread_local std::vector<float> keys, dots;
    keys.resize(static_cast<size_t>(kIndexerRowBlock) * p.dim);
    dots.resize(static_cast<size_t>(kIndexerRowBlock) * hp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < int64_t{p.n_q} * n_blocks; ++task) {
      const int32_t i = static_cast<int32_t>(task / n_blocks);
      const int64_t s0 = (task % n_blocks) * kIndexerRowBlock, s1 = std::min(p.cap, s0 + kIndexerRowBlock);
      const int64_t vis = std::min<int64_t>(p.n_rows, visible_rows(p.first_query_pos + i, p.ratio));
      float* sc = p.scores + i * p.scores_stride;
      const int64_t e = std::clamp(vis, s0, s1);
      std::fill(sc + e, sc + s1, -INFINITY);
      if (e == s0) continue;
      if (lanes && p.rows_packed)
        ops::cpu::dsv4_fp4_rows_decode_simd(static_cast<const uint8_t*>(p.rows) + s0 * p.rows_stride, p.rows_stride,
                                            static_cast<int32_t>(e - s0), p.dim, keys.data());
      else indexer_decode_rows(p, s0, e, keys.data());
      const float* qh = lanes ? nullptr : qall.data() + i * q_floats;
      const float* w = p.weights + i * p.w_stride;
      if (lanes)
        ops::cpu::dsv4_indexer_scores_lanes_simd(qt.data() + static_cast<size_t>(i) * hp * p.dim, wt.data() + i * hp, hp,
                                                 p.dim, keys.data(), static_cast<int32_t>(e - s0), dots.data(), sc + s0);
      else if (simd) ops::cpu::dsv4_indexer_scores_simd(qh, w, p.n_heads, p.dim, keys.data(), e - s0, sc + s0);
      else indexer_scores_scalar(p, qh, w, keys.data(), e - s0, sc + s0);
    }
  }
  // Top-k per query: the k highest scores, ties to the lower row; every NaN counts as one
  // value above +inf (a total order, the same the CUDA kernels select by), so NaN scores give
  // defined picks too. Sorted as one u64 key a row: the score's order-preserving bits (NaN
  // highest, -0 as +0) above the row's complement, so a larger key is a higher score or, equal,
  // a lower row.
#pragma omp parallel if (big && p.n_q > 1)
  {
    std::vector<uint64_t> order;
#pragma omp for schedule(dynamic, 1)
    for (int32_t i = 0; i < p.n_q; ++i) {
      const int64_t vis = std::min<int64_t>(p.n_rows, visible_rows(p.first_query_pos + i, p.ratio));
      const float* sc = p.scores + i * p.scores_stride;
      order.resize(static_cast<size_t>(std::max<int64_t>(vis, 0)));
      for (size_t s = 0; s < order.size(); ++s) {
        uint32_t u;
        const float x = sc[s] + 0.0f;  // -0 -> +0
        std::memcpy(&u, &x, 4);
        const uint32_t key = std::isnan(sc[s]) ? 0xffffffffu : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        order[s] = uint64_t{key} << 32 | (0xffffffffu - static_cast<uint32_t>(s));
      }
      const int64_t take = std::min<int64_t>(p.k, static_cast<int64_t>(order.size()));
      std::nth_element(order.begin(), order.begin() + take - (take > 0), order.end(), std::greater<>());
      std::sort(order.begin(), order.begin() + take, std::greater<>());
      int32_t* out = p.out + i * p.out_stride;
      for (int32_t j = 0; j < p.k; ++j)
        out[j] = j < take ? static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(order[j])) : -1;
    }
  }
}

void decode_layer(const DecodeParams& p) {
  finalize(p.fin);
  for (const CompressorParams* c : {p.has_comp ? &p.comp : nullptr, p.has_idx ? &p.idx : nullptr}) {
    if (!c) continue;
    store_one(*c);
    if (c == &p.comp ? p.comp_due : p.idx_due) {
      emit(*c);
      if (c->overlap) shift(*c);
    }
  }
}

}  // namespace kvcore::dsv4::cpu
