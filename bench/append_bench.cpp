// `kvcore bench append`: a decode step's K/V store into a PagedCache of Llama-3-8B's shape
// (32 layers, 8 kv heads x 128, block 16, RoPE stored: K rotated at its position), batch 1 / 16 /
// 64 sequences of one new token each, f16 and FP8 pools, f16 sources.
//   step_<fmt>_b<B>:       PagedCache::store_layers (one launch for every layer's K and V);
//                          baseline per_layer: store() for each of the 32 layers (64 launches);
//                          ratio = per-layer time / one-launch time
//   step_<fmt>_b<B>_graph: the same one-launch store replayed from a CUDA graph (no host time;
//                          one source set, so small batches read it from L2)
//   step_<fmt>_b<B>_copy:  a device-to-device copy of the same bytes (half read, half written):
//                          the ceiling at this size, where launch latency, not bandwidth, bounds
//                          small batches. A note gives the store's share of it.
//   step_<fmt>_b<B>_copy_graph: that copy replayed from a CUDA graph (one source, as the store's
//                          graph): the ceiling without host time; a note gives the graph store's
//                          share of it.
// Bytes = sources read (K and V, every layer) + pool rows written (codes and scales). Calls rotate
// among source sets of >= 128 MB in all, so a timed call does not find its sources in L2. Before
// timing, both paths' read-backs are compared (equal floats) and K of layer 0 is checked
// against a float64 rotation of its source.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "bench/rope_check.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

namespace kvcore::cli {

namespace {

constexpr int32_t kLayers = 32, kHeads = 8, kDim = 128;

struct StepSources {
  int32_t batch = 0, sets = 0;
  Buffer k, v;  // [sets][kLayers, batch, kHeads, kDim] f16, random in [-1, 1]
  std::vector<uint16_t> k0;  // host copy of set 0's K
  int64_t set_elems() const { return static_cast<int64_t>(kLayers) * batch * kHeads * kDim; }
  TensorRef view(const Buffer& b, int set) const {
    return TensorRef(static_cast<uint16_t*>(b.data()) + set * set_elems(), DType::F16, b.device(),
                     {kLayers, batch, kHeads, kDim});
  }
  TensorRef layer(const Buffer& b, int set, int32_t l) const {
    return TensorRef(static_cast<uint16_t*>(b.data()) + set * set_elems() + static_cast<int64_t>(l) * batch * kHeads * kDim,
                     DType::F16, b.device(), {batch, kHeads, kDim});
  }
};

StepSources make_sources(int32_t batch, Device dev, bool quick) {
  StepSources s;
  s.batch = batch;
  const double set_bytes = 2.0 * s.set_elems() * 2;  // K and V
  s.sets = quick ? 2 : static_cast<int32_t>(std::clamp(std::ceil(128e6 / set_bytes), 2.0, 1024.0));
  std::vector<uint16_t> h(static_cast<size_t>(s.set_elems() * s.sets));
  uint64_t st = 0x2545f4914f6cdd1dull * (batch + 1);
  for (int which = 0; which < 2; ++which) {
    for (auto& x : h) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      x = from_f32<f16>(static_cast<float>(static_cast<int64_t>(st >> 41) - (1 << 22)) * 0x1p-22f).bits;
    }
    if (which == 0) s.k0.assign(h.begin(), h.begin() + s.set_elems());
    (which == 0 ? s.k : s.v) = Buffer::from_host(h, dev);
  }
  return s;
}

// Worst |K read back - f64 rotation of the source| / rowmax over layer 0 of every sequence.
double check_k(PagedCache& c, const std::vector<SeqId>& ids, const StepSources& src) {
  const math::RopeTable& t = c.rope_table(0);
  double worst = 0;
  for (size_t b = 0; b < ids.size(); ++b) {
    const PagedReadBack rb = c.read(ids[b], 0);
    const size_t j = rb.positions.size() - 1;
    for (int32_t h = 0; h < kHeads; ++h)
      worst = std::max(worst, rotated_row_error(&src.k0[(b * kHeads + h) * kDim], &rb.k[(j * kHeads + h) * kDim], kDim,
                                                t, rb.positions[j]));
  }
  return worst;
}

BenchRecord record(const std::string& name, double bytes) {
  BenchRecord r;
  r.bench = "append";
  r.case_name = name;
  r.bytes = bytes;
  return r;
}

void bench_step(BenchOptions& opt, KvFormat f, int32_t batch) {
  const std::string name = "step_" + std::string(kv_format_name(f)) + "_b" + std::to_string(batch);
  if (!opt.wants(name)) return;
  const Device dev = opt.device;
  struct OwnedStream {
    Stream s;
    ~OwnedStream() {
#if KVCORE_WITH_CUDA
      if (s.handle) destroy_stream(s);
#endif
    }
  } stream;
#if KVCORE_WITH_CUDA
  if (dev.is_cuda()) stream.s = make_blocking_stream(dev.index);  // a CUDA graph captures the cache's stream
#endif
  PagedCacheConfig cfg;
  cfg.n_layers = kLayers;
  cfg.n_kv_heads = kHeads;
  cfg.head_dim = cfg.v_head_dim = kDim;
  cfg.block_size = 16;
  cfg.num_blocks = batch + 16;
  cfg.k_format = cfg.v_format = f;
  cfg.rope = {RopeSpec::llama3_8b()};
  cfg.rope_mode = RopeMode::RopeStored;
  cfg.stream = stream.s;
  PagedCache c(cfg, dev);
  std::vector<SeqId> ids(batch);
  for (auto& id : ids) id = c.create();
  const std::vector<int32_t> counts(batch, 1);
  std::vector<int32_t> pos(batch);
  for (int32_t b = 0; b < batch; ++b) pos[b] = 1000 + 37 * b;  // one step of sequences at other lengths
  AppendTicket t = c.reserve(ids, counts, pos);
  const StepSources src = make_sources(batch, dev, opt.quick);

  // Check: per-layer stores and the one-launch store read back the same floats; K against f64.
  auto per_layer = [&](int set) {
    for (int32_t l = 0; l < kLayers; ++l) c.store(t, l, src.layer(src.k, set, l), src.layer(src.v, set, l));
  };
  auto fused = [&](int set) { c.store_layers(t, src.view(src.k, set), src.view(src.v, set)); };
  per_layer(0);
  std::vector<PagedReadBack> want;
  for (int32_t l : {0, kLayers - 1}) want.push_back(c.read(ids.back(), l));
  fused(1);  // another set first, so the comparison cannot pass on stale rows
  fused(0);
  bool same = true;
  int i = 0;
  for (int32_t l : {0, kLayers - 1}) {
    const PagedReadBack got = c.read(ids.back(), l);
    same = same && got.k == want[i].k && got.v == want[i].v;
    ++i;
  }
  if (!same) {
    opt.note("CHECK FAILED: " + name + ": store_layers and per-layer store() differ; not timing it");
    return;
  }
  const double worst = check_k(c, ids, src), tol = f == KvFormat::F16 ? 3.0 / 2048 + 1e-3 : 1.5 / 16;
  char line[256];
  std::snprintf(line, sizeof line, "check %s: worst |err|/rowmax %.3g (tolerance %.3g); per-layer and one-launch equal",
                name.c_str(), worst, tol);
  opt.note(line);
  if (!(worst <= tol)) {
    opt.note("CHECK FAILED: " + name + " is wrong; not timing it");
    return;
  }

  const double src_bytes = 2.0 * src.set_elems() * 2;
  const double pool_bytes = 2.0 * batch * kLayers * kHeads * static_cast<double>(kv_row_bytes(f, kDim));
  BenchRecord rec = record(name, src_bytes + pool_bytes);
  rec.t = opt.time([&](int rep) { fused(rep % src.sets); });
  rec.baseline = "per_layer";
  rec.baseline_t = opt.time([&](int rep) { per_layer(rep % src.sets); });
  opt.report(rec);

  // A copy of the same bytes: half of them read, half written, from rotating sources.
  const size_t half = static_cast<size_t>(rec.bytes / 2) / 16 * 16;
  const int copies = std::max(2, static_cast<int>(std::min<double>(1024, std::ceil(128e6 / half))));
  Buffer from(half * copies, dev), to(half, dev);
  fill_bytes(from.data(), dev, 1, from.size(), stream.s);
  // The store's speed as a percentage of a copy's (store and copy timed the same way).
  auto share_of_copy = [&](double copy_us, double store_us) { return 100.0 * copy_us / store_us * rec.bytes / (2.0 * half); };
  BenchRecord cp = record(name + "_copy", 2.0 * half);
  cp.t = opt.time([&](int rep) {
    copy_bytes(to.data(), dev, static_cast<uint8_t*>(from.data()) + (rep % copies) * half, dev, half, stream.s);
  });
  opt.report(cp);
  std::snprintf(line, sizeof line, "%s: one-launch store at %.1f%% of a same-size copy's speed; per-layer at %.1f%%",
                name.c_str(), share_of_copy(cp.t.median_us, rec.t.median_us),
                share_of_copy(cp.t.median_us, rec.baseline_t->median_us));
  opt.note(line);
#if KVCORE_WITH_CUDA
  if (dev.is_cuda()) {
    synchronize(dev, stream.s);
    BenchRecord g = record(name + "_graph", rec.bytes);
    g.t = time_graph(dev.index, opt.reps, opt.warmup, [&](Stream) { fused(0); }, stream.s);
    g.baseline = "per_layer_graph";
    g.baseline_t = time_graph(dev.index, opt.reps, opt.warmup, [&](Stream) { per_layer(0); }, stream.s);
    opt.report(g);
    // The copy from a graph too (one source, as the store's): the ceiling without host time.
    BenchRecord gc = record(name + "_copy_graph", 2.0 * half);
    gc.t = time_graph(dev.index, opt.reps, opt.warmup,
                      [&](Stream) { copy_bytes(to.data(), dev, from.data(), dev, half, stream.s); }, stream.s);
    opt.report(gc);
    std::snprintf(line, sizeof line, "%s: from a CUDA graph, the one-launch store at %.1f%% of a same-size copy's speed",
                  name.c_str(), share_of_copy(gc.t.median_us, g.t.median_us));
    opt.note(line);
  }
#endif
}

}  // namespace

KVCORE_BENCH(append, "decode-step append of every layer (Llama-3-8B, batch 1/16/64, f16 and FP8): one launch vs per layer, vs a same-size copy") {
  for (KvFormat f : {KvFormat::F16, KvFormat::Fp8})
    for (int32_t batch : {1, 16, 64}) bench_step(opt, f, batch);
}

}  // namespace kvcore::cli
