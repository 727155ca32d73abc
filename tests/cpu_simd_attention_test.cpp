// The SIMD kernel of CPU paged attention on every compiled target this machine
// supports, against the scalar path and the float64 reference.
//
// Tolerance against the scalar path: both paths decode K/V to the same f32
// values and scale q the same way; they differ in the order of the float sums
// (dot products, the weighted sum of values, the softmax denominator) and in
// exp2 (a polynomial within 1e-7 relative of std::exp2), so f32 outputs agree
// to a few ulps of the output's magnitude: max |simd - scalar| <= 4e-6 * max(1,
// max |scalar|) (the cases below reach 9e-7; a 1e-4 relative error in exp2
// alone gives 2e-5). Outputs stored as f16 / bf16 may round to the
// neighbouring value: one ulp of those formats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "attention_test_util.hpp"
#include "cpu/attention_tasks.hpp"
#include "cpu/simd_targets.hpp"
#include "kvcore/math/rope_spec.hpp"

namespace {

using namespace attn_test;
namespace cpu = kvcore::ops::cpu;

double tol_vs_scalar(const CaseSpec& s) {
  if (s.out == DType::BF16) return 8e-3;
  if (s.out == DType::F16) return 1e-3;
  return 4e-6;
}
double tol_vs_reference(const CaseSpec& s) {
  if (s.out == DType::BF16) return 8e-3;
  if (s.out == DType::F16) return 1e-3;
  return s.rope_on_read ? 1e-4 : 2e-5;
}

double g_worst_vs_scalar = 0;  // printed by the last test

// Runs c once on the scalar path and on every target, checking each.
void check_all_targets(const CaseSpec& s, int splits = 0) {
  const HostCase c = make_case(s);
  const std::vector<double> ref = reference(c);
  std::vector<float> scalar;
  {
    cpu::SimdPin pin(cpu::kSimdScalar);
    scalar = run_op(c, Device::cpu(), splits);
  }
  ASSERT_LE(max_rel_err(scalar, ref), tol_vs_reference(s));
  for (const cpu::SimdTarget& t : cpu::simd_targets()) {
    cpu::SimdPin pin(t.bits);
    ASSERT_EQ(cpu::simd_active_name(), t.name);
    const std::vector<float> got = run_op(c, Device::cpu(), splits);
    const std::string what = t.name + " kv " + std::string(dtype_name(s.kv)) + " D " + std::to_string(s.head_dim) + " group " +
                             std::to_string(s.n_q_heads / s.n_kv_heads) + " splits " + std::to_string(splits);
    const double err = max_rel_err(got, scalar);
    if (s.out == DType::F32) g_worst_vs_scalar = std::max(g_worst_vs_scalar, err);
    EXPECT_LE(err, tol_vs_scalar(s)) << what;
    EXPECT_LE(max_rel_err(got, ref), tol_vs_reference(s)) << what;
  }
}

TEST(CpuSimdTargets, ListsTheCompiledTargetsThisCpuRuns) {
  const auto targets = cpu::simd_targets();
  ASSERT_FALSE(targets.empty());
  std::string names;
  for (const auto& t : targets) names += t.name + " ";
  std::printf("[cpu simd] targets: %s(default %s)\n", names.c_str(), cpu::simd_active_name().c_str());
#if defined(__x86_64__)
  // The portable fallback (plain C++ lanes) is always compiled and runnable.
  EXPECT_TRUE(targets.back().name == "EMU128" || targets.back().name == "SCALAR") << targets.back().name;
#endif
  for (size_t i = 1; i < targets.size(); ++i) EXPECT_LT(targets[i - 1].bits, targets[i].bits);  // best first
}

TEST(CpuSimdTargets, PinningAnUnknownTargetIsAnErrorAndChangesNothing) {
  const std::string before = cpu::simd_active_name();
  EXPECT_THROW(cpu::simd_pin(int64_t{1} << 40), kvcore::Error);
  EXPECT_EQ(cpu::simd_active_name(), before);
  {
    cpu::SimdPin pin(cpu::kSimdScalar);
    EXPECT_FALSE(cpu::simd_on());
    EXPECT_EQ(cpu::simd_active_name(), "scalar");
  }
  EXPECT_EQ(cpu::simd_active_name(), before);
}

TEST(CpuSimdAttention, EveryPoolFormatAndHeadDim) {
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::E4M3})
    for (int D : {64, 128, 256, 512})
      for (bool f32s : {false, true}) {
        if (kv != DType::E4M3 && f32s) continue;
        CaseSpec s;
        s.kv = kv;
        s.f32_scales = f32s;
        s.head_dim = D;
        s.n_q_heads = 8;
        s.n_kv_heads = 2;
        s.seq_cells = {37, 1, 16, 70};
        s.dead_rate = 0.2;
        s.seed = static_cast<uint64_t>(D + int(kv) * 7 + f32s);
        check_all_targets(s);
      }
}

TEST(CpuSimdAttention, GqaGroupsOneToSixteen) {
  for (int g : {1, 2, 3, 4, 5, 7, 8, 12, 16}) {
    for (DType kv : {DType::F16, DType::E4M3}) {
      CaseSpec s;
      s.kv = kv;
      s.n_kv_heads = g > 8 ? 1 : 2;
      s.n_q_heads = g * s.n_kv_heads;
      s.head_dim = 128;
      s.seq_cells = {65, 33, 7};
      s.dead_rate = 0.1;
      s.seed = 100 + g;
      check_all_targets(s);
    }
  }
}

TEST(CpuSimdAttention, RopeOnReadSinksWindowSplitsHalfOutputs) {
  for (int variant = 0; variant < 6; ++variant) {
    CaseSpec s;
    s.kv = variant % 2 ? DType::BF16 : DType::E4M3;
    s.head_dim = variant < 3 ? 128 : 64;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {300, 17, 129};
    s.dead_rate = 0.15;
    s.sinks = variant != 1;
    s.window = variant == 2 || variant == 5 ? 40 : 0;
    s.rope_on_read = variant >= 1 && variant <= 4;
    s.q = variant == 4 ? DType::BF16 : DType::F32;
    s.out = variant == 5 ? DType::F16 : DType::F32;
    s.seed = 200 + static_cast<uint64_t>(variant);
    check_all_targets(s, variant % 3 + 1);
  }
}

TEST(CpuSimdAttention, PrefillCausal) {
  for (DType kv : {DType::F16, DType::E4M3}) {
    CaseSpec s;
    s.kv = kv;
    s.head_dim = 128;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {90, 40};
    s.q_tokens = {33, 40};
    s.sinks = true;
    s.seed = 300 + static_cast<uint64_t>(kv);
    check_all_targets(s);
  }
}

// Prefill blocks: the SIMD kernel takes up to kSimdPrefillRows query rows of one
// sequence per task. Row counts below, at and above the block size (blocks that end
// inside a sequence and at its end), causal masks, windows narrower than a chunk (the
// rows of a block see different window edges, so their tiles part ways), sinks, rope
// on read, position offsets, dead cells, GQA groups 1-8, every pool format and splits.
TEST(CpuSimdAttention, PrefillRowBlocksMasksWindowsRope) {
  const DType kinds[] = {DType::F16, DType::BF16, DType::E4M3, DType::F32};
  const int groups[] = {4, 1, 3, 8};
  const int R = cpu::kSimdPrefillRows;
  for (int variant = 0; variant < 8; ++variant) {
    CaseSpec s;
    s.kv = kinds[variant % 4];
    s.head_dim = variant % 3 == 2 ? 64 : 128;
    s.n_kv_heads = 2;
    s.n_q_heads = 2 * groups[(variant + variant / 4) % 4];
    s.seq_cells = {90, 41, 2 * R + 3};
    s.q_tokens = {R - 1 + variant % 3, 2 * R + 1, R};
    s.dead_rate = 0.1;
    s.sinks = variant % 2 == 0;
    s.window = variant % 4 == 1 ? 6 : variant % 4 == 3 ? 37 : 0;
    s.rope_on_read = variant >= 4;
    s.pos_offsets = variant == 5 || variant == 6;
    s.seed = 700 + static_cast<uint64_t>(variant);
    check_all_targets(s, variant % 3 + 1);
  }
}

// A NaN in the V row of a cell only the later rows of a prefill block see (the chunk's
// last token: causal) reaches exactly the outputs the scalar path makes NaN: the rows
// that do not see the cell stay finite (the block shares no masked cell with them).
TEST(CpuSimdAttention, PrefillMaskedNanStaysOutOfEarlierRows) {
  for (DType kv : {DType::E4M3, DType::F16}) {
    CaseSpec s;
    s.kv = kv;
    s.head_dim = 128;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {50};
    s.q_tokens = {2 * cpu::kSimdPrefillRows};
    s.seed = 800 + static_cast<uint64_t>(kv);
    HostCase c = make_case(s);
    const int bs = s.block_size, D = s.head_dim;
    const int64_t cell = int64_t{c.indices[c.indptr[0] + 49 / bs]} * bs + 49 % bs;  // the last token's cell
    ASSERT_TRUE(c.valid[cell]);
    if (kv == DType::E4M3) c.v[c.row_of(cell, 1) * D + 17] = 0x7f;
    else reinterpret_cast<uint16_t*>(c.v.data())[c.row_of(cell, 1) * D + 17] = 0x7e00;  // f16 NaN
    std::vector<float> scalar;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      scalar = run_op(c, Device::cpu(), 1);
    }
    int nan_outputs = 0;
    for (float x : scalar) nan_outputs += std::isnan(x) ? 1 : 0;
    EXPECT_GT(nan_outputs, 0);
    EXPECT_LT(nan_outputs, static_cast<int>(scalar.size()) / 8);  // the last row's kv head 1 only
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      const std::vector<float> got = run_op(c, Device::cpu(), 1);
      ASSERT_EQ(got.size(), scalar.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::isnan(got[i]), std::isnan(scalar[i])) << t.name << " output " << i;
        if (!std::isnan(scalar[i])) {
          EXPECT_NEAR(got[i], scalar[i], tol_vs_scalar(s) * 4) << t.name << " output " << i;
        }
      }
    }
  }
}

// E4M3 pages: every code (subnormals and 448 included) against the scalar path, and
// NaN codes (0x7f / 0xff, which send a tile to the NaN-aware decode) in two live V
// rows: NaN exactly in the outputs the scalar path makes NaN. (A NaN code in a K row
// gives a NaN score, whose weight neither path defines: exp2 of NaN.) Variant 3 has
// groups of 16, whose tiles are decoded to f32 once.
TEST(CpuSimdAttention, E4m3EveryCodeAndNanCodes) {
  for (int variant = 0; variant < 4; ++variant) {
    CaseSpec s;
    s.kv = DType::E4M3;
    s.head_dim = variant == 2 ? 64 : 128;
    s.n_q_heads = variant == 3 ? 32 : 8;
    s.n_kv_heads = 2;
    s.seq_cells = {70, 33, 5};
    s.dead_rate = 0.1;
    s.rope_on_read = variant == 1;
    s.seed = 500 + static_cast<uint64_t>(variant % 3);  // variant 3: the pages of variant 0
    HostCase c = make_case(s);
    std::mt19937_64 rng(s.seed);
    const int64_t n = static_cast<int64_t>(c.k.size());
    for (int64_t i = 0; i < n; ++i) {  // live rows: any code but NaN
      if ((c.k[i] & 0x7f) == 0x7f) continue;
      c.k[i] = static_cast<uint8_t>(rng() % 0x7f | (rng() & 0x80));
      c.v[i] = static_cast<uint8_t>(rng() % 0x7f | (rng() & 0x80));
    }
    if (variant != 2) {  // a NaN code in a live V row of sequence 0 (kv head 1) and of sequence 1 (kv head 0)
      const int bs = s.block_size, D = s.head_dim;
      const int64_t cell0 = int64_t{c.indices[c.indptr[0] + 9 / bs]} * bs + 9 % bs;
      const int64_t cell1 = int64_t{c.indices[c.indptr[1] + 20 / bs]} * bs + 20 % bs;
      ASSERT_TRUE(c.valid[cell0] && c.valid[cell1]);
      c.v[c.row_of(cell0, 1) * D + 37] = 0x7f;
      c.v[c.row_of(cell1, 0) * D + 5] = 0xff;
    }
    std::vector<float> scalar;
    {
      cpu::SimdPin pin(cpu::kSimdScalar);
      scalar = run_op(c, Device::cpu(), 2);
    }
    int nan_outputs = 0;
    double mag = 1;
    for (float x : scalar) {
      if (std::isnan(x)) ++nan_outputs;
      else mag = std::max(mag, double(std::abs(x)));
    }
    if (variant != 2) EXPECT_GT(nan_outputs, 0);
    else EXPECT_EQ(nan_outputs, 0);
    for (const cpu::SimdTarget& t : cpu::simd_targets()) {
      cpu::SimdPin pin(t.bits);
      const std::vector<float> got = run_op(c, Device::cpu(), 2);
      ASSERT_EQ(got.size(), scalar.size());
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::isnan(got[i]), std::isnan(scalar[i])) << t.name << " variant " << variant << " output " << i;
        if (!std::isnan(scalar[i])) err = std::max(err, std::abs(double(got[i]) - double(scalar[i])));
      }
      EXPECT_LE(err / mag, tol_vs_scalar(s)) << t.name << " variant " << variant;
    }
  }
}

// Head dims the public rule does not admit yet (multiples of 8 from 8 up,
// DeepSeek MLA's 576, V rows of another width than K's): the kernel through its
// Params, against the scalar path and the float64 reference. v_in_k: V is read
// as a view of K's rows (their first v_head_dim dims and, e4m3, K's scales; MLA's
// shared layout), the case's own V pool unread (with_v_from_k_latent below makes
// it the same values for the reference).
std::vector<float> run_params(const HostCase& c, int splits, bool v_in_k = false) {
  const CaseSpec& s = c.spec;
  const int D = s.head_dim, DV = s.dv();
  ops::PagedAttentionParams p{};
  p.k = c.k.data();
  p.v = c.v.data();
  p.kv_elem = c.kv_elem();
  p.scale_mode = s.kv != DType::E4M3 ? math::KvScaleMode::None
                 : s.f32_scales      ? math::KvScaleMode::F32PerRow
                                     : math::KvScaleMode::Ue8m0Per64;
  p.maybe_k_scale_u8 = c.k_sc8.data();
  p.maybe_v_scale_u8 = c.v_sc8.data();
  p.maybe_k_scale_f32 = c.k_sc32.data();
  p.maybe_v_scale_f32 = c.v_sc32.data();
  p.maybe_positions = c.positions.data();
  p.maybe_valid = c.valid.data();
  p.layout = PagedLayout{s.block_size, s.n_kv_heads, D};
  p.v_head_dim = DV;
  p.v_row_stride = DV;  // V in a pool of its own
  p.v_scale_row_stride = DV / 64;
  if (v_in_k) {
    p.v = c.k.data();
    p.v_row_stride = D;
    p.maybe_v_scale_u8 = c.k_sc8.data();
    p.v_scale_row_stride = D / 64;
    p.maybe_v_scale_f32 = c.k_sc32.data();
  }
  p.num_blocks = c.num_blocks;
  p.indptr = c.indptr.data();
  p.indices = c.indices.data();
  p.n_indices = static_cast<int64_t>(c.indices.size());
  p.last_page_len = c.last_page_len.data();
  p.batch = static_cast<int32_t>(c.last_page_len.size());
  p.q = c.q.data();
  p.q_elem = ops::QElem::F32;
  p.q_head_stride = D;
  p.q_row_stride = int64_t{s.n_q_heads} * D;
  p.n_rows = c.rows;
  p.n_q_heads = s.n_q_heads;
  p.group = s.n_q_heads / s.n_kv_heads;
  p.maybe_q_positions = c.q_positions.data();
  p.maybe_qo_indptr = c.qo_indptr.empty() ? nullptr : c.qo_indptr.data();
  p.causal = c.qo_indptr.empty() ? 0 : 1;
  p.window = s.window;
  p.maybe_sinks = s.sinks ? c.sinks.data() : nullptr;
  p.softmax_scale = c.softmax_scale;
  p.rope_on_read = s.rope_on_read;
  p.rotate_query = s.rope_on_read;  // the ops rotate q with K (the reference does)
  if (s.rope_on_read) p.rope = make_rope_table(c.rope, D);
  std::vector<float> out(static_cast<size_t>(c.rows) * s.n_q_heads * DV);
  std::vector<float> part(static_cast<size_t>(c.rows) * s.n_q_heads * splits * (DV + 1));
  p.out = out.data();
  p.out_elem = ops::QElem::F32;
  p.out_head_stride = DV;
  p.out_row_stride = int64_t{s.n_q_heads} * DV;
  p.num_splits = splits;
  p.o_part = part.data();
  p.lse_part = part.data() + static_cast<size_t>(c.rows) * s.n_q_heads * splits * DV;
  if (cpu::simd_on()) {
    EXPECT_TRUE(cpu::attention_simd_serves(p)) << "the SIMD kernel must take this case";
  }
  ops::cpu::attention_paged(p);
  return out;
}

// The case with V made the first v_head_dim dims of each K row (and, e4m3, V's scales
// K's first v_head_dim / 64 scale bytes or K's row scale): what a view of K's rows reads.
HostCase with_v_from_k_latent(HostCase c) {
  const CaseSpec& s = c.spec;
  const int64_t D = s.head_dim, DV = s.dv(), rows = int64_t{c.num_blocks} * s.block_size * s.n_kv_heads;
  const size_t el = c.elem();
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&c.v[r * DV * el], &c.k[r * D * el], DV * el);
  if (s.kv == DType::E4M3) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&c.v_sc8[r * (DV / 64)], &c.k_sc8[r * (D / 64)], DV / 64);
    c.v_sc32 = c.k_sc32;
  }
  return c;
}

// Runs a Params case on the scalar path and every target (V in a pool of its own or a view
// of K's rows), each against the scalar path and the float64 reference.
void check_params_all_targets(const CaseSpec& s, int splits, bool v_in_k) {
  const HostCase c = v_in_k ? with_v_from_k_latent(make_case(s)) : make_case(s);
  const std::vector<double> ref = reference(c);
  std::vector<float> scalar;
  {
    cpu::SimdPin pin(cpu::kSimdScalar);
    scalar = run_params(c, splits, v_in_k);
  }
  const std::string what = std::string(dtype_name(s.kv)) + (s.f32_scales ? " f32 scales" : "") + " D " +
                           std::to_string(s.head_dim) + " DV " + std::to_string(s.dv()) + " heads " +
                           std::to_string(s.n_q_heads) + "/" + std::to_string(s.n_kv_heads) +
                           (v_in_k ? " V in K" : " V own pool") + (s.rope_on_read ? " rope on read" : "") +
                           (s.q_tokens.empty() ? "" : " prefill") + " splits " + std::to_string(splits);
  ASSERT_LE(max_rel_err(scalar, ref), tol_vs_reference(s)) << what;
  for (const cpu::SimdTarget& t : cpu::simd_targets()) {
    cpu::SimdPin pin(t.bits);
    const std::vector<float> got = run_params(c, splits, v_in_k);
    const double err = max_rel_err(got, scalar);
    g_worst_vs_scalar = std::max(g_worst_vs_scalar, err);
    EXPECT_LE(err, tol_vs_scalar(s)) << t.name << " " << what;
    EXPECT_LE(max_rel_err(got, ref), tol_vs_reference(s)) << t.name << " " << what;
  }
}

// DeepSeek MLA decode: K rows of 576 (512 latent + 64 rope dims at the tail), V of 512 in a
// pool of its own or read from K's latent; f16, bf16 and e4m3 (UE8M0 and f32 row scales);
// rope stored and rope on read; one kv head under 16, 128 or 3 query heads and two kv heads
// under 10 each (e4m3 under 16 and 128: the tiles decoded to f32 once);
// partial last pages, dead cells (NaN in the pools, never read), sinks and splits.
TEST(CpuSimdAttention, Mla576KeyWith512ValueOwnPoolOrKeyLatent) {
  const DType kinds[] = {DType::F16, DType::BF16, DType::E4M3, DType::E4M3};
  const int q_heads[] = {16, 128, 3, 10};
  for (int variant = 0; variant < 8; ++variant)
    for (bool v_in_k : {false, true}) {
      CaseSpec s;
      s.kv = kinds[variant % 4];
      s.f32_scales = variant % 4 == 3;
      s.head_dim = 576;
      s.v_head_dim = 512;
      s.n_kv_heads = variant % 4 == 3 ? 2 : 1;
      s.n_q_heads = q_heads[(variant + variant / 4 * 2) % 4] * s.n_kv_heads;
      s.seq_cells = {45, 20, 1};
      s.dead_rate = 0.1;
      s.sinks = variant % 2 == 1;
      s.rope_on_read = variant >= 4;
      s.rope_dims = 64;
      s.seed = 4502 + 4 * static_cast<uint64_t>(variant);  // seed & 2: the rotated dims are K's tail
      check_params_all_targets(s, variant % 3 + 1, v_in_k);
    }
}

// MLA prefill (row blocks of kSimdPrefillRows share each tile): causal masks, a window that
// parts the rows' tiles, both V layouts.
TEST(CpuSimdAttention, MlaPrefillRowBlocksBothValueLayouts) {
  const int R = cpu::kSimdPrefillRows;
  for (int variant = 0; variant < 3; ++variant)
    for (bool v_in_k : {false, true}) {
      CaseSpec s;
      s.kv = variant == 0 ? DType::BF16 : variant == 1 ? DType::E4M3 : DType::F16;
      s.head_dim = 576;
      s.v_head_dim = 512;
      s.n_kv_heads = 1;
      s.n_q_heads = variant == 2 ? 5 : 16;
      s.seq_cells = {40, 2 * R + 3};
      s.q_tokens = {R + 1, 2 * R + 1};
      s.dead_rate = 0.1;
      s.window = variant == 2 ? 9 : 0;
      s.rope_on_read = variant == 1;
      s.rope_dims = 64;
      s.seed = 4602 + 4 * static_cast<uint64_t>(variant);
      check_params_all_targets(s, variant + 1, v_in_k);
    }
}

// V widths other than K's beyond MLA (multiples of 8, narrower and wider than K; a view of K's
// rows where V is narrower): columns of whole vectors, 8-lane tails and UE8M0 chunks.
TEST(CpuSimdAttention, ValueWidthsOtherThanKeyWidth) {
  struct Shape {
    int D, DV;
    DType kv;
  };
  const Shape shapes[] = {{192, 128, DType::BF16}, {72, 24, DType::F16},   {64, 136, DType::F16},
                          {256, 128, DType::E4M3}, {128, 192, DType::E4M3}, {40, 8, DType::F32}};
  int n = 0;
  for (const Shape& sh : shapes)
    for (bool v_in_k : {false, true}) {
      if (v_in_k && sh.DV > sh.D) continue;
      CaseSpec s;
      s.kv = sh.kv;
      s.head_dim = sh.D;
      s.v_head_dim = sh.DV;
      s.n_kv_heads = 2;
      s.n_q_heads = n % 2 ? 6 : 10;
      s.seq_cells = {37, 1, 70};
      s.dead_rate = 0.15;
      s.sinks = n % 2 == 0;
      s.rope_on_read = sh.D == 192;
      s.seed = 4702 + static_cast<uint64_t>(n++);
      check_params_all_targets(s, n % 3 + 1, v_in_k);
    }
}

TEST(CpuSimdAttention, HeadDimsMultiplesOfEightUpTo576) {
  for (int D : {8, 24, 72, 136, 200, 576})
    for (DType kv : {DType::F16, DType::BF16, DType::E4M3}) {
      if (kv == DType::E4M3 && D % 64 != 0) continue;
      CaseSpec s;
      s.kv = kv;
      s.head_dim = D;
      s.n_q_heads = D == 576 ? 16 : 6;
      s.n_kv_heads = D == 576 ? 1 : 2;
      s.seq_cells = {45, 20};
      s.dead_rate = 0.1;
      s.sinks = true;
      s.rope_on_read = D == 72 || D == 576;
      s.rope_dims = D == 576 ? 64 : 0;
      s.seed = 400 + static_cast<uint64_t>(D);
      const HostCase c = make_case(s);
      const std::vector<double> ref = reference(c);
      std::vector<float> scalar;
      {
        cpu::SimdPin pin(cpu::kSimdScalar);
        scalar = run_params(c, 2);
      }
      ASSERT_LE(max_rel_err(scalar, ref), tol_vs_reference(s)) << "D " << D;
      for (const cpu::SimdTarget& t : cpu::simd_targets()) {
        cpu::SimdPin pin(t.bits);
        const std::vector<float> got = run_params(c, 2);
        const double err = max_rel_err(got, scalar);
        g_worst_vs_scalar = std::max(g_worst_vs_scalar, err);
        EXPECT_LE(err, tol_vs_scalar(s)) << t.name << " D " << D << " " << dtype_name(kv);
        EXPECT_LE(max_rel_err(got, ref), tol_vs_reference(s)) << t.name << " D " << D << " " << dtype_name(kv);
      }
    }
  std::printf("[cpu simd] attention: worst relative difference to the scalar path %.3g\n", g_worst_vs_scalar);
}

}  // namespace
