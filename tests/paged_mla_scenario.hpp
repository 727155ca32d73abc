// DeepSeek-V2/V3 MLA through PagedCache (tests/paged_configs.hpp's mla_config: K 576 = the
// 512-dim latent and a 64-dim RoPE tail, V 512): one scenario that stores, shifts, forks,
// rolls back and appends a decode step, on a cache of either device, while a float64 model
// keeps every token as written; then the model's attention for a query batch.
//
// V of each token is random, or -- in MLA proper -- the first 512 dims of its K row (the latent):
// always so for a cache with v_from_k_latent (which is given K only), and on request for a
// separate-V cache (fed the latent as V), so the two layouts can be compared on the same tokens.
//
// Reference attention, per (sequence, query head): keys and the query rotated in double at
// their positions (interleaved pairs of dims [512, 576), frequencies from
// rope_frequencies_f64, cos and sin times the spec's attention factor), scores
// 576^-0.5 * q . k, softmax in double, out = sum softmax * V (512 dims). Rope-stored and
// rope-on-read caches compute the same function: the caller of a rope-stored cache passes the
// query rotated (here: rotated in double, rounded to f32), a rope-on-read cache rotates it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "paged_configs.hpp"

namespace mla_test {

using namespace kvcore;

inline constexpr int32_t kDk = 576, kDv = 512, kLayers = 2;

struct Token {
  int32_t pos = 0;
  std::vector<double> k[kLayers], v[kLayers];  // as written (K unrotated)
};

// x's RoPE dims rotated in double at `pos` (cos and sin times the spec's attention factor).
inline std::vector<double> rotate_f64(std::vector<double> x, const RopeSpec& spec, int32_t pos) {
  const math::RopeLayout l = spec.layout(kDk);
  const std::vector<double> w = rope_frequencies_f64(spec);
  for (int32_t i = 0; i < l.n_pairs(); ++i) {
    const double a = pos * w[static_cast<size_t>(i)];
    const double c = std::cos(a) * spec.attention_factor, s = std::sin(a) * spec.attention_factor;
    const double x0 = x[static_cast<size_t>(l.dim0(i))], x1 = x[static_cast<size_t>(l.dim1(i))];
    x[static_cast<size_t>(l.dim0(i))] = x0 * c - x1 * s;
    x[static_cast<size_t>(l.dim1(i))] = x0 * s + x1 * c;
  }
  return x;
}

// Worst |out - reference| allowed (outputs are averages of V values in [-1, 1]): K and V each
// rounded once to the format, so the bound scales with its epsilon (f16 2^-11, bf16 2^-8, fp8's
// e4m3 2^-4 per 64-value group).
inline double attention_tolerance(KvFormat f) {
  switch (f) {
    case KvFormat::F16: return 2e-3;
    case KvFormat::BF16: return 1.2e-2;
    default: return 8e-2;
  }
}

class Scenario {
 public:
  // The scenario's operations applied to `cache` (an mla_config cache, any format and mode).
  Scenario(PagedCache& cache, uint32_t seed, bool v_is_latent = false)
      : cache_(cache), rng_(seed), v_is_latent_(v_is_latent || cache.config().v_from_k_latent),
        shared_(cache.config().v_from_k_latent) {
    const SeqId a = cache.create(), b = cache.create();
    seqs_ = {a, b};
    model_.resize(2);
    append(0, 0, 40);
    append(1, 0, 25);
    // Context shift of a: keep 4, drop 9; the later 27 tokens move down by 9 positions.
    cache.shift(a, 4, 9);
    model_[0].erase(model_[0].begin() + 4, model_[0].begin() + 13);
    for (size_t i = 4; i < model_[0].size(); ++i) model_[0][i].pos -= 9;
    // Fork b (beam / parallel sampling); both branches write into the shared tail block.
    seqs_.push_back(cache.fork(b));
    model_.push_back(model_[1]);
    append(2, 25, 6);
    append(1, 25, 3);
    // Speculative rollback of b to 20 tokens, then 2 accepted ones.
    cache.truncate(b, 20);
    model_[1].resize(20);
    append(1, 20, 2);
    decode_step();
  }

  const std::vector<SeqId>& seqs() const { return seqs_; }
  const std::vector<std::vector<Token>>& model() const { return model_; }
  // The position of each sequence's next token (the decode query's position).
  std::vector<int32_t> next_positions() const {
    std::vector<int32_t> p;
    for (const auto& s : model_) p.push_back(s.back().pos + 1);
    return p;
  }

  // Reference output [seqs, n_q_heads, 512] for queries q_raw [seqs, n_q_heads, 576] (unrotated).
  std::vector<double> reference(int32_t layer, const std::vector<float>& q_raw, int32_t n_q_heads) const {
    const RopeSpec& spec = cache_.config().rope_for(layer);
    const std::vector<int32_t> qpos = next_positions();
    std::vector<double> out;
    for (size_t r = 0; r < model_.size(); ++r) {
      std::vector<std::vector<double>> keys;
      for (const Token& t : model_[r]) keys.push_back(rotate_f64(t.k[layer], spec, t.pos));
      for (int32_t h = 0; h < n_q_heads; ++h) {
        const size_t q0 = (r * n_q_heads + h) * kDk;
        std::vector<double> q(q_raw.begin() + static_cast<std::ptrdiff_t>(q0),
                              q_raw.begin() + static_cast<std::ptrdiff_t>(q0 + kDk));
        q = rotate_f64(q, spec, qpos[r]);
        std::vector<double> s(keys.size());
        double m = -INFINITY;
        for (size_t j = 0; j < keys.size(); ++j) {
          double d = 0;
          for (int32_t e = 0; e < kDk; ++e) d += q[e] * keys[j][e];
          s[j] = d / std::sqrt(double(kDk));
          m = std::max(m, s[j]);
        }
        double den = 0;
        for (double& x : s) den += (x = std::exp(x - m));
        for (int32_t e = 0; e < kDv; ++e) {
          double o = 0;
          for (size_t j = 0; j < keys.size(); ++j) o += s[j] / den * model_[r][j].v[layer][e];
          out.push_back(o);
        }
      }
    }
    return out;
  }

  // The query the cache takes: rotated by the caller for a rope-stored cache, as is for rope-on-read.
  std::vector<float> query_for_cache(int32_t layer, const std::vector<float>& q_raw, int32_t n_q_heads) const {
    if (cache_.config().rope_mode == RopeMode::RopeOnRead) return q_raw;
    const RopeSpec& spec = cache_.config().rope_for(layer);
    const std::vector<int32_t> qpos = next_positions();
    std::vector<float> q(q_raw.size());
    for (size_t r = 0; r < model_.size(); ++r)
      for (int32_t h = 0; h < n_q_heads; ++h) {
        const size_t q0 = (r * n_q_heads + h) * kDk;
        const std::vector<double> x = rotate_f64(
            std::vector<double>(q_raw.begin() + static_cast<std::ptrdiff_t>(q0), q_raw.begin() + static_cast<std::ptrdiff_t>(q0 + kDk)),
            spec, qpos[r]);
        for (int32_t e = 0; e < kDk; ++e) q[q0 + e] = static_cast<float>(x[e]);
      }
    return q;
  }

 private:
  Token random_token(int32_t pos) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    Token t;
    t.pos = pos;
    for (int32_t l = 0; l < kLayers; ++l) {
      // f32-exact inputs; the RoPE tail 3x the latent's scale, so that positions weigh in the scores
      for (int32_t e = 0; e < kDk; ++e) t.k[l].push_back(static_cast<float>(u(rng_) * (e < kDv ? 1.0 : 3.0)));
      for (int32_t e = 0; e < kDv; ++e) t.v[l].push_back(static_cast<float>(u(rng_)));
      if (v_is_latent_) t.v[l].assign(t.k[l].begin(), t.k[l].begin() + kDv);  // (drawn anyway: same stream)
    }
    return t;
  }

  Buffer upload(const std::vector<float>& host) const { return Buffer::from_host(host, cache_.device()); }

  // n tokens at positions p0, p0 + 1, ... through append() (every layer at once).
  void append(size_t s, int32_t p0, int32_t n) {
    std::vector<int32_t> pos;
    std::vector<Token> toks;
    for (int32_t i = 0; i < n; ++i) toks.push_back(random_token(p0 + i)), pos.push_back(p0 + i);
    std::vector<float> k, v;
    for (int32_t l = 0; l < kLayers; ++l)
      for (const Token& t : toks) {
        k.insert(k.end(), t.k[l].begin(), t.k[l].end());
        v.insert(v.end(), t.v[l].begin(), t.v[l].end());
      }
    const Buffer dk = upload(k), dv = upload(v);
    cache_.append(seqs_[s], pos, TensorRef(dk.data(), DType::F32, cache_.device(), {kLayers, n, 1, kDk}),
                  shared_ ? TensorRef() : TensorRef(dv.data(), DType::F32, cache_.device(), {kLayers, n, 1, kDv}));
    model_[s].insert(model_[s].end(), toks.begin(), toks.end());
  }

  // One token for every sequence through reserve() + store() per layer (a decode step's append).
  void decode_step() {
    const std::vector<int32_t> pos = next_positions();
    const std::vector<int32_t> counts(seqs_.size(), 1);
    AppendTicket ticket = cache_.reserve(seqs_, counts, pos);
    std::vector<Token> toks;
    for (int32_t p : pos) toks.push_back(random_token(p));
    for (int32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k, v;
      for (const Token& t : toks) {
        k.insert(k.end(), t.k[l].begin(), t.k[l].end());
        v.insert(v.end(), t.v[l].begin(), t.v[l].end());
      }
      const Buffer dk = upload(k), dv = upload(v);
      const int64_t n = static_cast<int64_t>(toks.size());
      cache_.store(ticket, l, TensorRef(dk.data(), DType::F32, cache_.device(), {n, 1, kDk}),
                   shared_ ? TensorRef() : TensorRef(dv.data(), DType::F32, cache_.device(), {n, 1, kDv}));
    }
    for (size_t s = 0; s < toks.size(); ++s) model_[s].push_back(toks[s]);
  }

  PagedCache& cache_;
  std::mt19937 rng_;
  bool v_is_latent_ = false, shared_ = false;
  std::vector<SeqId> seqs_;
  std::vector<std::vector<Token>> model_;
};

// One parameter of the MLA suites (CPU and CUDA): pool format, RoPE mode, and whether every layer
// shares one RoPE spec (as DeepSeek's do: CUDA then rotates all layers in one launch).
// shared_v: MLA's shared layout (v_from_k_latent: V is K's latent, no V pools).
struct MlaCase {
  KvFormat format;
  RopeMode mode;
  bool one_spec = false;
  bool shared_v = false;
};

inline PagedCacheConfig config_of(const MlaCase& mc) {
  PagedCacheConfig c = paged_test::mla_config(mc.format, mc.mode, 16, 32);
  if (mc.one_spec) c.rope = {c.rope[0]};
  c.v_from_k_latent = mc.shared_v;
  return c;
}

// Every format in both modes, and every format with one spec for all layers.
inline std::vector<MlaCase> all_cases() {
  std::vector<MlaCase> v;
  for (KvFormat f : paged_test::kMlaFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m});
  for (KvFormat f : paged_test::kMlaFormats) v.push_back({f, RopeMode::RopeStored, true});
  for (KvFormat f : paged_test::kMlaFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m, false, true});
  v.push_back({KvFormat::Fp8, RopeMode::RopeStored, true, true});
  return v;
}

inline std::string case_name(const MlaCase& mc) {
  return std::string(kv_format_name(mc.format)) + (mc.mode == RopeMode::RopeStored ? "_RopeStored" : "_RopeOnRead") +
         (mc.one_spec ? "_OneSpec" : "") + (mc.shared_v ? "_SharedV" : "");
}

}  // namespace mla_test
