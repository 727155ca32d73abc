// When FP8 decode runs one fat CTA (kFatWarps warps) an SM instead of 4-warp CTAs, and the split
// count the automatic choice takes for it: plain host math, so a CPU test checks the rule at the
// benchmark shapes and that the split choice and the launch agree. A fat CTA wins where it owns
// its SM for a long time (the warps share their tiles and finish together) and loses where its
// start-up is not hidden behind other CTAs of its SM (short contexts, or more CTAs than one wave;
// the A/B timings are in bench/results).
#pragma once
#include <algorithm>
#include <cstdint>

namespace kvcore::ops {

constexpr int kFatWarps = 16;
constexpr int64_t kFatMinCells = 2048;    // cells a fat CTA needs at least (8 tiles a warp)
constexpr int64_t kFatWaveCells = 65536;  // cells a fat CTA needs to run in more than one wave

// The shapes built fat: FP8 pages, no rope on read, at most 8 heads a CTA (8 query columns).
inline bool fat_decode_shape(bool fp8, bool rope_on_read, int heads_per_cta) {
  return fp8 && !rope_on_read && heads_per_cta <= 8;
}

// A decode launch of `ctas` CTAs, `splits` splits over sequences of at most max_seq_cells cells
// (0: unknown) on `sms` SMs: fat when each CTA gets >= kFatMinCells cells and the grid is one
// wave, or each CTA gets >= kFatWaveCells (a wave's start-up is then noise).
inline bool fat_decode_grid(int64_t ctas, int64_t sms, int64_t max_seq_cells, int64_t splits) {
  if (max_seq_cells <= 0 || splits <= 0) return false;
  const int64_t cells = max_seq_cells / splits;
  return cells >= kFatMinCells && (ctas <= sms || cells >= kFatWaveCells);
}

// The automatic split count for fat CTAs, `base` CTAs a split (rows x kv heads x head chunks):
// one CTA an SM in one wave, at most s_max splits; 0 where fat CTAs do not serve (the 4-warp
// planning applies, and its larger split counts keep the launch at 4-warp CTAs).
inline int64_t fat_decode_splits(int64_t base, int64_t sms, int64_t max_seq_cells, int64_t s_max) {
  if (base < 1 || base > sms) return 0;
  const int64_t s = std::clamp<int64_t>(sms / base, 1, std::max<int64_t>(s_max, 1));
  return fat_decode_grid(base * s, sms, max_seq_cells, s) ? s : 0;
}

}  // namespace kvcore::ops
