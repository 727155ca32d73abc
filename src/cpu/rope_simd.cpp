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
        RotatePairs(l, xr, orow, cs.data(), sn.data());
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
