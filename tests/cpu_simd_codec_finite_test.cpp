// The SIMD FP8 encoders' paths for groups without inf or NaN (the common case: the amax
// from the magnitude bits, groups batched eight at a time, subnormal codes only in
// vectors that hold a value below 2^-6 after scaling), the 16-bit same-type store
// (rotation source to pool, NaN payloads made canonical) and kv_rope_angles: on every
// compiled target this machine supports, the scalar path's bytes. The other tests'
// values put inf or NaN in most groups, so these inputs are finite unless a case says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/simd_targets.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/fp8.hpp"
#include "ops/kv_store_params.hpp"

namespace {

using namespace kvcore;
namespace cpu = kvcore::ops::cpu;

// One 64-value group of a kind that reaches one branch of the encoders: plain values at
// a random scale; some values 2^-12 .. 2^-30 of the group's largest (subnormal codes,
// zeros of both signs, f32 subnormals); all zeros (the 1e-4 amax floor); values near
// the f32 maximum (the largest scale exponents); e4m3 ties at the group's scale (448
// sets scale 1); one inf or NaN among finite values (the clamp path inside a batch).
void fill_group(int kind, std::mt19937_64& rng, float* g) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int e = static_cast<int>(rng() % 60) - 30;
  for (int i = 0; i < 64; ++i) g[i] = std::ldexp(u(rng), e);
  switch (kind) {
    case 1:
      for (int i = 0; i < 64; i += 3) g[i] = std::ldexp(u(rng), e - 12 - static_cast<int>(rng() % 19));
      g[5] = 0.0f, g[7] = -0.0f, g[11] = 1e-40f, g[13] = -3e-45f;
      break;
    case 2:
      for (int i = 0; i < 64; ++i) g[i] = i % 2 ? 0.0f : -0.0f;
      break;
    case 3:
      for (int i = 0; i < 64; ++i) g[i] = std::numeric_limits<float>::max() * u(rng);
      break;
    case 4:
      g[0] = 448.0f;
      for (int i = 1; i < 64; ++i) {  // midpoints between neighbouring e4m3 values, and an ulp off
        const uint8_t c = static_cast<uint8_t>(rng() % 0x7e);
        const float mid = (math::e4m3_decode(c) + math::e4m3_decode(static_cast<uint8_t>(c + 1))) / 2;
        const float v = i % 3 == 0 ? mid : std::nextafter(mid, i % 3 == 1 ? 0.0f : 1e9f);
        g[i] = i % 2 ? -v : v;
      }
      break;
    case 5:
      g[rng() % 64] = rng() % 2 ? std::numeric_limits<float>::infinity() : std::nanf("");
      break;
    default:
      break;
  }
}

std::vector<float> rows_of_groups(int64_t rows, int cols, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<size_t>(rows) * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int off = 0; off < cols; off += 64) {
      float g[64];
      fill_group(static_cast<int>(rng() % 12 < 6 ? 0 : rng() % 6), rng, g);
      std::memcpy(&v[static_cast<size_t>(r) * cols + off], g, sizeof(float) * std::min(64, cols - off));
    }
  return v;
}

std::vector<uint8_t> as_type(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t b = t == DType::F16 ? math::f32_to_f16_bits(v[i]) : math::f32_to_bf16_bits(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {  // NaN as NaN (payloads may differ)
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], 4) != 0) return false;
  return a.size() == b.size();
}

TEST(CpuSimdCodecFinite, PackDsv4PackAndRoundTripGiveTheScalarBytesOnEveryTarget) {
  std::mt19937_64 rng(17);
  const Device c = Device::cpu();
  const int64_t rows = 41;
  // 7 groups (the DeepSeek-V4 row), 8 (one full batch), 11 (a batch and a part), a partial block
  for (int n_nope : {448, 512, 704, 100}) {
    const int n_rot = 64, cols = n_nope + n_rot, n_sc = (n_nope + 63) / 64;
    const std::vector<float> src = rows_of_groups(rows, cols, rng);
    for (DType row_t : {DType::F32, DType::F16, DType::BF16}) {
      const std::vector<uint8_t> bytes = as_type(src, row_t);
      auto pack = [&](std::vector<uint8_t>& codes, std::vector<uint8_t>& sc, std::vector<uint8_t>& tail) {
        codes.assign(size_t(rows) * n_nope, 0xcc), sc.assign(size_t(rows) * n_sc, 0xcc), tail.assign(size_t(rows) * n_rot * 2, 0xcc);
        fp8_pack_rows(TensorRef(const_cast<uint8_t*>(bytes.data()), row_t, c, {rows, cols}),
                      TensorRef(codes.data(), DType::E4M3, c, {rows, n_nope}), TensorRef(sc.data(), DType::UE8M0, c, {rows, n_sc}),
                      TensorRef(tail.data(), DType::BF16, c, {rows, n_rot}));
      };
      std::vector<uint8_t> codes0, sc0, tail0;
      {
        cpu::SimdPin pin(cpu::kSimdScalar);
        pack(codes0, sc0, tail0);
      }
      for (const cpu::SimdTarget& t : cpu::simd_targets()) {
        cpu::SimdPin pin(t.bits);
        std::vector<uint8_t> codes, sc, tail;
        pack(codes, sc, tail);
        const std::string what = t.name + " " + std::string(dtype_name(row_t)) + " n_nope " + std::to_string(n_nope);
        EXPECT_TRUE(codes == codes0) << what << " codes";
        EXPECT_TRUE(sc == sc0) << what << " scales";
        EXPECT_TRUE(tail == tail0) << what << " tail";
      }
    }
    for (bool in_place : {false, true}) {
      auto round_trip = [&] {
        std::vector<float> in = src, out(src.size(), -7.0f);
        std::vector<float>& dst = in_place ? in : out;
        fp8_round_trip_rows(TensorRef(in.data(), DType::F32, c, {rows, cols}), TensorRef(dst.data(), DType::F32, c, {rows, cols}), n_rot);
        return dst;
      };
      std::vector<float> want;
      {
        cpu::SimdPin pin(cpu::kSimdScalar);
        want = round_trip();
      }
      for (const cpu::SimdTarget& t : cpu::simd_targets()) {
        cpu::SimdPin pin(t.bits);
        EXPECT_TRUE(same_floats(round_trip(), want)) << t.name << " round trip n_nope " << n_nope << (in_place ? " in place" : "");
      }
    }
  }
  // the DeepSeek-V4 584-byte row (7 groups, codes and scales inside the row)
  const std::vector<float> src = rows_of_groups(rows, 512, rng);
  auto dsv4 = [&] {
    std::vector<uint8_t> packed(size_t(rows) * 584, 0xcc);
    dsv4_pack_rows(TensorRef(const_cast<float*>(src.data()), DType::F32, c, {rows, 512}), TensorRef(packed.data(), DType::U8, c, {rows, 584}));
    return packed;
  };
  std::vector<uint8_t> want;
  {
    cpu::SimdPin pin(cpu::kSimdScalar);
    want = dsv4();
  }
  for (const cpu::SimdTarget& t : cpu::simd_targets()) {
    cpu::SimdPin pin(t.bits);
    EXPECT_TRUE(dsv4() == want) << t.name << " dsv4_pack_rows";
  }
}

// kv_store of finite rows into FP8 and DeepSeek-V4 pools, rotated by positions and by a
// kv_rope_angles table (the path PagedCache::append takes), and unrotated (V); 16-bit pools
// from same-type sources holding NaN payloads, infinities and subnormals, fully and partly
// rotated; and the angle table itself.
TEST(CpuSimdCodecFinite, StoreAndAnglesGiveTheScalarBytesOnEveryTarget) {
  std::mt19937_64 rng(23);
  struct Case {
    KvFormat format;
    DType src;
    int head_dim;
    RopeSpec rope;
  };
  const Case cases[] = {
      {KvFormat::Fp8, DType::F16, 128, RopeSpec::llama3_8b()},
      {KvFormat::Fp8, DType::F32, 256, RopeSpec::plain(64, 1e4)},
      {KvFormat::Dsv4Row, DType::F32, 512, RopeSpec::deepseek_v4_compressed()},
      {KvFormat::F16, DType::F16, 128, RopeSpec::llama3_8b()},
      {KvFormat::F16, DType::F16, 96, RopeSpec::plain(32, 1e4, RopePairing::Interleaved)},
      {KvFormat::BF16, DType::BF16, 64, RopeSpec::plain(48, 5e5)},
  };
  const uint16_t specials16[] = {0x7c01, 0xfe00, 0xffff, 0x7e00, 0x7c00, 0xfc00, 0x0001, 0x8000, 0x7f81, 0xffc1};
  const int n_tokens = 29, n_heads = 3, n_cells = 40;
  for (const Case& c : cases) {
    const bool plain16 = c.format == KvFormat::F16 || c.format == KvFormat::BF16;
    const std::vector<float> values = rows_of_groups(int64_t{n_tokens} * n_heads, c.head_dim, rng);
    std::vector<uint8_t> src = as_type(values, c.src);
    if (plain16)  // NaN payloads and signs the f32 round trip makes canonical, infinities, subnormals
      for (size_t i = 0; i < src.size() / 2; i += 7) std::memcpy(&src[i * 2], &specials16[rng() % 10], 2);
    std::vector<int32_t> slots(n_tokens), positions(n_tokens);
    for (int t = 0; t < n_tokens; ++t) slots[t] = t == 3 ? -1 : (t * 11) % n_cells, positions[t] = t * 7919 - 100000;
    positions[1] = 400000000;  // an angle beyond 2^28: the scalar sin/cos
    const math::RopeTable table = make_rope_table(c.rope, c.head_dim);
    const int row_width = kv_row_width(c.format, c.head_dim);
    const size_t pool_bytes = size_t{n_cells} * n_heads * row_width * dtype_size(kv_format_dtype(c.format));
    const size_t n_scales = c.format == KvFormat::Fp8 ? size_t{n_cells} * n_heads * (c.head_dim / 64) : 0;
    // mode 0: positions, 1: angle table, 2: no rotation
    auto run = [&](int mode, std::vector<uint8_t>& pool, std::vector<uint8_t>& scales, std::vector<float>& angles) {
      pool.assign(pool_bytes, 0x5a);
      scales.assign(n_scales, 0x77);
      angles.assign(size_t{n_tokens} * table.layout.n_pairs() * 2, -5.0f);
      KvAnglesParams a;
      a.positions = positions.data();
      a.out = angles.data();
      a.n = n_tokens;
      a.rope = table;
      kvcore::cpu::kv_rope_angles(a);
      KvStoreParams p;
      p.src = src.data();
      p.src_token_stride = int64_t{n_heads} * c.head_dim;
      p.src_head_stride = c.head_dim;
      p.src_dtype = c.src;
      p.slots = slots.data();
      p.maybe_positions = mode == 2 ? nullptr : positions.data();
      p.maybe_angles = mode == 1 ? angles.data() : nullptr;
      p.pool = pool.data();
      p.maybe_scales = n_scales ? scales.data() : nullptr;
      p.format = c.format;
      p.n_tokens = n_tokens;
      p.n_heads = n_heads;
      p.head_dim = c.head_dim;
      p.row_width = row_width;
      p.num_cells = n_cells;
      p.rope = table;
      p.rope.attention_factor = 1.25f;
      kvcore::cpu::kv_store(p);
    };
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<uint8_t> want_pool, want_scales;
      std::vector<float> want_angles;
      {
        cpu::SimdPin pin(cpu::kSimdScalar);
        run(mode, want_pool, want_scales, want_angles);
      }
      for (const cpu::SimdTarget& t : cpu::simd_targets()) {
        cpu::SimdPin pin(t.bits);
        std::vector<uint8_t> pool, scales;
        std::vector<float> angles;
        run(mode, pool, scales, angles);
        const std::string what = t.name + " format " + std::to_string(int(c.format)) + " mode " + std::to_string(mode);
        EXPECT_TRUE(pool == want_pool) << what << " pool";
        EXPECT_TRUE(scales == want_scales) << what << " scales";
        EXPECT_EQ(0, std::memcmp(angles.data(), want_angles.data(), angles.size() * 4)) << what << " kv_rope_angles";
      }
    }
  }
}

}  // namespace
