// RoPE rotation, shared by every backend. What is rotated (which dims, which
// pairing) is described by RopeLayout; the per-pair frequencies come from a
// table built once on the host (rope_spec.hpp) in double precision.
//
// Angle convention: angle = float(position) * freq[i], in f32, as HF
// transformers and llama.cpp compute it. A shift rotates by delta * freq[i]:
// rotations compose exactly in real arithmetic, so rotating by delta a key
// stored at p gives the key at p + delta up to rounding.
//
// Same bits on every backend: sin/cos are computed here (argument reduction and
// polynomials in double, rounded once to f32) instead of by libm or CUDA's
// sincosf, and every float operation is an explicit IEEE operation (no FMA
// contraction on the device), so the CPU and CUDA kernels that call these
// helpers produce identical results for identical inputs.
#pragma once
#include <cmath>

#include "kvcore/math/hd.hpp"

namespace kvcore::math {

// Which dims of a head_dim row rotate, and how they pair. Plain data, so it
// travels inside kernel Params.
struct RopeLayout {
  int32_t n_rot = 0;        // rotated dims (even); n_rot/2 pairs
  int32_t first_dim = 0;    // 0 for a head slice, head_dim - n_rot for a tail slice
  int32_t interleaved = 0;  // 1: pairs (2i, 2i+1); 0: NeoX pairs (i, i + n_rot/2)

  constexpr KVCORE_HD int32_t n_pairs() const { return n_rot / 2; }
  constexpr KVCORE_HD int32_t dim0(int32_t i) const { return first_dim + (interleaved ? 2 * i : i); }
  constexpr KVCORE_HD int32_t dim1(int32_t i) const {
    return first_dim + (interleaved ? 2 * i + 1 : i + n_rot / 2);
  }
  constexpr KVCORE_HD bool rotates(int32_t d) const { return d >= first_dim && d < first_dim + n_rot; }
};

// ---- exact IEEE operations (the device would otherwise contract a*b+c into an FMA) ----
namespace rope_detail {
KVCORE_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVCORE_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVCORE_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KVCORE_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KVCORE_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KVCORE_HD double dsub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
KVCORE_HD double drint(double a) {
#if defined(__CUDA_ARCH__)
  return rint(a);
#else
  return std::nearbyint(a);  // round half to even in the default rounding mode, like rint on the device
#endif
}
KVCORE_HD double dfmod(double a, double b) {  // exact in IEEE arithmetic, so identical on both sides
#if defined(__CUDA_ARCH__)
  return fmod(a, b);
#else
  return std::fmod(a, b);
#endif
}
KVCORE_HD double dfloor(double a) {
#if defined(__CUDA_ARCH__)
  return floor(a);
#else
  return std::floor(a);
#endif
}
}  // namespace rope_detail

// sin and cos of an f32 angle, rounded once from double: within half an f32 ulp
// of the true values for every |a| < 2^26 (swept exhaustively in
// tests/exhaustive/rope_sincos_exhaustive_test.cpp) and accurate to 2^28; beyond,
// a reduction modulo the double 2*pi keeps results finite, deterministic and
// close. NaN or inf give NaN.
KVCORE_HD void sincos_f32(float a, float* s, float* c) {
  using namespace rope_detail;
  double x = a;
  if (!(x - x == 0.0)) {  // NaN or infinity
    *s = *c = static_cast<float>(x - x);
    return;
  }
  // Beyond 2^28 the three-part reduction below would lose exactness: first take x modulo
  // the double nearest 2*pi (exact), off by |x| * 2.5e-16 rad, far below such an f32 angle's ulp.
  if (x > 268435456.0 || x < -268435456.0) x = dfmod(x, 6.283185307179586);
  // k = nearest multiple of pi/2; r = x - k*pi/2 with pi/2 split in three 24-bit
  // parts, so each k*part is exact for |k| < 2^29 and the subtractions cancel exactly.
  constexpr double kTwoOverPi = 0.63661977236758134308;
  constexpr double kPio2A = 0x1.921fb4p+0;          // pi/2: first 24 bits
  constexpr double kPio2B = 0x1.4442dp-24;          // next 24 bits
  constexpr double kPio2C = 0x1.8469898cc517p-48;   // the rest, rounded to double
  const double k = drint(dmul(x, kTwoOverPi));
  double r = dsub(x, dmul(k, kPio2A));
  r = dsub(r, dmul(k, kPio2B));
  r = dsub(r, dmul(k, kPio2C));
  const double z = dmul(r, r);
  // Taylor series to degree 13 / 14: truncation below 2e-14 for |r| <= pi/4 (+ a rounding margin).
  double ps = 1.0 / 6227020800.0;  // 1/13!
  ps = dadd(dmul(ps, z), -1.0 / 39916800.0);
  ps = dadd(dmul(ps, z), 1.0 / 362880.0);
  ps = dadd(dmul(ps, z), -1.0 / 5040.0);
  ps = dadd(dmul(ps, z), 1.0 / 120.0);
  ps = dadd(dmul(ps, z), -1.0 / 6.0);
  const double sr = dadd(r, dmul(dmul(r, z), ps));
  double pc = -1.0 / 87178291200.0;  // -1/14!
  pc = dadd(dmul(pc, z), 1.0 / 479001600.0);
  pc = dadd(dmul(pc, z), -1.0 / 3628800.0);
  pc = dadd(dmul(pc, z), 1.0 / 40320.0);
  pc = dadd(dmul(pc, z), -1.0 / 720.0);
  pc = dadd(dmul(pc, z), 1.0 / 24.0);
  pc = dadd(dmul(pc, z), -0.5);
  const double cr = dadd(1.0, dmul(z, pc));
  // quadrant = k mod 4, computed in double so any finite k is safe
  const int q = static_cast<int>(dsub(k, dmul(4.0, dfloor(dmul(k, 0.25)))));
  const double sv = (q == 0) ? sr : (q == 1) ? cr : (q == 2) ? -sr : -cr;
  const double cv = (q == 0) ? cr : (q == 1) ? -sr : (q == 2) ? -cr : sr;
  *s = static_cast<float>(sv);
  *c = static_cast<float>(cv);
}

// (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a)
KVCORE_HD void rotate_pair(float& x0, float& x1, float c, float s) {
  using namespace rope_detail;
  const float y0 = fsub(fmul(x0, c), fmul(x1, s));
  const float y1 = fadd(fmul(x0, s), fmul(x1, c));
  x0 = y0;
  x1 = y1;
}

KVCORE_HD float rope_angle(float position, float freq) { return rope_detail::fmul(position, freq); }

// A stored integer position as the f32 the angle is computed from (round to
// nearest, as HF's position_ids.float()): exact for |p| <= 2^24.
KVCORE_HD float rope_position(int64_t p) { return static_cast<float>(p); }

// cos and sin of pair `freq` at `position`, both scaled by `magnitude`.
KVCORE_HD void rope_cos_sin(float position, float freq, float magnitude, float* c, float* s) {
  float sv, cv;
  sincos_f32(rope_angle(position, freq), &sv, &cv);
  *c = rope_detail::fmul(cv, magnitude);
  *s = rope_detail::fmul(sv, magnitude);
}

// Everything a kernel needs to rotate rows: the layout, the per-pair frequencies
// and the write-time magnitude. Passed by value in kernel Params (about 1 KB).
struct RopeTable {
  static constexpr int32_t kMaxPairs = 256;  // head_dim up to 512 fully rotated
  RopeLayout layout;
  float attention_factor = 1.0f;  // applied by rope_apply only; shifts use 1
  float freq[kMaxPairs];
};

// Rotate the rotated dims of one f32 row (head_dim values) by angle
// `position * freq[i]` per pair, scaling cos and sin by `magnitude`.
KVCORE_HD void rope_rotate_row(float* row, const RopeTable& t, float position, float magnitude) {
  for (int32_t i = 0; i < t.layout.n_pairs(); ++i) {
    float c, s;
    rope_cos_sin(position, t.freq[i], magnitude, &c, &s);
    rotate_pair(row[t.layout.dim0(i)], row[t.layout.dim1(i)], c, s);
  }
}

}  // namespace kvcore::math
