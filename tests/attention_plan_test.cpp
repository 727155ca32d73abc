// Plan once per step, run per layer: a plan reused over layers equals a fresh plan per layer;
// PagedCache hands attention its pages (RoPE mode and table included) and block tables in
// caller-owned storage; the cache refuses at construction what attention cannot read.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.hpp"
#include "kvcore/cache/paged_cache.hpp"

using namespace attn_test;

namespace {

// Flip the sign of every 16-bit element of a pool (NaN stays NaN): another layer's pages of the
// same shape.
void negate_f16(Buffer& b) {
  uint16_t* p = b.as<uint16_t>();
  for (size_t i = 0; i < b.size() / 2; ++i) p[i] ^= 0x8000;
}

std::vector<float> run_into(const AttentionPlan& plan, const DeviceCase& g, const PagedKV& kv, const AttentionLayer& layer,
                            int64_t rows, const CaseSpec& s) {
  std::vector<float> out(static_cast<size_t>(rows) * s.n_q_heads * s.head_dim, 7.0f);
  plan.run(g.q_ref, kv, TensorRef(out.data(), DType::F32, Device::cpu(), {rows, s.n_q_heads, s.head_dim}), layer);
  return out;
}

}  // namespace

// Three layers of one step (other pools, scales, windows, sinks) run through one plan give
// bit for bit what a plan made for each layer gives; layer 0 also matches float64.
TEST(AttentionPlan, ReusedOverLayersEqualsAPlanPerLayer) {
  for (bool prefill : {false, true})
    for (bool rope : {false, true}) {
      CaseSpec s;
      s.kv = DType::F16;
      s.seq_cells = {50, 21, 90};
      s.dead_rate = 0.1;
      s.sinks = true;
      s.rope_on_read = rope;
      if (prefill) s.q_tokens = {7, 1, 12};
      s.seed = 300 + 2 * prefill + rope;
      const HostCase c = make_case(s);
      DeviceCase g;
      make_device_case(c, Device::cpu(), g);
      // Layer 1: K negated; layer 2: K and V negated (same shapes, other values).
      Buffer k1 = Buffer::from_host(c.k, Device::cpu()), v2 = Buffer::from_host(c.v, Device::cpu());
      negate_f16(k1);
      negate_f16(v2);
      PagedKV kv1 = g.kv, kv2 = g.kv;
      kv1.k = TensorRef(k1.data(), DType::F16, Device::cpu(), {g.kv.k.size(0), g.kv.k.size(1), g.kv.k.size(2), g.kv.k.size(3)});
      kv2.k = kv1.k;
      kv2.v = TensorRef(v2.data(), DType::F16, Device::cpu(), {g.kv.k.size(0), g.kv.k.size(1), g.kv.k.size(2), g.kv.k.size(3)});
      const PagedKV layers_kv[3] = {g.kv, kv1, kv2};
      AttentionLayer layers[3] = {g.layer, g.layer, g.layer};
      layers[1].softmax_scale = 0.0f;  // head_dim^-0.5
      layers[1].window = 15;
      layers[2].maybe_sinks = TensorRef();
      layers[2].softmax_scale = 0.2f;
      g.sched.num_splits = 3;
      const AttentionPlan plan = g.plan();
      for (int l = 0; l < 3; ++l) {
        const std::vector<float> reused = run_into(plan, g, layers_kv[l], layers[l], c.rows, s);
        const AttentionPlan fresh = ops::attn::plan_paged(prefill, layers_kv[l], s.n_q_heads, g.step, g.sched, g.tuning);
        EXPECT_EQ(reused, run_into(fresh, g, layers_kv[l], layers[l], c.rows, s)) << "layer " << l;
        if (l == 0) {
          EXPECT_LE(max_rel_err(reused, reference(c)), 1e-4);
        }
      }
    }
}

// softmax_scale 0 is head_dim^-0.5.
TEST(AttentionPlan, DefaultSoftmaxScaleIsHeadDimToTheMinusHalf) {
  for (int D : {64, 128}) {
    CaseSpec s;
    s.head_dim = D;
    s.seq_cells = {33, 60};
    const HostCase c = make_case(s);
    DeviceCase g;
    make_device_case(c, Device::cpu(), g);
    const AttentionPlan plan = g.plan();
    AttentionLayer given = g.layer, by_default = g.layer;
    given.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    by_default.softmax_scale = 0.0f;
    EXPECT_EQ(run_into(plan, g, g.kv, given, c.rows, s), run_into(plan, g, g.kv, by_default, c.rows, s));
  }
}

// The plan reports what it resolved; a caller workspace too small for an automatic split count
// shrinks the count to what it holds.
TEST(AttentionPlan, ReportsItsSplitsAndWorkspace) {
  CaseSpec s;
  s.seq_cells = {4000};
  const HostCase c = make_case(s);
  DeviceCase g;
  make_device_case(c, Device::cpu(), g);
  g.sched.num_splits = 5;
  const AttentionPlan five = g.plan();
  EXPECT_EQ(five.num_splits(), 5);
  EXPECT_EQ(five.n_rows(), 1);
  EXPECT_EQ(five.max_seq_cells(), 4000);
  EXPECT_EQ(five.workspace_bytes(), attention_workspace_bytes(1, s.n_q_heads, s.head_dim, 5));
  Buffer ws(attention_workspace_bytes(1, s.n_q_heads, s.head_dim, 2), Device::cpu(), 64);
  g.sched.num_splits = 0;
  g.sched.maybe_workspace = TensorRef(ws.data(), DType::U8, Device::cpu(), {static_cast<int64_t>(ws.size())});
  const AttentionPlan fit = g.plan();
  EXPECT_LE(fit.num_splits(), 2);
  std::vector<float> out(static_cast<size_t>(s.n_q_heads) * s.head_dim);
  fit.run(g.q_ref, g.kv, TensorRef(out.data(), DType::F32, Device::cpu(), {1, s.n_q_heads, s.head_dim}), g.layer);
  EXPECT_LE(max_rel_err(out, reference(c)), 2e-5);
}

// PagedCache::paged_kv carries the cache's RoPE mode and table: attention over a rope-on-read
// cache rotates keys and the query without being told, and matches float64 over read(), which
// returns keys rotated to their positions. Block tables go into caller-owned storage, so two
// batches' tables live at once.
TEST(AttentionPlan, PagedCacheHandsAttentionItsPagesAndTables) {
  for (RopeMode mode : {RopeMode::RopeOnRead, RopeMode::RopeStored})
    for (KvFormat f : {KvFormat::F16, KvFormat::Fp8}) {
      PagedCacheConfig cfg;
      cfg.n_layers = 2;
      cfg.n_kv_heads = 2;
      cfg.head_dim = cfg.v_head_dim = 64;
      cfg.block_size = 8;
      cfg.num_blocks = 32;
      cfg.k_format = cfg.v_format = f;
      cfg.rope = {RopeSpec::plain(64, 10000.0)};
      cfg.rope_mode = mode;
      PagedCache cache(cfg, Device::cpu());
      const SeqId a = cache.create(), b = cache.create();
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (SeqId id : {a, b}) {
        const int n = id == a ? 19 : 30;
        std::vector<int32_t> pos(n);
        for (int i = 0; i < n; ++i) pos[i] = 3 + i;
        std::vector<float> k(2 * n * 2 * 64), v(k.size());
        for (float& x : k) x = u(rng);
        for (float& x : v) x = u(rng);
        cache.append(id, pos, TensorRef(k.data(), DType::F32, Device::cpu(), {2, n, 2, 64}),
                     TensorRef(v.data(), DType::F32, Device::cpu(), {2, n, 2, 64}));
      }
      Buffer storage_ab, storage_b;
      const SeqId ab[2] = {a, b};
      AttentionStep step;
      step.table = cache.block_tables(ab, storage_ab, PagedPositions::Offsets);
      const std::vector<int32_t> indptr_ab(step.table.indptr.data_as<int32_t>(), step.table.indptr.data_as<int32_t>() + 3);
      const BlockTable only_b = cache.block_tables(std::span<const SeqId>(&b, 1), storage_b);
      EXPECT_EQ(only_b.indptr.size(0), 2);
      EXPECT_EQ(std::vector<int32_t>(step.table.indptr.data_as<int32_t>(), step.table.indptr.data_as<int32_t>() + 3), indptr_ab)
          << "the first batch's tables must survive the second's";
      std::vector<int32_t> qpos{3 + 19, 3 + 30};
      step.q_positions = TensorRef(qpos.data(), DType::I32, Device::cpu(), {2});
      const PagedKV kv0 = cache.paged_kv(0);
      EXPECT_EQ(kv0.rope_mode, mode);
      EXPECT_EQ(kv0.maybe_rope, &cache.rope_table(0));
      const AttentionPlan plan = AttentionPlan::decode(kv0, 4, step);
      const math::RopeTable& t = cache.rope_table(0);
      std::vector<float> q(2 * 4 * 64);
      for (float& x : q) x = u(rng);
      for (int32_t layer = 0; layer < 2; ++layer) {
        std::vector<float> out(q.size());
        plan.run(TensorRef(q.data(), DType::F32, Device::cpu(), {2, 4, 64}), cache.paged_kv(layer),
                 TensorRef(out.data(), DType::F32, Device::cpu(), {2, 4, 64}));
        for (int r = 0; r < 2; ++r) {
          const PagedReadBack rb = cache.read(ab[r], layer);
          const int n = static_cast<int>(rb.positions.size());
          for (int h = 0; h < 4; ++h) {
            std::vector<float> qr(q.begin() + (r * 4 + h) * 64, q.begin() + (r * 4 + h + 1) * 64);
            // Rope-on-read: attention rotates the query at its position (cos and sin scaled by
            // the table's attention_factor); rope-stored: the query comes rotated.
            if (mode == RopeMode::RopeOnRead) math::rope_rotate_row(qr.data(), t, static_cast<float>(qpos[r]), t.attention_factor);
            std::vector<double> s(n);
            double m = -INFINITY;
            for (int j = 0; j < n; ++j) {
              double d = 0;
              for (int e = 0; e < 64; ++e) d += double(qr[e]) * rb.k[(size_t(j) * 2 + h / 2) * 64 + e];
              s[j] = d / 8.0;
              m = std::max(m, s[j]);
            }
            double den = 0;
            for (double& x : s) den += (x = std::exp(x - m));
            double err = 0;
            for (int e = 0; e < 64; ++e) {
              double o = 0;
              for (int j = 0; j < n; ++j) o += s[j] / den * rb.v[(size_t(j) * 2 + h / 2) * 64 + e];
              err = std::max(err, std::abs(o - out[(r * 4 + h) * 64 + e]));
            }
            EXPECT_LE(err, 2e-4) << "mode " << int(mode) << " format " << kv_format_name(f) << " layer " << layer;
          }
        }
      }
    }
}

// What attention cannot read is refused when the cache is made, naming the field and value.
TEST(AttentionPlan, CacheRefusesPagesAttentionCannotRead) {
  auto base = [] {
    PagedCacheConfig c;
    c.n_layers = 1;
    c.n_kv_heads = 1;
    c.head_dim = c.v_head_dim = 128;
    c.num_blocks = 4;
    c.rope = {RopeSpec::plain(64, 10000.0)};
    return c;
  };
  auto refused = [](const PagedCacheConfig& c, const char* needle) {
    try {
      PagedCache cache(c, Device::cpu());
      ADD_FAILURE() << "accepted, expected " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PagedCacheConfig c = base();
  c.head_dim = c.v_head_dim = 72;
  refused(c, "head_dim 72 has no attention kernel");
  c = base();
  c.k_format = KvFormat::Fp8;
  refused(c, "K pages are e4m3 but V pages are f16");
  c = base();
  c.v_head_dim = 64;
  refused(c, "v_head_dim 64 differs from head_dim 128");
  c.v_head_dim = 0;
  refused(c, "v_head_dim 0 differs from head_dim 128");
  // The same configurations for an engine that reads the pools itself, and a Dsv4Row cache.
  c = base();
  c.head_dim = c.v_head_dim = 72;
  c.kvcore_attention = false;
  EXPECT_NO_THROW(PagedCache(c, Device::cpu()));
  c = base();
  c.k_format = KvFormat::Dsv4Row;
  c.head_dim = 512;
  c.v_head_dim = 0;
  c.rope = {RopeSpec::deepseek_v4_compressed()};
  EXPECT_NO_THROW(PagedCache(c, Device::cpu()));
  c = base();
  c.k_format = c.v_format = KvFormat::Fp8;
  EXPECT_NO_THROW(PagedCache(c, Device::cpu()));
}
