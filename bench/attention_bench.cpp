// `kvcore bench attention`: paged decode attention at Llama-3-8B geometry
// (32 q heads, 8 kv heads, head_dim 128, blocks of 16) for batch 1/16/64 and
// contexts 1k..128k, f16 and FP8 (per-64 UE8M0) pages; DeepSeek-V4 sparse
// decode at 8k, 64k and 1M tokens (CSA: window 128 + top-512 picks; HCA: window
// + every visible row). Bytes = K/V (and scale) bytes the op must read; the
// ceiling is the read-only kernel. Case names match bench/attention_sdpa_baseline.py.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "bench/llama8b_pages.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/attention.hpp"
#include "ops/attention_plan_impl.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

using namespace kvcore::cli::llama8b;
constexpr double kL2Bytes = 60e6;

// Check sequence 0 of copy 0 against the CPU op on a host rebuild of its blocks.
bool check_paged(const Pages& s, Device d, const AttentionPlan& plan, const TensorRef& q, const TensorRef& out) {
  plan.run(q, s.kv, out);
  synchronize(d);
  const int64_t nb = s.blocks_per_seq;
  const size_t row_elem = s.fp8 ? 1 : 2;
  const size_t blk_bytes = kBlock * kKvHeads * kHeadDim * row_elem, blk_scales = kBlock * kKvHeads * (kHeadDim / 64);
  std::vector<uint8_t> hk(nb * blk_bytes), hv(nb * blk_bytes), hks(nb * blk_scales), hvs(nb * blk_scales);
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t b = s.indices[0][i];
    auto grab = [&](const Tiled& t, std::vector<uint8_t>& dst, size_t unit) {
      const size_t off = (b * unit) % t.pattern.size();
      std::memcpy(&dst[i * unit], &t.pattern[off], unit);
    };
    grab(s.k, hk, blk_bytes);
    grab(s.v, hv, blk_bytes);
    if (s.fp8) grab(s.ks, hks, blk_scales), grab(s.vs, hvs, blk_scales);
  }
  const DType t = s.fp8 ? DType::E4M3 : DType::F16;
  PagedKV hkv;
  hkv.k = TensorRef(hk.data(), t, Device::cpu(), {nb, kBlock, kKvHeads, kHeadDim});
  hkv.v = TensorRef(hv.data(), t, Device::cpu(), {nb, kBlock, kKvHeads, kHeadDim});
  if (s.fp8) {
    hkv.k_scale = TensorRef(hks.data(), DType::UE8M0, Device::cpu(), {nb, kBlock, kKvHeads, kHeadDim / 64});
    hkv.v_scale = TensorRef(hvs.data(), DType::UE8M0, Device::cpu(), {nb, kBlock, kKvHeads, kHeadDim / 64});
  }
  std::vector<int32_t> ip{0, static_cast<int32_t>(nb)}, ix(nb), lp{static_cast<int32_t>(s.ctx - (nb - 1) * kBlock)};
  std::iota(ix.begin(), ix.end(), 0);
  AttentionStep hs;
  hs.table = BlockTable{TensorRef(ip.data(), DType::I32, Device::cpu(), {2}), TensorRef(ix.data(), DType::I32, Device::cpu(), {nb}),
                        TensorRef(lp.data(), DType::I32, Device::cpu(), {1}), TensorRef()};
  std::vector<float> hq(kQHeads * kHeadDim), ho(kQHeads * kHeadDim), go(kQHeads * kHeadDim);
  copy_bytes(hq.data(), Device::cpu(), q.data(), d, hq.size() * 4);
  copy_bytes(go.data(), Device::cpu(), out.data(), d, go.size() * 4);
  std::vector<int32_t> hpos(nb * kBlock), hqpos{static_cast<int32_t>(s.ctx)};
  std::vector<uint8_t> hvalid(nb * kBlock, 1);
  if (s.rope) {
    std::iota(hpos.begin(), hpos.end(), 0);
    hkv.positions = TensorRef(hpos.data(), DType::I32, Device::cpu(), {nb, kBlock});
    hkv.valid = TensorRef(hvalid.data(), DType::U8, Device::cpu(), {nb, kBlock});
    hkv.rope_mode = RopeMode::RopeOnRead;
    hkv.maybe_rope = s.kv.maybe_rope;
    hs.q_positions = TensorRef(hqpos.data(), DType::I32, Device::cpu(), {1});
  }
  AttentionPlan::decode(hkv, kQHeads, hs)
      .run(TensorRef(hq.data(), DType::F32, Device::cpu(), {1, kQHeads, kHeadDim}), hkv,
           TensorRef(ho.data(), DType::F32, Device::cpu(), {1, kQHeads, kHeadDim}));
  double err = 0, mx = 1e-6;
  for (size_t i = 0; i < ho.size(); ++i) err = std::max(err, double(std::abs(ho[i] - go[i]))), mx = std::max(mx, double(std::abs(ho[i])));
  const bool ok = err <= 1e-4 * std::max(1.0, mx) && std::isfinite(err);
  if (!ok) std::fprintf(stderr, "[bench] attention CHECK FAILED: max error %.3g (max |out| %.3g)\n", err, mx);
  return ok;
}

void bench_paged(cli::BenchOptions& opt, int64_t batch, int64_t ctx, bool fp8, bool rope = false) {
  const std::string name = std::string("llama8b_") + (fp8 ? "fp8" : "f16") + (rope ? "_ropeonread" : "") + "_b" +
                           std::to_string(batch) + "_ctx" + std::to_string(ctx);
  if (!opt.wants(name)) return;
  const Device d = opt.device;
  const double bytes = kv_bytes(batch, ctx, fp8);
  const int64_t copies = d.is_cuda() ? std::clamp<int64_t>(static_cast<int64_t>(std::ceil(4 * kL2Bytes / bytes)), 1, 64) : 1;
  const Pages s = make_pages(d, batch, ctx, fp8, rope, copies);
  const PagedKV& kv = s.kv;
  const TensorRef q = s.q_ref, out = s.out_ref;
  // A step's plan per copy (the tables differ), one workspace for all: plans are made once
  // and every timed call is a run, as a decode step's layers are.
  AttentionSchedule sc;
  sc.check_tables = false;
  sc.max_seq_cells = ctx;
  const ops::AttentionKernel kernels[] = {ops::AttentionKernel::Auto, ops::AttentionKernel::SimtAsync};
  int32_t splits = 1;
  for (ops::AttentionKernel k : kernels) {
    ops::AttentionTuning tu;
    tu.kernel = k;
    splits = std::max(splits, ops::attn::plan_paged(false, kv, kQHeads, s.steps[0], sc, tu).num_splits());
  }
  Buffer ws(attention_workspace_bytes(batch, kQHeads, kHeadDim, splits), d, 256);
  sc.maybe_workspace = TensorRef(ws.data(), DType::U8, d, {static_cast<int64_t>(ws.size())});
  // The automatic kernel (tensor cores at this shape on CUDA) and, for comparison, the SIMT
  // cp.async kernel ("_simt"; not for FP8 with rope on read: ~2.6 ms a call).
  for (ops::AttentionKernel kernel : kernels) {
    const bool simt = kernel == ops::AttentionKernel::SimtAsync;
    if (simt && (!d.is_cuda() || (rope && fp8))) break;
    ops::AttentionTuning tu;
    tu.kernel = kernel;
    std::vector<AttentionPlan> plans;
    for (int64_t c = 0; c < s.copies; ++c) plans.push_back(ops::attn::plan_paged(false, kv, kQHeads, s.steps[c], sc, tu));
    const std::string cname = name + (simt ? "_simt" : "");
    if (!check_paged(s, d, plans[0], q, out)) {
      opt.note(cname + ": result check FAILED, not timed");
      continue;
    }
    const cli::Timing tm = opt.time([&](int rep) { plans[rep % s.copies].run(q, kv, out); });
    cli::BenchRecord r;
    r.bench = "attention";
    r.case_name = cname;
    r.bytes = bytes;
    r.t = tm;
    r.traffic = cli::Traffic::Read;
    opt.report(r);
#if KVCORE_WITH_CUDA
    // Host time of one run (O(1) checks, launches): the timings above include it, as SDPA's
    // include PyTorch's.
    if (!simt && d.is_cuda()) {
      int i = 0;
      const double host_us = cli::host_time_us(d.index, [&] { plans[i++ % s.copies].run(q, kv, out); });
      opt.note(cname + ": host time of one run (check, enqueue) " + std::to_string(host_us) + " us");
    }
    // Small batches: the same runs replayed from a CUDA graph (one run per copy, so inputs
    // still rotate) show the device time without the host's launch overhead.
    if (!simt && (batch == 1 || (batch == 16 && ctx <= 8192)) && d.is_cuda()) {
      const int n = static_cast<int>(s.copies);
      cli::Timing tg = cli::time_graph(d.index, opt.reps, opt.warmup, [&](Stream st) {
        for (int c = 0; c < n; ++c) plans[c].run(q, kv, out, {}, st);
      });
      tg.median_us /= n;
      tg.min_us /= n;
      r.case_name = name + "_graph";
      r.t = tg;
      opt.report(r);
    }
#endif
  }
  opt.note(name + ": splits " + std::to_string(splits) + ", rotating " + std::to_string(s.copies) + " copies");
}

// ---- DeepSeek-V4 ---------------------------------------------------------------------
void bench_dsv4(cli::BenchOptions& opt, int64_t batch, int64_t tokens, bool hca) {
  const std::string name = std::string("dsv4_") + (hca ? "hca" : "csa") + "_b" + std::to_string(batch) + "_ctx" +
                           std::to_string(tokens);
  if (!opt.wants(name)) return;
  const Device d = opt.device;
  constexpr int64_t kD = 512, kHeads = 64, kWin = 128, kRowB = math::Dsv4RowLayout::kBytes;
  const int64_t n_comp = hca ? tokens / 128 : tokens / 4;
  const int64_t k = hca ? n_comp : std::min<int64_t>(512, n_comp);
  const double bytes = double(batch) * (kWin * kD * 2 + k * kRowB);
  const int64_t copies = d.is_cuda() ? std::clamp<int64_t>(static_cast<int64_t>(std::ceil(4 * kL2Bytes / (batch * n_comp * kRowB + 1.0))), 1, 16) : 1;
  // Packed rows: finite e4m3 codes, bf16 tail, scales 2^-6..2^-3.
  std::vector<uint8_t> rows(static_cast<size_t>(std::min<int64_t>(n_comp, 65536)) * kRowB);
  std::mt19937_64 rng(11);
  for (size_t r = 0; r < rows.size() / kRowB; ++r) {
    uint8_t* p = &rows[r * kRowB];
    for (int i = 0; i < 448; ++i) p[i] = static_cast<uint8_t>((rng() % 0x58) | (rng() & 0x80));
    for (int i = 0; i < 64; ++i) {
      const uint16_t b = math::f32_to_bf16_bits(float(int(rng() % 2001) - 1000) / 1000.0f);
      p[448 + 2 * i] = uint8_t(b & 0xff), p[449 + 2 * i] = uint8_t(b >> 8);
    }
    for (int i = 0; i < 7; ++i) p[576 + i] = uint8_t(121 + rng() % 4);
    p[583] = 0;
  }
  Buffer comp(static_cast<size_t>(copies * batch * n_comp * kRowB), d);
  {
    Buffer src = Buffer::from_host(rows, d);
    for (size_t off = 0; off < comp.size(); off += rows.size())
      copy_bytes(static_cast<uint8_t*>(comp.data()) + off, d, src.data(), d, std::min(rows.size(), comp.size() - off));
  }
  std::vector<uint16_t> win(batch * kWin * kD);
  for (auto& w : win) w = math::f32_to_f16_bits(float(int(rng() % 2001) - 1000) / 1000.0f);
  std::vector<float> hq(batch * kHeads * kD);
  for (auto& x : hq) x = float(int(rng() % 2001) - 1000) / 1000.0f;
  std::vector<int32_t> wl(batch, kWin), qp(batch, static_cast<int32_t>(tokens - 1));
  std::vector<std::vector<int32_t>> idx(copies, std::vector<int32_t>(batch * k));
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < k; ++i)
        idx[c][b * k + i] = static_cast<int32_t>((c * batch + b) * n_comp + (hca ? i : static_cast<int64_t>(rng() % n_comp)));
  Buffer bq = Buffer::from_host(hq, d), bw = Buffer::from_host(win, d), bwl = Buffer::from_host(wl, d),
         bqp = Buffer::from_host(qp, d), bout(hq.size() * 4, d);
  std::vector<Buffer> bidx;
  for (auto& v : idx) bidx.push_back(Buffer::from_host(v, d));
  std::vector<float> sinks(kHeads, 0.5f);
  Buffer bs = Buffer::from_host(sinks, d);
  const math::RopeTable rope = make_rope_table(RopeSpec::deepseek_v4_compressed(), kD);
  Dsv4AttentionLayer a;
  Dsv4AttentionStep st;
  const TensorRef tq(bq.data(), DType::F32, d, {batch, kHeads, kD});
  a.window_kv = TensorRef(bw.data(), DType::F16, d, {batch, kWin, kD});
  st.window_len = TensorRef(bwl.data(), DType::I32, d, {batch});
  st.q_positions = TensorRef(bqp.data(), DType::I32, d, {batch});
  a.comp_rows = TensorRef(comp.data(), DType::U8, d, {copies * batch * n_comp, kRowB});
  a.comp_idx = TensorRef(bidx[0].data(), DType::I32, d, {batch, k});
  a.maybe_sinks = TensorRef(bs.data(), DType::F32, d, {kHeads});
  a.rope = &rope;
  a.check_indices = false;
  Buffer ws(attention_workspace_bytes(batch, kHeads, kD, 128), d, 256);
  AttentionSchedule sc;
  sc.maybe_workspace = TensorRef(ws.data(), DType::U8, d, {static_cast<int64_t>(ws.size())});
  const Dsv4AttentionPlan plan = Dsv4AttentionPlan::decode(a, kHeads, st, sc);
  const TensorRef out(bout.data(), DType::F32, d, {batch, kHeads, kD});
  // Check against the CPU op on copy 0 (the rows it reads are the pattern's).
  {
    plan.run(tq, a, out);
    std::vector<float> got = bout.to_host<float>();
    std::vector<uint8_t> hrows(static_cast<size_t>(batch * n_comp * kRowB));
    for (size_t off = 0; off < hrows.size(); off += rows.size())
      std::memcpy(&hrows[off], rows.data(), std::min(rows.size(), hrows.size() - off));
    Dsv4AttentionLayer h = a;
    Dsv4AttentionStep hst;
    h.window_kv = TensorRef(win.data(), DType::F16, Device::cpu(), {batch, kWin, kD});
    hst.window_len = TensorRef(wl.data(), DType::I32, Device::cpu(), {batch});
    hst.q_positions = TensorRef(qp.data(), DType::I32, Device::cpu(), {batch});
    h.comp_rows = TensorRef(hrows.data(), DType::U8, Device::cpu(), {batch * n_comp, kRowB});
    h.comp_idx = TensorRef(idx[0].data(), DType::I32, Device::cpu(), {batch, k});
    h.maybe_sinks = TensorRef(sinks.data(), DType::F32, Device::cpu(), {kHeads});
    std::vector<float> want(hq.size());
    Dsv4AttentionPlan::decode(h, kHeads, hst)
        .run(TensorRef(hq.data(), DType::F32, Device::cpu(), {batch, kHeads, kD}), h,
             TensorRef(want.data(), DType::F32, Device::cpu(), {batch, kHeads, kD}));
    double err = 0, mx = 1e-6;
    for (size_t i = 0; i < want.size(); ++i) err = std::max(err, double(std::abs(want[i] - got[i]))), mx = std::max(mx, double(std::abs(want[i])));
    if (!(err <= 1e-4 * std::max(1.0, mx))) {
      opt.note(name + ": result check FAILED (max error " + std::to_string(err) + "), not timed");
      return;
    }
  }
  const cli::Timing tm = opt.time([&](int rep) {
    a.comp_idx = TensorRef(bidx[rep % copies].data(), DType::I32, d, {batch, k});
    plan.run(tq, a, out);
  });
  cli::BenchRecord r;
  r.bench = "attention";
  r.case_name = name;
  r.bytes = bytes;
  r.t = tm;
  r.traffic = cli::Traffic::Read;
  opt.report(r);
}

}  // namespace

KVCORE_BENCH(attention, "paged decode attention (Llama-3-8B, f16/FP8 pages) and DeepSeek-V4 sparse decode") {
  std::vector<int64_t> batches{1, 16, 64}, ctxs{1024, 4096, 8192, 32768, 131072};
  if (opt.device.is_cpu()) batches = {1, 4}, ctxs = {1024, 4096, 8192, 32768};
  if (opt.quick) batches = {1, 4}, ctxs = {1024};
  for (bool fp8 : {false, true})
    for (int64_t b : batches)
      for (int64_t c : ctxs) {
        if (kv_bytes(b, c, fp8) > 40e9) continue;  // fits an H200 with room to spare
        if (opt.device.is_cpu() && b > 1 && c > 4096) continue;  // batch 1 carries the long contexts on a CPU
        bench_paged(opt, b, c, fp8);
      }
  // Rope-on-read (keys rotated while read from their positions; valid bytes read too).
  for (bool fp8 : {false, true}) {
    if (!opt.quick && opt.device.is_cuda()) bench_paged(opt, 16, 8192, fp8, true), bench_paged(opt, 1, 32768, fp8, true);
    else bench_paged(opt, 1, 1024, fp8, true);
  }
  std::vector<int64_t> dctx{8192, 65536, 1048576};
  if (opt.quick || opt.device.is_cpu()) dctx = {8192};
  for (bool hca : {false, true})
    for (int64_t t : dctx) bench_dsv4(opt, 1, t, hca);
  if (!opt.quick && opt.device.is_cuda())
    for (bool hca : {false, true}) bench_dsv4(opt, 16, 65536, hca);
}
