// rope_apply (CPU) against a float64 reference for every variant, slice, pairing, dtype and
// head_dim, with odd token counts and strided views; composition R(p) then R(d) == R(p+d);
// the attention factor only when asked; bad arguments rejected with nothing written.
//
// Tolerance of one output pair (x0, x1) -> (y0, y1), r = |x0| + |x1|, m the magnitude:
//   |y - y_f64| <= m * r * (|angle| * 2^-22 + 2^-21) + m * r * u(dtype)
// The first term is f32 math: the f32 frequency and the f32 product p * w each round once
// (relative 2^-24 each, so the angle is off by up to |angle| * 2^-23), sin/cos are within
// half an ulp, the rotation rounds three times; both get a 2x margin. The second is the
// one rounding to storage: u = 2^-23 (f32), 2^-10 (f16), 2^-7 (bf16) relative (twice the
// half-ulp bound, so subnormal f16 results are covered too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvcore/error.hpp"
#include "kvcore/ops/rope.hpp"
#include "rope_reference.hpp"

using namespace kvcore;
using rope_ref::load;

namespace {

struct Case {
  RopeSpec spec;
  DType dtype;
  int head_dim;
  int tokens, heads;
  bool strided;
  DType pos_dtype;
  RopeAttentionFactor factor = RopeAttentionFactor::Skip;
};

// A [tokens, heads, head_dim] view inside a host buffer; strided views leave gaps.
struct Rows {
  std::vector<uint8_t> buf;
  int64_t st, sh;
  TensorRef view(DType dt, int tokens, int heads, int hd) {
    return TensorRef(buf.data(), dt, Device::cpu(), {tokens, heads, hd}, {st, sh, 1});
  }
};

Rows make_rows(DType dt, int tokens, int heads, int hd, bool strided, std::mt19937_64& rng) {
  Rows r;
  r.sh = strided ? hd + 3 : hd;
  r.st = strided ? heads * r.sh + 5 : heads * r.sh;
  r.buf = rope_ref::random_storage(dt, r.st * tokens + 8, rng);
  return r;
}

struct Positions {
  std::vector<int64_t> values;
  std::vector<uint8_t> buf;
  int64_t stride;
  TensorRef view(DType dt) {
    return TensorRef(buf.data(), dt, Device::cpu(), {int64_t(values.size())}, {stride});
  }
};

Positions make_positions(const std::vector<int64_t>& v, DType dt, bool strided) {
  Positions p{v, {}, strided ? 2 : 1};
  const size_t es = dtype_size(dt);
  p.buf.assign(v.size() * p.stride * es + es, 0xAB);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::I32) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(p.buf.data() + i * p.stride * es, &x, 4);
    } else {
      std::memcpy(p.buf.data() + i * p.stride * es, &v[i], 8);
    }
  }
  return p;
}

std::vector<int64_t> random_positions(int n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> u(-70000, 140000);
  std::vector<int64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(i == 0 ? 0 : i == 1 ? 131071 : u(rng));
  return v;
}

// Checks `got` (the rows after the op) against the float64 rotation of `in` at `pos`.
// Pass-through dims must hold the input's exact bits. Returns the worst error / tolerance.
double check_against_reference(const Case& c, const Rows& in, const Rows& got, const std::vector<int64_t>& pos,
                               double magnitude) {
  const std::vector<double> w = rope_ref::freqs(c.spec);
  const size_t es = dtype_size(c.dtype);
  double worst = 0;
  for (int t = 0; t < c.tokens; ++t)
    for (int h = 0; h < c.heads; ++h) {
      const int64_t bi = t * in.st + h * in.sh, bo = t * got.st + h * got.sh;
      std::vector<double> row(c.head_dim);
      for (int d = 0; d < c.head_dim; ++d) row[d] = load(c.dtype, in.buf.data(), bi + d);
      const std::vector<double> want = rope_ref::rotate_row(row, c.spec, w, double(pos[t]), magnitude);
      std::vector<bool> rotated(c.head_dim, false);
      for (int i = 0; i < c.spec.n_rot / 2; ++i) {
        const int a = rope_ref::dim0(c.spec, c.head_dim, i), b = rope_ref::dim1(c.spec, c.head_dim, i);
        rotated[a] = rotated[b] = true;
        const double r = std::abs(row[a]) + std::abs(row[b]);
        const double ang = std::abs(double(pos[t]) * w[i]);
        const double tol = magnitude * r * (ang * std::ldexp(1.0, -22) + std::ldexp(1.0, -21) +
                                            rope_ref::unit_roundoff(c.dtype)) + 1e-30;
        for (int d : {a, b}) {
          const double err = std::abs(load(c.dtype, got.buf.data(), bo + d) - want[d]);
          worst = std::max(worst, err / tol);
          if (err > tol) {
            ADD_FAILURE() << c.spec.describe() << " " << dtype_name(c.dtype) << " hd " << c.head_dim << " token " << t
                          << " head " << h << " dim " << d << " pos " << pos[t] << ": err " << err << " > tol " << tol;
            return worst;
          }
        }
      }
      for (int d = 0; d < c.head_dim; ++d) {
        if (!rotated[d]) {
          EXPECT_EQ(0, std::memcmp(in.buf.data() + (bi + d) * es, got.buf.data() + (bo + d) * es, es))
              << "pass-through dim " << d << " changed";
        }
      }
    }
  return worst;
}

void run_case(const Case& c, std::mt19937_64& rng, double* worst) {
  Rows x = make_rows(c.dtype, c.tokens, c.heads, c.head_dim, c.strided, rng);
  const std::vector<int64_t> pv = random_positions(c.tokens, rng);
  Positions pos = make_positions(pv, c.pos_dtype, c.strided);
  const double m = c.factor == RopeAttentionFactor::Apply ? static_cast<float>(c.spec.attention_factor) : 1.0;

  // out of place: a differently strided output; bytes outside the view stay untouched
  Rows out = make_rows(c.dtype, c.tokens, c.heads, c.head_dim, !c.strided, rng);
  const std::vector<uint8_t> out_before = out.buf;
  rope_apply(x.view(c.dtype, c.tokens, c.heads, c.head_dim), pos.view(c.pos_dtype), c.spec, c.factor,
             out.view(c.dtype, c.tokens, c.heads, c.head_dim));
  *worst = std::max(*worst, check_against_reference(c, x, out, pv, m));
  const size_t es = dtype_size(c.dtype);
  for (size_t b = 0; b < out.buf.size(); ++b) {
    const int64_t e = static_cast<int64_t>(b / es);
    const int64_t t = e / out.st, rem = e % out.st, h = rem / out.sh, d = rem % out.sh;
    const bool inside = t < c.tokens && h < c.heads && d < c.head_dim;
    if (!inside && out.buf[b] != out_before[b]) {
      ADD_FAILURE() << "byte " << b << " outside the out view was written";
      break;
    }
  }

  // in place: the same numbers; gaps and pass-through dims keep their bits
  Rows y = x;
  rope_apply(y.view(c.dtype, c.tokens, c.heads, c.head_dim), pos.view(c.pos_dtype), c.spec, c.factor);
  *worst = std::max(*worst, check_against_reference(c, x, y, pv, m));
  for (int t = 0; t < c.tokens; ++t)
    for (int h = 0; h < c.heads; ++h)
      for (int d = 0; d < c.head_dim; ++d)
        if (std::memcmp(y.buf.data() + (t * y.st + h * y.sh + d) * es,
                        out.buf.data() + (t * out.st + h * out.sh + d) * es, es) != 0) {
          ADD_FAILURE() << "in place and out of place differ at " << t << "," << h << "," << d;
          return;
        }
  for (int64_t e = 0; e < int64_t(x.buf.size() / es); ++e) {
    const int64_t t = e / x.st, rem = e % x.st, h = rem / x.sh, d = rem % x.sh;
    if (!(t < c.tokens && h < c.heads && d < c.head_dim)) {
      ASSERT_EQ(0, std::memcmp(x.buf.data() + e * es, y.buf.data() + e * es, es)) << "gap element " << e << " written";
    }
  }
}

std::vector<RopeSpec> variants(int n_rot) {
  std::vector<RopeSpec> v;
  v.push_back(RopeSpec::plain(n_rot, 10000.0));
  RopeSpec lin = RopeSpec::plain(n_rot, 10000.0);
  lin.scaling = RopeScaling::Linear;
  lin.factor = 4.0;
  v.push_back(lin);
  RopeSpec l3 = RopeSpec::llama3_8b();
  l3.n_rot = n_rot;
  v.push_back(l3);
  RopeSpec y = RopeSpec::deepseek_v4_compressed();
  y.n_rot = n_rot;
  y.attention_factor = yarn_attention_factor(y.factor);
  v.push_back(y);
  RopeSpec ff = RopeSpec::plain(n_rot, 500000.0);
  for (int i = 0; i < n_rot / 2; ++i) ff.freq_factors.push_back(1.0f + 0.25f * static_cast<float>(i % 7));
  v.push_back(ff);
  return v;
}

}  // namespace

// Every variant x slice x pairing x dtype x head_dim x partial/full rotary, odd token counts,
// strided and contiguous views, i32 and i64 positions (strided too).
TEST(RopeApply, EveryVariantAgainstFloat64) {
  std::mt19937_64 rng(2024);
  double worst[3] = {0, 0, 0};
  int cases = 0;
  for (int head_dim : {64, 128, 256, 512})
    for (int n_rot : {head_dim, head_dim / 4})
      for (RopeSpec spec : variants(n_rot))
        for (RopeSlice slice : {RopeSlice::Head, RopeSlice::Tail})
          for (RopePairing pairing : {RopePairing::NeoX, RopePairing::Interleaved}) {
            if (n_rot == head_dim && slice == RopeSlice::Tail) continue;  // same dims as Head
            spec.slice = slice;
            spec.pairing = pairing;
            int k = 0;
            for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
              Case c{spec, dt, head_dim, 1 + 2 * ((cases + k) % 4), 1 + (cases + k) % 3, (cases + k) % 2 == 1,
                     (cases + k) % 3 == 0 ? DType::I64 : DType::I32,
                     spec.attention_factor != 1.0 ? RopeAttentionFactor::Apply : RopeAttentionFactor::Skip};
              run_case(c, rng, &worst[k]);
              ++k;
              if (HasFailure()) return;
            }
            ++cases;
          }
  std::printf("rope_apply vs float64: %d specs x 3 dtypes; worst error / tolerance: f32 %.3f, f16 %.3f, bf16 %.3f\n",
              cases, worst[0], worst[1], worst[2]);
}

// The attention factor multiplies the rotated dims only when asked, and only them.
TEST(RopeApply, AttentionFactorOnlyWhenAsked) {
  std::mt19937_64 rng(7);
  RopeSpec s = RopeSpec::deepseek_v4_compressed();
  s.attention_factor = 1.5;
  double worst = 0;
  for (RopeAttentionFactor f : {RopeAttentionFactor::Skip, RopeAttentionFactor::Apply}) {
    Case c{s, DType::F32, 512, 5, 2, false, DType::I32, f};
    run_case(c, rng, &worst);
  }
  // Directly: at position 0 a pure rotation is the identity; with the factor every rotated dim scales by 1.5.
  std::vector<float> x(512), y(512);
  for (int d = 0; d < 512; ++d) x[d] = y[d] = 0.25f * static_cast<float>(d % 17) - 2.0f;
  int32_t p0 = 0;
  TensorRef xt(y.data(), DType::F32, Device::cpu(), {1, 1, 512});
  TensorRef pt(&p0, DType::I32, Device::cpu(), {1});
  rope_apply(xt, pt, s, RopeAttentionFactor::Skip);
  EXPECT_EQ(x, y);
  rope_apply(xt, pt, s, RopeAttentionFactor::Apply);
  for (int d = 0; d < 512; ++d) EXPECT_EQ(y[d], d < 448 ? x[d] : x[d] * 1.5f) << d;
}

// R(p) then R(d) equals R(p + d), and R(-p) undoes R(p), for every pairing, in f32 and f16.
// Tolerance: each side carries the f32 angle error of its angles (|p| + |d| + |p + d|) * w * 2^-22
// plus 2^-20 of rotation rounding, plus two storage roundings for f16.
TEST(RopeApply, RotationsCompose) {
  std::mt19937_64 rng(99);
  for (RopeSpec spec : {RopeSpec::llama3_8b(), RopeSpec::deepseek_v4_compressed(), RopeSpec::deepseek_v4_window()})
    for (DType dt : {DType::F32, DType::F16}) {
      const int hd = spec.n_rot == 128 ? 128 : 512, tokens = 9, heads = 2;
      Rows x = make_rows(dt, tokens, heads, hd, false, rng);
      std::vector<int64_t> p = random_positions(tokens, rng), d(tokens), pd(tokens);
      std::uniform_int_distribution<int64_t> du(-5000, 5000);
      for (int t = 0; t < tokens; ++t) {
        d[t] = du(rng);
        pd[t] = p[t] + d[t];
      }
      Positions P = make_positions(p, DType::I64, false), D = make_positions(d, DType::I32, true),
                PD = make_positions(pd, DType::I64, false);
      Rows a = x, b = x;
      rope_apply(a.view(dt, tokens, heads, hd), P.view(DType::I64), spec, RopeAttentionFactor::Skip);
      rope_apply(a.view(dt, tokens, heads, hd), D.view(DType::I32), spec, RopeAttentionFactor::Skip);
      rope_apply(b.view(dt, tokens, heads, hd), PD.view(DType::I64), spec, RopeAttentionFactor::Skip);
      const std::vector<double> w = rope_ref::freqs(spec);
      double worst = 0;
      for (int t = 0; t < tokens; ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < spec.n_rot / 2; ++i) {
            const int64_t base = t * x.st + h * x.sh;
            const int da = rope_ref::dim0(spec, hd, i), db = rope_ref::dim1(spec, hd, i);
            const double r = std::abs(load(dt, x.buf.data(), base + da)) + std::abs(load(dt, x.buf.data(), base + db));
            const double angles = (std::abs(double(p[t])) + std::abs(double(d[t])) + std::abs(double(pd[t]))) * w[i];
            const double tol = r * (angles * std::ldexp(1.0, -22) + std::ldexp(1.0, -20) +
                                    3 * rope_ref::unit_roundoff(dt)) + 1e-30;
            for (int dd : {da, db}) {
              const double err = std::abs(load(dt, a.buf.data(), base + dd) - load(dt, b.buf.data(), base + dd));
              worst = std::max(worst, err / tol);
              ASSERT_LE(err, tol) << spec.describe() << " " << dtype_name(dt) << " t " << t << " dim " << dd;
            }
          }
      // and back: R(-(p + d)) returns the original up to the same bound
      std::vector<int64_t> neg(tokens);
      for (int t = 0; t < tokens; ++t) neg[t] = -pd[t];
      Positions N = make_positions(neg, DType::I32, false);
      rope_apply(b.view(dt, tokens, heads, hd), N.view(DType::I32), spec, RopeAttentionFactor::Skip);
      for (int64_t e = 0; e < tokens * x.st; ++e) {
        const double xv = load(dt, x.buf.data(), e);
        EXPECT_NEAR(load(dt, b.buf.data(), e), xv, 2 * (std::ldexp(1.0, -13) + 2 * rope_ref::unit_roundoff(dt)) * 2 +
                                                        300000.0 * std::ldexp(1.0, -22) * 4);
      }
      std::printf("compose %s %s: worst error / tolerance %.3f\n", spec.describe().c_str(),
                  std::string(dtype_name(dt)).c_str(), worst);
    }
}

TEST(RopeApply, EmptyInputsAreANoOp) {
  RopeSpec s = RopeSpec::plain(64, 10000.0);
  TensorRef x(nullptr, DType::F16, Device::cpu(), {0, 8, 64});
  TensorRef p(nullptr, DType::I32, Device::cpu(), {0});
  EXPECT_NO_THROW(rope_apply(x, p, s, RopeAttentionFactor::Skip));
}

// Every bad argument: the right code, a message naming it, and no byte of x or out changed.
TEST(RopeApply, BadArgumentsWriteNothing) {
  std::mt19937_64 rng(5);
  const int T = 3, H = 2, D = 64;
  Rows x = make_rows(DType::F32, T, H, D, false, rng);
  Rows o = make_rows(DType::F32, T, H, D, false, rng);
  Rows o16 = make_rows(DType::F16, T, H, D, false, rng);
  Positions p = make_positions({1, 2, 3}, DType::I32, false);
  std::vector<float> posf = {1, 2, 3};
  const std::vector<uint8_t> x0 = x.buf, o0 = o.buf, o160 = o16.buf;
  const RopeSpec good = RopeSpec::plain(64, 10000.0);
  TensorRef xv = x.view(DType::F32, T, H, D), ov = o.view(DType::F32, T, H, D), pv = p.view(DType::I32);

  auto expect_error = [&](const char* what, ErrorCode code, const char* needle, auto&& call) {
    try {
      call();
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
    EXPECT_EQ(x.buf, x0) << what << " wrote x";
    EXPECT_EQ(o.buf, o0) << what << " wrote out";
    EXPECT_EQ(o16.buf, o160) << what << " wrote out";
  };
  const auto Skip = RopeAttentionFactor::Skip;
  const auto IA = ErrorCode::InvalidArgument;

  RopeSpec odd = good;
  odd.n_rot = 63;
  expect_error("odd n_rot", IA, "n_rot must be even", [&] { rope_apply(xv, pv, odd, Skip, ov); });
  RopeSpec big = RopeSpec::plain(128, 10000.0);
  expect_error("n_rot > head_dim", IA, "n_rot = 128 does not fit head_dim = 64", [&] { rope_apply(xv, pv, big, Skip); });
  RopeSpec bad_theta = RopeSpec::plain(64, 0.5);
  expect_error("bad theta", IA, "theta", [&] { rope_apply(xv, pv, bad_theta, Skip, ov); });
  RopeSpec bad_yarn = RopeSpec::deepseek_v4_compressed();
  bad_yarn.original_max_position = 0;
  expect_error("bad yarn", IA, "original_max_position", [&] { rope_apply(xv, pv, bad_yarn, Skip); });

  expect_error("out dtype", IA, "out must be f32, got f16",
               [&] { rope_apply(xv, pv, good, Skip, o16.view(DType::F16, T, H, D)); });
  TensorRef xi(x.buf.data(), DType::I32, Device::cpu(), {T, H, D});
  expect_error("x dtype", IA, "x must be f32, f16 or bf16, got i32", [&] { rope_apply(xi, pv, good, Skip); });
  TensorRef pf(posf.data(), DType::F32, Device::cpu(), {T});
  expect_error("positions dtype", IA, "positions must be i32 or i64, got f32", [&] { rope_apply(xv, pf, good, Skip); });

  TensorRef p_short(p.buf.data(), DType::I32, Device::cpu(), {T - 1});
  expect_error("positions size", IA, "positions.shape[0] must be 3", [&] { rope_apply(xv, p_short, good, Skip); });
  TensorRef o_small(o.buf.data(), DType::F32, Device::cpu(), {T, H - 1, D});
  expect_error("out shape", IA, "out.shape[1] must be 2", [&] { rope_apply(xv, pv, good, Skip, o_small); });
  TensorRef x2(x.buf.data(), DType::F32, Device::cpu(), {T * H, D});
  expect_error("x rank", IA, "x must have 3 dims", [&] { rope_apply(x2, pv, good, Skip); });
  TensorRef x_ns(x.buf.data(), DType::F32, Device::cpu(), {T, H, D / 2}, {H * D, D, 2});
  RopeSpec s32 = RopeSpec::plain(32, 10000.0);
  expect_error("last dim strided", IA, "stride 1 in its last dim", [&] { rope_apply(x_ns, pv, s32, Skip); });
  TensorRef x_neg(x.buf.data() + 4 * H * D * 2, DType::F32, Device::cpu(), {T, H, D}, {-H * D, D, 1});
  expect_error("negative stride", IA, "x.stride[0] must be >= 0", [&] { rope_apply(x_neg, pv, good, Skip); });
  TensorRef x_alias(x.buf.data(), DType::F32, Device::cpu(), {T, H, D}, {D, 0, 1});
  expect_error("aliased rows in place", IA, "overlap, so writes would race", [&] { rope_apply(x_alias, pv, good, Skip); });
  TensorRef o_overlap(x.buf.data() + 4 * D, DType::F32, Device::cpu(), {T, H, D});
  expect_error("partial overlap", IA, "overlaps x", [&] { rope_apply(xv, pv, good, Skip, o_overlap); });
  TensorRef p_inside(x.buf.data() + 4 * D, DType::I32, Device::cpu(), {T});
  expect_error("positions inside x", IA, "overlap the rows being written", [&] { rope_apply(xv, p_inside, good, Skip); });
  TensorRef x_null(nullptr, DType::F32, Device::cpu(), {T, H, D});
  expect_error("null x", IA, "x has no data pointer", [&] { rope_apply(x_null, pv, good, Skip); });

  // devices: positions elsewhere than x; a CUDA x in a build without CUDA
  TensorRef p_cuda(p.buf.data(), DType::I32, Device::cuda(0), {T});
  expect_error("positions device", IA, "x is on cpu but positions is on cuda:0", [&] { rope_apply(xv, p_cuda, good, Skip); });
  TensorRef o_cuda(o.buf.data(), DType::F32, Device::cuda(0), {T, H, D});
  expect_error("out device", IA, "x is on cpu but out is on cuda:0", [&] { rope_apply(xv, pv, good, Skip, o_cuda); });
#if !KVCORE_WITH_CUDA
  TensorRef x_cuda(x.buf.data(), DType::F32, Device::cuda(0), {T, H, D});
  expect_error("cuda without backend", ErrorCode::NotSupported, "no CUDA backend",
               [&] { rope_apply(x_cuda, p_cuda, good, Skip); });
#endif

  // a bad prebuilt table
  math::RopeTable t = make_rope_table(good, D);
  t.layout.first_dim = 8;
  expect_error("table off the row", IA, "do not fit head_dim = 64", [&] { rope_apply(xv, pv, t, Skip); });
  t = make_rope_table(good, D);
  t.freq[3] = NAN;
  expect_error("table NaN freq", IA, "table.freq[3]", [&] { rope_apply(xv, pv, t, Skip); });
  t = make_rope_table(good, D);
  t.attention_factor = -1;
  expect_error("table factor", IA, "attention_factor", [&] { rope_apply(xv, pv, t, Skip); });
}
