// DeepSeek-V4 sparse decode attention on the CPU against a float64 reference.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "attention_dsv4_util.hpp"
#include "attention_test_util.hpp"

using namespace dsv4_test;

TEST(AttentionDsv4, WindowPlusPicksPlusSinkWithInverseRope) {
  double worst = 0;
  for (bool f16 : {false, true}) {
    Case c;
    c.rows = 2;
    c.heads = 16;  // 64 in the model; 16 keeps the CPU test short
    c.k = 40;
    c.f16_window = f16;
    c.seed = f16 ? 2 : 1;
    fill(c);
    const auto ref = reference(c);
    for (int splits : {1, 5}) {
      const double e = attn_test::max_rel_err(run(c, Device::cpu(), splits), ref);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << "f16 window " << f16 << " splits " << splits;
    }
  }
  std::printf("[attention] dsv4 sparse decode: worst relative error %.3g\n", worst);
}

TEST(AttentionDsv4, WindowOnlyAndNothingVisible) {
  Case c;
  c.rows = 2;
  c.heads = 8;
  c.k = 0;
  c.n_window = 5;
  fill(c);
  c.wlen = {5, 0};
  const auto got = run(c, Device::cpu());
  EXPECT_LE(attn_test::max_rel_err(got, reference(c)), 1e-5);
  for (size_t i = got.size() / 2; i < got.size(); ++i) EXPECT_EQ(got[i], 0.0f);
}

TEST(AttentionDsv4, BadInputsThrowNamingTheValueAndLeaveOutputUntouched) {
  Case c;
  c.rows = 2;
  c.heads = 8;
  c.k = 8;
  c.n_comp = 10;
  fill(c);
  Dev g;
  upload(c, Device::cpu(), g);
  float* o = g.out.as<float>();
  std::fill(o, o + g.out.size() / 4, 7.0f);
  auto expect_error = [&](const Dsv4AttentionLayer& a, const char* needle, const TensorRef* q = nullptr) {
    try {
      Dsv4AttentionPlan::decode(a, c.heads, g.step).run(q ? *q : g.q_ref, a, g.out_ref);
      ADD_FAILURE() << "no throw for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  g.idx.as<int32_t>()[3] = 10;  // one past the last row
  expect_error(g.layer, "comp_idx[0, 3] = 10");
  g.idx.as<int32_t>()[3] = -2;
  expect_error(g.layer, "= -2");
  g.idx.as<int32_t>()[3] = 0;
  g.wlen.as<int32_t>()[1] = 129;
  expect_error(g.layer, "window_len[1] = 129");
  g.wlen.as<int32_t>()[1] = 3;
  Dsv4AttentionLayer a = g.layer;
  a.softmax_scale = -1;
  expect_error(a, "softmax_scale");
  a = g.layer;
  a.maybe_sinks = TensorRef(g.sink.data(), DType::F32, Device::cpu(), {7});
  expect_error(a, "maybe_sinks");
  a = g.layer;
  a.rope = nullptr;
  expect_error(a, "layer.rope is required");
  const TensorRef q256(g.q.data(), DType::F32, Device::cpu(), {c.rows, c.heads, 256});
  expect_error(g.layer, "512] on cpu", &q256);
  // A layer whose window rows differ from the planned ones is refused by name.
  const Dsv4AttentionPlan plan = Dsv4AttentionPlan::decode(g.layer, c.heads, g.step);
  a = g.layer;
  a.window_kv = TensorRef(g.win.data(), DType::F32, Device::cpu(), {c.rows, c.n_window - 1, kD});
  try {
    plan.run(g.q_ref, a, g.out_ref);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("but the plan was made for f32"), std::string::npos) << e.what();
  }
  for (size_t i = 0; i < g.out.size() / 4; ++i) ASSERT_EQ(o[i], 7.0f);
}

// HF transformers 5.17 DeepSeek-V4 attention (eager_attention_forward with sinks, then the
// conjugate rotation of the output tail): tests/fixtures/make_attention_dsv4_fixture.py.
TEST(AttentionDsv4, MatchesHfTransformersFixture) {
  std::ifstream f(std::string(KVCORE_FIXTURE_DIR) + "/attn/dsv4_attention.json");
  ASSERT_TRUE(f.good()) << "missing fixture attn/dsv4_attention.json";
  const nlohmann::json doc = nlohmann::json::parse(f);
  const int H = doc["heads"], D = doc["head_dim"];
  double worst = 0;
  for (const auto& row : doc["rows"]) {
    std::vector<float> q = row["q"].get<std::vector<float>>(), win = row["window"].get<std::vector<float>>(),
                       sinks = row["sinks"].get<std::vector<float>>(), want = row["out"].get<std::vector<float>>();
    std::vector<uint8_t> packed = row["packed"].get<std::vector<uint8_t>>();
    std::vector<int32_t> idx = row["idx"].get<std::vector<int32_t>>();
    std::vector<int32_t> wlen{row["window_len"].get<int32_t>()}, qpos{row["q_position"].get<int32_t>()};
    const int64_t n_window = row["n_window"], n_comp = row["n_comp"], k = static_cast<int64_t>(idx.size());
    Dsv4AttentionLayer a;
    Dsv4AttentionStep st;
    const Device cpu = Device::cpu();
    const TensorRef tq(q.data(), DType::F32, cpu, {1, H, D});
    a.window_kv = TensorRef(win.data(), DType::F32, cpu, {1, n_window, D});
    st.window_len = TensorRef(wlen.data(), DType::I32, cpu, {1});
    a.comp_rows = TensorRef(packed.data(), DType::U8, cpu, {n_comp, 584});
    a.comp_idx = TensorRef(idx.data(), DType::I32, cpu, {1, k});
    a.maybe_sinks = TensorRef(sinks.data(), DType::F32, cpu, {H});
    st.q_positions = TensorRef(qpos.data(), DType::I32, cpu, {1});
    RopeSpec rope = RopeSpec::plain(64, doc["rope_theta"].get<double>(), RopePairing::Interleaved);
    rope.slice = RopeSlice::Tail;
    const math::RopeTable table = make_rope_table(rope, D);
    a.rope = &table;
    a.softmax_scale = doc["softmax_scale"].get<float>();
    std::vector<float> got(want.size());
    Dsv4AttentionPlan::decode(a, H, st).run(tq, a, TensorRef(got.data(), DType::F32, cpu, {1, H, D}));
    worst = std::max(worst, attn_test::max_rel_err(got, want));
  }
  EXPECT_LE(worst, 2e-5);
  std::printf("[attention] dsv4 vs HF transformers fixture: worst relative error %.3g\n", worst);
}

TEST(AttentionDsv4, WindowRingsFromAPoolByIndex) {
  Case c;
  c.rows = 3;
  c.heads = 8;
  c.k = 16;
  fill(c);
  const auto ref = reference(c);
  // Pool of 5 rings; row r's window sits in ring idx[r]; the other rings are NaN.
  const std::vector<int32_t> idx{4, 1, 2};
  std::vector<float> pool = window_ring_pool(c, idx, 5);
  Dev g;
  upload(c, Device::cpu(), g);
  std::vector<int32_t> wi = idx;
  g.layer.window_kv = TensorRef(pool.data(), DType::F32, Device::cpu(), {5, c.n_window, kD});
  g.step.maybe_window_index = TensorRef(wi.data(), DType::I32, Device::cpu(), {c.rows});
  g.run();
  EXPECT_LE(attn_test::max_rel_err(g.out.to_host<float>(), ref), 1e-5);
  wi[1] = 5;
  try {
    g.run();
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window_index[1] = 5"), std::string::npos) << e.what();
  }
}

// One plan serves every layer of a step: two layers with their own window rows, picks and
// sinks run through one plan equal their own float64 references.
TEST(AttentionDsv4, OnePlanServesEveryLayer) {
  Case c0, c1;
  for (Case* c : {&c0, &c1}) {
    c->rows = 2;
    c->heads = 8;
    c->k = 24;
    c->seed = c == &c0 ? 31 : 32;
    fill(*c);
  }
  c1.wlen = c0.wlen;  // step data the layers share
  c1.qpos = c0.qpos;
  Dev g0, g1;
  upload(c0, Device::cpu(), g0);
  upload(c1, Device::cpu(), g1);
  g0.sched.num_splits = 3;
  const Dsv4AttentionPlan plan = Dsv4AttentionPlan::decode(g0.layer, c0.heads, g0.step, g0.sched);
  plan.run(g0.q_ref, g0.layer, g0.out_ref);
  plan.run(g1.q_ref, g1.layer, g1.out_ref);
  EXPECT_LE(attn_test::max_rel_err(g0.out.to_host<float>(), reference(c0)), 1e-5);
  EXPECT_LE(attn_test::max_rel_err(g1.out.to_host<float>(), reference(c1)), 1e-5);
}
