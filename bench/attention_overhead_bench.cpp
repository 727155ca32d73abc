// `kvcore bench attention_overhead`: the host time kvcore adds to one layer's attention call
// beyond the backend (on the CPU the kernel itself, on CUDA its launches), at a tiny decode
// shape (batch 1, 8 q heads over 2 kv heads of 64 dims, one block of 16 f16 cells) where the
// wrapper's share is largest. Cases, each the median per call over batches of calls:
//   plan_run   AttentionPlan::decode + run every call (planning per layer: tables read on the
//              host, split choice, workspace allocation; what every call paid before plans)
//   run        plan.run only (the per-layer call of a planned step)
//   checks     the run's argument checks and Params fill alone (ops::attn::run_params)
//   backend    the backend alone with ready Params (ops::attn::launch_paged)
// run - backend is what the wrapper adds per layer (the note compares the fastest batches). On CUDA the calls are eager (no graph) and
// each batch is synchronized outside its timed span.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/half.hpp"
#include "ops/attention_plan_impl.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

constexpr int64_t kQHeads = 8, kKvHeads = 2, kDim = 64, kBlock = 16;

// Median over `rounds` batches of `per_batch` calls of the host time of one call, in us.
template <class F>
cli::Timing per_call_us(Device d, int rounds, int per_batch, F&& call) {
  std::vector<double> t;
  for (int r = 0; r < rounds + 2; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per_batch; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    synchronize(d);
    if (r >= 2) t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / per_batch);  // 2 warm-up batches
  }
  std::sort(t.begin(), t.end());
  return cli::Timing{t[t.size() / 2], t.front(), static_cast<int>(t.size())};
}

}  // namespace

KVCORE_BENCH(attention_overhead, "host time kvcore adds to a layer's attention call beyond the backend (tiny decode shape)") {
  const Device d = opt.device;
  const int rounds = std::max(opt.reps, 5), per_batch = opt.quick ? 50 : 200;
  // One sequence of 16 cells in block 0 of 2; f16 pages of small values.
  std::vector<uint16_t> pool(2 * kBlock * kKvHeads * kDim);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = math::f32_to_f16_bits(0.01f * static_cast<float>(i % 97));
  std::vector<float> hq(kQHeads * kDim, 0.5f);
  Buffer k = Buffer::from_host(pool, d), v = Buffer::from_host(pool, d), q = Buffer::from_host(hq, d),
         out(hq.size() * 4, d);
  Buffer indptr = Buffer::from_host(std::vector<int32_t>{0, 1}, d), indices = Buffer::from_host(std::vector<int32_t>{0}, d),
         lpl = Buffer::from_host(std::vector<int32_t>{kBlock}, d);
  PagedKV kv;
  kv.k = TensorRef(k.data(), DType::F16, d, {2, kBlock, kKvHeads, kDim});
  kv.v = TensorRef(v.data(), DType::F16, d, {2, kBlock, kKvHeads, kDim});
  AttentionStep step;
  step.table = BlockTable{TensorRef(indptr.data(), DType::I32, d, {2}), TensorRef(indices.data(), DType::I32, d, {1}),
                          TensorRef(lpl.data(), DType::I32, d, {1}), TensorRef()};
  const TensorRef tq(q.data(), DType::F32, d, {1, kQHeads, kDim}), to(out.data(), DType::F32, d, {1, kQHeads, kDim});
  const AttentionPlan plan = AttentionPlan::decode(kv, kQHeads, step);
  ops::PagedAttentionParams p{};
  ops::attn::run_params(plan, tq, kv, to, {}, {}, p);
  const ops::AttentionTuning tuning;

  const cli::Timing plan_run = per_call_us(d, rounds, per_batch, [&] { AttentionPlan::decode(kv, kQHeads, step).run(tq, kv, to); });
  const cli::Timing run = per_call_us(d, rounds, per_batch, [&] { plan.run(tq, kv, to); });
  const cli::Timing checks = per_call_us(d, rounds, per_batch, [&] { ops::attn::run_params(plan, tq, kv, to, {}, {}, p); });
  const cli::Timing backend = per_call_us(d, rounds, per_batch, [&] { ops::attn::launch_paged(d, p, tuning); });
  for (const auto& [name, t] : {std::pair<const char*, cli::Timing>{"plan_run", plan_run}, {"run", run}, {"checks", checks},
                                {"backend", backend}}) {
    cli::BenchRecord r;
    r.bench = "attention_overhead";
    r.case_name = std::string("decode_b1_h8x64_") + name;
    r.t = t;
    r.traffic = cli::Traffic::Read;
    opt.report(r);
  }
  // Differences of the fastest batches: a shared or busy host spreads the medians far more than
  // the microsecond this measures.
  opt.note("attention_overhead (fastest batches): the wrapper adds " + std::to_string(run.min_us - backend.min_us) +
           " us a layer (run - backend; its checks alone " + std::to_string(checks.min_us) +
           " us); planning every call would cost " + std::to_string(plan_run.min_us - run.min_us) + " us more");
}
