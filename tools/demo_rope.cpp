// Demo section "rope": Llama-3-8B keys rotated by rope_apply on the chosen device, checked
// against a float64 rotation, and a rotate-by-delta that lands where a direct rotation does
// (what a context shift relies on). DeepSeek-V4's interleaved tail rotary gets the same check.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/rope.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

using namespace kvcore;

namespace {

// Rotate f16 rows [tokens, heads, head_dim] at `pos` on `dev`; returns the rotated rows.
std::vector<f16> rotate_on(Device dev, const std::vector<f16>& x, const std::vector<int32_t>& pos, int64_t heads,
                           int64_t head_dim, const RopeSpec& spec) {
  const int64_t tokens = static_cast<int64_t>(pos.size());
  Buffer bx = Buffer::from_host(x, dev), bp = Buffer::from_host(pos, dev);
  rope_apply(TensorRef(bx.data(), DType::F16, dev, {tokens, heads, head_dim}),
             TensorRef(bp.data(), DType::I32, dev, {tokens}), spec, RopeAttentionFactor::Skip);
  synchronize(dev);
  return bx.to_host<f16>();
}

struct Errors {
  double max_abs = 0, max_ratio = 0;
};

// Against float64: |err| <= r * (|angle| * 2^-22 + 2^-21 + 2^-10) per pair (f32 angle, f16 storage).
Errors vs_float64(const std::vector<f16>& x, const std::vector<f16>& y, const std::vector<int32_t>& pos, int64_t heads,
                  int64_t head_dim, const RopeSpec& spec) {
  const std::vector<double> w = rope_frequencies_f64(spec);
  const math::RopeLayout l = spec.layout(static_cast<int>(head_dim));
  Errors e;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (int64_t(t) * heads + h) * head_dim;
      for (int i = 0; i < l.n_pairs(); ++i) {
        const int64_t a = base + l.dim0(i), b = base + l.dim1(i);
        const double x0 = to_f32(x[a]), x1 = to_f32(x[b]), ang = pos[t] * w[i];
        const double y0 = x0 * std::cos(ang) - x1 * std::sin(ang), y1 = x0 * std::sin(ang) + x1 * std::cos(ang);
        const double tol = (std::abs(x0) + std::abs(x1)) * (std::abs(ang) * std::ldexp(1.0, -22) + std::ldexp(1.0, -21) +
                                                            std::ldexp(1.0, -10)) + 1e-30;
        for (double err : {std::abs(to_f32(y[a]) - y0), std::abs(to_f32(y[b]) - y1)}) {
          e.max_abs = std::max(e.max_abs, err);
          e.max_ratio = std::max(e.max_ratio, err / tol);
        }
      }
    }
  return e;
}

int run_geometry(const char* label, const cli::DemoOptions& opt, const RopeSpec& spec, int64_t tokens, int64_t heads,
                 int64_t head_dim) {
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<f16> x(tokens * heads * head_dim);
  for (auto& v : x) v = from_f32<f16>(u(rng));
  std::vector<int32_t> pos(tokens), delta(tokens, -1000), moved(tokens);
  for (auto& p : pos) p = 1000 + static_cast<int32_t>(rng() % 130000);
  for (int64_t t = 0; t < tokens; ++t) moved[t] = pos[t] + delta[t];

  std::printf("%s: %s\n  %lld tokens x %lld heads x %lld dims, f16, on %s\n", label, spec.describe().c_str(),
              (long long)tokens, (long long)heads, (long long)head_dim, opt.device.str().c_str());
  const std::vector<f16> y = rotate_on(opt.device, x, pos, heads, head_dim, spec);
  const Errors e = vs_float64(x, y, pos, heads, head_dim, spec);
  const bool ok1 = e.max_ratio <= 1.0;
  std::printf("  rotate at positions up to 131000 vs float64: max |err| %.3g, max err/tolerance %.3f  [%s]\n",
              e.max_abs, e.max_ratio, ok1 ? "ok" : "FAILED");

  bool ok_cpu = true;
  if (!opt.device.is_cpu()) {  // the two backends run the same math: expect identical bits
    const std::vector<f16> c = rotate_on(Device::cpu(), x, pos, heads, head_dim, spec);
    int64_t differ = 0;
    for (size_t i = 0; i < c.size(); ++i) differ += c[i].bits != y[i].bits;
    ok_cpu = differ * 1000 <= int64_t(c.size());
    std::printf("  %s vs cpu: %lld of %zu values differ (expected 0)  [%s]\n", opt.device.str().c_str(),
                (long long)differ, c.size(), ok_cpu ? "ok" : "FAILED");
  }

  // rotate the stored keys by delta = -1000 (a context shift) vs rotating the originals at p - 1000
  const std::vector<f16> shifted = rotate_on(opt.device, y, delta, heads, head_dim, spec);
  const std::vector<f16> direct = rotate_on(opt.device, x, moved, heads, head_dim, spec);
  double max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) max_abs = std::max(max_abs, double(std::abs(to_f32(shifted[i]) - to_f32(direct[i]))));
  const Errors e2 = vs_float64(x, shifted, moved, heads, head_dim, spec);
  // two f16 roundings and the angles of p and delta: twice the single-rotation tolerance
  const bool ok2 = e2.max_ratio <= 2.0;
  std::printf("  R(p) then R(-1000) vs R(p - 1000): max |diff| %.3g; vs float64 max err/tolerance %.3f (bound 2)  [%s]\n",
              max_abs, e2.max_ratio, ok2 ? "ok" : "FAILED");
  return ok1 && ok2 && ok_cpu ? 0 : 1;
}

}  // namespace

KVCORE_DEMO_SECTION(20, "rope", "RoPE: Llama-3-8B and DeepSeek-V4 keys rotated, checked in float64, shifted by a delta") {
  const int64_t tokens = opt.quick ? 64 : 4096;
  int failed = run_geometry("Llama-3-8B K (8 kv heads x 128, NeoX, Llama-3 scaling)", opt, RopeSpec::llama3_8b(), tokens, 8,
                            128);
  failed += run_geometry("DeepSeek-V4 compressed row (1 x 512, rope on the last 64, interleaved, YaRN)", opt,
                         RopeSpec::deepseek_v4_compressed(), tokens, 1, 512);
  return failed;
}
