// fp8_pack_rows / fp8_unpack_rows and the DeepSeek-V4 row codec: the SIMD path
// on every compiled target this machine supports writes the scalar path's
// bytes, for every row type and tail type, full and partial 64-blocks, and
// values that reach every e4m3 code (subnormal codes, ties, saturation, NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/simd_targets.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/fp8_block.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/fp8.hpp"

namespace {

using namespace kvcore;
namespace cpu = kvcore::ops::cpu;

float value(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  switch (rng() % 24) {
    case 0: return std::numeric_limits<float>::infinity();
    case 1: return std::nanf("");
    case 2: return 1e-40f;
    default: return std::ldexp(u(rng), static_cast<int>(rng() % 30) - 15);
  }
}

std::vector<uint8_t> values(DType t, size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> out(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    const float v = value(rng);
    if (t == DType::F32) std::memcpy(&out[i * 4], &v, 4);
    else {
      const uint16_t b = t == DType::F16 ? math::f32_to_f16_bits(v) : math::f32_to_bf16_bits(v);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}

TEST(CpuSimdFp8, PackAndUnpackGiveTheScalarBytesOnEveryTarget) {
  std::mt19937_64 rng(3);
  const Device c = Device::cpu();
  const int64_t rows = 29;
  for (DType row_t : {DType::F32, DType::F16, DType::BF16})
    for (DType tail_t : {DType::F16, DType::BF16})
      for (int n_nope : {448, 100, 64}) {
        const int n_rot = n_nope == 64 ? 0 : 64, cols = n_nope + n_rot, n_sc = (n_nope + 63) / 64;
        std::vector<uint8_t> src = values(row_t, size_t(rows) * cols, rng);
        auto run = [&](std::vector<uint8_t>& codes, std::vector<uint8_t>& sc, std::vector<uint8_t>& tail,
                       std::vector<uint8_t>& back) {
          codes.assign(size_t(rows) * n_nope, 0xcc);
          sc.assign(size_t(rows) * n_sc, 0xcc);
          tail.assign(size_t(rows) * n_rot * 2, 0xcc);
          back.assign(size_t(rows) * cols * dtype_size(row_t), 0xcc);
          const TensorRef tr = n_rot ? TensorRef(tail.data(), tail_t, c, {rows, n_rot}) : TensorRef();
          fp8_pack_rows(TensorRef(src.data(), row_t, c, {rows, cols}), TensorRef(codes.data(), DType::E4M3, c, {rows, n_nope}),
                        TensorRef(sc.data(), DType::UE8M0, c, {rows, n_sc}), tr);
          fp8_unpack_rows(TensorRef(codes.data(), DType::E4M3, c, {rows, n_nope}), TensorRef(sc.data(), DType::UE8M0, c, {rows, n_sc}),
                          tr, TensorRef(back.data(), row_t, c, {rows, cols}));
        };
        std::vector<uint8_t> codes0, sc0, tail0, back0;
        {
          cpu::SimdPin pin(cpu::kSimdScalar);
          run(codes0, sc0, tail0, back0);
        }
        for (const cpu::SimdTarget& t : cpu::simd_targets()) {
          cpu::SimdPin pin(t.bits);
          std::vector<uint8_t> codes, sc, tail, back;
          run(codes, sc, tail, back);
          const std::string what = t.name + " " + std::string(dtype_name(row_t)) + " tail " +
                                   std::string(dtype_name(tail_t)) + " n_nope " + std::to_string(n_nope);
          EXPECT_TRUE(codes == codes0) << what << " codes";
          EXPECT_TRUE(sc == sc0) << what << " scales";
          EXPECT_TRUE(tail == tail0) << what << " tail";
          if (row_t == DType::F32) {  // f32 NaN bits may differ in payload: compare NaN as NaN
            for (size_t i = 0; i < back.size() / 4; ++i) {
              float a, b;
              std::memcpy(&a, &back[i * 4], 4), std::memcpy(&b, &back0[i * 4], 4);
              if (!(a != a && b != b)) {
                ASSERT_EQ(0, std::memcmp(&a, &b, 4)) << what << " unpacked " << i;
              }
            }
          } else {
            EXPECT_TRUE(back == back0) << what << " unpacked";
          }
        }
      }
}

// fp8_round_trip_rows on every target: the scalar path's f32 values (NaN compared as
// NaN: payloads may differ), out of place and in place, full and partial blocks.
TEST(CpuSimdFp8, RoundTripGivesTheScalarValuesOnEveryTarget) {
  std::mt19937_64 rng(5);
  const Device c = Device::cpu();
  const int64_t rows = 23;
  for (int n_nope : {448, 100, 64})
    for (bool in_place : {false, true}) {
      const int n_rot = n_nope == 64 ? 0 : 64, cols = n_nope + n_rot;
      std::vector<uint8_t> bytes = values(DType::F32, size_t(rows) * cols, rng);
      std::vector<float> src(size_t(rows) * cols);
      std::memcpy(src.data(), bytes.data(), bytes.size());
      auto run = [&] {
        std::vector<float> in = src, out(src.size(), -7.0f);
        std::vector<float>& dst = in_place ? in : out;
        fp8_round_trip_rows(TensorRef(in.data(), DType::F32, c, {rows, cols}), TensorRef(dst.data(), DType::F32, c, {rows, cols}),
                            n_rot);
        return dst;
      };
      std::vector<float> want;
      {
        cpu::SimdPin pin(cpu::kSimdScalar);
        want = run();
      }
      for (const cpu::SimdTarget& t : cpu::simd_targets()) {
        cpu::SimdPin pin(t.bits);
        const std::vector<float> got = run();
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isnan(got[i]) && std::isnan(want[i])) continue;
          ASSERT_EQ(0, std::memcmp(&got[i], &want[i], 4))
              << t.name << " n_nope " << n_nope << (in_place ? " in place" : "") << " value " << i;
        }
      }
    }
}

// Values that sit on and next to every rounding boundary of the e4m3 grid: the midpoint
// of each pair of neighbouring codes (a tie, rounded to the even code), one f32 ulp
// either side of it, the codes themselves, f32 subnormals and zeros, both signs. Each
// 64-block starts with 448, so its scale is 1 and the values are encoded as they are.
// Every target writes the codes math::e4m3_encode gives (the scalar kernel's).
TEST(CpuSimdFp8, EveryRoundingBoundaryGivesTheScalarCodes) {
  std::vector<float> probe;
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = math::e4m3_decode(static_cast<uint8_t>(c)), hi = math::e4m3_decode(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact: e4m3 values have 4 significant bits
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) probe.push_back(v), probe.push_back(-v);
  }
  for (float v : {0.0f, -0.0f, 1e-40f, -1e-45f, 0x1p-10f, 0x1p-7f, 448.0f, 440.0f})  // ties at 2^-10, f32 subnormals
    probe.push_back(v);
  const int64_t per_row = math::kFp8Block - 1, rows = (static_cast<int64_t>(probe.size()) + per_row - 1) / per_row;
  std::vector<float> src(size_t(rows) * math::kFp8Block, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    src[r * math::kFp8Block] = 448.0f;
    for (int64_t i = 0; i < per_row && r * per_row + i < static_cast<int64_t>(probe.size()); ++i)
      src[r * math::kFp8Block + 1 + i] = probe[r * per_row + i];
  }
  const Device c = Device::cpu();
  auto pack = [&] {
    std::vector<uint8_t> codes(size_t(rows) * math::kFp8Block, 0xcc), sc(size_t(rows), 0xcc);
    fp8_pack_rows(TensorRef(src.data(), DType::F32, c, {rows, math::kFp8Block}),
                  TensorRef(codes.data(), DType::E4M3, c, {rows, math::kFp8Block}), TensorRef(sc.data(), DType::UE8M0, c, {rows, 1}),
                  TensorRef());
    for (uint8_t b : sc) EXPECT_EQ(b, math::ue8m0_encode(0));
    return codes;
  };
  std::vector<uint8_t> want;
  {
    cpu::SimdPin pin(cpu::kSimdScalar);
    want = pack();
  }
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(want[i], math::e4m3_encode(src[i])) << src[i];
  for (const cpu::SimdTarget& t : cpu::simd_targets()) {
    cpu::SimdPin pin(t.bits);
    const std::vector<uint8_t> got = pack();
    for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(got[i], want[i]) << t.name << " value " << src[i];
  }
}

}  // namespace
