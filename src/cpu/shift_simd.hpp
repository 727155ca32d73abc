// SIMD rotation of one head for the shift kernels (Highway, every target of
// simd_config.hpp): f32 / f16 / bf16 heads and the DeepSeek-V4 row's bf16 rope
// tail, with the bits of math::shift_rotate_head_plain.
#pragma once
#include <cstdint>

#include "kvcore/math/rope.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::ops::cpu {
// Whether shift_rotate_head_simd serves this kind (FP8 heads stay on the scalar path).
inline bool shift_simd_serves(ops::ShiftKind k) {
  return k == ops::ShiftKind::F32 || k == ops::ShiftKind::F16 || k == ops::ShiftKind::BF16 || k == ops::ShiftKind::Dsv4;
}
void shift_rotate_head_simd(ops::ShiftKind kind, uint8_t* head, const math::RopeLayout& l, const float* c,
                            const float* s);
// A head moved from one row to another (distinct bytes) and rotated on the way: the
// bits of a copy followed by shift_rotate_head_simd. Kinds of shift_simd_serves and Copy.
void shift_move_head_simd(ops::ShiftKind kind, const uint8_t* from, uint8_t* to, int64_t head_bytes,
                          const math::RopeLayout& l, const float* c, const float* s);
// cs[i], sn[i] = math::shift_sincos(delta, freq[i]) for i < n, the same bits. freq, cs and sn
// hold a multiple of 16 entries (freq zero padded).
void shift_cos_sin_row_simd(const float* freq, int32_t n, int32_t delta, float* cs, float* sn);
// rope_shift_rows for a kind of shift_simd_serves, the same bits: freq is p.table.freq zero
// padded to kMaxPairs + 16 entries; threads (OpenMP) when `parallel`.
void shift_rows_simd(const ops::RopeShiftRowsParams& p, const float* freq, bool parallel);
}  // namespace kvcore::ops::cpu
