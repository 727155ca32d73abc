// The CPU's one pass over every layer (cpu/paged_rotate_simd.cpp) on FP8 pools (Fp8 with
// its scale tensor, Dsv4Row with in-row scales and a bf16 tail): on every compiled SIMD
// target it writes the bytes (codes, scales, tails) of the scalar kv_rotate_blocks applied
// layer by layer, and of the SIMD kv_rotate_blocks layer by layer. Rows written by kv_store
// from values with infinities, NaN, subnormal codes and large magnitudes; 67 layers (two
// launches of up to 64), 3 heads, block size 5, a shuffled subset of blocks, zero, negative
// and positive deltas; NeoX and interleaved, full and partial rotary (head and tail slices).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/simd_targets.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "ops/paged_rotate.hpp"

using namespace kvcore;

namespace {

namespace cpu = kvcore::ops::cpu;

constexpr int32_t kHeads = 3, kBlockSize = 5, kBlocks = 9;

float value(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  switch (rng() % 40) {
    case 0: return std::numeric_limits<float>::infinity();
    case 1: return std::nanf("");
    case 2: return 70000.0f * u(rng);
    case 3: case 4: case 5: return std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);  // subnormal codes
    default: return u(rng);
  }
}

struct Case {
  std::string name;
  KvFormat format;
  int32_t head_dim;
  RopeSpec rope;
};

std::vector<Case> cases() {
  RopeSpec tail = RopeSpec::plain(64, 1e4, RopePairing::Interleaved);
  tail.slice = RopeSlice::Tail;
  return {
      {"fp8_128_llama3", KvFormat::Fp8, 128, RopeSpec::llama3_8b()},
      {"fp8_128_head32", KvFormat::Fp8, 128, RopeSpec::plain(32, 1e4)},  // group 0 rotates, group 1 keeps its bytes
      {"fp8_192_tail64_interleaved", KvFormat::Fp8, 192, tail},          // groups 0-1 keep their bytes
      {"dsv4row_512", KvFormat::Dsv4Row, 512, RopeSpec::deepseek_v4_compressed()},  // the bf16 tail rotates
  };
}

// One layer's pool: row bytes and (Fp8) scale bytes.
struct Layer {
  std::vector<uint8_t> data, scales;
  bool operator==(const Layer&) const = default;
};

struct Pools {
  const Case& c;
  std::vector<Layer> layers;

  KvPool pool(int32_t l) {
    KvPool p;
    p.format = c.format;
    p.head_dim = c.head_dim;
    p.data = TensorRef(layers[l].data.data(), kv_format_dtype(c.format), Device::cpu(),
                       {kBlocks, kBlockSize, kHeads, kv_row_width(c.format, c.head_dim)});
    if (c.format == KvFormat::Fp8)
      p.scales = TensorRef(layers[l].scales.data(), DType::UE8M0, Device::cpu(), {kBlocks, kBlockSize, kHeads, c.head_dim / 64});
    return p;
  }
  std::vector<KvPool> all() {
    std::vector<KvPool> v;
    for (int32_t l = 0; l < static_cast<int32_t>(layers.size()); ++l) v.push_back(pool(l));
    return v;
  }
};

// n_layers pools, every row written by kv_store from random values.
Pools filled(const Case& c, int32_t n_layers, std::mt19937_64& rng) {
  const int64_t cells = int64_t{kBlocks} * kBlockSize;
  const size_t row_bytes = static_cast<size_t>(kv_row_width(c.format, c.head_dim)) * dtype_size(kv_format_dtype(c.format));
  Pools p{c, {}};
  std::vector<float> src(static_cast<size_t>(cells) * kHeads * c.head_dim);
  std::vector<int32_t> slots(cells);
  for (int64_t i = 0; i < cells; ++i) slots[i] = static_cast<int32_t>(i);
  const TensorRef st(slots.data(), DType::I32, Device::cpu(), {cells});
  for (int32_t l = 0; l < n_layers; ++l) {
    Layer layer;
    layer.data.assign(static_cast<size_t>(cells) * kHeads * row_bytes, 0);
    if (c.format == KvFormat::Fp8) layer.scales.assign(static_cast<size_t>(cells) * kHeads * (c.head_dim / 64), 0);
    p.layers.push_back(std::move(layer));
    for (float& x : src) x = value(rng);
    kv_store(TensorRef(src.data(), DType::F32, Device::cpu(), {cells, kHeads, c.head_dim}), st, p.pool(l), {}, nullptr);
  }
  return p;
}

TEST(PagedRotateLayersFp8, CpuPassOnEveryTargetMatchesKvRotateBlocksPerLayer) {
  const int32_t n_layers = 67;
  std::mt19937_64 rng(31);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const math::RopeTable table = make_rope_table(c.rope, c.head_dim);
    const std::vector<math::RopeTable> tables(n_layers, table);
    const Pools base = filled(c, n_layers, rng);
    std::vector<int32_t> delta(kBlocks * kBlockSize), list = {7, 0, 4, 5, 8};
    for (auto& x : delta) x = rng() % 4 == 0 ? 0 : static_cast<int32_t>(rng() % 100000) - 60000;
    const TensorRef lt(list.data(), DType::I32, Device::cpu(), {static_cast<int64_t>(list.size())});
    const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {kBlocks, kBlockSize});
    auto all_layers = [&](bool want_pass) {
      Pools got = base;
      const std::vector<KvPool> pools = got.all();
      EXPECT_EQ(want_pass, paged_rotate_cpu_ok(pools, tables));
      kv_rotate_blocks_layers(pools, lt, dt, tables);
      return got.layers;
    };
    auto layer_by_layer = [&] {
      Pools got = base;
      for (const KvPool& pool : got.all()) kv_rotate_blocks(pool, lt, dt, table);
      return got.layers;
    };
    std::vector<Layer> want;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      want = all_layers(false);  // the scalar kv_rotate_blocks, layer by layer
    }
    ASSERT_NE(want, base.layers);
    const std::vector<Layer> simd_layers = layer_by_layer();
    for (int32_t l = 0; l < n_layers; ++l) ASSERT_EQ(simd_layers[l], want[l]) << "SIMD kv_rotate_blocks, layer " << l;
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      const std::vector<Layer> got = all_layers(true);
      for (int32_t l = 0; l < n_layers; ++l) EXPECT_EQ(got[l], want[l]) << t.name << " layer " << l;
    }
  }
}

// A bad pool in any layer is reported before any layer is rotated.
TEST(PagedRotateLayersFp8, BadLayerThrowsAndChangesNothing) {
  std::mt19937_64 rng(37);
  const Case c = cases()[0];
  const Pools base = filled(c, 3, rng);
  std::vector<int32_t> delta(kBlocks * kBlockSize, 5), list = {1, 2};
  const TensorRef lt(list.data(), DType::I32, Device::cpu(), {2});
  const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {kBlocks, kBlockSize});
  const std::vector<math::RopeTable> tables(3, make_rope_table(c.rope, c.head_dim));
  {
    Pools got = base;
    std::vector<KvPool> pools = got.all();
    pools[2].scales = {};  // the last layer's scales missing
    EXPECT_THROW(kv_rotate_blocks_layers(pools, lt, dt, tables), Error);
    EXPECT_EQ(got.layers, base.layers);
  }
  {
    Pools got = base;
    std::vector<KvPool> pools = got.all();
    std::vector<math::RopeTable> wide = tables;
    wide[1] = make_rope_table(RopeSpec::plain(64, 1e4), 64);
    wide[1].layout.first_dim = 96;  // dims [96, 160) of a 128-dim head
    EXPECT_THROW(kv_rotate_blocks_layers(pools, lt, dt, wide), Error);
    EXPECT_EQ(got.layers, base.layers);
  }
  {
    Pools got = base;
    std::vector<KvPool> pools = got.all();
    std::vector<int32_t> bad_list = {1, 9};  // block 9 of a 9-block pool
    EXPECT_THROW(kv_rotate_blocks_layers(pools, TensorRef(bad_list.data(), DType::I32, Device::cpu(), {2}), dt, tables), Error);
    EXPECT_EQ(got.layers, base.layers);
  }
}

}  // namespace
