// DeepSeek-V2/V3 MLA through a CUDA PagedCache (K 576 = 512 latent + 64-dim RoPE tail, V 512;
// f16, bf16, fp8; both RoPE modes) against a CPU cache given the same operations and the same
// fresh random rows (tests/paged_mla_scenario.hpp: stores, a context shift, a fork, a
// rollback, a decode step's reserve + store; per-layer RoPE specs, or one spec for every layer,
// which rotates all layers in one launch on CUDA; V in pools of its own, or K's latent in the
// shared layout, v_from_k_latent): identical metadata, V bytes (the V pools, or the latent dims
// of every K row) and (rope-on-read) K pool bytes; rope-stored K bytes compared and counted. Then
// CUDA attention through paged_kv(layer) against the float64 reference and against the CPU cache's
// attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "kvcore/ops/attention.hpp"
#include "kvcore/runtime.hpp"
#include "paged_configs.hpp"
#include "paged_mla_scenario.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

bool have_gpu() { return cuda_device_count() > 0; }

using mla_test::MlaCase;
using mla_test::config_of;

// Attention of every layer for the scenario's sequences with queries q_raw; outputs on the host.
std::vector<std::vector<float>> attend(PagedCache& cache, const mla_test::Scenario& sc, const std::vector<float>& q_raw,
                                       int32_t heads) {
  const Device dev = cache.device();
  const int64_t rows = static_cast<int64_t>(sc.seqs().size());
  const Buffer qpos = Buffer::from_host(sc.next_positions(), dev);
  AttentionStep step;
  step.table = cache.block_tables(sc.seqs());
  step.q_positions = TensorRef(qpos.data(), DType::I32, dev, {rows});
  const AttentionPlan plan = AttentionPlan::decode(cache.paged_kv(0), heads, step);
  std::vector<std::vector<float>> outs;
  for (int32_t layer = 0; layer < mla_test::kLayers; ++layer) {
    const Buffer q = Buffer::from_host(sc.query_for_cache(layer, q_raw, heads), dev);
    Buffer out(static_cast<size_t>(rows) * heads * mla_test::kDv * sizeof(float), dev);
    plan.run(TensorRef(q.data(), DType::F32, dev, {rows, heads, mla_test::kDk}), cache.paged_kv(layer),
             TensorRef(out.data(), DType::F32, dev, {rows, heads, mla_test::kDv}));
    synchronize(dev);
    outs.push_back(out.to_host<float>());
  }
  return outs;
}

class PagedMlaCuda : public ::testing::TestWithParam<MlaCase> {};

TEST_P(PagedMlaCuda, SameCacheAsTheCpuAndAttentionMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const MlaCase mc = GetParam();
  const PagedCacheConfig cfg = config_of(mc);
  PagedCache cpu(cfg, Device::cpu()), gpu(cfg, Device::cuda(0));
  const uint32_t seed =
      1900 + static_cast<uint32_t>(mc.format) * 4 + static_cast<uint32_t>(mc.mode) * 2 + mc.one_spec + 64 * mc.shared_v;
  mla_test::Scenario sc_cpu(cpu, seed), sc_gpu(gpu, seed);
  ASSERT_EQ(sc_cpu.seqs(), sc_gpu.seqs());
  cpu.prepare();
  gpu.prepare();
  ASSERT_EQ(cpu.debug_state(), gpu.debug_state());
  const Snapshot a = snapshot(cpu), b = snapshot(gpu);
  ASSERT_EQ(a.arrays.size(), b.arrays.size());
  // Per layer: K data [, K scales] [, V data [, V scales]]; then positions and validity.
  const bool scales = kv_format_has_scales(mc.format);
  const size_t k_arrays = 1 + scales, per_layer = mc.shared_v ? k_arrays : 2 * k_arrays;
  const int64_t elem = static_cast<int64_t>(dtype_size(kv_format_dtype(mc.format)));
  int64_t k_diff = 0, k_bytes = 0;
  for (size_t i = 0; i < a.arrays.size(); ++i) {
    const bool is_k = i < per_layer * mla_test::kLayers && i % per_layer < k_arrays;
    if (is_k && mc.mode == RopeMode::RopeStored) {  // rotated on each device: count differing bytes
      // Shared layout: a row's first 512 dims (and their 8 scale bytes) are V, never rotated: equal.
      const bool data = i % per_layer == 0;
      const int64_t row = data ? mla_test::kDk * elem : mla_test::kDk / 64, latent = data ? mla_test::kDv * elem : 8;
      for (size_t j = 0; j < a.arrays[i].size(); ++j) {
        if (mc.shared_v && static_cast<int64_t>(j) % row < latent) {
          if (a.arrays[i][j] != b.arrays[i][j]) {
            ADD_FAILURE() << "array " << i << " byte " << j << ": the latent (V) differs between the CPU and CUDA cache";
            break;
          }
          continue;
        }
        k_diff += a.arrays[i][j] != b.arrays[i][j];
      }
      k_bytes += static_cast<int64_t>(a.arrays[i].size());
      continue;
    }
    EXPECT_EQ(a.arrays[i], b.arrays[i]) << "array " << i << " differs between the CPU and the CUDA cache";
  }

  constexpr int32_t kHeads = 16;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> q_raw(sc_cpu.seqs().size() * kHeads * mla_test::kDk);
  for (float& x : q_raw) x = u(rng);
  const auto out_cpu = attend(cpu, sc_cpu, q_raw, kHeads), out_gpu = attend(gpu, sc_gpu, q_raw, kHeads);
  const double tol = mla_test::attention_tolerance(mc.format);
  for (int32_t layer = 0; layer < mla_test::kLayers; ++layer) {
    const std::vector<double> ref = sc_gpu.reference(layer, q_raw, kHeads);
    ASSERT_EQ(out_gpu[layer].size(), ref.size());
    double e_ref = 0, e_cpu = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      e_ref = std::max(e_ref, std::abs(out_gpu[layer][i] - ref[i]));
      e_cpu = std::max(e_cpu, std::abs(double(out_gpu[layer][i]) - out_cpu[layer][i]));
    }
    std::printf("[paged mla cuda] %s %s%s%s layer %d: |CUDA - f64| %.3g, |CUDA - CPU| %.3g (tolerance %.3g); "
                "rope-stored K bytes differing %lld of %lld\n",
                std::string(kv_format_name(mc.format)).c_str(), mc.mode == RopeMode::RopeStored ? "rope-stored" : "rope-on-read",
                mc.one_spec ? " one spec" : "", mc.shared_v ? " shared V" : "", layer, e_ref, e_cpu, tol, static_cast<long long>(k_diff), static_cast<long long>(k_bytes));
    EXPECT_LE(e_ref, tol) << "layer " << layer << " vs float64";
    // Both read the same pool bytes (up to rope-stored rotation roundings) and accumulate in f32.
    EXPECT_LE(e_cpu, tol / 2) << "layer " << layer << " vs the CPU cache's attention";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedMlaCuda, ::testing::ValuesIn(mla_test::all_cases()),
                         [](const ::testing::TestParamInfo<MlaCase>& i) { return mla_test::case_name(i.param); });

}  // namespace
