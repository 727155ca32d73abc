// Dsv4Cache on the CPU: schedules, decode == prefill through the cache (bit-exact,
// every read), memory report, sequences (create, erase, truncate to zero), and bad
// inputs (Error, cache unchanged).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "dsv4_test_util.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/error.hpp"

using namespace kvcore;
using namespace kvcore::testing;

namespace {

TEST(Dsv4Cache, BuiltInSchedules) {
  const auto flash = Dsv4CacheConfig::v4_flash_schedule();
  ASSERT_EQ(flash.size(), 43u);
  EXPECT_EQ(std::count(flash.begin(), flash.end(), Dsv4LayerKind::Window), 2);
  EXPECT_EQ(std::count(flash.begin(), flash.end(), Dsv4LayerKind::CSA), 21);
  EXPECT_EQ(std::count(flash.begin(), flash.end(), Dsv4LayerKind::HCA), 20);
  EXPECT_EQ(flash[2], Dsv4LayerKind::CSA);
  EXPECT_EQ(flash[3], Dsv4LayerKind::HCA);
  EXPECT_EQ(flash[42], Dsv4LayerKind::CSA);
  const auto pro = Dsv4CacheConfig::v4_pro_schedule();
  ASSERT_EQ(pro.size(), 61u);
  EXPECT_EQ(pro[0], Dsv4LayerKind::HCA);
  EXPECT_EQ(pro[1], Dsv4LayerKind::HCA);
  EXPECT_EQ(pro[2], Dsv4LayerKind::CSA);
  EXPECT_EQ(std::count(pro.begin(), pro.end(), Dsv4LayerKind::HCA), 31);
  EXPECT_EQ(std::count(pro.begin(), pro.end(), Dsv4LayerKind::CSA), 30);
  EXPECT_EQ(Dsv4CacheConfig::v4_pro(8192).index_topk, 1024);
}

// A small CSA + HCA + window stack at DeepSeek-V4's head geometry.
struct Stack {
  Dsv4CacheConfig cfg;
  explicit Stack(Dsv4Quant q, int max_seqs = 2) {
    cfg.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
    cfg.hca_ratio = 16;
    cfg.index_topk = 8;
    cfg.max_context = 96;
    cfg.max_seqs = max_seqs;
    cfg.window = 32;
    cfg.quant = q;
  }
  void set_weights(Dsv4Cache& cache) {
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
  // Token data of (position, layer), independent of chunking.
  struct Tokens {
    std::vector<float> kv, cc, cz, ic, iz;
    Dsv4TokenInputs in;
  };
  Tokens tokens(int layer, int p, int len) const {
    Tokens t;
    const int wc = cfg.layers[layer] == Dsv4LayerKind::Window ? 0 : cfg.compressor(cfg.layers[layer]).width();
    const int wi = 2 * cfg.index_dim;
    for (int q = p; q < p + len; ++q) {
      const uint64_t s = 7000 + 31 * q + layer;
      for (auto [vec, n, sd, sc] : {std::tuple{&t.kv, 512, s, 2.0f}, std::tuple{&t.cc, wc, s + 1, 1.0f},
                                    std::tuple{&t.cz, wc, s + 2, 2.0f}, std::tuple{&t.ic, wi, s + 3, 1.0f},
                                    std::tuple{&t.iz, wi, s + 4, 2.0f}}) {
        const auto r = randn(n, sd, sc);
        vec->insert(vec->end(), r.begin(), r.end());
      }
    }
    t.in.kv = view(t.kv, {len, 512});
    if (wc) {
      t.in.comp_c = view(t.cc, {len, wc});
      t.in.comp_z = view(t.cz, {len, wc});
    }
    if (cfg.layers[layer] == Dsv4LayerKind::CSA) {
      t.in.idx_c = view(t.ic, {len, wi});
      t.in.idx_z = view(t.iz, {len, wi});
    }
    return t;
  }
};

TEST(Dsv4Cache, DecodeEqualsPrefillBitExact) {
  for (Dsv4Quant q : {Dsv4Quant::On, Dsv4Quant::Off}) {
    Stack st(q);
    Dsv4Cache cache(st.cfg, Device::cpu());
    EXPECT_EQ(cache.create(), 0);
    EXPECT_EQ(cache.create(), 1);
    st.set_weights(cache);
    EXPECT_EQ(cache.compressed_packed(), q == Dsv4Quant::On);
    const int n = 90;
    const std::vector<int> chunks = {5, 1, 2, 33, 7, 1, 41};
    for (int seq = 0; seq < 2; ++seq) {
      int p = 0;
      for (size_t ci = 0; p < n; ++ci) {
        const int len = seq == 0 ? 1 : chunks[ci];
        for (int l = 0; l < 3; ++l) {
          Stack::Tokens t = st.tokens(l, p, len);
          cache.append(seq, l, p, t.in);
        }
        p += len;
      }
    }
    for (int l = 0; l < 3; ++l) {
      EXPECT_EQ(cache.length(0, l), n);
      EXPECT_EQ(cache.read_window(0, l), cache.read_window(1, l)) << "layer " << l;
      EXPECT_EQ(cache.read_window(0, l).size(), 32u * 512u);
      if (l == 0) continue;
      EXPECT_EQ(cache.compressed_rows(0, l), n / st.cfg.ratio(st.cfg.layers[l]));
      EXPECT_EQ(cache.read_compressed(0, l), cache.read_compressed(1, l)) << "layer " << l;
      EXPECT_EQ(cache.read_state(0, l, Dsv4State::CompressorKv), cache.read_state(1, l, Dsv4State::CompressorKv));
      if (l == 1) {
        EXPECT_EQ(cache.read_indexer(0, l), cache.read_indexer(1, l));
        EXPECT_EQ(cache.read_state(0, l, Dsv4State::IndexerScore), cache.read_state(1, l, Dsv4State::IndexerScore));
      }
    }
    // The raw window holds the finalized rows: FP8 nope + f16 when quantized.
    const Stack::Tokens last = st.tokens(2, n - 1, 1);
    std::vector<float> want = last.kv;
    if (q == Dsv4Quant::On) {
      math::dsv4_fp8_round_trip_nope(want.data(), 448);
      for (float& v : want) v = math::f16_bits_to_f32(math::f32_to_f16_bits(v));
    }
    const std::vector<float> win = cache.read_window(0, 2);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), win.end() - 512));
  }
}

TEST(Dsv4Cache, IndexerThroughTheCache) {
  Stack st(Dsv4Quant::On, 1);
  Dsv4Cache cache(st.cfg, Device::cpu());
  cache.create();  // sequence 0
  st.set_weights(cache);
  for (int p = 0; p < 40; ++p)
    for (int l = 0; l < 3; ++l) {
      Stack::Tokens t = st.tokens(l, p, 1);
      cache.append(0, l, p, t.in);
    }
  std::vector<float> q = randn(2 * 64 * 128, 5), w = randn(2 * 64, 6);
  const int64_t cap = cache.indexer_store(0, 1).size(0);
  std::vector<float> sc(2 * cap);
  std::vector<int32_t> out(2 * 8);
  cache.indexer_topk(0, 1, view(q, {2, 64, 128}), view(w, {2, 64}), 22, view(sc, {2, cap}),
                     host_view(out, DType::I32, {2, 8}));
  // Query 22 sees rows 0..4, query 23 rows 0..5: the rest of the picks are -1.
  EXPECT_EQ(std::count(out.begin(), out.begin() + 8, -1), 3);
  EXPECT_EQ(std::count(out.begin() + 8, out.end(), -1), 2);
  for (int j = 0; j < 5; ++j) EXPECT_LT(out[j], 5);
}

TEST(Dsv4Cache, MemoryReportV4Flash) {
  Dsv4CacheConfig cfg = Dsv4CacheConfig::v4_flash(2048);
  Dsv4Cache cache(cfg, Device::cpu());
  EXPECT_EQ(cache.compressed_row_bytes(), 584);
  EXPECT_EQ(cache.indexer_row_bytes(), 68);
  EXPECT_EQ(cache.raw_row_bytes(), 1024);
  const auto rep = cache.memory_report({131072, 1048576});
  for (const Dsv4MemoryRow& r : rep) {
    const double L = static_cast<double>(r.context);
    // By hand: 43 rings of 128 f16 rows; 21 CSA layers with 584 B rows + 68 B indexer
    // rows every 4 tokens and 64 KiB + 16 KiB of state; 20 HCA layers with a 584 B row
    // every 128 tokens and 512 KiB of state.
    const double want = 43 * 128 * 1024.0 + 21 * ((L / 4) * (584 + 68) + 65536 + 16384) + 20 * ((L / 128) * 584 + 524288);
    EXPECT_NEAR(r.total_bytes, want, 1.0);
    const double f32 = 43 * 128 * 2048.0 + 21 * ((L / 4) * (2048 + 512) + 65536 + 16384) + 20 * ((L / 128) * 2048 + 524288);
    EXPECT_NEAR(r.f32_bytes_per_token, f32 / L, 1e-6);
    std::printf("[dsv4 memory] V4-Flash at %lld tokens: %.1f B/token packed, %.1f B/token f32 rows, %.1f B/token f16 rows\n",
                static_cast<long long>(r.context), r.bytes_per_token, r.f32_bytes_per_token, r.f16_bytes_per_token);
  }
  EXPECT_LT(rep[1].bytes_per_token, 3600);
  EXPECT_GT(rep[1].f32_bytes_per_token / rep[1].bytes_per_token, 3.5);
}

TEST(Dsv4Cache, TruncateToZeroEmptiesTheSequence) {
  Stack st(Dsv4Quant::On, 1);
  Dsv4Cache cache(st.cfg, Device::cpu());
  cache.create();  // sequence 0
  st.set_weights(cache);
  const std::vector<float> fresh = cache.read_state(0, 1, Dsv4State::CompressorScore);
  for (int l = 0; l < 3; ++l) {
    Stack::Tokens t = st.tokens(l, 0, 20);
    cache.append(0, l, 0, t.in);
  }
  cache.truncate(0, 0);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(cache.length(0, l), 0);
  const std::vector<float> after = cache.read_state(0, 1, Dsv4State::CompressorScore);
  EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](float v) { return v == -INFINITY; }));
  EXPECT_EQ(after.size(), fresh.size());
  Stack::Tokens t = st.tokens(1, 0, 1);
  EXPECT_NO_THROW(cache.append(0, 1, 0, t.in));
}

template <class F>
void expect_error(ErrorCode code, F&& f, const char* what);

// Sequences are ids from create(), at most max_seqs at once; an erased id stays invalid, and its
// storage goes to the next sequence created, emptied first.
TEST(Dsv4Cache, SequencesAreIdsFromCreate) {
  Stack st(Dsv4Quant::On, 2);
  Dsv4Cache cache(st.cfg, Device::cpu());
  st.set_weights(cache);
  const SeqId a = cache.create(), b = cache.create();
  EXPECT_EQ(cache.sequences(), (std::vector<SeqId>{a, b}));
  expect_error(ErrorCode::OutOfMemory, [&] { cache.create(); }, "max_seqs live");
  const std::vector<float> fresh = cache.read_state(b, 1, Dsv4State::CompressorScore);
  for (int l = 0; l < 3; ++l) {
    Stack::Tokens t = st.tokens(l, 0, 20);
    cache.append(b, l, 0, t.in);
  }
  cache.erase(b);
  EXPECT_FALSE(cache.contains(b));
  expect_error(ErrorCode::InvalidArgument, [&] { cache.length(b, 0); }, "erased id");
  const SeqId c = cache.create();
  EXPECT_NE(c, b);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(cache.length(c, l), 0);
  EXPECT_EQ(cache.read_state(c, 1, Dsv4State::CompressorScore), fresh);
  EXPECT_TRUE(cache.read_window(c, 0).empty());
  // truncate: only to 0 or to the length.
  for (int l = 0; l < 3; ++l) {
    Stack::Tokens t = st.tokens(l, 0, 9);
    cache.append(c, l, 0, t.in);
  }
  cache.truncate(c, 9);
  EXPECT_EQ(cache.length(c, 2), 9);
  expect_error(ErrorCode::NotSupported, [&] { cache.truncate(c, 4); }, "truncate into the sequence");
  expect_error(ErrorCode::InvalidArgument, [&] { cache.truncate(c, 10); }, "truncate past the end");
  expect_error(ErrorCode::InvalidArgument, [&] { cache.truncate(c, -1); }, "negative truncate");
  expect_error(ErrorCode::InvalidArgument, [&] { cache.state(c, 1, static_cast<Dsv4State>(9)); }, "bad state enum");
  // A moved-from cache refuses every call; the moved-to one holds everything.
  Dsv4Cache moved = std::move(cache);
  expect_error(ErrorCode::InvalidArgument, [&] { cache.length(c, 0); }, "moved from");  // NOLINT(bugprone-use-after-move)
  expect_error(ErrorCode::InvalidArgument, [&] { cache.create(); }, "moved from");      // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(moved.length(c, 1), 9);
  // Out-of-range enums in the config are refused at construction.
  Dsv4CacheConfig bad = st.cfg;
  bad.layers[1] = static_cast<Dsv4LayerKind>(5);
  expect_error(ErrorCode::InvalidArgument, [&] { Dsv4Cache x(bad, Device::cpu()); }, "layer kind enum");
  bad = st.cfg;
  bad.quant = static_cast<Dsv4Quant>(3);
  expect_error(ErrorCode::InvalidArgument, [&] { Dsv4Cache x(bad, Device::cpu()); }, "quant enum");
}

template <class F>
void expect_error(ErrorCode code, F&& f, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << what << ": " << e.what();
  }
}

TEST(Dsv4Cache, BadInputsLeaveTheCacheUnchanged) {
  Stack st(Dsv4Quant::On, 1);
  Dsv4Cache cache(st.cfg, Device::cpu());
  cache.create();  // sequence 0
  const ErrorCode IA = ErrorCode::InvalidArgument;
  {
    Stack::Tokens t = st.tokens(1, 0, 1);
    expect_error(IA, [&] { cache.append(0, 1, 0, t.in); }, "no weights yet");
  }
  st.set_weights(cache);
  for (int l = 0; l < 3; ++l) {
    Stack::Tokens t = st.tokens(l, 0, 9);
    cache.append(0, l, 0, t.in);
  }
  auto snapshot = [&] {
    std::vector<std::vector<float>> s;
    for (int l = 0; l < 3; ++l) {
      s.push_back(cache.read_window(0, l));
      s.push_back({static_cast<float>(cache.length(0, l))});
      if (l == 0) continue;
      s.push_back(cache.read_compressed(0, l));
      s.push_back(cache.read_state(0, l, Dsv4State::CompressorKv));
      s.push_back(cache.read_state(0, l, Dsv4State::CompressorScore));
    }
    s.push_back(cache.read_indexer(0, 1));
    return s;
  };
  const auto before = snapshot();
  Stack::Tokens t = st.tokens(1, 9, 1);
  expect_error(IA, [&] { cache.append(0, 1, 10, t.in); }, "position skips");
  expect_error(IA, [&] { cache.append(0, 1, 8, t.in); }, "position repeats");
  expect_error(IA, [&] { cache.append(1, 1, 9, t.in); }, "no such sequence");
  expect_error(IA, [&] { cache.append(0, 3, 9, t.in); }, "no such layer");
  Stack::Tokens bad = t;
  bad.in.comp_c = view(bad.cc, {1, 512});  // CSA wants 1024 features
  expect_error(IA, [&] { cache.append(0, 1, 9, bad.in); }, "compressor width");
  Stack::Tokens bad2 = t;
  bad2.in.idx_z = TensorRef();
  expect_error(IA, [&] { cache.append(0, 1, 9, bad2.in); }, "indexer gate missing");
  Stack::Tokens big = st.tokens(1, 9, 90);
  expect_error(IA, [&] { cache.append(0, 1, 9, big.in); }, "past max_context");
  std::vector<float> ape_bad(3 * 1024);
  std::vector<float> norm(512, 1.0f), ia(4 * 256), in(128, 1.0f);
  expect_error(IA, [&] { cache.set_weights(1, {view(ape_bad, {3, 1024}), view(norm, {512}), view(ia, {4, 256}), view(in, {128})}); },
               "ape shape");
  std::vector<uint16_t> ape16(4 * 1024);
  expect_error(IA, [&] { cache.set_weights(1, {host_view(ape16, DType::BF16, {4, 1024}), view(norm, {512}), view(ia, {4, 256}), view(in, {128})}); },
               "ape dtype");
  expect_error(IA, [&] { cache.shift(0, 4, 4); }, "shift off the granule (16)");
  expect_error(IA, [&] { cache.shift(0, 4, 40); }, "shift past the end");
  std::vector<float> q(64 * 128), w(64), sc(1 * 24);
  std::vector<int32_t> out(25);
  expect_error(IA, [&] { cache.indexer_topk(0, 1, view(q, {1, 64, 128}), view(w, {1, 64}), 5, view(sc, {1, 24}), host_view(out, DType::I32, {1, 25})); },
               "top-k > capacity");
  expect_error(IA, [&] { cache.indexer_topk(0, 1, view(q, {1, 64, 128}), view(w, {1, 64}), 9, view(sc, {1, 24}), host_view(out, DType::I32, {1, 8})); },
               "query not appended yet");
  EXPECT_EQ(snapshot(), before);

  Dsv4CacheConfig c = st.cfg;
  c.index_topk = 25;  // more than max_context / 4 rows
  expect_error(IA, [&] { Dsv4Cache x(c, Device::cpu()); }, "config top-k > capacity");
  c = st.cfg;
  c.n_rot = 63;
  expect_error(IA, [&] { Dsv4Cache x(c, Device::cpu()); }, "odd n_rot");
}

}  // namespace
