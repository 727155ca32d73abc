// CUDA paged attention (decode and prefill) against the CPU op and the
// float64 reference, on fresh random pages of awkward sizes; every case runs the
// automatic kernel (the tensor-core one for head_dim 64/128 with 16-bit or FP8 pages),
// both SIMT kernels and, for prefill, the tensor-core prefill kernel whatever the size.
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

TEST(AttnCuda, DecodeEveryFormatHeadDimAndGroup) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  int n = 0;
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::E4M3})
    for (int D : {64, 128, 256, 512})
      for (int group : {1, 4, 8}) {
        CaseSpec s;
        s.kv = kv;
        s.f32_scales = kv == DType::E4M3 && (D + group) % 3 == 0;
        s.head_dim = D;
        s.n_kv_heads = 2;
        s.n_q_heads = 2 * group;
        s.seq_cells = {1, 37, 300, 129};
        s.dead_rate = 0.2;
        s.seed = 1000 + n++;
        check_case(s);
      }
  std::printf("[attn cuda] decode formats: worst relative error vs float64 %.3g\n", worst_seen);
}

// Pages read without positions, valid flags or masks take the lean kernel (its checks
// compiled out); group 16 uses 16 columns.
TEST(AttnCuda, LeanPathEveryFormat) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  int n = 0;
  for (DType kv : {DType::F16, DType::BF16, DType::E4M3})
    for (int D : {64, 128})
      for (int group : {1, 4, 8, 16}) {
        CaseSpec s;
        s.kv = kv;
        s.head_dim = D;
        s.n_kv_heads = 2;
        s.n_q_heads = 2 * group;
        s.seq_cells = {1, 37, 300, 2100};
        s.bare = true;
        s.sinks = group == 4;
        s.seed = 5000 + n++;
        worst_seen = 0;
        check_case(s);
        const std::string name(dtype_name(kv));
        std::printf("[attn cuda] lean %s D %d group %d: worst relative error vs float64 %.3g\n", name.c_str(), D, group,
                    worst_seen);
      }
}

TEST(AttnCuda, OddGroupsChunkedHeads) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  struct G {
    int D, q, kv;
  };
  for (G g : {G{128, 6, 1}, G{128, 24, 2}, G{256, 3, 1}, G{512, 2, 1}, G{512, 5, 1}, G{64, 32, 1}, G{128, 2, 1}}) {
    CaseSpec s;
    s.head_dim = g.D;
    s.n_q_heads = g.q;
    s.n_kv_heads = g.kv;
    s.seq_cells = {77, 200};
    s.dead_rate = 0.1;
    s.sinks = true;
    s.seed = 77 + g.q;
    check_case(s, {0, 3});
  }
}

TEST(AttnCuda, ForkWindowSinksDeadCellsBlockSizes) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (int bs : {1, 7, 16, 64}) {
    CaseSpec s;
    s.block_size = bs;
    s.head_dim = 128;
    s.n_q_heads = 32;
    s.n_kv_heads = 8;
    s.seq_cells = {150, 300, 64, 65};
    s.shared_blocks = std::max(1, 64 / bs);
    s.dead_rate = 0.3;
    s.window = 41;
    s.sinks = true;
    s.kv = bs == 7 ? DType::E4M3 : DType::F16;
    s.seed = 300 + bs;
    check_case(s);
  }
}

TEST(AttnCuda, RopeOnReadEveryLayout) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (uint64_t seed : {1, 2, 3, 4, 5, 6})
    for (int D : {64, 128, 512}) {
      CaseSpec s;
      s.head_dim = D;
      s.n_q_heads = D == 512 ? 2 : 8;
      s.n_kv_heads = D == 512 ? 1 : 2;
      // FP8 pages (both scale layouts) rotate in the tensor-core kernel since session 6
      s.kv = seed >= 5 ? DType::E4M3 : seed == 2 ? DType::F16 : DType::BF16;
      s.f32_scales = seed == 6;
      s.seq_cells = {45, 333};
      s.dead_rate = 0.2;
      s.rope_on_read = true;
      s.window = seed == 4 ? 30 : 0;
      s.seed = seed;
      check_case(s, {0, 2});
    }
}

// Rotated dims that do not fill whole 8-dim chunks (24 of 64): the SIMT kernels rotate them
// (the tensor-core kernel rotates 8 pairs a lane, so it turns such layouts away).
TEST(AttnCuda, RopeOnReadUnalignedLayouts) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (uint64_t seed : {1, 2, 3})
    for (DType kv : {DType::F16, DType::E4M3}) {
      CaseSpec s;
      s.kv = kv;
      s.rope_dims = 24;
      s.seq_cells = {70, 17};
      s.dead_rate = 0.1;
      s.rope_on_read = true;
      s.seed = seed;
      check_case(s, {0, 3});
    }
}

TEST(AttnCuda, QueryAndOutputDtypes) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (DType q : {DType::F32, DType::F16, DType::BF16})
    for (DType o : {DType::F32, DType::F16, DType::BF16}) {
      CaseSpec s;
      s.q = q;
      s.out = o;
      s.seq_cells = {20, 400};
      s.seed = 40 + int(q) * 3 + int(o);
      check_case(s, {0});
    }
}

TEST(AttnCuda, LongContextSplitK) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  CaseSpec s;
  s.head_dim = 128;
  s.n_q_heads = 32;
  s.n_kv_heads = 8;
  s.seq_cells = {20011};
  s.dead_rate = 0.05;
  s.sinks = true;
  s.seed = 5;
  check_case(s, {0, 1, 64, 300});
  s.kv = DType::E4M3;
  s.seq_cells = {9000, 3, 4097};
  check_case(s, {0, 17});
}

// FP8 decode in one 16-warp CTA an SM (src/ops/decode_fat_ctas.hpp: one wave of CTAs with >= 2048
// cells each; here with 1 and 2 splits), warps taking tiles from a shared counter: the general
// kernel (dead cells, window, f32 scales, sinks) and the lean one, groups of 1 to 8.
TEST(AttnCuda, FatCtasFp8) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  int n = 0;
  for (bool general : {true, false})
    for (int D : {64, 128})
      for (int group : {1, 4, 8}) {
        CaseSpec s;
        s.kv = DType::E4M3;
        s.head_dim = D;
        s.n_kv_heads = 2;
        s.n_q_heads = 2 * group;
        s.seq_cells = {5000, 2100, 37, 0};
        s.seed = 900 + n++;
        if (general) {
          s.dead_rate = 0.2;
          s.window = 3000;
          s.f32_scales = group != 4;
          s.sinks = true;
        } else {
          s.bare = true;
        }
        check_case(s, {1, 2});
      }
}

// Batch row 0 guesses its first block ids from the max_seq_cells hint in fat CTAs (FP8, >= 2048
// cells a CTA; attention_mma.cuh): right, too large (other sequences' entries, or past the
// table: not guessed), too small, with and without rows after it; 1 and 2 splits (fat) and the
// automatic count; every result must match the CPU op.
TEST(AttnCuda, GuessedFirstBlocksAnyHint) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  int n = 0;
  for (DType kv : {DType::E4M3, DType::F16})
    for (std::vector<int> cells : {std::vector<int>{9000}, std::vector<int>{4200, 9000}, std::vector<int>{9000, 4200, 17}}) {
      CaseSpec s;
      s.kv = kv;
      s.head_dim = 128;
      s.n_kv_heads = 2;
      s.n_q_heads = 8;
      s.seq_cells = cells;
      s.bare = true;
      s.seed = 1500 + n++;
      const HostCase c = make_case(s);
      const std::vector<float> cpu = run_op(c, Device::cpu());
      DeviceCase g;
      make_device_case(c, Device::cuda(0), g);
      const int64_t n_out = int64_t{c.rows} * s.n_q_heads * s.head_dim;
      Buffer out(n_out * 4, Device::cuda(0));
      const TensorRef o(out.data(), DType::F32, Device::cuda(0), {c.rows, s.n_q_heads, s.head_dim});
      g.sched.check_tables = false;
      for (int64_t hint : {int64_t{cells[0]}, int64_t{cells[0]} + 16, int64_t{cells[0]} - 5, int64_t{20000}, int64_t{1} << 40})
        for (int sp : {0, 1, 2}) {
          g.sched.max_seq_cells = hint;
          g.sched.num_splits = sp;
          g.run(o);
          EXPECT_LE(max_rel_err(out.to_host<float>(), cpu), cuda_tol(s))
              << "kv " << dtype_name(kv) << " rows " << cells.size() << " hint " << hint << " splits " << sp;
        }
    }
}

TEST(AttnCuda, PrefillCausal) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  // group 4: 4 query rows per tensor-core CTA; group 1: 16 rows; group 16: one row.
  struct H {
    int q, kv;
    DType t;
  };
  for (H h : {H{8, 2, DType::F16}, H{8, 2, DType::E4M3}, H{4, 4, DType::BF16}, H{32, 2, DType::F16}}) {
    const DType kv = h.t;
    CaseSpec s;
    s.kv = kv;
    s.head_dim = h.q == 4 ? 64 : 128;
    s.n_q_heads = h.q;
    s.n_kv_heads = h.kv;
    s.seq_cells = {140, 19, 333};
    s.q_tokens = {33, 19, 1};
    s.dead_rate = 0.1;
    s.sinks = true;
    s.seed = 21 + int(kv) + h.q;
    check_case(s, {0, 3});
    s.window = 16;
    s.rope_on_read = true;
    check_case(s, {0});
  }
}

// The tensor-core prefill kernel (attention_prefill.cuh) on chunks of many 16-row blocks:
// q exact in the page type or split (f16 / f32 q), P exact or split (f16 / f32 output), groups
// of 1 to 8 (chunked at 4 heads a CTA), head_dim 64 and 128, dead cells, window, sinks, a
// sequence whose chunk is one row; the automatic choice takes it here for the larger calls.
TEST(AttnCuda, PrefillTensorCoreKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  struct C {
    int q, kv, d;
    DType kv_t, q_t, out_t;
    double dead;
    int window;
    bool sinks;
  };
  for (C c : {C{32, 8, 128, DType::F16, DType::F16, DType::F16, 0.0, 0, false},
              C{32, 8, 128, DType::F16, DType::F32, DType::F32, 0.1, 0, true},
              C{16, 2, 128, DType::BF16, DType::BF16, DType::BF16, 0.0, 100, false},
              C{12, 2, 64, DType::F16, DType::BF16, DType::F32, 0.05, 0, true},
              C{4, 4, 64, DType::BF16, DType::F32, DType::BF16, 0.0, 0, false},
              C{8, 4, 128, DType::F16, DType::F16, DType::F32, 0.2, 37, true}}) {
    CaseSpec s;
    s.kv = c.kv_t;
    s.q = c.q_t;
    s.out = c.out_t;
    s.head_dim = c.d;
    s.n_q_heads = c.q;
    s.n_kv_heads = c.kv;
    s.seq_cells = {700, 290, 61};
    s.q_tokens = {300, 290, 1};
    s.dead_rate = c.dead;
    s.window = c.window;
    s.sinks = c.sinks;
    s.seed = 40 + c.q + c.d;
    check_case(s, {0});
  }
  // Sequences starting on and between 32-row blocks, an empty one, a one-row one: every row
  // belongs to exactly one CTA (row blocks plus a CTA per unaligned sequence start).
  CaseSpec s;
  s.kv = DType::F16;
  s.q = DType::F16;
  s.out = DType::F32;
  s.head_dim = 128;
  s.n_q_heads = 8;
  s.n_kv_heads = 2;
  s.seq_cells = {100, 40, 200, 64, 50, 31};
  s.q_tokens = {0, 32, 33, 64, 1, 31};
  s.dead_rate = 0.05;
  s.seed = 77;
  check_case(s, {0});
}

TEST(AttnCuda, PositionOffsets) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (int variant = 0; variant < 4; ++variant) {
    CaseSpec s = pos_offset_case(variant, {145, 380, 17});
    s.kv = variant == 1 ? DType::E4M3 : DType::F16;
    s.head_dim = 128;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    check_case(s, {0, 3});
  }
}

TEST(AttnCuda, BadInputsThrowAndLeaveOutputUntouched) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  CaseSpec s;
  s.seq_cells = {30, 40};
  const HostCase c = make_case(s);
  DeviceCase g;
  make_device_case(c, Device::cuda(0), g);
  const int64_t n = int64_t{c.rows} * s.n_q_heads * s.head_dim;
  std::vector<float> sentinel(n, 42.0f);
  Buffer out = Buffer::from_host(sentinel, Device::cuda(0));
  TensorRef o(out.data(), DType::F32, Device::cuda(0), {c.rows, s.n_q_heads, s.head_dim});
  // A bad block id, a bad last_page_len, a pool on the wrong device, a bad scale.
  std::vector<int32_t> bad_idx = c.indices;
  bad_idx[1] = c.num_blocks + 5;
  Buffer bi = Buffer::from_host(bad_idx, Device::cuda(0));
  const BlockTable good = g.table();
  g.table().indices = TensorRef(bi.data(), DType::I32, Device::cuda(0), {static_cast<int64_t>(bad_idx.size())});
  try {
    g.run(o);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find(std::to_string(c.num_blocks + 5)), std::string::npos) << e.what();
  }
  g.table() = good;
  AttentionLayer l2 = g.layer;
  l2.softmax_scale = -1.0f;
  EXPECT_THROW(g.plan().run(g.q_ref, g.kv, o, l2), Error);
  PagedKV kv2 = g.kv;
  kv2.k = TensorRef(static_cast<char*>(g.k.data()) + 2, s.kv, Device::cuda(0),
                    {g.kv.k.size(0) - 1, g.kv.k.size(1), g.kv.k.size(2), g.kv.k.size(3)});
  kv2.v = TensorRef(g.v.data(), s.kv, Device::cuda(0), {g.kv.k.size(0) - 1, g.kv.k.size(1), g.kv.k.size(2), g.kv.k.size(3)});
  kv2.positions = TensorRef();
  kv2.valid = TensorRef();
  AttentionSchedule sc3 = g.sched;
  sc3.check_tables = false;
  EXPECT_THROW(ops::attn::plan_paged(false, kv2, s.n_q_heads, g.step, sc3, g.tuning).run(g.q_ref, kv2, o, g.layer),
               Error);  // misaligned pool
  EXPECT_EQ(out.to_host<float>(), sentinel);
}

TEST(AttnCuda, ManySequencesMoreCtasThanTheGpuHolds) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (DType kv : {DType::F16, DType::E4M3}) {
    CaseSpec s;
    s.kv = kv;
    s.head_dim = 128;
    s.n_q_heads = 32;
    s.n_kv_heads = 8;
    std::mt19937 rng(3);
    s.seq_cells.clear();
    for (int b = 0; b < 72; ++b) s.seq_cells.push_back(50 + static_cast<int>(rng() % 350));
    s.dead_rate = 0.05;
    s.sinks = true;
    s.seed = 900 + int(kv);
    check_case(s, {0, 2});
  }
}

// A plan's runs over several layers, captured in a CUDA graph on a stream and replayed, give the
// eager runs' outputs: runs neither synchronize nor allocate (a capture would fail if they did).
TEST(AttnCuda, PlannedRunsCaptureInAGraph) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (DType kv : {DType::F16, DType::E4M3})
    for (bool rope : {false, true}) {
      CaseSpec s;
      s.kv = kv;
      s.head_dim = 128;
      s.n_q_heads = 8;
      s.n_kv_heads = 2;
      s.seq_cells = {3000, 70, 900};
      s.dead_rate = 0.05;
      s.sinks = true;
      s.rope_on_read = rope;
      s.seed = 1700 + int(kv) + rope;
      const HostCase c = make_case(s);
      DeviceCase g;
      make_device_case(c, Device::cuda(0), g);
      g.sched.check_tables = false;  // a trusted table: planning reads nothing on the host either
      g.sched.max_seq_cells = 3000;
      const AttentionPlan plan = g.plan();
      const int64_t n_out = int64_t{c.rows} * s.n_q_heads * s.head_dim;
      constexpr int kLayers = 3;
      std::vector<Buffer> eager, graph;
      for (int l = 0; l < kLayers; ++l) eager.emplace_back(n_out * 4, Device::cuda(0)), graph.emplace_back(n_out * 4, Device::cuda(0));
      auto out = [&](std::vector<Buffer>& v, int l) {
        return TensorRef(v[l].data(), DType::F32, Device::cuda(0), {c.rows, s.n_q_heads, s.head_dim});
      };
      AttentionLayer layer = g.layer;
      for (int l = 0; l < kLayers; ++l) {
        layer.softmax_scale = g.layer.softmax_scale * (1.0f + 0.25f * l);  // layers differ
        plan.run(g.q_ref, g.kv, out(eager, l), layer);
      }
      cudaStream_t st;
      ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
      cudaGraph_t gr;
      ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      for (int l = 0; l < kLayers; ++l) {
        layer.softmax_scale = g.layer.softmax_scale * (1.0f + 0.25f * l);
        plan.run(g.q_ref, g.kv, out(graph, l), layer, Stream::from_native(st));
      }
      ASSERT_EQ(cudaStreamEndCapture(st, &gr), cudaSuccess);
      cudaGraphExec_t ex;
      ASSERT_EQ(cudaGraphInstantiate(&ex, gr, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(ex, st), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      for (int l = 0; l < kLayers; ++l)
        EXPECT_EQ(graph[l].to_host<float>(), eager[l].to_host<float>()) << "layer " << l << " kv " << dtype_name(kv);
      cudaGraphExecDestroy(ex);
      cudaGraphDestroy(gr);
      cudaStreamDestroy(st);
    }
}
