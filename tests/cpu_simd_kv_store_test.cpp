// kv_store and kv_rotate_blocks: the SIMD path on every compiled target this
// machine supports writes the scalar path's bytes (pool rows and FP8 scales),
// for every pool format, source type and rotation layout, with special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/simd_targets.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "ops/kv_store_params.hpp"

namespace {

using namespace kvcore;
namespace cpu = kvcore::ops::cpu;

float value(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  switch (rng() % 20) {
    case 0: return 1e-39f * u(rng);
    case 1: return 70000.0f * u(rng);
    case 2: return 1.0f + 0x1p-11f;
    case 3: return std::numeric_limits<float>::infinity();
    case 4: return std::nanf("");
    case 5: case 6: case 7: case 8: return std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);  // subnormal codes
    default: return u(rng);
  }
}

struct Case {
  KvFormat format;
  DType src;
  int head_dim;
  RopeSpec rope;
};

TEST(CpuSimdKvStore, StoreAndRotateGiveTheScalarBytesOnEveryTarget) {
  std::mt19937_64 rng(11);
  const Case cases[] = {
      {KvFormat::F16, DType::F32, 128, RopeSpec::llama3_8b()},
      {KvFormat::F16, DType::F16, 128, RopeSpec::plain(64, 1e4, RopePairing::Interleaved)},
      {KvFormat::BF16, DType::BF16, 80, RopeSpec::plain(80, 5e5)},
      {KvFormat::F32, DType::F16, 64, RopeSpec::plain(32, 1e4)},
      {KvFormat::Fp8, DType::BF16, 128, RopeSpec::llama3_8b()},
      {KvFormat::Fp8, DType::F16, 192, RopeSpec::plain(64, 1e4)},  // group 0 rotates, groups 1-2 keep their bytes
      {KvFormat::Dsv4Row, DType::F32, 512, RopeSpec::deepseek_v4_compressed()},
  };
  const int n_tokens = 37, n_heads = 3, n_cells = 50;
  for (const Case& c : cases) {
    const size_t es = dtype_size(c.src);
    const int row_width = kv_row_width(c.format, c.head_dim);
    const size_t pool_bytes = size_t{n_cells} * n_heads * row_width * dtype_size(kv_format_dtype(c.format));
    const size_t n_scales = c.format == KvFormat::Fp8 ? size_t{n_cells} * n_heads * (c.head_dim / 64) : 0;
    std::vector<uint8_t> src(size_t{n_tokens} * n_heads * c.head_dim * es);
    for (size_t i = 0; i < src.size() / es; ++i) {
      const float v = value(rng);
      if (c.src == DType::F32) std::memcpy(&src[i * 4], &v, 4);
      else {
        const uint16_t b = c.src == DType::F16 ? math::f32_to_f16_bits(v) : math::f32_to_bf16_bits(v);
        std::memcpy(&src[i * 2], &b, 2);
      }
    }
    std::vector<int32_t> slots(n_tokens), positions(n_tokens), deltas(n_cells), blocks{0, 2, 1};
    for (int t = 0; t < n_tokens; ++t) slots[t] = t == 5 ? -1 : (t * 7) % n_cells, positions[t] = t * 977 - 3000;
    for (int i = 0; i < n_cells; ++i) deltas[i] = i % 4 == 0 ? 0 : i * 3001 - 40000;
    auto run = [&](std::vector<uint8_t>& pool, std::vector<uint8_t>& scales) {
      pool.assign(pool_bytes, 0x5a);
      scales.assign(n_scales, 0x77);
      KvStoreParams p;
      p.src = src.data();
      p.src_token_stride = int64_t{n_heads} * c.head_dim;
      p.src_head_stride = c.head_dim;
      p.src_dtype = c.src;
      p.slots = slots.data();
      p.maybe_positions = positions.data();
      p.pool = pool.data();
      p.maybe_scales = n_scales ? scales.data() : nullptr;
      p.format = c.format;
      p.n_tokens = n_tokens;
      p.n_heads = n_heads;
      p.head_dim = c.head_dim;
      p.row_width = row_width;
      p.num_cells = n_cells;
      p.rope = make_rope_table(c.rope, c.head_dim);
      kvcore::cpu::kv_store(p);
      KvRotateParams r;
      r.pool = pool.data();
      r.maybe_scales = p.maybe_scales;
      r.format = c.format;
      r.n_heads = n_heads;
      r.head_dim = c.head_dim;
      r.row_width = row_width;
      r.block_size = 16;
      r.blocks = blocks.data();
      r.n_blocks = 3;
      r.cell_delta = deltas.data();
      r.rope = p.rope;
      r.rope.attention_factor = 1.0f;
      std::vector<uint8_t> stored = pool;
      if (n_cells >= 48) kvcore::cpu::kv_rotate_blocks(r);
      return stored;
    };
    std::vector<uint8_t> want_pool, want_scales, want_stored;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      want_stored = run(want_pool, want_scales);
    }
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      std::vector<uint8_t> pool, scales;
      const std::vector<uint8_t> stored = run(pool, scales);
      EXPECT_TRUE(stored == want_stored) << t.name << " kv_store, format " << int(c.format);
      EXPECT_TRUE(pool == want_pool) << t.name << " kv_rotate_blocks, format " << int(c.format);
      EXPECT_TRUE(scales == want_scales) << t.name << " scales, format " << int(c.format);
    }
  }
}

}  // namespace
