// A plain dense reference model of a PagedCache and a driver that applies the same
// random operations to the model and to one or more caches (tests/paged_model_test.cpp
// on the CPU; tests/cuda/paged_cuda_test.cu runs a CPU and a CUDA cache side by side).
//
// Model: per sequence a list of tokens (position, f64 K row and f64 V row per layer, as
// written, unrotated). Expected read-back: K rotated at the current position (cos and sin
// times the attention factor), V as written. With v_from_k_latent (MLA's shared layout) the
// stores take K only and the model's V is each head's first v_head_dim dims of K.
// Tolerance per element, relative to the largest |value| of the row (rowmax):
//   1.5 * eps(format) * (1 + r) + 2.4e-7 * A + 1e-6          (K; V: eps(format) + 1e-6)
// eps: f32 6e-8, f16 2^-11, bf16 2^-8, fp8 (and Dsv4Row's nope dims) 2^-4: one rounding,
// relative; 1.5 > sqrt 2 because a dim of a rotated pair may reach the pair's norm, up to
// sqrt 2 * rowmax, at an intermediate rotation; r: rotations the token's K
// went through after its write (rope-stored shifts; 0 for V and for dims that never rotate);
// A: the sum of |angles| the cache computed in f32 for it (position at write plus every shift
// delta, times the largest frequency 1) -- f32 angles carry a relative error of 2^-24 each.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/persist/prefix_cache.hpp"
#include "kvcore/runtime.hpp"
#include "ops/kv_store_row.hpp"

namespace paged_test {

using namespace kvcore;

// ---- snapshots ---------------------------------------------------------------------------

inline std::vector<uint8_t> download(const TensorRef& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.span_bytes()));
  if (!out.empty()) copy_bytes(out.data(), Device::cpu(), t.data(), t.device(), out.size());
  return out;
}

// Everything a failing call must leave unchanged: metadata text, every pool byte, the
// positions and validity arrays on the cache's device.
struct Snapshot {
  std::string meta;
  std::vector<std::vector<uint8_t>> arrays;
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot snapshot(const PagedCache& c) {
  Snapshot s;
  s.meta = c.debug_state();
  for (int32_t l = 0; l < c.config().n_layers; ++l) {
    const KvPool k = c.k_pool(l), v = c.v_pool(l);
    s.arrays.push_back(download(k.data));
    if (!k.scales.empty()) s.arrays.push_back(download(k.scales));
    if (!v.data.empty()) s.arrays.push_back(download(v.data));
    if (!v.scales.empty()) s.arrays.push_back(download(v.scales));
  }
  s.arrays.push_back(download(c.positions()));
  s.arrays.push_back(download(c.valid()));
  return s;
}

// ---- rows ----------------------------------------------------------------------------------

inline double format_eps(KvFormat f) {
  switch (f) {
    case KvFormat::F32: return 6e-8;
    case KvFormat::F16: return 1.0 / 2048;
    case KvFormat::BF16: return 1.0 / 256;
    case KvFormat::Fp8:
    case KvFormat::Dsv4Row: return 1.0 / 16;
  }
  return 1;
}
inline double dim_eps(KvFormat f, int32_t d) {
  if (f == KvFormat::Dsv4Row && d >= math::Dsv4RowLayout::kNope) return 1.0 / 256;  // bf16 tail
  return format_eps(f);
}

// Host data of n rows per layer in a source dtype, and a tensor of it on a device.
struct Source {
  std::vector<std::vector<double>> values;  // [layer][n * H * D]: what the cache receives (rounded to the dtype)
  Buffer buffer;
  TensorRef tensor;  // [L, n, H, D] or [n, H, D] when one layer
};

inline float round_to(DType t, float x) {
  if (t == DType::F16) return to_f32(from_f32<f16>(x));
  if (t == DType::BF16) return to_f32(from_f32<bf16>(x));
  return x;
}

inline Source make_source(std::mt19937_64& rng, int32_t layers, int32_t n, int32_t H, int32_t D, DType t, Device dev,
                          bool one_layer_shape) {
  Source s;
  // splitmix64: far cheaper than <random>'s distributions, and plenty for test data.
  uint64_t state = rng();
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto u = [&](std::mt19937_64&) { return static_cast<float>(static_cast<int64_t>(next() >> 40) - (1 << 23)) * 0x1p-23f; };
  auto e = [&](std::mt19937_64&) { return static_cast<float>(static_cast<int32_t>(next() % 13) - 6); };
  const size_t per = static_cast<size_t>(n) * H * D;
  std::vector<uint16_t> h16(per * layers);
  std::vector<float> h32(per * layers);
  s.values.resize(layers);
  for (int32_t l = 0; l < layers; ++l) {
    s.values[l].resize(per);
    for (size_t r = 0; r < per / D; ++r) {
      const float scale = std::exp2(e(rng));  // rows of different magnitudes: FP8 scales vary
      for (int32_t d = 0; d < D; ++d) {
        const size_t i = r * D + d;
        const float x = round_to(t, u(rng) * scale);
        s.values[l][i] = x;
        h32[l * per + i] = x;
        h16[l * per + i] = t == DType::F16 ? from_f32<f16>(x).bits : from_f32<bf16>(x).bits;
      }
    }
  }
  const size_t bytes = per * layers * dtype_size(t);
  s.buffer = Buffer(std::max<size_t>(bytes, 4), dev);
  copy_bytes(s.buffer.data(), dev, t == DType::F32 ? static_cast<const void*>(h32.data()) : h16.data(), Device::cpu(), bytes);
  if (one_layer_shape) s.tensor = TensorRef(s.buffer.data(), t, dev, {n, H, D});
  else s.tensor = TensorRef(s.buffer.data(), t, dev, {layers, n, H, D});
  return s;
}

// ---- the reference model ------------------------------------------------------------------

struct RefToken {
  int32_t token = -1;    // prompt token id (prefix reuse); -1 for random appends (no id: never published)
  bool fresh = false;    // its K/V are what a fresh prompt computes at position == its index (false after edits)
  int32_t pos = 0;
  int32_t rot = 0;       // rotations after the write (rope-stored shifts)
  double angle = 0;      // sum of |angles| computed in f32 for this token
  std::vector<std::vector<double>> k, v;  // [layer][H * D]
};
using RefSeq = std::vector<RefToken>;

// Width of the V rows a store takes: 0 without V pools (v_head_dim 0, or V read from K's latent).
inline int32_t stored_v_width(const PagedCacheConfig& c) { return c.v_from_k_latent ? 0 : c.v_head_dim; }

// With v_from_k_latent, the token's V: each head's first v_head_dim dims of its K row (as written).
inline void v_from_latent(const PagedCacheConfig& c, RefToken& tok) {
  if (!c.v_from_k_latent) return;
  const int32_t H = c.n_kv_heads, D = c.head_dim, DV = c.v_head_dim;
  tok.v.assign(tok.k.size(), std::vector<double>(static_cast<size_t>(H) * DV));
  for (size_t l = 0; l < tok.k.size(); ++l)
    for (int32_t h = 0; h < H; ++h)
      std::copy_n(tok.k[l].begin() + static_cast<int64_t>(h) * D, DV, tok.v[l].begin() + static_cast<int64_t>(h) * DV);
}

struct ErrorStats {
  double worst_ratio_k = 0, worst_ratio_v = 0;  // max |err| / tolerance seen
  double worst_rel_k = 0, worst_rel_v = 0;      // max |err| / rowmax seen
  int64_t rows_checked = 0;
};

// Expected K row of one head: rotated at `pos`, magnitude attention_factor, in f64.
inline void expected_k(const double* raw, int32_t D, const math::RopeTable& t, int32_t pos, double* out) {
  std::copy(raw, raw + D, out);
  for (int32_t i = 0; i < t.layout.n_pairs(); ++i) {
    const double a = static_cast<double>(pos) * static_cast<double>(t.freq[i]);
    const double c = std::cos(a) * t.attention_factor, s = std::sin(a) * t.attention_factor;
    const double x0 = out[t.layout.dim0(i)], x1 = out[t.layout.dim1(i)];
    out[t.layout.dim0(i)] = x0 * c - x1 * s;
    out[t.layout.dim1(i)] = x0 * s + x1 * c;
  }
}

// Compare one cache's read-back of (seq, layer) with the model. Returns false (with a
// gtest failure) on the first mismatch.
inline bool check_read(PagedCache& c, SeqId id, const RefSeq& ref, int32_t layer, ErrorStats& st) {
  const PagedCacheConfig& cfg = c.config();
  const PagedReadBack rb = c.read(id, layer);
  const int32_t H = cfg.n_kv_heads, D = cfg.head_dim, DV = cfg.v_head_dim;
  if (rb.positions.size() != ref.size()) {
    ADD_FAILURE() << "seq " << id << ": " << rb.positions.size() << " tokens read, model has " << ref.size();
    return false;
  }
  const math::RopeTable& t = c.rope_table(layer);
  std::vector<double> want(D);
  const bool stored = cfg.rope_mode == RopeMode::RopeStored;
  for (size_t j = 0; j < ref.size(); ++j) {
    const RefToken& tok = ref[j];
    if (rb.positions[j] != tok.pos) {
      ADD_FAILURE() << "seq " << id << " token " << j << ": position " << rb.positions[j] << ", model " << tok.pos;
      return false;
    }
    const double angle = stored ? tok.angle : std::abs(static_cast<double>(tok.pos));
    for (int32_t h = 0; h < H; ++h) {
      expected_k(tok.k[layer].data() + h * D, D, t, tok.pos, want.data());
      double rowmax = 0;
      for (double x : want) rowmax = std::max(rowmax, std::abs(x));
      for (int32_t d = 0; d < D; ++d) {
        const bool rotated = t.layout.rotates(d) || (kvrow::is_fp8_dim(cfg.k_format, d) && stored);
        const int32_t r = stored && rotated ? tok.rot : 0;
        const double tol = rowmax * (1.5 * dim_eps(cfg.k_format, d) * (1 + r) + 2.4e-7 * angle + 1e-6) + 1e-30;
        const double err = std::abs(static_cast<double>(rb.k[(j * H + h) * D + d]) - want[d]);
        st.worst_ratio_k = std::max(st.worst_ratio_k, err / tol);
        if (rowmax > 0) st.worst_rel_k = std::max(st.worst_rel_k, err / rowmax);
        if (!(err <= tol)) {
          ADD_FAILURE() << "seq " << id << " layer " << layer << " token " << j << " (pos " << tok.pos << ", rot " << tok.rot
                        << ") head " << h << " dim " << d << ": K " << rb.k[(j * H + h) * D + d] << ", want " << want[d]
                        << " (tol " << tol << ")";
          return false;
        }
      }
      ++st.rows_checked;
      if (DV == 0) continue;
      const double* v = tok.v[layer].data() + h * DV;
      double vmax = 0;
      for (int32_t d = 0; d < DV; ++d) vmax = std::max(vmax, std::abs(v[d]));
      // A latent V is K's bytes: K's format, and in rope-stored FP8 re-encoded with the row at each shift.
      const bool latent = cfg.v_from_k_latent;
      const int32_t vr = latent && stored && cfg.k_format == KvFormat::Fp8 ? tok.rot : 0;
      const double veps = format_eps(latent ? cfg.k_format : cfg.v_format) * (1 + vr);
      for (int32_t d = 0; d < DV; ++d) {
        const double tol = vmax * (veps + 1e-6) + 1e-30;
        const double err = std::abs(static_cast<double>(rb.v[(j * H + h) * DV + d]) - v[d]);
        st.worst_ratio_v = std::max(st.worst_ratio_v, err / tol);
        if (vmax > 0) st.worst_rel_v = std::max(st.worst_rel_v, err / vmax);
        if (!(err <= tol)) {
          ADD_FAILURE() << "seq " << id << " layer " << layer << " token " << j << " head " << h << " dim " << d << ": V "
                        << rb.v[(j * H + h) * DV + d] << ", want " << v[d];
          return false;
        }
      }
    }
  }
  return true;
}

// ---- the driver -------------------------------------------------------------------------------

// Applies random operations to caches[0..] and the model (append, reserve + store, shift,
// truncate, remove_positions, add_positions, fork, erase, prepare, bad calls). Every cache must behave the same
// (same ids, same metadata, same error codes); caches[0] is read back against the model.
//
// Prefix reuse (when `prefixes` holds one PrefixCache per cache, all with one seed): prompts are
// a few shared system prompts (whole or cut) plus short random tails, under two tenant salts.
// A prompt token's K/V are a function of the salt and the prompt up to it (what a model computes
// from scratch), so a reused block must hold exactly what a fresh append would. The reference
// keeps the set of published prefixes itself: the blocks each create() reuses, the hit and miss
// counters and what each publish() returns are predicted exactly; edits (shift, truncate,
// position edits) go through the PrefixCache for its sequences and end the reusable run of
// tokens where they touch it (the model marks those tokens -1). Holders are cleared, never
// evicted piecemeal, so the prediction stays exact.
struct Driver {
  std::vector<PagedCache*> caches;
  std::map<SeqId, RefSeq> model;
  std::mt19937_64 rng;
  ErrorStats st;
  int64_t ops = 0, failed_ops = 0, oom = 0, shifts = 0, forks = 0, edits = 0;
  int32_t max_seqs = 6, max_append = 20;
  double read_prob = 0.2;
  double offsets_prob = 0.1;
  // After each op, compare caches[i] with caches[0] (metadata text, and the bytes of
  // positions/validity); `compare_pools` is called for the pool bytes when set.
  std::function<void(int64_t op)> on_step;

  // ---- prefix reuse (empty `prefixes`: off) ----
  std::vector<PrefixCache*> prefixes;
  std::set<SeqId> prompted;                                      // sequences the PrefixCaches created
  std::map<SeqId, std::string> salt_of;
  std::set<std::pair<std::string, std::vector<int32_t>>> published;  // (salt, tokens of k full blocks)
  std::vector<std::vector<int32_t>> systems;                     // shared system prompts
  int64_t prompts = 0, ref_blocks_hit = 0, ref_blocks_missed = 0, hit_prompts = 0, publishes = 0, clears = 0;

  explicit Driver(std::vector<PagedCache*> cs, uint64_t seed) : caches(std::move(cs)), rng(seed) {}

  const PagedCacheConfig& cfg() const { return caches[0]->config(); }
  PrefixCache* prefix_of(const PagedCache& c) const {
    for (size_t i = 0; i < prefixes.size(); ++i)
      if (caches[i] == &c) return prefixes[i];
    return nullptr;
  }
  bool is_prompted(SeqId id) const { return prompted.count(id) > 0; }
  // Tokens from index `from` on are no longer what a fresh prompt computes (they keep their ids).
  static void end_reusable(RefSeq& s, size_t from) {
    for (size_t j = from; j < s.size(); ++j) s[j].fresh = false;
  }
  int32_t rand(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  SeqId pick() {
    auto it = model.begin();
    std::advance(it, rand(0, static_cast<int32_t>(model.size()) - 1));
    return it->first;
  }

  // Run `op` on every cache. Returns true when it succeeded everywhere; when it threw, checks that
  // every cache threw the same code and kept its snapshot (taken only when `may_fail`).
  template <class F>
  bool run(bool may_fail, F&& op, ErrorCode* code = nullptr) {
    std::vector<Snapshot> before;
    if (may_fail)
      for (PagedCache* c : caches) before.push_back(snapshot(*c));
    int n_threw = 0;
    ErrorCode first{};
    for (size_t i = 0; i < caches.size(); ++i) {
      try {
        op(*caches[i]);
      } catch (const Error& e) {
        if (!may_fail) ADD_FAILURE() << "unexpected error: " << e.what();
        if (n_threw == 0) first = e.code();
        else EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(first));
        ++n_threw;
        if (may_fail && !(snapshot(*caches[i]) == before[i])) ADD_FAILURE() << "a failing call changed the cache: " << e.what();
      }
    }
    EXPECT_TRUE(n_threw == 0 || n_threw == static_cast<int>(caches.size())) << "caches disagree on failure";
    if (code) *code = first;
    if (n_threw) ++failed_ops;
    return n_threw == 0;
  }

  std::vector<int32_t> next_positions(const RefSeq& s, int32_t n) {
    std::vector<int32_t> p(n);
    int32_t last = s.empty() ? rand(-1, 2) : s.back().pos;
    for (int32_t i = 0; i < n; ++i) last = p[i] = last + 1 + (coin(0.2) ? rand(1, 2) : 0);
    return p;
  }

  void op_append() {
    if (model.empty()) return;
    const PagedCacheConfig& c = cfg();
    const int32_t L = c.n_layers, H = c.n_kv_heads, D = c.head_dim, DV = stored_v_width(c);
    // One to three sequences; all layers at once (one sequence), or reserve + store per layer.
    const bool per_layer = coin(0.4);
    std::vector<SeqId> ids{pick()};
    if (per_layer)
      for (int i = 0; i < 2 && coin(0.4); ++i) {
        const SeqId o = pick();
        if (std::find(ids.begin(), ids.end(), o) == ids.end()) ids.push_back(o);
      }
    std::vector<int32_t> counts, positions;
    for (SeqId id : ids) {
      // Now and then a chunk larger than what is free: the pool must run out cleanly.
      const int32_t big = (caches[0]->stats().blocks_free + 2) * c.block_size;
      const int32_t n = coin(0.02) ? rand(big / 2, big) : (coin(0.5) ? 1 : rand(1, max_append));
      counts.push_back(n);
      const std::vector<int32_t> p = next_positions(model[id], n);
      positions.insert(positions.end(), p.begin(), p.end());
    }
    const int32_t total = static_cast<int32_t>(positions.size());
    const DType dts[3] = {DType::F32, DType::F16, DType::BF16};
    const DType dt = dts[rand(0, 2)];
    // May it run out of blocks? (then it must fail cleanly, and only then)
    const int32_t free_blocks = caches[0]->stats().blocks_free;
    int64_t need_lo = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const SeqInfo in = caches[0]->info(ids[i]);
      need_lo += (in.n_cells + counts[i] + c.block_size - 1) / c.block_size - in.n_blocks;
    }
    const bool may_fail = need_lo + static_cast<int64_t>(ids.size()) > free_blocks;
    // The same data for every cache, on each cache's device.
    const uint64_t seed = rng();
    std::vector<std::vector<double>> kvals, vvals;
    ErrorCode code{};
    const bool ok = run(may_fail, [&](PagedCache& cache) {
      std::mt19937_64 r(seed);
      if (!per_layer) {
        Source k = make_source(r, L, total, H, D, dt, cache.device(), false);
        Source v = DV ? make_source(r, L, total, H, DV, dt, cache.device(), false) : Source{};
        kvals = k.values;
        vvals = v.values;
        cache.append(ids[0], positions, k.tensor, v.tensor);
      } else {
        AppendTicket t = cache.reserve(ids, counts, positions);
        std::vector<int32_t> order(L);
        for (int32_t l = 0; l < L; ++l) order[l] = l;
        std::shuffle(order.begin(), order.end(), r);
        kvals.assign(L, {});
        vvals.assign(L, {});
        for (int32_t l : order) {
          Source k = make_source(r, 1, total, H, D, dt, cache.device(), true);
          Source v = DV ? make_source(r, 1, total, H, DV, dt, cache.device(), true) : Source{};
          kvals[l] = k.values[0];
          if (DV) vvals[l] = v.values[0];
          cache.store(t, l, k.tensor, v.tensor);
        }
      }
    }, &code);
    if (!ok) {
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::OutOfMemory));
      EXPECT_TRUE(may_fail) << "append failed although " << need_lo << " + copies <= " << free_blocks << " free blocks";
      ++oom;
      return;
    }
    int32_t at = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      for (int32_t j = 0; j < counts[i]; ++j, ++at) {
        RefToken tok;
        tok.pos = positions[at];
        tok.angle = std::abs(static_cast<double>(tok.pos));
        for (int32_t l = 0; l < L; ++l) {
          tok.k.emplace_back(kvals[l].begin() + static_cast<int64_t>(at) * H * D,
                             kvals[l].begin() + static_cast<int64_t>(at + 1) * H * D);
          if (DV)
            tok.v.emplace_back(vvals[l].begin() + static_cast<int64_t>(at) * H * DV,
                               vvals[l].begin() + static_cast<int64_t>(at + 1) * H * DV);
        }
        v_from_latent(c, tok);
        model[ids[i]].push_back(std::move(tok));
      }
  }

  void op_shift() {
    if (model.empty()) return;
    const SeqId id = pick();
    RefSeq& s = model[id];
    const int32_t n = static_cast<int32_t>(s.size());
    if (coin(0.03)) {  // out of range: must fail cleanly
      const int32_t keep = rand(0, n), discard = n - keep + rand(1, 3);
      ErrorCode code{};
      EXPECT_FALSE(run(true, [&](PagedCache& c) { c.shift(id, keep, discard); }, &code));
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::InvalidArgument));
      return;
    }
    int32_t keep = rand(0, n), discard = rand(0, n - keep);
    const int32_t bs = cfg().block_size;
    if (is_prompted(id) && n >= 2 * bs && coin(0.5)) {
      // Whole blocks cut: their blocks are freed and the later cells follow at consecutive
      // positions, so only the PrefixCache's own bookkeeping knows they are not a fresh prompt.
      keep = rand(0, n / bs - 1) * bs;
      discard = rand(1, (n - keep) / bs) * bs;
    }
    // Shared blocks may need copies: a clean OutOfMemory is then allowed.
    const PagedStats ps = caches[0]->stats();
    const bool may_fail = ps.blocks_shared > 0 && caches[0]->info(id).n_blocks > ps.blocks_free;
    ErrorCode code{};
    const bool via_prefix = is_prompted(id);
    auto do_shift = [&](PagedCache& c) {
      if (via_prefix) prefix_of(c)->shift(id, keep, discard);
      else c.shift(id, keep, discard);
    };
    if (!run(may_fail, do_shift, &code)) {
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::OutOfMemory));
      ++oom;
      return;
    }
    ++shifts;
    if (discard == 0) return;
    s.erase(s.begin() + keep, s.begin() + keep + discard);
    end_reusable(s, keep);  // later tokens attended to the discarded ones
    const bool stored = cfg().rope_mode == RopeMode::RopeStored;
    for (size_t j = keep; j < s.size(); ++j) {
      s[j].pos -= discard;
      if (stored) {
        ++s[j].rot;
        s[j].angle += discard;
      }
    }
  }

  // A position range [p0, p1) of `s`: around its tokens' positions, sometimes empty, sometimes to the end.
  std::pair<int32_t, int32_t> pick_range(const RefSeq& s) {
    const int32_t n = static_cast<int32_t>(s.size());
    auto pos_at = [&](int32_t i) { return i < n ? s[i].pos : (n ? s.back().pos + 1 : 0); };
    const int32_t i = rand(0, n), j = rand(i, n);
    const int32_t p0 = std::max(0, pos_at(i) - (coin(0.3) ? rand(0, 1) : 0));
    const int32_t p1 = coin(0.25) ? PagedCache::kPosEnd : std::max(p0, pos_at(j) + (coin(0.3) ? rand(0, 1) : 0));
    return {p0, p1};
  }

  // Shared blocks may need copies: a clean OutOfMemory is then allowed.
  bool copies_may_fail(SeqId id) {
    const PagedStats ps = caches[0]->stats();
    return ps.blocks_shared > 0 && caches[0]->info(id).n_blocks > ps.blocks_free;
  }

  void op_remove_positions() {
    if (model.empty()) return;
    const SeqId id = pick();
    RefSeq& s = model[id];
    ErrorCode code{};
    if (coin(0.05)) {  // a bad range: must fail cleanly
      const int32_t p0 = coin(0.5) ? -rand(1, 3) : rand(2, 9), p1 = p0 >= 0 ? p0 - rand(1, 2) : rand(0, 9);
      EXPECT_FALSE(run(true, [&](PagedCache& c) { c.remove_positions(id, p0, p1); }, &code));
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::InvalidArgument));
      return;
    }
    const std::pair<int32_t, int32_t> range = pick_range(s);  // named fields: lambdas below capture them
    const int32_t p0 = range.first, p1 = range.second;
    const int32_t first = first_in_range(s, p0, p1);
    auto do_remove = [&](PagedCache& c) {
      c.remove_positions(id, p0, p1);
      if (first >= 0 && is_prompted(id)) prefix_of(c)->note_edit(id, first);
    };
    if (!run(copies_may_fail(id), do_remove, &code)) {
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::OutOfMemory));
      ++oom;
      return;
    }
    ++edits;
    s.erase(std::remove_if(s.begin(), s.end(), [&](const RefToken& t) { return t.pos >= p0 && t.pos < p1; }), s.end());
    if (first >= 0) end_reusable(s, static_cast<size_t>(first));
  }

  void op_add_positions() {
    if (model.empty()) return;
    const SeqId id = pick();
    RefSeq& s = model[id];
    const std::pair<int32_t, int32_t> range = pick_range(s);  // named fields: lambdas below capture them
    const int32_t p0 = range.first, p1 = range.second;
    const int32_t delta = coin(0.05) ? -rand(1000, 100000) : rand(-6, 6) + (coin(0.2) ? rand(10, 2000) : 0);
    // Valid when every new position is >= 0 and they still increase along the sequence.
    bool valid = true;
    int64_t prev = -1;
    for (const RefToken& t : s) {
      const int64_t np = t.pos + (t.pos >= p0 && t.pos < p1 ? delta : 0);
      valid = valid && np >= 0 && np > prev;
      prev = np;
    }
    ErrorCode code{};
    const int32_t first = delta == 0 ? -1 : first_in_range(s, p0, p1);
    auto do_add = [&](PagedCache& c) {
      c.add_positions(id, p0, p1, delta);
      if (first >= 0 && is_prompted(id)) prefix_of(c)->note_edit(id, first);
    };
    if (!run(!valid || copies_may_fail(id), do_add, &code)) {
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(valid ? ErrorCode::OutOfMemory : ErrorCode::InvalidArgument));
      if (valid) ++oom;
      return;
    }
    EXPECT_TRUE(valid) << "add_positions(" << p0 << ", " << p1 << ", " << delta << ") accepted positions that do not increase";
    ++edits;
    const bool stored = cfg().rope_mode == RopeMode::RopeStored;
    if (first >= 0) end_reusable(s, static_cast<size_t>(first));
    for (RefToken& t : s) {
      if (t.pos < p0 || t.pos >= p1 || delta == 0) continue;
      t.pos += delta;
      if (stored) {
        ++t.rot;
        t.angle += std::abs(static_cast<double>(delta));
      }
    }
  }

  void op_truncate() {
    if (model.empty()) return;
    const SeqId id = pick();
    RefSeq& s = model[id];
    const int32_t n = static_cast<int32_t>(s.size());
    if (coin(0.03)) {
      ErrorCode code{};
      EXPECT_FALSE(run(true, [&](PagedCache& c) { c.truncate(id, n + rand(1, 4)); }, &code));
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::InvalidArgument));
      return;
    }
    const int32_t keep = std::max(0, n - rand(0, 6));
    run(false, [&](PagedCache& c) {
      if (is_prompted(id)) prefix_of(c)->truncate(id, keep);
      else c.truncate(id, keep);
    });
    s.resize(keep);
  }

  void op_create() {
    std::vector<SeqId> got;
    run(false, [&](PagedCache& c) { got.push_back(c.create()); });
    for (SeqId g : got) EXPECT_EQ(g, got[0]);
    model[got[0]] = {};
  }

  void op_fork() {
    if (model.empty()) return;
    const SeqId id = pick();
    std::vector<SeqId> got;
    run(false, [&](PagedCache& c) { got.push_back(c.fork(id)); });
    for (SeqId g : got) EXPECT_EQ(g, got[0]);
    model[got[0]] = model[id];
    ++forks;
  }

  void op_erase() {
    if (model.empty()) return;
    const SeqId id = pick();
    run(false, [&](PagedCache& c) {
      if (is_prompted(id)) prefix_of(c)->erase(id);
      else c.erase(id);
    });
    model.erase(id);
    prompted.erase(id);
    salt_of.erase(id);
  }

  void op_bad_id() {
    ErrorCode code{};
    const SeqId bad = 1000000 + rand(0, 10);
    EXPECT_FALSE(run(true, [&](PagedCache& c) { c.shift(bad, 0, 1); }, &code));
    EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::InvalidArgument));
  }

  void check(SeqId id, int32_t layer) {
    for (PagedCache* c : caches) check_read(*c, id, model[id], layer, st);
  }

  void check_all() {
    for (auto& [id, s] : model)
      for (int32_t l = 0; l < cfg().n_layers; ++l) check(id, l);
  }

  // Cross-checks of the metadata that need no read-back.
  void check_counts() {
    PagedCache& c = *caches[0];
    const PagedStats ps = c.stats();
    int64_t live = 0;
    std::vector<SeqId> ids;
    for (auto& [id, s] : model) {
      live += static_cast<int64_t>(s.size());
      ids.push_back(id);
      EXPECT_EQ(c.info(id).n_live, static_cast<int32_t>(s.size()));
    }
    int32_t holders = 0;  // the PrefixCache's holder sequences: every sequence the model does not know
    for (SeqId id : c.sequences()) {
      if (model.count(id)) continue;
      EXPECT_TRUE(!prefixes.empty() && prefixes[0]->holds(id)) << "sequence " << id << " is neither the model's nor a holder";
      ++holders;
      live += c.info(id).n_live;
      ids.push_back(id);
    }
    EXPECT_EQ(ps.sequences, static_cast<int32_t>(model.size()) + holders);
    if (!prefixes.empty()) {
      const PrefixStats pst = prefixes[0]->stats();
      EXPECT_EQ(pst.holders, holders);
      EXPECT_EQ(pst.queries, prompts);
      EXPECT_EQ(pst.blocks_hit, ref_blocks_hit);
      EXPECT_EQ(pst.blocks_missed, ref_blocks_missed);
      EXPECT_EQ(pst.hit_queries, hit_prompts);
    }
    EXPECT_EQ(ps.tokens_live, live);
    const BlockTable csr = c.block_tables(ids);
    const std::vector<uint8_t> ind = download(csr.indices);
    std::vector<int32_t> blocks(ind.size() / 4);
    if (!ind.empty()) std::memcpy(blocks.data(), ind.data(), ind.size());
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    EXPECT_EQ(static_cast<int32_t>(blocks.size()), ps.blocks_used);
  }

  // The export for offset-aware readers (block_tables with PagedPositions::Offsets, no fold):
  // stored position - pos_offset of every live cell of `id` is the model's position, on every cache.
  void check_offsets(SeqId id) {
    const RefSeq& want = model[id];
    for (PagedCache* c : caches) {
      const SeqId ids[1] = {id};
      const BlockTable csr = c->block_tables(ids, PagedPositions::Offsets);
      auto i32 = [](const TensorRef& t) {
        const std::vector<uint8_t> b = download(t);
        std::vector<int32_t> v(b.size() / 4);
        if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
        return v;
      };
      const std::vector<int32_t> indptr = i32(csr.indptr), indices = i32(csr.indices), last = i32(csr.last_page_len),
                                 off = i32(csr.pos_offset), pos = i32(c->positions());
      const std::vector<uint8_t> valid = download(c->valid());
      const int32_t bs = c->config().block_size;
      const int32_t cells = PagedLayout::seq_cells(indptr.data(), last.data(), 0, bs);
      size_t t = 0;
      for (int32_t j = 0; j < cells; ++j) {
        const int64_t cell = static_cast<int64_t>(indices[j / bs]) * bs + j % bs;
        if (!valid[cell]) continue;
        if (t >= want.size() || pos[cell] - off[0] != want[t].pos) {
          ADD_FAILURE() << "seq " << id << " cell " << j << ": stored " << pos[cell] << " - offset " << off[0]
                        << " != model position " << (t < want.size() ? want[t].pos : -1);
          return;
        }
        ++t;
      }
      EXPECT_EQ(t, want.size()) << "live cells of seq " << id;
    }
  }

  void step() {
    ++ops;
    if (!prefixes.empty() && coin(0.12)) {
      op_prefix();
    } else {
      op_plain();
    }
    if (!model.empty() && coin(read_prob)) check(pick(), rand(0, cfg().n_layers - 1));
    if (!model.empty() && coin(offsets_prob)) check_offsets(pick());
    if (on_step) on_step(ops);
  }

  void op_plain() {
    const int32_t r = rand(0, 99);
    const int32_t n = static_cast<int32_t>(model.size());
    const PagedStats ps = caches[0]->stats();
    if (n == 0 || (n < max_seqs && r < 6)) op_create();
    else if (r < 45) op_append();
    else if (r < 54) op_shift();
    else if (r < 57) op_remove_positions();
    else if (r < 60) op_add_positions();
    else if (r < 72) op_truncate();
    else if (r < 78 && n < max_seqs) op_fork();
    else if (r < 84 || ps.blocks_free < 3) op_erase();
    else if (r < 86) op_bad_id();
    else if (r < 90) {
      run(false, [&](PagedCache& c) { c.prepare(); });
      EXPECT_FALSE(caches[0]->needs_prepare());
    } else {
      op_append();
    }
  }

  // Index of the first token of `s` whose position is in [p0, p1); -1 when none is.
  static int32_t first_in_range(const RefSeq& s, int32_t p0, int32_t p1) {
    for (size_t j = 0; j < s.size(); ++j)
      if (s[j].pos >= p0 && s[j].pos < p1) return static_cast<int32_t>(j);
    return -1;
  }

  // ---- prefix reuse ----

  void op_prefix() {
    const int32_t r = rand(0, 99);
    if (caches[0]->stats().blocks_free < 4 && coin(0.5)) op_prefix_clear();
    else if (r < 60) op_prompt();
    else op_publish();
  }

  // The K/V of token i of a prompt: a function of the salt and tokens [0, i] only.
  void prompt_token(const std::string& salt, std::span<const int32_t> prompt, int32_t i, RefToken& tok) const {
    const PagedCacheConfig& c = cfg();
    uint64_t h = 0xcbf29ce484222325ull;
    for (char ch : salt) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
    for (int32_t j = 0; j <= i; ++j) h = (h ^ static_cast<uint32_t>(prompt[j])) * 0x100000001b3ull;
    auto next = [&h] {  // splitmix64
      uint64_t z = (h += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    auto row = [&](int32_t width, std::vector<double>& out) {
      out.resize(static_cast<size_t>(c.n_kv_heads) * width);
      for (int32_t hh = 0; hh < c.n_kv_heads; ++hh) {
        const float scale = std::exp2(static_cast<float>(static_cast<int32_t>(next() % 13) - 6));
        for (int32_t d = 0; d < width; ++d)
          out[static_cast<size_t>(hh) * width + d] =
              static_cast<float>(static_cast<int64_t>(next() >> 40) - (1 << 23)) * 0x1p-23f * scale;
      }
    };
    tok = RefToken{};
    tok.token = prompt[i];
    tok.fresh = true;
    tok.pos = i;
    tok.angle = std::abs(static_cast<double>(i));
    tok.k.resize(c.n_layers);
    const int32_t DV = stored_v_width(c);
    if (DV) tok.v.resize(c.n_layers);
    for (int32_t l = 0; l < c.n_layers; ++l) {
      row(c.head_dim, tok.k[l]);
      if (DV) row(DV, tok.v[l]);
    }
    v_from_latent(c, tok);
  }

  void op_prompt() {
    if (static_cast<int32_t>(model.size()) >= max_seqs) return;
    const int32_t bs = cfg().block_size;
    if (systems.empty())
      for (int32_t len : {2 * bs + bs / 2, 3 * bs + 1, bs + 3}) {
        std::vector<int32_t> t(len);
        for (int32_t& x : t) x = rand(0, 999);
        systems.push_back(std::move(t));
      }
    const std::string salt = coin(0.5) ? "tenant-a" : "tenant-b";
    const std::vector<int32_t>& sys = systems[rand(0, static_cast<int32_t>(systems.size()) - 1)];
    std::vector<int32_t> prompt(sys.begin(), sys.begin() + (coin(0.3) ? rand(1, static_cast<int32_t>(sys.size())) : sys.size()));
    for (int32_t i = rand(0, bs + bs / 2); i > 0; --i) prompt.push_back(rand(0, 7));
    const int32_t len = static_cast<int32_t>(prompt.size());
    // The reference's prediction: the longest run of published full blocks, leaving a token to compute.
    const int32_t full = (len - 1) / bs;
    int32_t m = 0;
    while (m < full && published.count({salt, std::vector<int32_t>(prompt.begin(), prompt.begin() + (m + 1) * bs)})) ++m;
    std::vector<SeqId> got;
    std::vector<int32_t> reused;
    run(false, [&](PagedCache& c) {
      int32_t n = -1;
      got.push_back(prefix_of(c)->create(prompt, salt, &n));
      reused.push_back(n);
    });
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], got[0]);
      EXPECT_EQ(reused[i], m * bs) << "prompt of " << len << " tokens: reused " << reused[i] << ", the reference says "
                                   << m * bs;
    }
    ++prompts;
    ref_blocks_hit += m;
    ref_blocks_missed += full - m;
    hit_prompts += m > 0 ? 1 : 0;
    const SeqId id = got[0];
    prompted.insert(id);
    salt_of[id] = salt;
    RefSeq& s = model[id];
    s.resize(static_cast<size_t>(m) * bs);
    for (int32_t i = 0; i < m * bs; ++i) prompt_token(salt, prompt, i, s[i]);
    if (m > 0 && coin(0.5)) check(id, rand(0, cfg().n_layers - 1));  // the reused blocks hold the prompt's K/V
    // The rest of the prompt: new blocks only (the reused part ends on a block boundary).
    const int32_t n = len - m * bs;
    std::vector<RefToken> toks(n);
    for (int32_t i = 0; i < n; ++i) prompt_token(salt, prompt, m * bs + i, toks[i]);
    std::vector<int32_t> positions(n);
    for (int32_t i = 0; i < n; ++i) positions[i] = m * bs + i;
    const PagedCacheConfig& c = cfg();
    const int32_t L = c.n_layers, H = c.n_kv_heads, D = c.head_dim, DV = stored_v_width(c);
    auto tensor_of = [&](int32_t width, bool v, Device dev, Buffer& b) {
      std::vector<float> h(static_cast<size_t>(L) * n * H * width);
      for (int32_t l = 0; l < L; ++l)
        for (int32_t i = 0; i < n; ++i) {
          const std::vector<double>& src = v ? toks[i].v[l] : toks[i].k[l];
          for (size_t e = 0; e < src.size(); ++e) h[(static_cast<size_t>(l) * n + i) * H * width + e] = static_cast<float>(src[e]);
        }
      b = Buffer(std::max<size_t>(h.size() * 4, 4), dev);
      copy_bytes(b.data(), dev, h.data(), Device::cpu(), h.size() * 4);
      return TensorRef(b.data(), DType::F32, dev, {L, n, H, width});
    };
    const bool may_fail = (len + bs - 1) / bs - m > caches[0]->stats().blocks_free;
    ErrorCode code{};
    const bool ok = run(may_fail, [&](PagedCache& cache) {
      Buffer kb, vb;
      const TensorRef k = tensor_of(D, false, cache.device(), kb);
      const TensorRef v = DV ? tensor_of(DV, true, cache.device(), vb) : TensorRef{};
      cache.append(id, positions, k, v);
    }, &code);
    if (!ok) {
      EXPECT_EQ(static_cast<int>(code), static_cast<int>(ErrorCode::OutOfMemory));
      ++oom;
      return;
    }
    for (RefToken& t : toks) s.push_back(std::move(t));
  }

  void op_publish() {
    std::vector<SeqId> cands;
    for (SeqId id : prompted)
      if (model.count(id)) cands.push_back(id);
    if (cands.empty()) return;
    const SeqId id = cands[rand(0, static_cast<int32_t>(cands.size()) - 1)];
    const RefSeq& s = model[id];
    // The engine passes every token id it has (edited tokens included: only the PrefixCache's own
    // bookkeeping may cut them); what may be published is the run still as a fresh prompt computes it.
    std::vector<int32_t> tokens;
    while (tokens.size() < s.size() && s[tokens.size()].token >= 0) tokens.push_back(s[tokens.size()].token);
    size_t fresh = 0;
    while (fresh < tokens.size() && s[fresh].fresh && s[fresh].pos == static_cast<int32_t>(fresh)) ++fresh;
    const int32_t bs = cfg().block_size;
    const int32_t want = static_cast<int32_t>(fresh) / bs * bs;
    std::vector<int32_t> got;
    run(false, [&](PagedCache& c) { got.push_back(prefix_of(c)->publish(id, tokens, salt_of[id])); });
    for (int32_t g : got) EXPECT_EQ(g, want) << "publish of " << tokens.size() << " tokens, " << fresh << " of them fresh";
    for (int32_t k = 1; k * bs <= want; ++k)
      published.insert({salt_of[id], std::vector<int32_t>(tokens.begin(), tokens.begin() + k * bs)});
    ++publishes;
  }

  void op_prefix_clear() {
    run(false, [&](PagedCache& c) { prefix_of(c)->clear(); });
    published.clear();
    ++clears;
  }
};

}  // namespace paged_test
