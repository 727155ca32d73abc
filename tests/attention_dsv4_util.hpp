// Random inputs and a float64 reference for DeepSeek-V4 sparse decode attention.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvcore/kvcore.hpp"
#include "kvcore/math/attention_rows.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/ops/attention_dsv4.hpp"

namespace dsv4_test {

using namespace kvcore;
constexpr int kD = 512, kRow = math::Dsv4RowLayout::kBytes;

struct Case {
  int rows = 2, heads = 64, n_window = 128, k = 64, n_comp = 100;
  bool f16_window = false, sinks = true;
  int comp_pad = 0;                 // bytes after each packed row on the device (rows not 8-byte aligned: the kernels' byte path)
  uint64_t seed = 1;
  // data
  std::vector<float> q;             // [rows, heads, 512]
  std::vector<float> win32;         // [rows, n_window, 512]
  std::vector<uint16_t> win16;
  std::vector<int32_t> wlen, qpos, idx;
  std::vector<uint8_t> comp;        // [n_comp, 584]
  std::vector<float> sink;
  RopeSpec rope = RopeSpec::deepseek_v4_compressed();
  float scale = 1.0f / std::sqrt(512.0f);

  double win_value(int r, int j, int d) const {
    const size_t i = (static_cast<size_t>(r) * n_window + j) * kD + d;
    return f16_window ? math::f16_bits_to_f32(win16[i]) : win32[i];
  }
};

inline void fill(Case& c) {
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  c.q.resize(static_cast<size_t>(c.rows) * c.heads * kD);
  for (float& x : c.q) x = 2.0f * u(rng);
  c.win32.resize(static_cast<size_t>(c.rows) * c.n_window * kD);
  c.win16.resize(c.win32.size());
  for (size_t i = 0; i < c.win32.size(); ++i) {
    c.win16[i] = math::f32_to_f16_bits(u(rng));
    c.win32[i] = math::f16_bits_to_f32(c.win16[i]) * 1.5f;
  }
  c.comp.assign(static_cast<size_t>(c.n_comp) * kRow, 0);
  std::uniform_int_distribution<int> code(0, 0x57);
  for (int r = 0; r < c.n_comp; ++r) {
    uint8_t* row = &c.comp[static_cast<size_t>(r) * kRow];
    for (int d = 0; d < 448; ++d) row[d] = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
    for (int d = 0; d < 64; ++d) {
      const uint16_t b = math::f32_to_bf16_bits(u(rng));
      row[448 + 2 * d] = static_cast<uint8_t>(b & 0xff);
      row[448 + 2 * d + 1] = static_cast<uint8_t>(b >> 8);
    }
    for (int s = 0; s < 7; ++s) row[576 + s] = static_cast<uint8_t>(120 + rng() % 4);
  }
  std::uniform_int_distribution<int> pick(-1, c.n_comp - 1);
  c.idx.resize(static_cast<size_t>(c.rows) * c.k);
  for (auto& i : c.idx) i = pick(rng);
  c.wlen.resize(c.rows);
  c.qpos.resize(c.rows);
  for (int r = 0; r < c.rows; ++r) {
    c.wlen[r] = static_cast<int32_t>(r == 0 ? c.n_window : rng() % (c.n_window + 1));
    c.qpos[r] = static_cast<int32_t>(rng() % 5000);
  }
  c.sink.resize(c.heads);
  for (auto& s : c.sink) s = 3.0f * u(rng);
}

inline std::vector<double> reference(const Case& c) {
  const math::RopeTable t = make_rope_table(c.rope, kD);
  std::vector<double> out(static_cast<size_t>(c.rows) * c.heads * kD, 0.0);
  for (int r = 0; r < c.rows; ++r) {
    std::vector<std::vector<double>> keys;
    for (int j = 0; j < c.wlen[r]; ++j) {
      std::vector<double> k(kD);
      for (int d = 0; d < kD; ++d) k[d] = c.win_value(r, j, d);
      keys.push_back(k);
    }
    for (int i = 0; i < c.k; ++i) {
      const int id = c.idx[static_cast<size_t>(r) * c.k + i];
      if (id < 0) continue;
      std::vector<double> k(kD);
      for (int d = 0; d < kD; ++d) k[d] = math::dsv4_row_value(&c.comp[static_cast<size_t>(id) * kRow], d);
      keys.push_back(k);
    }
    for (int h = 0; h < c.heads; ++h) {
      double* o = &out[(static_cast<size_t>(r) * c.heads + h) * kD];
      if (keys.empty()) continue;
      std::vector<double> s;
      for (auto& k : keys) {
        double dot = 0;
        for (int d = 0; d < kD; ++d) dot += double(c.q[(static_cast<size_t>(r) * c.heads + h) * kD + d]) * k[d];
        s.push_back(dot * c.scale);
      }
      double m = c.sinks ? c.sink[h] : -INFINITY;
      for (double x : s) m = std::max(m, x);
      double den = c.sinks ? std::exp(c.sink[h] - m) : 0.0;
      for (double x : s) den += std::exp(x - m);
      for (size_t i = 0; i < keys.size(); ++i)
        for (int d = 0; d < kD; ++d) o[d] += std::exp(s[i] - m) / den * keys[i][d];
      for (int i = 0; i < t.layout.n_pairs(); ++i) {
        const double a = static_cast<float>(-c.qpos[r]) * t.freq[i];  // the f32 angle of the convention (rope.hpp)
        double& x0 = o[t.layout.dim0(i)];
        double& x1 = o[t.layout.dim1(i)];
        const double y0 = x0 * std::cos(a) - x1 * std::sin(a), y1 = x0 * std::sin(a) + x1 * std::cos(a);
        x0 = y0;
        x1 = y1;
      }
    }
  }
  return out;
}

struct Dev {
  Buffer q, win, wlen, qpos, idx, comp, sink, out;
  TensorRef q_ref, out_ref;
  Dsv4AttentionStep step;
  Dsv4AttentionLayer layer;
  AttentionSchedule sched;
  math::RopeTable rope{};
  // Plan the step and run the layer (the one-layer case).
  void run() const {
    Dsv4AttentionPlan::decode(layer, static_cast<int32_t>(q_ref.size(1)), step, sched).run(q_ref, layer, out_ref);
  }
};

inline void upload(const Case& c, Device d, Dev& g) {
  g.q = Buffer::from_host(c.q, d);
  g.win = c.f16_window ? Buffer::from_host(c.win16, d) : Buffer::from_host(c.win32, d);
  g.wlen = Buffer::from_host(c.wlen, d);
  g.qpos = Buffer::from_host(c.qpos, d);
  auto& a = g.layer;
  g.q_ref = TensorRef(g.q.data(), DType::F32, d, {c.rows, c.heads, kD});
  a.window_kv = TensorRef(g.win.data(), c.f16_window ? DType::F16 : DType::F32, d, {c.rows, c.n_window, kD});
  g.step.window_len = TensorRef(g.wlen.data(), DType::I32, d, {c.rows});
  g.step.q_positions = TensorRef(g.qpos.data(), DType::I32, d, {c.rows});
  if (c.k > 0) {
    g.idx = Buffer::from_host(c.idx, d);
    const int64_t stride = kRow + c.comp_pad;
    std::vector<uint8_t> padded(static_cast<size_t>(c.n_comp * stride), 0xff);
    for (int64_t i = 0; i < c.n_comp; ++i)
      std::copy_n(c.comp.begin() + i * kRow, kRow, padded.begin() + i * stride);
    g.comp = Buffer::from_host(padded, d);
    a.comp_idx = TensorRef(g.idx.data(), DType::I32, d, {c.rows, c.k});
    a.comp_rows = TensorRef(g.comp.data(), DType::U8, d, {c.n_comp, kRow}, {stride, 1});
  }
  if (c.sinks) {
    g.sink = Buffer::from_host(c.sink, d);
    a.maybe_sinks = TensorRef(g.sink.data(), DType::F32, d, {c.heads});
  }
  g.rope = make_rope_table(c.rope, kD);
  a.rope = &g.rope;
  a.softmax_scale = c.scale;
  g.out = Buffer(static_cast<size_t>(c.rows) * c.heads * kD * 4, d);
  g.out_ref = TensorRef(g.out.data(), DType::F32, d, {c.rows, c.heads, kD});
}

// A pool of `n_rings` window rings, NaN everywhere except row r's window, placed in ring idx[r]
// (the pool-by-index layout attention reads through Dsv4StepInputs::maybe_window_index).
inline std::vector<float> window_ring_pool(const Case& c, const std::vector<int32_t>& idx, int n_rings) {
  const size_t ring = static_cast<size_t>(c.n_window) * kD;
  std::vector<float> pool(static_cast<size_t>(n_rings) * ring, std::nanf(""));
  for (int r = 0; r < c.rows; ++r)
    std::copy(c.win32.begin() + static_cast<size_t>(r) * ring, c.win32.begin() + static_cast<size_t>(r + 1) * ring,
              pool.begin() + static_cast<size_t>(idx[r]) * ring);
  return pool;
}

inline std::vector<float> run(const Case& c, Device d, int splits = 0) {
  Dev g;
  upload(c, d, g);
  g.sched.num_splits = splits;
  g.run();
  return g.out.to_host<float>();
}

}  // namespace dsv4_test
