// The benches' correctness gate for stored keys: a K row read back from a cache against the
// float64 rotation of the f16 source row it was stored from (a wrong kernel fails it, rounding
// of the pool format does not).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"

namespace kvcore::cli {

// max_d |rot(src)[d] - stored[d]| / max_d |rot(src)[d]|, where rot rotates the `dim` f16 values
// at `src` in float64 to `position` by table `t` (its attention factor included).
inline double rotated_row_error(const uint16_t* src, const float* stored, int32_t dim, const math::RopeTable& t,
                                int64_t position) {
  std::vector<double> row(static_cast<size_t>(dim));
  for (int32_t d = 0; d < dim; ++d) row[d] = to_f32(f16{src[d]});
  for (int32_t i = 0; i < t.layout.n_pairs(); ++i) {
    const double a = static_cast<double>(position) * t.freq[i];
    const double x0 = row[t.layout.dim0(i)], x1 = row[t.layout.dim1(i)];
    row[t.layout.dim0(i)] = (x0 * std::cos(a) - x1 * std::sin(a)) * t.attention_factor;
    row[t.layout.dim1(i)] = (x0 * std::sin(a) + x1 * std::cos(a)) * t.attention_factor;
  }
  double rowmax = 0, err = 0;
  for (int32_t d = 0; d < dim; ++d) {
    rowmax = std::max(rowmax, std::abs(row[d]));
    err = std::max(err, std::abs(row[d] - stored[d]));
  }
  return err / rowmax;
}

}  // namespace kvcore::cli
