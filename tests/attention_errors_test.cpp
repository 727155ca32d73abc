// Bad arguments to paged attention, at planning and at run: kvcore::Error naming the value,
// output untouched.
#include <gtest/gtest.h>

#include <functional>

#include "attention_test_util.hpp"

using namespace attn_test;

namespace {

struct Fixture {
  HostCase c;
  DeviceCase g;
  Buffer out;
  TensorRef o;
  Fixture() {
    CaseSpec s;
    s.seq_cells = {30, 40};
    s.kv = DType::E4M3;
    c = make_case(s);
    make_device_case(c, Device::cpu(), g);
    out = Buffer(static_cast<size_t>(c.rows) * s.n_q_heads * s.head_dim * 4, Device::cpu());
    std::fill(out.as<float>(), out.as<float>() + out.size() / 4, 42.0f);
    o = TensorRef(out.data(), DType::F32, Device::cpu(), {c.rows, s.n_q_heads, s.head_dim});
  }
  void expect_call(const std::function<void()>& call, const char* needle) {
    try {
      call();
      ADD_FAILURE() << "no throw, expected " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << " / wanted: " << needle;
    }
    for (size_t i = 0; i < out.size() / 4; ++i) ASSERT_EQ(out.as<float>()[i], 42.0f);
  }
  // Plan with these arguments and run the fixture's q into o.
  void expect(const PagedKV& kv, const AttentionStep& step, const AttentionSchedule& sched, const AttentionLayer& layer,
              const char* needle) {
    expect_call([&] { AttentionPlan::decode(kv, 8, step, sched).run(g.q_ref, kv, o, layer); }, needle);
  }
  void expect(const PagedKV& kv, const char* needle) { expect(kv, g.step, g.sched, g.layer, needle); }
  void expect(const AttentionStep& step, const char* needle) { expect(g.kv, step, g.sched, g.layer, needle); }
  void expect(const AttentionSchedule& sched, const char* needle) { expect(g.kv, g.step, sched, g.layer, needle); }
  void expect(const AttentionLayer& layer, const char* needle) { expect(g.kv, g.step, g.sched, layer, needle); }
};

}  // namespace

TEST(AttentionErrors, TablesOutOfRange) {
  Fixture f;
  f.g.indices.as<int32_t>()[2] = f.c.num_blocks;
  f.expect(f.g.step, "table.indices[2]");
  f.g.indices.as<int32_t>()[2] = -1;
  f.expect(f.g.step, "= -1");
  f.g.indices.as<int32_t>()[2] = 0;
  f.g.lpl.as<int32_t>()[1] = 17;
  f.expect(f.g.step, "last_page_len[1] = 17");
  f.g.lpl.as<int32_t>()[1] = 8;
  f.g.indptr.as<int32_t>()[1] = 99;
  f.expect(f.g.step, "indptr");
}

TEST(AttentionErrors, RunShapesAgainstThePlan) {
  Fixture f;
  const AttentionPlan plan = f.g.plan();
  Buffer ob(2 * 16 * 64 * 4, Device::cpu());
  // q rows != the plan's rows; head_dim or heads off the plan
  TensorRef q1(f.g.q.data(), DType::F32, Device::cpu(), {1, 8, 64}), o1(ob.data(), DType::F32, Device::cpu(), {1, 8, 64});
  f.expect_call([&] { plan.run(q1, f.g.kv, f.o); }, "q must be f32, f16 or bf16 [n_rows = 2, n_q_heads = 8, head_dim = 64]");
  TensorRef q2(f.g.q.data(), DType::F32, Device::cpu(), {2, 16, 32});
  f.expect_call([&] { plan.run(q2, f.g.kv, f.o); }, "got f32[2, 16, 32]");
  f.expect_call([&] { plan.run(f.g.q_ref, f.g.kv, o1); }, "out must be");
  TensorRef qi(f.g.q.data(), DType::I32, Device::cpu(), {2, 8, 64});
  f.expect_call([&] { plan.run(qi, f.g.kv, f.o); }, "got i32");
  // layer semantics
  AttentionLayer l = f.g.layer;
  l.maybe_sinks = TensorRef(f.g.q.data(), DType::F32, Device::cpu(), {5});
  f.expect_call([&] { plan.run(f.g.q_ref, f.g.kv, f.o, l); }, "layer.maybe_sinks must be contiguous f32 [n_q_heads = 8]");
  l = f.g.layer;
  l.window = -3;
  f.expect_call([&] { plan.run(f.g.q_ref, f.g.kv, f.o, l); }, "layer.window must be >= 0, got -3");
  l = f.g.layer;
  l.softmax_scale = -1;
  f.expect_call([&] { plan.run(f.g.q_ref, f.g.kv, f.o, l); }, "layer.softmax_scale must be finite and > 0");
  l.softmax_scale = std::nanf("");
  f.expect_call([&] { plan.run(f.g.q_ref, f.g.kv, f.o, l); }, "layer.softmax_scale");
}

// Pages of another shape, format or RoPE mode than the plan's are refused by name.
TEST(AttentionErrors, PagesThatDoNotMatchThePlan) {
  Fixture f;
  const AttentionPlan plan = f.g.plan();
  PagedKV kv = f.g.kv;
  kv.k_scale = TensorRef();
  f.expect_call([&] { plan.run(f.g.q_ref, kv, f.o); }, "pages.k_scale is empty but the plan was made for ue8m0");
  kv = f.g.kv;
  kv.k = TensorRef(f.g.k.data(), DType::E4M3, Device::cpu(), {f.g.kv.k.size(0) / 2, 16, 2, 64});
  f.expect_call([&] { plan.run(f.g.q_ref, kv, f.o); }, "pages.k is e4m3[");
  kv = f.g.kv;
  kv.valid = TensorRef();
  f.expect_call([&] { plan.run(f.g.q_ref, kv, f.o); }, "pages.valid is empty");
  kv = f.g.kv;
  const math::RopeTable t = make_rope_table(f.c.rope, 64);
  kv.rope_mode = RopeMode::RopeOnRead;
  kv.maybe_rope = &t;
  f.expect_call([&] { plan.run(f.g.q_ref, kv, f.o); }, "pages.rope_mode is RopeOnRead but the plan was made for RopeStored");
  // A moved-from plan is refused, not dereferenced.
  AttentionPlan moved = f.g.plan();
  AttentionPlan taker = std::move(moved);
  f.expect_call([&] { moved.run(f.g.q_ref, f.g.kv, f.o); }, "moved from");  // NOLINT(bugprone-use-after-move)
}

TEST(AttentionErrors, PlanArguments) {
  Fixture f;
  AttentionLayer l = f.g.layer;
  l.window = 4;
  AttentionStep st = f.g.step;
  st.q_positions = TensorRef();
  f.expect(f.g.kv, st, f.g.sched, l, "a layer with a window needs step.q_positions");
  PagedKV kv = f.g.kv;
  kv.k_scale = TensorRef();
  f.expect(kv, "need pages.k_scale");
  kv = f.g.kv;
  kv.v = TensorRef(f.g.v.data(), DType::F16, Device::cpu(), {f.g.kv.v.size(0), 16, 2, 32});
  f.expect(kv, "K pages are e4m3 but V pages are f16");
  kv = f.g.kv;
  kv.positions = TensorRef(f.g.pos.data(), DType::F32, Device::cpu(), {f.g.kv.k.size(0), 16});
  f.expect(kv, "pages.positions");
  kv = f.g.kv;
  kv.rope_mode = RopeMode::RopeOnRead;
  f.expect(kv, "RopeOnRead pages need pages.maybe_rope");
  math::RopeTable bad = make_rope_table(f.c.rope, 64);
  bad.layout.n_rot = 66;
  kv.maybe_rope = &bad;
  f.expect(kv, "which is no even range inside head_dim = 64");
  kv.rope_mode = static_cast<RopeMode>(7);
  f.expect(kv, "pages.rope_mode must be RopeStored or RopeOnRead, got 7");
  st = f.g.step;
  st.table.indptr = TensorRef(f.g.indptr.data(), DType::I32, Device::cpu(), {1});
  f.expect(st, "batch + 1 >= 2");  // empty batch
  st = f.g.step;
  st.qo_indptr = f.g.step.table.indptr;
  f.expect(st, "step.qo_indptr is for prefill");
  AttentionSchedule sc = f.g.sched;
  Buffer small(16, Device::cpu());
  sc.maybe_workspace = TensorRef(small.data(), DType::U8, Device::cpu(), {16});
  sc.num_splits = 4;
  f.expect(sc, "maybe_workspace holds 16 bytes");
  sc = f.g.sched;
  sc.num_splits = -1;
  f.expect(sc, "num_splits must be in [0, 1024], got -1");
  sc.num_splits = 0;
  sc.max_seq_cells = -5;
  f.expect(sc, "max_seq_cells must be >= 0, got -5");
  f.expect_call([&] { (void)AttentionPlan::decode(f.g.kv, 3, f.g.step); }, "n_q_heads = 3 must be a multiple of n_kv_heads = 2");
  f.expect_call([&] { (void)AttentionPlan::decode(f.g.kv, 0, f.g.step); }, "n_q_heads must be >= 1, got 0");
  ops::AttentionTuning tu;
  tu.kernel = static_cast<ops::AttentionKernel>(11);
  f.expect_call([&] { (void)ops::attn::plan_paged(false, f.g.kv, 8, f.g.step, f.g.sched, tu); },
                "tuning.kernel must be 0 to 10, got 11");
}

// Head dims and formats outside the shared rule (attention_support.hpp) are refused by the plan.
TEST(AttentionErrors, PagesAttentionCannotRead) {
  Fixture f;
  PagedKV kv = f.g.kv;
  kv.k = TensorRef(f.g.k.data(), DType::E4M3, Device::cpu(), {f.g.kv.k.size(0), 16, 1, 128});
  kv.v = kv.k;
  f.expect(kv, "pages.k_scale.shape[2] must be 1");  // pools of another shape than their scales
  kv = f.g.kv;
  kv.k = TensorRef(f.g.k.data(), DType::F16, Device::cpu(), {f.g.kv.k.size(0), 16, 2, 32});
  kv.v = TensorRef(f.g.v.data(), DType::F16, Device::cpu(), {f.g.kv.k.size(0), 16, 2, 32});
  kv.k_scale = kv.v_scale = TensorRef();
  f.expect(kv, "head_dim 32 has no attention kernel");
  kv.v = TensorRef(f.g.v.data(), DType::F16, Device::cpu(), {f.g.kv.k.size(0), 16, 2, 64});
  kv.k = TensorRef(f.g.k.data(), DType::F16, Device::cpu(), {f.g.kv.k.size(0), 16, 2, 64});
  kv.v = TensorRef(f.g.v.data(), DType::F16, Device::cpu(), {f.g.kv.k.size(0) / 2, 16, 2, 128});
  f.expect(kv, "v_head_dim 128 differs from head_dim 64");
}

// The workspace size needs a split count (0 is not a count) and refuses sizes that overflow.
TEST(AttentionErrors, WorkspaceBytesNeedsASplitCount) {
  EXPECT_EQ(attention_workspace_bytes(3, 8, 64, 2), size_t{3 * 8 * 2 * (64 + 1)} * 4);
  try {
    (void)attention_workspace_bytes(3, 8, 64, 0);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_splits must be >= 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)attention_workspace_bytes(int64_t{1} << 40, int64_t{1} << 20, 512, 1024), Error);
}
