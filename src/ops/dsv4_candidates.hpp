// Where the compressor's candidates come from, shared by the CPU and CUDA
// kernels so both backends read exactly the same values in the same order.
#pragma once
#include <cmath>

#include "kvcore/math/dsv4.hpp"
#include "kvcore/math/half.hpp"
#include "ops/dsv4_params.hpp"

namespace kvcore::dsv4 {

KVCORE_HD float ape_value(const CompressorParams& p, int64_t r, int32_t col) {
  return p.ape_f16 ? math::f16_bits_to_f32(static_cast<const uint16_t*>(p.ape)[r * p.ape_stride + col])
                   : static_cast<const float*>(p.ape)[r * p.ape_stride + col];
}

// Candidate j of channel k when emitting from the state.
KVCORE_HD void state_candidate(const CompressorParams& p, int32_t j, int32_t k, float& z, float& c) {
  const int32_t col = math::dsv4_candidate_col(j, k, p.ratio, p.head_dim, p.overlap != 0);
  z = p.state_score[static_cast<int64_t>(j) * p.width + col];
  c = p.state_kv[static_cast<int64_t>(j) * p.width + col];
}

// Candidate j of channel k of window w during prefill (chunk starts at p.pos):
// tokens of the chunk come from c/z (+ ape, the same f32 add as store_one);
// earlier tokens from the state rows where token-by-token storing left them;
// tokens before position 0 are no candidate (-inf).
KVCORE_HD void prefill_candidate(const CompressorParams& p, int64_t w, int32_t j, int32_t k, float& z, float& c) {
  const int32_t m = p.ratio;
  // tok % m is the candidate's lane jm: no 64-bit division per candidate (it cost more than the pool).
  int64_t tok;
  int32_t col, jm;
  if (p.overlap) {
    if (j < m) {
      tok = (w - 1) * m + j;
      col = k;
      jm = j;
    } else {
      tok = w * m + (j - m);
      col = p.head_dim + k;
      jm = j - m;
    }
  } else {
    tok = w * m + j;
    col = k;
    jm = j;
  }
  if (tok < 0) {
    z = -INFINITY;
    c = 0.0f;
    return;
  }
  if (tok >= p.pos) {
    const int64_t i = tok - p.pos;
    c = p.c[i * p.c_stride + col];
    z = p.z[i * p.z_stride + col] + ape_value(p, jm, col);
    return;
  }
  const int64_t cw = p.pos / m;  // the window that was current when the chunk began
  const int64_t row = (p.overlap && tok / m == cw) ? m + jm : jm;
  z = p.state_score[row * p.width + col];
  c = p.state_kv[row * p.width + col];
}

// After a prefill chunk, where state row r takes its value from, per the
// token-by-token semantics: returns 0 (unchanged), 1 (chunk token *tok), or
// 2 (old state row *src_row: the current window's lane copied by the shift).
// Rows r < m of an overlapping state must be updated before rows >= m.
KVCORE_HD int prefill_state_source(const CompressorParams& p, int32_t r, int64_t* tok, int32_t* src_row) {
  const int32_t m = p.ratio;
  const int64_t start = p.pos, end = p.pos + p.n_tokens;
  if (p.overlap && r < m) {
    const int64_t last_window = end / m - 1;  // the last window completed by the end of the chunk
    if (last_window < start / m) return 0;    // none completed inside the chunk: no shift happened
    const int64_t t = last_window * m + r;
    if (t >= start) {
      *tok = t - start;
      return 1;
    }
    *src_row = m + r;
    return 2;
  }
  const int32_t jj = p.overlap ? r - m : r;
  const int64_t last = (end - 1) - (((end - 1 - jj) % m) + m) % m;  // largest t < end with t % m == jj
  if (last < start) return 0;
  *tok = last - start;
  return 1;
}

}  // namespace kvcore::dsv4
