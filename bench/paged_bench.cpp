// `kvcore bench paged`: PagedCache on Llama-3-8B geometry (32 layers, 8 kv heads x 128,
// block 16, RopeSpec::llama3_8b).
//   append_<fmt>_<n>:        append n tokens to every layer through the fused store (rotate +
//                            quantize + place), then truncate back; bytes = sources read + pool written
//   decode_<fmt>_b64:        one decode step for 64 sequences: reserve + 32 per-layer stores
//   shift_<mode>_<ctx>_<d>:  shift(4, d) of a ctx-token sequence, every layer; rope-stored includes
//                            prepare() (the one rotation of the retained K: bytes = K read + written);
//                            rope-on-read edits metadata only (the cells before the cut and the cut
//                            blocks; the sequence's position offset grows): the shift alone, which is
//                            all an offset-aware reader (block_tables(.., PagedPositions::Offsets))
//                            needs; bytes = positions/validity of the cells edited.
//   shift_onread_<ctx>_<d>_fold: the same followed by prepare(), which folds the offset into every
//                            cell (what a reader of plain positions() needs): O(context).
//                            Timed on the host clock around the call (it is host + device work);
//                            every baseline registered with KVCORE_PAGED_SHIFT_BASELINE runs on the
//                            same geometry and is reported beside it.
//   shift_stored_[fp8_]smollm2_<ctx>_half: the rope-stored shift on SmolLM2-135M's geometry (30
//                            layers, 3 kv heads x 64): small heads, where the per-cell angles weigh most
//   fork_<ctx>, fork_write_<ctx>: fork + erase of a ctx-token sequence; the same with one appended
//                            token in between (copies the shared tail block of every layer)
// Results are checked against a float64 rotation of the source rows before anything is timed.
#include "bench/paged_bench.hpp"
#include "bench/rope_check.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

namespace kvcore::cli {

std::vector<PagedShiftBaseline>& paged_shift_baselines() {
  static std::vector<PagedShiftBaseline> v;
  return v;
}

namespace {

struct Geometry {
  int32_t layers = 32, heads = 8, dim = 128;
  RopeSpec rope = RopeSpec::llama3_8b();
  std::string tag;  // in case names after the mode ("smollm2_"); empty for Llama-3-8B
};

// SmolLM2-135M's KV geometry (30 layers, 3 kv heads x 64, theta 100000): many layers of small
// heads, where a stored-mode shift's per-cell angles weigh most against the rows they rotate.
Geometry smollm2() { return Geometry{30, 3, 64, RopeSpec::plain(64, 100000.0), "smollm2_"}; }

PagedCacheConfig llama_config(const Geometry& g, KvFormat f, RopeMode mode, int64_t tokens) {
  PagedCacheConfig c;
  c.n_layers = g.layers;
  c.n_kv_heads = g.heads;
  c.head_dim = g.dim;
  c.v_head_dim = g.dim;
  c.block_size = 16;
  c.num_blocks = static_cast<int32_t>((tokens + 15) / 16 + 64);  // slack: blocks a shift leaves partly dead
  c.k_format = c.v_format = f;
  c.rope = {g.rope};
  c.rope_mode = mode;
  return c;
}

// Source rows [layers, chunk, H, D] f16 on the device (random in [-1, 1]) and the host copy of layer 0.
struct Rows {
  Geometry g;
  int32_t chunk = 0;
  Buffer k, v;
  std::vector<uint16_t> k0;
  TensorRef slice(const Buffer& b, int32_t n) const {
    return TensorRef(b.data(), DType::F16, b.device(), {g.layers, n, g.heads, g.dim},
                     {static_cast<int64_t>(chunk) * g.heads * g.dim, static_cast<int64_t>(g.heads) * g.dim, g.dim, 1});
  }
};

Rows make_rows(const Geometry& g, int32_t chunk, Device dev, uint64_t seed) {
  Rows r;
  r.g = g;
  r.chunk = chunk;
  const size_t n = static_cast<size_t>(g.layers) * chunk * g.heads * g.dim;
  std::vector<uint16_t> h(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int which = 0; which < 2; ++which) {
    for (auto& x : h) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x = from_f32<f16>(static_cast<float>(static_cast<int64_t>(s >> 41) - (1 << 22)) * 0x1p-22f).bits;
    }
    Buffer b = Buffer::from_host(h, dev);
    if (which == 0) {
      r.k0.assign(h.begin(), h.begin() + static_cast<int64_t>(chunk) * g.heads * g.dim);
      r.k = std::move(b);
    } else {
      r.v = std::move(b);
    }
  }
  return r;
}

// Append `tokens` tokens (source row i % chunk for the sequence's i-th appended token).
void fill(PagedCache& c, SeqId s, const Rows& r, int64_t tokens) {
  while (tokens > 0) {
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(tokens, r.chunk));
    const int32_t first = c.info(s).last_position + 1;
    std::vector<int32_t> pos(n);
    for (int32_t i = 0; i < n; ++i) pos[i] = first + i;
    c.append(s, pos, r.slice(r.k, n), r.slice(r.v, n));
    tokens -= n;
  }
}

// Host-clock timing of fn(rep) with an untimed setup(rep) before each call.
Timing time_wall(const BenchOptions& opt, Device dev, const std::function<void(int)>& setup,
                 const std::function<void(int)>& fn) {
  for (int i = 0; i < opt.warmup; ++i) {
    setup(i);
    fn(i);
  }
  std::vector<double> us;
  for (int i = 0; i < opt.reps; ++i) {
    setup(i);
    synchronize(dev);
    const auto t0 = std::chrono::steady_clock::now();
    fn(i);
    synchronize(dev);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return Timing{us[us.size() / 2], us.front(), static_cast<int>(us.size())};
}

// Worst |read-back - f64 rotation of the source| / rowmax over layer 0 of `s`, where token j of
// the sequence holds source row src_index(j) at position pos(j).
double check_layer0(PagedCache& c, SeqId s, const Rows& r, const std::function<int64_t(int64_t)>& src_index) {
  const PagedReadBack rb = c.read(s, 0);
  const math::RopeTable& t = c.rope_table(0);
  const int32_t H = r.g.heads, D = r.g.dim;
  double worst = 0;
  for (size_t j = 0; j < rb.positions.size(); j += 7) {  // a sample is enough to catch a wrong kernel
    const int64_t si = src_index(static_cast<int64_t>(j)) % r.chunk;
    for (int32_t h = 0; h < H; ++h)
      worst = std::max(worst, rotated_row_error(&r.k0[(si * H + h) * D], &rb.k[(j * H + h) * D], D, t, rb.positions[j]));
  }
  return worst;
}

bool require_ok(BenchOptions& opt, const std::string& what, double worst, double tol) {
  char line[256];
  std::snprintf(line, sizeof line, "check %s: worst |err|/rowmax %.3g (tolerance %.3g)", what.c_str(), worst, tol);
  opt.note(line);
  if (worst <= tol) return true;
  opt.note("CHECK FAILED: " + what + " is wrong; not timing it");
  return false;
}

BenchRecord record(const std::string& case_name, double bytes) {
  BenchRecord r;
  r.bench = "paged";
  r.case_name = case_name;
  r.bytes = bytes;
  return r;
}

std::string ctx_name(int64_t ctx) { return ctx % 1024 == 0 ? std::to_string(ctx / 1024) + "k" : std::to_string(ctx); }

double kv_bytes(const Geometry& g, KvFormat f, int64_t tokens) {  // K + V pool bytes of `tokens` tokens
  return 2.0 * static_cast<double>(tokens) * g.layers * g.heads * static_cast<double>(kv_row_bytes(f, g.dim));
}

void bench_append(BenchOptions& opt, const Geometry& g, const Rows& rows, KvFormat f, int32_t n) {
  const std::string name = "append_" + std::string(kv_format_name(f)) + "_" + std::to_string(n);
  if (!opt.wants(name)) return;
  PagedCache c(llama_config(g, f, RopeMode::RopeStored, n), opt.device);
  const SeqId s = c.create();
  fill(c, s, rows, n);
  const double tol = f == KvFormat::F16 ? 3.0 / 2048 + 2.4e-7 * n : 1.5 / 16;
  if (!require_ok(opt, name, check_layer0(c, s, rows, [](int64_t j) { return j; }), tol)) return;
  BenchRecord rec = record(name, 2.0 * n * g.layers * g.heads * g.dim * 2 + kv_bytes(g, f, n));
  rec.t = opt.time([&](int) {
    c.truncate(s, 0);
    fill(c, s, rows, n);
  });
  opt.report(rec);
  char line[160];
  std::snprintf(line, sizeof line, "%s: %.3g tokens/s (all %d layers, K and V)", name.c_str(), n / (rec.t.median_us * 1e-6),
                g.layers);
  opt.note(line);
  // Where the time goes: the 2 x n_layers store launches alone (one reserved ticket, rewritten),
  // and the metadata alone (truncate + reserve, no store).
  c.truncate(s, 0);
  std::vector<int32_t> pos(n);
  for (int32_t i = 0; i < n; ++i) pos[i] = i;
  const AppendTicket t = c.reserve(s, pos);
  const int64_t layer_stride = static_cast<int64_t>(rows.chunk) * g.heads * g.dim;
  auto layer_rows = [&](const Buffer& b, int32_t l) {
    return TensorRef(static_cast<uint16_t*>(b.data()) + l * layer_stride, DType::F16, b.device(), {n, g.heads, g.dim});
  };
  BenchRecord st = record(name + "_stores", rec.bytes);
  st.t = opt.time([&](int) {
    for (int32_t l = 0; l < g.layers; ++l) c.store(t, l, layer_rows(rows.k, l), layer_rows(rows.v, l));
  });
  opt.report(st);
  BenchRecord meta = record(name + "_meta", 0);
  AppendTicket t2;  // reused: its device lists are allocated once
  meta.t = opt.time([&](int) {
    c.truncate(s, 0);
    c.reserve(t2, std::span<const SeqId>(&s, 1), std::span<const int32_t>(&n, 1), pos);
  });
  opt.report(meta);
}

void bench_decode(BenchOptions& opt, const Geometry& g, const Rows& rows, KvFormat f, int32_t batch) {
  const std::string name = "decode_" + std::string(kv_format_name(f)) + "_b" + std::to_string(batch);
  if (!opt.wants(name)) return;
  const int32_t steps = opt.warmup + opt.reps + 1;
  PagedCacheConfig cfg = llama_config(g, f, RopeMode::RopeStored, 0);
  cfg.num_blocks = batch * ((steps + 15) / 16 + 1);
  PagedCache c(cfg, opt.device);
  std::vector<SeqId> ids(batch);
  for (auto& id : ids) id = c.create();
  std::vector<int32_t> counts(batch, 1);
  // Per-layer sources [batch, H, D]: the first `batch` rows of the chunk of each layer.
  const int64_t layer_stride = static_cast<int64_t>(rows.chunk) * g.heads * g.dim;
  auto layer_rows = [&](const Buffer& b, int32_t l) {
    return TensorRef(static_cast<uint16_t*>(b.data()) + l * layer_stride, DType::F16, b.device(), {batch, g.heads, g.dim});
  };
  int32_t step = 0;
  AppendTicket t;  // reused: no device allocation per step
  BenchRecord rec = record(name, 2.0 * batch * g.layers * g.heads * g.dim * 2 + kv_bytes(g, f, batch));
  rec.t = opt.time([&](int) {
    std::vector<int32_t> pos(batch, step++);
    c.reserve(t, ids, counts, pos);
    for (int32_t l = 0; l < g.layers; ++l) c.store(t, l, layer_rows(rows.k, l), layer_rows(rows.v, l));
  });
  opt.report(rec);
}

void bench_shift(BenchOptions& opt, const Geometry& g, const Rows& rows, KvFormat f, RopeMode mode, int64_t ctx,
                 int32_t discard) {
  const bool stored = mode == RopeMode::RopeStored;
  const std::string name = std::string("shift_") + (stored ? "stored_" : "onread_") +
                           (f == KvFormat::F16 ? "" : std::string(kv_format_name(f)) + "_") + g.tag + ctx_name(ctx) + "_" +
                           (discard == ctx / 2 ? std::string("half") : std::to_string(discard));
  if (!opt.wants(name)) return;
  const int32_t keep = 4;
  PagedCache c(llama_config(g, f, mode, ctx), opt.device);
  const SeqId s = c.create();
  fill(c, s, rows, ctx);
  // Check once: token j >= keep now holds source row j + discard at position j.
  c.shift(s, keep, discard);
  // f16: a half-ulp per rounding; FP8 (E4M3, 3 mantissa bits): stored, then rotated and stored again
  const double tol = (f == KvFormat::Fp8 ? 0.15 : 3.0 / 2048) + 2.4e-7 * static_cast<double>(ctx + discard);
  const bool ok = require_ok(opt, name, check_layer0(c, s, rows, [&](int64_t j) { return j < keep ? j : j + discard; }), tol);
  fill(c, s, rows, discard);
  if (!ok) return;
  auto refill = [&](int) {
    if (c.info(s).n_live < ctx) fill(c, s, rows, ctx - c.info(s).n_live);
  };
  const Timing t = time_wall(opt, opt.device, refill, [&](int) {
    c.shift(s, keep, discard);
    if (stored) c.prepare();
  });
  const double retained_k = static_cast<double>(ctx - keep - discard) * g.layers * g.heads * kv_row_bytes(f, g.dim);
  const double bytes = stored ? 2.0 * retained_k : static_cast<double>(keep + 2 * 16) * 5.0;
  if (!stored) {  // the fold an offset-unaware reader pays once after the shift
    BenchRecord fold = record(name + "_fold", static_cast<double>(ctx - keep - discard) * 4.0);
    fold.t = time_wall(opt, opt.device, refill, [&](int) {
      c.shift(s, keep, discard);
      c.prepare();
    });
    opt.report(fold);
  }
  const PagedShiftCase sc{ctx, keep, discard, g.layers, g.heads, g.dim};
  // Baselines are CUDA programs on f16 keys (bench/paged_shift_baselines.cu): compared on a GPU only.
  const bool with_baselines =
      opt.device.is_cuda() && f == KvFormat::F16 && g.tag.empty() && !paged_shift_baselines().empty();
  if (!with_baselines) {
    BenchRecord rec = record(name, bytes);
    rec.t = t;
    opt.report(rec);
  }
  for (const PagedShiftBaseline& b : with_baselines ? paged_shift_baselines() : std::vector<PagedShiftBaseline>{}) {
    BenchRecord rec = record(name, bytes);
    rec.t = t;
    rec.baseline = b.name;
    rec.baseline_t = b.time(opt, sc);
    opt.report(rec);
  }
}

void bench_fork(BenchOptions& opt, const Geometry& g, const Rows& rows, int64_t ctx) {
  const std::string name = "fork_" + ctx_name(ctx);
  if (!opt.wants(name)) return;
  PagedCache c(llama_config(g, KvFormat::F16, RopeMode::RopeStored, ctx + 32), opt.device);
  const SeqId s = c.create();
  fill(c, s, rows, ctx - 3);  // a partly filled tail block
  BenchRecord rec = record(name, 0);
  rec.t = opt.time([&](int) { c.erase(c.fork(s)); });
  opt.report(rec);
  const int32_t p = c.info(s).last_position + 1;
  const double block_bytes = static_cast<double>(c.stats().bytes_per_block);
  BenchRecord w = record("fork_write_" + ctx_name(ctx), 2.0 * block_bytes);
  w.t = opt.time([&](int) {
    const SeqId f = c.fork(s);
    const int32_t pos[1] = {p};
    c.append(f, pos, rows.slice(rows.k, 1), rows.slice(rows.v, 1));
    c.erase(f);
  });
  opt.report(w);
}

}  // namespace

KVCORE_BENCH(paged, "PagedCache: append (f16, FP8), decode step, shift at 32k/128k (rope-stored, rope-on-read, baselines), fork") {
  Geometry g;
  if (opt.quick) g.layers = 2;
  const int32_t chunk = opt.quick ? 64 : 4096;
  const Rows rows = make_rows(g, chunk, opt.device, 1);
  bench_append(opt, g, rows, KvFormat::F16, chunk);
  bench_append(opt, g, rows, KvFormat::Fp8, chunk);
  bench_decode(opt, g, rows, KvFormat::F16, std::min(64, chunk));
  bench_decode(opt, g, rows, KvFormat::Fp8, std::min(64, chunk));
  const std::vector<int64_t> contexts = opt.quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{32768, 131072};
  for (int64_t ctx : contexts)
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead})
      for (int32_t discard : {static_cast<int32_t>(ctx / 2), opt.quick ? 32 : 256})
        bench_shift(opt, g, rows, KvFormat::F16, mode, ctx, discard);
  // FP8 keys stored rotated: the shift decodes, rotates and re-encodes every kept key (on read moves nothing)
  for (int64_t ctx : contexts) bench_shift(opt, g, rows, KvFormat::Fp8, RopeMode::RopeStored, ctx, static_cast<int32_t>(ctx / 2));
  // the same stored-mode shifts on SmolLM2's geometry (f16 and FP8 keys)
  Geometry smol = smollm2();
  if (opt.quick) smol.layers = 2;
  bool smol_wanted = false;
  for (int64_t ctx : contexts)
    for (const char* f : {"", "fp8_"})
      smol_wanted = smol_wanted || opt.wants("shift_stored_" + std::string(f) + smol.tag + ctx_name(ctx) + "_half");
  if (smol_wanted) {
    const Rows smol_rows = make_rows(smol, chunk, opt.device, 2);
    for (int64_t ctx : contexts)
      for (KvFormat f : {KvFormat::F16, KvFormat::Fp8})
        bench_shift(opt, smol, smol_rows, f, RopeMode::RopeStored, ctx, static_cast<int32_t>(ctx / 2));
  }
  for (int64_t ctx : contexts) bench_fork(opt, g, rows, ctx);
}

}  // namespace kvcore::cli
