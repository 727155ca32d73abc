// rope_apply on the CPU with SIMD: a contiguous run of tokens per thread (OpenMP); the
// cos and sin of every pair computed once per token in double lanes (simd_rope-inl.h),
// between the heads of the token before, and reused for all heads; pairs rotate a
// vector of pairs at a time (NeoX directly, interleaved split and joined again). Every
// value has the scalar path's bits: the same f32 operations per element in the same
// order, the same roundings.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rope_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/rope_simd.hpp"
#include "cpu/simd_rope-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

int64_t PositionAt(const RopeApplyParams& p, int64_t t) {
  return p.pos_dtype == DType::I32 ? static_cast<const int32_t*>(p.positions)[t * p.pos_stride]
                                   : static_cast<const int64_t*>(p.positions)[t * p.pos_stride];
}

// Each thread rotates a contiguous run of tokens. The rotation streams memory and the
// cos/sin are arithmetic alone, so the two are interleaved: while the heads of token t
// rotate, each head is followed by a slice of token t + 1's cos/sin (a run of steps of
// RopeCosSinRange), and the out-of-order core overlaps that arithmetic with the
// rotation's loads and stores instead of leaving memory idle while it runs.
template <class T>
void RotateRows(const RopeApplyParams& p) {
  const math::RopeLayout& l = p.table.layout;
  const int32_t n_pairs = l.n_pairs();
  const int32_t padded = (n_pairs + 15) / 16 * 16;
  const int32_t rot_end = l.first_dim + l.n_rot;
  const int32_t step = RopeCosSinStep();
  const int64_t steps = (n_pairs + step - 1) / step;
  const int64_t steps_per_head = (steps + p.heads - 1) / std::max<int64_t>(p.heads, 1);
  std::vector<float> freq(static_cast<size_t>(padded), 0.0f);
  std::memcpy(freq.data(), p.table.freq, sizeof(float) * n_pairs);
  const int64_t work = p.tokens * p.heads * p.head_dim;
  const bool bounded = std::abs(p.magnitude) <= 0x1p100f;  // |cos|, |sin| <= 1: RotatePairs' bound holds
#pragma omp parallel if (work > (1 << 15))
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t t0 = p.tokens * me / threads, t1 = p.tokens * (me + 1) / threads;
    // two rows of cos / sin: the token being rotated and the next one
    std::vector<float> angles(4 * static_cast<size_t>(padded));
    float* cs = angles.data();
    float* sn = cs + padded;
    float* cs_next = sn + padded;
    float* sn_next = cs_next + padded;
    if (t0 < t1) RopeCosSinRow(freq.data(), n_pairs, math::rope_position(PositionAt(p, t0)), p.magnitude, cs, sn);
    for (int64_t t = t0; t < t1; ++t) {
      const bool next = t + 1 < t1;
      const float next_pos = next ? math::rope_position(PositionAt(p, t + 1)) : 0.0f;
      int64_t done = 0;  // steps of the next token's row computed so far
      for (int64_t h = 0; h < p.heads; ++h) {
        const T* xr = static_cast<const T*>(p.x) + t * p.x_stride_token + h * p.x_stride_head;
        T* orow = static_cast<T*>(p.out) + t * p.out_stride_token + h * p.out_stride_head;
        if (!p.in_place) {  // pass-through dims keep their exact bits
          std::memcpy(orow, xr, sizeof(T) * l.first_dim);
          std::memcpy(orow + rot_end, xr + rot_end, sizeof(T) * (p.head_dim - rot_end));
        }
        RotatePairs(l, xr, orow, cs, sn, bounded);
        if (next && done < steps) {
          const int64_t upto = std::min(steps, done + steps_per_head);
          RopeCosSinRange(freq.data(), static_cast<int32_t>(done * step),
                          static_cast<int32_t>(std::min<int64_t>(upto * step, n_pairs)), next_pos, p.magnitude, cs_next,
                          sn_next);
          done = upto;
        }
      }
      if (next && done < steps)  // no heads
        RopeCosSinRange(freq.data(), static_cast<int32_t>(done * step), n_pairs, next_pos, p.magnitude, cs_next, sn_next);
      std::swap(cs, cs_next);
      std::swap(sn, sn_next);
    }
  }
}

}  // namespace

void RopeApply(const RopeApplyParams& p) {
  switch (p.dtype) {
    case DType::F32: return RotateRows<float>(p);
    case DType::F16: return RotateRows<f16>(p);
    case DType::BF16: return RotateRows<bf16>(p);
    default: break;  // validated by the entry point
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(RopeApply);
void rope_apply_simd(const RopeApplyParams& p) { HWY_DYNAMIC_DISPATCH(RopeApply)(p); }
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
