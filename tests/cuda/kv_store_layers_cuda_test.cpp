// kv_store_layers on CUDA (one launch for every layer's K and V) against kv_store per layer on
// the CPU: identical bytes on fresh random inputs. Llama-3-8B's shape (32 layers, 8 heads of
// 128, NeoX) at batch 1 / 16 / 64 for f16, bf16, f32 and FP8 pools and f16 / bf16 / f32
// sources; awkward shapes (70 layers: two launches; 3 heads; FP8 rows of 64 / 256 / 512,
// interleaved pairs, FP8 K with 16-bit V, 16-bit K and V of other widths, no V); shapes the
// kernel refuses (a partial rotation: per-layer fallback). And PagedCache::store_layers on a
// CUDA cache against store() per layer on a CPU cache: the same snapshot.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "kv_store_layers_util.hpp"
#include "paged_store_layers_util.hpp"

using namespace kvcore;
using kvsl_test::LayersCase;

namespace {

std::string describe(const LayersCase& c) {
  return std::to_string(c.layers) + " layers, n " + std::to_string(c.n) + ", H " + std::to_string(c.H) + ", K " +
         std::string(kv_format_name(c.kf)) + "/" + std::to_string(c.Dk) + ", V " + std::string(kv_format_name(c.vf)) +
         "/" + std::to_string(c.Dv) + ", src " + std::string(dtype_name(c.src)) + (c.rotate ? ", rotated" : "");
}

void expect_cuda_matches_cpu(LayersCase c) {
  c.blocks = c.n / c.bs + 4;
  const Device gpu = Device::cuda(0);
  const kvsl_test::LayersInputs cpu_in = kvsl_test::make_inputs(c, Device::cpu());
  const kvsl_test::LayersInputs gpu_in = kvsl_test::make_inputs(c, gpu);
  const kvsl_test::LayersPools want = kvsl_test::make_pools(c, Device::cpu());
  const kvsl_test::LayersPools got = kvsl_test::make_pools(c, gpu);
  kvsl_test::store_per_layer(c, cpu_in, want);
  kvsl_test::store_fused(c, gpu_in, got);
  synchronize(gpu);
  const auto a = want.bytes(), b = got.bytes();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    size_t diffs = 0, first = a[i].size();
    for (size_t j = 0; j < a[i].size(); ++j)
      if (a[i][j] != b[i][j]) {
        ++diffs;
        first = std::min(first, j);
      }
    EXPECT_EQ(diffs, 0u) << describe(c) << ": array " << i << " differs in " << diffs << " bytes, first at " << first;
  }
}

TEST(KvStoreLayersCuda, LlamaShapeEveryFormatAndBatch) {
  for (KvFormat f : {KvFormat::F16, KvFormat::BF16, KvFormat::F32, KvFormat::Fp8})
    for (int32_t n : {1, 16, 64})
      for (DType src : {DType::F16, DType::BF16, DType::F32}) {
        if (src != DType::F16 && n != 16) continue;  // other sources at one batch are enough
        LayersCase c;
        c.layers = 32;
        c.n = n;
        c.H = 8;
        c.bs = 16;
        c.kf = c.vf = f;
        c.src = src;
        c.seed = 100 + n + static_cast<uint64_t>(f) * 7;
        expect_cuda_matches_cpu(c);
        c.rotate = false;
        expect_cuda_matches_cpu(c);
      }
}

TEST(KvStoreLayersCuda, AwkwardShapes) {
  std::vector<LayersCase> cases;
  {
    LayersCase c;  // two launches of 64 + 6 layers, 3 heads
    c.layers = 70;
    c.H = 3;
    c.n = 7;
    cases.push_back(c);
    c.kf = c.vf = KvFormat::Fp8;
    cases.push_back(c);
  }
  for (int32_t D : {64, 256, 512}) {  // FP8 rows of 4, 16, 32 units; NeoX where D >= 128
    LayersCase c;
    c.kf = c.vf = KvFormat::Fp8;
    c.Dk = c.Dv = D;
    c.spec = RopeSpec::plain(D, 10000.0);
    c.spec.attention_factor = 0.9;
    c.n = 9;
    c.H = 3;
    cases.push_back(c);
    c.spec = RopeSpec::plain(D, 10000.0, RopePairing::Interleaved);
    cases.push_back(c);
  }
  {
    LayersCase c;  // FP8 K, f16 V; then f16 K, FP8 V
    c.kf = KvFormat::Fp8;
    c.H = 1;
    c.n = 6;
    cases.push_back(c);
    std::swap(c.kf, c.vf);
    cases.push_back(c);
  }
  {
    LayersCase c;  // 16-bit K and V of other widths, bf16 pools, f32 source
    c.kf = c.vf = KvFormat::BF16;
    c.Dk = 48;
    c.Dv = 80;
    c.spec = RopeSpec::plain(48, 10000.0);
    c.src = DType::F32;
    c.n = 11;
    cases.push_back(c);
  }
  {
    LayersCase c;  // no V, interleaved
    c.Dv = 0;
    c.spec = RopeSpec::plain(128, 10000.0, RopePairing::Interleaved);
    cases.push_back(c);
    c.kf = KvFormat::Fp8;
    cases.push_back(c);
  }
  {
    LayersCase c;  // a rotated tail: the per-layer fallback
    c.spec = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
    c.spec.slice = RopeSlice::Tail;
    cases.push_back(c);
    c.kf = c.vf = KvFormat::Fp8;
    cases.push_back(c);
  }
  for (const LayersCase& c : cases) expect_cuda_matches_cpu(c);
}

TEST(KvStoreLayersCuda, PagedCacheStoreLayersMatchesCpuStorePerLayer) {
  for (KvFormat f : {KvFormat::F16, KvFormat::Fp8, KvFormat::BF16}) {
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
      PagedCacheConfig cfg = paged_test::small_config(f, mode, 16, 64);
      cfg.n_layers = 32;
      cfg.n_kv_heads = 8;
      cfg.head_dim = cfg.v_head_dim = 128;
      cfg.rope = {RopeSpec::llama3_8b()};
      PagedCache cpu(cfg, Device::cpu()), gpu(cfg, Device::cuda(0));
      const std::vector<int32_t> decode(16, 1);
      paged_test::drive_steps(cpu, false, 3, decode, 31);
      paged_test::drive_steps(gpu, true, 3, decode, 31);
      EXPECT_TRUE(paged_test::snapshot(cpu) == paged_test::snapshot(gpu))
          << kv_format_name(f) << (mode == RopeMode::RopeStored ? " stored" : " on-read");
    }
  }
}

}  // namespace
