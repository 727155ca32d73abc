// shift_dense: the SIMD rotation on every compiled target this machine supports
// writes the scalar path's bytes (f32, f16, bf16 keys, NeoX and interleaved
// pairs, head and tail slices, DeepSeek-V4 packed rows; FP8 keys stay scalar). Moved
// heads rotate from their old row into the new one: the copied dims around the rotated
// ones (NeoX head and tail slices) are part of the bytes checked. rope_shift_rows' angles
// and rotations likewise.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cpu/simd_targets.hpp"
#include "shift_test_util.hpp"

namespace {

using namespace shift_test;
namespace cpu = kvcore::ops::cpu;

TEST(CpuSimdShift, EveryTargetGivesTheScalarBytes) {
  std::vector<LayerSpec> specs;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    LayerSpec s;
    s.k_dtype = t;
    specs.push_back(s);
    s.rope = RopeSpec::plain(64, 5e5, RopePairing::Interleaved);
    s.rope.slice = RopeSlice::Tail;
    s.head_dim = 96;
    s.v_head_dim = 96;
    specs.push_back(s);
    s.rope = RopeSpec::plain(32, 1e4, RopePairing::NeoX);  // NeoX tail: copied dims before the rotated ones
    s.rope.slice = RopeSlice::Tail;
    specs.push_back(s);
    s.rope = RopeSpec::llama3_8b();
    s.rope.n_rot = 40;
    s.head_dim = 128;
    s.v_head_dim = 128;
    specs.push_back(s);
  }
  LayerSpec d;
  d.form = KForm::Dsv4;
  d.rope = RopeSpec::deepseek_v4_compressed();
  d.v_dtype.reset();
  specs.push_back(d);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Layer base = make_layer(specs[i], 300, 17 + i);
    Layer want = base;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      const ShiftDenseLayer L = want.host_view();
      shift_dense(std::span<const ShiftDenseLayer>(&L, 1), 300, 4, 37);
    }
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      Layer got = base;
      const ShiftDenseLayer L = got.host_view();
      shift_dense(std::span<const ShiftDenseLayer>(&L, 1), 300, 4, 37);
      EXPECT_TRUE(got.k == want.k) << t.name << " spec " << i;
      EXPECT_TRUE(got.v == want.v) << t.name << " spec " << i;
    }
  }
}

// rope_shift_rows: per-row angles (math::shift_sincos in SIMD lanes) and rotations on every
// target give the scalar path's bytes, deltas from 1 to 2^24 - 1 of either sign, FP8 keys too.
TEST(CpuSimdShift, RopeShiftRowsOnEveryTargetGivesTheScalarBytes) {
  std::vector<LayerSpec> specs;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    LayerSpec s;
    s.k_dtype = t;
    s.rope = RopeSpec::llama3_8b();
    specs.push_back(s);
    s.rope = RopeSpec::plain(64, 1e4, RopePairing::Interleaved);
    s.rope.slice = RopeSlice::Tail;
    s.head_dim = 96;
    s.v_head_dim = 96;
    specs.push_back(s);
  }
  LayerSpec f;
  f.form = KForm::Fp8;
  specs.push_back(f);
  LayerSpec d;
  d.form = KForm::Dsv4;
  d.rope = RopeSpec::deepseek_v4_compressed();
  d.v_dtype.reset();
  specs.push_back(d);
  const int64_t cap = 97;
  std::vector<int32_t> delta(cap);
  for (int64_t r = 0; r < cap; ++r) {
    const int32_t big[] = {0, 1, -1, 7, -4096, 123457, -999999, (1 << 24) - 1, -((1 << 24) - 1), 65535};
    delta[r] = big[r % 10] + (r % 10 == 0 ? 0 : static_cast<int32_t>(r));
    if (r % 10 == 7) delta[r] = (1 << 24) - 1 - static_cast<int32_t>(r);
    if (r % 10 == 8) delta[r] = -((1 << 24) - 1) + static_cast<int32_t>(r);
  }
  const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {cap});
  for (size_t i = 0; i < specs.size(); ++i) {
    const Layer base = make_layer(specs[i], cap, 41 + i);
    Layer want = base;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      const ShiftDenseLayer L = want.host_view();
      rope_shift_rows(L.k, L.maybe_k_scales, specs[i].rope, dt);
    }
    ASSERT_FALSE(want.k == base.k) << "spec " << i << ": the shift changed nothing";
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      Layer got = base;
      const ShiftDenseLayer L = got.host_view();
      rope_shift_rows(L.k, L.maybe_k_scales, specs[i].rope, dt);
      EXPECT_TRUE(got.k == want.k) << t.name << " spec " << i;
      EXPECT_TRUE(got.s == want.s) << t.name << " spec " << i;
    }
  }
}

// rope_shift_rows over rows enough to use every thread (each takes a contiguous run and
// computes the next moved row's cos/sin between the heads of the current one): runs of
// zero deltas (rows left alone) across the thread boundaries, f16 rows with infinities
// and NaN in a few heads (the NaN fix) and rows without (the plain conversion), 1 to 8
// heads.
TEST(CpuSimdShift, RopeShiftRowsThreadedF16WithSpecialValuesGivesTheScalarBytes) {
  for (int heads : {1, 3, 8}) {
    LayerSpec s;
    s.heads = heads;
    s.rope = RopeSpec::llama3_8b();
    s.v_dtype.reset();
    const int64_t cap = 4600 / heads + 300;
    Layer base = make_layer(s, cap, 77 + heads);
    const uint16_t special[] = {0x7c00, 0xfc00, 0x7e01, 0xfe00};
    for (int64_t r = 0; r < cap; r += 13) {
      const int64_t at = (r * 2 * heads * s.head_dim / 13 + r * 7) % (cap * heads * s.head_dim);
      std::memcpy(&base.k[static_cast<size_t>(at) * 2], &special[r % 4], 2);
    }
    std::vector<int32_t> delta(cap);
    for (int64_t r = 0; r < cap; ++r)
      delta[r] = (r / 50) % 3 == 1 ? 0 : static_cast<int32_t>((r * 7919) % 200001) - 100000;
    const TensorRef dt(delta.data(), DType::I32, Device::cpu(), {cap});
    Layer want = base;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      const ShiftDenseLayer L = want.host_view();
      rope_shift_rows(L.k, L.maybe_k_scales, s.rope, dt);
    }
    ASSERT_FALSE(want.k == base.k);
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      Layer got = base;
      const ShiftDenseLayer L = got.host_view();
      rope_shift_rows(L.k, L.maybe_k_scales, s.rope, dt);
      EXPECT_TRUE(got.k == want.k) << t.name << " heads " << heads;
    }
  }
}

}  // namespace
