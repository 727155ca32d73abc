// CUDA paged attention at head dims beyond the powers of two (80, 96, 112, 192: the SIMT
// kernel with rows that do not fill their lanes) and with 576-dim K and 512-dim V (MLA),
// against the CPU op and the float64 reference on fresh random pages; decode and causal
// prefill rows, rope on read, GQA groups, split-K (the merge at these widths). Every case
// runs the automatic kernel choice at several split counts and both SIMT variants.
// Tolerances: attn_cuda_check.hpp.
#include <gtest/gtest.h>

#include <cstdio>

#include "attn_cuda_check.hpp"

using namespace attn_test;

namespace {

bool have_gpu() { return cuda_device_count() > 0; }

double worst_seen = 0;

void check_case(const CaseSpec& s, const std::vector<int>& splits = {0, 1, 5}) { check_cuda_case(s, splits, worst_seen); }

}  // namespace

TEST(AttnHeadDimsCuda, DecodeEveryNewHeadDimFormatAndGroup) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  worst_seen = 0;
  int n = 0;
  for (int D : {80, 96, 112, 192})
    for (DType kv : {DType::F32, DType::F16, DType::BF16})
      for (int group : {1, 4, 8, 5}) {
        CaseSpec s;
        s.kv = kv;
        s.head_dim = D;
        s.n_kv_heads = 2;
        s.n_q_heads = 2 * group;
        s.seq_cells = {1, 37, 300, 129};
        s.dead_rate = 0.2;
        s.sinks = group == 4;
        s.seed = 7000 + n++;
        check_case(s);
      }
  std::printf("[attn cuda] head dims 80/96/112/192: worst relative error vs float64 %.3g\n", worst_seen);
}

TEST(AttnHeadDimsCuda, Fp8At192BothScaleLayouts) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (bool f32s : {false, true})
    for (int group : {1, 4}) {
      CaseSpec s;
      s.kv = DType::E4M3;
      s.f32_scales = f32s;
      s.head_dim = 192;
      s.n_kv_heads = 2;
      s.n_q_heads = 2 * group;
      s.seq_cells = {77, 200};
      s.dead_rate = 0.1;
      s.seed = 7100 + 2 * f32s + group;
      check_case(s);
    }
}

TEST(AttnHeadDimsCuda, PrefillRopeOnReadWindowHalfOutputs) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  int n = 0;
  for (int D : {80, 96, 112, 192})
    for (uint64_t layout : {1, 2}) {  // NeoX head slice / interleaved tail slice (make_case)
      CaseSpec s;
      s.kv = D == 96 ? DType::BF16 : DType::F16;
      s.q = s.kv;
      s.out = n % 3 == 0 ? DType::F16 : DType::F32;
      s.head_dim = D;
      s.n_q_heads = 8;
      s.n_kv_heads = 2;
      s.seq_cells = {40, 19, 133};
      s.q_tokens = {9, 19, 40};
      s.dead_rate = 0.1;
      s.rope_on_read = layout == 2 || D == 80;
      s.rope_dims = D == 80 ? 0 : D / 2;
      s.window = n % 2 ? 11 : 0;
      s.sinks = n % 4 == 1;
      s.seed = 7200 + layout + 8 * n++;
      check_case(s, {0, 3});
      s.q_tokens.clear();  // the same pages, decode
      check_case(s, {0, 3});
    }
}

// DeepSeek-V2/V3 MLA: one kv head, K 576 (latent + 64 rope dims at the tail), V 512.
TEST(AttnHeadDimsCuda, Mla576KeyWith512Value) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  worst_seen = 0;
  int n = 0;
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::E4M3})
    for (int heads : {16, 5})
      for (bool prefill : {false, true}) {
        CaseSpec s;
        s.kv = kv;
        s.f32_scales = kv == DType::E4M3 && heads == 5;
        s.head_dim = 576;
        s.v_head_dim = 512;
        s.n_q_heads = heads;
        s.n_kv_heads = 1;
        s.seq_cells = {50, 300, 1};
        if (prefill) s.q_tokens = {6, 17, 1};
        s.dead_rate = 0.1;
        s.sinks = prefill;
        s.rope_on_read = kv == DType::BF16 || (kv == DType::E4M3 && !prefill);
        s.rope_dims = 64;
        s.seed = 7302 + 4 * n++;  // seed & 2: the rotated dims are the tail
        check_case(s);
      }
  std::printf("[attn cuda] K 576 / V 512: worst relative error vs float64 %.3g\n", worst_seen);
}
