// Cross-check against the faithful port of seed 000 (bench/baselines): on an
// f16 Llama-like cache (NeoX, whole head, theta 10000, the seed's only
// variant), kvcore's shift_dense and the seed's two-kernel algorithm agree
// within f16 rounding: V and kept tokens byte-identical, each K pair within two
// f16 roundings of the pair norm plus the seed's own f32 angle error (powf
// frequencies, unreduced angle), which grows with n_discard.
#include <gtest/gtest.h>

#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "../../bench/baselines/seed_shift.cu"
#include "kvcore/buffer.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/shift.hpp"
#include "kvcore/runtime.hpp"

using namespace kvcore;

namespace {

void cross_check(int64_t L, int64_t n_keep, int64_t n_discard, int heads, int hd, double theta) {
  const int64_t kv_dim = int64_t{heads} * hd;
  std::mt19937 rng(static_cast<uint32_t>(L * 31 + n_discard));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> k(L * kv_dim), v(L * kv_dim);
  for (auto& x : k) x = math::f32_to_f16_bits(normal(rng));
  for (auto& x : v) x = math::f32_to_f16_bits(normal(rng));
  const Device dev = Device::cuda(0);
  Buffer k1 = Buffer::from_host(k, dev), v1 = Buffer::from_host(v, dev);
  Buffer k2 = Buffer::from_host(k, dev), v2 = Buffer::from_host(v, dev);
  Buffer scratch(static_cast<size_t>(L * kv_dim * 2), dev);

  const baselines::SeedShiftLayer seed_layer{k1.data(), v1.data()};
  baselines::seed_shift_f16(&seed_layer, 1, scratch.data(), static_cast<uint32_t>(n_keep), static_cast<uint32_t>(n_discard),
                            static_cast<uint32_t>(L - n_discard), static_cast<uint32_t>(heads), static_cast<uint32_t>(hd),
                            static_cast<float>(theta), nullptr);
  ShiftDenseLayer layer;
  layer.k = TensorRef(k2.data(), DType::F16, dev, {L, heads, hd});
  layer.maybe_v = TensorRef(v2.data(), DType::F16, dev, {L, heads, hd});
  layer.rope = RopeSpec::plain(hd, theta);
  shift_dense(std::span<const ShiftDenseLayer>(&layer, 1), L, n_keep, n_discard);
  synchronize(dev);

  const auto ks = k1.to_host<uint16_t>(), kk = k2.to_host<uint16_t>();
  const auto vs = v1.to_host<uint16_t>(), vk = v2.to_host<uint16_t>();
  const int64_t end = (L - n_discard) * kv_dim;  // rows the seed rewrites
  EXPECT_TRUE(std::equal(vs.begin(), vs.begin() + end, vk.begin())) << "V differs from the seed port";
  EXPECT_TRUE(std::equal(ks.begin(), ks.begin() + n_keep * kv_dim, kk.begin())) << "kept K differs";
  // Per NeoX pair (d, d + hd/2) of every moved head: both results round once to f16, and the
  // seed's angle carries f32 error growing with n_discard (powf frequencies, unreduced angle).
  const double tol = std::ldexp(1.0, -10) + 1e-6 * double(n_discard) + 1e-6;  // relative to the pair norm (CUDA powf: <= 4 ulp)
  double worst = 0;
  int64_t differing = 0;
  for (int64_t t = n_keep; t < L - n_discard; ++t)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < hd / 2; ++d) {
        const int64_t i0 = t * kv_dim + int64_t{h} * hd + d, i1 = i0 + hd / 2;
        differing += (ks[i0] != kk[i0]) + (ks[i1] != kk[i1]);
        const double a0 = math::f16_bits_to_f32(ks[i0]), a1 = math::f16_bits_to_f32(ks[i1]);
        const double b0 = math::f16_bits_to_f32(kk[i0]), b1 = math::f16_bits_to_f32(kk[i1]);
        const double norm = std::max(std::hypot(b0, b1), 1e-3);
        const double rel = std::max(std::fabs(a0 - b0), std::fabs(a1 - b1)) / norm;
        worst = std::max(worst, rel);
        if (rel > tol) {
          ADD_FAILURE() << "token " << t << " head " << h << " pair " << d << ": seed (" << a0 << ", " << a1 << ") vs kvcore ("
                        << b0 << ", " << b1 << "), " << rel << " of the pair norm > " << tol;
          return;
        }
      }
  std::printf("[shift] seed cross-check L %lld keep %lld discard %lld: %lld of %lld K values differ, max %.2e of the pair "
              "norm (allowed %.2e)\n",
              (long long)L, (long long)n_keep, (long long)n_discard, (long long)differing, (long long)(end - n_keep * kv_dim),
              worst, tol);
}

}  // namespace

TEST(ShiftSeed, AgreesWithSeedPortWithinF16Rounding) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  cross_check(4096, 4, 2046, 8, 128, 10000.0);
  cross_check(4096, 4, 256, 8, 128, 500000.0);
  cross_check(1999, 0, 1, 3, 64, 10000.0);
  cross_check(3001, 7, 1500, 2, 256, 1000000.0);
}
