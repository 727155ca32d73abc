// When FP8 decode runs fat CTAs (src/ops/decode_fat_ctas.hpp), checked on the host: the decision
// at the benchmark shapes the GPU A/B runs measured (Llama-3-8B: 8 kv heads, group 4, an H200's
// 132 SMs), and that the split count planned for fat CTAs is one the launch then runs fat.
#include <gtest/gtest.h>

#include <random>

#include "ops/attention_params.hpp"
#include "ops/decode_fat_ctas.hpp"

namespace kvcore::ops {
namespace {

constexpr int64_t kSms = 132, kKvHeads = 8;

// The fat split count at (batch, context), 0 when 4-warp CTAs are planned.
int64_t planned(int64_t batch, int64_t ctx) { return fat_decode_splits(batch * kKvHeads, kSms, ctx, attention_split_limit(ctx)); }

TEST(DecodeFatCtas, BenchmarkShapes) {
  // Fat, one wave: batch 1 from 32k (16 splits of >= 2048 cells), batch 16 from 4k (one split).
  EXPECT_EQ(planned(1, 32768), 16);
  EXPECT_EQ(planned(1, 131072), 16);
  EXPECT_EQ(planned(16, 4096), 1);
  EXPECT_EQ(planned(16, 8192), 1);
  EXPECT_EQ(planned(16, 131072), 1);
  // 4-warp CTAs: too few cells a CTA (batch 1 at 8k / 16k: 512 / 1024; batch 16 at 1k).
  EXPECT_EQ(planned(1, 8192), 0);
  EXPECT_EQ(planned(1, 16384), 0);
  EXPECT_EQ(planned(16, 1024), 0);
  // Batch 64: 512 CTAs a split, more than one wave: planned for 4-warp CTAs (one split each) ...
  EXPECT_EQ(planned(64, 8192), 0);
  // ... and the launch runs them fat only when each CTA reads >= 65536 cells (measured: 128k
  // -3 to -8%, 8k +3%, 1k +50%).
  EXPECT_TRUE(fat_decode_grid(512, kSms, 131072, 1));
  EXPECT_FALSE(fat_decode_grid(512, kSms, 32768, 1));
  EXPECT_FALSE(fat_decode_grid(512, kSms, 8192, 1));
  EXPECT_FALSE(fat_decode_grid(512, kSms, 1024, 1));
  // Unknown lengths (max_seq_cells 0, as with check_tables off and no hint): never fat.
  EXPECT_FALSE(fat_decode_grid(8, kSms, 0, 1));
  EXPECT_EQ(fat_decode_splits(8, kSms, 0, 1024), 0);
}

TEST(DecodeFatCtas, ShapesBuiltFat) {
  EXPECT_TRUE(fat_decode_shape(true, false, 4));
  EXPECT_TRUE(fat_decode_shape(true, false, 8));
  EXPECT_FALSE(fat_decode_shape(true, false, 16));  // 16 query columns
  EXPECT_FALSE(fat_decode_shape(true, true, 4));    // rope on read
  EXPECT_FALSE(fat_decode_shape(false, false, 4));  // 16-bit pages
}

// Over random sizes: a planned fat split count fills at most one wave with CTAs the launch runs
// fat, no more splits than allowed; and a plan of 0 never leaves a single-wave grid the launch
// would run fat with the fat split count.
TEST(DecodeFatCtas, PlanAndLaunchAgree) {
  std::mt19937_64 rng(11);
  for (int it = 0; it < 20000; ++it) {
    const int64_t sms = 1 + static_cast<int64_t>(rng() % 200);
    const int64_t base = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t cells = static_cast<int64_t>(rng() % 300000);
    const int64_t s_max = attention_split_limit(cells);
    const int64_t s = fat_decode_splits(base, sms, cells, s_max);
    if (s > 0) {
      ASSERT_LE(s, s_max);
      ASSERT_LE(base * s, sms) << "base " << base << " sms " << sms;
      ASSERT_TRUE(fat_decode_grid(base * s, sms, cells, s));
      ASSERT_GE(cells / s, kFatMinCells);
    } else if (base <= sms) {
      const int64_t s1 = std::clamp<int64_t>(sms / base, 1, s_max);
      ASSERT_FALSE(fat_decode_grid(base * s1, sms, cells, s1)) << "base " << base << " cells " << cells;
    }
  }
}

}  // namespace
}  // namespace kvcore::ops
