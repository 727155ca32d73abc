// Demo section 40: PagedCache in both RoPE modes. A shared prompt forked into two
// continuations (prefix sharing, copy on write of the tail), a speculative draft rolled back
// (truncate), and a context shift; every read-back is compared with a float64 reference.
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

// The reference: per sequence, (position, K row as written) for layer 0; all heads.
struct Ref {
  std::vector<int32_t> pos;
  std::vector<std::vector<float>> k;
};

struct Demo {
  PagedCache cache;
  std::map<SeqId, Ref> ref;
  uint64_t state = 12345;
  double worst = 0;

  Demo(PagedCacheConfig cfg, Device dev) : cache(std::move(cfg), dev) {}

  float rnd() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(state >> 41) - (1 << 22)) * 0x1p-22f;
  }

  void append(SeqId s, int32_t n) {
    const PagedCacheConfig& c = cache.config();
    const int32_t row = c.n_kv_heads * c.head_dim;
    std::vector<float> k(static_cast<size_t>(c.n_layers) * n * row), v(static_cast<size_t>(c.n_layers) * n * c.n_kv_heads * c.v_head_dim);
    for (float& x : k) x = rnd();
    for (float& x : v) x = rnd();
    std::vector<int32_t> p(n);
    Ref& r = ref[s];
    for (int32_t i = 0; i < n; ++i) {
      p[i] = (r.pos.empty() ? -1 : r.pos.back()) + 1 + i;
      r.k.emplace_back(k.begin() + static_cast<int64_t>(i) * row, k.begin() + static_cast<int64_t>(i + 1) * row);
    }
    r.pos.insert(r.pos.end(), p.begin(), p.end());
    Buffer kb = Buffer::from_host(k, cache.device()), vb = Buffer::from_host(v, cache.device());
    cache.append(s, p, TensorRef::of(kb, DType::F32, {c.n_layers, n, c.n_kv_heads, c.head_dim}),
                 TensorRef::of(vb, DType::F32, {c.n_layers, n, c.n_kv_heads, c.v_head_dim}));
  }

  // Read layer 0 of s back and compare with a fresh f64 rotation of the reference.
  bool check(SeqId s, const char* what) {
    const PagedCacheConfig& c = cache.config();
    const PagedReadBack rb = cache.read(s, 0);
    const Ref& r = ref[s];
    if (rb.positions != r.pos) {
      std::printf("    %-44s FAIL: positions differ\n", what);
      return false;
    }
    const math::RopeTable& t = cache.rope_table(0);
    double err = 0;
    for (size_t j = 0; j < r.pos.size(); ++j)
      for (int32_t h = 0; h < c.n_kv_heads; ++h) {
        std::vector<double> w(r.k[j].begin() + h * c.head_dim, r.k[j].begin() + (h + 1) * c.head_dim);
        for (int32_t i = 0; i < t.layout.n_pairs(); ++i) {
          const double a = static_cast<double>(r.pos[j]) * t.freq[i];
          const double x0 = w[t.layout.dim0(i)], x1 = w[t.layout.dim1(i)];
          w[t.layout.dim0(i)] = x0 * std::cos(a) - x1 * std::sin(a);
          w[t.layout.dim1(i)] = x0 * std::sin(a) + x1 * std::cos(a);
        }
        for (int32_t d = 0; d < c.head_dim; ++d)
          err = std::max(err, std::abs(w[d] - rb.k[(j * c.n_kv_heads + h) * c.head_dim + d]));
      }
    // FP8: one rounding is up to 2^-4 of a value; rope-stored FP8 keys re-quantize at every rotation.
    const double tol = c.k_format != KvFormat::Fp8 ? 3e-3 : (c.rope_mode == RopeMode::RopeStored ? 0.25 : 0.07);
    worst = std::max(worst, err);
    const PagedStats st = cache.stats();
    std::printf("    %-44s %3zu tokens, max |err| %.2e (tol %.2g); blocks used %d shared %d, dead cells %lld  %s\n", what,
                r.pos.size(), err, tol, st.blocks_used, st.blocks_shared, static_cast<long long>(st.tokens_dead),
                err <= tol ? "ok" : "FAIL");
    return err <= tol;
  }
};

int run_mode(const cli::DemoOptions& opt, KvFormat f, RopeMode mode) {
  PagedCacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.head_dim = c.v_head_dim = 64;
  c.block_size = 8;
  c.num_blocks = opt.quick ? 48 : 512;
  c.k_format = c.v_format = f;
  c.rope = {RopeSpec::plain(64, 10000.0)};
  c.rope_mode = mode;
  Demo d(c, opt.device);
  const int32_t prompt = opt.quick ? 21 : 181;
  std::printf("  %s, %s, block 8, %d blocks on %s\n", std::string(kv_format_name(f)).c_str(),
              mode == RopeMode::RopeStored ? "rope stored (K rotated at write)" : "rope on read (K unrotated, positions kept)",
              c.num_blocks, opt.device.str().c_str());
  bool ok = true;
  const SeqId sys = d.cache.create();
  d.append(sys, prompt);
  ok &= d.check(sys, "shared prompt");
  const SeqId a = d.cache.fork(sys), b = d.cache.fork(sys);
  d.ref[a] = d.ref[sys];
  d.ref[b] = d.ref[sys];
  ok &= d.check(a, "two forks: every block shared, none copied");
  d.append(a, 5);
  d.append(b, 9);
  ok &= d.check(a, "fork a continues (tail copied on write)");
  ok &= d.check(b, "fork b continues");
  ok &= d.check(sys, "prompt unchanged");
  // Speculative decoding: 6 draft tokens, 4 rejected.
  d.append(b, 6);
  d.cache.truncate(b, static_cast<int32_t>(d.ref[b].pos.size()) - 4);
  d.ref[b].pos.resize(d.ref[b].pos.size() - 4);
  d.ref[b].k.resize(d.ref[b].k.size() - 4);
  ok &= d.check(b, "draft of 6, 4 rejected (truncate)");
  // Context shift: keep 4, drop 12, then 3 more shifts of 2 before the next read.
  auto shift = [&](SeqId s, int32_t keep, int32_t n) {
    d.cache.shift(s, keep, n);
    Ref& r = d.ref[s];
    r.pos.erase(r.pos.begin() + keep, r.pos.begin() + keep + n);
    r.k.erase(r.k.begin() + keep, r.k.begin() + keep + n);
    for (size_t j = keep; j < r.pos.size(); ++j) r.pos[j] -= n;
  };
  shift(a, 4, 12);
  ok &= d.check(a, "shift(4, 12)");
  for (int i = 0; i < 3; ++i) shift(a, 4, 2);
  std::printf("    3 more shifts: %lld cells wait for one rotation\n", static_cast<long long>(d.cache.stats().cells_pending));
  ok &= d.check(a, "3 x shift(4, 2), rotated once on read");
  ok &= d.check(b, "fork b untouched by a's shifts");
  d.cache.erase(a);
  d.cache.erase(b);
  ok &= d.check(sys, "forks erased, prompt intact");
  return ok ? 0 : 1;
}

}  // namespace

KVCORE_DEMO_SECTION(40, "paged", "PagedCache: prefix sharing, speculative rollback, context shift in both RoPE modes") {
  int failures = 0;
  for (KvFormat f : {KvFormat::F16, KvFormat::Fp8})
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) failures += run_mode(opt, f, m);
  return failures;
}
