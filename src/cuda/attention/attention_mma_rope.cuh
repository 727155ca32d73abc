// Rope on read in the tensor-core attention kernel: a warp rotates its tile's 16 K rows at
// their cached positions into 16-bit hi + lo tiles, which the score mma reads as
// K_hi q_hi + K_hi q_lo + K_lo q_hi (~f32 accuracy, like the unrotated path).
//
// 16-bit pages rotate in place (hi = the stage's K tile). FP8 pages cannot (their pairs cross
// scale blocks, and a rotated code is no code): the codes are decoded, scaled by their block's
// scale relative to the row's largest (a power of two for UE8M0, exactly 1 for per-row
// scales), rotated and written as f16 hi + lo; the score then takes that largest scale.
// |rotated| <= 2 * 448 keeps every value inside f16's range.
//
// Layouts whose rotated dims fill whole 8-dim chunks (first_dim % 8 == 0, n_rot % 16 == 0:
// every common model) rotate 8 pairs per lane from two 16-byte chunks: one 16-byte load and
// two 16-byte stores per 8 dims instead of a 2-byte load and two 2-byte stores per dim (an
// element-by-element rotation leaves 16-bit rope-on-read far below the read bandwidth).
// Other layouts are served by the SIMT kernel.
#pragma once
#include "cuda/attention/mma_primitives.cuh"
#include "kvcore/math/rope.hpp"

namespace kvcore::ops::cuda::mma_attn {

KVCORE_HD bool rope_chunk_aligned(const math::RopeLayout& l) {
  return l.first_dim % 8 == 0 && l.n_rot % 16 == 0;
}

// 8 dims d .. d + 7 (d % 8 == 0) of source tile row r as f32. 16-bit: the tile holds HD * 2
// bytes a row. FP8: HD bytes a row; each code times its block's ratio.
template <int HD, math::KvElem KV>
__device__ __forceinline__ void rope_load8(const unsigned char* src, int r, int d, const float* ratio, float (&x)[8]) {
  if constexpr (KV == math::KvElem::E4M3) {
    const uint2 w = *reinterpret_cast<const uint2*>(src + swz<HD / 16>(r, d / 16) + d % 16);
    const float f = ratio[d / 64];
    const uint32_t h[4] = {e4m3x2_to_f16x2(w.x), e4m3x2_hi_to_f16x2(w.x), e4m3x2_to_f16x2(w.y), e4m3x2_hi_to_f16x2(w.y)};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __half2 hh;
      memcpy(&hh, &h[k], 4);
      const float2 v = __half22float2(hh);
      x[2 * k] = v.x * f, x[2 * k + 1] = v.y * f;
    }
  } else {
    const uint4 w = *reinterpret_cast<const uint4*>(src + swz<HD / 8>(r, d / 8));
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (KV == math::KvElem::BF16) {
        x[2 * k] = __uint_as_float(u[k] << 16), x[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
      } else {
        __half2 hh;
        memcpy(&hh, &u[k], 4);
        const float2 v = __half22float2(hh);
        x[2 * k] = v.x, x[2 * k + 1] = v.y;
      }
    }
  }
}

// y -> hi and lo halves (the mma type) at byte offset `off` of both tiles.
template <bool BF16>
__device__ __forceinline__ void rope_store8(unsigned char* hi, unsigned char* lo, int off, const float (&y)[8]) {
  uint4 h, l;
  split2<BF16>(y[0], y[1], h.x, l.x);
  split2<BF16>(y[2], y[3], h.y, l.y);
  split2<BF16>(y[4], y[5], h.z, l.z);
  split2<BF16>(y[6], y[7], h.w, l.w);
  *reinterpret_cast<uint4*>(hi + off) = h;
  *reinterpret_cast<uint4*>(lo + off) = l;
}

// Pairs (x0[k], x1[k]) rotated by angle pos * f[k] (the f32 angle of rope.hpp). The
// rotation's magnitude is applied to q instead (attention_mma.cuh).
__device__ __forceinline__ void rope_rotate8(float pos, const float* f, float (&x0)[8], float (&x1)[8]) {
  const float4 fa = *reinterpret_cast<const float4*>(f), fb = *reinterpret_cast<const float4*>(f + 4);
  const float fr[8] = {fa.x, fa.y, fa.z, fa.w, fb.x, fb.y, fb.z, fb.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float sn, cs;
    sincos_reduced(math::rope_angle(pos, fr[k]), &sn, &cs);
    const float a = x0[k], b = x1[k];
    x0[k] = a * cs - b * sn;
    x1[k] = a * sn + b * cs;
  }
}

// Rotation units of a row: unit u holds pairs 8u .. 8u + 7 in 8-dim chunks ca and cb.
template <int HD, math::KvElem KV, bool INTERLEAVED>
__device__ __forceinline__ void rope_rows_units(const math::RopeLayout& L, const float* freq, float pos, int r, int u0,
                                                const unsigned char* src, unsigned char* hi, unsigned char* lo,
                                                const float* ratio) {
  constexpr bool kBf16 = KV == math::KvElem::BF16;  // FP8 rows become f16
  const int units = L.n_rot / 16, fc = L.first_dim / 8;
  for (int u = u0; u < units; u += 2) {
    const int ca = INTERLEAVED ? fc + 2 * u : fc + u;
    const int cb = INTERLEAVED ? ca + 1 : ca + units;
    float a[8], b[8];
    rope_load8<HD, KV>(src, r, 8 * ca, ratio, a);
    rope_load8<HD, KV>(src, r, 8 * cb, ratio, b);
    if constexpr (INTERLEAVED) {  // pairs (2i, 2i + 1): even dims of a then b, odd dims
      float x0[8], x1[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) x0[k] = a[2 * k], x1[k] = a[2 * k + 1], x0[4 + k] = b[2 * k], x1[4 + k] = b[2 * k + 1];
      rope_rotate8(pos, freq + 8 * u, x0, x1);
#pragma unroll
      for (int k = 0; k < 4; ++k) a[2 * k] = x0[k], a[2 * k + 1] = x1[k], b[2 * k] = x0[4 + k], b[2 * k + 1] = x1[4 + k];
    } else {  // NeoX pairs (i, i + n_rot / 2): chunk ca with chunk cb, element by element
      rope_rotate8(pos, freq + 8 * u, a, b);
    }
    rope_store8<kBf16>(hi, lo, swz<HD / 8>(r, ca), a);
    rope_store8<kBf16>(hi, lo, swz<HD / 8>(r, cb), b);
  }
}

// Rotates the warp's 16-row K tile: lane -> row lane % 16, every other unit (magnitude 1). `src`: the
// stage's K tile; `hi`, `lo`: [16][HD] 16-bit tiles swizzled like a 16-bit stage tile (for
// 16-bit pages hi == src). `ratio`: this row's FP8 block scales over its largest (unused
// for 16-bit pages). Rows of no cell (live false) are left alone: their scores are masked.
template <int HD, math::KvElem KV>
__device__ __forceinline__ void rope_rotate_tile(const math::RopeLayout& L, const float* freq, float pos, bool live,
                                                 int lane, const unsigned char* src, unsigned char* hi,
                                                 unsigned char* lo, const float* ratio) {
  if (!live) return;
  const int r = lane & 15, u0 = lane >> 4;
  if (L.interleaved) rope_rows_units<HD, KV, true>(L, freq, pos, r, u0, src, hi, lo, ratio);
  else rope_rows_units<HD, KV, false>(L, freq, pos, r, u0, src, hi, lo, ratio);
  if constexpr (KV == math::KvElem::E4M3) {  // the dims RoPE leaves alone, decoded into the tiles too
    const int fc = L.first_dim / 8, rot_chunks = L.n_rot / 8;
    for (int u = u0; u < HD / 8 - rot_chunks; u += 2) {
      const int c = u < fc ? u : u + rot_chunks;
      float a[8];
      rope_load8<HD, KV>(src, r, 8 * c, ratio, a);
      rope_store8<false>(hi, lo, swz<HD / 8>(r, c), a);
    }
  }
}

}  // namespace kvcore::ops::cuda::mma_attn
