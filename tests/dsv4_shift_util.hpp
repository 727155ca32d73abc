// Helpers of the DeepSeek-V4 shift tests (CPU and CUDA): a small stack of layers at
// DeepSeek-V4's head geometry, and token inputs addressed by a "content id" so that a cache
// can be built again from the kept tokens at their compacted positions.
#pragma once
#include <cstdint>
#include <vector>

#include "dsv4_test_util.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore::testing {

struct ShiftStack {
  Dsv4CacheConfig cfg;
  math::RopeTable window_table{}, comp_table{};

  ShiftStack(Dsv4Quant q, bool packed, std::vector<Dsv4LayerKind> layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA,
                                                                           Dsv4LayerKind::HCA}) {
    cfg.layers = std::move(layers);
    cfg.hca_ratio = 16;
    cfg.index_topk = 8;
    cfg.max_context = 192;
    cfg.max_seqs = 2;
    cfg.window = 32;
    cfg.quant = q;
    cfg.packed = packed;
    window_table = make_rope_table(cfg.window_rope, cfg.head_dim);
    comp_table = make_rope_table(cfg.compressed_rope, cfg.head_dim);
  }
  int n_layers() const { return static_cast<int>(cfg.layers.size()); }
  const math::RopeTable& raw_table(int layer) const {
    return cfg.layers[layer] == Dsv4LayerKind::Window ? window_table : comp_table;
  }

  void set_weights(Dsv4Cache& cache) const {
    for (int l = 0; l < n_layers(); ++l) {
      if (cfg.layers[l] == Dsv4LayerKind::Window) continue;
      const Dsv4Compressor c = cfg.compressor(cfg.layers[l]), ix = cfg.indexer();
      std::vector<float> ca = randn(static_cast<size_t>(c.ratio) * c.width(), 80 + l), cn = randn(c.head_dim, 90 + l, 0.2f);
      std::vector<float> ia = randn(static_cast<size_t>(ix.ratio) * ix.width(), 100 + l), in = randn(ix.head_dim, 110 + l, 0.2f);
      for (float& v : cn) v += 1;
      for (float& v : in) v += 1;
      cache.set_weights(l, {view(ca, {c.ratio, c.width()}), view(cn, {c.head_dim}), view(ia, {ix.ratio, ix.width()}),
                            view(in, {ix.head_dim})});
    }
  }

  // Appends tokens at positions pos .. pos + n - 1 of every layer, token i with content
  // content[i]: its projections depend on (content, layer, seed) only; its raw kv row is the
  // content's vector rotated at the token's position (what an engine would hand over).
  void append(Dsv4Cache& cache, SeqId seq, int pos, const std::vector<int>& content, uint64_t seed = 7000) const {
    const int n = static_cast<int>(content.size());
    const Device dv = cache.device();
    for (int l = 0; l < n_layers(); ++l) {
      const bool comp = cfg.layers[l] != Dsv4LayerKind::Window, csa = cfg.layers[l] == Dsv4LayerKind::CSA;
      const int wc = comp ? cfg.compressor(cfg.layers[l]).width() : 0, wi = 2 * cfg.index_dim;
      std::vector<float> kv, cc, cz, ic, iz;
      for (int i = 0; i < n; ++i) {
        const uint64_t s = seed + 131 * static_cast<uint64_t>(content[i]) + 17 * l;
        std::vector<float> x = randn(cfg.head_dim, s, 2.0f);
        math::rope_rotate_row(x.data(), raw_table(l), static_cast<float>(pos + i), 1.0f);
        kv.insert(kv.end(), x.begin(), x.end());
        for (auto [vec, w, sd, sc] : {std::tuple{&cc, wc, s + 1, 1.0f}, std::tuple{&cz, wc, s + 2, 2.0f},
                                      std::tuple{&ic, csa ? wi : 0, s + 3, 1.0f}, std::tuple{&iz, csa ? wi : 0, s + 4, 2.0f}}) {
          const auto r = randn(w, sd, sc);
          vec->insert(vec->end(), r.begin(), r.end());
        }
      }
      Buffer bkv = Buffer::from_host(kv, dv), bcc, bcz, bic, biz;
      Dsv4TokenInputs in;
      in.kv = TensorRef(bkv.data(), DType::F32, dv, {n, cfg.head_dim});
      if (comp) {
        bcc = Buffer::from_host(cc, dv);
        bcz = Buffer::from_host(cz, dv);
        in.comp_c = TensorRef(bcc.data(), DType::F32, dv, {n, wc});
        in.comp_z = TensorRef(bcz.data(), DType::F32, dv, {n, wc});
      }
      if (csa) {
        bic = Buffer::from_host(ic, dv);
        biz = Buffer::from_host(iz, dv);
        in.idx_c = TensorRef(bic.data(), DType::F32, dv, {n, wi});
        in.idx_z = TensorRef(biz.data(), DType::F32, dv, {n, wi});
      }
      cache.append(seq, l, pos, in);
      synchronize(dv, cache.config().stream);
    }
  }

  // Content ids first .. first + n - 1.
  static std::vector<int> ids(int first, int n) {
    std::vector<int> v(n);
    for (int i = 0; i < n; ++i) v[i] = first + i;
    return v;
  }
};

// Every byte of a tensor view (any device).
inline std::vector<uint8_t> bytes_of(const TensorRef& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.span_bytes()));
  copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size());
  return v;
}

}  // namespace kvcore::testing
