// kv_rotate_blocks_layers on CUDA (one launch for every layer, ops/paged_rotate.hpp)
// against kv_rotate_blocks on the CPU, layer by layer: identical bytes (same per-pair
// math, same conversions). Awkward sizes: 37 layers (runs of 8 and a partial one), 3 heads
// (a partial batch of 4), block size 7, a shuffled subset of blocks, zero / negative /
// positive deltas; f32, f16, bf16; NeoX and interleaved, partial rotary; and per-layer
// tables (the fallback: kv_rotate_blocks per layer).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/runtime.hpp"
#include "ops/paged_rotate.hpp"

using namespace kvcore;

namespace {

void run_case(KvFormat f, const RopeSpec& spec, bool per_layer_theta, uint32_t seed) {
  const int32_t D = 128, H = 3, bs = 7, blocks = 23, layers = 37;
  const size_t es = dtype_size(kv_format_dtype(f));
  const size_t pool_bytes = static_cast<size_t>(blocks) * bs * H * D * es;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> host(layers);
  std::vector<Buffer> dev;
  std::vector<KvPool> cpu_pools, gpu_pools;
  std::vector<math::RopeTable> tables;
  for (int32_t l = 0; l < layers; ++l) {
    host[l].resize(pool_bytes);
    for (size_t i = 0; i < pool_bytes / es; ++i) {
      const float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300.0f;
      if (f == KvFormat::F32) std::memcpy(&host[l][4 * i], &v, 4);
      else {
        const uint16_t h = f == KvFormat::F16 ? math::f32_to_f16_bits(v) : math::f32_to_bf16_bits(v);
        std::memcpy(&host[l][2 * i], &h, 2);
      }
    }
    dev.push_back(Buffer::from_host(host[l], Device::cuda(0)));
    KvPool p;
    p.format = f;
    p.head_dim = D;
    p.data = TensorRef(host[l].data(), kv_format_dtype(f), Device::cpu(), {blocks, bs, H, D});
    cpu_pools.push_back(p);
    p.data = TensorRef(dev.back().data(), kv_format_dtype(f), Device::cuda(0), {blocks, bs, H, D});
    gpu_pools.push_back(p);
    RopeSpec s = spec;
    if (per_layer_theta) s.theta = spec.theta * (1.0 + 0.01 * l);
    tables.push_back(make_rope_table(s, D));
  }
  EXPECT_EQ(paged_rotate_fused_ok(gpu_pools, tables), !per_layer_theta);
  std::vector<int32_t> delta(blocks * bs), list = {7, 0, 4, 5, 22, 13, 9};
  for (auto& x : delta) x = rng() % 4 == 0 ? 0 : static_cast<int32_t>(rng() % 200000) - 120000;
  const Buffer dlist = Buffer::from_host(list, Device::cuda(0));
  const Buffer ddelta = Buffer::from_host(delta, Device::cuda(0));
  kv_rotate_blocks_layers(cpu_pools, TensorRef(list.data(), DType::I32, Device::cpu(), {static_cast<int64_t>(list.size())}),
                          TensorRef(delta.data(), DType::I32, Device::cpu(), {blocks, bs}), tables);
  kv_rotate_blocks_layers(gpu_pools, TensorRef(dlist.data(), DType::I32, Device::cuda(0), {static_cast<int64_t>(list.size())}),
                          TensorRef(ddelta.data(), DType::I32, Device::cuda(0), {blocks, bs}), tables);
  synchronize(Device::cuda(0));
  for (int32_t l = 0; l < layers; ++l)
    ASSERT_EQ(dev[l].to_host<uint8_t>(), host[l]) << kv_format_name(f) << " layer " << l << ": CUDA differs from the CPU";
}

}  // namespace

TEST(PagedRotateCuda, OneLaunchForAllLayersMatchesCpuPerLayer) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  RopeSpec tail = RopeSpec::plain(32, 20000.0, RopePairing::Interleaved);
  tail.slice = RopeSlice::Tail;
  uint32_t seed = 1;
  for (KvFormat f : {KvFormat::F32, KvFormat::F16, KvFormat::BF16})
    for (const RopeSpec& s : {RopeSpec::llama3_8b(), RopeSpec::plain(64, 10000.0), tail}) run_case(f, s, false, ++seed);
}

TEST(PagedRotateCuda, PerLayerTablesFallBackToOneCallPerLayer) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  run_case(KvFormat::F16, RopeSpec::llama3_8b(), true, 99);
}
