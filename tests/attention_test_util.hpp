// Random paged caches and float64 references for the attention tests (CPU
// and CUDA suites share it). Pages hold NaN in every cell a kernel must not
// read (unused blocks, dead cells), so a kernel that touches them fails.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kvcore/kvcore.hpp"
#include "kvcore/math/attention_rows.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/attention.hpp"
#include "ops/attention_plan_impl.hpp"
#include "ops/attention_tuning.hpp"

namespace attn_test {

using namespace kvcore;

struct CaseSpec {
  int n_q_heads = 8, n_kv_heads = 2, head_dim = 64, block_size = 16;
  int v_head_dim = 0;       // width of V rows and of the output; 0: head_dim
  DType kv = DType::F16;  // F32, F16, BF16, E4M3
  bool f32_scales = false;  // E4M3: per (token, head) f32 scale instead of per-64 UE8M0
  DType q = DType::F32, out = DType::F32;
  std::vector<int> seq_cells{37};  // cells spanned per sequence
  int shared_blocks = 0;           // sequences 1.. share sequence 0's first blocks (a fork)
  double dead_rate = 0.0;          // share of dead cells (valid = 0)
  int window = 0;
  bool sinks = false;
  bool rope_on_read = false;       // K stored unrotated; attention rotates K and q
  int rope_dims = 0;               // rotated dims (0: head_dim / 2 from 128 on, else head_dim)
  std::vector<int> q_tokens;       // prefill: new tokens per sequence (the last cells of each sequence)
  bool pos_offsets = false;        // store positions + a per-sequence offset, pass table.pos_offset
  bool shuffled_positions = false; // a sequence's live cells take its positions in a random order (not growing)
  bool bare = false;               // pass no positions or valid flags (needs dead_rate 0; decode without window)
  uint64_t seed = 1;
  int dv() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

// Host copy of everything an attention call reads.
struct HostCase {
  CaseSpec spec;
  int num_blocks = 0;
  std::vector<uint8_t> k, v;            // pool bytes
  std::vector<uint8_t> k_sc8, v_sc8;    // UE8M0 scales
  std::vector<float> k_sc32, v_sc32;    // f32 scales
  std::vector<int32_t> positions;
  std::vector<uint8_t> valid;
  std::vector<int32_t> indptr, indices, last_page_len;
  std::vector<uint8_t> q;               // [rows, heads, dim] of spec.q
  std::vector<int32_t> q_positions, qo_indptr;
  std::vector<float> sinks;
  int rows = 0;
  float softmax_scale = 0;
  RopeSpec rope;

  size_t elem() const { return dtype_size(spec.kv); }
  int64_t row_of(int64_t cell, int head) const { return cell * spec.n_kv_heads + head; }
  double kv_value(bool is_k, int64_t cell, int head, int d) const {
    const auto& pool = is_k ? k : v;
    const int width = is_k ? spec.head_dim : spec.dv();
    const int64_t i = row_of(cell, head) * width + d;
    double x = math::kv_elem_to_f32(pool.data(), i, kv_elem());
    if (spec.kv == DType::E4M3) {
      if (spec.f32_scales) x *= (is_k ? k_sc32 : v_sc32)[row_of(cell, head)];
      else x *= math::ue8m0_decode((is_k ? k_sc8 : v_sc8)[row_of(cell, head) * (width / 64) + d / 64]);
    }
    return x;
  }
  math::KvElem kv_elem() const {
    return spec.kv == DType::F32 ? math::KvElem::F32 : spec.kv == DType::F16 ? math::KvElem::F16
           : spec.kv == DType::BF16 ? math::KvElem::BF16 : math::KvElem::E4M3;
  }
  double q_value(int r, int h, int d) const {
    const int64_t i = (int64_t{r} * spec.n_q_heads + h) * spec.head_dim + d;
    if (spec.q == DType::F32) return reinterpret_cast<const float*>(q.data())[i];
    const uint16_t b = reinterpret_cast<const uint16_t*>(q.data())[i];
    return spec.q == DType::F16 ? math::f16_bits_to_f32(b) : math::bf16_bits_to_f32(b);
  }
  int seq_of_row(int r) const {
    if (qo_indptr.empty()) return r;
    int b = 0;
    while (qo_indptr[b + 1] <= r) ++b;
    return b;
  }
};

inline void put_f(std::vector<uint8_t>& buf, DType t, int64_t i, float x) {
  if (t == DType::F32) std::memcpy(&buf[i * 4], &x, 4);
  else {
    const uint16_t b = t == DType::F16 ? math::f32_to_f16_bits(x) : math::f32_to_bf16_bits(x);
    std::memcpy(&buf[i * 2], &b, 2);
  }
}

inline void put_nan(std::vector<uint8_t>& buf, DType t, int64_t i) {
  if (t == DType::E4M3) buf[i] = 0x7f;
  else put_f(buf, t, i, std::nanf(""));
}

inline HostCase make_case(const CaseSpec& s) {
  HostCase c;
  c.spec = s;
  std::mt19937_64 rng(s.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int batch = static_cast<int>(s.seq_cells.size());
  const int bs = s.block_size, D = s.head_dim, DV = s.dv(), nkv = s.n_kv_heads;
  // Blocks per sequence; sequences > 0 reuse the first shared_blocks of sequence 0.
  std::vector<int> nblk(batch);
  int total = 0;
  for (int b = 0; b < batch; ++b) {
    nblk[b] = (s.seq_cells[b] + bs - 1) / bs;
    total += nblk[b] - (b > 0 ? std::min(s.shared_blocks, nblk[b]) : 0);
  }
  c.num_blocks = total + 3;  // spare blocks stay unused (NaN)
  std::vector<int> perm(c.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  c.indptr.push_back(0);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < nblk[b]; ++i)
      c.indices.push_back(b > 0 && i < s.shared_blocks && i < nblk[0] ? c.indices[i] : perm[next++]);
    c.indptr.push_back(static_cast<int32_t>(c.indices.size()));
    c.last_page_len.push_back(nblk[b] ? s.seq_cells[b] - (nblk[b] - 1) * bs : 1);
  }
  // Pools: NaN everywhere, then live cells get values.
  const int64_t cells = int64_t{c.num_blocks} * bs;
  const int64_t n = cells * nkv * D, nv = cells * nkv * DV;
  c.k.assign(n * c.elem(), 0);
  c.v.assign(nv * c.elem(), 0);
  for (int64_t i = 0; i < n; ++i) put_nan(c.k, s.kv, i);
  for (int64_t i = 0; i < nv; ++i) put_nan(c.v, s.kv, i);
  c.positions.assign(cells, 777777);
  c.valid.assign(cells, 0);
  if (s.kv == DType::E4M3) {
    c.k_sc8.assign(cells * nkv * (D / 64), 0xff);
    c.v_sc8.assign(cells * nkv * (DV / 64), 0xff);
    c.k_sc32.assign(cells * nkv, std::nanf(""));
    c.v_sc32 = c.k_sc32;
  }
  std::bernoulli_distribution dead(s.dead_rate);
  std::uniform_int_distribution<int> code(0, 0x5f);  // e4m3 magnitudes up to 2^4 * 1.875
  std::uniform_int_distribution<int> sexp(124, 128);
  for (int b = 0; b < batch; ++b) {
    int pos = 0;
    for (int j = 0; j < s.seq_cells[b]; ++j) {
      const int blk = c.indices[c.indptr[b] + j / bs];
      const int64_t cell = int64_t{blk} * bs + j % bs;
      if (b > 0 && j / bs < s.shared_blocks) {  // shared cell: already written by sequence 0
        if (c.valid[cell]) pos = c.positions[cell] + 1;
        continue;
      }
      if (dead(rng)) continue;  // stays NaN, valid 0
      c.valid[cell] = 1;
      c.positions[cell] = pos++;
      for (int h = 0; h < nkv; ++h) {
        const int64_t row = cell * nkv + h;
        // K and V values interleaved while both rows last (the draws of equal widths stay
        // those of the cases written before V could differ), then the rest of the longer row.
        for (int d = 0; d < std::max(D, DV); ++d) {
          const int64_t i = row * D + d, iv = row * DV + d;
          if (s.kv == DType::E4M3) {
            if (d < D) c.k[i] = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
            if (d < DV) c.v[iv] = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
          } else {
            if (d < D) put_f(c.k, s.kv, i, u(rng));
            if (d < DV) put_f(c.v, s.kv, iv, u(rng));
          }
        }
        if (s.kv == DType::E4M3) {
          for (int g = 0; g < std::max(D, DV) / 64; ++g) {
            if (g < D / 64) c.k_sc8[row * (D / 64) + g] = static_cast<uint8_t>(sexp(rng) - 4);
            if (g < DV / 64) c.v_sc8[row * (DV / 64) + g] = static_cast<uint8_t>(sexp(rng) - 4);
          }
          c.k_sc32[row] = 0.01f + 0.05f * (u(rng) + 1.0f);
          c.v_sc32[row] = 0.01f + 0.05f * (u(rng) + 1.0f);
        }
      }
    }
  }
  if (s.shuffled_positions)  // each sequence's own live cells (not the shared ones) swap positions
    for (int b = 0; b < batch; ++b) {
      std::vector<int64_t> live;
      for (int j = b > 0 ? s.shared_blocks * bs : 0; j < s.seq_cells[b]; ++j) {
        const int64_t cell = int64_t{c.indices[c.indptr[b] + j / bs]} * bs + j % bs;
        if (c.valid[cell]) live.push_back(cell);
      }
      for (size_t i = live.size(); i > 1; --i)
        std::swap(c.positions[live[i - 1]], c.positions[live[std::uniform_int_distribution<size_t>(0, i - 1)(rng)]]);
    }
  // Queries: decode = one per sequence; prefill = the last q_tokens[b] cells of each sequence.
  const bool prefill = !s.q_tokens.empty();
  if (prefill) {
    c.qo_indptr.push_back(0);
    for (int b = 0; b < batch; ++b) c.qo_indptr.push_back(c.qo_indptr.back() + s.q_tokens[b]);
    c.rows = c.qo_indptr.back();
  } else {
    c.rows = batch;
  }
  for (int r = 0; r < c.rows; ++r) {
    const int b = c.seq_of_row(r);
    // The query's position: the last live position of its sequence (+ its index in the chunk).
    int last = -1;
    for (int j = 0; j < s.seq_cells[b]; ++j) {
      const int64_t cell = int64_t{c.indices[c.indptr[b] + j / bs]} * bs + j % bs;
      if (c.valid[cell]) last = std::max(last, c.positions[cell]);
    }
    c.q_positions.push_back(prefill ? last - (c.qo_indptr[b + 1] - 1 - r) : last + 0);
  }
  c.q.assign(static_cast<size_t>(c.rows) * s.n_q_heads * D * dtype_size(s.q), 0);
  for (int64_t i = 0; i < int64_t{c.rows} * s.n_q_heads * D; ++i) put_f(c.q, s.q, i, 1.5f * u(rng));
  if (s.sinks)
    for (int h = 0; h < s.n_q_heads; ++h) c.sinks.push_back(2.0f * u(rng));
  c.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
  c.rope = RopeSpec::plain(s.rope_dims > 0 ? s.rope_dims : D >= 128 ? D / 2 : D, 10000.0, (s.seed & 1) ? RopePairing::NeoX : RopePairing::Interleaved);
  if (s.seed & 2) c.rope.slice = RopeSlice::Tail;
  c.rope.attention_factor = 1.25;
  return c;
}

// float64 reference: out[rows][n_q_heads][v_head_dim].
inline std::vector<double> reference(const HostCase& c) {
  const auto& s = c.spec;
  const int D = s.head_dim, DV = s.dv(), bs = s.block_size, G = s.n_q_heads / s.n_kv_heads;
  const math::RopeTable t = make_rope_table(c.rope, D);
  auto rotate = [&](std::vector<double>& x, double pos) {
    const double mag = t.attention_factor;
    for (int i = 0; i < t.layout.n_pairs(); ++i) {
      const double a = static_cast<float>(pos) * t.freq[i];  // the f32 angle of the convention (rope.hpp)
      const double cs = std::cos(a) * mag, sn = std::sin(a) * mag;
      double& x0 = x[t.layout.dim0(i)];
      double& x1 = x[t.layout.dim1(i)];
      const double y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
      x0 = y0;
      x1 = y1;
    }
  };
  std::vector<double> out(static_cast<size_t>(c.rows) * s.n_q_heads * DV, 0.0);
  const bool prefill = !c.qo_indptr.empty();
  for (int r = 0; r < c.rows; ++r) {
    const int b = c.seq_of_row(r);
    const int qp = c.q_positions[r];
    for (int h = 0; h < s.n_q_heads; ++h) {
      const int kvh = h / G;
      std::vector<double> q(D);
      for (int d = 0; d < D; ++d) q[d] = c.q_value(r, h, d);
      if (s.rope_on_read) rotate(q, qp);
      std::vector<double> scores;
      std::vector<int64_t> keys;
      for (int j = 0; j < s.seq_cells[b]; ++j) {
        const int64_t cell = int64_t{c.indices[c.indptr[b] + j / bs]} * bs + j % bs;
        if (!c.valid[cell]) continue;
        const int kp = c.positions[cell];
        if (prefill && kp > qp) continue;
        if (s.window > 0 && int64_t{qp} - kp >= s.window) continue;
        std::vector<double> k(D);
        for (int d = 0; d < D; ++d) k[d] = c.kv_value(true, cell, kvh, d);
        if (s.rope_on_read) rotate(k, kp);
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += q[d] * k[d];
        scores.push_back(dot * c.softmax_scale);
        keys.push_back(cell);
      }
      if (keys.empty()) continue;  // zeros
      double m = *std::max_element(scores.begin(), scores.end());
      if (s.sinks) m = std::max(m, double{c.sinks[h]});
      double den = s.sinks ? std::exp(c.sinks[h] - m) : 0.0;
      for (double x : scores) den += std::exp(x - m);
      double* o = &out[(static_cast<size_t>(r) * s.n_q_heads + h) * DV];
      for (size_t i = 0; i < keys.size(); ++i) {
        const double w = std::exp(scores[i] - m) / den;
        for (int d = 0; d < DV; ++d) o[d] += w * c.kv_value(false, keys[i], kvh, d);
      }
    }
  }
  return out;
}

// Device copies of a HostCase and the arguments of a plan and its run.
struct DeviceCase {
  Buffer k, v, ks, vs, pos, valid, indptr, indices, lpl, q, qpos, qo, sinks, pos_off;
  PagedKV kv;
  math::RopeTable rope_table{};
  AttentionStep step;        // step.table, q_positions, qo_indptr (prefill)
  AttentionSchedule sched;
  AttentionLayer layer;
  ops::AttentionTuning tuning;
  TensorRef q_ref;
  bool prefill = false;
  BlockTable& table() { return step.table; }
  AttentionPlan plan() const {
    return ops::attn::plan_paged(prefill, kv, static_cast<int32_t>(q_ref.size(1)), step, sched, tuning);
  }
  // Plan and run in one (the one-layer case).
  void run(const TensorRef& out) const { plan().run(q_ref, kv, out, layer); }
};

template <class T>
Buffer upload(const std::vector<T>& v, Device d) {
  if (v.empty()) return Buffer();
  return Buffer::from_host(v, d);
}

inline void make_device_case(const HostCase& c, Device d, DeviceCase& g) {
  const auto& s = c.spec;
  g.k = upload(c.k, d);
  g.v = upload(c.v, d);
  const int64_t nb = c.num_blocks, bs = s.block_size, nkv = s.n_kv_heads, D = s.head_dim, DV = s.dv();
  g.kv.k = TensorRef(g.k.data(), s.kv, d, {nb, bs, nkv, D});
  g.kv.v = TensorRef(g.v.data(), s.kv, d, {nb, bs, nkv, DV});
  if (s.kv == DType::E4M3) {
    if (s.f32_scales) {
      g.ks = upload(c.k_sc32, d);
      g.vs = upload(c.v_sc32, d);
      g.kv.k_scale = TensorRef(g.ks.data(), DType::F32, d, {nb, bs, nkv});
      g.kv.v_scale = TensorRef(g.vs.data(), DType::F32, d, {nb, bs, nkv});
    } else {
      g.ks = upload(c.k_sc8, d);
      g.vs = upload(c.v_sc8, d);
      g.kv.k_scale = TensorRef(g.ks.data(), DType::UE8M0, d, {nb, bs, nkv, D / 64});
      g.kv.v_scale = TensorRef(g.vs.data(), DType::UE8M0, d, {nb, bs, nkv, DV / 64});
    }
  }
  if (s.pos_offsets) {
    // Each sequence's cells store position + offset (forked sequences share one offset, as
    // PagedCache keeps it); the op must subtract table.pos_offset and see the same keys.
    const int64_t n_seq = static_cast<int64_t>(c.last_page_len.size());
    std::vector<int32_t> off(n_seq), stored = c.positions;
    for (int64_t b = 0; b < n_seq; ++b) off[b] = s.shared_blocks > 0 ? 1234 : 1000 + 37 * static_cast<int32_t>(b);
    std::vector<bool> done(stored.size(), false);
    for (int64_t b = 0; b < n_seq; ++b)
      for (int32_t i = c.indptr[b]; i < c.indptr[b + 1]; ++i)
        for (int64_t slot = 0; slot < s.block_size; ++slot) {
          const int64_t cell = int64_t{c.indices[i]} * s.block_size + slot;
          if (!done[cell]) stored[cell] += off[b], done[cell] = true;
        }
    g.pos = upload(stored, d);
    g.pos_off = upload(off, d);
    g.step.table.pos_offset = TensorRef(g.pos_off.data(), DType::I32, d, {n_seq});
  } else {
    g.pos = upload(c.positions, d);
    g.step.table.pos_offset = TensorRef();
  }
  g.valid = upload(c.valid, d);
  g.kv.positions = TensorRef(g.pos.data(), DType::I32, d, {nb, bs});
  g.kv.valid = TensorRef(g.valid.data(), DType::U8, d, {nb, bs});
  if (s.bare) g.kv.positions = TensorRef(), g.kv.valid = TensorRef();
  g.indptr = upload(c.indptr, d);
  g.indices = upload(c.indices, d);
  g.lpl = upload(c.last_page_len, d);
  const int64_t batch = static_cast<int64_t>(c.last_page_len.size());
  g.step.table.indptr = TensorRef(g.indptr.data(), DType::I32, d, {batch + 1});
  g.step.table.indices = TensorRef(g.indices.data(), DType::I32, d, {static_cast<int64_t>(c.indices.size())});
  g.step.table.last_page_len = TensorRef(g.lpl.data(), DType::I32, d, {batch});
  g.q = upload(c.q, d);
  g.q_ref = TensorRef(g.q.data(), s.q, d, {c.rows, s.n_q_heads, D});
  g.qpos = upload(c.q_positions, d);
  g.prefill = !c.qo_indptr.empty();
  g.step.qo_indptr = TensorRef();
  if (g.prefill) {
    g.qo = upload(c.qo_indptr, d);
    g.step.qo_indptr = TensorRef(g.qo.data(), DType::I32, d, {batch + 1});
  }
  g.layer = AttentionLayer{};
  g.layer.softmax_scale = c.softmax_scale;
  g.layer.window = s.window;
  g.step.q_positions = TensorRef(g.qpos.data(), DType::I32, d, {c.rows});
  if (s.sinks) {
    g.sinks = upload(c.sinks, d);
    g.layer.maybe_sinks = TensorRef(g.sinks.data(), DType::F32, d, {s.n_q_heads});
  }
  g.sched = AttentionSchedule{};
  g.tuning = ops::AttentionTuning{};
  if (s.rope_on_read) {
    g.rope_table = make_rope_table(c.rope, D);
    g.kv.rope_mode = RopeMode::RopeOnRead;
    g.kv.maybe_rope = &g.rope_table;
  }
}

// Cases that store position + a per-sequence offset (read through table.pos_offset):
// variant 0 rope on read, 1 window, 2 causal prefill with rope on read, 3 forked sequences.
inline CaseSpec pos_offset_case(int variant, std::vector<int> seq_cells) {
  CaseSpec s;
  s.seq_cells = std::move(seq_cells);
  s.dead_rate = 0.2;
  s.pos_offsets = true;
  s.rope_on_read = variant != 1;
  s.window = variant >= 1 ? 30 : 0;
  s.shared_blocks = variant == 3 ? 2 : 0;
  if (variant == 2) s.q_tokens = {5, 9, 1};
  s.seed = 60 + variant;
  return s;
}

// Runs the op (decode or prefill as the case says) and returns the output as f32.
inline std::vector<float> run_op(const HostCase& c, Device d, int num_splits = 0, DeviceCase* keep = nullptr,
                                 int kernel_variant = 0) {
  DeviceCase local;
  DeviceCase& g = keep ? *keep : local;
  make_device_case(c, d, g);
  g.sched.num_splits = num_splits;
  g.tuning.kernel = static_cast<ops::AttentionKernel>(kernel_variant);
  const auto& s = c.spec;
  const int64_t n = int64_t{c.rows} * s.n_q_heads * s.dv();
  Buffer out(n * dtype_size(s.out), d);
  TensorRef o(out.data(), s.out, d, {c.rows, s.n_q_heads, s.dv()});
  g.run(o);
  std::vector<uint8_t> raw = out.to_host<uint8_t>();
  std::vector<float> f(n);
  for (int64_t i = 0; i < n; ++i) {
    if (s.out == DType::F32) std::memcpy(&f[i], &raw[i * 4], 4);
    else {
      uint16_t b;
      std::memcpy(&b, &raw[i * 2], 2);
      f[i] = s.out == DType::F16 ? math::f16_bits_to_f32(b) : math::bf16_bits_to_f32(b);
    }
  }
  return f;
}

// max |a - b| / max(1, max |b|).
template <class A, class B>
double max_rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  double e = 0, m = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    e = std::max(e, std::abs(double(a[i]) - double(b[i])));
    if (!std::isfinite(double(a[i]))) return INFINITY;
    m = std::max(m, std::abs(double(b[i])));
  }
  return e / m;
}

}  // namespace attn_test
