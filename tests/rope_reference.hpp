// Test-side references for RoPE, written from specs/context-shift.md independently of
// src/core/rope_spec.cpp: float64 frequencies per variant and a float64 rotation; plus
// small helpers to hold rows of any storage type on the host.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "kvcore/dtype.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope_spec.hpp"

namespace rope_ref {

constexpr double kPi = std::numbers::pi;

// w_i = theta^(-2i/n_rot)
inline std::vector<double> base_freqs(int n_rot, double theta) {
  std::vector<double> w;
  for (int i = 0; i < n_rot / 2; ++i) w.push_back(1.0 / std::pow(theta, (2.0 * i) / n_rot));
  return w;
}

struct YarnRange {
  double low, high;
};
inline YarnRange yarn_range(int n_rot, double theta, double orig, double beta_fast, double beta_slow, bool truncate) {
  auto cd = [&](double r) { return n_rot * std::log(orig / (2 * kPi * r)) / (2 * std::log(theta)); };
  double lo = cd(beta_fast), hi = cd(beta_slow);
  if (truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  return {std::max(lo, 0.0), std::min(hi, n_rot - 1.0)};
}

inline std::vector<double> yarn_freqs(int n_rot, double theta, double factor, double orig, double bf, double bs,
                                      bool trunc) {
  std::vector<double> w = base_freqs(n_rot, theta);
  YarnRange r = yarn_range(n_rot, theta, orig, bf, bs, trunc);
  if (r.low == r.high) r.high += 0.001;
  for (size_t i = 0; i < w.size(); ++i) {
    const double ramp = std::min(1.0, std::max(0.0, (double(i) - r.low) / (r.high - r.low)));
    w[i] = w[i] * (1 - ramp) + w[i] / factor * ramp;
  }
  return w;
}

// Llama 3.1: keep short wavelengths, divide long ones by factor, blend between.
inline std::vector<double> llama3_freqs(int n_rot, double theta, double factor, double lo, double hi, double orig) {
  std::vector<double> w = base_freqs(n_rot, theta);
  for (double& x : w) {
    const double wl = 2 * kPi / x;
    if (wl < orig / hi) continue;
    if (wl > orig / lo) {
      x /= factor;
      continue;
    }
    const double s = (orig / wl - lo) / (hi - lo);
    x = (1 - s) * x / factor + s * x;
  }
  return w;
}

// Every variant a RopeSpec can describe, recomputed from its fields.
inline std::vector<double> freqs(const kvcore::RopeSpec& s) {
  std::vector<double> w;
  switch (s.scaling) {
    case kvcore::RopeScaling::None: w = base_freqs(s.n_rot, s.theta); break;
    case kvcore::RopeScaling::Linear:
      w = base_freqs(s.n_rot, s.theta);
      for (double& x : w) x /= s.factor;
      break;
    case kvcore::RopeScaling::Llama3:
      w = llama3_freqs(s.n_rot, s.theta, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position);
      break;
    case kvcore::RopeScaling::Yarn:
      w = yarn_freqs(s.n_rot, s.theta, s.factor, s.original_max_position, s.beta_fast, s.beta_slow, s.yarn_truncate);
      break;
  }
  for (size_t i = 0; i < s.freq_factors.size(); ++i) w[i] /= s.freq_factors[i];
  return w;
}

// Pair (d0, d1) of pair i for a spec at head_dim.
inline int dim0(const kvcore::RopeSpec& s, int head_dim, int i) {
  const int first = s.slice == kvcore::RopeSlice::Head ? 0 : head_dim - s.n_rot;
  return first + (s.pairing == kvcore::RopePairing::Interleaved ? 2 * i : i);
}
inline int dim1(const kvcore::RopeSpec& s, int head_dim, int i) {
  const int first = s.slice == kvcore::RopeSlice::Head ? 0 : head_dim - s.n_rot;
  return first + (s.pairing == kvcore::RopePairing::Interleaved ? 2 * i + 1 : i + s.n_rot / 2);
}

// Rotate one head_dim row in float64 at `position` with frequencies w, magnitude m.
inline std::vector<double> rotate_row(const std::vector<double>& row, const kvcore::RopeSpec& s,
                                      const std::vector<double>& w, double position, double m) {
  std::vector<double> out = row;
  const int hd = static_cast<int>(row.size());
  for (int i = 0; i < s.n_rot / 2; ++i) {
    const int a = dim0(s, hd, i), b = dim1(s, hd, i);
    const double ang = position * w[i], c = std::cos(ang) * m, sn = std::sin(ang) * m;
    out[a] = row[a] * c - row[b] * sn;
    out[b] = row[a] * sn + row[b] * c;
  }
  return out;
}

// ---- storage helpers -----------------------------------------------------------
inline float load(kvcore::DType t, const void* base, int64_t i) {
  switch (t) {
    case kvcore::DType::F32: return static_cast<const float*>(base)[i];
    case kvcore::DType::F16: return kvcore::to_f32(static_cast<const kvcore::f16*>(base)[i]);
    default: return kvcore::to_f32(static_cast<const kvcore::bf16*>(base)[i]);
  }
}
inline void store(kvcore::DType t, void* base, int64_t i, float v) {
  switch (t) {
    case kvcore::DType::F32: static_cast<float*>(base)[i] = v; break;
    case kvcore::DType::F16: static_cast<kvcore::f16*>(base)[i] = kvcore::from_f32<kvcore::f16>(v); break;
    default: static_cast<kvcore::bf16*>(base)[i] = kvcore::from_f32<kvcore::bf16>(v); break;
  }
}
// Relative spacing of the storage type (one ulp at 1.0).
inline double unit_roundoff(kvcore::DType t) {
  return t == kvcore::DType::F32 ? std::ldexp(1.0, -23) : t == kvcore::DType::F16 ? std::ldexp(1.0, -10)
                                                                                   : std::ldexp(1.0, -7);
}

// A host buffer of `elems` values of dtype t filled with uniform values in [-2, 2).
inline std::vector<uint8_t> random_storage(kvcore::DType t, int64_t elems, std::mt19937_64& rng) {
  std::vector<uint8_t> buf(elems * kvcore::dtype_size(t));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int64_t i = 0; i < elems; ++i) store(t, buf.data(), i, u(rng));
  return buf;
}

}  // namespace rope_ref
