// The Hopper wgmma prefill kernels (prefill_wgmma.cuh, prefill_wgmma_ws.cuh, prefill_wgmma_tma.cuh,
// prefill_wgmma_wide.cuh; kernel variants 5 warp-specialized, 6 synchronous, 7 warp-specialized with
// TMA copies, 8 that in ping-pong, 9 and 10 those with tiles of 128 keys), on compute capability 9.0
// only (skipped elsewhere):
//  - WgmmaPrimitives: one warpgroup's S = Q K^T and O = P V tiles through the kernel's
//    descriptors, swizzled tile layout and register fragments against a float64 product of
//    the same 16-bit inputs (a layout bug gives O(1) errors; f32 accumulation of <= 128
//    exact products stays far below the bound);
//  - Kernels/WgmmaPrefillCuda.*/{Ws,Sync,Tma,TmaPingPong,Wide,WidePingPong}: each forced kernel against the CPU op and the float64 reference on fresh
//    random pages, f16 and bf16, head_dim 64 and 128, groups of 1 to 8 (chunks of 4 heads),
//    rows not a multiple of 16 or 32, several sequences of different lengths (one empty, one
//    of one row), partial pages, dead cells, windows, sinks, position offsets, and a context
//    of 33 tiles of 64 keys (every stage of the ring reused), positions that do not grow with the cells; pages of 8 to 128 cells (the TMA kernels'
//    boxes of a page, of 64 or of 128 cells) and of 12 (they fall back to variant 5 or 6). Tolerances as attn_decode_test.cu: relative
//    to max(1, max |ref|), f16 outputs of f16 pages 1e-3, bf16 pages or outputs 8e-3 (P enters P V in
//    the page type: 2^-9 relative for bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "attention_test_util.hpp"
#include "cuda/attention/prefill_wgmma.hpp"
#include "kvcore/math/half.hpp"

using namespace attn_test;
namespace wg = kvcore::ops::cuda::prefill_wgmma;

namespace {

bool have_sm90() { return cuda_device_count() > 0 && wg::device_is_sm90(0); }

uint16_t to_bits(float x, bool bf16) { return bf16 ? math::f32_to_bf16_bits(x) : math::f32_to_f16_bits(x); }
double from_bits(uint16_t b, bool bf16) { return bf16 ? math::bf16_bits_to_f32(b) : math::f16_bits_to_f32(b); }

// bf16 pages or output: 8 bits of mantissa. With bf16 pages P enters the P V product as bf16 too
// (wgmma takes A and B of one type), so a f16 output of bf16 pages gets the bf16 bound.
double tol(DType kv, DType out) { return kv == DType::BF16 || out == DType::BF16 ? 8e-3 : 1e-3; }

// A forced wgmma kernel (5: warp-specialized, 6: synchronous, 7: TMA) on one case, against the
// CPU op and float64; it must have launched.
void check_wgmma(const CaseSpec& s, ops::AttentionKernel k) {
  const HostCase c = make_case(s);
  const std::vector<float> cpu = run_op(c, Device::cpu());
  const std::vector<double> ref = reference(c);
  const int64_t before = wg::launch_count();
  const std::vector<float> gpu = run_op(c, Device::cuda(0), 0, nullptr, static_cast<int>(k));
  EXPECT_EQ(wg::launch_count(), before + 1) << "the forced wgmma kernel did not run";
  const double e_cpu = max_rel_err(gpu, cpu), e_ref = max_rel_err(gpu, ref);
  const std::string what = std::string("variant ") + std::to_string(static_cast<int>(k)) + " kv " +
                           std::string(dtype_name(s.kv)) + " D " + std::to_string(s.head_dim) + " heads " +
                           std::to_string(s.n_q_heads) + "/" + std::to_string(s.n_kv_heads) + " window " +
                           std::to_string(s.window) + " page " + std::to_string(s.block_size);
  EXPECT_LE(e_cpu, tol(s.kv, s.out)) << "vs CPU: " << what;
  EXPECT_LE(e_ref, tol(s.kv, s.out)) << "vs f64: " << what;
  std::printf("[wgmma prefill] %s: error vs f64 %.3g, vs CPU %.3g\n", what.c_str(), e_ref, e_cpu);
}

void formats_groups_and_masks(ops::AttentionKernel k) {
  struct C {
    int q, kv, d;
    DType t, out;
    double dead;
    int window;
    bool sinks;
  };
  for (C c : {C{32, 8, 128, DType::F16, DType::F16, 0.0, 0, false},
              C{32, 8, 128, DType::F16, DType::BF16, 0.1, 0, true},
              C{16, 2, 128, DType::BF16, DType::BF16, 0.0, 100, false},
              C{12, 2, 64, DType::F16, DType::F16, 0.05, 0, true},
              C{4, 4, 64, DType::BF16, DType::F16, 0.2, 37, false},
              C{8, 4, 128, DType::BF16, DType::BF16, 0.2, 37, true}}) {
    CaseSpec s;
    s.kv = c.t;
    s.q = c.t;  // q exact in the page type
    s.out = c.out;
    s.head_dim = c.d;
    s.n_q_heads = c.q;
    s.n_kv_heads = c.kv;
    s.seq_cells = {700, 290, 61};  // partial last pages
    s.q_tokens = {300, 290, 1};    // 591 rows: not a multiple of 16 or 32
    s.dead_rate = c.dead;
    s.window = c.window;
    s.sinks = c.sinks;
    s.seed = 140 + c.q + c.d + int(c.t);
    check_wgmma(s, k);
  }
}

void ragged_sequences(ops::AttentionKernel k) {
  // Sequences starting on and between 32-row blocks, an empty one, a one-row one.
  for (DType t : {DType::F16, DType::BF16})
    for (int d : {64, 128}) {
      CaseSpec s;
      s.kv = s.q = s.out = t;
      s.head_dim = d;
      s.n_q_heads = 8;
      s.n_kv_heads = 2;
      s.seq_cells = {100, 40, 200, 64, 50, 31};
      s.q_tokens = {0, 32, 33, 64, 1, 31};
      s.dead_rate = 0.05;
      s.sinks = true;
      s.seed = 177 + int(t) + d;
      check_wgmma(s, k);
      // stored positions carry a per-sequence offset (table.pos_offset)
      s.pos_offsets = true;
      s.window = 45;
      s.seed += 1;
      check_wgmma(s, k);
    }
}

void long_context(ops::AttentionKernel k) {
  // 2100 keys = 33 tiles of 64 (the 4-stage ring wraps 8 times), a chunk of 1500 rows; f16 at
  // head dim 128, bf16 at 64.
  for (DType t : {DType::F16, DType::BF16}) {
    CaseSpec s;
    s.kv = s.q = s.out = t;
    s.head_dim = t == DType::F16 ? 128 : 64;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {2100, 130};
    s.q_tokens = {1500, 70};
    s.dead_rate = 0.02;
    s.seed = 211 + int(t);
    check_wgmma(s, k);
  }
}

void shuffled_positions(ops::AttentionKernel k) {
  // Positions that do not grow with the cells: keys the rows see lie in every tile, the last
  // included (the wide kernel scans them for the last tile to read), beside dead cells.
  for (int d : {64, 128}) {
    CaseSpec s;
    s.kv = s.q = s.out = DType::F16;
    s.head_dim = d;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {1100, 300};
    s.q_tokens = {700, 20};
    s.dead_rate = 0.05;
    s.shuffled_positions = true;
    s.seed = 400 + d;
    check_wgmma(s, k);
  }
}

void block_sizes(ops::AttentionKernel k) {
  // Pages of 8 (8 boxes a tile), 32, 64, 128 and 256 cells (boxes of a page, of 64 or of 128
  // cells), and 12 (no box fits: the TMA kernels' launchers take variant 5 or 6); partial last
  // pages, dead cells, a sequence of 3 tiles of 64 keys and one of less than a tile.
  for (int bs : {8, 32, 64, 128, 256, 12}) {
    CaseSpec s;
    s.kv = s.q = s.out = DType::F16;
    s.head_dim = bs == 32 ? 64 : 128;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.block_size = bs;
    s.seq_cells = {200, 45};
    s.q_tokens = {120, 45};
    s.dead_rate = 0.05;
    s.sinks = bs == 64;
    s.seed = 300 + bs;
    check_wgmma(s, k);
  }
}

constexpr ops::AttentionKernel kWs = ops::AttentionKernel::WgmmaPrefill, kSync = ops::AttentionKernel::WgmmaPrefillSync,
                               kTma = ops::AttentionKernel::WgmmaPrefillTma,
                               kPingPong = ops::AttentionKernel::WgmmaPrefillTmaPingPong,
                               kWide = ops::AttentionKernel::WgmmaPrefillWide,
                               kWidePingPong = ops::AttentionKernel::WgmmaPrefillWidePingPong;

}  // namespace

TEST(AttnCuda, WgmmaPrimitives) {
  if (!have_sm90()) GTEST_SKIP() << "no compute capability 9.0 GPU";
  for (bool bf16 : {false, true})
    for (int hd : {64, 128}) {
      std::mt19937_64 rng(100 + hd + bf16);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      auto fill = [&](size_t n) {
        std::vector<uint16_t> v(n);
        for (auto& x : v) x = to_bits(u(rng), bf16);
        return v;
      };
      const std::vector<uint16_t> q = fill(64 * hd), k = fill(64 * hd), p = fill(64 * 64), v = fill(64 * hd);
      std::vector<float> s(64 * 64), o(64 * hd);
      wg::selftest_tiles(0, bf16, hd, q.data(), k.data(), p.data(), v.data(), s.data(), o.data());
      double es = 0, eo = 0;
      for (int r = 0; r < 64; ++r) {
        for (int n = 0; n < 64; ++n) {  // s[r][n] = sum_d q[r][d] k[n][d]
          double want = 0;
          for (int d = 0; d < hd; ++d) want += from_bits(q[r * hd + d], bf16) * from_bits(k[n * hd + d], bf16);
          es = std::max(es, std::abs(want - s[r * 64 + n]));
        }
        for (int d = 0; d < hd; ++d) {  // o[r][d] = sum_j p[r][j] v[j][d]
          double want = 0;
          for (int j = 0; j < 64; ++j) want += from_bits(p[r * 64 + j], bf16) * from_bits(v[j * hd + d], bf16);
          eo = std::max(eo, std::abs(want - o[r * hd + d]));
        }
      }
      // Sums of up to 128 products of magnitude <= 1: f32 accumulation error ~1e-5.
      EXPECT_LE(es, 1e-3) << "S = Q K^T, bf16 " << bf16 << " head_dim " << hd;
      EXPECT_LE(eo, 1e-3) << "O = P V, bf16 " << bf16 << " head_dim " << hd;
    }
}

// One test per kernel and group of cases (a fault in one kernel leaves the other's results):
// WgmmaPrefillCuda.<group>/<kernel>.
class WgmmaPrefillCuda : public ::testing::TestWithParam<ops::AttentionKernel> {
 protected:
  void SetUp() override {
    if (!have_sm90()) GTEST_SKIP() << "no compute capability 9.0 GPU";
  }
};
TEST_P(WgmmaPrefillCuda, FormatsGroupsAndMasks) { formats_groups_and_masks(GetParam()); }
TEST_P(WgmmaPrefillCuda, RaggedSequences) { ragged_sequences(GetParam()); }
TEST_P(WgmmaPrefillCuda, LongContext) { long_context(GetParam()); }
TEST_P(WgmmaPrefillCuda, BlockSizes) { block_sizes(GetParam()); }
TEST_P(WgmmaPrefillCuda, ShuffledPositions) { shuffled_positions(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Kernels, WgmmaPrefillCuda, ::testing::Values(kWs, kSync, kTma, kPingPong, kWide, kWidePingPong),
                         [](const ::testing::TestParamInfo<ops::AttentionKernel>& info) {
                           return std::string(info.param == kWs          ? "Ws"
                                              : info.param == kSync      ? "Sync"
                                              : info.param == kTma       ? "Tma"
                                              : info.param == kPingPong  ? "TmaPingPong"
                                              : info.param == kWide      ? "Wide"
                                                                         : "WidePingPong");
                         });
