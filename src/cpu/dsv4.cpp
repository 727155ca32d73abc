// CPU kernels of the DeepSeek-V4 ops (OpenMP across rows / windows / queries).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kvcore/math/dsv4.hpp"
#include "ops/dsv4_backends.hpp"
#include "ops/dsv4_candidates.hpp"

namespace kvcore::dsv4::cpu {

void finalize(const FinalizeParams& p) {
  const int32_t n_nope = p.head_dim - p.n_rot;
  const int64_t first_stored = std::max<int64_t>(0, p.n_rows - p.raw_rows);
#pragma omp parallel for if (p.n_rows > 64)
  for (int64_t i = 0; i < p.n_rows; ++i) {
    float* row = p.kv + i * p.kv_stride;
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
void finish_row(const CompressorParams& p, int64_t w, float* buf) {
  const float s = math::dsv4_rms_scale(buf, p.head_dim, p.eps);
  for (int32_t k = 0; k < p.head_dim; ++k) buf[k] = p.norm_weight[k] * (buf[k] * s);
  math::rope_rotate_row(buf, p.rope, static_cast<float>(w * p.ratio), 1.0f);
  if (p.rows_packed) {
    uint8_t* out = static_cast<uint8_t*>(p.rows) + w * p.rows_stride;
    if (p.kind == 0) {
      math::dsv4_row_pack(buf, out);
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

}  // namespace

void emit(const CompressorParams& p) {
  std::vector<float> buf(p.head_dim);
  for (int32_t k = 0; k < p.head_dim; ++k)
    buf[k] = math::dsv4_pool_any(p.state_rows, [&](int j, float& z, float& c) { state_candidate(p, j, k, z, c); });
  finish_row(p, p.window, buf.data());
}

void prefill(const CompressorParams& p) {
  const int64_t m = p.ratio;
  const int64_t w0 = p.pos / m, w1 = (p.pos + p.n_tokens) / m;  // windows [w0, w1) complete in this chunk
  const bool big = (w1 - w0) * p.head_dim * p.state_rows > (1 << 16);  // threads only pay off on large chunks
#pragma omp parallel if (big)
  {
    std::vector<float> buf(p.head_dim);
#pragma omp for schedule(static)
    for (int64_t w = w0; w < w1; ++w) {
      for (int32_t k = 0; k < p.head_dim; ++k)
        buf[k] = math::dsv4_pool_any(p.state_rows, [&](int j, float& z, float& c) { prefill_candidate(p, w, j, k, z, c); });
      finish_row(p, w, buf.data());
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

void indexer_topk(const IndexerParams& p) {
  const bool big = p.n_q > 1 && static_cast<double>(p.n_q) * p.n_rows * p.n_heads * p.dim > 1e6;  // threads split queries
#pragma omp parallel if (big)
  {
    std::vector<float> qh(static_cast<size_t>(p.n_heads) * p.dim), key(p.dim);
    std::vector<int64_t> order;
#pragma omp for schedule(dynamic, 1)
    for (int32_t i = 0; i < p.n_q; ++i) {
      for (int32_t h = 0; h < p.n_heads; ++h) {
        float* dst = qh.data() + static_cast<size_t>(h) * p.dim;
        const float* src = p.q + i * p.q_stride0 + h * p.q_stride1;
        std::copy(src, src + p.dim, dst);
        if (p.quant) {
          math::dsv4_hadamard(dst, p.dim);
          math::dsv4_fp4_round_trip(dst, p.dim);
        }
      }
      const int64_t t = p.first_query_pos + i;
      const int64_t vis = std::min<int64_t>(p.n_rows, visible_rows(t, p.ratio));
      float* sc = p.scores + i * p.scores_stride;
      const float* w = p.weights + i * p.w_stride;
      for (int64_t s = 0; s < p.cap; ++s) {
        if (s >= vis) {
          sc[s] = -INFINITY;
          continue;
        }
        if (p.rows_packed) {
          const uint8_t* row = static_cast<const uint8_t*>(p.rows) + s * p.rows_stride;
          for (int32_t d = 0; d < p.dim; ++d) key[d] = math::dsv4_unpack_fp4_value(row, p.dim, d);
        } else {
          const float* row = static_cast<const float*>(p.rows) + s * p.rows_stride;
          std::copy(row, row + p.dim, key.begin());
        }
        float acc = 0.0f;
        for (int32_t h = 0; h < p.n_heads; ++h) {
          const float* qv = qh.data() + static_cast<size_t>(h) * p.dim;
          float dot = 0.0f;
          for (int32_t d = 0; d < p.dim; ++d) dot += qv[d] * key[d];
          acc += w[h] * (dot > 0.0f ? dot : 0.0f);
        }
        sc[s] = acc;
      }
      order.resize(vis);
      std::iota(order.begin(), order.end(), int64_t{0});
      const int64_t take = std::min<int64_t>(p.k, vis);
      // Score descending, then row ascending; every NaN counts as one value above +inf (a total
      // order, the same the CUDA kernels select by), so NaN scores give defined picks too.
      std::partial_sort(order.begin(), order.begin() + take, order.end(), [&](int64_t a, int64_t b) {
        const bool na = std::isnan(sc[a]), nb = std::isnan(sc[b]);
        if (na || nb) return na && (!nb || a < b);
        return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
      });
      int32_t* out = p.out + i * p.out_stride;
      for (int32_t j = 0; j < p.k; ++j) out[j] = j < take ? static_cast<int32_t>(order[j]) : -1;
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
