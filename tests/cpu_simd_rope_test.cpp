// rope_apply's SIMD path on every compiled target this machine supports gives
// the scalar path's bits: f32, f16 and bf16 rows, NeoX and interleaved pairs,
// head and tail slices, in place and into another tensor, positions whose
// angles reach the scalar fmod branch, and special values (subnormals, values
// that round to f16 / bf16 ties, huge values, infinities and NaN; f16 and bf16
// NaN are canonical, f32 NaN only need to be NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/simd_targets.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/rope.hpp"

namespace {

using namespace kvcore;
namespace cpu = kvcore::ops::cpu;

float special_value(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  switch (rng() % 16) {
    case 0: return 3.0e-39f * u(rng);                          // f32 subnormal
    case 1: return 5.9604645e-08f * (1.0f + u(rng) * 0.25f);  // around the f16 subnormal step
    case 2: return 65504.0f * u(rng);                         // f16 overflow range
    case 3: return 1.0f + 0x1p-11f;                           // an f16 tie
    case 4: return 1.0f + 0x1p-8f;                            // a bf16 tie
    case 5: return std::numeric_limits<float>::infinity();
    case 6: return (rng() & 1) ? std::nanf("") : -std::nanf("");
    default: return u(rng);
  }
}

void put(std::vector<uint8_t>& buf, DType t, size_t i, float x) {
  if (t == DType::F32) std::memcpy(&buf[i * 4], &x, 4);
  else {
    const uint16_t b = t == DType::F16 ? math::f32_to_f16_bits(x) : math::f32_to_bf16_bits(x);
    std::memcpy(&buf[i * 2], &b, 2);
  }
}

TEST(CpuSimdRope, EveryTargetGivesTheScalarBits) {
  const int tokens = 67, heads = 3;
  std::mt19937_64 rng(5);
  int cases = 0;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int variant = 0; variant < 6; ++variant) {
      const int D = variant < 3 ? 128 : 80;
      RopeSpec spec = RopeSpec::plain(variant == 1 ? 64 : variant == 4 ? 16 : D, variant == 2 ? 1e4 : 5e5,
                                      variant % 2 ? RopePairing::Interleaved : RopePairing::NeoX);
      if (variant == 1 || variant == 4) spec.slice = RopeSlice::Tail;
      if (variant == 5) spec = RopeSpec::llama3_8b(), spec.n_rot = 80;
      const size_t n = size_t{tokens} * heads * D, es = dtype_size(t);
      std::vector<uint8_t> x(n * es);
      for (size_t i = 0; i < n; ++i) put(x, t, i, special_value(rng));
      std::vector<int64_t> pos(tokens);
      for (int i = 0; i < tokens; ++i)
        pos[i] = i % 5 == 0 ? int64_t{1} << (20 + i % 12) : i % 7 == 0 ? -i * 1000 : i * 31;  // fmod branch too
      const TensorRef pr(pos.data(), DType::I64, Device::cpu(), {tokens});
      for (bool in_place : {true, false}) {
        auto run = [&] {
          std::vector<uint8_t> a = x, out(n * es, 0xab);
          const TensorRef xr(a.data(), t, Device::cpu(), {tokens, heads, D});
          const TensorRef orf(out.data(), t, Device::cpu(), {tokens, heads, D});
          if (in_place) rope_apply(xr, pr, spec, RopeAttentionFactor::Apply);
          else rope_apply(xr, pr, spec, RopeAttentionFactor::Apply, orf);
          return in_place ? a : out;
        };
        std::vector<uint8_t> want;
        {
          cpu::SimdPin pin(cpu::kSimdScalar);
          want = run();
        }
        for (const cpu::SimdTarget& target : cpu::simd_targets()) {
          cpu::SimdPin pin(target.bits);
          const std::vector<uint8_t> got = run();
          size_t first = n;
          for (size_t i = 0; i < n && first == n; ++i) {
            if (std::memcmp(&got[i * es], &want[i * es], es) == 0) continue;
            float g, w;  // f32 NaN payloads and signs follow operand order, which compilers may commute
            if (t == DType::F32 && (std::memcpy(&g, &got[i * 4], 4), std::memcpy(&w, &want[i * 4], 4), g != g && w != w))
              continue;
            first = i;
          }
          float gv = 0, wv = 0;
          if (first < n && t == DType::F32) std::memcpy(&gv, &got[first * 4], 4), std::memcpy(&wv, &want[first * 4], 4);
          EXPECT_EQ(first, n) << gv << " vs " << wv << " " << target.name << " " << dtype_name(t) << " variant " << variant << " in place "
                              << in_place << ": first differing element " << first;
          ++cases;
        }
      }
    }
  EXPECT_GT(cases, 0);
}

// Rows without infinities or NaN take a conversion without the NaN fix, and the cos/sin
// of the next token are computed between the heads of the current one: f16 rows where a
// few heads hold a special value, 1, 3 and 8 heads (the split of the next
// token's angles over the heads), 8 to 256 pairs, attention factors up to 1e34, beyond 2^100
// (where products of f16 values may overflow and the fix is always applied).
TEST(CpuSimdRope, F16RowsWithAndWithoutSpecialsGiveTheScalarBitsOnEveryTarget) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  int cases = 0;
  for (int heads : {1, 3, 8})
    for (int variant = 0; variant < 4; ++variant) {
      const int D = variant == 3 ? 512 : 128;
      RopeSpec spec = RopeSpec::plain(variant == 1 ? 16 : variant == 2 ? 80 : D, 1e4,
                                      variant == 2 ? RopePairing::Interleaved : RopePairing::NeoX);
      if (variant == 1) spec.slice = RopeSlice::Tail;
      for (double factor : {1.0, 1e20, 1e34}) {
        spec.attention_factor = factor;
        const int tokens = 37;
        const size_t n = size_t{tokens} * heads * D;
        std::vector<uint16_t> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = math::f32_to_f16_bits(u(rng) * (rng() % 2 ? 20000.0f : 1.0f));
        for (int k = 0; k < tokens * heads / 4; ++k) {  // a special value in about a quarter of the rows
          const uint16_t special[] = {0x7c00, 0xfc00, 0x7e00, 0xfd17, 0x7bff};
          x[rng() % n] = special[rng() % 5];
        }
        std::vector<int32_t> pos(tokens);
        for (int i = 0; i < tokens; ++i) pos[i] = i % 9 == 4 ? (1 << 29) + i : static_cast<int32_t>(rng() % 100000) - 50000;
        const TensorRef pr(pos.data(), DType::I32, Device::cpu(), {tokens});
        auto run = [&] {
          std::vector<uint16_t> a = x;
          rope_apply(TensorRef(a.data(), DType::F16, Device::cpu(), {tokens, heads, D}), pr, spec, RopeAttentionFactor::Apply);
          return a;
        };
        std::vector<uint16_t> want;
        {
          cpu::SimdPin pin(cpu::kSimdScalar);
          want = run();
        }
        for (const cpu::SimdTarget& target : cpu::simd_targets()) {
          cpu::SimdPin pin(target.bits);
          const std::vector<uint16_t> got = run();
          size_t first = n;
          for (size_t i = 0; i < n && first == n; ++i)
            if (got[i] != want[i]) first = i;
          EXPECT_EQ(first, n) << target.name << " heads " << heads << " variant " << variant << " factor " << factor
                              << ": first differing element " << first;
          ++cases;
        }
      }
    }
  EXPECT_GT(cases, 0);
}

}  // namespace
