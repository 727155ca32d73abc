// DeepSeek-V2/V3 MLA through PagedCache on the CPU: K rows of 576 dims (512 latent, 64-dim
// interleaved RoPE tail), V rows of 512, f16 / bf16 / fp8, both RoPE modes. After stores, a
// context shift, a fork, a rollback and a decode step's reserve + store, attention through
// cache.paged_kv(layer) matches float64 attention over the tokens as written
// (tests/paged_mla_scenario.hpp); a control with the query at a wrong position must miss.
// And what stays unsupported is refused at construction, naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "kvcore/error.hpp"
#include "kvcore/ops/attention.hpp"
#include "paged_configs.hpp"
#include "paged_mla_scenario.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

using mla_test::MlaCase;
using mla_test::config_of;

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

class PagedMla : public ::testing::TestWithParam<MlaCase> {};

TEST_P(PagedMla, AttentionThroughTheCacheMatchesFloat64) {
  const MlaCase mc = GetParam();
  PagedCache cache(config_of(mc), Device::cpu());
  mla_test::Scenario sc(cache, 19 + static_cast<uint32_t>(mc.format));
  constexpr int32_t kHeads = 16;
  const int64_t rows = static_cast<int64_t>(sc.seqs().size());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> q_raw(static_cast<size_t>(rows) * kHeads * mla_test::kDk);
  for (float& x : q_raw) x = u(rng);
  std::vector<int32_t> qpos = sc.next_positions();
  AttentionStep step;
  step.table = cache.block_tables(sc.seqs());
  step.q_positions = TensorRef(qpos.data(), DType::I32, Device::cpu(), {rows});
  const AttentionPlan plan = AttentionPlan::decode(cache.paged_kv(0), kHeads, step);
  for (int32_t layer = 0; layer < mla_test::kLayers; ++layer) {
    std::vector<float> q = sc.query_for_cache(layer, q_raw, kHeads);
    std::vector<float> out(static_cast<size_t>(rows) * kHeads * mla_test::kDv);
    plan.run(TensorRef(q.data(), DType::F32, Device::cpu(), {rows, kHeads, mla_test::kDk}), cache.paged_kv(layer),
             TensorRef(out.data(), DType::F32, Device::cpu(), {rows, kHeads, mla_test::kDv}));
    const std::vector<double> ref = sc.reference(layer, q_raw, kHeads);
    ASSERT_EQ(ref.size(), out.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      worst = std::max(worst, std::abs(out[i] - ref[i]));
      scale = std::max(scale, std::abs(ref[i]));
    }
    // Control: the same attention with every query 9 positions later (as if the shift had not
    // moved the keys) must miss by far more than the tolerance.
    double control = 0;
    {
      // Rotating the raw query by 9 more positions before the reference rotates it by qpos
      // gives the reference of a query at qpos + 9.
      const RopeSpec& spec = cache.config().rope_for(layer);
      std::vector<float> q9(q_raw.size());
      for (size_t i = 0; i < q_raw.size(); i += mla_test::kDk) {
        const std::vector<double> x =
            mla_test::rotate_f64(std::vector<double>(q_raw.begin() + static_cast<std::ptrdiff_t>(i),
                                                     q_raw.begin() + static_cast<std::ptrdiff_t>(i + mla_test::kDk)),
                                 spec, 9);
        for (int32_t e = 0; e < mla_test::kDk; ++e) q9[i + e] = static_cast<float>(x[e] / spec.attention_factor);
      }
      const std::vector<double> ref9 = sc.reference(layer, q9, kHeads);
      for (size_t i = 0; i < ref9.size(); ++i) control = std::max(control, std::abs(out[i] - ref9[i]));
    }
    std::printf("[paged mla] %s %s%s layer %d: worst |out - f64| %.3g (tolerance %.3g, largest |out| %.3g); control %.3g\n",
                std::string(kv_format_name(mc.format)).c_str(), mc.mode == RopeMode::RopeStored ? "rope-stored" : "rope-on-read",
                mc.one_spec ? " one spec" : "", layer, worst, mla_test::attention_tolerance(mc.format), scale, control);
    EXPECT_LE(worst, mla_test::attention_tolerance(mc.format)) << "layer " << layer;
    EXPECT_GT(control, 3 * mla_test::attention_tolerance(mc.format)) << "layer " << layer << ": the control must fail";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedMla, ::testing::ValuesIn(mla_test::all_cases()),
                         [](const ::testing::TestParamInfo<MlaCase>& i) { return mla_test::case_name(i.param); });

// What an MLA-shaped cache cannot be, refused at construction with the field and value named.
TEST(PagedMlaRefusals, WhatStaysUnsupportedIsRefusedNamingTheField) {
  PagedCacheConfig c = mla_config(KvFormat::F16, RopeMode::RopeStored);
  c.head_dim = 640;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "PagedCacheConfig.head_dim must be in [1, 576], got 640");
  c = mla_config(KvFormat::F16, RopeMode::RopeStored);
  c.v_head_dim = 577;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "PagedCacheConfig.v_head_dim must be in [0, 576], got 577");
  // Rotation tables hold 256 pairs: a 576-dim row rotates a slice of at most 512 dims.
  c = mla_config(KvFormat::F16, RopeMode::RopeStored);
  c.rope = {RopeSpec::plain(576, 10000.0)};
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "PagedCacheConfig.rope[0].n_rot must be <= 512");
  // Attention reads 576-dim K only with 512-dim V, and K and V of one format.
  c = mla_config(KvFormat::F16, RopeMode::RopeStored);
  c.v_head_dim = 576;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "head_dim 576 has no attention kernel");
  c = mla_config(KvFormat::Fp8, RopeMode::RopeStored);
  c.v_format = KvFormat::F16;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "K pages are e4m3 but V pages are f16");
  // FP8 rows carry one scale per 64 dims.
  c = mla_config(KvFormat::Fp8, RopeMode::RopeStored);
  c.head_dim = 544;
  c.kvcore_attention = false;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "fp8 K needs head_dim % 64 == 0, got 544");
  // An engine that reads the pages with its own kernels may keep other MLA layouts (V as wide as K).
  c = mla_config(KvFormat::BF16, RopeMode::RopeOnRead);
  c.v_head_dim = 576;
  c.kvcore_attention = false;
  EXPECT_NO_THROW(PagedCache(c, Device::cpu()));
  // kv_store's pools follow the same cap.
  std::vector<uint16_t> pool(4 * 640, 0), src(640, 0);
  std::vector<int32_t> slot{0};
  KvPool p;
  p.format = KvFormat::F16;
  p.head_dim = 640;
  p.data = TensorRef(pool.data(), DType::F16, Device::cpu(), {4, 1, 1, 640});
  expect_error(
      [&] {
        kv_store(TensorRef(src.data(), DType::F16, Device::cpu(), {1, 1, 640}),
                 TensorRef(slot.data(), DType::I32, Device::cpu(), {1}), p, {}, nullptr);
      },
      "kv_store: pool.head_dim must be in [1, 576], got 640");
  EXPECT_EQ(pool, std::vector<uint16_t>(4 * 640, 0)) << "a refused store writes nothing";
}

}  // namespace
