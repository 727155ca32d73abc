// Filling and comparing Dsv4Cache sequences of the three-layer test stack (Window, CSA, HCA):
// weights, tokens [p, p + len) of every layer from fixed seeds (on the cache's device), and an
// every-read comparison.
#pragma once
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "dsv4_test_util.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore::testing {

inline void dsv4_set_test_weights(Dsv4Cache& cache) {
  const Dsv4CacheConfig& cfg = cache.config();
  for (int l = 1; l < 3; ++l) {
    const Dsv4Compressor c = cfg.compressor(cfg.layers[l]), ix = cfg.indexer();
    std::vector<float> ca = randn(static_cast<size_t>(c.ratio) * c.width(), 80 + l), cn = randn(c.head_dim, 90 + l, 0.2f);
    std::vector<float> ia = randn(static_cast<size_t>(ix.ratio) * ix.width(), 100 + l), in = randn(ix.head_dim, 110 + l, 0.2f);
    for (float& v : cn) v += 1;
    for (float& v : in) v += 1;
    cache.set_weights(l, {view(ca, {c.ratio, c.width()}), view(cn, {c.head_dim}), view(ia, {ix.ratio, ix.width()}),
                          view(in, {ix.head_dim})});
  }
}

inline void dsv4_append_tokens(Dsv4Cache& cache, SeqId seq, int p, int len) {
  const Dsv4CacheConfig& cfg = cache.config();
  for (int l = 0; l < 3; ++l) {
    const int wc = cfg.layers[l] == Dsv4LayerKind::Window ? 0 : cfg.compressor(cfg.layers[l]).width();
    const int wi = 2 * cfg.index_dim;
    std::vector<float> kv, cc, cz, ic, iz;
    for (int q = p; q < p + len; ++q) {
      const uint64_t s = 9000 + 37 * q + l;
      for (auto [vec, n, sd, sc] : {std::tuple{&kv, 512, s, 2.0f}, std::tuple{&cc, wc, s + 1, 1.0f},
                                    std::tuple{&cz, wc, s + 2, 2.0f}, std::tuple{&ic, wi, s + 3, 1.0f},
                                    std::tuple{&iz, wi, s + 4, 2.0f}}) {
        const auto r = randn(n, sd, sc);
        vec->insert(vec->end(), r.begin(), r.end());
      }
    }
    // On the cache's device (host views on the CPU).
    const Device dv = cache.device();
    auto put = [&](std::vector<float>& v, Buffer& b, int w) {
      if (dv.is_cpu()) return view(v, {len, w});
      b = Buffer::from_host(v, dv);
      return TensorRef(b.data(), DType::F32, dv, {len, w});
    };
    Buffer bkv, bcc, bcz, bic, biz;
    Dsv4TokenInputs in;
    in.kv = put(kv, bkv, 512);
    if (wc) {
      in.comp_c = put(cc, bcc, wc);
      in.comp_z = put(cz, bcz, wc);
    }
    if (cfg.layers[l] == Dsv4LayerKind::CSA) {
      in.idx_c = put(ic, bic, wi);
      in.idx_z = put(iz, biz, wi);
    }
    cache.append(seq, l, p, in);
    if (dv.is_cuda()) synchronize(dv);
  }
}

inline ::testing::AssertionResult dsv4_same_sequence(const Dsv4Cache& a, SeqId sa, const Dsv4Cache& b, SeqId sb) {
  for (int l = 0; l < 3; ++l) {
    if (a.length(sa, l) != b.length(sb, l)) return ::testing::AssertionFailure() << "length, layer " << l;
    if (a.read_window(sa, l) != b.read_window(sb, l)) return ::testing::AssertionFailure() << "window, layer " << l;
    if (l == 0) continue;
    if (a.read_compressed(sa, l) != b.read_compressed(sb, l)) return ::testing::AssertionFailure() << "rows, layer " << l;
    for (Dsv4State s : {Dsv4State::CompressorKv, Dsv4State::CompressorScore})
      if (a.read_state(sa, l, s) != b.read_state(sb, l, s)) return ::testing::AssertionFailure() << "compressor state, layer " << l;
    if (l != 1) continue;
    if (a.read_indexer(sa, l) != b.read_indexer(sb, l)) return ::testing::AssertionFailure() << "indexer rows";
    for (Dsv4State s : {Dsv4State::IndexerKv, Dsv4State::IndexerScore})
      if (a.read_state(sa, l, s) != b.read_state(sb, l, s)) return ::testing::AssertionFailure() << "indexer state";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvcore::testing
