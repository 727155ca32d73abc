// The C++ side of python/bench/overhead.py: the same per-layer calls the Python bindings make
// (PagedCache::store, capi::PagedPlan::run, PagedCache::shift) on the same setup, timed in a
// loop; prints one "name ns_per_call" line each (the fastest of 15 loops, host CPU time). Sizes
// and the device (cpu | cuda) from argv. On CUDA the calls are launched, not waited for (the
// stream is drained between loops): the figure is the host time a call costs, as in Python.
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "capi/paged_plan.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/runtime.hpp"

using namespace kvcore;

namespace {
int kHeads = 8, kQHeads = 32, kDim = 128, kContext = 64;
constexpr int kIters = 2000;

// Process CPU time (run with OMP_NUM_THREADS=1): time spent descheduled on a shared machine does
// not count.
double cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

Device g_device = Device::cpu();

template <class F>
double fastest_ns(F&& f, int iters) {
  const double c0 = cpu_ns();
  for (int i = 0; i < 5; ++i) f();
  const double five = cpu_ns() - c0;
  iters = std::min(iters, std::max(5, static_cast<int>(20e6 * 5 / std::max(five, 1.0))));  // loops of ~20 ms at most
  std::vector<double> reps;
  for (int r = 0; r < 15; ++r) {
    synchronize(g_device);  // an empty launch queue at the start of each loop (CUDA)
    const double t0 = cpu_ns();
    for (int i = 0; i < iters; ++i) f();
    reps.push_back((cpu_ns() - t0) / iters);
  }
  return *std::min_element(reps.begin(), reps.end());  // the least disturbed loop
}
}  // namespace

// argv: n_kv_heads n_q_heads head_dim context format (f16 | fp8) device (cpu | cuda); defaults
// 8 32 128 64 fp8 cpu.
int main(int argc, char** argv) {
  if (argc > 4) {
    kHeads = std::atoi(argv[1]);
    kQHeads = std::atoi(argv[2]);
    kDim = std::atoi(argv[3]);
    kContext = std::atoi(argv[4]);
  }
  const bool fp8 = argc <= 5 || std::string(argv[5]) == "fp8";
  if (argc > 6 && std::string(argv[6]) == "cuda") g_device = Device::cuda(0);
  const Device dev = g_device;
  PagedCacheConfig cfg;
  cfg.n_layers = 1;
  cfg.n_kv_heads = kHeads;
  cfg.head_dim = cfg.v_head_dim = kDim;
  cfg.block_size = 16;
  cfg.num_blocks = 1024;
  cfg.k_format = cfg.v_format = fp8 ? KvFormat::Fp8 : KvFormat::F16;
  cfg.rope = {RopeSpec::plain(kDim, 500000.0)};
  cfg.rope_mode = RopeMode::RopeOnRead;
  PagedCache cache(cfg, dev);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t(kContext) * kHeads * kDim), q(size_t(kQHeads) * kDim), out(q.size());
  for (float& x : k) x = nd(rng);
  for (float& x : q) x = nd(rng);
  // Inputs and outputs on the cache's device (uploaded once).
  const Buffer kd = Buffer::from_host(k, dev), qd = Buffer::from_host(q, dev), od = Buffer::from_host(out, dev);
  const SeqId s = cache.create();
  std::vector<int32_t> pos(kContext);
  for (int i = 0; i < kContext; ++i) pos[i] = i;
  cache.append(s, pos, TensorRef(kd.data(), DType::F32, dev, {1, kContext, kHeads, kDim}),
               TensorRef(kd.data(), DType::F32, dev, {1, kContext, kHeads, kDim}));
  const int32_t next = kContext;
  capi::Ticket t;
  const SeqId one_seq[1] = {s};
  const int32_t one[1] = {1};
  t.reserve(cache, one_seq, one, std::span<const int32_t>(&next, 1));
  const TensorRef k1(kd.data(), DType::F32, dev, {1, kHeads, kDim});
  const TensorRef q1(qd.data(), DType::F32, dev, {1, kQHeads, kDim});
  const TensorRef o1(od.data(), DType::F32, dev, {1, kQHeads, kDim});
  capi::PagedPlan plan = capi::PagedPlan::of_ticket(cache, t, {});
  std::printf("store %.1f\n", fastest_ns([&] { cache.store(t.t, 0, k1, k1); }, kIters));
  std::printf("attention_run %.1f\n", fastest_ns([&] { plan.run(0, q1, o1, Stream{}); }, kIters));
  // shift: a long sequence loses one token per call (n_keep 4, n_discard 1)
  cfg.num_blocks = 2048;
  PagedCache big(cfg, dev);
  const SeqId b = big.create();
  std::vector<int32_t> many(20000);
  for (int i = 0; i < 20000; ++i) many[i] = i;
  const Buffer kk = Buffer::from_host(std::vector<float>(size_t(20000) * kHeads * kDim, 0.5f), dev);
  big.append(b, many, TensorRef(kk.data(), DType::F32, dev, {1, 20000, kHeads, kDim}),
             TensorRef(kk.data(), DType::F32, dev, {1, 20000, kHeads, kDim}));
  std::printf("shift %.1f\n", fastest_ns([&] { big.shift(b, 4, 1); }, 1000));
  return 0;
}
