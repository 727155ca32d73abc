// `kvcore bench ceilings`: the two bandwidth ceilings every other result is compared with.
// On the CPU it also times plain streaming loops the compiler vectorizes (every thread
// copying / summing its own slice), a check that the ceilings' kernels (per-thread
// slices by memcpy or a copy loop, the faster; an OpenMP xor over u64) are not themselves the bound.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <vector>

#include <omp.h>

#include "bench/harness.hpp"
#include "kvcore/buffer.hpp"
#include "tools/registry.hpp"

namespace {

double best_gbps(double bytes, int reps, const std::function<void()>& fn) {
  double best = 0;
  fn();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
  }
  return best;
}

}  // namespace

KVCORE_BENCH(ceilings, "copy (read+write) and read-only bandwidth of this device") {
  const auto& c = opt.ceilings();
  std::printf("ceilings: copy %.1f GB/s (read+write), read-only %.1f GB/s\n", c.copy_gbps, c.read_gbps);
  if (!opt.device.is_cpu()) return;
  const size_t n = size_t{64} << 20;  // floats: 256 MiB per buffer, allocated as the pools are (same pages)
  kvcore::Buffer ab(4 * n, kvcore::Device::cpu()), bb(4 * n, kvcore::Device::cpu());
  float* a = ab.as<float>();
  float* b = bb.as<float>();
  std::fill(a, a + n, 1.0f);
  std::fill(b, b + n, 2.0f);
  volatile float sink = 0;
  const double copy = best_gbps(8.0 * n, 5, [&] {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = a[i];
  });
  // 64 partial sums per thread: independent adds, so the loop streams instead of
  // waiting on one accumulator's add latency.
  const double read = best_gbps(4.0 * n, 5, [&] {
    float acc[64] = {};
#pragma omp parallel for schedule(static) reduction(+ : acc[:64])
    for (size_t i = 0; i < n; i += 64) {
#pragma omp simd
      for (int j = 0; j < 64; ++j) acc[j] += a[i + j];
    }
    float s = 0;
    for (float x : acc) s += x;
    sink = sink + s;
  });
  std::printf("streaming loops (%d threads, best of 5): copy %.1f GB/s (read+write), read-only %.1f GB/s\n",
              omp_get_max_threads(), copy, read);
}
