// Test helpers for the shift family: build a dense cache whose keys were
// written at positions p_t = t from known unrotated values (float64), and
// check a shifted cache byte by byte (moves) and against a fresh float64
// rotation at the new position (rotated dims). Shared by the CPU and CUDA tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvcore/error.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/shift.hpp"

namespace shift_test {

using namespace kvcore;

enum class KForm { Plain, Dsv4, Fp8 };

struct LayerSpec {
  KForm form = KForm::Plain;
  DType k_dtype = DType::F16;            // Plain only
  std::optional<DType> v_dtype = DType::F16;
  int heads = 2, head_dim = 128, v_head_dim = 128;
  RopeSpec rope = RopeSpec::plain(128, 10000.0);
  int k_pad = 0, v_pad = 0;              // extra elements per token: strided rows
  double magnitude = 1.0;                // attention factor applied when the keys were written
};

// One layer per K form rope_shift_rows takes: f16 Llama-3 (`heads0` heads), bf16 rotating an
// interleaved 32-dim tail, DeepSeek-V4's packed rows, FP8 (128 dims), and MLA's latent K as FP8
// (576 dims, RoPE on the 64-dim tail).
inline std::vector<LayerSpec> every_k_form(int heads0) {
  std::vector<LayerSpec> specs(5);
  specs[0].heads = heads0;
  specs[0].rope = RopeSpec::llama3_8b();
  specs[1].k_dtype = DType::BF16;
  specs[1].head_dim = 64;
  specs[1].rope = RopeSpec::plain(32, 10000.0, RopePairing::Interleaved);
  specs[1].rope.slice = RopeSlice::Tail;
  specs[2].form = KForm::Dsv4;
  specs[2].heads = 1;
  specs[2].rope = RopeSpec::deepseek_v4_compressed();
  specs[3].form = KForm::Fp8;
  specs[3].rope = RopeSpec::plain(128, 10000.0);
  specs[4] = specs[3];
  specs[4].head_dim = 576;
  specs[4].rope = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  specs[4].rope.slice = RopeSlice::Tail;
  return specs;
}

inline double store_round(DType t, double v) {
  switch (t) {
    case DType::F16: return to_f32(from_f32<f16>(static_cast<float>(v)));
    case DType::BF16: return to_f32(from_f32<bf16>(static_cast<float>(v)));
    default: return static_cast<float>(v);
  }
}
inline void store_value(DType t, uint8_t* p, double v) {
  const float f = static_cast<float>(v);
  if (t == DType::F32) std::memcpy(p, &f, 4);
  else if (t == DType::F16) { const f16 h = from_f32<f16>(f); std::memcpy(p, &h, 2); }
  else { const bf16 h = from_f32<bf16>(f); std::memcpy(p, &h, 2); }
}
inline double load_value(DType t, const uint8_t* p) {
  if (t == DType::F32) { float f; std::memcpy(&f, p, 4); return f; }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return t == DType::F16 ? math::f16_bits_to_f32(b) : math::bf16_bits_to_f32(b);
}

// Rotate the rotated dims of `row` (head_dim doubles) by pos * w_i, times magnitude.
inline void rotate_ref(double* row, const math::RopeLayout& l, const std::vector<double>& w, double pos, double magnitude) {
  for (int i = 0; i < l.n_pairs(); ++i) {
    const double a = pos * w[i], c = std::cos(a) * magnitude, s = std::sin(a) * magnitude;
    const double x0 = row[l.dim0(i)], x1 = row[l.dim1(i)];
    row[l.dim0(i)] = x0 * c - x1 * s;
    row[l.dim1(i)] = x0 * s + x1 * c;
  }
}

struct Layer {
  LayerSpec spec;
  math::RopeTable table{};
  std::vector<double> w;       // the f32 frequencies the kernels use, as double
  int64_t cap = 0;
  int64_t k_tok = 0, s_tok = 0, v_tok = 0;  // bytes per token (row stride)
  int k_head_bytes = 0, v_head_bytes = 0, n_blocks = 0;
  std::vector<uint8_t> k, s, v;
  std::vector<double> x;       // [cap][heads][head_dim] unrotated keys (dsv4: only dims 448..511 matter)

  int head_dim() const { return spec.form == KForm::Dsv4 ? math::Dsv4RowLayout::kHeadDim : spec.head_dim; }
  DType k_dtype() const {
    return spec.form == KForm::Plain ? spec.k_dtype : spec.form == KForm::Dsv4 ? DType::U8 : DType::E4M3;
  }
  int64_t k_elem_stride() const { return k_tok / static_cast<int64_t>(dtype_size(k_dtype())); }

  // A view of (possibly device) copies of k, s, v.
  ShiftDenseLayer view(Device dev, void* kp, void* sp, void* vp) const {
    ShiftDenseLayer L;
    const int64_t hd = spec.form == KForm::Dsv4 ? math::Dsv4RowLayout::kBytes : spec.head_dim;
    L.k = TensorRef(kp, k_dtype(), dev, {cap, spec.heads, hd}, {k_elem_stride(), hd, 1});
    if (spec.form == KForm::Fp8) L.maybe_k_scales = TensorRef(sp, DType::UE8M0, dev, {cap, spec.heads, n_blocks}, {s_tok, n_blocks, 1});
    if (spec.v_dtype) {
      const int64_t es = static_cast<int64_t>(dtype_size(*spec.v_dtype));
      L.maybe_v = TensorRef(vp, *spec.v_dtype, dev, {cap, spec.heads, spec.v_head_dim}, {v_tok / es, spec.v_head_dim, 1});
    }
    L.rope = spec.rope;
    return L;
  }
  ShiftDenseLayer host_view() { return view(Device::cpu(), k.data(), s.data(), v.data()); }
};

// FP8 write-time quantization of one head (values in f64), as a writer would do it.
inline void quantize_fp8_head(const double* vals, int head_dim, uint8_t* codes, uint8_t* scales) {
  for (int b = 0; b < head_dim / 64; ++b) {
    float amax = 0;
    for (int d = b * 64; d < b * 64 + 64; ++d) amax = math::finite_abs_max(amax, static_cast<float>(vals[d]));
    const int e = math::e4m3_scale_exponent(amax);
    for (int d = b * 64; d < b * 64 + 64; ++d) codes[d] = math::e4m3_encode(math::e4m3_scaled(static_cast<float>(vals[d]), math::pow2f(-e)));
    scales[b] = math::ue8m0_encode(e);
  }
}
inline double dequant_fp8(const uint8_t* codes, const uint8_t* scales, int d) {
  return static_cast<double>(math::e4m3_decode(codes[d])) * math::ue8m0_decode(scales[d / 64]);
}

// Keys of token t written at position t (times magnitude), random V and padding.
inline Layer make_layer(const LayerSpec& spec, int64_t cap, uint64_t seed) {
  Layer L;
  L.spec = spec;
  L.cap = cap;
  const int hd = L.head_dim();
  L.table = make_rope_table(spec.rope, hd);
  for (int i = 0; i < L.table.layout.n_pairs(); ++i) L.w.push_back(L.table.freq[i]);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> byte(0, 255);
  const DType kdt = L.k_dtype();
  L.k_head_bytes = spec.form == KForm::Dsv4 ? math::Dsv4RowLayout::kBytes : hd * static_cast<int>(dtype_size(kdt));
  L.k_tok = int64_t{spec.heads} * L.k_head_bytes + int64_t{spec.k_pad} * static_cast<int64_t>(dtype_size(kdt));
  L.k.resize(cap * L.k_tok);
  for (auto& b : L.k) b = static_cast<uint8_t>(byte(rng));  // padding and DSV4 nope bytes stay random
  if (spec.form == KForm::Fp8) {
    L.n_blocks = hd / 64;
    L.s_tok = int64_t{spec.heads} * L.n_blocks;
    L.s.resize(cap * L.s_tok);
  }
  L.x.resize(cap * spec.heads * hd);
  std::vector<double> row(hd);
  for (int64_t t = 0; t < cap; ++t) {
    for (int h = 0; h < spec.heads; ++h) {
      double* x = &L.x[(t * spec.heads + h) * hd];
      for (int d = 0; d < hd; ++d) x[d] = normal(rng);
      for (int d = 0; d < hd; ++d) row[d] = x[d];
      rotate_ref(row.data(), L.table.layout, L.w, static_cast<double>(t), spec.magnitude);
      uint8_t* kh = L.k.data() + t * L.k_tok + h * L.k_head_bytes;
      if (spec.form == KForm::Plain) {
        const int es = static_cast<int>(dtype_size(kdt));
        for (int d = 0; d < hd; ++d) store_value(kdt, kh + d * es, row[d]);
      } else if (spec.form == KForm::Dsv4) {
        for (int d = math::Dsv4RowLayout::kNope; d < hd; ++d)
          store_value(DType::BF16, kh + math::Dsv4RowLayout::kRopeOffset + 2 * (d - math::Dsv4RowLayout::kNope), row[d]);
        for (int b = 0; b < math::Dsv4RowLayout::kBlocks; ++b) kh[math::Dsv4RowLayout::kScaleOffset + b] = static_cast<uint8_t>(110 + byte(rng) % 20);
      } else {
        quantize_fp8_head(row.data(), hd, kh, L.s.data() + t * L.s_tok + h * L.n_blocks);
      }
    }
  }
  if (spec.v_dtype) {
    const int es = static_cast<int>(dtype_size(*spec.v_dtype));
    L.v_head_bytes = spec.v_head_dim * es;
    L.v_tok = int64_t{spec.heads} * L.v_head_bytes + int64_t{spec.v_pad} * es;
    L.v.resize(cap * L.v_tok);
    for (auto& b : L.v) b = static_cast<uint8_t>(byte(rng));
    for (int64_t t = 0; t < cap; ++t)
      for (int i = 0; i < spec.heads * spec.v_head_dim; ++i) store_value(*spec.v_dtype, L.v.data() + t * L.v_tok + i * es, normal(rng));
  }
  return L;
}

// Error bound of the rotated dims, relative to the norm of each pair.
inline double rotation_tolerance(const Layer& L) {
  if (L.spec.form == KForm::Fp8) return 0.13;
  const DType t = L.spec.form == KForm::Dsv4 ? DType::BF16 : L.spec.k_dtype;
  return t == DType::F32 ? 2e-6 : t == DType::F16 ? 1.0e-3 : 8.0e-3;  // two roundings (write + shift)
}

struct CheckResult {
  bool ok = true;
  double max_rel = 0;          // max |got - ref| / |ref pair| over rotated dims
  double sq_err = 0, sq_ref = 0;
  std::string problem;
  double rms_rel() const { return sq_ref > 0 ? std::sqrt(sq_err / sq_ref) : 0.0; }
  void fail(const std::string& what) {
    if (ok) problem = what;
    ok = false;
  }
};

inline bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// Compare `after` (the shifted bytes of this layer's k, s, v) with what the shift must produce.
inline CheckResult check_shift(const Layer& before, const std::vector<uint8_t>& k, const std::vector<uint8_t>& s,
                               const std::vector<uint8_t>& v, int64_t length, int64_t n_keep, int64_t n_discard) {
  CheckResult r;
  const LayerSpec& sp = before.spec;
  const int hd = before.head_dim();
  const int64_t n_moved = n_discard == 0 ? 0 : length - n_keep - n_discard;
  const math::RopeLayout& l = before.table.layout;
  std::vector<double> ref(hd);
  for (int64_t t = 0; t < before.cap; ++t) {
    const bool moved = t >= n_keep && t < n_keep + n_moved;
    const int64_t src = moved ? t + n_discard : t;
    auto where = [&](const char* what) {
      std::ostringstream os;
      os << what << " differs at token " << t << (moved ? " (moved from " + std::to_string(src) + ")" : " (not moved)");
      return os.str();
    };
    const uint8_t* kb = before.k.data() + src * before.k_tok;  // expected source row
    const uint8_t* ka = k.data() + t * before.k_tok;
    const int64_t head_span = int64_t{sp.heads} * before.k_head_bytes;
    // padding between rows is never written
    if (!same_bytes(ka + head_span, before.k.data() + t * before.k_tok + head_span, before.k_tok - head_span)) r.fail(where("K padding"));
    if (sp.v_dtype) {
      const int64_t vspan = int64_t{sp.heads} * before.v_head_bytes;
      if (!same_bytes(v.data() + t * before.v_tok, before.v.data() + src * before.v_tok, vspan)) r.fail(where("V row"));
      if (!same_bytes(v.data() + t * before.v_tok + vspan, before.v.data() + t * before.v_tok + vspan, before.v_tok - vspan))
        r.fail(where("V padding"));
    }
    if (!moved) {
      if (!same_bytes(ka, kb, head_span)) r.fail(where("K row"));
      if (sp.form == KForm::Fp8 && !same_bytes(s.data() + t * before.s_tok, before.s.data() + t * before.s_tok, before.s_tok))
        r.fail(where("K scales"));
      continue;
    }
    for (int h = 0; h < sp.heads; ++h) {
      const uint8_t* hb = kb + h * before.k_head_bytes;
      const uint8_t* ha = ka + h * before.k_head_bytes;
      const double* x = &before.x[(src * sp.heads + h) * hd];
      for (int d = 0; d < hd; ++d) ref[d] = x[d];
      rotate_ref(ref.data(), l, before.w, static_cast<double>(t), sp.magnitude);  // fresh rotation at the new position
      std::vector<double> got(hd, 0.0);
      if (sp.form == KForm::Plain) {
        const int es = static_cast<int>(dtype_size(sp.k_dtype));
        for (int d = 0; d < hd; ++d) {
          if (l.rotates(d)) got[d] = load_value(sp.k_dtype, ha + d * es);
          else if (!same_bytes(ha + d * es, hb + d * es, es)) r.fail(where("non-rotated K dim"));
        }
      } else if (sp.form == KForm::Dsv4) {
        if (!same_bytes(ha, hb, math::Dsv4RowLayout::kRopeOffset) ||
            !same_bytes(ha + math::Dsv4RowLayout::kScaleOffset, hb + math::Dsv4RowLayout::kScaleOffset, 8))
          r.fail(where("DeepSeek-V4 FP8 bytes / scales"));
        for (int d = math::Dsv4RowLayout::kNope; d < hd; ++d) {
          const uint8_t* p = ha + math::Dsv4RowLayout::kRopeOffset + 2 * (d - math::Dsv4RowLayout::kNope);
          if (l.rotates(d)) got[d] = load_value(DType::BF16, p);
          else if (!same_bytes(p, hb + math::Dsv4RowLayout::kRopeOffset + 2 * (d - math::Dsv4RowLayout::kNope), 2))
            r.fail(where("non-rotated DeepSeek-V4 tail dim"));
        }
      } else {
        const uint8_t* sa = s.data() + t * before.s_tok + h * before.n_blocks;
        const uint8_t* sb = before.s.data() + src * before.s_tok + h * before.n_blocks;
        const int b0 = l.first_dim / 64, b1 = (l.first_dim + l.n_rot - 1) / 64;
        for (int b = 0; b < before.n_blocks; ++b) {
          const bool touched = b >= b0 && b <= b1;
          if (!touched) {
            if (!same_bytes(ha + b * 64, hb + b * 64, 64) || sa[b] != sb[b]) r.fail(where("FP8 block without rotated dims"));
            continue;
          }
          for (int d = b * 64; d < b * 64 + 64; ++d) {
            got[d] = dequant_fp8(ha, sa, d);
            if (!l.rotates(d) && sa[b] == sb[b] && ha[d] != hb[d]) r.fail(where("non-rotated FP8 code (same scale)"));
          }
        }
      }
      const double tol = rotation_tolerance(before);
      for (int i = 0; i < l.n_pairs(); ++i) {
        const int d0 = l.dim0(i), d1 = l.dim1(i);
        const double norm = std::hypot(ref[d0], ref[d1]);
        const double e = std::max(std::fabs(got[d0] - ref[d0]), std::fabs(got[d1] - ref[d1]));
        r.sq_err += (got[d0] - ref[d0]) * (got[d0] - ref[d0]) + (got[d1] - ref[d1]) * (got[d1] - ref[d1]);
        r.sq_ref += norm * norm;
        const double floor = sp.form == KForm::Fp8 ? 1e-2 : 1e-6;  // FP8 subnormal steps
        const double rel = e / std::max(norm, floor);
        r.max_rel = std::max(r.max_rel, rel);
        if (!(rel <= tol)) {
          std::ostringstream os;
          os << "rotated dims (" << d0 << ", " << d1 << ") of head " << h << " at token " << t << ": got (" << got[d0] << ", "
             << got[d1] << "), want (" << ref[d0] << ", " << ref[d1] << "), rel " << rel << " > " << tol;
          r.fail(os.str());
        }
      }
    }
  }
  return r;
}

}  // namespace shift_test
