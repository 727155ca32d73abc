// Demo section 50: the DeepSeek-V4 cache. Decodes a few hundred tokens through a
// small CSA + HCA stack with random projections, shows compressed rows being
// emitted and the indexer's picks, checks that token-by-token decode and chunked
// prefill leave identical caches, and prints bytes per token of V4-Flash at 128k
// and 1M context beside f32 and f16 rows.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

struct Projections {  // random stand-ins for the engine's per-layer projections
  int hidden;
  std::vector<float> w_kv, w_cc, w_cz, w_ic, w_iz;
  Projections(int h, int width, int iwidth, std::mt19937& g) : hidden(h) {
    auto mat = [&](int rows, float scale) {
      std::normal_distribution<float> d(0.0f, scale / std::sqrt(static_cast<float>(h)));
      std::vector<float> m(static_cast<size_t>(rows) * h);
      for (float& v : m) v = d(g);
      return m;
    };
    w_kv = mat(512, 1.0f);
    w_cc = mat(width, 1.0f);
    w_cz = mat(width, 2.0f);
    w_ic = mat(iwidth, 1.0f);
    w_iz = mat(iwidth, 2.0f);
  }
  static void apply(const std::vector<float>& w, const float* x, int hidden, float* out) {
    const size_t rows = w.size() / hidden;
    for (size_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (int i = 0; i < hidden; ++i) acc += w[r * hidden + i] * x[i];
      out[r] = acc;
    }
  }
};

}  // namespace

KVCORE_DEMO_SECTION(50, "dsv4", "DeepSeek-V4 compressed KV cache: CSA + HCA, packed FP8 rows, indexer, memory") {
  const Device dev = opt.device;
  const int n_tokens = opt.quick ? 160 : 400, hidden = 64;
  Dsv4CacheConfig cfg;
  cfg.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
  cfg.max_context = 1024;
  cfg.max_seqs = 2;
  cfg.index_topk = 8;
  std::printf("dsv4: %zu layers (window, CSA m=4 + indexer, HCA m=128), head 512 = 448 FP8 + 64 rope, window %d, on %s\n",
              cfg.layers.size(), cfg.window, dev.str().c_str());
  Dsv4Cache cache(cfg, dev);
  cache.create();  // sequences 0 and 1
  cache.create();
  std::mt19937 g(static_cast<unsigned>(opt.seed));
  std::vector<Projections> proj;
  for (size_t l = 0; l < cfg.layers.size(); ++l) {
    const Dsv4LayerKind k = cfg.layers[l];
    const int width = k == Dsv4LayerKind::Window ? 0 : cfg.compressor(k).width();
    proj.emplace_back(hidden, width, k == Dsv4LayerKind::CSA ? 2 * cfg.index_dim : 0, g);
    if (k == Dsv4LayerKind::Window) continue;
    const Dsv4Compressor c = cfg.compressor(k), ix = cfg.indexer();
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> ape(static_cast<size_t>(c.ratio) * c.width()), norm(c.head_dim, 1.0f);
    std::vector<float> iape(static_cast<size_t>(ix.ratio) * ix.width()), inorm(ix.head_dim, 1.0f);
    for (float& v : ape) v = d(g);
    for (float& v : iape) v = d(g);
    cache.set_weights(static_cast<int32_t>(l), {TensorRef(ape.data(), DType::F32, Device::cpu(), {c.ratio, c.width()}),
                                                TensorRef(norm.data(), DType::F32, Device::cpu(), {c.head_dim}),
                                                TensorRef(iape.data(), DType::F32, Device::cpu(), {ix.ratio, ix.width()}),
                                                TensorRef(inorm.data(), DType::F32, Device::cpu(), {ix.head_dim})});
  }
  const math::RopeTable win_rope = make_rope_table(RopeSpec::deepseek_v4_window(), 512);
  const math::RopeTable comp_rope = make_rope_table(RopeSpec::deepseek_v4_compressed(), 512);

  // Token t's projections for layer l (the engine's part): raw kv = rmsnorm(W x), RoPE at t.
  std::normal_distribution<float> dx(0.0f, 1.0f);
  std::vector<float> xs(static_cast<size_t>(n_tokens) * hidden);
  for (float& v : xs) v = dx(g);
  auto project = [&](size_t l, int t0, int n, std::vector<float>& kv, std::vector<float>& cc, std::vector<float>& cz,
                     std::vector<float>& ic, std::vector<float>& iz) {
    const Projections& P = proj[l];
    const int w = static_cast<int>(P.w_cc.size() / hidden), iw = static_cast<int>(P.w_ic.size() / hidden);
    kv.resize(static_cast<size_t>(n) * 512);
    cc.resize(static_cast<size_t>(n) * w);
    cz.resize(cc.size());
    ic.resize(static_cast<size_t>(n) * iw);
    iz.resize(ic.size());
    for (int i = 0; i < n; ++i) {
      const float* x = xs.data() + static_cast<size_t>(t0 + i) * hidden;
      float* row = kv.data() + static_cast<size_t>(i) * 512;
      Projections::apply(P.w_kv, x, hidden, row);
      double ss = 0;
      for (int d = 0; d < 512; ++d) ss += double(row[d]) * row[d];
      const float r = static_cast<float>(1.0 / std::sqrt(ss / 512 + 1e-6));
      for (int d = 0; d < 512; ++d) row[d] *= r;
      math::rope_rotate_row(row, cfg.layers[l] == Dsv4LayerKind::Window ? win_rope : comp_rope, static_cast<float>(t0 + i), 1.0f);
      if (w) {
        Projections::apply(P.w_cc, x, hidden, cc.data() + static_cast<size_t>(i) * w);
        Projections::apply(P.w_cz, x, hidden, cz.data() + static_cast<size_t>(i) * w);
      }
      if (iw) {
        Projections::apply(P.w_ic, x, hidden, ic.data() + static_cast<size_t>(i) * iw);
        Projections::apply(P.w_iz, x, hidden, iz.data() + static_cast<size_t>(i) * iw);
      }
    }
  };
  auto append = [&](int seq, size_t l, int t0, int n) {
    std::vector<float> kv, cc, cz, ic, iz;
    project(l, t0, n, kv, cc, cz, ic, iz);
    Buffer bkv = Buffer::from_host(kv, dev), bcc = Buffer::from_host(cc, dev), bcz = Buffer::from_host(cz, dev),
           bic = Buffer::from_host(ic, dev), biz = Buffer::from_host(iz, dev);
    Dsv4TokenInputs in;
    in.kv = TensorRef(bkv.data(), DType::F32, dev, {n, 512});
    if (!cc.empty()) {
      in.comp_c = TensorRef(bcc.data(), DType::F32, dev, {n, static_cast<int64_t>(cc.size() / n)});
      in.comp_z = TensorRef(bcz.data(), DType::F32, dev, {n, static_cast<int64_t>(cz.size() / n)});
    }
    if (!ic.empty()) {
      in.idx_c = TensorRef(bic.data(), DType::F32, dev, {n, static_cast<int64_t>(ic.size() / n)});
      in.idx_z = TensorRef(biz.data(), DType::F32, dev, {n, static_cast<int64_t>(iz.size() / n)});
    }
    cache.append(seq, static_cast<int32_t>(l), t0, in);
    synchronize(dev);
  };

  // Sequence 0: token by token, reporting emissions.
  for (int t = 0; t < n_tokens; ++t) {
    for (size_t l = 0; l < cfg.layers.size(); ++l) {
      const int64_t before = cache.compressed_rows(0, static_cast<int32_t>(l));
      append(0, l, t, 1);
      const int64_t after = cache.compressed_rows(0, static_cast<int32_t>(l));
      if (after > before && (after <= 2 || cfg.layers[l] == Dsv4LayerKind::HCA))
        std::printf("  token %3d: layer %zu (%s) emitted compressed row %lld (window %d..%d, RoPE at %d)\n", t, l,
                    dsv4_layer_kind_name(cfg.layers[l]), static_cast<long long>(after - 1),
                    static_cast<int>((after - 1) * cfg.ratio(cfg.layers[l])), t, static_cast<int>((after - 1) * cfg.ratio(cfg.layers[l])));
    }
  }
  for (size_t l = 1; l < cfg.layers.size(); ++l)
    std::printf("  layer %zu (%s): %d tokens -> %lld compressed rows of %d bytes%s\n", l, dsv4_layer_kind_name(cfg.layers[l]),
                n_tokens, static_cast<long long>(cache.compressed_rows(0, static_cast<int32_t>(l))), cache.compressed_row_bytes(),
                cfg.layers[l] == Dsv4LayerKind::CSA ? (" + " + std::to_string(cache.indexer_rows(0, static_cast<int32_t>(l))) +
                                                       " indexer rows of " + std::to_string(cache.indexer_row_bytes()) + " bytes").c_str()
                                                    : "");

  // Sequence 1: the same tokens in chunks of 37 (not a multiple of 4 or 128).
  for (int t = 0; t < n_tokens; t += 37)
    for (size_t l = 0; l < cfg.layers.size(); ++l) append(1, l, t, std::min(37, n_tokens - t));
  int failures = 0;
  for (size_t l = 0; l < cfg.layers.size(); ++l) {
    const int32_t li = static_cast<int32_t>(l);
    bool same = cache.read_window(0, li) == cache.read_window(1, li);
    if (cfg.layers[l] != Dsv4LayerKind::Window) same = same && cache.read_compressed(0, li) == cache.read_compressed(1, li);
    if (cfg.layers[l] == Dsv4LayerKind::CSA) same = same && cache.read_indexer(0, li) == cache.read_indexer(1, li);
    failures += !same;
  }
  std::printf("  check: token-by-token decode == prefill in chunks of 37, every layer, bit for bit: %s\n",
              failures ? "FAILED" : "ok");

  // The indexer of layer 1 for the last token.
  {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(cfg.index_heads) * cfg.index_dim), w(cfg.index_heads);
    for (float& v : q) v = d(g);
    for (float& v : w) v = std::fabs(d(g)) / std::sqrt(128.0f * 64.0f);
    const int64_t cap = cache.indexer_store(0, 1).size(0);
    Buffer bq = Buffer::from_host(q, dev), bw = Buffer::from_host(w, dev), bs(static_cast<size_t>(cap) * 4, dev),
           bo(static_cast<size_t>(cfg.index_topk) * 4, dev);
    cache.indexer_topk(0, 1, TensorRef(bq.data(), DType::F32, dev, {1, cfg.index_heads, cfg.index_dim}),
                       TensorRef(bw.data(), DType::F32, dev, {1, cfg.index_heads}), n_tokens - 1,
                       TensorRef(bs.data(), DType::F32, dev, {1, cap}), TensorRef(bo.data(), DType::I32, dev, {1, cfg.index_topk}));
    const std::vector<int32_t> picks = bo.to_host<int32_t>();
    std::printf("  indexer (layer 1, query at %d, %lld rows visible): top-%d rows", n_tokens - 1,
                static_cast<long long>(cache.indexer_rows(0, 1)), cfg.index_topk);
    for (int32_t p : picks) std::printf(" %d", p);
    std::printf("\n");
    for (int32_t p : picks) failures += p < 0 || p >= cache.indexer_rows(0, 1);
  }

  // Memory of the real V4-Flash schedule.
  Dsv4Cache flash(Dsv4CacheConfig::v4_flash(2048), dev);
  for (const Dsv4MemoryRow& r : flash.memory_report({131072, 1048576}))
    std::printf("  V4-Flash (43 layers) at %7lld tokens: %7.1f B/token packed (%.2f GB) vs %7.1f B/token as f32 rows, %7.1f as f16 rows\n",
                static_cast<long long>(r.context), r.bytes_per_token, r.total_bytes / 1e9, r.f32_bytes_per_token,
                r.f16_bytes_per_token);
  return failures ? 1 : 0;
}
