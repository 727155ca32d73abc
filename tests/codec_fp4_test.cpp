// FP4 E2M1 codec and its power-of-two block scales (kvcore/math/fp4.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvcore/math/fp4.hpp"

using namespace kvcore::math;

namespace {

const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Nearest of the 8 magnitudes, ties to the even code, saturating; in double.
uint8_t ref_encode(float x) {
  if (std::isnan(x)) return 0x7;
  const double a = std::fabs(static_cast<double>(x));
  int best = a >= 6.0 ? 7 : 0;
  for (int c = 1; c < 8 && a < 6.0; ++c) {
    const double dc = std::fabs(a - kMag[c]), db = std::fabs(a - kMag[best]);
    if (dc < db || (dc == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x8 : 0) | best);
}

int exact_k(float amax) {  // smallest k with 6 * 2^k >= max(amax, 1e-4f)
  const long double a = std::fmax(amax, 1.0e-4f);
  int k = -200;
  while (6.0L * std::ldexp(1.0L, k) < a) ++k;
  return k;
}

float up(float x) { return std::nextafter(x, INFINITY); }
float down(float x) { return std::nextafter(x, -INFINITY); }

}  // namespace

TEST(CodecFp4, DecodeEveryCode) {
  for (int c = 0; c < 16; ++c) {
    const float want = (c & 8) ? -kMag[c & 7] : kMag[c & 7];
    EXPECT_EQ(float_bits(e2m1_decode(static_cast<uint8_t>(c))), float_bits(want)) << c;
    EXPECT_EQ(e2m1_encode(want), c) << "encode(decode(c)) == c";
  }
}

TEST(CodecFp4, EncodeOnEveryBoundaryAndAtRandom) {
  std::vector<float> xs;
  for (int c = 0; c < 8; ++c) {
    const float v = kMag[c];
    const float mid = c < 7 ? 0.5f * (v + kMag[c + 1]) : 7.0f;
    for (float x : {v, up(v), down(v), mid, up(mid), down(mid)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float x : {1e-45f, 1e30f, std::numeric_limits<float>::max()}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 200000; ++i) xs.push_back(u(rng));
  for (float x : xs) ASSERT_EQ(e2m1_encode(x), ref_encode(x)) << x;
  // ties to even: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0
  EXPECT_EQ(e2m1_decode(e2m1_encode(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(up(5.0f))), 6.0f);
}

TEST(CodecFp4, NonFiniteInputs) {
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::infinity()), 0x7);
  EXPECT_EQ(e2m1_encode(-std::numeric_limits<float>::infinity()), 0xf);
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::quiet_NaN()), 0x7) << "NaN -> +6, as CUDA's __nv_cvt_float_to_fp4";
  EXPECT_EQ(e2m1_encode(-std::numeric_limits<float>::quiet_NaN()), 0x7);
  EXPECT_EQ(e2m1_encode(-0.0f), 0x8);
}

TEST(CodecFp4, ScaleExponentIsExact) {
  std::vector<float> as;
  for (int j = -20; j <= 125; ++j) {
    const float b = std::ldexp(6.0f, j);
    for (float a : {b, up(b), down(b), 0.7f * b}) as.push_back(a);
  }
  for (float a : {0.0f, 1e-4f, up(1e-4f), down(1e-4f), std::numeric_limits<float>::max()}) as.push_back(a);
  for (float a : as) ASSERT_EQ(e2m1_scale_exponent(a), exact_k(a)) << a;
  EXPECT_EQ(e2m1_scale_exponent(6.0f), 0);
  EXPECT_EQ(e2m1_scale_exponent(up(6.0f)), 1);
}

TEST(CodecFp4, BlockRoundTrip) {
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int b = 0; b < 2000; ++b) {
    const int len = 1 + static_cast<int>(rng() % 32);
    const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    std::vector<float> v(len), out(len);
    for (auto& x : v) x = n(rng) * mag;
    const int k = fp4_block_round_trip(v.data(), out.data(), len);
    float amax = 0;
    for (float x : v) amax = std::fmax(amax, std::fabs(x));
    ASSERT_EQ(k, exact_k(amax));
    const double scale = std::ldexp(1.0, k);
    for (int i = 0; i < len; ++i) {
      const double want = e2m1_decode(ref_encode(static_cast<float>(v[i] / scale))) * scale;
      ASSERT_EQ(static_cast<double>(out[i]), want) << b << "," << i;
      ASSERT_LE(std::fabs(out[i]), 6.0 * scale);
    }
  }
  // in place, with inf and NaN (they do not set the scale)
  float w[4] = {1.0f, -INFINITY, NAN, 2.9f};
  const int k = fp4_block_round_trip(w, w, 4);
  EXPECT_EQ(k, exact_k(2.9f));
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], -6.0f * std::ldexp(1.0f, k));
  EXPECT_EQ(w[2], 6.0f * std::ldexp(1.0f, k)) << "NaN -> +6 * scale";
  EXPECT_EQ(w[3], 3.0f);
}
