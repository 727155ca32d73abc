// `kvcore bench attention_prefill`: causal prefill over pages at Llama-3-8B geometry
// (32 q heads, 8 kv heads, head_dim 128, blocks of 16, f16 pages, f16 q and out): each
// sequence's chunk of `new` query tokens against its cached prefix plus the chunk itself
// (the chunk's keys already stored, as an engine appends them before attention).
// Prefill is bound by math, not bytes: the note gives TFLOP/s, counting 4 * head_dim flops
// per (query head, visible key) pair (QK^T and PV, as FlashAttention counts them); bytes =
// K/V read once. Case names match bench/attention_sdpa_baseline.py (SDPA, causal from the
// bottom right, on dense K/V). On compute capability 9.0 each case also runs the Hopper wgmma
// kernels (kernel variants 5, 6) as "<case>_wgmma" and "<case>_wgmma_sync", their notes giving
// the speed-up over the automatic kernel.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/attention.hpp"
#include "ops/attention_plan_impl.hpp"
#include "ops/attention_tuning.hpp"
#if KVCORE_WITH_CUDA
#include "cuda/attention/prefill_wgmma.hpp"
#endif
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

constexpr int64_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;

std::vector<uint16_t> random_f16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = math::f32_to_f16_bits(u(rng));
  return v;
}

// Visible (query, key) pairs of one sequence: query i of the chunk sees ctx - new + 1 + i keys.
double visible_pairs(int64_t ctx, int64_t n_new) {
  return double(n_new) * double(ctx - n_new + 1) + double(n_new) * double(n_new - 1) / 2.0;
}

// The case-name suffix of each kernel the bench forces: "_wgmma" warp-specialized, "_wgmma_sync"
// synchronous, "_wgmma_tma" warp-specialized with TMA copies, "_wgmma_tma_pp" that with the
// consumers in ping-pong, "_wgmma_wide" and "_wgmma_wide_pp" those with tiles of 128 keys.
struct ForcedKernel {
  ops::AttentionKernel kernel;
  const char* suffix;
};
constexpr ForcedKernel kForced[] = {
    {ops::AttentionKernel::WgmmaPrefillSync, "_wgmma_sync"},  // the simplest first: a fault in a later one leaves the earlier rows
    {ops::AttentionKernel::WgmmaPrefill, "_wgmma"},
    {ops::AttentionKernel::WgmmaPrefillTma, "_wgmma_tma"},
    {ops::AttentionKernel::WgmmaPrefillTmaPingPong, "_wgmma_tma_pp"},
    {ops::AttentionKernel::WgmmaPrefillWide, "_wgmma_wide"},
    {ops::AttentionKernel::WgmmaPrefillWidePingPong, "_wgmma_wide_pp"},
};

void bench_prefill(cli::BenchOptions& opt, int64_t batch, int64_t ctx, int64_t n_new) {
  const std::string name = "llama8b_prefill_f16_b" + std::to_string(batch) + "_ctx" + std::to_string(ctx) + "_new" +
                           std::to_string(n_new);
  // --case names a shape, or a shape and a kernel (its suffix)
  if (!opt.wants(name) && std::none_of(std::begin(kForced), std::end(kForced), [&](const ForcedKernel& f) {
        return opt.wants(name + f.suffix);
      }))
    return;
  const Device d = opt.device;
  const int64_t nb = (ctx + kBlock - 1) / kBlock, n_blocks = batch * nb, rows = batch * n_new;
  const size_t row_elems = size_t(n_blocks) * kBlock * kKvHeads * kHeadDim;
  const std::vector<uint16_t> hk = random_f16(row_elems, 1), hv = random_f16(row_elems, 2);
  const std::vector<uint16_t> hq = random_f16(size_t(rows) * kQHeads * kHeadDim, 3);
  // A fragmented pool: sequence b's blocks are a shuffled slice; positions = index in the sequence.
  std::vector<int32_t> perm(n_blocks), pos(n_blocks * kBlock), ip(batch + 1), lp(batch), qo(batch + 1), qp(rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  for (int64_t b = 0; b < batch; ++b) {
    ip[b + 1] = static_cast<int32_t>((b + 1) * nb);
    lp[b] = static_cast<int32_t>(ctx - (nb - 1) * kBlock);
    qo[b + 1] = static_cast<int32_t>((b + 1) * n_new);
    for (int64_t i = 0; i < nb; ++i)
      for (int64_t t = 0; t < kBlock; ++t) pos[perm[b * nb + i] * kBlock + t] = static_cast<int32_t>(i * kBlock + t);
    for (int64_t i = 0; i < n_new; ++i) qp[b * n_new + i] = static_cast<int32_t>(ctx - n_new + i);
  }
  ip[0] = qo[0] = 0;
  Buffer bk = Buffer::from_host(hk, d), bv = Buffer::from_host(hv, d), bq = Buffer::from_host(hq, d);
  Buffer bpos = Buffer::from_host(pos, d), bperm = Buffer::from_host(perm, d), bip = Buffer::from_host(ip, d),
         blp = Buffer::from_host(lp, d), bqo = Buffer::from_host(qo, d), bqp = Buffer::from_host(qp, d);
  Buffer bout(size_t(rows) * kQHeads * kHeadDim * 2, d);
  PagedKV kv;
  kv.k = TensorRef(bk.data(), DType::F16, d, {n_blocks, kBlock, kKvHeads, kHeadDim});
  kv.v = TensorRef(bv.data(), DType::F16, d, {n_blocks, kBlock, kKvHeads, kHeadDim});
  kv.positions = TensorRef(bpos.data(), DType::I32, d, {n_blocks, kBlock});
  AttentionStep step;
  step.table = BlockTable{TensorRef(bip.data(), DType::I32, d, {batch + 1}), TensorRef(bperm.data(), DType::I32, d, {n_blocks}),
                          TensorRef(blp.data(), DType::I32, d, {batch}), TensorRef()};
  step.qo_indptr = TensorRef(bqo.data(), DType::I32, d, {batch + 1});
  step.q_positions = TensorRef(bqp.data(), DType::I32, d, {rows});
  const TensorRef q(bq.data(), DType::F16, d, {rows, kQHeads, kHeadDim});
  const TensorRef out(bout.data(), DType::F16, d, {rows, kQHeads, kHeadDim});
  AttentionSchedule sc;
  sc.check_tables = false;
  sc.max_seq_cells = ctx;
  // The automatic kernel (prefill_wgmma.hpp's kAutomaticVariant, or the mma.sync prefill kernel)
  // and, on compute capability 9.0, each wgmma kernel forced (kForced), with their ratios to it.
  std::vector<ForcedKernel> kernels{{ops::AttentionKernel::Auto, ""}};
#if KVCORE_WITH_CUDA
  if (d.is_cuda() && ops::cuda::prefill_wgmma::device_is_sm90(d.index))
    kernels.insert(kernels.end(), std::begin(kForced), std::end(kForced));
#endif
  double auto_us = 0;
  for (const ForcedKernel& fk : kernels) {
    const ops::AttentionKernel kernel = fk.kernel;
    ops::AttentionTuning tu;
    tu.kernel = kernel;
    const bool wgmma = kernel != ops::AttentionKernel::Auto;
    const std::string cname = name + fk.suffix;
    if (!opt.wants(cname)) continue;  // --case _wgmma_sync: that kernel alone
    const AttentionPlan plan = ops::attn::plan_paged(true, kv, kQHeads, step, sc, tu);  // owns its workspace
    const int32_t splits = plan.num_splits();
    const std::vector<uint16_t> nan_out(size_t(rows) * kQHeads * kHeadDim, 0x7e00);  // f16 NaN: a row left unwritten fails the check
    bout.copy_from_host(nan_out.data(), nan_out.size() * 2);
    plan.run(q, kv, out);
    synchronize(d);

    // Check the chunk's last 32 rows of sequence 0 (they see the most keys) against the CPU op.
    {
      const int64_t n_chk = std::min<int64_t>(32, n_new), r0 = n_new - n_chk;
      const std::vector<uint16_t> got = bout.to_host<uint16_t>();
      PagedKV hkv;
      hkv.k = TensorRef(const_cast<uint16_t*>(hk.data()), DType::F16, Device::cpu(), {n_blocks, kBlock, kKvHeads, kHeadDim});
      hkv.v = TensorRef(const_cast<uint16_t*>(hv.data()), DType::F16, Device::cpu(), {n_blocks, kBlock, kKvHeads, kHeadDim});
      hkv.positions = TensorRef(pos.data(), DType::I32, Device::cpu(), {n_blocks, kBlock});
      std::vector<int32_t> hip{0, static_cast<int32_t>(nb)}, hlp{lp[0]}, hqo{0, static_cast<int32_t>(n_chk)};
      AttentionStep hs;
      hs.table = BlockTable{TensorRef(hip.data(), DType::I32, Device::cpu(), {2}), TensorRef(perm.data(), DType::I32, Device::cpu(), {nb}),
                            TensorRef(hlp.data(), DType::I32, Device::cpu(), {1}), TensorRef()};
      hs.q_positions = TensorRef(qp.data() + r0, DType::I32, Device::cpu(), {n_chk});
      hs.qo_indptr = TensorRef(hqo.data(), DType::I32, Device::cpu(), {2});
      std::vector<float> want(size_t(n_chk) * kQHeads * kHeadDim);
      AttentionPlan::prefill(hkv, kQHeads, hs)
          .run(TensorRef(const_cast<uint16_t*>(hq.data()) + r0 * kQHeads * kHeadDim, DType::F16, Device::cpu(),
                         {n_chk, kQHeads, kHeadDim}),
               hkv, TensorRef(want.data(), DType::F32, Device::cpu(), {n_chk, kQHeads, kHeadDim}));
      double err = 0, mx = 1e-6;
      for (size_t i = 0; i < want.size(); ++i) {
        const double g = math::f16_bits_to_f32(got[size_t(r0) * kQHeads * kHeadDim + i]);
        const double e = std::abs(g - want[i]);
        if (!(e <= err)) err = e;  // NaN (an unwritten row) sticks
        mx = std::max(mx, double(std::abs(want[i])));
      }
      if (!(err <= 2e-3 * std::max(1.0, mx))) {  // one f16 rounding of the output
        opt.note(cname + ": result check FAILED (max error " + std::to_string(err) + "), not timed");
        continue;
      }
    }
    const cli::Timing tm = opt.time([&](int) { plan.run(q, kv, out); });
    cli::BenchRecord r;
    r.bench = "attention_prefill";
    r.case_name = cname;
    r.bytes = 2.0 * batch * ctx * kKvHeads * kHeadDim * 2;
    r.t = tm;
    r.traffic = cli::Traffic::Read;
    opt.report(r);
    const double flops = 4.0 * kHeadDim * kQHeads * batch * visible_pairs(ctx, n_new);
    std::string note = cname + ": " + std::to_string(flops / tm.median_us / 1e6) + " TFLOP/s (" +
                       std::to_string(flops / 1e9) + " GFLOP a call), splits " + std::to_string(splits);
    if (!wgmma) auto_us = tm.median_us;
    else if (auto_us > 0) note += ", " + std::to_string(auto_us / tm.median_us) + "x the automatic kernel";
    opt.note(note);
  }
}

}  // namespace

KVCORE_BENCH(attention_prefill, "causal paged prefill attention (Llama-3-8B, f16 pages): chunks against their prefix") {
  struct Shape {
    int64_t batch, ctx, n_new;
  };
  std::vector<Shape> shapes{{1, 8192, 512}, {1, 8192, 2048}, {1, 32768, 2048}, {4, 4096, 1024}};
  if (opt.quick || opt.device.is_cpu()) shapes = {{1, 1024, 128}};
  for (const Shape& s : shapes) bench_prefill(opt, s.batch, s.ctx, s.n_new);
}
