// Helpers shared by the DeepSeek-V4 tests (CPU and CUDA): random data, views,
// and float64 references of the compressor math.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kvcore/math/dsv4.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

template <class T>
TensorRef host_view(std::vector<T>& v, DType dt, std::initializer_list<int64_t> shape) {
  return TensorRef(v.data(), dt, Device::cpu(), shape);
}
inline TensorRef view(std::vector<float>& v, std::initializer_list<int64_t> shape) { return host_view(v, DType::F32, shape); }

// The compressed-row RoPE table of a geometry (tail n_rot dims, YaRN as DeepSeek-V4).
inline math::RopeTable compressed_table(int head_dim, int n_rot) {
  RopeSpec s = RopeSpec::deepseek_v4_compressed();
  s.n_rot = n_rot;
  return make_rope_table(s, head_dim);
}

// Nearest value of a sorted non-negative grid to |x| (ties to the even index), with sign.
inline double grid_round(double x, const std::vector<double>& grid) {
  const double a = std::fabs(x);
  size_t best = 0;
  for (size_t i = 1; i < grid.size(); ++i) {
    const double di = std::fabs(a - grid[i]), db = std::fabs(a - grid[best]);
    if (di < db || (di == db && (i % 2 == 0))) best = i;
  }
  return x < 0 ? -grid[best] : grid[best];
}

inline std::vector<double> e4m3_grid() {
  std::vector<double> g;
  for (int c = 0; c < 127; ++c) {
    const int e = c >> 3, m = c & 7;
    g.push_back(e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7));
  }
  return g;
}

inline std::vector<double> e2m1_grid() { return {0, 0.5, 1, 1.5, 2, 3, 4, 6}; }

// Block quantization reference: scale 2^ceil(log2(max(amax, 1e-4) / maxv)), value
// clamp(v / scale, +-maxv) rounded to the grid, times the scale.
inline void block_round_trip_ref(std::vector<double>& v, size_t off, size_t n, double maxv, const std::vector<double>& grid) {
  double amax = 0;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[off + i]));
  amax = std::max(amax, static_cast<double>(1.0e-4f));
  const double scale = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(amax / maxv))));
  for (size_t i = 0; i < n; ++i) {
    const double s = std::clamp(v[off + i] / scale, -maxv, maxv);
    v[off + i] = grid_round(s, grid) * scale;
  }
}

// Float64 reference of one emitted row from explicit candidates:
// z[j * hd + k], c[j * hd + k] for j < n_cand (-inf: none).
inline std::vector<double> emit_ref(const std::vector<double>& z, const std::vector<double>& c, int n_cand, int hd,
                                    const std::vector<float>& norm, const math::RopeTable& rope, int64_t position,
                                    double eps) {
  std::vector<double> y(hd);
  for (int k = 0; k < hd; ++k) {
    double mx = -INFINITY;
    for (int j = 0; j < n_cand; ++j) mx = std::max(mx, z[j * hd + k]);
    double den = 0, num = 0;
    for (int j = 0; j < n_cand; ++j)
      if (z[j * hd + k] != -INFINITY) den += std::exp(z[j * hd + k] - mx);
    for (int j = 0; j < n_cand; ++j)
      if (z[j * hd + k] != -INFINITY) num += c[j * hd + k] * std::exp(z[j * hd + k] - mx) / den;
    y[k] = num;
  }
  double ss = 0;
  for (double v : y) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / hd + eps);
  for (int k = 0; k < hd; ++k) y[k] = y[k] * r * norm[k];
  for (int i = 0; i < rope.layout.n_pairs(); ++i) {
    // The angle as kvcore defines it: f32 position times the f32 frequency, rounded to f32.
    const double a = static_cast<float>(static_cast<float>(position) * rope.freq[i]);
    const int d0 = rope.layout.dim0(i), d1 = rope.layout.dim1(i);
    const double x0 = y[d0], x1 = y[d1];
    y[d0] = x0 * std::cos(a) - x1 * std::sin(a);
    y[d1] = x0 * std::sin(a) + x1 * std::cos(a);
  }
  return y;
}

}  // namespace kvcore::testing
