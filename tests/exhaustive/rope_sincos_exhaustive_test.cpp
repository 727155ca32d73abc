// Every f32 angle with |a| < 2^26 (every angle a context of 64M positions produces):
// math::sincos_f32 (the sin/cos both RoPE backends use) is within half an f32 ulp of
// libm's double sin/cos plus a hair (the double evaluation's own error), and it is exactly
// odd/even in a. Long sweep: label exhaustive.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "kvcore/math/rope.hpp"

namespace {

// |got - want| in units of the f32 ulp at |want| (2^-149 floor for tiny values).
double ulps(float got, double want) {
  const double m = std::abs(want);
  int e = -126;
  if (m >= std::ldexp(1.0, -126)) std::frexp(m, &e), e -= 1;
  return std::abs(double(got) - want) / std::ldexp(1.0, std::max(e, -126) - 23);
}

}  // namespace

TEST(RopeSinCosExhaustive, EveryAngleBelow2To26) {
  const uint32_t end = 0x4C800000u;  // 2^26
  double worst_s = 0, worst_c = 0;
  int64_t asym = 0;
#pragma omp parallel for schedule(dynamic, 1 << 16) reduction(max : worst_s, worst_c) reduction(+ : asym)
  for (int64_t b = 0; b < int64_t(end); ++b) {
    const float a = kvcore::math::bits_float(static_cast<uint32_t>(b));
    float s, c, sn, cn;
    kvcore::math::sincos_f32(a, &s, &c);
    kvcore::math::sincos_f32(-a, &sn, &cn);
    asym += (sn != -s || cn != c);
    worst_s = std::max(worst_s, ulps(s, std::sin(double(a))));
    worst_c = std::max(worst_c, ulps(c, std::cos(double(a))));
  }
  std::printf("sincos_f32 over %u angles (and their negatives): worst sin %.6f ulp, worst cos %.6f ulp, %lld asymmetric\n",
              end, worst_s, worst_c, (long long)asym);
  EXPECT_LE(worst_s, 0.5001);
  EXPECT_LE(worst_c, 0.5001);
  EXPECT_EQ(asym, 0);
}
