// DeepSeek-V2/V3 MLA through PagedCache on the CPU: K rows of 576 dims (512 latent, 64-dim
// interleaved RoPE tail), V rows of 512 in pools of their own or read from K's latent (the shared
// layout, v_from_k_latent), f16 / bf16 / fp8, both RoPE modes. After stores, a
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
#include "kvcore/persist/snapshot.hpp"
#include "paged_configs.hpp"
#include "paged_mla_scenario.hpp"
#include "paged_model.hpp"

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
    std::printf("[paged mla] %s %s%s%s layer %d: worst |out - f64| %.3g (tolerance %.3g, largest |out| %.3g); control %.3g\n",
                std::string(kv_format_name(mc.format)).c_str(), mc.mode == RopeMode::RopeStored ? "rope-stored" : "rope-on-read",
                mc.one_spec ? " one spec" : "", mc.shared_v ? " shared V" : "", layer, worst, mla_test::attention_tolerance(mc.format), scale, control);
    EXPECT_LE(worst, mla_test::attention_tolerance(mc.format)) << "layer " << layer;
    EXPECT_GT(control, 3 * mla_test::attention_tolerance(mc.format)) << "layer " << layer << ": the control must fail";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedMla, ::testing::ValuesIn(mla_test::all_cases()),
                         [](const ::testing::TestParamInfo<MlaCase>& i) { return mla_test::case_name(i.param); });

// Decode attention of the scenario's sequences, one layer, queries from a fixed seed.
std::vector<float> decode_out(PagedCache& cache, const mla_test::Scenario& sc, int32_t layer) {
  constexpr int32_t kHeads = 4;
  const int64_t rows = static_cast<int64_t>(sc.seqs().size());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> q_raw(static_cast<size_t>(rows) * kHeads * mla_test::kDk);
  for (float& x : q_raw) x = u(rng);
  std::vector<int32_t> qpos = sc.next_positions();
  AttentionStep step;
  step.table = cache.block_tables(sc.seqs());
  step.q_positions = TensorRef(qpos.data(), DType::I32, Device::cpu(), {rows});
  const AttentionPlan plan = AttentionPlan::decode(cache.paged_kv(layer), kHeads, step);
  std::vector<float> q = sc.query_for_cache(layer, q_raw, kHeads);
  std::vector<float> out(static_cast<size_t>(rows) * kHeads * mla_test::kDv);
  plan.run(TensorRef(q.data(), DType::F32, Device::cpu(), {rows, kHeads, mla_test::kDk}), cache.paged_kv(layer),
           TensorRef(out.data(), DType::F32, Device::cpu(), {rows, kHeads, mla_test::kDv}));
  return out;
}

// MLA's shared layout (v_from_k_latent) against the separate-V layout fed the latent as V, after
// the same stores, shift, fork, rollback and decode step: the same K bytes, V read back as the
// same values, attention outputs bit-identical (the same kernel reading the same values, V in
// place from K's rows), and 576 bytes-per-dim-row per token instead of 576 + 512.
TEST(PagedMlaSharedV, EqualsTheSeparateLayoutFedTheLatent) {
  for (KvFormat f : kMlaFormats)
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
      SCOPED_TRACE(std::string(kv_format_name(f)) + (mode == RopeMode::RopeStored ? " rope-stored" : " rope-on-read"));
      PagedCache sep(mla_config(f, mode, 16, 32), Device::cpu());
      PagedCache shared(mla_shared_config(f, mode, 16, 32), Device::cpu());
      const mla_test::Scenario a(sep, 5, /*v_is_latent=*/true), b(shared, 5);
      ASSERT_EQ(a.seqs().size(), b.seqs().size());
      for (int32_t l = 0; l < mla_test::kLayers; ++l) {
        for (size_t i = 0; i < a.seqs().size(); ++i) {
          const PagedReadBack ra = sep.read(a.seqs()[i], l), rb = shared.read(b.seqs()[i], l);
          EXPECT_EQ(ra.positions, rb.positions);
          EXPECT_EQ(ra.k, rb.k) << "layer " << l << " seq " << i;
          ASSERT_EQ(rb.v.size(), rb.positions.size() * mla_test::kDv);
          EXPECT_EQ(ra.v, rb.v) << "layer " << l << " seq " << i;
          // The shared layout's V is K's latent, row by row.
          for (size_t r = 0; r < rb.positions.size(); ++r)
            for (int32_t d = 0; d < mla_test::kDv; d += 37)
              ASSERT_EQ(rb.v[r * mla_test::kDv + d], rb.k[r * mla_test::kDk + d]);
        }
        EXPECT_EQ(decode_out(sep, a, l), decode_out(shared, b, l)) << "layer " << l;
      }
      // The view attention reads: V is K's memory with K's row stride, no V pool exists.
      const PagedKV kv = shared.paged_kv(0);
      EXPECT_EQ(kv.v.data(), kv.k.data());
      EXPECT_EQ(kv.v.size(3), 512);
      EXPECT_EQ(kv.v.stride(2), 576);
      EXPECT_TRUE(shared.v_pool(0).data.empty());
      if (f == KvFormat::Fp8) {
        EXPECT_EQ(kv.v_scale.data(), kv.k_scale.data());
        EXPECT_EQ(kv.v_scale.size(3), 8);
        EXPECT_EQ(kv.v_scale.stride(2), 9);
      }
      for (const PagedPoolSpec& spec : paged_pool_specs(shared.config()))
        EXPECT_TRUE(spec.part == PoolPart::KData || spec.part == PoolPart::KScales) << pool_part_name(spec.part);
      // Stats: per layer and cell, the K row only.
      const int64_t elem = f == KvFormat::Fp8 ? 1 : 2, scales = f == KvFormat::Fp8 ? 1 : 0;
      const int64_t per_cell_k = 576 * elem + 9 * scales, per_cell_v = 512 * elem + 8 * scales;
      EXPECT_EQ(shared.stats().bytes_per_block, mla_test::kLayers * 16 * per_cell_k);
      EXPECT_EQ(sep.stats().bytes_per_block, mla_test::kLayers * 16 * (per_cell_k + per_cell_v));
      EXPECT_EQ(shared.stats().blocks_used, sep.stats().blocks_used);
    }
}

// The shared layout takes K only: a store or append given V is refused, naming v_from_k_latent,
// and changes nothing; the persistence fingerprint tells the two layouts apart.
TEST(PagedMlaSharedV, StoresGivenVAreRefusedAndChangeNothing) {
  PagedCache cache(mla_shared_config(KvFormat::Fp8, RopeMode::RopeStored, 8, 40), Device::cpu());
  const mla_test::Scenario sc(cache, 3);
  const paged_test::Snapshot before = paged_test::snapshot(cache);
  std::vector<float> k(2 * 2 * 576, 0.5f), v(2 * 2 * 512, 0.25f);
  const std::vector<int32_t> pos{100, 101};
  const TensorRef k4(k.data(), DType::F32, Device::cpu(), {2, 2, 1, 576});
  const TensorRef v4(v.data(), DType::F32, Device::cpu(), {2, 2, 1, 512});
  expect_error([&] { cache.append(sc.seqs()[0], pos, k4, v4); },
               "PagedCache::append: this cache reads V from K's latent (v_from_k_latent");
  EXPECT_TRUE(paged_test::snapshot(cache) == before) << "a refused append changed the cache";
  AppendTicket t = cache.reserve(sc.seqs()[0], std::span<const int32_t>(pos));
  const paged_test::Snapshot reserved = paged_test::snapshot(cache);
  expect_error([&] {
    cache.store(t, 0, TensorRef(k.data(), DType::F32, Device::cpu(), {2, 1, 576}),
                TensorRef(v.data(), DType::F32, Device::cpu(), {2, 1, 512}));
  }, "so v must be empty");
  expect_error([&] { cache.store_layers(t, k4, v4); }, "PagedCache::store_layers: this cache reads V from K's latent");
  EXPECT_TRUE(paged_test::snapshot(cache) == reserved) << "a refused store changed the cache";
  cache.store_layers(t, k4, TensorRef());  // K only: stored
  EXPECT_FALSE(paged_test::snapshot(cache) == reserved);

  const std::string shared_fp = layout_fingerprint(cache.config());
  PagedCacheConfig sep = cache.config();
  sep.v_from_k_latent = false;
  EXPECT_NE(shared_fp, layout_fingerprint(sep));
  EXPECT_NE(layout_fingerprint_hash(cache.config()), layout_fingerprint_hash(sep));
  EXPECT_NE(shared_fp.find("v_format k_latent"), std::string::npos) << shared_fp;
}

// What the shared layout cannot be, refused at construction naming the field and its value.
TEST(PagedMlaSharedV, ImpossibleLayoutsAreRefusedNamingTheField) {
  PagedCacheConfig c = mla_shared_config(KvFormat::F16, RopeMode::RopeStored);
  c.v_head_dim = 577;
  c.kvcore_attention = false;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "PagedCacheConfig.v_head_dim must be in [0, 576], got 577");
  c = mla_shared_config(KvFormat::F16, RopeMode::RopeStored);
  c.head_dim = 320;
  c.v_head_dim = 384;
  c.kvcore_attention = false;
  expect_error([&] { PagedCache cache(c, Device::cpu()); },
               "PagedCacheConfig.v_head_dim must be in [1, head_dim = 320] with v_from_k_latent");
  c = mla_shared_config(KvFormat::F16, RopeMode::RopeStored);
  c.v_head_dim = 0;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "with v_from_k_latent (V is the first v_head_dim dims of the K row), got 0");
  // A RoPE slice over the latent: a stored rotation (or a shift) would rewrite V.
  c = mla_shared_config(KvFormat::BF16, RopeMode::RopeOnRead);
  c.rope[1].slice = RopeSlice::Head;
  expect_error([&] { PagedCache cache(c, Device::cpu()); },
               "PagedCacheConfig.rope[1] rotates dims [0, 64), but with v_from_k_latent dims [0, v_head_dim = 512) are V");
  c = mla_shared_config(KvFormat::BF16, RopeMode::RopeStored);
  c.v_head_dim = 520;  // the tail starts at 512: dims 512..519 would be V and rotate
  c.kvcore_attention = false;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "PagedCacheConfig.rope[0] rotates dims [512, 576)");
  // FP8: V takes whole scale groups of K.
  c = mla_shared_config(KvFormat::Fp8, RopeMode::RopeStored);
  c.v_head_dim = 480;
  c.kvcore_attention = false;
  expect_error([&] { PagedCache cache(c, Device::cpu()); },
               "PagedCacheConfig.v_head_dim must be a multiple of 64 with fp8 K and v_from_k_latent");
  // Dsv4Row packs its dims: no latent prefix to read.
  c = mla_shared_config(KvFormat::Dsv4Row, RopeMode::RopeStored);
  c.head_dim = 512;
  c.v_head_dim = 448;
  c.rope = {RopeSpec::plain(64, 10000.0, RopePairing::Interleaved)};
  c.rope[0].slice = RopeSlice::Tail;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "PagedCacheConfig.k_format: v_from_k_latent needs f32, f16, bf16 or fp8 K, got dsv4row");
  // A V format other than K's is ignored (V is K's bytes), not an error.
  c = mla_shared_config(KvFormat::Fp8, RopeMode::RopeStored);
  c.v_format = KvFormat::F16;
  EXPECT_NO_THROW(PagedCache(c, Device::cpu()));
}

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
