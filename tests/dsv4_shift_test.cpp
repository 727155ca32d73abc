// Dsv4Cache::shift on the CPU (docs/specs/dsv4-context-shift.md):
//   - against a float64 reference of the rule, written from the cache's stored rows before
//     the shift: kept rows byte-identical, dropped rows gone, moved rows' FP8 / nope parts
//     byte-identical and their RoPE tails equal to the stored tail un-rotated at the old
//     position and rotated at the new one in float64 (within one rounding of the storage
//     format); indexer rows through the plain domain (Hadamard, rotate, Hadamard, FP4);
//     compressor states unchanged; the raw window re-assembled from the kept tokens;
//   - decoding after a shift against a cache built directly at the compacted positions;
//   - bad input: kvcore::Error naming the values, nothing changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "dsv4_shift_util.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/ops/attention_dsv4.hpp"

using namespace kvcore;
using namespace kvcore::testing;

namespace {

struct Mode {
  Dsv4Quant quant;
  bool packed;
  const char* name;
};
const Mode kModes[] = {{Dsv4Quant::On, true, "quant on, packed"},
                       {Dsv4Quant::On, false, "quant on, f32 rows"},
                       {Dsv4Quant::Off, false, "quant off"}};

// Everything the reference needs from one layer, read before the shift.
struct LayerState {
  int32_t length = 0;
  std::vector<float> window, comp, idx;
  std::vector<uint8_t> comp_bytes, idx_bytes;
  std::vector<std::vector<float>> states;
};

LayerState capture(const Dsv4Cache& c, SeqId seq, int l) {
  LayerState s;
  s.length = c.length(seq, l);
  s.window = c.read_window(seq, l);
  if (c.kind(l) == Dsv4LayerKind::Window) return s;
  s.comp = c.read_compressed(seq, l);
  s.comp_bytes = bytes_of(c.compressed_store(seq, l));
  for (Dsv4State w : {Dsv4State::CompressorKv, Dsv4State::CompressorScore}) s.states.push_back(c.read_state(seq, l, w));
  if (c.kind(l) != Dsv4LayerKind::CSA) return s;
  s.idx = c.read_indexer(seq, l);
  s.idx_bytes = bytes_of(c.indexer_store(seq, l));
  for (Dsv4State w : {Dsv4State::IndexerKv, Dsv4State::IndexerScore}) s.states.push_back(c.read_state(seq, l, w));
  return s;
}

// The pairs of `layout` in v (float64), un-rotated at position `from` and rotated at `to`.
void rerotate_ref(std::vector<double>& v, const math::RopeLayout& layout, const float* freq, double from, double to) {
  for (int i = 0; i < layout.n_pairs(); ++i) {
    const double w = freq[i];
    for (double a : {-from * w, to * w}) {
      const double x0 = v[layout.dim0(i)], x1 = v[layout.dim1(i)];
      v[layout.dim0(i)] = x0 * std::cos(a) - x1 * std::sin(a);
      v[layout.dim1(i)] = x0 * std::sin(a) + x1 * std::cos(a);
    }
  }
}

// Storage of a rotated value: how far one rounding may move it.
enum class Store { F32, F16, BF16 };
double tolerance(Store s, double ref, double pair_norm) {
  const double rel = s == Store::BF16 ? std::ldexp(1.0, -8) : s == Store::F16 ? std::ldexp(1.0, -11) : 0.0;
  return rel * std::fabs(ref) + 4e-6 * pair_norm + (s == Store::F16 ? 6e-8 : 0.0);
}

struct Worst {
  double err = 0;
  int64_t n = 0;
};

// Rotated dims of `got` (one row) against `old` re-rotated from `from` to `to`; the other dims equal.
void check_row(const float* got, const float* old, int dim, const math::RopeTable& t, double from, double to, Store s,
               Worst& worst, const std::string& what) {
  std::vector<double> ref(old, old + dim);
  rerotate_ref(ref, t.layout, t.freq, from, to);
  for (int d = 0; d < dim; ++d) {
    if (!t.layout.rotates(d)) {
      ASSERT_EQ(got[d], old[d]) << what << " dim " << d << " does not rotate: must keep its value";
      continue;
    }
    const int i = t.layout.interleaved ? (d - t.layout.first_dim) / 2 : (d - t.layout.first_dim) % t.layout.n_pairs();
    const double norm = std::hypot(ref[t.layout.dim0(i)], ref[t.layout.dim1(i)]);
    const double e = std::fabs(got[d] - ref[d]);
    worst.err = std::max(worst.err, e / (norm + 1e-30));
    ++worst.n;
    ASSERT_LE(e, tolerance(s, ref[d], norm)) << what << " dim " << d << ": got " << got[d] << ", float64 " << ref[d];
  }
}

// The 128-point orthonormal Hadamard in float64.
void hadamard_ref(std::vector<double>& x) {
  const size_t n = x.size();
  for (size_t h = 1; h < n; h *= 2)
    for (size_t i = 0; i < n; i += 2 * h)
      for (size_t j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  for (double& v : x) v /= std::sqrt(static_cast<double>(n));
}

struct Fp4Stats {
  int64_t n = 0, code_diff = 0;
};

// A quantized indexer row: FP4(H R H y) of the old dequantized row y, in float64.
void check_fp4_row(const float* got, const float* old, int dim, const math::RopeTable& t, double from, double to,
                   Fp4Stats& st, const std::string& what) {
  std::vector<double> x(old, old + dim);
  hadamard_ref(x);
  rerotate_ref(x, t.layout, t.freq, from, to);
  hadamard_ref(x);
  std::vector<double> q = x;
  for (int b = 0; b < dim / 32; ++b) block_round_trip_ref(q, b * 32, 32, 6.0, e2m1_grid());
  for (int b = 0; b < dim / 32; ++b) {
    double amax = 1e-4;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const double scale = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(amax / 6.0))));
    for (int i = 0; i < 32; ++i) {
      const int d = b * 32 + i;
      ++st.n;
      st.code_diff += got[d] != q[d];
      // FP4 rounds to within half a grid gap (at most 1 * scale); a tie broken the other way
      // by f32 noise moves it by at most one gap.
      ASSERT_LE(std::fabs(got[d] - x[d]), 1.0001 * scale) << what << " dim " << d << ": got " << got[d] << ", float64 " << x[d];
    }
  }
}

// The whole rule, layer by layer.
void check_shift(const ShiftStack& st, const Dsv4Cache& c, SeqId seq, const std::vector<LayerState>& before, int K, int D,
                 const std::string& what) {
  const Dsv4CacheConfig& cfg = st.cfg;
  const int hd = cfg.head_dim, W = cfg.window, L = before[0].length, Lp = L - D;
  const bool quant = cfg.quant == Dsv4Quant::On;
  Worst ring_w, comp_w, idx_w;
  Fp4Stats fp4;
  math::RopeTable idx_table = st.comp_table;
  idx_table.layout.first_dim = cfg.index_dim - cfg.n_rot;
  for (int l = 0; l < st.n_layers(); ++l) {
    const std::string at = what + " layer " + std::to_string(l);
    const LayerState& b = before[l];
    ASSERT_EQ(c.length(seq, l), Lp) << at;
    // Raw window: new position q from old token o(q).
    const std::vector<float> win = c.read_window(seq, l);
    const int n_old = std::min(L, W), n_new = std::min(Lp, W);
    ASSERT_EQ(win.size(), static_cast<size_t>(n_new) * hd) << at;
    for (int i = 0; i < n_new; ++i) {
      const int q = Lp - n_new + i, o = q < K ? q : q + D, oi = o - (L - n_old);
      ASSERT_GE(oi, 0) << at << ": token " << o << " is not in the old window";
      const float* got = &win[static_cast<size_t>(i) * hd];
      const float* old = &b.window[static_cast<size_t>(oi) * hd];
      if (q < K) {
        ASSERT_TRUE(std::equal(got, got + hd, old)) << at << " raw row of kept token " << q;
      } else {
        check_row(got, old, hd, st.raw_table(l), o, q, quant ? Store::F16 : Store::F32, ring_w, at + " raw row " + std::to_string(q));
      }
    }
    if (cfg.layers[l] == Dsv4LayerKind::Window) continue;
    // Compressor and indexer states: unchanged.
    size_t si = 0;
    for (Dsv4State w : {Dsv4State::CompressorKv, Dsv4State::CompressorScore})
      ASSERT_EQ(c.read_state(seq, l, w), b.states[si++]) << at << " compressor state";
    // Compressed rows.
    const int m = cfg.ratio(cfg.layers[l]), Kr = K / m, Dr = D / m, R = L / m;
    ASSERT_EQ(c.compressed_rows(seq, l), R - Dr) << at;
    const std::vector<float> comp = c.read_compressed(seq, l);
    const std::vector<uint8_t> cb = bytes_of(c.compressed_store(seq, l));
    const size_t rb = static_cast<size_t>(c.compressed_row_bytes());
    ASSERT_TRUE(std::equal(cb.begin(), cb.begin() + Kr * rb, b.comp_bytes.begin())) << at << ": kept rows must keep their bytes";
    for (int i = 0; i < R - Kr - Dr; ++i) {
      const int w_old = Kr + Dr + i, w_new = Kr + i;
      if (c.compressed_packed()) {  // FP8 codes and scales move byte for byte
        using RL = math::Dsv4RowLayout;
        const uint8_t* g = cb.data() + w_new * rb;
        const uint8_t* o = b.comp_bytes.data() + w_old * rb;
        ASSERT_EQ(std::memcmp(g, o, RL::kRopeOffset), 0) << at << " row " << w_new << ": FP8 codes changed";
        ASSERT_EQ(std::memcmp(g + RL::kScaleOffset, o + RL::kScaleOffset, RL::kBytes - RL::kScaleOffset), 0) << at;
      }
      check_row(&comp[static_cast<size_t>(w_new) * hd], &b.comp[static_cast<size_t>(w_old) * hd], hd, st.comp_table,
                double(w_old) * m, double(w_new) * m, c.compressed_packed() ? Store::BF16 : Store::F32, comp_w,
                at + " compressed row " + std::to_string(w_new));
    }
    if (cfg.layers[l] != Dsv4LayerKind::CSA) continue;
    for (Dsv4State w : {Dsv4State::IndexerKv, Dsv4State::IndexerScore})
      ASSERT_EQ(c.read_state(seq, l, w), b.states[si++]) << at << " indexer state";
    const int D_i = cfg.index_dim;
    ASSERT_EQ(c.indexer_rows(seq, l), R - Dr) << at;
    const std::vector<float> idx = c.read_indexer(seq, l);
    const std::vector<uint8_t> ib = bytes_of(c.indexer_store(seq, l));
    const size_t irb = static_cast<size_t>(c.indexer_row_bytes());
    ASSERT_TRUE(std::equal(ib.begin(), ib.begin() + Kr * irb, b.idx_bytes.begin())) << at << ": kept indexer rows";
    for (int i = 0; i < R - Kr - Dr; ++i) {
      const int w_old = Kr + Dr + i, w_new = Kr + i;
      const float* g = &idx[static_cast<size_t>(w_new) * D_i];
      const float* o = &b.idx[static_cast<size_t>(w_old) * D_i];
      const std::string rw = at + " indexer row " + std::to_string(w_new);
      if (quant)
        check_fp4_row(g, o, D_i, idx_table, double(w_old) * m, double(w_new) * m, fp4, rw);
      else
        check_row(g, o, D_i, idx_table, double(w_old) * m, double(w_new) * m, Store::F32, idx_w, rw);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  std::printf("[dsv4 shift] %s: worst error / pair norm: raw %.2e (%lld), compressed %.2e (%lld), indexer %.2e (%lld); "
              "FP4 codes off the float64 rounding %lld of %lld\n",
              what.c_str(), ring_w.err, static_cast<long long>(ring_w.n), comp_w.err, static_cast<long long>(comp_w.n),
              idx_w.err, static_cast<long long>(idx_w.n), static_cast<long long>(fp4.code_diff), static_cast<long long>(fp4.n));
  EXPECT_LE(double(fp4.code_diff), 0.02 * double(fp4.n) + 1) << what << ": FP4 codes off the float64 rounding";
}

struct Case {
  int L, K, D;
};

TEST(Dsv4Shift, MatchesTheFloat64Rule) {
  // Granule 16 (CSA 4, HCA 16), window 32. Cases: ring rows in place (D % 32 == 0) or
  // permuted through a snapshot; indexer rows moving over themselves (D/4 < moved) or not;
  // a sequence inside the window (L <= 32) with an empty tail; n_keep = 0.
  const Case cases[] = {{150, 16, 64}, {150, 0, 48}, {150, 16, 96}, {32, 16, 16}, {30, 0, 16}, {131, 48, 48}};
  for (const Mode& mode : kModes) {
    for (const Case& cs : cases) {
      const std::string what = std::string(mode.name) + " L " + std::to_string(cs.L) + " keep " + std::to_string(cs.K) +
                               " discard " + std::to_string(cs.D);
      SCOPED_TRACE(what);
      ShiftStack st(mode.quant, mode.packed);
      Dsv4Cache cache(st.cfg, Device::cpu());
      const SeqId other = cache.create(), seq = cache.create();
      st.set_weights(cache);
      st.append(cache, other, 0, ShiftStack::ids(500, 40));
      st.append(cache, seq, 0, ShiftStack::ids(0, cs.L / 2));
      st.append(cache, seq, cs.L / 2, ShiftStack::ids(cs.L / 2, cs.L - cs.L / 2));
      std::vector<LayerState> before, other_before;
      for (int l = 0; l < st.n_layers(); ++l) {
        before.push_back(capture(cache, seq, l));
        other_before.push_back(capture(cache, other, l));
      }
      cache.shift(seq, cs.K, cs.D);
      check_shift(st, cache, seq, before, cs.K, cs.D, what);
      for (int l = 0; l < st.n_layers(); ++l) {  // the other sequence is untouched
        const LayerState o = capture(cache, other, l);
        EXPECT_EQ(o.window, other_before[l].window);
        EXPECT_EQ(o.comp_bytes, other_before[l].comp_bytes);
        EXPECT_EQ(o.idx_bytes, other_before[l].idx_bytes);
      }
    }
  }
}

TEST(Dsv4Shift, RepeatedShiftsFollowTheRule) {
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    ShiftStack st(mode.quant, mode.packed);
    Dsv4Cache cache(st.cfg, Device::cpu());
    const SeqId seq = cache.create();
    st.set_weights(cache);
    st.append(cache, seq, 0, ShiftStack::ids(0, 170));
    int L = 170, next = 1000;
    for (const auto& [K, D] : {std::pair{16, 32}, std::pair{32, 48}, std::pair{0, 16}}) {
      std::vector<LayerState> before;
      for (int l = 0; l < st.n_layers(); ++l) before.push_back(capture(cache, seq, l));
      cache.shift(seq, K, D);
      check_shift(st, cache, seq, before, K, D, std::string(mode.name) + " repeated");
      L -= D;
      st.append(cache, seq, L, ShiftStack::ids(next, 9));  // decode a little between shifts
      L += 9;
      next += 9;
    }
  }
}

TEST(Dsv4Shift, NoDiscardChangesNothing) {
  ShiftStack st(Dsv4Quant::On, true);
  Dsv4Cache cache(st.cfg, Device::cpu());
  const SeqId seq = cache.create();
  st.set_weights(cache);
  st.append(cache, seq, 0, ShiftStack::ids(0, 100));
  std::vector<LayerState> before;
  for (int l = 0; l < st.n_layers(); ++l) before.push_back(capture(cache, seq, l));
  const std::string meta = cache.debug_state();
  cache.shift(seq, 32, 0);
  cache.shift(seq, 0, 0);
  EXPECT_EQ(cache.debug_state(), meta);
  for (int l = 0; l < st.n_layers(); ++l) {
    const LayerState a = capture(cache, seq, l);
    EXPECT_EQ(a.window, before[l].window);
    EXPECT_EQ(a.comp_bytes, before[l].comp_bytes);
    EXPECT_EQ(a.idx_bytes, before[l].idx_bytes);
    EXPECT_EQ(a.states, before[l].states);
  }
}

TEST(Dsv4Shift, Granule) {
  ShiftStack st(Dsv4Quant::On, true);
  EXPECT_EQ(Dsv4Cache(st.cfg, Device::cpu()).shift_granule(), 16);
  EXPECT_EQ(Dsv4Cache(Dsv4CacheConfig::v4_flash(4096), Device::cpu()).shift_granule(), 128);
  Dsv4CacheConfig c = st.cfg;
  c.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::Window};
  EXPECT_EQ(Dsv4Cache(c, Device::cpu()).shift_granule(), 1);
  c.layers = {Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
  c.csa_ratio = 6;
  c.hca_ratio = 16;
  EXPECT_EQ(Dsv4Cache(c, Device::cpu()).shift_granule(), 48);
}

TEST(Dsv4Shift, WindowOnlyStackShiftsByAnyCount) {
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    ShiftStack st(mode.quant, mode.packed, {Dsv4LayerKind::Window, Dsv4LayerKind::Window});
    Dsv4Cache cache(st.cfg, Device::cpu());
    const SeqId seq = cache.create();
    st.append(cache, seq, 0, ShiftStack::ids(0, 77));
    for (const auto& [K, D] : {std::pair{3, 5}, std::pair{0, 7}, std::pair{4, 29}}) {
      std::vector<LayerState> before;
      for (int l = 0; l < st.n_layers(); ++l) before.push_back(capture(cache, seq, l));
      cache.shift(seq, K, D);
      check_shift(st, cache, seq, before, K, D, std::string(mode.name) + " window-only");
    }
  }
}

// ---- decoding after a shift against a cache built at the compacted positions ----------------

// Content ids of the shifted sequence (A) and of the compacted one (B). The window before the
// cut in A repeats the content of the last kept window, so a CSA row's lookback across the
// cut sees the same projections in A and B (where it does not, the two differ by design).
void decode_after_shift(const Mode& mode, int L, int K, int D) {
  const std::string what = std::string(mode.name) + " L " + std::to_string(L) + " keep " + std::to_string(K) +
                           " discard " + std::to_string(D);
  SCOPED_TRACE(what);
  ShiftStack st(mode.quant, mode.packed);
  const int m4 = st.cfg.csa_ratio;
  std::vector<int> a_ids = ShiftStack::ids(0, L);
  for (int j = K + D - m4; j < K + D; ++j) a_ids[j] = j - D;
  std::vector<int> b_ids(a_ids.begin(), a_ids.begin() + K);
  b_ids.insert(b_ids.end(), a_ids.begin() + K + D, a_ids.end());
  Dsv4Cache a(st.cfg, Device::cpu()), b(st.cfg, Device::cpu());
  const SeqId sa = a.create(), sb = b.create();
  st.set_weights(a);
  st.set_weights(b);
  st.append(a, sa, 0, a_ids);
  st.append(b, sb, 0, b_ids);
  a.shift(sa, K, D);
  const int Lp = L - D, T = 37;
  st.append(a, sa, Lp, ShiftStack::ids(2000, T));
  st.append(b, sb, Lp, ShiftStack::ids(2000, T));
  const bool quant = mode.quant == Dsv4Quant::On;
  for (int l = 0; l < st.n_layers(); ++l) {
    const std::string at = what + " layer " + std::to_string(l);
    ASSERT_EQ(a.length(sa, l), Lp + T);
    // Raw window: all rows of tokens appended after the shift (the window is 32 < T): equal.
    EXPECT_EQ(a.read_window(sa, l), b.read_window(sb, l)) << at;
    if (st.cfg.layers[l] == Dsv4LayerKind::Window) continue;
    for (Dsv4State w : {Dsv4State::CompressorKv, Dsv4State::CompressorScore})
      EXPECT_EQ(a.read_state(sa, l, w), b.read_state(sb, l, w)) << at << ": states are the same function";
    const int m = st.cfg.ratio(st.cfg.layers[l]), hd = st.cfg.head_dim, rows = (Lp + T) / m, moved_end = Lp / m;
    const std::vector<float> ca = a.read_compressed(sa, l), cb = b.read_compressed(sb, l);
    ASSERT_EQ(ca.size(), cb.size());
    for (int w = 0; w < rows; ++w) {
      const float* x = &ca[static_cast<size_t>(w) * hd];
      const float* y = &cb[static_cast<size_t>(w) * hd];
      if (w < K / m || w >= moved_end) {  // kept rows, and rows emitted after the shift: identical
        ASSERT_TRUE(std::equal(x, x + hd, y)) << at << " row " << w;
        continue;
      }
      for (int d = 0; d < hd; ++d) {  // moved rows: nope identical, tails one rounding apart
        if (d < hd - st.cfg.n_rot) {
          ASSERT_EQ(x[d], y[d]) << at << " row " << w << " dim " << d;
        } else {
          // A rounded twice, B once: each rounding within half an ulp (<= 2^-8 of the pair's norm
          // in bf16). And each cache wrote its row with the f32 angle position * w (w <= 1),
          // rounded at a different position: up to 2^-24 * position rad each.
          const int pair0 = d - (d - (hd - st.cfg.n_rot)) % 2;
          const double norm = std::hypot(y[pair0], y[pair0 + 1]);
          const double angle_err = std::ldexp(1.0, -24) * (double(w) * m + double(w + D / m) * m);
          const double tol = (3 * (a.compressed_packed() ? std::ldexp(1.0, -8) : 1e-6) + angle_err) * norm + 1e-7;
          ASSERT_NEAR(x[d], y[d], tol) << at << " row " << w << " dim " << d;
        }
      }
    }
    if (st.cfg.layers[l] != Dsv4LayerKind::CSA) continue;
    for (Dsv4State w : {Dsv4State::IndexerKv, Dsv4State::IndexerScore})
      EXPECT_EQ(a.read_state(sa, l, w), b.read_state(sb, l, w)) << at;
    const int Di = st.cfg.index_dim;
    const std::vector<float> ia = a.read_indexer(sa, l), ib = b.read_indexer(sb, l);
    for (int w = 0; w < rows; ++w) {
      const float* x = &ia[static_cast<size_t>(w) * Di];
      const float* y = &ib[static_cast<size_t>(w) * Di];
      if (w < K / m || w >= moved_end) {
        ASSERT_TRUE(std::equal(x, x + Di, y)) << at << " indexer row " << w;
      } else if (!quant) {  // quantized: FP4(H R H FP4(.)) against FP4(.): not the same function
        const double angle_err = std::ldexp(1.0, -24) * (double(w) * m + double(w + D / m) * m);
        for (int d = 0; d < Di; ++d) {
          const int pair0 = d < Di - st.cfg.n_rot ? d : d - (d - (Di - st.cfg.n_rot)) % 2;
          const double norm = d < Di - st.cfg.n_rot ? std::fabs(y[d]) : std::hypot(y[pair0], y[pair0 + 1]);
          ASSERT_NEAR(x[d], y[d], (3e-6 + angle_err) * norm + 1e-7) << at << " indexer row " << w << " dim " << d;
        }
      }
    }
  }
}

TEST(Dsv4Shift, DecodingAfterAShiftMatchesACompactedCache) {
  for (const Mode& mode : kModes) {
    decode_after_shift(mode, 150, 32, 64);  // ring rows in place
    decode_after_shift(mode, 150, 16, 48);  // ring rows permuted
    decode_after_shift(mode, 117, 16, 16);  // indexer rows moving over themselves
  }
}

// Decode attention (window + every visible compressed row + no sink) for one query after a
// shift, on the shifted cache and on the compacted one: the same within the tails' rounding.
// Few tokens are decoded after the shift, so the window still holds moved raw rows.
double attention_out(const ShiftStack& st, const Dsv4Cache& c, SeqId seq, int l, const std::vector<float>& q_rot,
                     std::vector<float>& out) {
  const int H = 8, hd = st.cfg.head_dim, W = st.cfg.window, len = c.length(seq, l);
  const TensorRef ring = c.raw_ring(seq, l);
  std::vector<int32_t> wlen{std::min(len, W)}, qpos{len - 1};
  Dsv4AttentionStep step;
  step.window_len = TensorRef(wlen.data(), DType::I32, Device::cpu(), {1});
  step.q_positions = TensorRef(qpos.data(), DType::I32, Device::cpu(), {1});
  Dsv4AttentionLayer layer;
  layer.window_kv = TensorRef(ring.data(), ring.dtype(), Device::cpu(), {1, W, hd});
  std::vector<int32_t> idx;
  if (st.cfg.layers[l] != Dsv4LayerKind::Window) {
    const int rows = c.compressed_rows(seq, l);
    for (int i = 0; i < rows; ++i) idx.push_back(i);
    layer.comp_rows = TensorRef(c.compressed_store(seq, l).data(), DType::U8, Device::cpu(), {rows, 584});
    layer.comp_idx = TensorRef(idx.data(), DType::I32, Device::cpu(), {1, rows});
  }
  layer.rope = &st.raw_table(l);
  out.assign(static_cast<size_t>(H) * hd, 0.0f);
  std::vector<float> q = q_rot;
  Dsv4AttentionPlan::decode(layer, H, step)
      .run(TensorRef(q.data(), DType::F32, Device::cpu(), {1, H, hd}), layer,
           TensorRef(out.data(), DType::F32, Device::cpu(), {1, H, hd}));
  double n = 0;
  for (float v : out) n += double(v) * v;
  return std::sqrt(n);
}

TEST(Dsv4Shift, AttentionAfterAShiftMatchesACompactedCache) {
  ShiftStack st(Dsv4Quant::On, true);
  const int L = 150, K = 32, D = 64, T = 5, m4 = st.cfg.csa_ratio, H = 8, hd = st.cfg.head_dim;
  std::vector<int> a_ids = ShiftStack::ids(0, L);
  for (int j = K + D - m4; j < K + D; ++j) a_ids[j] = j - D;  // the same lookback across the cut (see above)
  std::vector<int> b_ids(a_ids.begin(), a_ids.begin() + K);
  b_ids.insert(b_ids.end(), a_ids.begin() + K + D, a_ids.end());
  Dsv4Cache a(st.cfg, Device::cpu()), b(st.cfg, Device::cpu());
  const SeqId sa = a.create(), sb = b.create();
  for (Dsv4Cache* c : {&a, &b}) st.set_weights(*c);
  st.append(a, sa, 0, a_ids);
  st.append(b, sb, 0, b_ids);
  a.shift(sa, K, D);
  st.append(a, sa, L - D, ShiftStack::ids(3000, T));
  st.append(b, sb, L - D, ShiftStack::ids(3000, T));
  for (int l = 0; l < st.n_layers(); ++l) {
    std::vector<float> q = randn(static_cast<size_t>(H) * hd, 77 + l);
    for (int h = 0; h < H; ++h) math::rope_rotate_row(q.data() + h * hd, st.raw_table(l), static_cast<float>(L - D + T - 1), 1.0f);
    std::vector<float> oa, ob;
    const double na = attention_out(st, a, sa, l, q, oa);
    attention_out(st, b, sb, l, q, ob);
    double e = 0;
    for (size_t i = 0; i < oa.size(); ++i) e += double(oa[i] - ob[i]) * (oa[i] - ob[i]);
    e = std::sqrt(e) / na;
    // A control the bound must reject: the query rotated D positions off, as a query meets keys
    // whose rotation is off by D (a shift that moved rows without rotating them).
    std::vector<float> qc = q, oc;
    for (int h = 0; h < H; ++h) math::rope_rotate_row(qc.data() + h * hd, st.raw_table(l), static_cast<float>(D), 1.0f);
    attention_out(st, a, sa, l, qc, oc);
    double ec = 0;
    for (size_t i = 0; i < oa.size(); ++i) ec += double(oc[i] - ob[i]) * (oc[i] - ob[i]);
    ec = std::sqrt(ec) / na;
    std::printf("[dsv4 shift] attention after shift, layer %d (%s): |A - B| / |A| = %.2e (control, off by D: %.2e)\n", l,
                dsv4_layer_kind_name(st.cfg.layers[l]), e, ec);
    EXPECT_LT(e, 4e-3) << "layer " << l;
    EXPECT_GT(ec, 10 * 4e-3) << "layer " << l << ": the control should miss the bound";
  }
}

// With n_keep = 0 the first kept-tail CSA row looked back at the discarded window; a cache
// built from the tail alone has no window before it: the documented difference.
TEST(Dsv4Shift, LookbackAcrossTheCutIsKept) {
  ShiftStack st(Dsv4Quant::Off, false);
  Dsv4Cache a(st.cfg, Device::cpu()), b(st.cfg, Device::cpu());
  const SeqId sa = a.create(), sb = b.create();
  st.set_weights(a);
  st.set_weights(b);
  st.append(a, sa, 0, ShiftStack::ids(0, 100));
  st.append(b, sb, 0, ShiftStack::ids(32, 68));
  a.shift(sa, 0, 32);
  const std::vector<float> ra = a.read_compressed(sa, 1), rb = b.read_compressed(sb, 1);
  ASSERT_EQ(ra.size(), rb.size());
  const int hd = st.cfg.head_dim;
  EXPECT_FALSE(std::equal(ra.begin(), ra.begin() + hd - st.cfg.n_rot, rb.begin())) << "row 0 pooled the discarded window";
  EXPECT_TRUE(std::equal(ra.begin() + hd, ra.begin() + 2 * hd - st.cfg.n_rot, rb.begin() + hd)) << "row 1 did not";
}

// ---- bad input ---------------------------------------------------------------------------------

void expect_error(ErrorCode code, const std::function<void()>& f, const std::string& what, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": message lacks '" << needle << "': " << e.what();
  }
}

TEST(Dsv4Shift, BadInputLeavesTheCacheUnchanged) {
  ShiftStack st(Dsv4Quant::On, true);
  Dsv4Cache cache(st.cfg, Device::cpu());
  const SeqId seq = cache.create();
  st.set_weights(cache);
  st.append(cache, seq, 0, ShiftStack::ids(0, 100));
  auto snapshot = [&] {
    std::vector<LayerState> s;
    for (int l = 0; l < st.n_layers(); ++l) s.push_back(capture(cache, seq, l));
    return s;
  };
  auto same = [](const std::vector<LayerState>& x, const std::vector<LayerState>& y) {
    for (size_t l = 0; l < x.size(); ++l)
      if (x[l].length != y[l].length || x[l].window != y[l].window || x[l].comp_bytes != y[l].comp_bytes ||
          x[l].idx_bytes != y[l].idx_bytes || x[l].states != y[l].states)
        return false;
    return true;
  };
  const auto before = snapshot();
  const std::string meta = cache.debug_state();
  const ErrorCode IA = ErrorCode::InvalidArgument, NS = ErrorCode::NotSupported;
  expect_error(IA, [&] { cache.shift(seq + 7, 16, 16); }, "unknown sequence", "unknown or erased sequence id 7");
  expect_error(IA, [&] { cache.shift(seq, -16, 16); }, "negative n_keep", "n_keep -16");
  expect_error(IA, [&] { cache.shift(seq, 16, -16); }, "negative n_discard", "n_discard -16");
  expect_error(IA, [&] { cache.shift(seq, 64, 48); }, "past the end", "n_keep + n_discard <= 100");
  expect_error(IA, [&] { cache.shift(seq, 4, 16); }, "n_keep off the granule", "multiples of 16");
  expect_error(IA, [&] { cache.shift(seq, 16, 8); }, "n_discard off the granule", "n_discard (8)");
  expect_error(NS, [&] { cache.shift(seq, 32, 48); }, "tail shorter than the window", "kept tail of 20 tokens");
  EXPECT_TRUE(same(snapshot(), before));
  EXPECT_EQ(cache.debug_state(), meta);

  // Layers in the middle of a step (layer 0 appended, the others not yet).
  {
    Dsv4Cache c2(st.cfg, Device::cpu());
    const SeqId s2 = c2.create();
    st.set_weights(c2);
    st.append(c2, s2, 0, ShiftStack::ids(0, 64));
    std::vector<float> kv = randn(512, 3);
    Dsv4TokenInputs in;
    in.kv = view(kv, {1, 512});
    c2.append(s2, 0, 64, in);
    const std::string m2 = c2.debug_state();
    expect_error(IA, [&] { c2.shift(s2, 0, 16); }, "unequal layer lengths", "layer 1 holds 64");
    EXPECT_EQ(c2.debug_state(), m2);
  }
  // A window RoPE that does not fit the head: named, at shift time.
  {
    ShiftStack bad(Dsv4Quant::On, true);
    bad.cfg.window_rope.n_rot = 1024;
    Dsv4Cache c3(bad.cfg, Device::cpu());
    const SeqId s3 = c3.create();
    st.set_weights(c3);
    st.append(c3, s3, 0, ShiftStack::ids(0, 80));
    const std::string m3 = c3.debug_state();
    const std::vector<float> w0 = c3.read_window(s3, 0);
    expect_error(IA, [&] { c3.shift(s3, 0, 16); }, "window_rope", "window_rope");
    EXPECT_EQ(c3.debug_state(), m3);
    EXPECT_EQ(c3.read_window(s3, 0), w0);
  }
  // A moved-from cache.
  Dsv4Cache moved = std::move(cache);
  expect_error(IA, [&] { cache.shift(seq, 0, 16); }, "moved-from", "moved from");
}

}  // namespace
