// Replays HF transformers 5.17's DeepSeek-V4 attention (tests/fixtures/dsv4, made by
// make_dsv4_fixtures.py) through Dsv4Cache with quantization off: the raw window,
// the compressed rows, the indexer rows, the indexer scores and top-k picks must
// match what HF computed, call by call, for stateless prefill and for chunked
// prefill + decode with chunks that are and are not multiples of the ratio.
//
// Tolerances (f32 on both sides, different summation orders and libm):
//   raw window rows: exact (the cache stores the rows it is given);
//   compressed and indexer rows: |ours - hf| <= 1e-5 + 1e-5 |hf|;
//   indexer scores: |ours - hf| <= 1e-4 (1 + |hf|);
//   top-k: same number of valid picks; picks equal as sets, except where HF's and
//   our orders break a tie: then the scores of the k-th picks agree within 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dsv4_fixture_reader.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/math/rope_spec.hpp"

using namespace kvcore;
using kvcore::testing::Fixture;
using kvcore::testing::FixtureArray;

namespace {

std::string fixture_path(const std::string& name) { return std::string(KVCORE_FIXTURE_DIR) + "/dsv4/" + name + ".bin"; }

// Record names: "L<layer>." and "L<layer>.call<ci>." (appends sidestep a GCC 12 -Wrestrict false positive).
std::string layer_prefix(int l) {
  std::string s("L");
  s.append(std::to_string(l));
  s.push_back('.');
  return s;
}
std::string call_prefix(int l, int ci) {
  std::string s = layer_prefix(l);
  s.append("call");
  s.append(std::to_string(ci));
  s.push_back('.');
  return s;
}

TensorRef f32_view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return TensorRef(v.data(), DType::F32, Device::cpu(), shape);
}

struct Errors {
  double rows = 0, idx_rows = 0, scores = 0;
  int topk_queries = 0, topk_exact = 0, bias_checked = 0;
};

double max_rel_err(const std::vector<float>& ours, const std::vector<float>& ref, double atol, double rtol, int64_t n,
                   const std::string& what) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::fabs(static_cast<double>(ours[i]) - ref[i]);
    worst = std::max(worst, e / (atol + rtol * std::fabs(ref[i])));
    if (e > atol + rtol * std::fabs(ref[i])) {
      ADD_FAILURE() << what << "[" << i << "]: ours " << ours[i] << " hf " << ref[i];
      return worst;
    }
  }
  return worst;
}

void replay(const std::string& name, Errors& err) {
  SCOPED_TRACE(name);
  const Fixture fx(fixture_path(name));
  const auto& c = fx.at("config").i;
  const int n_layers = c[0], hd = c[1], n_rot = c[2], W = c[3], csa = c[4], hca = c[5];
  const int ih = c[6], idim = c[7], topk = c[8], n_calls = c[10], n_total = c[11];
  const bool yarn = c[12] != 0;

  // RoPE: our spec's frequencies against HF's f32 table; the replay then uses HF's table.
  RopeSpec spec = RopeSpec::plain(n_rot, 160000.0, RopePairing::Interleaved);
  spec.slice = RopeSlice::Tail;
  if (yarn) {
    spec = RopeSpec::deepseek_v4_compressed();
    spec.n_rot = n_rot;
  }
  const FixtureArray& hf_freq = fx.at("rope_compress_inv_freq");
  const std::vector<float> ours_freq = rope_frequencies(spec);
  ASSERT_EQ(static_cast<int64_t>(ours_freq.size()), hf_freq.numel());
  for (size_t i = 0; i < ours_freq.size(); ++i)
    EXPECT_NEAR(ours_freq[i], hf_freq.f[i], 4e-7 * hf_freq.f[i]) << "compress rope frequency " << i;
  math::RopeTable table = make_rope_table(spec, hd);
  for (size_t i = 0; i < ours_freq.size(); ++i) table.freq[i] = hf_freq.f[i];

  Dsv4CacheConfig cfg;
  for (int32_t k : fx.at("layer_kinds").i) cfg.layers.push_back(static_cast<Dsv4LayerKind>(k));
  ASSERT_EQ(static_cast<int>(cfg.layers.size()), n_layers);
  cfg.head_dim = hd;
  cfg.n_rot = n_rot;
  cfg.window = W;
  cfg.csa_ratio = csa;
  cfg.hca_ratio = hca;
  cfg.index_heads = ih;
  cfg.index_dim = idim;
  cfg.index_topk = topk;
  cfg.max_context = std::max(n_total, topk * csa);
  cfg.quant = Dsv4Quant::Off;
  cfg.eps = fx.at("rms_eps").f[0];
  cfg.compressed_rope = spec;
  cfg.maybe_compressed_rope_table = table;
  Dsv4Cache cache(cfg, Device::cpu());
  cache.create();  // sequence 0

  std::vector<std::vector<float>> keep;  // weights stay alive until set_weights copied them
  auto view = [&](const std::string& key) {
    const FixtureArray& a = fx.at(key);
    keep.push_back(a.f);
    TensorRef t(keep.back().data(), DType::F32, Device::cpu(), static_cast<int>(a.shape.size()), a.shape.data(), nullptr);
    return t;
  };
  for (int l = 0; l < n_layers; ++l) {
    if (cfg.layers[l] == Dsv4LayerKind::Window) continue;
    const std::string p = layer_prefix(l);
    Dsv4LayerWeights w;
    w.comp_ape = view(p + "comp.ape");
    w.comp_norm = view(p + "comp.norm");
    if (cfg.layers[l] == Dsv4LayerKind::CSA) {
      w.idx_ape = view(p + "idx.ape");
      w.idx_norm = view(p + "idx.norm");
    }
    cache.set_weights(l, w);
  }

  const std::vector<int32_t>& chunks = fx.at("chunks").i;
  ASSERT_EQ(static_cast<int>(chunks.size()), n_calls);
  int64_t pos = 0;
  for (int ci = 0; ci < n_calls; ++ci) {
    const int n = chunks[ci];
    const bool last = ci == n_calls - 1;
    for (int l = 0; l < n_layers; ++l) {
      SCOPED_TRACE(call_prefix(l, ci));
      const std::string p = call_prefix(l, ci);
      const Dsv4LayerKind kind = cfg.layers[l];
      std::vector<float> kv = fx.at(p + "kv").f, cc, cz, ic, iz;
      Dsv4TokenInputs in;
      in.kv = f32_view(kv, {n, hd});
      if (kind != Dsv4LayerKind::Window) {
        cc = fx.at(p + "comp.c").f;
        cz = fx.at(p + "comp.z").f;
        const int64_t width = cfg.compressor(kind).width();
        in.comp_c = f32_view(cc, {n, width});
        in.comp_z = f32_view(cz, {n, width});
      }
      if (kind == Dsv4LayerKind::CSA) {
        ic = fx.at(p + "idx.c").f;
        iz = fx.at(p + "idx.z").f;
        in.idx_c = f32_view(ic, {n, 2 * idim});
        in.idx_z = f32_view(iz, {n, 2 * idim});
      }
      cache.append(0, l, pos, in);
      ASSERT_EQ(kv, fx.at(p + "kv").f) << "quant Off must leave the kv rows untouched";

      if (kind != Dsv4LayerKind::Window) {
        ASSERT_EQ(cache.compressed_rows(0, l), fx.at(p + "comp.n").i[0]);
      }
      if (fx.has(p + "comp.bias")) {  // HCA visibility: row w is usable by query t iff w < (t + 1) / m
        const FixtureArray& bias = fx.at(p + "comp.bias");
        const int64_t t_rows = bias.dim(1);
        for (int i = 0; i < n; ++i)
          for (int64_t w = 0; w < t_rows; ++w)
            ASSERT_EQ(bias.f[i * t_rows + w] == 0.0f, w < (pos + i + 1) / hca) << "query " << i << " row " << w;
        ++err.bias_checked;
      }
      if (last) {
        const FixtureArray& win = fx.at(p + "window");
        const std::vector<float> ours = cache.read_window(0, l);
        const int64_t n_ours = static_cast<int64_t>(ours.size()) / hd;
        ASSERT_LE(n_ours, win.dim(0));
        // HF's window part holds at least our rows; compare the newest n_ours.
        const std::vector<float> ref(win.f.end() - n_ours * hd, win.f.end());
        EXPECT_EQ(ours, ref) << "raw window rows";
        if (kind != Dsv4LayerKind::Window) {
          const FixtureArray& rows = fx.at(p + "comp.rows");
          err.rows = std::max(err.rows, max_rel_err(cache.read_compressed(0, l), rows.f, 1e-5, 1e-5, rows.numel(), "compressed row"));
        }
        if (kind == Dsv4LayerKind::CSA) {
          const FixtureArray& rows = fx.at(p + "idx.rows");
          err.idx_rows = std::max(err.idx_rows, max_rel_err(cache.read_indexer(0, l), rows.f, 1e-5, 1e-5, rows.numel(), "indexer row"));
        }
      }
      if (kind != Dsv4LayerKind::CSA) continue;

      // Indexer: scores and top-k of this call's queries.
      const int64_t t_rows = fx.at(p + "idx.n").i[0];
      ASSERT_EQ(cache.indexer_rows(0, l), t_rows);
      std::vector<float> q = fx.at(p + "idx.q").f, w = fx.at(p + "idx.weights").f;
      const int64_t cap = cache.indexer_store(0, l).size(0);
      std::vector<float> scores(static_cast<size_t>(n * cap));
      std::vector<int32_t> out(static_cast<size_t>(n * topk));
      cache.indexer_topk(0, l, f32_view(q, {n, ih, idim}), f32_view(w, {n, ih}), pos, f32_view(scores, {n, cap}),
                         TensorRef(out.data(), DType::I32, Device::cpu(), {n, topk}));
      const FixtureArray& hs = fx.at(p + "idx.scores");
      const FixtureArray& hk = fx.at(p + "idx.topk");
      const int64_t hf_k = hk.dim(1);
      ASSERT_EQ(hf_k, std::min<int64_t>(topk, t_rows));
      for (int i = 0; i < n; ++i) {
        const int64_t t = pos + i, vis = std::min<int64_t>(t_rows, (t + 1) / csa);
        for (int64_t s = 0; s < vis; ++s) {
          const double ref = hs.f[i * t_rows + s];
          const double e = std::fabs(scores[i * cap + s] - ref);
          err.scores = std::max(err.scores, e / (1 + std::fabs(ref)));
          EXPECT_LE(e, 1e-4 * (1 + std::fabs(ref))) << "score q " << i << " row " << s;
        }
        std::vector<int32_t> ours_v, hf_v;
        for (int j = 0; j < topk; ++j)
          if (out[i * topk + j] >= 0) ours_v.push_back(out[i * topk + j]);
        for (int j = 0; j < hf_k; ++j)
          if (hk.i[i * hf_k + j] >= 0) hf_v.push_back(hk.i[i * hf_k + j]);
        ASSERT_EQ(ours_v.size(), hf_v.size()) << "valid picks of query " << i;
        for (int j = topk - 1; j >= static_cast<int>(ours_v.size()); --j) EXPECT_EQ(out[i * topk + j], -1);
        std::vector<int32_t> a = ours_v, b = hf_v;
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        ++err.topk_queries;
        if (a == b) {
          ++err.topk_exact;
          continue;
        }
        // A tie broken differently: the picked scores, best first, must agree.
        std::vector<float> sa, sb;
        for (int32_t s : ours_v) sa.push_back(scores[i * cap + s]);
        for (int32_t s : hf_v) sb.push_back(scores[i * cap + s]);
        std::sort(sa.rbegin(), sa.rend());
        std::sort(sb.rbegin(), sb.rend());
        for (size_t j = 0; j < sa.size(); ++j) EXPECT_NEAR(sa[j], sb[j], 1e-4 * (1 + std::fabs(sb[j]))) << "pick " << j;
      }
    }
    pos += n;
  }
}

class Dsv4Fixture : public ::testing::TestWithParam<const char*> {};

TEST_P(Dsv4Fixture, MatchesHfTransformers) {
  Errors err;
  replay(GetParam(), err);
  // Worst error as a share of the tolerance (1 = at the limit), and top-k agreement.
  std::printf("[dsv4 fixture %s] rows %.3f, indexer rows %.3f, scores %.2e rel, top-k exact sets %d/%d, HCA bias calls %d\n",
              GetParam(), err.rows, err.idx_rows, err.scores, err.topk_exact, err.topk_queries, err.bias_checked);
}

INSTANTIATE_TEST_SUITE_P(Hf, Dsv4Fixture,
                         ::testing::Values("hf_test_prefill", "hf_test_chunks_odd", "hf_test_chunks_m", "rates_4_8_prefill",
                                           "rates_4_8_chunks_odd", "rates_4_8_chunks_m", "real_geom_prefill",
                                           "real_geom_chunks_odd", "real_geom_chunks_m"));

}  // namespace
