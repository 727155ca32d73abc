// The CUDA prefill kernel's CTA -> rows mapping (src/ops/prefill_row_blocks.hpp), checked on the
// host: over random batches (empty sequences, one-row ones, starts on and between row blocks)
// the CTAs cover every row exactly once, never cross a sequence, never take more than a block.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ops/prefill_row_blocks.hpp"

namespace kvcore::ops {
namespace {

template <int kRows>
void check_cover(const std::vector<int32_t>& lens) {
  std::vector<int32_t> qo{0};
  for (int32_t n : lens) qo.push_back(qo.back() + n);
  PagedAttentionParams p{};
  p.maybe_qo_indptr = qo.data();
  p.batch = static_cast<int32_t>(lens.size());
  p.n_rows = qo.back();
  std::vector<int> seen(p.n_rows, 0);
  const int64_t ctas = prefill_row_block_ctas(p.n_rows, p.batch, kRows);
  for (int x = 0; x < ctas; ++x) {
    const PrefillRowBlock rb = prefill_row_block<kRows>(p, x);
    if (rb.n_r <= 0) continue;
    ASSERT_LE(rb.n_r, kRows) << "cta " << x;
    ASSERT_GE(rb.b, 0);
    ASSERT_LT(rb.b, p.batch);
    ASSERT_GE(rb.row, qo[rb.b]) << "cta " << x << " starts before its sequence";
    ASSERT_LE(rb.row + rb.n_r, qo[rb.b + 1]) << "cta " << x << " crosses into the next sequence";
    for (int r = rb.row; r < rb.row + rb.n_r; ++r) ++seen[r];
  }
  for (int r = 0; r < p.n_rows; ++r) ASSERT_EQ(seen[r], 1) << "row " << r << " of " << p.n_rows;
}

TEST(PrefillRowBlocks, EveryRowOnceInOneSequence) {
  check_cover<32>({0, 32, 33, 64, 1, 31});
  check_cover<32>({300, 290, 1});
  check_cover<32>({0});
  check_cover<32>({0, 0, 5, 0});
  check_cover<16>({17, 15, 16, 0, 1});
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> lens(1 + rng() % 12);
    for (auto& n : lens) n = rng() % 4 == 0 ? 0 : static_cast<int32_t>(rng() % 100);
    check_cover<32>(lens);
    check_cover<16>(lens);
  }
}

TEST(PrefillRowBlocks, AtMostOneExtraCtaPerSequence) {
  // Aligned sequences need no extra CTAs: they are the plain row blocks.
  std::vector<int32_t> qo{0, 64, 128};
  PagedAttentionParams p{};
  p.maybe_qo_indptr = qo.data();
  p.batch = 2;
  p.n_rows = 128;
  EXPECT_EQ(prefill_row_block_ctas(p.n_rows, p.batch, 32), 6);
  for (int x = 4; x < 6; ++x) EXPECT_LE(prefill_row_block<32>(p, x).n_r, 0) << "cta " << x;
  for (int x = 0; x < 4; ++x) EXPECT_EQ(prefill_row_block<32>(p, x).n_r, 32) << "cta " << x;
}

}  // namespace
}  // namespace kvcore::ops
