// FP8 E4M3 codec and UE8M0 scales (kvcore/math/fp8.hpp, fp8_block.hpp) against
// seed 002's binary search (bench/baselines/seed_fp8_replica.hpp) and exact arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "bench/baselines/seed_fp8_replica.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/fp8_block.hpp"

using namespace kvcore;
using namespace kvcore::math;

namespace {

uint32_t bits(float f) { return float_bits(f); }
float up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float down(float x) { return std::nextafter(x, -std::numeric_limits<float>::infinity()); }

float ours_codec(float x) { return e4m3_decode(e4m3_encode(x)); }
float seed_codec(float x) { return codec_seed::e4m3fn_dequant(codec_seed::clamp448(x)); }

// Bit-identical, except that the seed turns -0.0 into +0.0 (its sign comes from x < 0);
// kvcore keeps the sign of zero like the hardware conversion (code 0x80).
::testing::AssertionResult codec_agrees(float x) {
  const float o = ours_codec(x), s = seed_codec(x);
  if (bits(o) == bits(s)) return ::testing::AssertionSuccess();
  if (bits(x) == 0x80000000u && bits(o) == 0x80000000u && bits(s) == 0u) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "x=" << x << " (0x" << std::hex << bits(x) << ") ours=" << o << " (0x"
                                       << bits(o) << ") seed=" << s << " (0x" << bits(s) << ")";
}

// The exact UE8M0 exponent: the smallest k with 448 * 2^k >= max(amax, 1e-4f), in long double (exact here).
int exact_scale_exponent(float amax) {
  const long double a = std::fmax(amax, 1.0e-4f);
  int k = -200;
  while (448.0L * std::ldexp(1.0L, k) < a) ++k;
  return k;
}

std::vector<float> boundary_set() {
  std::vector<float> xs;
  auto add = [&](float x) {
    for (float y : {x, up(x), down(x)}) {
      xs.push_back(y);
      xs.push_back(-y);
    }
  };
  for (int c = 0; c < 0x7f; ++c) {
    const float v = codec_seed::e4m3fn_value(c);
    add(v);
    if (c < 0x7e) add(0.5f * (v + codec_seed::e4m3fn_value(c + 1)));  // midpoints are exact in f32
  }
  // every float in [448, 465]: the saturation band (464 is the midpoint to the next binade) and a bit beyond
  for (float x = 448.0f; x <= 465.0f; x = up(x)) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  // f32 subnormals and the region below E4M3's smallest subnormal (2^-9)
  for (uint32_t u : {1u, 2u, 3u, 0x7fffffu, 0x800000u, 0x3a800000u /*2^-10*/, 0x3b000000u /*2^-9*/}) add(bits_float(u));
  add(std::numeric_limits<float>::max());
  add(1.0e30f);
  xs.push_back(0.0f);
  xs.push_back(-0.0f);
  return xs;
}

}  // namespace

TEST(CodecFp8, DecodeEveryCodeMatchesTheSeedTable) {
  for (int c = 0; c < 256; ++c) {
    const float d = e4m3_decode(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(d)) << c;
      continue;
    }
    const float mag = codec_seed::e4m3fn_value(c & 0x7f);
    EXPECT_EQ(bits(d), bits((c & 0x80) ? -mag : mag)) << "code " << c;
    EXPECT_EQ(e4m3_encode(d), c) << "encode(decode(c)) == c for every finite code";
  }
  EXPECT_EQ(e4m3_decode(0x7e), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(e4m3_decode(0x08), 0.015625f);     // 2^-6, the smallest normal
}

TEST(CodecFp8, EncodeMatchesSeedOnEveryBoundary) {
  const auto xs = boundary_set();
  EXPECT_GT(xs.size(), 1000000u);
  size_t failures = 0;
  for (float x : xs)
    if (!codec_agrees(x) && ++failures < 10) ADD_FAILURE() << codec_agrees(x).message();
  EXPECT_EQ(failures, 0u);
}

TEST(CodecFp8, RoundValueEqualsDecodeOfEncodeOnEveryBoundary) {
  for (float x : boundary_set()) {
    const float fast = e4m3_round_value(x), ref = e4m3_decode(e4m3_encode(e4m3_scaled(x, 1.0f)));
    ASSERT_EQ(bits(fast), bits(ref)) << x;
    ASSERT_EQ(e4m3_encode_clamped(x), e4m3_encode(e4m3_scaled(x, 1.0f))) << x;
  }
  EXPECT_TRUE(std::isnan(e4m3_round_value(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(e4m3_round_value(std::numeric_limits<float>::infinity()), 448.0f);
  EXPECT_EQ(e4m3_round_value(-std::numeric_limits<float>::infinity()), -448.0f);
  EXPECT_EQ(e4m3_encode_clamped(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(e4m3_encode_clamped(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(e4m3_encode_clamped(-std::numeric_limits<float>::infinity()), 0xfe);
}

TEST(CodecFp8, TiesGoToTheEvenCode) {
  // 1 + 1/16 lies between codes 0x38 (1.0) and 0x39 (1.125): even code 0x38 wins.
  EXPECT_EQ(e4m3_encode(1.0625f), 0x38);
  EXPECT_EQ(e4m3_encode(up(1.0625f)), 0x39);
  // 1.1875 between 0x39 (1.125) and 0x3a (1.25): even 0x3a.
  EXPECT_EQ(e4m3_encode(1.1875f), 0x3a);
  // subnormal tie 1.5 * 2^-9 between 0x01 and 0x02: 0x02; 2^-10 between 0 and 0x01: 0.
  EXPECT_EQ(e4m3_encode(1.5f * 0.001953125f), 0x02);
  EXPECT_EQ(e4m3_encode(0.0009765625f), 0x00);
  EXPECT_EQ(e4m3_encode(up(0.0009765625f)), 0x01);
  // the subnormal/normal seam: 0.0146484375 = midpoint of 7*2^-9 (0x07) and 2^-6 (0x08): even 0x08
  EXPECT_EQ(e4m3_encode(0.0146484375f), 0x08);
}

TEST(CodecFp8, SaturationSignedZeroNanAndInfinity) {
  EXPECT_EQ(e4m3_encode(448.0f), 0x7e);
  EXPECT_EQ(e4m3_encode(463.99f), 0x7e);
  EXPECT_EQ(e4m3_encode(464.0f), 0x7e);  // would round to 512 (no such finite code): saturates
  EXPECT_EQ(e4m3_encode(1e30f), 0x7e);
  EXPECT_EQ(e4m3_encode(-1e30f), 0xfe);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(e4m3_encode(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(e4m3_encode(-std::numeric_limits<float>::quiet_NaN()), 0x7f);  // NaN loses its sign
  EXPECT_EQ(e4m3_encode(0.0f), 0x00);
  EXPECT_EQ(e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(e4m3_encode(-1e-10f), 0x80);
  // the seed maps -0.0 to +0.0 and tiny negatives to -0.0
  EXPECT_EQ(bits(seed_codec(-0.0f)), 0u);
  EXPECT_EQ(bits(seed_codec(-1e-10f)), 0x80000000u);
}

TEST(CodecFp8, EncodeMatchesSeedOnRandomInputs) {
  std::mt19937 rng(20261202);
  size_t failures = 0;
  for (int i = 0; i < 300000; ++i) {
    float x = bits_float(static_cast<uint32_t>(rng()));
    if (!std::isfinite(x)) continue;
    if (!codec_agrees(x) && ++failures < 10) ADD_FAILURE() << codec_agrees(x).message();
  }
  std::uniform_real_distribution<float> u(-500.0f, 500.0f);
  for (int i = 0; i < 300000; ++i) {
    const float x = u(rng) * std::ldexp(1.0f, -static_cast<int>(rng() % 24));
    if (!codec_agrees(x) && ++failures < 10) ADD_FAILURE() << codec_agrees(x).message();
  }
  EXPECT_EQ(failures, 0u);
}

TEST(CodecFp8, ScaleExponentIsExact) {
  std::vector<float> amaxes;
  for (int j = -40; j <= 119; ++j) {
    const float b = std::ldexp(448.0f, j);
    for (float a : {b, up(b), down(b), up(up(b)), 0.5f * b, 0.75f * b}) amaxes.push_back(a);
  }
  for (float a : {1.0e-4f, up(1.0e-4f), down(1.0e-4f), 0.0f, 1e-30f, std::numeric_limits<float>::max(), 1.0f}) amaxes.push_back(a);
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const float a = std::fabs(bits_float(static_cast<uint32_t>(rng())));
    if (std::isfinite(a)) amaxes.push_back(a);
  }
  for (float a : amaxes) {
    ASSERT_EQ(e4m3_scale_exponent(a), exact_scale_exponent(a)) << "amax " << a;
    // the scale byte decodes to 2^k
    const int k = e4m3_scale_exponent(a);
    ASSERT_EQ(ue8m0_decode(ue8m0_encode(k)), std::ldexp(1.0f, k));
  }
  EXPECT_EQ(e4m3_scale_exponent(448.0f), 0);
  EXPECT_EQ(e4m3_scale_exponent(up(448.0f)), 1);
  EXPECT_EQ(e4m3_scale_exponent(0.0f), -22);  // the 1e-4 floor: 2^-22 >= 1e-4 / 448 > 2^-23
}

// Seed 002 computes the scale as exp2(ceil(log2(amax / 448))) in float. Just above 448 * 2^k
// the quotient is 2^k (1 + 2^-23), whose float log2 rounds down to k for most k, so the seed
// picks 2^k where the exact rule (and this library) picks 2^(k+1). The seed then clamps amax
// itself to 448 * 2^k (an error below one ulp). The E4M3 grid is a floating-point grid, so a
// scale twice as large changes nothing for values in its normal range; it only differs for the
// block's tiny values (below 2^-5 of the scale), which the exact rule rounds on a coarser
// subnormal step. kvcore follows the exact rule of the spec.
TEST(CodecFp8, SeedFloatLog2ScaleIsWrongJustAbove448TimesPowersOfTwo) {
  int wrong = 0;
  for (int k = -30; k <= 100; ++k) {
    const float amax = up(std::ldexp(448.0f, k));
    const float seed_scale = codec_seed::block_scale(amax);
    const float exact_scale = std::ldexp(1.0f, exact_scale_exponent(amax));
    EXPECT_EQ(std::ldexp(1.0f, e4m3_scale_exponent(amax)), exact_scale);
    if (seed_scale != exact_scale) {
      ++wrong;
      EXPECT_EQ(seed_scale, 0.5f * exact_scale) << "k=" << k;
    }
  }
  EXPECT_GT(wrong, 100) << "the float formula fails at most of these boundaries";
  // A concrete block: amax = 14336 (1 + 2^-23) = 448 * 32 (1 + 2^-23) and a small value 0.55.
  const float amax = up(14336.0f);
  EXPECT_EQ(codec_seed::block_scale(amax), 32.0f);  // seed: 2^5
  EXPECT_EQ(e4m3_scale_exponent(amax), 6);          // exact: 2^6
  float seed[2] = {amax, 0.55f}, ours[2] = {amax, 0.55f};
  codec_seed::block_round_trip(seed, 2);
  fp8_block_round_trip(ours, 1, ours, 1, 2);
  EXPECT_EQ(seed[0], 14336.0f);  // clamped to 448 * 32
  EXPECT_EQ(ours[0], 14336.0f);  // 224 * 64
  EXPECT_EQ(seed[1], 0.5625f);   // 0.55 / 32 = 0.0171875, normal: step 2^-9 -> 9 * 2^-9 * 32
  EXPECT_EQ(ours[1], 0.5f);      // 0.55 / 64 = 0.00859375, subnormal: step 2^-9 -> 4 * 2^-9 * 64
  int differ = 0, large_differ = 0;
  for (float v = 0.001f; v < 14336.0f; v *= 1.001f) {
    float sb[2] = {amax, v}, ob[2] = {amax, v};
    codec_seed::block_round_trip(sb, 2);
    fp8_block_round_trip(ob, 1, ob, 1, 2);
    if (sb[1] != ob[1]) ++differ;
    if (sb[1] != ob[1] && v >= 2.0f) ++large_differ;  // 2 = 2^-5 * 64
  }
  EXPECT_GT(differ, 0);
  EXPECT_EQ(large_differ, 0) << "only values far below amax see the difference";
}

TEST(CodecFp8, BlockRoundTripEqualsSeedWithTheExactScale) {
  std::mt19937 rng(99);
  std::normal_distribution<float> n(0.0f, 1.0f);
  int seed_scale_mismatches = 0;
  for (int b = 0; b < 3000; ++b) {
    const int len = 1 + static_cast<int>(rng() % 64);
    const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
    std::vector<float> v(len), ours(len), seed(len), seed_exact(len);
    for (auto& x : v) x = n(rng) * mag;
    fp8_block_round_trip(v.data(), 1, ours.data(), 1, len);
    float amax = 0;
    for (float x : v) amax = std::fmax(amax, std::fabs(x));
    const float exact = std::ldexp(1.0f, exact_scale_exponent(amax));
    for (int i = 0; i < len; ++i) seed_exact[i] = codec_seed::round_trip(v[i], exact);
    seed = v;
    codec_seed::block_round_trip(seed.data(), len);
    for (int i = 0; i < len; ++i) ASSERT_EQ(bits(ours[i]), bits(seed_exact[i])) << "block " << b << " i " << i;
    if (codec_seed::block_scale(amax) != exact) ++seed_scale_mismatches;
    else
      for (int i = 0; i < len; ++i) ASSERT_EQ(bits(ours[i]), bits(seed[i]));
    // pack/unpack equals the round trip
    std::vector<uint8_t> codes(len);
    const uint8_t sb = fp8_block_pack(v.data(), 1, len, codes.data(), 1);
    std::vector<float> un(len);
    fp8_block_unpack(codes.data(), 1, sb, len, un.data(), 1);
    for (int i = 0; i < len; ++i) ASSERT_EQ(bits(un[i]), bits(ours[i]));
  }
  EXPECT_EQ(seed_scale_mismatches, 0) << "random data essentially never lands just above 448 * 2^k";
}

TEST(CodecFp8, NanAndInfinityInABlock) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  float v[5] = {1.0f, -inf, nan, 3.0f, inf};
  float out[5];
  const int k = fp8_block_round_trip(v, 1, out, 1, 5);
  EXPECT_EQ(k, e4m3_scale_exponent(3.0f)) << "non-finite values do not set the scale";
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -448.0f * std::ldexp(1.0f, k));
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 3.0f);
  EXPECT_EQ(out[4], 448.0f * std::ldexp(1.0f, k));
  // Near FLT_MAX the decoded value times 2^k can exceed FLT_MAX: 2^128 -> inf (the seed does the same).
  const float big = std::numeric_limits<float>::max();
  float w[1] = {big}, wo[1];
  fp8_block_round_trip(w, 1, wo, 1, 1);
  EXPECT_TRUE(std::isinf(wo[0]));
  EXPECT_TRUE(std::isinf(codec_seed::round_trip(big, codec_seed::block_scale(big))));
}

TEST(CodecFp8, RowAndDsv4RowPackUnpackEqualTheRoundTrip) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> row(512), rt(512), back(512);
  for (auto& x : row) x = n(rng);
  row[5] = 1000.0f;  // one block with a large outlier
  for (int b = 0; b < 7; ++b) fp8_block_round_trip(row.data() + 64 * b, 1, rt.data() + 64 * b, 1, 64);
  uint8_t packed[584];
  std::fill(packed, packed + 584, uint8_t{0xcd});
  dsv4_row_pack(row.data(), packed);
  EXPECT_EQ(packed[583], 0);
  dsv4_row_unpack(packed, back.data());
  for (int i = 0; i < 448; ++i) ASSERT_EQ(bits(back[i]), bits(rt[i])) << i;
  for (int i = 448; i < 512; ++i) ASSERT_EQ(bits(back[i]), bits(bf16_bits_to_f32(f32_to_bf16_bits(row[i])))) << i;
  for (int b = 0; b < 7; ++b) {
    float amax = 0;
    for (int i = 0; i < 64; ++i) amax = std::fmax(amax, std::fabs(row[64 * b + i]));
    EXPECT_EQ(packed[576 + b], exact_scale_exponent(amax) + 127) << "scale byte " << b;
  }
  // generic row helpers, partial last block (n_nope 100 = 64 + 36), f16 tail of 6
  std::vector<uint8_t> codes(100), scales(2);
  std::vector<f16> tail(6);
  fp8_row_pack(row.data(), 100, 6, codes.data(), scales.data(), tail.data());
  std::vector<float> out(106), want(106);
  fp8_row_unpack(codes.data(), scales.data(), tail.data(), 100, 6, out.data());
  fp8_block_round_trip(row.data(), 1, want.data(), 1, 64);
  fp8_block_round_trip(row.data() + 64, 1, want.data() + 64, 1, 36);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(bits(out[i]), bits(want[i])) << i;
  for (int i = 100; i < 106; ++i) ASSERT_EQ(bits(out[i]), bits(f16_bits_to_f32(f32_to_f16_bits(row[i])))) << i;
}
