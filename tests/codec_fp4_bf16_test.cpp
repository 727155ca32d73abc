// E2M1 codes times UE8M0 block scales as bf16 pairs (kvcore/math/fp4_bf16.hpp) against the f32
// product rounded to bf16, for every 4 codes and every scale byte; and byte_perm's host emulation.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "fp4_bf16_reference.hpp"
#include "kvcore/math/fp4_bf16.hpp"

using namespace kvcore::math;

using fp4_bf16_test::ref_table;

TEST(CodecFp4Bf16, BytePermFollowsPtx) {
  const uint32_t a = 0x83027100u, b = 0xf7e6d5c4u;  // bytes 0..7: 00 71 02 83 c4 d5 e6 f7
  EXPECT_EQ(byte_perm(a, b, 0x3210u), a);
  EXPECT_EQ(byte_perm(a, b, 0x7654u), b);
  EXPECT_EQ(byte_perm(a, b, 0x0527u), 0x00d502f7u);
  EXPECT_EQ(byte_perm(a, b, 0xffff0527u), 0x00d502f7u) << "the upper 16 bits of the selector are ignored";
  // sign mode: the selected byte's top bit replicated
  EXPECT_EQ(byte_perm(a, b, 0x89abu), 0x000000ffu);
  EXPECT_EQ(byte_perm(a, b, 0xcdefu), 0xffffffffu);
  EXPECT_EQ(byte_perm(a, b, 0x8c1bu), 0x00ff71ffu);
}

TEST(CodecFp4Bf16, ScalePairOfEveryByte) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t top = float_bits(ue8m0_decode(static_cast<uint8_t>(b))) >> 16;  // exact: its low half is zero
    for (int j = 0; j < 4; ++j) {
      const uint32_t others = 0x5a5a5a5au & ~(0xffu << (8 * j));  // the other blocks' bytes must not matter
      EXPECT_EQ(ue8m0_bf16x2(others | (b << (8 * j)), j), top | (top << 16)) << "byte " << b << " block " << j;
    }
  }
}

// Every 16-bit t (4 codes) times every scale byte: 2^24 cases (OpenMP).
TEST(CodecFp4Bf16, EveryFourCodesTimesEveryScale) {
  const std::vector<uint16_t> ref = ref_table();
  long long bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(dynamic)
  for (int b = 0; b < 256; ++b) {
    const uint32_t s = ue8m0_bf16x2(static_cast<uint32_t>(b), 0);
    const uint16_t* r = ref.data() + b * 16;
    for (uint32_t t = 0; t < 65536; ++t) {
      uint32_t p01, p23;
      e2m1x4_scaled_bf16(t | (t * 0x9e370000u), s, p01, p23);  // the upper 16 bits are ignored: garbage there
      const uint32_t w01 = r[t & 0xfu] | (uint32_t{r[(t >> 4) & 0xfu]} << 16);
      const uint32_t w23 = r[(t >> 8) & 0xfu] | (uint32_t{r[t >> 12]} << 16);
      if (p01 != w01 || p23 != w23) {
        if (bad < 4) std::printf("  b 0x%02x t 0x%04x: 0x%08x 0x%08x, want 0x%08x 0x%08x\n", b, t, p01, p23, w01, w23);
        ++bad;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// The unscaled decode: every code its own value, in every position.
TEST(CodecFp4Bf16, UnscaledCodesAreTheirValues) {
  for (uint32_t t = 0; t < 65536; ++t) {
    uint32_t p01, p23;
    e2m1x4_bf16(t, p01, p23);
    const uint32_t c[4] = {t & 0xfu, (t >> 4) & 0xfu, (t >> 8) & 0xfu, t >> 12};
    uint32_t want[4];
    for (int i = 0; i < 4; ++i) want[i] = f32_to_bf16_bits(e2m1_decode(static_cast<uint8_t>(c[i])));
    ASSERT_EQ(p01, want[0] | (want[1] << 16)) << t;
    ASSERT_EQ(p23, want[2] | (want[3] << 16)) << t;
  }
}
