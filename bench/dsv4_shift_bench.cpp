// `kvcore bench dsv4_shift`: the DeepSeek-V4 context shift (docs/specs/dsv4-context-shift.md) of
// one V4-Flash sequence (43 layers, packed FP8 rows, FP4 indexer rows) at 8k and 64k tokens:
// n_keep 128 with half the context discarded, and with 128 tokens discarded (moves that overlap
// themselves). Bytes: what the shift must move at least, each moved byte read once and written
// once: every moved compressed row (584 B) and indexer row (68 B), and the 64 rotated dims
// (128 B) of each raw-window row of the kept tail. Compared with the copy ceiling.
// The stores hold random valid rows (lengths set through the persistence hook): the work does
// not depend on the values. Before timing, one shift is checked against the CPU on the same
// bytes, bit for bit. Sequences rotate so the timed stores exceed the L2.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "cache/dsv4_export.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;
using kvcore::cli::BenchOptions;
using kvcore::cli::BenchRecord;
using kvcore::cli::Traffic;

struct Rng {  // xorshift64*: fast enough to fill hundreds of MB
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
};

// Random valid bytes for one view: FP8 codes without NaN, moderate scales, finite bf16 / f16 /
// f32 values; FP4 nibbles are all valid.
std::vector<uint8_t> random_bytes(const TensorRef& t, bool packed_rows, bool packed_idx, bool is_idx, Rng& rng) {
  std::vector<uint8_t> v(static_cast<size_t>(t.span_bytes()));
  const size_t row = static_cast<size_t>(t.size(1)) * t.element_size();
  for (size_t r = 0; r < v.size() / row; ++r) {
    uint8_t* p = v.data() + r * row;
    if (is_idx && packed_idx) {
      for (size_t i = 0; i < row; ++i) p[i] = static_cast<uint8_t>(rng.next());
      for (size_t i = row - 4; i < row; ++i) p[i] = static_cast<uint8_t>(120 + rng.next() % 10);  // ue8m0 near 2^0
    } else if (!is_idx && packed_rows) {
      using L = math::Dsv4RowLayout;
      for (int i = 0; i < L::kNope; ++i) p[i] = static_cast<uint8_t>(rng.next() % 0x7e) | static_cast<uint8_t>(rng.next() & 0x80);
      for (int i = 0; i < L::kRope; ++i) {
        const uint16_t b = static_cast<uint16_t>(0x3c00 + rng.next() % 0x0400) | static_cast<uint16_t>(rng.next() & 0x8000);
        std::memcpy(p + L::kRopeOffset + 2 * i, &b, 2);  // bf16 in [2^-7, 2^1)
      }
      for (int i = 0; i < L::kBlocks; ++i) p[L::kScaleOffset + i] = static_cast<uint8_t>(120 + rng.next() % 10);
      p[L::kPadOffset] = 0;
    } else if (t.dtype() == DType::F16) {
      for (size_t i = 0; i < row / 2; ++i) {
        const uint16_t h = static_cast<uint16_t>(0x3000 + rng.next() % 0x1000) | static_cast<uint16_t>(rng.next() & 0x8000);
        std::memcpy(p + 2 * i, &h, 2);
      }
    } else {
      for (size_t i = 0; i < row / 4; ++i) {
        const float f = static_cast<float>(static_cast<int64_t>(rng.next() % 2001) - 1000) / 500.0f;
        std::memcpy(p + 4 * i, &f, 4);
      }
    }
  }
  return v;
}

void fill(Dsv4Cache& c, SeqId seq, int64_t length, Rng& rng) {
  for (int l = 0; l < c.n_layers(); ++l) {
    std::vector<TensorRef> v = {c.raw_ring(seq, l)};
    if (c.kind(l) != Dsv4LayerKind::Window) v.push_back(c.compressed_store(seq, l));
    if (c.kind(l) == Dsv4LayerKind::CSA) v.push_back(c.indexer_store(seq, l));
    for (size_t i = 0; i < v.size(); ++i) {
      const std::vector<uint8_t> b = random_bytes(v[i], c.compressed_packed(), c.indexer_packed(), i == 2, rng);
      copy_bytes(v[i].data(), c.device(), b.data(), Device::cpu(), b.size());
    }
  }
  const std::vector<int64_t> lens(c.n_layers(), length);
  dsv4_set_lengths(c, seq, lens);
}

// The fewest bytes the shift moves: read + write of each moved row and each rotated raw dim.
double min_bytes(const Dsv4Cache& c, int64_t L, int64_t K, int64_t D) {
  const Dsv4CacheConfig& cfg = c.config();
  const int64_t W = cfg.window, Lp = L - D, tail_in_window = std::min(W, Lp - K);
  double b = 0;
  for (int l = 0; l < c.n_layers(); ++l) {
    b += 2.0 * tail_in_window * cfg.n_rot * (cfg.quant == Dsv4Quant::On ? 2 : 4);
    if (c.kind(l) == Dsv4LayerKind::Window) continue;
    const int64_t m = cfg.ratio(c.kind(l)), moved = L / m - K / m - D / m;
    b += 2.0 * moved * c.compressed_row_bytes();
    if (c.kind(l) == Dsv4LayerKind::CSA) b += 2.0 * moved * c.indexer_row_bytes();
  }
  return b;
}

// One shift on the device cache and on a CPU cache holding the same bytes: every byte equal.
bool check_against_cpu(Dsv4Cache& dev, SeqId seq, int64_t L, int64_t K, int64_t D) {
  Dsv4Cache cpu(dev.config(), Device::cpu());
  const SeqId cs = cpu.create();
  auto views = [](const Dsv4Cache& c, SeqId s) {
    std::vector<TensorRef> v;
    for (int l = 0; l < c.n_layers(); ++l) {
      v.push_back(c.raw_ring(s, l));
      if (c.kind(l) != Dsv4LayerKind::Window) v.push_back(c.compressed_store(s, l));
      if (c.kind(l) == Dsv4LayerKind::CSA) v.push_back(c.indexer_store(s, l));
    }
    return v;
  };
  const std::vector<TensorRef> a = views(dev, seq), b = views(cpu, cs);
  synchronize(dev.device());
  for (size_t i = 0; i < a.size(); ++i) copy_bytes(b[i].data(), Device::cpu(), a[i].data(), dev.device(), a[i].span_bytes());
  const std::vector<int64_t> lens(dev.n_layers(), L);
  dsv4_set_lengths(dev, seq, lens);
  dsv4_set_lengths(cpu, cs, lens);
  dev.shift(seq, static_cast<int32_t>(K), static_cast<int32_t>(D));
  cpu.shift(cs, static_cast<int32_t>(K), static_cast<int32_t>(D));
  synchronize(dev.device());
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<uint8_t> x(a[i].span_bytes()), y(b[i].span_bytes());
    copy_bytes(x.data(), Device::cpu(), a[i].data(), dev.device(), x.size());
    copy_bytes(y.data(), Device::cpu(), b[i].data(), Device::cpu(), y.size());
    if (x != y) return false;
  }
  return true;
}

std::string case_name(int64_t L, int64_t K, int64_t D) {
  return "flash43 L=" + std::to_string(L) + " keep=" + std::to_string(K) + " discard=" + std::to_string(D);
}

void bench_shift(BenchOptions& opt, int64_t L, int64_t K, int64_t D) {
  if (!opt.wants(case_name(L, K, D))) return;
  const Device dev = opt.device;
  const int64_t per_seq = [&] {
    Dsv4Cache probe(Dsv4CacheConfig::v4_flash(static_cast<int32_t>(L), 1), Device::cpu());
    return static_cast<int64_t>(probe.memory_report({static_cast<int32_t>(L)})[0].total_bytes);
  }();
  const int n_seqs = static_cast<int>(std::clamp<int64_t>((160ll << 20) / std::max<int64_t>(per_seq, 1) + 1, 1, 8));
  Dsv4Cache cache(Dsv4CacheConfig::v4_flash(static_cast<int32_t>(L), n_seqs), dev);
  Rng rng{0x9e3779b97f4a7c15ull};
  std::vector<SeqId> seqs;
  for (int i = 0; i < n_seqs; ++i) {
    seqs.push_back(cache.create());
    fill(cache, seqs.back(), L, rng);
  }
  BenchRecord r;
  r.bench = "dsv4_shift";
  r.case_name = case_name(L, K, D);
  r.bytes = min_bytes(cache, L, K, D);
  r.traffic = Traffic::Copy;
  const bool ok = check_against_cpu(cache, seqs[0], L, K, D);
  opt.note(r.case_name + (ok ? ": check: every byte equal to the CPU's shift" : ": check FAILED: bytes differ from the CPU's shift"));
  const std::vector<int64_t> lens(cache.n_layers(), L);
  r.t = opt.time([&](int rep) {
    const SeqId s = seqs[rep % n_seqs];
    dsv4_set_lengths(cache, s, lens);  // host metadata only: the same shift again, on rotated data
    cache.shift(s, static_cast<int32_t>(K), static_cast<int32_t>(D));
  });
  opt.report(r);
}

}  // namespace

KVCORE_BENCH(dsv4_shift, "DeepSeek-V4-Flash context shift of one sequence (43 layers): 8k and 64k tokens, GB/s vs copy") {
  const std::vector<int64_t> contexts = opt.quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{8192, 65536};
  for (int64_t L : contexts) {
    const int64_t half = (L / 2) / 128 * 128;
    bench_shift(opt, L, 128, half);
    bench_shift(opt, L, 128, 128);
  }
}
