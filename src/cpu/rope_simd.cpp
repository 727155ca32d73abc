// rope_apply on the CPU with SIMD: one token per iteration (OpenMP); the cos and
// sin of every pair computed once per token in double lanes (simd_rope-inl.h)
// and reused for all heads; NeoX pairs rotate a vector of pairs at a time,
// interleaved pairs one pair at a time. Every value has the scalar path's bits:
// the same f32 operations per element in the same order, the same roundings.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rope_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <cstring>
#include <vector>

#include "cpu/rope_simd.hpp"
#include "cpu/simd_rope-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

template <class T>
void RotateHead(const math::RopeLayout& l, const T* xr, T* orow, const float* cs, const float* sn) {
  const int32_t n_pairs = l.n_pairs();
  int32_t i = 0;
  if (!l.interleaved) {
    const hn::ScalableTag<float> df;
    const int32_t N = static_cast<int32_t>(hn::Lanes(df));
    const T* x0p = xr + l.first_dim;
    const T* x1p = x0p + n_pairs;
    T* y0p = orow + l.first_dim;
    T* y1p = y0p + n_pairs;
    for (; i + N <= n_pairs; i += N) {
      const auto x0 = LoadAsF32(df, x0p + i), x1 = LoadAsF32(df, x1p + i);
      const auto c = hn::LoadU(df, cs + i), s = hn::LoadU(df, sn + i);
      // math::rotate_pair: y0 = x0 c - x1 s, y1 = x0 s + x1 c (two products, then the sum)
      const auto y0 = hn::Sub(hn::Mul(x0, c), hn::Mul(x1, s));
      const auto y1 = hn::Add(hn::Mul(x0, s), hn::Mul(x1, c));
      StoreFromF32(df, y0, y0p + i);
      StoreFromF32(df, y1, y1p + i);
    }
  }
  for (; i < n_pairs; ++i) {
    const int32_t d0 = l.dim0(i), d1 = l.dim1(i);
    float x0 = to_f32(xr[d0]), x1 = to_f32(xr[d1]);
    math::rotate_pair(x0, x1, cs[i], sn[i]);
    orow[d0] = from_f32<T>(x0);
    orow[d1] = from_f32<T>(x1);
  }
}

template <class T>
void RotateRows(const RopeApplyParams& p) {
  const math::RopeLayout& l = p.table.layout;
  const int32_t n_pairs = l.n_pairs();
  const int32_t padded = (n_pairs + 15) / 16 * 16;
  const int32_t rot_end = l.first_dim + l.n_rot;
  std::vector<float> freq(static_cast<size_t>(padded), 0.0f);
  std::memcpy(freq.data(), p.table.freq, sizeof(float) * n_pairs);
  const int64_t work = p.tokens * p.heads * p.head_dim;
#pragma omp parallel if (work > (1 << 15))
  {
    std::vector<float> cs(static_cast<size_t>(padded)), sn(static_cast<size_t>(padded));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.tokens; ++t) {
      const int64_t pos = p.pos_dtype == DType::I32 ? static_cast<const int32_t*>(p.positions)[t * p.pos_stride]
                                                    : static_cast<const int64_t*>(p.positions)[t * p.pos_stride];
      RopeCosSinRow(freq.data(), n_pairs, math::rope_position(pos), p.magnitude, cs.data(), sn.data());
      for (int64_t h = 0; h < p.heads; ++h) {
        const T* xr = static_cast<const T*>(p.x) + t * p.x_stride_token + h * p.x_stride_head;
        T* orow = static_cast<T*>(p.out) + t * p.out_stride_token + h * p.out_stride_head;
        if (!p.in_place) {  // pass-through dims keep their exact bits
          std::memcpy(orow, xr, sizeof(T) * l.first_dim);
          std::memcpy(orow + rot_end, xr + rot_end, sizeof(T) * (p.head_dim - rot_end));
        }
        RotateHead(l, xr, orow, cs.data(), sn.data());
      }
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
