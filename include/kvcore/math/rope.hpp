// RoPE rotation, shared by every backend. What is rotated (which dims, which
// pairing) is described by RopeLayout; the per-pair frequencies come from a
// table built once on the host (rope_spec.hpp) in double precision.
//
// Angle convention: angle = float(position) * freq[i], in f32, as HF
// transformers and llama.cpp compute it. A shift rotates by delta * freq[i]:
// rotations compose exactly in real arithmetic, so rotating by delta a key
// stored at p gives the key at p + delta up to rounding.
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

KVCORE_HD void sincos_f32(float a, float* s, float* c) {
#if defined(__CUDA_ARCH__)
  sincosf(a, s, c);
#else
  *s = std::sin(a);
  *c = std::cos(a);
#endif
}

// (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a)
KVCORE_HD void rotate_pair(float& x0, float& x1, float c, float s) {
  const float y0 = x0 * c - x1 * s;
  const float y1 = x0 * s + x1 * c;
  x0 = y0;
  x1 = y1;
}

KVCORE_HD float rope_angle(float position, float freq) { return position * freq; }

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
    float s, c;
    sincos_f32(rope_angle(position, t.freq[i]), &s, &c);
    rotate_pair(row[t.layout.dim0(i)], row[t.layout.dim1(i)], c * magnitude, s * magnitude);
  }
}

}  // namespace kvcore::math
