// CPU shift kernels (OpenMP). shift_dense: one unit of work per (tensor,
// head); a unit walks its tokens in ascending order, so every destination
// row lies below every source row it has not read yet (memmove order), and
// units touch disjoint bytes: no barrier, no scratch copy of the cache. Plain and
// DeepSeek-V4 heads rotate with SIMD (shift_simd.cpp, the same bits) unless the
// scalar path is asked for (simd_targets.hpp).
#include <cstring>
#include <vector>

#include "cpu/shift_simd.hpp"
#include "cpu/simd_targets.hpp"
#include "kvcore/math/shift_rotate.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::cpu {
namespace {

using ops::ShiftKind;
using ops::ShiftTensorParams;

constexpr int64_t kParallelMin = 4096;  // head rows below which one thread does the work

void rotate_head(const ShiftTensorParams& t, uint8_t* head, uint8_t* scales, const math::RopeLayout& l,
                 const float* c, const float* s, float* scratch, bool simd) {
  if (simd && ops::cpu::shift_simd_serves(t.kind)) return ops::cpu::shift_rotate_head_simd(t.kind, head, l, c, s);
  const math::ShiftSerialLanes lanes;
  switch (t.kind) {
    case ShiftKind::Copy: break;
    case ShiftKind::F32: math::shift_rotate_head_plain(reinterpret_cast<float*>(head), 0, l, c, s, lanes); break;
    case ShiftKind::F16: math::shift_rotate_head_plain(reinterpret_cast<f16*>(head), 0, l, c, s, lanes); break;
    case ShiftKind::BF16: math::shift_rotate_head_plain(reinterpret_cast<bf16*>(head), 0, l, c, s, lanes); break;
    case ShiftKind::Dsv4: math::shift_rotate_head_dsv4(head, l, c, s, lanes); break;
    case ShiftKind::Fp8: math::shift_rotate_head_fp8(head, scales, l, c, s, scratch, lanes); break;
  }
}

}  // namespace

void shift_dense(const ops::ShiftDenseParams& p) {
  std::vector<std::pair<int32_t, int32_t>> units;  // (tensor, head)
  for (int32_t i = 0; i < p.n_tensors; ++i)
    for (int32_t h = 0; h < p.tensors[i].n_heads; ++h) units.emplace_back(i, h);
  const int64_t n_units = static_cast<int64_t>(units.size());
  const bool big = n_units * p.n_moved >= kParallelMin;  // small shifts: threads cost more than they save
  const bool simd = ops::cpu::simd_on();
#pragma omp parallel for schedule(dynamic, 1) if (big)
  for (int64_t u = 0; u < n_units; ++u) {
    const ShiftTensorParams& t = p.tensors[units[u].first];
    const int64_t h = units[u].second;
    const math::RopeLayout& l = p.layouts[t.layer];
    const float* c = p.cos_t + p.pair_offset[t.layer];
    const float* s = p.sin_t + p.pair_offset[t.layer];
    alignas(16) uint8_t head[ops::kShiftMaxHeadBytes];
    uint8_t scales[ops::kShiftMaxFp8HeadDim / 64];
    float scratch[ops::kShiftMaxFp8HeadDim];
    for (int64_t j = 0; j < p.n_moved; ++j) {
      const int64_t src = p.n_keep + p.n_discard + j, dst = p.n_keep + j;
      uint8_t* from = t.base + src * t.token_stride + h * t.head_bytes;
      uint8_t* to = t.base + dst * t.token_stride + h * t.head_bytes;
      if (t.kind == ShiftKind::Copy) {
        std::memcpy(to, from, t.head_bytes);  // distinct rows: n_discard * token_stride >= head_bytes apart
        continue;
      }
      std::memcpy(head, from, t.head_bytes);
      uint8_t* sc_from = nullptr;
      if (t.kind == ShiftKind::Fp8) {
        sc_from = t.maybe_scales + src * t.scale_token_stride + h * t.scale_head_bytes;
        std::memcpy(scales, sc_from, t.scale_head_bytes);
      }
      rotate_head(t, head, scales, l, c, s, scratch, simd);
      std::memcpy(to, head, t.head_bytes);
      if (t.kind == ShiftKind::Fp8)
        std::memcpy(t.maybe_scales + dst * t.scale_token_stride + h * t.scale_head_bytes, scales, t.scale_head_bytes);
    }
  }
}

void rope_shift_rows(const ops::RopeShiftRowsParams& p) {
  const ShiftTensorParams& t = p.k;
  const math::RopeLayout& l = p.table.layout;
  const bool big = p.rows * t.n_heads >= kParallelMin;
  const bool simd = ops::cpu::simd_on();
#pragma omp parallel for schedule(static) if (big)
  for (int64_t r = 0; r < p.rows; ++r) {
    const int32_t delta = p.delta[r];
    if (delta == 0) continue;
    float c[math::RopeTable::kMaxPairs], s[math::RopeTable::kMaxPairs];
    for (int32_t i = 0; i < l.n_pairs(); ++i) math::shift_sincos(delta, p.table.freq[i], &s[i], &c[i]);
    float scratch[ops::kShiftMaxFp8HeadDim];
    for (int64_t h = 0; h < t.n_heads; ++h) {
      uint8_t* head = t.base + r * t.token_stride + h * t.head_bytes;
      uint8_t* scales = t.maybe_scales ? t.maybe_scales + r * t.scale_token_stride + h * t.scale_head_bytes : nullptr;
      rotate_head(t, head, scales, l, c, s, scratch, simd);
    }
  }
}

}  // namespace kvcore::cpu
