#include "bench/harness.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

namespace kvcore::cli {

namespace {

// `kvcore bench`: the requested benchmarks (all when none are named), in order, sharing one
// BenchOptions (its ceilings are measured once per run).
void run_benches(const BenchRequest& req) {
  BenchOptions opt;
  opt.device = req.device;
  opt.reps = req.reps;
  opt.quick = req.quick;
  opt.json_path = req.json_path;
  opt.cases = req.cases;
  opt.trace_dir = req.trace_dir;
  std::vector<std::string> names = req.names;
  if (names.empty())
    for (auto& [name, b] : bench_entries()) names.push_back(name);
  for (const auto& n : names) {
    auto it = bench_entries().find(n);
    require(it != bench_entries().end(), ErrorCode::InvalidArgument, "bench: unknown benchmark '", n, "' (kvcore info lists them)");
    opt.note("running '" + n + "' on " + opt.device.str() + " (" + device_name(opt.device) + ")");
    it->second.run(opt);
  }
}

[[maybe_unused]] const bool runner_registered = (bench_runner() = run_benches, true);

}  // namespace

std::string git_commit() { return KVCORE_GIT_COMMIT; }

bool BenchOptions::wants(const std::string& case_name) const {
  if (cases.empty()) return true;
  return std::any_of(cases.begin(), cases.end(), [&](const std::string& c) { return case_name.find(c) != std::string::npos; });
}

static Timing summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  Timing t;
  t.reps = static_cast<int>(us.size());
  t.min_us = us.front();
  t.median_us = us[us.size() / 2];
  return t;
}

Timing BenchOptions::time(const std::function<void(int)>& fn) const {
  if (device.is_cuda()) {
#if KVCORE_WITH_CUDA
    return time_cuda(device.index, reps, warmup, fn);
#else
    throw Error(ErrorCode::NotSupported, "bench: no CUDA backend in this build");
#endif
  }
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(i);
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return summarize(us);
}

Ceilings measure_cpu_ceilings() {
  const size_t n = size_t{256} << 20;  // 256 MiB, far beyond any CPU cache
  Buffer a(n, Device::cpu()), b(n, Device::cpu());
  std::memset(a.data(), 1, n);
  std::memset(b.data(), 2, n);
  BenchOptions o;
  o.reps = 5;
  o.warmup = 1;
  // Copy: every thread copies its own slice, as the CPU ops split their rows over
  // threads, once with memcpy (non-temporal stores for large sizes in glibc) and once
  // with a loop the compiler vectorizes (ordinary stores); the ceiling is the faster.
  const auto slices = [&](auto&& copy) {
#pragma omp parallel
    {
      const size_t threads = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t begin = n / threads * t / 64 * 64, end = t + 1 == threads ? n : n / threads * (t + 1) / 64 * 64;
      copy(b.as<uint8_t>() + begin, a.as<uint8_t>() + begin, end - begin);
    }
  };
  const Timing tm = o.time([&](int) { slices([](uint8_t* dst, const uint8_t* src, size_t len) { std::memcpy(dst, src, len); }); });
  const Timing tl = o.time([&](int) {
    slices([](uint8_t* dst, const uint8_t* src, size_t len) {
      auto* d = reinterpret_cast<uint64_t*>(dst);
      const auto* s = reinterpret_cast<const uint64_t*>(src);
#pragma omp simd
      for (size_t i = 0; i < len / 8; ++i) d[i] = s[i];
    });
  });
  volatile uint64_t sink = 0;
  const Timing tr = o.time([&](int) {
    const uint64_t* p = a.as<uint64_t>();
    uint64_t s = 0;
#pragma omp parallel for reduction(^ : s)
    for (size_t i = 0; i < n / 8; ++i) s ^= p[i];
    sink = sink + s;
  });
  return {2.0 * n / std::min(tm.median_us, tl.median_us) / 1e3, 1.0 * n / tr.median_us / 1e3};
}

const Ceilings& BenchOptions::ceilings() {
  if (!ceilings_) {
    note("measuring bandwidth ceilings (copy and read-only kernels) ...");
    if (device.is_cuda()) {
#if KVCORE_WITH_CUDA
      ceilings_ = measure_cuda_ceilings(device.index);
#endif
    } else {
      ceilings_ = measure_cpu_ceilings();
    }
    note("ceilings on " + device_name(device) + ": copy " + std::to_string(int(ceilings_->copy_gbps)) +
         " GB/s, read " + std::to_string(int(ceilings_->read_gbps)) + " GB/s");
    if (!json_path.empty()) {
      std::ofstream f(json_path, std::ios::app);
      nlohmann::json j{{"bench", "ceilings"}, {"device_name", device_name(device)}, {"commit", git_commit()},
                       {"copy_gbps", ceilings_->copy_gbps}, {"read_gbps", ceilings_->read_gbps}};
      f << j.dump() << "\n";
    }
  }
  return *ceilings_;
}

void BenchOptions::note(const std::string& line) const { std::cerr << "[bench] " << line << std::endl; }

void BenchOptions::report(const BenchRecord& r) {
  const Ceilings& c = ceilings();
  const double gbps = r.bytes / r.t.median_us / 1e3;
  const double ceiling = r.traffic == Traffic::Copy ? c.copy_gbps : c.read_gbps;
  const double share = gbps / ceiling;
  const double ratio = r.baseline_t ? r.baseline_t->median_us / r.t.median_us : 0.0;
  if (!header_printed_) {
    std::printf("%-10s %-44s %12s %12s %10s %9s %7s  %-14s %12s %8s\n", "bench", "case", "median_us", "min_us",
                "MB", "GB/s", "share", "baseline", "base_us", "ratio");
    header_printed_ = true;
  }
  std::printf("%-10s %-44s %12.2f %12.2f %10.2f %9.1f %6.1f%%  %-14s %12.2f %8.2f\n", r.bench.c_str(),
              r.case_name.c_str(), r.t.median_us, r.t.min_us, r.bytes / 1e6, gbps, 100.0 * share,
              r.baseline.empty() ? "-" : r.baseline.c_str(), r.baseline_t ? r.baseline_t->median_us : 0.0, ratio);
  std::fflush(stdout);
  if (!json_path.empty()) {
    nlohmann::json j{{"bench", r.bench},
                     {"case", r.case_name},
                     {"backend", device.is_cuda() ? "cuda" : "cpu"},
                     {"device_name", device_name(device)},
                     {"commit", git_commit()},
                     {"median_us", r.t.median_us},
                     {"min_us", r.t.min_us},
                     {"reps", r.t.reps},
                     {"bytes", r.bytes},
                     {"gbps", gbps},
                     {"ceiling", r.traffic == Traffic::Copy ? "copy" : "read"},
                     {"ceiling_gbps", ceiling},
                     {"share_of_ceiling", share},
                     {"baseline", r.baseline.empty() ? nlohmann::json() : nlohmann::json(r.baseline)},
                     {"baseline_median_us", r.baseline_t ? nlohmann::json(r.baseline_t->median_us) : nlohmann::json()},
                     {"ratio", r.baseline_t ? nlohmann::json(ratio) : nlohmann::json()}};
    std::ofstream f(json_path, std::ios::app);
    f << j.dump() << "\n";
  }
}

}  // namespace kvcore::cli
