// `kvcore bench decode_trace` (CUDA only): where the tensor-core decode kernel's time goes.
// Runs the lean kernel at Llama-3-8B geometry with trace stamps (Path::LeanTrace, see
// trace_mark in src/cuda/attention/attention_mma.cuh) and prints, per shape, a timeline: when CTAs
// start, how long the prologue, the first tile, the loop and the epilogue take, how the warps
// in their loop ramp up and drain, and how the event-timed kernel, the whole call (eager and
// from a graph) and the traced kernel compare. A diagnostic for #6, not a benchmark with
// targets: it reports no GB/s records.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "bench/llama8b_pages.hpp"
#include "cuda/attention/attention_mma.cuh"
#include "cuda/common/device.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/ops/attention.hpp"
#include "ops/attention_plan_impl.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;
using namespace kvcore::cli::llama8b;
namespace mma = kvcore::ops::cuda::mma_attn;

struct TraceCase {
  int batch, ctx;
  bool fp8;
};

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

void print_dist(const char* what, const std::vector<double>& v) {
  std::printf("    %-34s p10 %7.2f  p50 %7.2f  p90 %7.2f  max %7.2f us\n", what, pct(v, 0.1), pct(v, 0.5), pct(v, 0.9),
              pct(v, 1.0));
}

__global__ void empty_kernel() {}

// Host microseconds per call of fn, over back-to-back calls (the GPU queue absorbs the launches).
template <class F>
double host_us_per_call(F&& fn) {
  constexpr int kCalls = 200;
  for (int i = 0; i < 20; ++i) fn(i);
  KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) fn(i);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCalls;
  KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
  return us;
}

template <math::KvElem KV, int W>
void launch_traced_w(const ops::PagedAttentionParams& p, mma::CtaOrder order, unsigned long long* trace, cudaStream_t s) {
  using S = mma::Shape<kHeadDim, KV, false, 1, W>;
  auto kernel = mma::mma_decode_kernel<kHeadDim, KV, false, 1, mma::Path::LeanTrace, W>;
  ops::cuda::smem_opt_in(kernel, S::kSmemBytes, p.device);
  order.trace = trace;
  kernel<<<order.gx * order.gy, S::kThreads, S::kSmemBytes, s>>>(p, 1, mma::heads_per_cta(p.group), order);
  KVCORE_CUDA_CHECK_LAUNCH("traced decode kernel");
}

// The CTA size the library launches for this grid (src/ops/decode_fat_ctas.hpp).
template <math::KvElem KV>
void launch_traced(const ops::PagedAttentionParams& p, mma::CtaOrder order, unsigned long long* trace, cudaStream_t s) {
  if constexpr (KV == math::KvElem::E4M3)
    if (order.fat) return launch_traced_w<KV, ops::kFatWarps>(p, order, trace, s);
  launch_traced_w<KV, 4>(p, order, trace, s);
}

void trace_case(cli::BenchOptions& opt, const TraceCase& c) {
  const std::string name = std::string(c.fp8 ? "fp8" : "f16") + "_b" + std::to_string(c.batch) + "_ctx" + std::to_string(c.ctx);
  if (!opt.wants(name)) return;
  const Device d = opt.device;
  const double bytes = kv_bytes(c.batch, c.ctx, c.fp8);
  const int copies = std::clamp(static_cast<int>(std::ceil(240e6 / bytes)), 1, 16);
  const Pages pages = make_pages(d, c.batch, c.ctx, c.fp8, false, copies);
  // The public calls (eager and from a graph): what the attention bench times. A plan per copy
  // (its table), one workspace.
  const PagedKV& kv = pages.kv;
  const TensorRef tq = pages.q_ref, to = pages.out_ref;
  AttentionSchedule sc;
  sc.check_tables = false;
  sc.max_seq_cells = c.ctx;
  const int32_t splits = AttentionPlan::decode(kv, kQHeads, pages.steps[0], sc).num_splits();
  Buffer ws(attention_workspace_bytes(c.batch, kQHeads, kHeadDim, splits), d, 256);
  sc.maybe_workspace = TensorRef(ws.data(), DType::U8, d, {static_cast<int64_t>(ws.size())});
  std::vector<AttentionPlan> plans;
  for (int cp = 0; cp < copies; ++cp) plans.push_back(AttentionPlan::decode(kv, kQHeads, pages.steps[cp], sc));
  const cli::Timing eager = opt.time([&](int rep) { plans[rep % copies].run(tq, kv, to); });
  cli::Timing graph = cli::time_graph(d.index, opt.reps, opt.warmup, [&](Stream st) {
    for (int cp = 0; cp < copies; ++cp) plans[cp].run(tq, kv, to, {}, st);
  });
  graph.median_us /= copies;
  // Where the eager call's host time goes: the run back to back, planning alone (once per
  // step, not per layer), and a plain launch of an empty kernel (the driver's share).
  const double host_call = host_us_per_call([&](int i) { plans[i % copies].run(tq, kv, to); });
  const double host_splits = host_us_per_call([&](int i) { (void)AttentionPlan::decode(kv, kQHeads, pages.steps[i % copies], sc); });
  const double host_launch = host_us_per_call([&](int) {
    empty_kernel<<<1, 32>>>();
    KVCORE_CUDA_CHECK_LAUNCH("empty kernel");
  });

  // The kernel alone: the parameters a run launches.
  ops::PagedAttentionParams p{};
  ops::attn::run_params(plans[0], tq, kv, to, {}, {}, p);
  const ops::AttentionTuning tuning;
  const mma::CtaOrder order = mma::cta_order_for(p, 1, tuning.fat_ctas);  // what mma::launch runs
  const int warps = order.fat ? ops::kFatWarps : 4;
  const int ctas = order.gx * order.gy;
  Buffer tr(size_t(ctas) * warps * mma::kTraceSlots * 8, d);
  auto* trace = static_cast<unsigned long long*>(tr.data());
  auto with_table = [&](int rep) {
    ops::PagedAttentionParams pr = p;
    pr.indices = static_cast<const int32_t*>(pages.indices_dev[rep % copies].data());
    pr.n_indices = static_cast<int64_t>(pages.indices[rep % copies].size());
    return pr;
  };
  const cli::Timing kernel = opt.time([&](int rep) { mma::launch(with_table(rep), tuning, nullptr); });
  auto traced = [&](int rep) {
    if (c.fp8) launch_traced<math::KvElem::E4M3>(with_table(rep), order, trace, nullptr);
    else launch_traced<math::KvElem::F16>(with_table(rep), order, trace, nullptr);
  };
  const cli::Timing traced_t = opt.time(traced);
  KVCORE_CUDA_CHECK(cudaMemset(trace, 0, tr.size()));  // warps with no tile leave the first-tile stamp at 0
  traced(1);
  KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned long long> h(size_t(ctas) * warps * mma::kTraceSlots);
  copy_bytes(h.data(), Device::cpu(), tr.data(), d, h.size() * 8);

  // Raw stamps (ns after the first) for offline analysis: <--trace-dir>/<case>.csv.
  if (const std::string& dir = opt.trace_dir; !dir.empty()) {
    unsigned long long first = ~0ull;
    for (size_t i = 0; i < h.size(); i += mma::kTraceSlots) first = std::min(first, h[i]);
    if (FILE* f = std::fopen((dir + "/" + name + ".csv").c_str(), "w")) {
      std::fprintf(f, "cta,warp,sm,entry,seq_known,prologue,q_ready,first_tile,loop_done,merged,written\n");
      for (int i = 0; i < ctas; ++i)
        for (int w = 0; w < warps; ++w) {
          const unsigned long long* r = &h[(size_t(i) * warps + w) * mma::kTraceSlots];
          std::fprintf(f, "%d,%d,%llu", i, w, r[mma::kTraceSmSlot]);
          for (int pt = 0; pt < mma::kTraceStamps; ++pt) std::fprintf(f, ",%lld", static_cast<long long>(r[pt] - first));
          std::fprintf(f, "\n");
        }
      std::fclose(f);
    }
  }

  // ---- the timeline, relative to the first stamp
  using P = mma::TracePoint;
  auto at = [&](int cta, int w, int point) { return h[(size_t(cta) * warps + w) * mma::kTraceSlots + point]; };
  unsigned long long t0 = ~0ull, t_end = 0;
  for (int i = 0; i < ctas; ++i)
    for (int w = 0; w < warps; ++w) t0 = std::min(t0, at(i, w, P::kTraceEntry)), t_end = std::max(t_end, at(i, w, P::kTraceWritten));
  auto us = [](unsigned long long a, unsigned long long b) { return (double(b) - double(a)) * 1e-3; };
  std::vector<double> start, seq, prologue, qready, first, loop, merged, epi, finish, cta_len;
  std::vector<int> per_sm(1024, 0);
  std::vector<double> sm_finish(1024, 0);
  for (int i = 0; i < ctas; ++i) {
    const unsigned long long s0 = at(i, 0, P::kTraceEntry);
    unsigned long long last = 0;
    for (int w = 0; w < warps; ++w) {
      if (at(i, w, P::kTraceFirstTile) == 0) continue;  // an empty split (or warp): no loop
      const unsigned long long e = at(i, w, P::kTraceEntry);
      seq.push_back(us(e, at(i, w, P::kTraceSeqKnown)));
      prologue.push_back(us(e, at(i, w, P::kTracePrologueIssued)));
      qready.push_back(us(e, at(i, w, P::kTraceQReady)));
      first.push_back(us(e, at(i, w, P::kTraceFirstTile)));
      loop.push_back(us(at(i, w, P::kTraceFirstTile), at(i, w, P::kTraceLoopDone)));
      last = std::max(last, at(i, w, P::kTraceLoopDone));
    }
    if (last == 0) continue;
    start.push_back(us(t0, s0));
    const unsigned long long done = at(i, 0, P::kTraceWritten);
    merged.push_back(us(last, at(i, 0, P::kTraceWarpsMerged)));
    epi.push_back(us(last, done));
    finish.push_back(us(t0, done));
    cta_len.push_back(us(s0, done));
    const int sm = static_cast<int>(at(i, 0, mma::kTraceSmSlot)) & 1023;
    ++per_sm[sm];
    sm_finish[sm] = std::max(sm_finish[sm], us(t0, done));
  }
  int sms = 0, max_per = 0;
  std::vector<double> fin;
  for (int sm = 0; sm < 1024; ++sm)
    if (per_sm[sm]) ++sms, max_per = std::max(max_per, per_sm[sm]), fin.push_back(sm_finish[sm]);
  std::printf("\n== %s: %d splits, %d CTAs of %d warps on %d SMs (at most %d an SM), %.1f MB of K/V, %d copies\n",
              name.c_str(), splits, ctas, warps, sms, max_per, bytes / 1e6, copies);
  std::printf("    call eager %.1f us, call graph %.1f us, decode kernel %.1f us (event), traced kernel %.1f us; "
              "stamped span %.1f us\n",
              eager.median_us, graph.median_us, kernel.median_us, traced_t.median_us, us(t0, t_end));
  std::printf("    read at %.0f GB/s over the decode kernel's event time\n", bytes / kernel.median_us / 1e3);
  std::printf("    host per call, back to back: plan.run %.2f us, AttentionPlan::decode (once a step) %.2f us, "
              "empty kernel launch %.2f us\n",
              host_call, host_splits, host_launch);
  print_dist("CTA start after the first", start);
  print_dist("warp: entry -> sequence known", seq);
  print_dist("warp: entry -> prologue issued", prologue);
  print_dist("warp: entry -> q fragments ready", qready);
  print_dist("warp: entry -> first tile ready", first);
  print_dist("warp: first tile -> loop done", loop);
  print_dist("CTA: last warp done -> factors ready", merged);
  print_dist("CTA: last warp done -> partial written", epi);
  print_dist("CTA: entry -> partial written", cta_len);
  print_dist("CTA finish after the first start", finish);
  print_dist("SM finish after the first start", fin);
  // Warps inside their main loop, per 1-us bin of the span: the ramp and the drain.
  const int bins = static_cast<int>(us(t0, t_end)) + 1;
  std::vector<double> busy(bins, 0.0);
  for (int i = 0; i < ctas; ++i)
    for (int w = 0; w < warps; ++w) {
      if (at(i, w, P::kTraceFirstTile) == 0) continue;
      const double a = us(t0, at(i, w, P::kTraceFirstTile)), b = us(t0, at(i, w, P::kTraceLoopDone));
      for (int x = std::max(0, int(a)); x < bins && x <= int(b); ++x)
        busy[x] += std::max(0.0, std::min(b, x + 1.0) - std::max(a, double(x)));
    }
  std::printf("    warps in their loop per us (of %d):", ctas * warps);
  for (int x = 0; x < bins; x += std::max(1, bins / 40)) std::printf(" %.0f", busy[x]);
  std::printf("\n");
}

}  // namespace

KVCORE_BENCH(decode_trace, "timeline of the tensor-core decode kernel (trace stamps): start-up, loop, drain (CUDA)") {
  if (!opt.device.is_cuda()) {
    opt.note("decode_trace: CUDA only, skipped");
    return;
  }
  for (const TraceCase& c : {TraceCase{1, 32768, true}, TraceCase{1, 131072, true}, TraceCase{16, 8192, true},
                             TraceCase{16, 32768, true}, TraceCase{1, 32768, false}, TraceCase{16, 8192, false},
                             TraceCase{64, 1024, false}})
    trace_case(opt, c);
}
