// Exhaustive codec sweeps over every f32 bit pattern (OpenMP):
//   E4M3 encode+decode == seed 002's binary search for every finite input;
//   f32 -> f16 == the x86 F16C hardware conversion (or a double-precision rint reference);
//   f32 -> bf16 == an explicit-remainder integer reference (and a rint reference on a sample);
//   f16 -> f32 for all 65536 inputs; E2M1 encode == brute-force nearest value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "bench/baselines/seed_fp8_replica.hpp"
#include "kvcore/math/fp4.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/fp8_block.hpp"
#include "kvcore/math/half.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define CODEC_HAVE_F16C_CODE 1
#endif

using namespace kvcore::math;

namespace {

constexpr uint64_t kAll = uint64_t{1} << 32;

bool is_nan16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

#if CODEC_HAVE_F16C_CODE
__attribute__((target("f16c"))) uint16_t f16c_from_f32(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float f16c_to_f32(uint16_t h) { return _cvtsh_ss(h); }
bool have_f16c() { return __builtin_cpu_supports("f16c"); }
#else
uint16_t f16c_from_f32(float) { return 0; }
float f16c_to_f32(uint16_t) { return 0; }
bool have_f16c() { return false; }
#endif

// Round |x| to `sig` significant bits with quantum at least 2^min_q, in double with rint
// (round to nearest even in the default mode). Returns the rounded magnitude.
double rint_round(float x, int sig, int min_q) {
  int e;
  std::frexp(std::fabs(static_cast<double>(x)), &e);
  const int q = std::max(e - sig, min_q);
  return std::ldexp(std::nearbyint(std::ldexp(std::fabs(static_cast<double>(x)), -q)), q);
}

uint16_t ref_f16_rint(float x) {  // finite or inf x
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  if (std::isinf(x)) return sign | 0x7c00u;
  const double r = rint_round(x, 11, -24);
  if (r > 65504.0) return sign | 0x7c00u;
  if (r == 0.0) return sign;
  int e;
  const double m = std::frexp(r, &e);  // r = m 2^e, m in [0.5, 1)
  if (e - 1 >= -14) return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) | (static_cast<int>(std::ldexp(m, 11)) - 1024));
  return sign | static_cast<uint16_t>(std::ldexp(r, 24));
}

uint16_t ref_bf16_rint(float x) {  // finite or inf x
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  if (std::isinf(x)) return sign | 0x7f80u;
  const double r = rint_round(x, 8, -133);
  if (r > 3.3895313892515355e38) return sign | 0x7f80u;  // bf16 max 0x7f7f
  return sign | static_cast<uint16_t>(float_bits(static_cast<float>(r)) >> 16);
}

// bf16 by explicit comparison of the dropped half-word with one half ulp.
uint16_t ref_bf16_compare(uint32_t u) {
  uint32_t hi = u >> 16;
  const uint32_t lo = u & 0xffffu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) ++hi;
  return static_cast<uint16_t>(hi);
}

}  // namespace

// The seed's result depends on |x| and the sign only (sign * value(|x|)), so the binary search
// runs on the 2^31 non-negative patterns; each negative pattern is checked against the negated
// seed value of its magnitude in the same iteration. Every one of the 2^32 patterns is encoded.
TEST(CodecExhaustive, E4M3EqualsSeedBinarySearchForEveryFiniteFloat) {
  uint64_t mismatches = 0, finite = 0, nonfinite_bad = 0;
#pragma omp parallel for schedule(dynamic, 1 << 16) reduction(+ : mismatches, finite, nonfinite_bad)
  for (uint64_t i = 0; i < kAll / 2; ++i) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = bits_float(u), nx = bits_float(u | 0x80000000u);
    const uint8_t c = e4m3_encode(x), nc = e4m3_encode(nx);
    if ((u & 0x7f800000u) == 0x7f800000u) {  // +-inf -> +-448, NaN -> 0x7f
      nonfinite_bad += (u & 0x7fffffu) ? (c != 0x7fu) + (nc != 0x7fu) : (c != 0x7eu) + (nc != 0xfeu);
      continue;
    }
    finite += 2;
    const float seed = codec_seed::e4m3fn_dequant(codec_seed::clamp448(x));
    mismatches += float_bits(e4m3_decode(c)) != float_bits(seed);
    // negative input: the seed gives -seed(|x|), except -0.0 itself, where it gives +0.0 and
    // kvcore -0.0 (code 0x80, like the hardware conversion)
    const float nseed = u == 0 ? 0.0f : -seed;
    if (u != 0) mismatches += float_bits(e4m3_decode(nc)) != float_bits(nseed);
    else mismatches += nc != 0x80u || float_bits(codec_seed::e4m3fn_dequant(codec_seed::clamp448(nx))) != 0u;
  }
  EXPECT_EQ(finite, kAll - (uint64_t{1} << 24));
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(nonfinite_bad, 0u);
  std::printf("e4m3: %llu finite inputs, %llu mismatches against the seed\n", static_cast<unsigned long long>(finite),
              static_cast<unsigned long long>(mismatches));
}

// The branch-free rounding the CPU kernels use: value == decode(encode(clamp(s))), code == encode(clamp(s)).
TEST(CodecExhaustive, E4M3RoundValueEqualsDecodeOfEncodeForEveryFloat) {
  uint64_t bad = 0;
#pragma omp parallel for schedule(dynamic, 1 << 16) reduction(+ : bad)
  for (uint64_t i = 0; i < kAll; ++i) {
    const float s = bits_float(static_cast<uint32_t>(i));
    const uint8_t code = e4m3_encode(e4m3_scaled(s, 1.0f));
    const float fast = e4m3_round_value(s), ref = e4m3_decode(code);
    bad += (ref != ref) ? !(fast != fast) : float_bits(fast) != float_bits(ref);
    bad += e4m3_encode_clamped(s) != code;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(CodecExhaustive, F32ToF16AndBf16ForEveryFloat) {
  const bool hw = have_f16c();
  uint64_t f16_bad = 0, bf16_bad = 0, bf16_rint_bad = 0, sampled = 0;
#pragma omp parallel for schedule(dynamic, 1 << 16) reduction(+ : f16_bad, bf16_bad, bf16_rint_bad, sampled)
  for (uint64_t i = 0; i < kAll; ++i) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = bits_float(u);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint16_t h = f32_to_f16_bits(x);
    const uint16_t b = f32_to_bf16_bits(x);
    if (nan) {  // canonical quiet NaNs
      f16_bad += h != 0x7e00u;
      bf16_bad += b != 0x7fc0u;
      continue;
    }
    f16_bad += h != (hw ? f16c_from_f32(x) : ref_f16_rint(x));
    bf16_bad += b != ref_bf16_compare(u);
    if (i % 61 == 0) {
      ++sampled;
      bf16_rint_bad += b != ref_bf16_rint(x);
    }
  }
  std::printf("f32->f16 against %s: %llu mismatches; f32->bf16: %llu mismatches (rint reference on %llu samples: %llu)\n",
              hw ? "F16C hardware" : "a double rint reference", static_cast<unsigned long long>(f16_bad),
              static_cast<unsigned long long>(bf16_bad), static_cast<unsigned long long>(sampled),
              static_cast<unsigned long long>(bf16_rint_bad));
  EXPECT_EQ(f16_bad, 0u);
  EXPECT_EQ(bf16_bad, 0u);
  EXPECT_EQ(bf16_rint_bad, 0u);
}

TEST(CodecExhaustive, F16RintReferenceAgreesWithHardwareOnASample) {
  if (!have_f16c()) GTEST_SKIP() << "no F16C";
  uint64_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
  for (uint64_t i = 0; i < kAll; i += 257) {
    const float x = bits_float(static_cast<uint32_t>(i));
    if (!std::isnan(x)) bad += ref_f16_rint(x) != f16c_from_f32(x);
  }
  EXPECT_EQ(bad, 0u) << "the two references agree, so either one pins f32_to_f16_bits";
}

TEST(CodecExhaustive, F16ToF32ForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
    if (e == 0x1f) {
      EXPECT_EQ(std::isnan(f), m != 0) << h;
      if (m == 0) {
        EXPECT_TRUE(std::isinf(f)) << h;
      }
    } else {
      ASSERT_EQ(static_cast<double>(f), (h & 0x8000) ? -mag : mag) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    }
    if (is_nan16(static_cast<uint16_t>(h))) continue;  // NaN payloads: host keeps them, F16C quiets them
    if (have_f16c()) {
      ASSERT_EQ(float_bits(f), float_bits(f16c_to_f32(static_cast<uint16_t>(h)))) << "half 0x" << std::hex << h;
    }
    ASSERT_EQ(f32_to_f16_bits(f), h) << "f16 -> f32 -> f16 is the identity";
  }
  for (uint32_t b = 0; b < 65536; ++b)
    if (!is_nan_bf16(static_cast<uint16_t>(b))) {
      ASSERT_EQ(f32_to_bf16_bits(bf16_bits_to_f32(static_cast<uint16_t>(b))), b);
    }
}

TEST(CodecExhaustive, E2M1EqualsNearestValueForEveryFloat) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint64_t bad = 0;
#pragma omp parallel for schedule(dynamic, 1 << 16) reduction(+ : bad)
  for (uint64_t i = 0; i < kAll; ++i) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = bits_float(u);
    uint8_t want;
    if (std::isnan(x)) {
      want = 0x7;  // NaN -> +6
    } else {
      const double a = std::fabs(static_cast<double>(x));
      int best = a >= 6.0 ? 7 : 0;  // saturation (and keeps huge |x| away from equal rounded distances)
      for (int c = 1; c < 8 && a < 6.0; ++c) {
        const double dc = std::fabs(a - kMag[c]), db = std::fabs(a - kMag[best]);
        if (dc < db || (dc == db && (c & 1) == 0)) best = c;
      }
      want = static_cast<uint8_t>(((u >> 28) & 0x8u) | best);
    }
    bad += e2m1_encode(x) != want;
  }
  EXPECT_EQ(bad, 0u);
}
