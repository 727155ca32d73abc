// The device and the host evaluate math::sincos_f32 to the same bits, for every f32 angle
// with |a| < 2^26 (positives swept; the function is exactly odd/even, which the exhaustive
// CPU test checks) plus special values. This is what makes rope_apply bit-identical on
// the CPU and CUDA backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kvcore/math/rope.hpp"
#include "kvcore/runtime.hpp"

void rope_test_device_sincos(uint32_t first_bits, uint32_t n, float* s, float* c);  // rope_sincos_kernel.cu

TEST(RopeCudaSinCos, BitIdenticalToHost) {
  if (kvcore::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  constexpr uint32_t kChunk = 1u << 25;
  constexpr uint32_t kEnd = 0x4C800000u;  // 2^26
  std::vector<float> hs(kChunk), hc(kChunk);
  int64_t mismatches = 0;
  uint32_t first_bad = 0;
  for (uint32_t b0 = 0; b0 < kEnd; b0 += kChunk) {
    const uint32_t n = std::min(kChunk, kEnd - b0);
    rope_test_device_sincos(b0, n, hs.data(), hc.data());
    int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
    for (int64_t i = 0; i < int64_t(n); ++i) {
      float s, c;
      kvcore::math::sincos_f32(kvcore::math::bits_float(b0 + uint32_t(i)), &s, &c);
      bad += kvcore::math::float_bits(s) != kvcore::math::float_bits(hs[i]) ||
             kvcore::math::float_bits(c) != kvcore::math::float_bits(hc[i]);
    }
    if (bad && !mismatches) first_bad = b0;
    mismatches += bad;
  }
  const float specials[] = {-0.0f, 268435456.0f, 3e8f, -1e9f, 3.4e38f, INFINITY, -INFINITY, NAN};
  for (float a : specials) {
    float gs, gc, s, c;
    rope_test_device_sincos(kvcore::math::float_bits(a), 1, &gs, &gc);
    kvcore::math::sincos_f32(a, &s, &c);
    if (std::isnan(s)) {
      EXPECT_TRUE(std::isnan(gs) && std::isnan(gc)) << a;
    } else {
      EXPECT_EQ(kvcore::math::float_bits(s), kvcore::math::float_bits(gs)) << a;
      EXPECT_EQ(kvcore::math::float_bits(c), kvcore::math::float_bits(gc)) << a;
    }
  }
  std::printf("sincos_f32 device vs host: %lld of %u angles differ\n", (long long)mismatches, kEnd);
  EXPECT_EQ(mismatches, 0) << "first differing chunk starts at bits 0x" << std::hex << first_bad;
}
