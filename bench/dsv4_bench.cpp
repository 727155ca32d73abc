// `kvcore bench dsv4`: DeepSeek-V4-Flash cache work.
//  - decode43: the per-token decode cache step of all 43 V4-Flash layers (finalize,
//    compressor and indexer store, emission when due, shift), averaged over 128
//    consecutive tokens (so CSA rows are emitted every 4th token, HCA rows every
//    128th), one fused kernel per layer; baseline: the same work as separate ops
//    (one launch per seed kernel), timed in the same run.
//  - decode43+indexer: the same plus the indexer's scores and top-512 for the 21
//    CSA layers at a given context (what HF's CSA compressor call also does; HF also
//    rotates the indexer query, kvcore also Hadamard + FP4 rounds it), plain launches
//    and CUDA-graph replay, and the indexer alone for one layer (graph replay), also split
//    into its two kernels ("indexer scores only", "indexer top-k only") for the breakdown,
//    and each kernel on its own (ops::IndexerTuning: "scorer simt" / "scorer tensor core",
//    "top-k ordered" / "top-k compact", and the pairs "simt + ordered" / "tensor core +
//    compact"), the top-k kernels' picks checked identical.
//  - prefill: compression of 64k tokens (one CSA compressor, its indexer, one HCA
//    compressor), GB/s of input read + rows written against the copy ceiling.
// HF transformers' modules doing the same work: bench/dsv4_hf_baseline.py.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "kvcore/runtime.hpp"
#include "ops/dsv4_tuning.hpp"  // the indexer's kernel choices (A/B)
#if KVCORE_WITH_CUDA
#include "ops/dsv4_backends.hpp"  // the indexer's two halves, timed apart for the breakdown
#endif
#include "tools/registry.hpp"

namespace {

using namespace kvcore;
using kvcore::cli::BenchOptions;
using kvcore::cli::BenchRecord;
using kvcore::cli::Timing;
using kvcore::cli::Traffic;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

Buffer upload(const std::vector<float>& v, Device d) { return Buffer::from_host(v, d); }

void set_flash_weights(Dsv4Cache& cache, uint64_t seed) {
  const Dsv4CacheConfig& cfg = cache.config();
  for (int l = 0; l < cache.n_layers(); ++l) {
    if (cfg.layers[l] == Dsv4LayerKind::Window) continue;
    const Dsv4Compressor c = cfg.compressor(cfg.layers[l]), ix = cfg.indexer();
    std::vector<float> ca = randn(static_cast<size_t>(c.ratio) * c.width(), seed + l), cn = randn(c.head_dim, seed + 100 + l, 0.2f);
    std::vector<float> ia = randn(static_cast<size_t>(ix.ratio) * ix.width(), seed + 200 + l), in = randn(ix.head_dim, seed + 300 + l, 0.2f);
    for (float& v : cn) v += 1;
    for (float& v : in) v += 1;
    cache.set_weights(l, {TensorRef(ca.data(), DType::F32, Device::cpu(), {c.ratio, c.width()}),
                          TensorRef(cn.data(), DType::F32, Device::cpu(), {c.head_dim}),
                          TensorRef(ia.data(), DType::F32, Device::cpu(), {ix.ratio, ix.width()}),
                          TensorRef(in.data(), DType::F32, Device::cpu(), {ix.head_dim})});
  }
}

// Per-layer token inputs for `n_tok` distinct tokens, on the device (rotated through).
struct LayerInputs {
  int width = 0, iwidth = 0, n_tok = 0;
  Buffer kv, kv_work, cc, cz, ic, iz;
  LayerInputs(const Dsv4CacheConfig& cfg, Dsv4LayerKind kind, int n, Device d, uint64_t seed) : n_tok(n) {
    width = kind == Dsv4LayerKind::Window ? 0 : cfg.compressor(kind).width();
    iwidth = kind == Dsv4LayerKind::CSA ? 2 * cfg.index_dim : 0;
    kv = upload(randn(static_cast<size_t>(n) * cfg.head_dim, seed, 2.0f), d);
    kv_work = Buffer(kv.size(), d);  // the finalizer rounds kv in place: work on a copy
    copy_bytes(kv_work.data(), d, kv.data(), d, kv.size());
    if (width) {
      cc = upload(randn(static_cast<size_t>(n) * width, seed + 1), d);
      cz = upload(randn(static_cast<size_t>(n) * width, seed + 2, 2.0f), d);
    }
    if (iwidth) {
      ic = upload(randn(static_cast<size_t>(n) * iwidth, seed + 3), d);
      iz = upload(randn(static_cast<size_t>(n) * iwidth, seed + 4, 2.0f), d);
    }
  }
  Dsv4TokenInputs at(int tok, int len, int head_dim, Device d) const {
    Dsv4TokenInputs in;
    in.kv = TensorRef(kv_work.as<float>() + static_cast<size_t>(tok) * head_dim, DType::F32, d, {len, head_dim});
    if (width) {
      in.comp_c = TensorRef(cc.as<float>() + static_cast<size_t>(tok) * width, DType::F32, d, {len, width});
      in.comp_z = TensorRef(cz.as<float>() + static_cast<size_t>(tok) * width, DType::F32, d, {len, width});
    }
    if (iwidth) {
      in.idx_c = TensorRef(ic.as<float>() + static_cast<size_t>(tok) * iwidth, DType::F32, d, {len, iwidth});
      in.idx_z = TensorRef(iz.as<float>() + static_cast<size_t>(tok) * iwidth, DType::F32, d, {len, iwidth});
    }
    return in;
  }
  double bytes_per_token(const Dsv4CacheConfig& cfg, Dsv4LayerKind kind) const {
    // kv read and written back, one ring row written, projections read, state rows
    // written, emitted rows amortized over their ratio.
    double b = cfg.head_dim * 4.0 * 2 + cfg.head_dim * 2.0 + width * 4.0 * 2 * 2 + iwidth * 4.0 * 2 * 2;
    if (kind == Dsv4LayerKind::CSA) b += 584.0 / cfg.csa_ratio + 68.0 / cfg.csa_ratio;
    if (kind == Dsv4LayerKind::HCA) b += 584.0 / cfg.hca_ratio;
    return b;
  }
};

std::string fmt(const char* f, long long a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

Timing per(const Timing& t, double n) {
  Timing r = t;
  r.median_us /= n;
  r.min_us /= n;
  return r;
}

// Sanity check before timing: the device cache's compressed rows of one CSA layer
// against a CPU cache fed the same tokens (FP8 after float math: rare one-code flips).
bool check_against_cpu(const Dsv4CacheConfig& cfg, const std::vector<std::unique_ptr<LayerInputs>>& inputs, Device dev,
                       BenchOptions& opt) {
  if (dev.is_cpu()) return true;
  Dsv4CacheConfig small = cfg;
  // Small, but the indexer's rows must still hold top-k picks (max_context / ratio >= index_topk).
  small.max_context = std::max(512, cfg.index_topk * cfg.csa_ratio);
  small.layers = {Dsv4LayerKind::CSA};
  Dsv4Cache gpu(small, dev), cpu(small, Device::cpu());
  gpu.create();  // sequence 0 of each
  cpu.create();
  set_flash_weights(gpu, 77);
  set_flash_weights(cpu, 77);
  const LayerInputs& li = *inputs[2];
  const int n = std::min(64, li.n_tok);
  auto host = [&](const Buffer& b, size_t off, size_t cnt) {
    std::vector<float> v(cnt);
    copy_bytes(v.data(), Device::cpu(), b.as<float>() + off, dev, cnt * 4);
    return v;
  };
  for (int t = 0; t < n; ++t) {
    std::vector<float> kv = host(li.kv, static_cast<size_t>(t) * 512, 512);
    Buffer kvd = upload(kv, dev);
    std::vector<float> cc = host(li.cc, static_cast<size_t>(t) * li.width, li.width), cz = host(li.cz, static_cast<size_t>(t) * li.width, li.width);
    std::vector<float> ic = host(li.ic, static_cast<size_t>(t) * li.iwidth, li.iwidth), iz = host(li.iz, static_cast<size_t>(t) * li.iwidth, li.iwidth);
    Dsv4TokenInputs g = li.at(t, 1, 512, dev);
    g.kv = TensorRef(kvd.data(), DType::F32, dev, {1, 512});
    gpu.append(0, 0, t, g);
    Dsv4TokenInputs c;
    c.kv = TensorRef(kv.data(), DType::F32, Device::cpu(), {1, 512});
    c.comp_c = TensorRef(cc.data(), DType::F32, Device::cpu(), {1, li.width});
    c.comp_z = TensorRef(cz.data(), DType::F32, Device::cpu(), {1, li.width});
    c.idx_c = TensorRef(ic.data(), DType::F32, Device::cpu(), {1, li.iwidth});
    c.idx_z = TensorRef(iz.data(), DType::F32, Device::cpu(), {1, li.iwidth});
    cpu.append(0, 0, t, c);
  }
  synchronize(dev);
  const std::vector<float> a = gpu.read_compressed(0, 0), b = cpu.read_compressed(0, 0);
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  const bool ok = a.size() == b.size() && a.size() > 0 && diff <= a.size() / 100 && gpu.read_window(0, 0) == cpu.read_window(0, 0);
  opt.note("check: " + std::to_string(diff) + " of " + std::to_string(a.size()) + " compressed values differ from the CPU" +
           (ok ? " (ok)" : " (FAILED)"));
  return ok;
}

// The decode step with the indexer timed again (from a CUDA graph) with each of these kernel
// choices, which the cache's own call does not take (ops::IndexerTuning): opt-in kernels beside
// the default, in the same job.
struct TunedStep {
  const char* name;
  bool sort_four, fused;
};
constexpr TunedStep kTunedStepChoices[] = {{"sort four", true, false}, {"fused", false, true}, {"fused sort four", true, true}};
constexpr int kTunedSteps = static_cast<int>(sizeof(kTunedStepChoices) / sizeof(kTunedStepChoices[0]));

void bench_decode(BenchOptions& opt, int64_t context, bool with_indexer) {
  const Device dev = opt.device;
  const int tokens_per_rep = 128;
  const int reps_total = opt.reps + opt.warmup;
  // Room for the eager reps, the graph captures (the default and kTunedSteps) and slack.
  const int64_t max_ctx =
      std::max<int64_t>(context + static_cast<int64_t>(tokens_per_rep) * (2 * reps_total + 2 + kTunedSteps), 4 * 512);
  Dsv4CacheConfig cfg = Dsv4CacheConfig::v4_flash(static_cast<int32_t>(max_ctx), 1);
  // The cache runs its work on the stream of its config: one a CUDA graph can capture, and
  // that synchronizes with the default stream the eager timing's events are recorded on.
  struct OwnedStream {
    Stream s;
    ~OwnedStream() {
#if KVCORE_WITH_CUDA
      kvcore::cli::destroy_stream(s);
#endif
    }
  } cache_stream;
#if KVCORE_WITH_CUDA
  if (dev.is_cuda()) cache_stream.s = kvcore::cli::make_blocking_stream(dev.index);
#endif
  cfg.stream = cache_stream.s;
  Dsv4Cache cache(cfg, dev);
  cache.create();  // sequence 0
  set_flash_weights(cache, 1);
  const int n_tok = opt.quick ? 32 : tokens_per_rep;  // distinct token inputs, rotated through
  std::vector<std::unique_ptr<LayerInputs>> inputs;
  double bytes = 0;
  for (int l = 0; l < cache.n_layers(); ++l) {
    inputs.push_back(std::make_unique<LayerInputs>(cfg, cfg.layers[l], n_tok, dev, 1000 + 17 * l));
    bytes += inputs.back()->bytes_per_token(cfg, cfg.layers[l]);
  }
  if (!check_against_cpu(cfg, inputs, dev, opt)) throw Error(ErrorCode::Corrupt, "bench dsv4: device results differ from the CPU");
  // Bring the sequence to `context` tokens through the prefill path.
  int64_t pos = 0;
  while (pos < context) {
    const int len = static_cast<int>(std::min<int64_t>(n_tok, context - pos));
    for (int l = 0; l < cache.n_layers(); ++l) cache.append(0, l, pos, inputs[l]->at(0, len, cfg.head_dim, dev));
    pos += len;
  }
  synchronize(dev);
  // Indexer inputs (one query per CSA layer).
  const int64_t cap = cfg.max_context / cfg.csa_ratio;
  Buffer q = upload(randn(static_cast<size_t>(cfg.index_heads) * cfg.index_dim, 5), dev),
         w = upload(randn(cfg.index_heads, 6), dev), scores(static_cast<size_t>(cap) * 4, dev),
         picks(static_cast<size_t>(cfg.index_topk) * 4, dev);
#if KVCORE_WITH_CUDA
  // The arguments the cache's indexer_topk gives the op's backend, for layer l's rows and a query at qpos.
  auto indexer_params = [&](int l, int64_t qpos) {
    const TensorRef store = cache.indexer_store(0, l);
    dsv4::IndexerParams ip{};
    ip.q = q.as<float>();
    ip.q_stride0 = static_cast<int64_t>(cfg.index_heads) * cfg.index_dim;
    ip.q_stride1 = cfg.index_dim;
    ip.weights = w.as<float>();
    ip.w_stride = cfg.index_heads;
    ip.rows = store.data();
    ip.rows_stride = store.stride(0);
    ip.rows_packed = store.dtype() == DType::U8 ? 1 : 0;
    ip.cap = store.size(0);
    ip.n_rows = cache.indexer_rows(0, l);
    ip.n_q = 1;
    ip.n_heads = cfg.index_heads;
    ip.dim = cfg.index_dim;
    ip.ratio = cfg.csa_ratio;
    ip.quant = cfg.quant == Dsv4Quant::On ? 1 : 0;
    ip.k = cfg.index_topk;
    ip.first_query_pos = qpos;
    ip.scores = scores.as<float>();
    ip.scores_stride = ip.cap;
    ip.out = picks.as<int32_t>();
    ip.out_stride = cfg.index_topk;
    return ip;
  };
#endif
  // On the cache's stream. tune: the indexer through the op's backend with these kernel choices
  // (CUDA only) instead of the cache's call.
  auto step = [&](int64_t p, const ops::IndexerTuning* tune = nullptr) {
    const int tok = static_cast<int>(p % n_tok);
    for (int l = 0; l < cache.n_layers(); ++l) {
      cache.append(0, l, static_cast<int32_t>(p), inputs[l]->at(tok, 1, cfg.head_dim, dev));
      if (!with_indexer || cfg.layers[l] != Dsv4LayerKind::CSA) continue;
#if KVCORE_WITH_CUDA
      if (tune) {
        ops::cuda::dsv4::indexer_topk(indexer_params(l, p), cfg.stream, *tune);
        continue;
      }
#else
      (void)tune;  // the CPU has no kernel choices
#endif
      cache.indexer_topk(0, l, TensorRef(q.data(), DType::F32, dev, {1, cfg.index_heads, cfg.index_dim}),
                         TensorRef(w.data(), DType::F32, dev, {1, cfg.index_heads}), static_cast<int32_t>(p),
                         TensorRef(scores.data(), DType::F32, dev, {1, cap}), TensorRef(picks.data(), DType::I32, dev, {1, cfg.index_topk}));
    }
  };
  const Timing t = opt.time([&](int) {
    for (int i = 0; i < tokens_per_rep; ++i, ++pos) step(pos);
  });
  BenchRecord r;
  r.bench = "dsv4";
  r.case_name = with_indexer ? fmt("decode43 cache step+indexer ctx=%lld", context) : fmt("decode43 cache step ctx=%lld", context);
  r.bytes = bytes;
  r.t = per(t, tokens_per_rep);
  r.traffic = Traffic::Copy;
  opt.report(r);
#if KVCORE_WITH_CUDA
  if (dev.is_cuda()) {
    // The same 128 tokens captured once into a CUDA graph and replayed: what the
    // step costs without host overhead. Replays redo the captured positions (an
    // engine would keep positions in device memory to reuse one graph).
    synchronize(dev);
    const Timing tg = kvcore::cli::time_graph(
        dev.index, opt.reps, opt.warmup, [&](Stream) {
          for (int i = 0; i < tokens_per_rep; ++i, ++pos) step(pos);
        },
        cfg.stream);
    BenchRecord g = r;
    g.case_name = with_indexer ? fmt("decode43 cache step+indexer ctx=%lld (CUDA graph replay)", context)
                               : fmt("decode43 cache step ctx=%lld (CUDA graph replay)", context);
    g.t = per(tg, tokens_per_rep);
    g.baseline = "plain launches";
    g.baseline_t = r.t;
    opt.report(g);
    if (with_indexer) {  // the step with the opt-in indexer kernels, then the indexer alone
      for (const TunedStep& choice : kTunedStepChoices) {
        ops::IndexerTuning tune;
        tune.sort_four = choice.sort_four;
        tune.fused = choice.fused;
        synchronize(dev);
        const Timing tt = kvcore::cli::time_graph(
            dev.index, opt.reps, opt.warmup, [&](Stream) {
              for (int i = 0; i < tokens_per_rep; ++i, ++pos) step(pos, &tune);
            },
            cfg.stream);
        BenchRecord y = g;
        y.case_name = fmt("decode43 cache step+indexer ctx=%lld (CUDA graph replay) ", context) + choice.name;
        y.t = per(tt, tokens_per_rep);
        y.baseline = "the default kernels (CUDA graph replay)";
        y.baseline_t = g.t;
        opt.report(y);
      }
      // The indexer alone (scores + top-k of one CSA layer), for the breakdown.
      int csa = 0;
      while (cfg.layers[csa] != Dsv4LayerKind::CSA) ++csa;
      const int64_t qpos = pos - 1;
      synchronize(dev);
      const Timing ti = kvcore::cli::time_graph(
          dev.index, opt.reps, opt.warmup, [&](Stream) {
            for (int i = 0; i < tokens_per_rep; ++i)
              cache.indexer_topk(0, csa, TensorRef(q.data(), DType::F32, dev, {1, cfg.index_heads, cfg.index_dim}),
                                 TensorRef(w.data(), DType::F32, dev, {1, cfg.index_heads}), static_cast<int32_t>(qpos),
                                 TensorRef(scores.data(), DType::F32, dev, {1, cap}),
                                 TensorRef(picks.data(), DType::I32, dev, {1, cfg.index_topk}));
          },
          cfg.stream);
      BenchRecord x;
      x.bench = "dsv4";
      x.case_name = fmt("indexer scores+top-k one CSA layer ctx=%lld (CUDA graph replay)", context);
      x.bytes = static_cast<double>(cache.indexer_rows(0, csa)) * 68 + static_cast<double>(cap) * 4;
      x.t = per(ti, tokens_per_rep);
      x.traffic = Traffic::Read;
      opt.report(x);
      // The two halves apart (the op's backend calls, same arguments as the op fills).
      const dsv4::IndexerParams ip = indexer_params(csa, qpos);
      for (int half = 0; half < 2; ++half) {
        synchronize(dev);
        const Timing th = kvcore::cli::time_graph(dev.index, opt.reps, opt.warmup, [&](Stream s) {
          for (int i = 0; i < tokens_per_rep; ++i) {
            if (half == 0) {
              ops::cuda::dsv4::indexer_scores(ip, s);
            } else {
              ops::cuda::dsv4::indexer_select(ip, s);
            }
          }
        });
        BenchRecord y = x;
        y.case_name = fmt(half == 0 ? "indexer scores only one CSA layer ctx=%lld (CUDA graph replay)"
                                    : "indexer top-k only one CSA layer ctx=%lld (CUDA graph replay)",
                          context);
        y.bytes = half == 0 ? static_cast<double>(cache.indexer_rows(0, csa)) * 68 + static_cast<double>(cap) * 4
                            : static_cast<double>(cache.indexer_rows(0, csa)) * 4;
        y.t = per(th, tokens_per_rep);
        opt.report(y);
      }
      // Both backend calls of the op in one graph.
      {
        synchronize(dev);
        const Timing th = kvcore::cli::time_graph(dev.index, opt.reps, opt.warmup, [&](Stream s) {
          for (int i = 0; i < tokens_per_rep; ++i) {
            ops::cuda::dsv4::indexer_scores(ip, s);
            ops::cuda::dsv4::indexer_select(ip, s);
          }
        });
        BenchRecord y = x;
        y.case_name = fmt("indexer scores+top-k backend calls one CSA layer ctx=%lld (CUDA graph replay)", context);
        y.bytes = static_cast<double>(cache.indexer_rows(0, csa)) * 68 + static_cast<double>(cap) * 4;
        y.t = per(th, tokens_per_rep);
        opt.report(y);
      }
      // The kernels one by one (ops::IndexerTuning), for the A/B: each scorer alone, each top-k
      // kernel alone, and the two pairs (SIMT + ordered, tensor core + compact) back to back.
      // The top-k kernels' picks must be identical (one selection rule over the same scores);
      // the scorers' scores may differ in rounding (their head sums run in different orders).
      // scores_on and select_on: the two backend calls (both: through indexer_topk, which runs the
      // fused kernel where tune.fused asks for it).
      auto time_calls = [&](const ops::IndexerTuning& tune, bool scores_on, bool select_on) {
        synchronize(dev);
        return per(kvcore::cli::time_graph(dev.index, opt.reps, opt.warmup, [&](Stream s) {
                     for (int i = 0; i < tokens_per_rep; ++i) {
                       if (scores_on && select_on) {
                         ops::cuda::dsv4::indexer_topk(ip, s, tune);
                       } else if (scores_on) {
                         ops::cuda::dsv4::indexer_scores(ip, s, tune);
                       } else if (select_on) {
                         ops::cuda::dsv4::indexer_select(ip, s, tune);
                       }
                     }
                   }),
                   tokens_per_rep);
      };
      const double score_bytes = static_cast<double>(cache.indexer_rows(0, csa)) * 68 + static_cast<double>(cap) * 4;
      const double select_bytes = static_cast<double>(cache.indexer_rows(0, csa)) * 4;
      auto row = [&](const std::string& name, double b, const Timing& tt) {
        BenchRecord y = x;
        y.case_name = name;
        y.bytes = b;
        y.t = tt;
        opt.report(y);
      };
      std::vector<float> scores_of[2];
      for (const ops::IndexerScorer kind : {ops::IndexerScorer::Simt, ops::IndexerScorer::TensorCore}) {
        ops::IndexerTuning tune;
        tune.scorer = kind;
        const bool tc = kind == ops::IndexerScorer::TensorCore;
        row(fmt("indexer scores only one CSA layer ctx=%lld (CUDA graph replay)", context) + (tc ? " scorer tensor core" : " scorer simt"),
            score_bytes, time_calls(tune, true, false));
        synchronize(dev);
        scores_of[tc ? 1 : 0] = scores.to_host<float>();
      }
      // The tensor-core scorer's CTA width, each computing the same scores (the automatic row above).
      // (warps a CTA, CTAs a cluster sharing the query transform; 0: no clusters)
      for (const auto& [warps, cluster] : {std::pair{4, 0}, std::pair{8, 0}, std::pair{16, 0}, std::pair{8, 8}}) {
        ops::IndexerTuning tune;
        tune.scorer = ops::IndexerScorer::TensorCore;
        tune.scorer_warps = warps;
        tune.scorer_cluster = cluster;
        row(fmt("indexer scores only one CSA layer ctx=%lld (CUDA graph replay)", context) + " scorer tensor core " +
                std::to_string(warps) + " warps" + (cluster ? " cluster " + std::to_string(cluster) : std::string()),
            score_bytes, time_calls(tune, true, false));
        synchronize(dev);
        if (scores.to_host<float>() != scores_of[1])
          throw Error(ErrorCode::Corrupt, "bench dsv4: the tensor-core scorer's scores differ with " + std::to_string(warps) +
                                              " warps a CTA, cluster " + std::to_string(cluster));
      }
      {
        size_t differ = 0;
        for (size_t j = 0; j < scores_of[0].size(); ++j) differ += scores_of[0][j] != scores_of[1][j];
        opt.note(fmt("indexer scores ctx=%lld: ", context) + std::to_string(differ) + " of " + std::to_string(scores_of[0].size()) +
                 " differ between the SIMT and tensor-core scorers (rounding of the head sums)");
      }
      std::vector<int32_t> first_picks;
      const std::pair<ops::IndexerTopk, bool> topks[] = {{ops::IndexerTopk::Ordered, false}, {ops::IndexerTopk::Compact, false},
                                                         {ops::IndexerTopk::Cluster, false}, {ops::IndexerTopk::Compact, true},
                                                         {ops::IndexerTopk::Cluster, true}};
      for (const auto& [kind, four] : topks) {
        ops::IndexerTuning tune;
        tune.topk = kind;
        tune.sort_four = four;
        const std::string name = std::string(kind == ops::IndexerTopk::Ordered   ? "ordered"
                                             : kind == ops::IndexerTopk::Compact ? "compact"
                                                                                 : "cluster") +
                                 (four ? " sort four" : "");
        row(fmt("indexer top-k only one CSA layer ctx=%lld (CUDA graph replay) top-k ", context) + name, select_bytes,
            time_calls(tune, false, true));
        synchronize(dev);
        const std::vector<int32_t> got = picks.to_host<int32_t>();
        if (first_picks.empty()) {
          first_picks = got;
        } else {
          const bool same = got == first_picks;
          opt.note(fmt("indexer top-k ctx=%lld: the ", context) + name + " kernel's picks " +
                   (same ? "are identical to" : "DIFFER from") + " the ordered kernel's");
          if (!same) throw Error(ErrorCode::Corrupt, std::string("bench dsv4: the ") + name + " top-k's picks differ from the ordered kernel's");
        }
      }
      for (int pair = 0; pair < 2; ++pair) {
        ops::IndexerTuning tune;
        tune.scorer = pair ? ops::IndexerScorer::TensorCore : ops::IndexerScorer::Simt;
        tune.topk = pair ? ops::IndexerTopk::Compact : ops::IndexerTopk::Ordered;
        row(fmt("indexer scores+top-k backend calls one CSA layer ctx=%lld (CUDA graph replay)", context) +
                (pair ? " tensor core + compact" : " simt + ordered"),
            score_bytes, time_calls(tune, true, true));
      }
      // The opt-in choices beside the default pair (timed above as both backend calls): the sort four
      // a thread, the fused kernel, both. Scores must be the tensor-core scorer's bits and picks the
      // ordered kernel's.
      for (const auto& [fused, four] : {std::pair{false, true}, std::pair{true, false}, std::pair{true, true}}) {
        ops::IndexerTuning tune;
        tune.fused = fused;
        tune.sort_four = four;
        const std::string name = std::string(fused ? " fused" : " automatic") + (four ? " sort four" : "");
        row(fmt("indexer scores+top-k backend calls one CSA layer ctx=%lld (CUDA graph replay)", context) + name, score_bytes,
            time_calls(tune, true, true));
        synchronize(dev);
        const bool same = scores.to_host<float>() == scores_of[1] && picks.to_host<int32_t>() == first_picks;
        opt.note(fmt("indexer scores+top-k ctx=%lld:", context) + name + (same ? " scores and picks identical to" : " DIFFER from") +
                 " the tensor-core scorer's and the ordered top-k's");
        if (!same) throw Error(ErrorCode::Corrupt, "bench dsv4: the" + name + " scores+top-k differ");
      }
    }
  }
#endif
}

// The unfused baseline: the decode step of every layer as the seed's separate kernels.
void bench_decode_separate(BenchOptions& opt) {
  const Device dev = opt.device;
  const int tokens_per_rep = 128, reps_total = opt.reps + opt.warmup;
  Dsv4CacheConfig cfg =
      Dsv4CacheConfig::v4_flash(std::max(tokens_per_rep * (2 * reps_total + 2), 4 * 512), 1);
  Dsv4Cache fused(cfg, dev), sep(cfg, dev);
  fused.create();  // sequence 0 of each
  sep.create();
  set_flash_weights(fused, 1);
  set_flash_weights(sep, 1);
  const int n_tok = opt.quick ? 32 : tokens_per_rep;
  std::vector<std::unique_ptr<LayerInputs>> inputs;
  double bytes = 0;
  for (size_t l = 0; l < cfg.layers.size(); ++l) {
    inputs.push_back(std::make_unique<LayerInputs>(cfg, cfg.layers[l], n_tok, dev, 1000 + 17 * l));
    bytes += inputs.back()->bytes_per_token(cfg, cfg.layers[l]);
  }
  // Weights of the separate-ops run (values do not matter for timing, shapes do).
  std::vector<Buffer> keep;
  std::vector<Dsv4CompressorWeights> wts(cfg.layers.size() * 2);
  for (size_t l = 0; l < cfg.layers.size(); ++l)
    for (int ix = 0; ix < 2; ++ix) {
      const Dsv4LayerKind k = cfg.layers[l];
      if (k == Dsv4LayerKind::Window || (ix && k != Dsv4LayerKind::CSA)) continue;
      const Dsv4Compressor c = ix ? cfg.indexer() : cfg.compressor(k);
      Dsv4CompressorWeights& w = wts[l * 2 + ix];
      keep.push_back(upload(randn(static_cast<size_t>(c.ratio) * c.width(), l * 2 + ix), dev));
      w.ape = TensorRef(keep.back().data(), DType::F32, dev, {c.ratio, c.width()});
      keep.push_back(upload(std::vector<float>(c.head_dim, 1.0f), dev));
      w.norm_weight = TensorRef(keep.back().data(), DType::F32, dev, {c.head_dim});
      w.rope = make_rope_table(RopeSpec::deepseek_v4_compressed(), cfg.head_dim);
      w.rope.layout.first_dim = c.head_dim - c.n_rot;
    }
  // The seed's kernels one by one, on the same storage the cache uses.
  auto separate = [&](int64_t p) {
    for (int l = 0; l < sep.n_layers(); ++l) {
      const Dsv4TokenInputs in = inputs[l]->at(static_cast<int>(p % n_tok), 1, cfg.head_dim, dev);
      dsv4_kv_finalize(in.kv, sep.raw_ring(0, l), p % cfg.window, cfg.n_rot, cfg.quant);
      const Dsv4LayerKind k = cfg.layers[l];
      if (k == Dsv4LayerKind::Window) continue;
      for (int ix = 0; ix < 2; ++ix) {
        if (ix && k != Dsv4LayerKind::CSA) continue;
        const Dsv4Compressor c = ix ? cfg.indexer() : cfg.compressor(k);
        const Dsv4CompressorWeights& w = wts[static_cast<size_t>(l) * 2 + ix];
        const TensorRef skv = sep.state(0, l, ix ? Dsv4State::IndexerKv : Dsv4State::CompressorKv),
                        ssc = sep.state(0, l, ix ? Dsv4State::IndexerScore : Dsv4State::CompressorScore);
        const TensorRef rows = ix ? sep.indexer_store(0, l) : sep.compressed_store(0, l);
        const TensorRef c1((ix ? in.idx_c : in.comp_c).data(), DType::F32, dev, {c.width()});
        const TensorRef z1((ix ? in.idx_z : in.comp_z).data(), DType::F32, dev, {c.width()});
        dsv4_compressor_store_one(c1, z1, w.ape, skv, ssc, p, c);
        if ((p + 1) % c.ratio == 0) {
          dsv4_compressor_emit(skv, ssc, c, w, p / c.ratio, cfg.quant, rows);
          if (c.overlap) dsv4_compressor_shift(skv, ssc, c);
        }
      }
    }
  };
  int64_t pf = 0, ps = 0;
  const Timing tf = opt.time([&](int) {
    for (int i = 0; i < tokens_per_rep; ++i, ++pf)
      for (int l = 0; l < fused.n_layers(); ++l)
        fused.append(0, l, static_cast<int32_t>(pf), inputs[l]->at(static_cast<int>(pf % n_tok), 1, cfg.head_dim, dev));
  });
  const Timing ts = opt.time([&](int) {
    for (int i = 0; i < tokens_per_rep; ++i, ++ps) separate(ps);
  });
  BenchRecord r;
  r.bench = "dsv4";
  r.case_name = "decode43 fused vs separate ops";
  r.bytes = bytes;
  r.t = per(tf, tokens_per_rep);
  r.traffic = Traffic::Copy;
  r.baseline = "separate ops";
  r.baseline_t = per(ts, tokens_per_rep);
  opt.report(r);
}

void bench_prefill(BenchOptions& opt, Dsv4Compressor c, const char* name, int64_t n) {
  const Device dev = opt.device;
  const int W = c.width(), cap = static_cast<int>(n / c.ratio);
  Buffer cc = upload(randn(static_cast<size_t>(n) * W, 11), dev), zz = upload(randn(static_cast<size_t>(n) * W, 12, 2.0f), dev);
  Buffer skv(static_cast<size_t>(c.state_rows()) * W * 4, dev), ssc(skv.size(), dev);
  const int rb = c.packed_row_bytes();
  Buffer rows(static_cast<size_t>(cap) * rb, dev);
  Buffer ape = upload(randn(static_cast<size_t>(c.ratio) * W, 13), dev);
  std::vector<float> nw(c.head_dim, 1.0f);
  Buffer norm = upload(nw, dev);
  RopeSpec s = RopeSpec::deepseek_v4_compressed();
  math::RopeTable rope = make_rope_table(s, 512);
  rope.layout.first_dim = c.head_dim - c.n_rot;
  const Dsv4CompressorWeights w{TensorRef(ape.data(), DType::F32, dev, {c.ratio, W}),
                                TensorRef(norm.data(), DType::F32, dev, {c.head_dim}), rope};
  const TensorRef tkv(skv.data(), DType::F32, dev, {c.state_rows(), W}), tsc(ssc.data(), DType::F32, dev, {c.state_rows(), W});
  const TensorRef tr(rows.data(), DType::U8, dev, {cap, rb});
  const TensorRef tc(cc.data(), DType::F32, dev, {n, W}), tz(zz.data(), DType::F32, dev, {n, W});
  const auto prefill = [&](Stream st) { dsv4_compress_prefill(tc, tz, tkv, tsc, 0, c, w, Dsv4Quant::On, tr, st); };
  const auto run = [&] {  // a fresh sequence: reset, then prefill
    dsv4_compressor_reset(tkv, tsc, c);
    prefill({});
  };
  BenchRecord r;
  r.bench = "dsv4";
  r.case_name = std::string("prefill ") + name + fmt(" n=%lld", n);
  r.bytes = 2.0 * n * W * 4 + static_cast<double>(cap) * rb;
  r.traffic = Traffic::Copy;
  // The timed region is the prefill call alone: a chunk at position 0 reads nothing of the state
  // and (n >= 2 ratio) overwrites all of it, so one reset before timing leaves every timed call
  // exactly a fresh sequence's (checked below on a state of garbage). "with reset": the reset op
  // timed too, as up to GPU run C (its launch and host validation were ~10 us of that row).
  run();
  const std::vector<uint8_t> rows_ref = rows.to_host<uint8_t>();
  const std::vector<float> kv_ref = skv.to_host<float>(), sc_ref = ssc.to_host<float>();
  const auto same_as_ref = [&] {
    return rows.to_host<uint8_t>() == rows_ref && skv.to_host<float>() == kv_ref && ssc.to_host<float>() == sc_ref;
  };
  const auto clear_outputs = [&](bool garbage_state) {  // so a call that wrote nothing cannot pass on the reference's output
    const std::vector<uint8_t> zeros(rows.size(), 0);
    rows.copy_from_host(zeros.data(), zeros.size());
    if (!garbage_state) return;
    const std::vector<float> junk = randn(skv.size() / 4, 14, 3.0f);
    skv.copy_from_host(junk.data(), skv.size());
    ssc.copy_from_host(junk.data(), ssc.size());
  };
  clear_outputs(true);
  prefill({});
  opt.note(r.case_name + (same_as_ref() ? ": prefill on a garbage state == reset + prefill (rows and state)"
                                        : ": prefill on a garbage state DIFFERS from reset + prefill: time the 'with reset' row"));
  r.t = opt.time([&](int) { prefill({}); });
  opt.report(r);
  BenchRecord rr = r;
  rr.case_name = r.case_name + " with reset";
  rr.t = opt.time([&](int) { run(); });
  opt.report(rr);
#if KVCORE_WITH_CUDA
  // The same call replayed from a CUDA graph: the GPU's time without the host's validation and
  // launch. Four calls a graph (the per-call time reported), so the graph's own launch is spread.
  const auto graph_row = [&](const std::string& case_name) {
    if (!dev.is_cuda()) return;
    constexpr int kCalls = 4;
    BenchRecord rg = r;
    rg.case_name = case_name + " (CUDA graph replay)";
    try {
      synchronize(dev);
      rg.t = per(kvcore::cli::time_graph(dev.index, opt.reps, opt.warmup, [&](Stream st) {
                   for (int i = 0; i < kCalls; ++i) prefill(st);
                 }),
                 kCalls);
    } catch (const std::exception& e) {
      opt.note(rg.case_name + ": graph capture failed: " + e.what());
      return;
    }
    opt.report(rg);
  };
  graph_row(r.case_name);
#endif
}

}  // namespace

KVCORE_BENCH(dsv4, "DeepSeek-V4-Flash cache: per-token decode step of 43 layers, indexer top-k, 64k-token prefill compression") {
  const int64_t n_prefill = opt.quick ? 4096 : 65536;
  const long long short_ctx = opt.quick ? 256 : 8192;
  if (opt.wants(fmt("decode43 cache step ctx=%lld", short_ctx))) bench_decode(opt, short_ctx, false);
  // One case name a context, so that `--case "...ctx=65536"` runs (and profiles) the long one alone.
  if (opt.wants(fmt("decode43 cache step+indexer ctx=%lld", short_ctx))) bench_decode(opt, short_ctx, true);
  if (!opt.quick && opt.wants("decode43 cache step+indexer ctx=65536")) bench_decode(opt, 65536, true);
  if (opt.wants("decode43 fused")) bench_decode_separate(opt);
  if (opt.wants("prefill csa")) bench_prefill(opt, Dsv4Compressor::csa(), "csa", n_prefill);
  if (opt.wants("prefill indexer")) bench_prefill(opt, Dsv4Compressor::indexer(), "indexer", n_prefill);
  if (opt.wants("prefill hca")) bench_prefill(opt, Dsv4Compressor::hca(), "hca", n_prefill);
}
