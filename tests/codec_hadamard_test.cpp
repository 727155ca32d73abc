// The orthonormal Walsh-Hadamard transform (kvcore/math/hadamard.hpp) against the
// float64 matrix H[i][j] = (-1)^popcount(i & j) / sqrt(N).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvcore/math/fp4_hadamard.hpp"
#include "kvcore/math/hadamard.hpp"

using namespace kvcore::math;

namespace {

template <int N>
std::vector<double> matrix_times(const std::vector<float>& x) {
  std::vector<double> y(N, 0.0);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) y[i] += ((std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0) * x[j];
  for (auto& v : y) v /= std::sqrt(static_cast<double>(N));
  return y;
}

template <int N>
void check_against_matrix(uint32_t seed, double* worst_rel) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(N);
  for (auto& v : x) v = n(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
  const auto want = matrix_times<N>(x);
  double l1 = 0;
  for (float v : x) l1 += std::fabs(v);
  std::vector<float> y = x;
  hadamard_transform<N>(y.data());
  // error bound: log2(N) rounded additions on partial sums bounded by the l1 norm, one rounded
  // multiply and the scale's own rounding: (log2 N + 2) * 2^-24 * l1 / sqrt(N)
  const double tol = (std::log2(N) + 2) * std::ldexp(1.0, -24) * l1 / std::sqrt(double(N));
  for (int i = 0; i < N; ++i) {
    ASSERT_NEAR(y[i], want[i], tol) << "N " << N << " i " << i;
    *worst_rel = std::max(*worst_rel, std::fabs(y[i] - want[i]) / (l1 / std::sqrt(double(N))));
  }
}

}  // namespace

TEST(CodecHadamard, MatchesTheFloat64Matrix) {
  double worst = 0;
  for (uint32_t s = 0; s < 20; ++s) check_against_matrix<128>(s, &worst);
  for (uint32_t s = 0; s < 5; ++s) {
    check_against_matrix<2>(s, &worst);
    check_against_matrix<16>(s, &worst);
    check_against_matrix<64>(s, &worst);
    check_against_matrix<256>(s, &worst);
  }
  std::printf("hadamard: worst abs error / (l1 norm / sqrt(N)) = %.3g (bound for N = 128: 9 * 2^-24 = %.3g)\n", worst,
              9 * std::ldexp(1.0, -24));
  EXPECT_LT(worst, 1e-6);
}

TEST(CodecHadamard, RowsAreOrthonormal) {
  // H e_j is column j of H: unit norm, and orthogonal to every other column (in float64).
  std::vector<std::vector<float>> cols(128, std::vector<float>(128, 0.0f));
  for (int j = 0; j < 128; ++j) {
    cols[j][j] = 1.0f;
    hadamard128(cols[j].data());
    for (int i = 0; i < 128; ++i) {
      const double want = ((std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0) / std::sqrt(128.0);
      ASSERT_NEAR(cols[j][i], want, 1e-8);
    }
  }
  for (int a = 0; a < 128; ++a)
    for (int b = 0; b < 128; ++b) {
      double dot = 0;
      for (int i = 0; i < 128; ++i) dot += double(cols[a][i]) * cols[b][i];
      ASSERT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-6) << a << "," << b;
    }
}

TEST(CodecHadamard, AppliedTwiceIsTheIdentityAndKeepsTheNorm) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (int t = 0; t < 200; ++t) {
    std::vector<float> x(128);
    for (auto& v : x) v = n(rng);
    std::vector<float> y = x;
    hadamard128(y.data());
    double nx = 0, ny = 0;
    for (int i = 0; i < 128; ++i) {
      nx += double(x[i]) * x[i];
      ny += double(y[i]) * y[i];
    }
    ASSERT_NEAR(std::sqrt(ny), std::sqrt(nx), 1e-6 * std::sqrt(nx));
    hadamard128(y.data());
    for (int i = 0; i < 128; ++i) ASSERT_NEAR(y[i], x[i], 2e-6 * std::sqrt(nx)) << t << "," << i;
  }
}

TEST(CodecHadamard, ScaleConstants) {
  EXPECT_EQ(hadamard_scale<128>(), static_cast<float>(1.0 / std::sqrt(128.0)));
  EXPECT_EQ(hadamard_scale<2>(), static_cast<float>(1.0 / std::sqrt(2.0)));
  EXPECT_EQ(hadamard_scale<8>(), static_cast<float>(1.0 / std::sqrt(8.0)));
  EXPECT_EQ(hadamard_scale<32>(), static_cast<float>(1.0 / std::sqrt(32.0)));
  EXPECT_EQ(hadamard_scale<512>(), static_cast<float>(1.0 / std::sqrt(512.0)));
}

TEST(CodecHadamard, Fp4IndexerRowCodec) {
  std::mt19937 rng(13);
  std::normal_distribution<float> n(0.0f, 1.0f);
  double err2 = 0, ref2 = 0;
  for (int t = 0; t < 200; ++t) {
    std::vector<float> x(128);
    for (auto& v : x) v = n(rng) * (rng() % 16 == 0 ? 10.0f : 1.0f);
    std::vector<float> want = x, got = x;
    hadamard128(want.data());
    const std::vector<float> rotated = want;
    for (int b = 0; b < 4; ++b) fp4_block_round_trip(want.data() + 32 * b, want.data() + 32 * b, 32);
    fp4_hadamard_round_trip128(got.data());
    for (int i = 0; i < 128; ++i) {
      ASSERT_EQ(float_bits(got[i]), float_bits(want[i]));
      err2 += double(got[i] - rotated[i]) * (got[i] - rotated[i]);
      ref2 += double(rotated[i]) * rotated[i];
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("fp4 after hadamard: relative RMS error %.3f on rows with outliers\n", rel);
  EXPECT_LT(rel, 0.2);  // E2M1 has one mantissa bit
  EXPECT_GT(rel, 0.02);
}
