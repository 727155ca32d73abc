// Paged decode and prefill attention on the CPU against a float64 reference.
#include <gtest/gtest.h>

#include <cstdio>

#include "attention_test_util.hpp"

using namespace attn_test;

namespace {

// Tolerances against float64, relative to max(1, max |ref|): f32 math over
// at most a few hundred keys; 16-bit outputs add their own rounding.
double tolerance(const CaseSpec& s) {
  if (s.out == DType::BF16) return 8e-3;
  if (s.out == DType::F16) return 1e-3;
  return s.rope_on_read ? 1e-4 : 2e-5;
}

void check(const CaseSpec& s, int splits = 0) {
  const HostCase c = make_case(s);
  const std::vector<double> ref = reference(c);
  const std::vector<float> got = run_op(c, Device::cpu(), splits);
  const double err = max_rel_err(got, ref);
  EXPECT_LE(err, tolerance(s)) << "kv " << dtype_name(s.kv) << " D " << s.head_dim << " group "
                               << s.n_q_heads / s.n_kv_heads << " splits " << splits;
}

}  // namespace

TEST(AttentionDecode, EveryPoolFormatAndHeadDim) {
  double worst = 0;
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::E4M3})
    for (int D : {64, 128, 256, 512})
      for (bool f32s : {false, true}) {
        if (kv != DType::E4M3 && f32s) continue;
        CaseSpec s;
        s.kv = kv;
        s.f32_scales = f32s;
        s.head_dim = D;
        s.n_q_heads = 4;
        s.n_kv_heads = 2;
        s.seq_cells = {37, 1, 16, 50};
        s.dead_rate = 0.2;
        s.seed = static_cast<uint64_t>(D + int(kv) * 7 + f32s);
        const HostCase c = make_case(s);
        const double err = max_rel_err(run_op(c, Device::cpu()), reference(c));
        worst = std::max(worst, err);
        EXPECT_LE(err, tolerance(s)) << dtype_name(kv) << " D " << D << " f32 scales " << f32s;
      }
  std::printf("[attention] decode, all pool formats: worst relative error %.3g\n", worst);
}

TEST(AttentionDecode, GqaGroupsAndMqa) {
  for (int g : {1, 4, 8, 6}) {
    CaseSpec s;
    s.n_kv_heads = g == 6 ? 1 : 2;
    s.n_q_heads = g * s.n_kv_heads;
    s.head_dim = 128;
    s.seq_cells = {65, 33, 7};
    s.dead_rate = 0.1;
    s.seed = 100 + g;
    check(s);
  }
}

TEST(AttentionDecode, SplitKMatchesOneSplit) {
  CaseSpec s;
  s.seq_cells = {300, 17, 129};
  s.dead_rate = 0.15;
  s.sinks = true;
  const HostCase c = make_case(s);
  const auto one = run_op(c, Device::cpu(), 1);
  const auto ref = reference(c);
  EXPECT_LE(max_rel_err(one, ref), 2e-5);
  for (int splits : {2, 3, 7, 40}) EXPECT_LE(max_rel_err(run_op(c, Device::cpu(), splits), ref), 2e-5) << splits;
}

TEST(AttentionDecode, SharedBlocksAfterForkDeadCellsWindowSinks) {
  CaseSpec s;
  s.seq_cells = {70, 90, 64};
  s.shared_blocks = 3;
  s.dead_rate = 0.25;
  s.window = 23;
  s.sinks = true;
  s.seed = 7;
  check(s, 3);
  s.block_size = 1;
  s.seed = 8;
  check(s);
  s.block_size = 32;
  s.window = 1;
  check(s);
}

TEST(AttentionDecode, RopeOnReadEveryLayout) {
  for (uint64_t seed : {1, 2, 3, 4}) {  // NeoX/interleaved x head/tail slice (see make_case)
    for (int D : {64, 128}) {
      CaseSpec s;
      s.head_dim = D;
      s.seq_cells = {45, 80};
      s.dead_rate = 0.2;
      s.rope_on_read = true;
      s.window = seed == 4 ? 30 : 0;
      s.seed = seed;
      check(s);
    }
    CaseSpec s;  // partial rotation in no whole 8-dim chunks, FP8 pages
    s.kv = DType::E4M3;
    s.rope_dims = 24;
    s.seq_cells = {45, 80};
    s.rope_on_read = true;
    s.seed = seed;
    check(s);
  }
}

TEST(AttentionDecode, QueryAndOutputDtypes) {
  for (DType q : {DType::F16, DType::BF16})
    for (DType o : {DType::F32, DType::F16, DType::BF16}) {
      CaseSpec s;
      s.q = q;
      s.out = o;
      s.kv = DType::BF16;
      s.seq_cells = {20, 40};
      check(s);
    }
}

TEST(AttentionDecode, SequencesWithNoLiveKeyGiveZeros) {
  CaseSpec s;
  s.seq_cells = {0, 5, 30};
  s.dead_rate = 1.0;  // everything dead
  s.sinks = true;
  const HostCase c = make_case(s);
  for (float x : run_op(c, Device::cpu(), 2)) EXPECT_EQ(x, 0.0f);
}

TEST(AttentionPrefill, CausalChunkAgainstPrefixAndItself) {
  for (DType kv : {DType::F16, DType::E4M3}) {
    CaseSpec s;
    s.kv = kv;
    s.head_dim = 128;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {40, 19, 33};
    s.q_tokens = {9, 19, 1};
    s.dead_rate = 0.1;
    s.sinks = true;
    s.seed = 11 + int(kv);
    check(s);
    s.window = 8;
    s.rope_on_read = true;
    s.seed = 12;
    check(s, 2);
  }
}

// Cells that store position + a per-sequence offset, read with table.pos_offset, give the
// same attention as materialized positions: rope on read, window, causal prefill, forks.
TEST(AttentionDecode, PositionOffsetsActLikeMaterializedPositions) {
  for (int variant = 0; variant < 4; ++variant) {
    CaseSpec s = pos_offset_case(variant, {45, 80, 17});
    s.head_dim = 64;
    check(s);
  }
}

TEST(AttentionDecode, PositionOffsetOfTheWrongShapeThrows) {
  CaseSpec s;
  s.seq_cells = {20, 30};
  s.pos_offsets = true;
  const HostCase c = make_case(s);
  DeviceCase g;
  make_device_case(c, Device::cpu(), g);
  std::vector<float> out(static_cast<size_t>(c.rows) * s.n_q_heads * s.head_dim, 42.0f);
  const TensorRef o(out.data(), DType::F32, Device::cpu(), {c.rows, s.n_q_heads, s.head_dim});
  std::vector<int32_t> three{0, 0, 0};
  g.step.table.pos_offset = TensorRef(three.data(), DType::I32, Device::cpu(), {3});
  try {
    g.run(o);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pos_offset"), std::string::npos) << e.what();
  }
  EXPECT_EQ(out, std::vector<float>(out.size(), 42.0f));
}
