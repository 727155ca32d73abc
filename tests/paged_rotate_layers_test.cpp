// The one-launch rotation of every layer's K pool (ops/paged_rotate.hpp): its CUDA body,
// run on the host over every thread index, gives exactly the bytes of kv_rotate_blocks'
// CPU kernel applied layer by layer. Awkward sizes: 11 layers (a partial run of 8), 3
// heads (a partial batch of 4), block size 5, a shuffled subset of blocks, deltas that are
// zero, negative or positive, NeoX and interleaved, full and partial rotary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/simd_targets.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "ops/paged_rotate.hpp"

using namespace kvcore;

namespace {

template <KvFormat F>
void run_all(const PagedRotateParams& p) {
  const int64_t threads = paged_rotate_threads(p);
  PagedRotateLocalAngles ang;
  for (int64_t t = 0; t < threads + 5; ++t) paged_rotate_unit<F>(p, t, ang);  // + 5: out-of-range threads do nothing
}

std::vector<RopeSpec> specs() {
  RopeSpec tail = RopeSpec::plain(32, 20000.0, RopePairing::Interleaved);
  tail.slice = RopeSlice::Tail;
  return {RopeSpec::llama3_8b(), RopeSpec::plain(64, 10000.0), tail};
}

class PagedRotateLayers : public ::testing::TestWithParam<KvFormat> {};

TEST_P(PagedRotateLayers, HostRunOfTheCudaBodyMatchesKvRotateBlocksPerLayer) {
  const KvFormat f = GetParam();
  const int32_t D = 128, H = 3, bs = 5, blocks = 9, layers = 11;
  const size_t es = dtype_size(kv_format_dtype(f));
  const size_t pool_bytes = static_cast<size_t>(blocks) * bs * H * D * es;
  std::mt19937_64 rng(23);
  for (const RopeSpec& spec : specs()) {
    SCOPED_TRACE(spec.describe());
    const math::RopeTable table = make_rope_table(spec, D);
    std::vector<Buffer> a, b;
    std::vector<KvPool> pools;
    PagedRotateParams p;
    for (int32_t l = 0; l < layers; ++l) {
      a.emplace_back(pool_bytes, Device::cpu());
      b.emplace_back(pool_bytes, Device::cpu());
      uint8_t* x = a.back().as<uint8_t>();
      // finite values of every format: small random f32 / f16 / bf16 numbers
      for (size_t i = 0; i < pool_bytes / es; ++i) {
        const float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300.0f;
        if (f == KvFormat::F32) std::memcpy(x + 4 * i, &v, 4);
        else {
          const uint16_t h = f == KvFormat::F16 ? math::f32_to_f16_bits(v) : math::f32_to_bf16_bits(v);
          std::memcpy(x + 2 * i, &h, 2);
        }
      }
      std::memcpy(b.back().data(), a.back().data(), pool_bytes);
      KvPool pool;
      pool.format = f;
      pool.head_dim = D;
      pool.data = TensorRef(a.back().data(), kv_format_dtype(f), Device::cpu(), {blocks, bs, H, D});
      pools.push_back(pool);
      p.pools[l] = b.back().data();
    }
    std::vector<int32_t> delta(blocks * bs), list = {7, 0, 4, 5, 8};
    for (auto& x : delta) x = rng() % 4 == 0 ? 0 : static_cast<int32_t>(rng() % 100000) - 60000;
    const TensorRef lt(list.data(), DType::I32, Device::cpu(), {static_cast<int64_t>(list.size())});
    const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {blocks, bs});
    // the entry point on the CPU: one pass over every layer (SIMD), or kv_rotate_blocks layer by layer
    std::vector<math::RopeTable> tables(layers, table);
    EXPECT_FALSE(paged_rotate_fused_ok(pools, tables));  // CPU pools: never the CUDA launch
    kv_rotate_blocks_layers(pools, lt, dt, tables);

    p.n_layers = layers;
    p.format = f;
    p.n_heads = H;
    p.row_width = D;
    p.block_size = bs;
    p.blocks = list.data();
    p.n_blocks = static_cast<int32_t>(list.size());
    p.cell_delta = delta.data();
    p.rope = table;
    if (f == KvFormat::F32) run_all<KvFormat::F32>(p);
    else if (f == KvFormat::F16) run_all<KvFormat::F16>(p);
    else run_all<KvFormat::BF16>(p);
    for (int32_t l = 0; l < layers; ++l)
      ASSERT_EQ(0, std::memcmp(a[l].data(), b[l].data(), pool_bytes)) << "layer " << l;
  }
}

// The CPU's one pass over every layer (cpu/paged_rotate_simd.cpp) on every compiled SIMD
// target gives the bytes of the scalar kv_rotate_blocks applied layer by layer: f16 rows
// with infinities and NaN in some heads, zero deltas, 3 heads, 11 layers, a shuffled list.
TEST_P(PagedRotateLayers, CpuPassOnEveryTargetMatchesScalarKvRotateBlocksPerLayer) {
  const KvFormat f = GetParam();
  const int32_t D = 128, H = 3, bs = 5, blocks = 9, layers = 11;
  const size_t es = dtype_size(kv_format_dtype(f));
  const size_t pool_bytes = static_cast<size_t>(blocks) * bs * H * D * es;
  std::mt19937_64 rng(29);
  for (const RopeSpec& spec : specs()) {
    SCOPED_TRACE(spec.describe());
    const math::RopeTable table = make_rope_table(spec, D);
    std::vector<std::vector<uint8_t>> base(layers, std::vector<uint8_t>(pool_bytes));
    for (auto& x : base) {
      for (size_t i = 0; i < pool_bytes / es; ++i) {
        const float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300.0f;
        if (f == KvFormat::F32) std::memcpy(x.data() + 4 * i, &v, 4);
        else {
          const uint16_t h = f == KvFormat::F16 ? math::f32_to_f16_bits(v) : math::f32_to_bf16_bits(v);
          std::memcpy(x.data() + 2 * i, &h, 2);
        }
      }
      if (f == KvFormat::F16)
        for (int k = 0; k < 6; ++k) {
          const uint16_t special[] = {0x7c00, 0xfc00, 0x7e01};
          std::memcpy(x.data() + 2 * (rng() % (pool_bytes / 2)), &special[k % 3], 2);
        }
    }
    std::vector<int32_t> delta(blocks * bs), list = {7, 0, 4, 5, 8};
    for (auto& x : delta) x = rng() % 4 == 0 ? 0 : static_cast<int32_t>(rng() % 100000) - 60000;
    const TensorRef lt(list.data(), DType::I32, Device::cpu(), {static_cast<int64_t>(list.size())});
    const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {blocks, bs});
    const std::vector<math::RopeTable> tables(layers, table);
    auto run = [&] {
      std::vector<std::vector<uint8_t>> got = base;
      std::vector<KvPool> pools;
      for (auto& x : got) {
        KvPool pool;
        pool.format = f;
        pool.head_dim = D;
        pool.data = TensorRef(x.data(), kv_format_dtype(f), Device::cpu(), {blocks, bs, H, D});
        pools.push_back(pool);
      }
      kv_rotate_blocks_layers(pools, lt, dt, tables);
      return got;
    };
    std::vector<std::vector<uint8_t>> want;
    {
      ops::cpu::SimdPin pin(ops::cpu::kSimdScalar);
      want = run();
    }
    ASSERT_NE(want, base);
    for (const ops::cpu::SimdTarget& t : ops::cpu::simd_targets()) {
      ops::cpu::SimdPin pin(t.bits);
      const std::vector<std::vector<uint8_t>> got = run();
      for (int32_t l = 0; l < layers; ++l) EXPECT_EQ(got[l], want[l]) << t.name << " layer " << l;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedRotateLayers, ::testing::Values(KvFormat::F32, KvFormat::F16, KvFormat::BF16),
                         [](const auto& info) { return std::string(kv_format_name(info.param)); });

TEST(PagedRotateLayersArgs, MismatchedCountsThrowAndChangeNothing) {
  std::vector<uint8_t> bytes(2 * 4 * 1 * 64 * 2, 0x3c);
  const std::vector<uint8_t> before = bytes;
  KvPool pool;
  pool.format = KvFormat::F16;
  pool.head_dim = 64;
  pool.data = TensorRef(bytes.data(), DType::F16, Device::cpu(), {2, 4, 1, 64});
  std::vector<KvPool> pools{pool, pool};
  std::vector<math::RopeTable> one{make_rope_table(RopeSpec::plain(64, 1e4), 64)};
  std::vector<int32_t> list{0}, delta(8, 3);
  const TensorRef lt(list.data(), DType::I32, Device::cpu(), {1});
  const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {2, 4});
  EXPECT_THROW(kv_rotate_blocks_layers(pools, lt, dt, one), Error);
  EXPECT_EQ(before, bytes);
}

TEST(PagedRotateLayersArgs, NonFiniteTableOrBadBlockThrowsAndChangesNothing) {
  std::vector<uint8_t> a(2 * 4 * 1 * 64 * 2, 0x3c), b = a;
  const std::vector<uint8_t> before = a;
  std::vector<KvPool> pools(2);
  for (int i = 0; i < 2; ++i) {
    pools[i].format = KvFormat::F16;
    pools[i].head_dim = 64;
    pools[i].data = TensorRef(i == 0 ? a.data() : b.data(), DType::F16, Device::cpu(), {2, 4, 1, 64});
  }
  std::vector<int32_t> list{0}, bad_list{2}, delta(8, 3);
  const TensorRef lt(list.data(), DType::I32, Device::cpu(), {1}), bad(bad_list.data(), DType::I32, Device::cpu(), {1});
  const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {2, 4});
  std::vector<math::RopeTable> tables(2, make_rope_table(RopeSpec::plain(64, 1e4), 64));
  EXPECT_THROW(kv_rotate_blocks_layers(pools, bad, dt, tables), Error);  // block 2 of a 2-block pool
  tables[0].freq[5] = tables[1].freq[5] = std::nanf("");
  EXPECT_THROW(kv_rotate_blocks_layers(pools, lt, dt, tables), Error);
  EXPECT_EQ(before, a);
  EXPECT_EQ(before, b);
}

}  // namespace
