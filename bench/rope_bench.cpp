// `kvcore bench rope`: rope_apply in place on f16 keys, GB/s against the copy ceiling
// (in place it reads and writes the rotated bytes once: Traffic::Copy), and on CUDA the
// seed's per-thread RoPE (bench/baselines/seed_rope.cu) on the same data in the same run.
// Positions are t mod 65536 (many sequences of realistic length): every angle stays below
// CUDA's slow-path threshold for sinf/cosf, so the baseline is not penalized.
// Results are checked before timing on a small slice: kvcore CUDA vs kvcore CPU (expected
// bit-identical), and the baseline vs kvcore CPU within r * (|angle| * 1e-6 + 2^-9).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/rope.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"
#if KVCORE_WITH_CUDA
#include "bench/baselines/seed_rope.hpp"
#endif

using namespace kvcore;

namespace {

std::vector<int32_t> bench_positions(int64_t tokens) {
  std::vector<int32_t> p(tokens);
  for (int64_t t = 0; t < tokens; ++t) p[t] = static_cast<int32_t>(t % 65536);
  return p;
}

std::vector<f16> random_f16(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<f16> v(n);
  for (auto& x : v) x = from_f32<f16>(u(rng));
  return v;
}

// kvcore on opt.device (and the seed port on CUDA) vs kvcore CPU on a small slice. Throws on a mismatch.
void check_slice(const cli::BenchOptions& opt, const RopeSpec& spec, int heads, int head_dim, bool with_baseline) {
  const int64_t tokens = 3001;
  std::vector<f16> x = random_f16(tokens * heads * head_dim, 17);
  std::vector<int32_t> pos(tokens);
  std::mt19937 rng(5);
  for (auto& p : pos) p = static_cast<int32_t>(rng() % 65536);
  std::vector<f16> want = x;
  rope_apply(TensorRef(want.data(), DType::F16, Device::cpu(), {tokens, heads, head_dim}),
             TensorRef(pos.data(), DType::I32, Device::cpu(), {tokens}), spec, RopeAttentionFactor::Skip);
  Buffer gx = Buffer::from_host(x, opt.device), gp = Buffer::from_host(pos, opt.device);
  rope_apply(TensorRef(gx.data(), DType::F16, opt.device, {tokens, heads, head_dim}),
             TensorRef(gp.data(), DType::I32, opt.device, {tokens}), spec, RopeAttentionFactor::Skip);
  synchronize(opt.device);
  const std::vector<f16> got = gx.to_host<f16>();
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i].bits != want[i].bits;
  opt.note("check: kvcore " + opt.device.str() + " vs cpu: " + std::to_string(differ) + " of " +
           std::to_string(got.size()) + " f16 values differ");
  require(differ * 1000 <= int64_t(got.size()), ErrorCode::Corrupt, "bench rope: kvcore on ", opt.device.str(),
          " disagrees with the CPU in ", differ, " values");
#if KVCORE_WITH_CUDA
  if (with_baseline) {
    Buffer bx = Buffer::from_host(x, opt.device);
    bench::seed_rope_f16_inplace(bx.data(), gp.as<int32_t>(), tokens, heads, head_dim, static_cast<float>(spec.theta),
                                 nullptr);
    synchronize(opt.device);
    const std::vector<f16> b = bx.to_host<f16>();
    // Both sides round the angle in f32 and the seed's powf frequency is a few ulps off, so the
    // bound grows with the angle: |diff| <= r * (|p * w| * 1e-6 + 2^-9), r = |x0| + |x1|.
    const std::vector<float> w = rope_frequencies(spec);
    double worst = 0;
    for (int64_t r = 0; r < tokens * heads; ++r)
      for (int i = 0; i < head_dim / 2; ++i) {
        const int64_t a0 = r * head_dim + i, a1 = a0 + head_dim / 2;
        const double angle = std::abs(double(pos[r / heads]) * w[i]);
        const double tol = (std::abs(to_f32(x[a0])) + std::abs(to_f32(x[a1]))) * (angle * 1e-6 + std::ldexp(1.0, -9)) + 1e-6;
        for (int64_t a : {a0, a1}) worst = std::max(worst, std::abs(to_f32(b[a]) - to_f32(want[a])) / tol);
      }
    opt.note("check: seed baseline vs kvcore cpu: worst |diff| / tolerance = " + std::to_string(worst));
    require(worst <= 1.0, ErrorCode::Corrupt, "bench rope: the seed baseline disagrees: err/tol ", worst);
  }
#else
  (void)with_baseline;
#endif
}

}  // namespace

KVCORE_BENCH(rope, "rope_apply in place, f16 [tokens, 8, 128] (Llama-3 K) and DSV4 tail [tokens, 1, 512]; baseline: seed's per-thread RoPE") {
  const bool gpu = opt.device.is_cuda();
  const int64_t elems = opt.quick ? (int64_t{1} << 22) : gpu ? (int64_t{1} << 31) : (int64_t{1} << 25);  // 4 GiB of f16 on a GPU
  Buffer buf(elems * 2, opt.device);
#if KVCORE_WITH_CUDA
  if (gpu) bench::fill_random_f16(buf.data(), elems, 1234, nullptr);
#endif
  if (!gpu) {
    const std::vector<f16> h = random_f16(elems, 1234);
    buf.copy_from_host(h.data(), elems * 2);
  }

  struct Case {
    std::string name;
    RopeSpec spec;
    int heads, head_dim;
    bool baseline;
  };
  const Case cases[] = {
      {"f16 neox theta 5e5 [T,8,128]", RopeSpec::plain(128, 500000.0), 8, 128, true},
      {"f16 llama3 [T,8,128]", RopeSpec::llama3_8b(), 8, 128, false},
      {"f16 dsv4 tail64 yarn [T,1,512]", RopeSpec::deepseek_v4_compressed(), 1, 512, false},
  };
  for (const Case& c : cases) {
    const int64_t tokens = elems / (int64_t(c.heads) * c.head_dim);
    const std::string name = c.name + " T=" + std::to_string(tokens);
    if (!opt.wants(name)) continue;
    check_slice(opt, c.spec, c.heads, c.head_dim, c.baseline && gpu);
    const std::vector<int32_t> hp = bench_positions(tokens);
    Buffer pos = Buffer::from_host(hp, opt.device);
    const TensorRef x(buf.data(), DType::F16, opt.device, {tokens, c.heads, c.head_dim});
    const TensorRef p(pos.data(), DType::I32, opt.device, {tokens});
    opt.note("timing " + name + " ...");
    cli::BenchRecord r;
    r.bench = "rope";
    r.case_name = name;
    r.bytes = 2.0 * 2.0 * double(tokens) * c.heads * c.spec.n_rot;  // rotated f16 values read once, written once
    r.traffic = cli::Traffic::Copy;
    // rotations keep norms, so timing repeatedly on the same (4 GiB >> L2) buffer stays on real data
    r.t = opt.time([&](int) { rope_apply(x, p, c.spec, RopeAttentionFactor::Skip); });
#if KVCORE_WITH_CUDA
    if (c.baseline && gpu) {
      r.baseline = "seed_rope";
      r.baseline_t = opt.time([&](int) {
        bench::seed_rope_f16_inplace(buf.data(), pos.as<int32_t>(), static_cast<uint32_t>(tokens), c.heads,
                                     c.head_dim, static_cast<float>(c.spec.theta), nullptr);
      });
    }
#endif
    opt.report(r);
  }
}
