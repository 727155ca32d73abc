// One head of a shift, rotated with SIMD (simd_rope-inl.h's RotatePairs: NeoX
// pairs a vector at a time): the bits of math::shift_rotate_head_plain.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/shift_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include "cpu/shift_simd.hpp"
#include "cpu/simd_rope-inl.h"
#include "kvcore/math/dsv4_row.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {

void ShiftRotateHead(ops::ShiftKind kind, uint8_t* head, const math::RopeLayout& l, const float* c, const float* s) {
  switch (kind) {
    case ops::ShiftKind::F32: return RotatePairs(l, reinterpret_cast<float*>(head), reinterpret_cast<float*>(head), c, s);
    case ops::ShiftKind::F16: return RotatePairs(l, reinterpret_cast<f16*>(head), reinterpret_cast<f16*>(head), c, s);
    case ops::ShiftKind::BF16: return RotatePairs(l, reinterpret_cast<bf16*>(head), reinterpret_cast<bf16*>(head), c, s);
    case ops::ShiftKind::Dsv4: {  // the bf16 tail holds dims [kNope, 512): rotate it with dims counted from kNope
      math::RopeLayout tail = l;
      tail.first_dim -= math::Dsv4RowLayout::kNope;
      bf16* t = reinterpret_cast<bf16*>(head + math::Dsv4RowLayout::kRopeOffset);
      return RotatePairs(tail, t, t, c, s);
    }
    default: return;  // not served (shift_simd_serves)
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(ShiftRotateHead);
void shift_rotate_head_simd(ops::ShiftKind kind, uint8_t* head, const math::RopeLayout& l, const float* c,
                            const float* s) {
  HWY_DYNAMIC_DISPATCH(ShiftRotateHead)(kind, head, l, c, s);
}
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
