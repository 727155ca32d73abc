// shift_dense on the CPU: kept tokens byte-identical, moved V rows and
// non-rotated K dims byte-identical, rotated dims equal a fresh float64
// rotation at the new position within per-dtype tolerances, for every layout,
// RoPE variant, format and range case of the issue.
#include <gtest/gtest.h>

#include <cstdio>

#include "shift_test_util.hpp"

using namespace kvcore;
using namespace shift_test;

namespace {

struct Run {
  int64_t cap, length, n_keep, n_discard;
};

// Build every layer, shift them in one call, check every layer; returns the worst rms error.
double run_and_check(const std::vector<LayerSpec>& specs, const Run& run, uint64_t seed = 7) {
  std::vector<Layer> layers;
  for (size_t i = 0; i < specs.size(); ++i) layers.push_back(make_layer(specs[i], run.cap, seed + i));
  std::vector<Layer> work = layers;
  std::vector<ShiftDenseLayer> views;
  for (auto& L : work) views.push_back(L.host_view());
  shift_dense(views, run.length, run.n_keep, run.n_discard);
  double worst = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const CheckResult r = check_shift(layers[i], work[i].k, work[i].s, work[i].v, run.length, run.n_keep, run.n_discard);
    EXPECT_TRUE(r.ok) << "layer " << i << ": " << r.problem;
    worst = std::max(worst, r.rms_rel());
  }
  return worst;
}

LayerSpec plain(DType k, std::optional<DType> v, int heads, int hd, RopeSpec rope) {
  LayerSpec s;
  s.k_dtype = k;
  s.v_dtype = v;
  s.heads = heads;
  s.head_dim = hd;
  s.v_head_dim = hd;
  s.rope = rope;
  return s;
}

}  // namespace

TEST(ShiftDense, RangesOverlappingAndNot) {
  const LayerSpec s = plain(DType::F16, DType::F16, 2, 64, RopeSpec::plain(64, 10000.0));
  run_and_check({s}, {100, 100, 4, 3});    // heavy overlap: many bands of 3
  run_and_check({s}, {100, 90, 4, 43});    // moved 43 == discard: one band, no overlap
  run_and_check({s}, {100, 90, 4, 60});    // discard > moved
  run_and_check({s}, {100, 97, 0, 1});     // n_keep = 0, shift by one
  run_and_check({s}, {100, 100, 0, 50});   // full capacity, half discarded
  run_and_check({s}, {100, 80, 10, 70});   // discard reaches the end: nothing retained (no-op)
  run_and_check({s}, {100, 80, 80, 0});    // n_discard = 0: no-op
  run_and_check({s}, {100, 0, 0, 0});      // empty cache
  run_and_check({s}, {100, 57, 5, 11});    // stale tail beyond length untouched
}

TEST(ShiftDense, HeadDimsHeadsAndDtypes) {
  for (int hd : {64, 128, 256, 512})
    for (int heads : {1, 3}) run_and_check({plain(DType::F16, DType::F16, heads, hd, RopeSpec::plain(hd, 10000.0))}, {40, 40, 3, 7});
  for (DType k : {DType::F32, DType::F16, DType::BF16})
    for (DType v : {DType::F32, DType::F16, DType::BF16}) run_and_check({plain(k, v, 2, 64, RopeSpec::plain(64, 500000.0))}, {33, 31, 2, 9});
}

TEST(ShiftDense, RopeVariants) {
  // NeoX and interleaved, partial rotary at head and at tail
  for (RopePairing pr : {RopePairing::NeoX, RopePairing::Interleaved})
    for (RopeSlice sl : {RopeSlice::Head, RopeSlice::Tail}) {
      RopeSpec r = RopeSpec::plain(32, 10000.0, pr);
      r.slice = sl;
      run_and_check({plain(DType::BF16, DType::F16, 2, 128, r)}, {50, 48, 4, 13});
      run_and_check({plain(DType::F32, std::nullopt, 1, 96, r)}, {50, 50, 1, 20});
    }
  run_and_check({plain(DType::F16, DType::F16, 8, 128, RopeSpec::llama3_8b())}, {64, 64, 4, 30});
  RopeSpec lin = RopeSpec::plain(64, 10000.0);
  lin.scaling = RopeScaling::Linear;
  lin.factor = 4.0;
  run_and_check({plain(DType::F32, DType::F32, 1, 64, lin)}, {30, 30, 2, 5});
  RopeSpec ff = RopeSpec::plain(64, 10000.0);
  ff.freq_factors.assign(32, 1.0f);
  for (int i = 0; i < 32; ++i) ff.freq_factors[i] = 1.0f + 0.25f * i;
  run_and_check({plain(DType::F32, DType::F16, 2, 64, ff)}, {30, 30, 2, 5});
}

TEST(ShiftDense, YarnMagnitudeIsNeverReapplied) {
  // Keys were written with YaRN's attention factor 1.3 on cos and sin; the reference
  // at the new position carries it once. A shift that re-applied it would be off by 30%.
  RopeSpec y = RopeSpec::deepseek_v4_compressed();
  y.slice = RopeSlice::Head;
  y.attention_factor = 1.3;
  LayerSpec s = plain(DType::F32, DType::F32, 2, 64, y);
  s.magnitude = 1.3;
  run_and_check({s}, {60, 60, 4, 17});
  s.k_dtype = DType::F16;
  run_and_check({s}, {60, 60, 4, 17});
}

TEST(ShiftDense, ManyLayersWithPerLayerThetaInOneCall) {
  std::vector<LayerSpec> specs;
  for (int i = 0; i < 6; ++i) {
    LayerSpec s = plain(i % 2 ? DType::BF16 : DType::F16, i % 3 ? std::optional<DType>(DType::F16) : std::nullopt, 2, 64,
                        RopeSpec::plain(64, i < 3 ? 10000.0 : 1000000.0, i % 2 ? RopePairing::Interleaved : RopePairing::NeoX));
    specs.push_back(s);
  }
  run_and_check(specs, {45, 44, 4, 6});
}

// The entry point makes one RoPE table (and cos/sin) per run of equal specs; any
// difference (theta, head_dim, freq_factors, pairing) must give the layer its own.
TEST(ShiftDense, RepeatedAndAlternatingSpecsShareTablesOnlyWhenEqual) {
  const RopeSpec a = RopeSpec::plain(64, 10000.0);
  RopeSpec f = a;
  f.freq_factors.assign(32, 1.0f);
  f.freq_factors[5] = 8.0f;
  RopeSpec i = a;
  i.pairing = RopePairing::Interleaved;
  std::vector<LayerSpec> specs = {plain(DType::F16, DType::F16, 2, 64, a),  plain(DType::F16, DType::F16, 2, 64, a),
                                  plain(DType::F16, std::nullopt, 2, 64, RopeSpec::plain(64, 500000.0)),
                                  plain(DType::BF16, DType::F16, 2, 64, a), plain(DType::F16, DType::F16, 2, 64, f),
                                  plain(DType::F16, DType::F16, 2, 64, a),  plain(DType::F16, DType::F16, 1, 128, a),
                                  plain(DType::F16, DType::F16, 2, 64, i),  plain(DType::F16, DType::F16, 2, 64, i),
                                  plain(DType::F16, DType::F16, 2, 64, a)};
  specs[6].v_head_dim = 128;
  run_and_check(specs, {50, 50, 3, 20});
}

TEST(ShiftDense, StridedRowsAndOwnVHeadDim) {
  LayerSpec s = plain(DType::F16, DType::BF16, 2, 64, RopeSpec::plain(64, 10000.0));
  s.v_head_dim = 48;
  s.k_pad = 5;  // odd padding: rows no longer 16-byte aligned
  s.v_pad = 3;
  run_and_check({s}, {40, 40, 2, 9});
}

TEST(ShiftDense, DeepSeekV4PackedRows) {
  LayerSpec s;
  s.form = KForm::Dsv4;
  s.v_dtype = std::nullopt;
  s.heads = 1;
  s.rope = RopeSpec::deepseek_v4_compressed();
  run_and_check({s}, {70, 70, 4, 16});
  s.rope = RopeSpec::deepseek_v4_window();
  s.heads = 2;
  run_and_check({s, s}, {41, 39, 0, 5});
  // A spec that rotates nope dims does not fit the row.
  s.rope = RopeSpec::plain(128, 10000.0, RopePairing::Interleaved);
  s.rope.slice = RopeSlice::Tail;
  EXPECT_THROW(run_and_check({s}, {10, 10, 0, 2}), Error);
}

TEST(ShiftDense, Fp8KeysRequantizeOnlyRotatedBlocks) {
  LayerSpec s;
  s.form = KForm::Fp8;
  s.heads = 2;
  s.head_dim = 128;
  s.v_dtype = DType::F16;
  s.rope = RopeSpec::plain(128, 10000.0);
  const double full = run_and_check({s}, {50, 50, 4, 11});
  s.rope = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  s.rope.slice = RopeSlice::Tail;  // block 0 must move byte-identical
  run_and_check({s}, {50, 50, 4, 11});
  s.rope = RopeSpec::plain(32, 10000.0);  // half of block 0 rotates
  run_and_check({s}, {50, 50, 4, 11});
  std::printf("[shift] FP8 keys, 128 dims fully rotated: rms error after one shift %.4f (relative to |k|)\n", full);
}

// MLA's latent K stored as FP8: 576 dims (9 blocks), RoPE on the 64-dim tail (block 8 requantized,
// blocks 0-7 byte-identical), V 512 dims; and 512 rotated dims at the head (blocks 0-7 requantized,
// the scratch's whole span; block 8 byte-identical). Against a float64 rotation.
TEST(ShiftDense, Fp8KeysAtMla576) {
  LayerSpec s;
  s.form = KForm::Fp8;
  s.heads = 1;
  s.head_dim = 576;
  s.v_head_dim = 512;
  s.v_dtype = DType::BF16;
  s.rope = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  s.rope.slice = RopeSlice::Tail;
  run_and_check({s, s}, {80, 78, 4, 29});
  run_and_check({s}, {80, 80, 0, 60});  // no overlap
  s.heads = 2;
  s.rope = RopeSpec::plain(512, 10000.0);
  const double head512 = run_and_check({s}, {50, 50, 4, 11});
  std::printf("[shift] FP8 keys, 576 dims with 512 rotated: rms error after one shift %.4f (relative to |k|)\n", head512);
}

// The extra error of a shift on FP8 keys: error of the dequantized keys against
// the exact key, before (write quantization only) and after one shift.
TEST(ShiftDense, Fp8ExtraErrorIsMeasured) {
  LayerSpec s;
  s.form = KForm::Fp8;
  s.heads = 4;
  s.head_dim = 128;
  s.v_dtype = std::nullopt;
  s.rope = RopeSpec::plain(128, 10000.0);
  const Layer L = make_layer(s, 64, 99);
  double e0 = 0, n0 = 0;
  std::vector<double> ref(128);
  for (int64_t t = 0; t < 64; ++t)
    for (int h = 0; h < 4; ++h) {
      const double* x = &L.x[(t * 4 + h) * 128];
      for (int d = 0; d < 128; ++d) ref[d] = x[d];
      rotate_ref(ref.data(), L.table.layout, L.w, double(t), 1.0);
      for (int d = 0; d < 128; ++d) {
        const double g = dequant_fp8(L.k.data() + t * L.k_tok + h * 128, L.s.data() + t * L.s_tok + h * 2, d);
        e0 += (g - ref[d]) * (g - ref[d]);
        n0 += ref[d] * ref[d];
      }
    }
  Layer w = L;
  std::vector<ShiftDenseLayer> v{w.host_view()};
  shift_dense(v, 64, 0, 21);
  const CheckResult r = check_shift(L, w.k, w.s, w.v, 64, 0, 21);
  EXPECT_TRUE(r.ok) << r.problem;
  const double before = std::sqrt(e0 / n0), after = r.rms_rel();
  std::printf("[shift] FP8 e4m3 keys: rms relative error %.4f at write, %.4f after one shift (extra %.4f)\n", before, after,
              after - before);
  EXPECT_LT(after, 2.0 * before);  // requantizing adds at most one more rounding
  EXPECT_LT(after, 0.06);
}

TEST(ShiftDense, BigEnoughForSeveralThreads) {
  // 16 (tensor, head) units x 496 moved tokens: above the CPU kernel's parallel threshold.
  run_and_check({plain(DType::BF16, DType::F16, 8, 64, RopeSpec::plain(64, 10000.0, RopePairing::Interleaved))}, {600, 600, 4, 100});
}
