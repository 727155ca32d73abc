// `kvcore bench decode_trace` (CUDA only): where the tensor-core decode kernel's time goes.
// Runs the lean kernel at Llama-3-8B geometry with trace stamps (Path::LeanTrace, see
// trace_mark in src/cuda/attention_mma.cuh) and prints, per shape, a timeline: when CTAs
// start, how long the prologue, the first tile, the loop and the epilogue take, how the warps
// in their loop ramp up and drain, and how the event-timed kernel, the whole call (eager and
// from a graph) and the traced kernel compare. A diagnostic for #6, not a benchmark with
// targets: it reports no GB/s records.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "cuda/attention_mma.cuh"
#include "kvcore/kvcore.hpp"
#include "kvcore/ops/attention.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;
namespace mma = kvcore::ops::cuda::mma_attn;

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;

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

template <math::KvElem KV, int W>
void launch_traced_w(const ops::PagedAttentionParams& p, mma::CtaOrder order, unsigned long long* trace, cudaStream_t s) {
  using S = mma::Shape<kHeadDim, KV, false, 1, W>;
  auto kernel = mma::mma_decode_kernel<kHeadDim, KV, false, 1, mma::Path::LeanTrace, W>;
  static const bool attr = [&] {
    KVCORE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
    return true;
  }();
  (void)attr;
  order.trace = trace;
  kernel<<<order.gx * order.gy, S::kThreads, S::kSmemBytes, s>>>(p, 1, kQHeads / kKvHeads, order);
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
  const int nb = (c.ctx + kBlock - 1) / kBlock;
  const double bytes = 2.0 * c.batch * c.ctx * kKvHeads * (c.fp8 ? kHeadDim + 2 : 2 * kHeadDim);
  const int copies = std::clamp(static_cast<int>(std::ceil(240e6 / bytes)), 1, 16);
  const int64_t blocks = int64_t{copies} * c.batch * nb;
  const size_t row = c.fp8 ? kHeadDim : 2 * kHeadDim, blk = size_t{kBlock} * kKvHeads * row;
  const size_t blk_scales = size_t{kBlock} * kKvHeads * (kHeadDim / 64);
  // Contents do not matter for timing as long as they are finite: small codes / halves, scales 2^-6.
  std::vector<uint8_t> fill(blk);
  std::mt19937_64 rng(5);
  for (size_t i = 0; i < blk; ++i) fill[i] = c.fp8 ? static_cast<uint8_t>(rng() % 0x58) : (i % 2 ? 0x38 : rng() & 0xff);
  Buffer k(blocks * blk, d), v(blocks * blk, d), ks, vs;
  {
    Buffer src = Buffer::from_host(fill, d);
    for (int64_t b = 0; b < blocks; ++b) {
      copy_bytes(static_cast<uint8_t*>(k.data()) + b * blk, d, src.data(), d, blk);
      copy_bytes(static_cast<uint8_t*>(v.data()) + b * blk, d, src.data(), d, blk);
    }
  }
  if (c.fp8) {
    ks = Buffer::from_host(std::vector<uint8_t>(blocks * blk_scales, 121), d);
    vs = Buffer::from_host(std::vector<uint8_t>(blocks * blk_scales, 121), d);
  }
  std::vector<int32_t> perm(blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  std::vector<Buffer> idx;
  for (int cp = 0; cp < copies; ++cp)
    idx.push_back(Buffer::from_host(std::vector<int32_t>(perm.begin() + int64_t{cp} * c.batch * nb,
                                                         perm.begin() + int64_t{cp + 1} * c.batch * nb),
                                    d));
  std::vector<int32_t> ip(c.batch + 1), lp(c.batch, c.ctx - (nb - 1) * kBlock);
  for (int b = 0; b <= c.batch; ++b) ip[b] = b * nb;
  Buffer indptr = Buffer::from_host(ip, d), lpl = Buffer::from_host(lp, d);
  std::vector<float> hq(static_cast<size_t>(c.batch) * kQHeads * kHeadDim);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : hq) x = u(rng);
  Buffer q = Buffer::from_host(hq, d), out(hq.size() * 4, d);

  const DType t = c.fp8 ? DType::E4M3 : DType::F16;
  const int32_t splits = attention_auto_splits(d, c.batch, kKvHeads, kQHeads, kHeadDim, t, c.ctx);
  Buffer ws(attention_workspace_bytes(c.batch, kQHeads, kHeadDim, splits), d, 256);

  // The public call (eager and from a graph): what the attention bench times.
  PagedKV kv;
  kv.k = TensorRef(k.data(), t, d, {blocks, kBlock, kKvHeads, kHeadDim});
  kv.v = TensorRef(v.data(), t, d, {blocks, kBlock, kKvHeads, kHeadDim});
  if (c.fp8) {
    kv.k_scale = TensorRef(ks.data(), DType::UE8M0, d, {blocks, kBlock, kKvHeads, kHeadDim / 64});
    kv.v_scale = TensorRef(vs.data(), DType::UE8M0, d, {blocks, kBlock, kKvHeads, kHeadDim / 64});
  }
  std::vector<BlockTable> tables;
  for (int cp = 0; cp < copies; ++cp)
    tables.push_back({TensorRef(indptr.data(), DType::I32, d, {c.batch + 1}),
                      TensorRef(idx[cp].data(), DType::I32, d, {int64_t{c.batch} * nb}),
                      TensorRef(lpl.data(), DType::I32, d, {c.batch}), TensorRef()});
  const TensorRef tq(q.data(), DType::F32, d, {c.batch, kQHeads, kHeadDim});
  const TensorRef to(out.data(), DType::F32, d, {c.batch, kQHeads, kHeadDim});
  AttentionOptions ao;
  ao.softmax_scale = 1.0f / std::sqrt(float(kHeadDim));
  ao.check_tables = false;
  ao.max_seq_cells = c.ctx;
  ao.workspace = TensorRef(ws.data(), DType::U8, d, {static_cast<int64_t>(ws.size())});
  const cli::Timing eager = opt.time([&](int rep) { attention_decode(tq, kv, tables[rep % copies], to, ao); });
  cli::Timing graph = cli::time_graph(d.index, opt.reps, opt.warmup, [&](Stream st) {
    AttentionOptions go = ao;
    go.stream = st;
    for (int cp = 0; cp < copies; ++cp) attention_decode(tq, kv, tables[cp], to, go);
  });
  graph.median_us /= copies;

  // The kernel alone: the parameters validate_and_fill would produce for this lean call.
  ops::PagedAttentionParams p{};
  p.k = k.data();
  p.v = v.data();
  p.kv_elem = c.fp8 ? math::KvElem::E4M3 : math::KvElem::F16;
  p.scale_mode = c.fp8 ? math::KvScaleMode::Ue8m0Per64 : math::KvScaleMode::None;
  p.maybe_k_scale_u8 = c.fp8 ? static_cast<const uint8_t*>(ks.data()) : nullptr;
  p.maybe_v_scale_u8 = c.fp8 ? static_cast<const uint8_t*>(vs.data()) : nullptr;
  p.layout = PagedLayout{kBlock, kKvHeads, kHeadDim};
  p.num_blocks = static_cast<int32_t>(blocks);
  p.indptr = static_cast<const int32_t*>(indptr.data());
  p.last_page_len = static_cast<const int32_t*>(lpl.data());
  p.batch = c.batch;
  p.q = q.data();
  p.q_elem = ops::QElem::F32;
  p.q_row_stride = kQHeads * kHeadDim;
  p.q_head_stride = kHeadDim;
  p.n_rows = c.batch;
  p.n_q_heads = kQHeads;
  p.group = kQHeads / kKvHeads;
  p.softmax_scale = ao.softmax_scale;
  p.out = out.data();
  p.out_elem = ops::QElem::F32;
  p.out_row_stride = kQHeads * kHeadDim;
  p.out_head_stride = kHeadDim;
  p.num_splits = splits;
  p.max_seq_cells = c.ctx;
  p.o_part = static_cast<float*>(ws.data());
  p.lse_part = p.o_part + int64_t{c.batch} * kQHeads * splits * kHeadDim;
  p.device = d.index;
  mma::CtaOrder order{c.batch * splits, kKvHeads, true};
  order.fat = mma::fat_decode_allowed(p.kv_elem, false, p.group) &&
              ops::fat_decode_grid(int64_t{order.gx} * order.gy, ops::cuda::sm_count(d.index), p.max_seq_cells, splits);
  const int warps = order.fat ? ops::kFatWarps : 4;
  const int ctas = order.gx * order.gy;
  Buffer tr(size_t(ctas) * warps * mma::kTraceSlots * 8, d);
  auto* trace = static_cast<unsigned long long*>(tr.data());
  auto with_table = [&](int rep) {
    ops::PagedAttentionParams pr = p;
    pr.indices = static_cast<const int32_t*>(idx[rep % copies].data());
    return pr;
  };
  const cli::Timing kernel = opt.time([&](int rep) { mma::launch(with_table(rep), nullptr); });
  auto traced = [&](int rep) {
    if (c.fp8) launch_traced<math::KvElem::E4M3>(with_table(rep), order, trace, nullptr);
    else launch_traced<math::KvElem::F16>(with_table(rep), order, trace, nullptr);
  };
  const cli::Timing traced_t = opt.time(traced);
  KVCORE_CUDA_CHECK(cudaMemset(trace, 0, tr.size()));  // warps with no tile leave stamp 3 at 0
  traced(1);
  KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned long long> h(size_t(ctas) * warps * mma::kTraceSlots);
  copy_bytes(h.data(), Device::cpu(), tr.data(), d, h.size() * 8);

  // Raw stamps (ns after the first) for offline analysis: KVCORE_TRACE_DIR/<case>.csv.
  if (const char* dir = std::getenv("KVCORE_TRACE_DIR")) {
    unsigned long long first = ~0ull;
    for (size_t i = 0; i < h.size(); i += mma::kTraceSlots) first = std::min(first, h[i]);
    if (FILE* f = std::fopen((std::string(dir) + "/" + name + ".csv").c_str(), "w")) {
      std::fprintf(f, "cta,warp,sm,entry,prologue,q_ready,first_tile,loop_done,written\n");
      for (int i = 0; i < ctas; ++i)
        for (int w = 0; w < warps; ++w) {
          const unsigned long long* r = &h[(size_t(i) * warps + w) * mma::kTraceSlots];
          std::fprintf(f, "%d,%d,%llu", i, w, r[mma::kTraceStamps]);
          for (int pt = 0; pt < mma::kTraceStamps; ++pt) std::fprintf(f, ",%lld", static_cast<long long>(r[pt] - first));
          std::fprintf(f, "\n");
        }
      std::fclose(f);
    }
  }

  // ---- the timeline, relative to the first stamp
  auto at = [&](int cta, int w, int point) { return h[(size_t(cta) * warps + w) * mma::kTraceSlots + point]; };
  unsigned long long t0 = ~0ull, t_end = 0;
  for (int i = 0; i < ctas; ++i)
    for (int w = 0; w < warps; ++w) t0 = std::min(t0, at(i, w, 0)), t_end = std::max(t_end, at(i, w, 5));
  auto us = [](unsigned long long a, unsigned long long b) { return (double(b) - double(a)) * 1e-3; };
  std::vector<double> start, prologue, qready, first, loop, epi, finish, cta_len;
  std::vector<int> per_sm(1024, 0);
  std::vector<double> sm_finish(1024, 0);
  for (int i = 0; i < ctas; ++i) {
    const unsigned long long s0 = at(i, 0, 0);
    unsigned long long last = 0;
    for (int w = 0; w < warps; ++w) {
      if (at(i, w, 3) == 0) continue;  // an empty split (or warp): no loop
      prologue.push_back(us(at(i, w, 0), at(i, w, 1)));
      qready.push_back(us(at(i, w, 0), at(i, w, 2)));
      first.push_back(us(at(i, w, 0), at(i, w, 3)));
      loop.push_back(us(at(i, w, 3), at(i, w, 4)));
      last = std::max(last, at(i, w, 4));
    }
    if (last == 0) continue;
    start.push_back(us(t0, s0));
    epi.push_back(us(last, at(i, 0, 5)));
    finish.push_back(us(t0, at(i, 0, 5)));
    cta_len.push_back(us(s0, at(i, 0, 5)));
    const int sm = static_cast<int>(at(i, 0, 6)) & 1023;
    ++per_sm[sm];
    sm_finish[sm] = std::max(sm_finish[sm], us(t0, at(i, 0, 5)));
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
  print_dist("CTA start after the first", start);
  print_dist("warp: entry -> prologue issued", prologue);
  print_dist("warp: entry -> q fragments ready", qready);
  print_dist("warp: entry -> first tile ready", first);
  print_dist("warp: first tile -> loop done", loop);
  print_dist("CTA: last warp done -> partial written", epi);
  print_dist("CTA: entry -> partial written", cta_len);
  print_dist("CTA finish after the first start", finish);
  print_dist("SM finish after the first start", fin);
  // Warps inside their main loop, per 1-us bin of the span: the ramp and the drain.
  const int bins = static_cast<int>(us(t0, t_end)) + 1;
  std::vector<double> busy(bins, 0.0);
  for (int i = 0; i < ctas; ++i)
    for (int w = 0; w < warps; ++w) {
      if (at(i, w, 3) == 0) continue;
      const double a = us(t0, at(i, w, 3)), b = us(t0, at(i, w, 4));
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
