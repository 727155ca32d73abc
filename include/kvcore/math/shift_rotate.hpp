// Shift rotations, shared by the CPU and CUDA shift kernels: an accurate
// angle for `delta * w` (delta can be tens of thousands of positions) and the
// per-head rotation of one K head in each supported storage format:
//   plain f32 / f16 / bf16 rows, the DeepSeek-V4 packed row (only the bf16
//   rope tail rotates), and fully-FP8 rows (e4m3 codes + one ue8m0 scale per
//   64 dims: dequantize, rotate, requantize the touched 64-blocks).
// A shift is a pure rotation: no magnitude (YaRN attention factor) here.
//
// The per-head routines are written for `Lanes` workers that split the pairs
// among themselves: one serial worker on the CPU, a CUDA warp on the GPU.
#pragma once
#include <cmath>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"

namespace kvcore::math {

// sin and cos of `delta * w` in f32 with an accurate range reduction: the
// product is split exactly into hi + lo (an FMA gives the rounding error of
// hi) and 2*pi is subtracted in three parts, so the angle error stays near
// one f32 ulp of the *reduced* angle even for |delta * w| ~ 1e5, where a
// plain f32 product would already be off by ~4e-3 rad. Needs |delta| < 2^24.
KVCORE_HD void shift_sincos(int32_t delta, float w, float* s, float* c) {
  const float d = static_cast<float>(delta);
  const float hi = d * w;
#if defined(__CUDA_ARCH__)
  const float lo = fmaf(d, w, -hi);
  const float k = rintf(hi * 0.159154943091895336f);
  float r = fmaf(-k, 6.28318548202514648f, hi);
  r = fmaf(-k, -1.74845553146951715e-07f, r);
  r = fmaf(-k, -6.86049804e-15f, r);
#else
  const float lo = std::fma(d, w, -hi);
  const float k = std::nearbyint(hi * 0.159154943091895336f);
  float r = std::fma(-k, 6.28318548202514648f, hi);
  r = std::fma(-k, -1.74845553146951715e-07f, r);
  r = std::fma(-k, -6.86049804e-15f, r);
#endif
  sincos_f32(r + lo, s, c);
}

// A single worker: the CPU path.
struct ShiftSerialLanes {
  int32_t lane = 0;
  int32_t count = 1;
  KVCORE_HD void sync() const {}
  KVCORE_HD float reduce_max(float v) const { return v; }
};

// Rotate pairs of one head stored as T (float, f16, bf16). `elems` points at
// the element that holds dim `dim_base`; cos_t/sin_t hold one entry per pair.
template <class T, class Lanes>
KVCORE_HD void shift_rotate_head_plain(T* elems, int32_t dim_base, const RopeLayout& l, const float* cos_t,
                                       const float* sin_t, const Lanes& lanes) {
  for (int32_t i = lanes.lane; i < l.n_pairs(); i += lanes.count) {
    T* p0 = elems + (l.dim0(i) - dim_base);
    T* p1 = elems + (l.dim1(i) - dim_base);
    float x0 = to_f32(*p0), x1 = to_f32(*p1);
    rotate_pair(x0, x1, cos_t[i], sin_t[i]);
    *p0 = from_f32<T>(x0);
    *p1 = from_f32<T>(x1);
  }
}

// One DeepSeek-V4 packed row (584 bytes): the bf16 rope tail holds dims
// [448, 512); the layout must rotate only those. FP8 bytes and scales stay.
template <class Lanes>
KVCORE_HD void shift_rotate_head_dsv4(uint8_t* row, const RopeLayout& l, const float* cos_t, const float* sin_t,
                                      const Lanes& lanes) {
  shift_rotate_head_plain(reinterpret_cast<bf16*>(row + Dsv4RowLayout::kRopeOffset), Dsv4RowLayout::kNope, l, cos_t,
                          sin_t, lanes);
}

// The 64-blocks [b0, b1] of an FP8 head that hold rotated dims.
KVCORE_HD int32_t shift_fp8_first_block(const RopeLayout& l) { return l.first_dim / kFp8Block; }
KVCORE_HD int32_t shift_fp8_last_block(const RopeLayout& l) { return (l.first_dim + l.n_rot - 1) / kFp8Block; }

// One FP8 head: e4m3 codes [head_dim], ue8m0 scales [head_dim / 64]. Blocks
// without rotated dims are not touched (byte-identical). Each touched block
// is dequantized into `scratch` (64 floats per touched block), rotated, and
// requantized with a fresh scale from its new amax, exactly as a write would
// quantize it: non-rotated dims sharing a block keep their codes unless the
// block's scale changes.
template <class Lanes>
KVCORE_HD void shift_rotate_head_fp8(uint8_t* codes, uint8_t* scales, const RopeLayout& l, const float* cos_t,
                                     const float* sin_t, float* scratch, const Lanes& lanes) {
  const int32_t b0 = shift_fp8_first_block(l), b1 = shift_fp8_last_block(l);
  const int32_t d0 = b0 * kFp8Block, d1 = (b1 + 1) * kFp8Block;
  for (int32_t d = d0 + lanes.lane; d < d1; d += lanes.count)
    scratch[d - d0] = e4m3_decode(codes[d]) * ue8m0_decode(scales[d / kFp8Block]);
  lanes.sync();
  for (int32_t i = lanes.lane; i < l.n_pairs(); i += lanes.count) {
    float& x0 = scratch[l.dim0(i) - d0];
    float& x1 = scratch[l.dim1(i) - d0];
    rotate_pair(x0, x1, cos_t[i], sin_t[i]);
  }
  lanes.sync();
  for (int32_t b = b0; b <= b1; ++b) {
    float amax = 0.0f;
    for (int32_t d = b * kFp8Block + lanes.lane; d < (b + 1) * kFp8Block; d += lanes.count)
      amax = finite_abs_max(amax, scratch[d - d0]);
    amax = lanes.reduce_max(amax);
    const int k = e4m3_scale_exponent(amax);
    const float inv = pow2f(-k);
    for (int32_t d = b * kFp8Block + lanes.lane; d < (b + 1) * kFp8Block; d += lanes.count)
      codes[d] = e4m3_encode(e4m3_scaled(scratch[d - d0], inv));
    if (lanes.lane == 0) scales[b] = ue8m0_encode(k);
  }
  lanes.sync();
}

}  // namespace kvcore::math
