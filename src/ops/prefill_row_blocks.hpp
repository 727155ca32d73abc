// Which query rows a CTA of the CUDA prefill kernel takes, as plain host + device integer math
// so a CPU test can check that the CTAs cover every row exactly once.
// CTA x < n_blocks takes rows [x * kRows, x * kRows + kRows) of the sequence holding row x * kRows
// (clipped at its end); CTA n_blocks + b takes sequence b's first rows up to the next multiple of
// kRows when it starts between two. A grid of one CTA per row (31 of 32 exiting at once) spent
// ~1 us of an SM per empty CTA at one CTA an SM.
#pragma once
#include <cstdint>

#include "ops/attention_params.hpp"

namespace kvcore::ops {

struct PrefillRowBlock {
  int b = 0, row = 0, n_r = 0;  // sequence, first row, rows (n_r <= 0: nothing to do)
};

// CTAs along x for n_rows rows in `batch` sequences.
KVCORE_HD int64_t prefill_row_block_ctas(int64_t n_rows, int64_t batch, int rows_per_cta) {
  return (n_rows + rows_per_cta - 1) / rows_per_cta + batch;
}

template <int kRows>
KVCORE_HD PrefillRowBlock prefill_row_block(const PagedAttentionParams& p, int x) {
  const int n_blocks = (p.n_rows + kRows - 1) / kRows;
  PrefillRowBlock rb;
  if (x < n_blocks) {
    rb.row = x * kRows;
    rb.b = attention_row_seq(p, rb.row);
    const int left = p.maybe_qo_indptr[rb.b + 1] - rb.row;
    rb.n_r = left < kRows ? left : kRows;
  } else {
    rb.b = x - n_blocks;
    if (rb.b >= p.batch) return rb;
    const int first = p.maybe_qo_indptr[rb.b], last = p.maybe_qo_indptr[rb.b + 1];
    const int boundary = (first / kRows + 1) * kRows;
    rb.row = first;
    if (first % kRows != 0) rb.n_r = (boundary < last ? boundary : last) - first;
  }
  return rb;
}

}  // namespace kvcore::ops
