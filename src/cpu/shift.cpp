// CPU shift kernels (OpenMP). shift_dense: one unit of work per (tensor, run
// of heads); a unit walks its tokens in ascending order, so every destination
// row lies below every source row it has not read yet (memmove order), and
// units touch disjoint bytes: no barrier, no scratch copy of the cache. Plain and
// DeepSeek-V4 heads rotate with SIMD (shift_simd.cpp, the same bits) unless the
// scalar path is asked for (simd_targets.hpp).
#include <omp.h>

#include <algorithm>
#include <array>
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
constexpr int64_t kAheadBytes = 2048;     // bytes of rows a unit asks for ahead of their move (at least a token)

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
  // A unit walks its tokens with every head of a run of heads (contiguous bytes of a
  // token row): whole heads per unit when there are tensors enough to keep every
  // thread busy, else runs short enough to give each thread about four units.
  const int64_t threads = omp_get_max_threads();
  int64_t heads = 0;
  for (int32_t i = 0; i < p.n_tensors; ++i) heads += p.tensors[i].n_heads;
  const int64_t per_unit = std::max<int64_t>(1, heads / std::max<int64_t>(1, 4 * threads));
  std::vector<std::array<int32_t, 3>> units;  // (tensor, first head, end head)
  for (int32_t i = 0; i < p.n_tensors; ++i)
    for (int32_t h = 0; h < p.tensors[i].n_heads; h += static_cast<int32_t>(per_unit))
      units.push_back({i, h, static_cast<int32_t>(std::min<int64_t>(p.tensors[i].n_heads, h + per_unit))});
  const int64_t n_units = static_cast<int64_t>(units.size());
  const bool big = heads * p.n_moved >= kParallelMin;  // small shifts: threads cost more than they save
  const bool simd = ops::cpu::simd_on();
#pragma omp parallel for schedule(dynamic, 1) if (big)
  for (int64_t u = 0; u < n_units; ++u) {
    const ShiftTensorParams& t = p.tensors[units[u][0]];
    const int32_t h0 = units[u][1], h1 = units[u][2];
    const math::RopeLayout& l = p.layouts[t.layer];
    const float* c = p.cos_t + p.pair_offset[t.layer];
    const float* s = p.sin_t + p.pair_offset[t.layer];
    const bool move_simd = simd && (t.kind == ShiftKind::Copy || ops::cpu::shift_simd_serves(t.kind));
    const int64_t run_bytes = (h1 - h0) * t.head_bytes;
    const int64_t ahead = std::clamp<int64_t>(kAheadBytes / run_bytes, 1, 8);
    alignas(16) uint8_t head[ops::kShiftMaxHeadBytes];
    uint8_t scales[ops::kShiftMaxFp8HeadDim / 64];
    float scratch[ops::kShiftFp8ScratchDims];
    for (int64_t j = 0; j < p.n_moved; ++j) {
      const int64_t src = p.n_keep + p.n_discard + j, dst = p.n_keep + j;
      if (j + ahead < p.n_moved) {  // runs token_stride apart: ask for them ahead of their move
        const uint8_t* next = t.base + (src + ahead) * t.token_stride + h0 * t.head_bytes;
        for (int64_t b = 0; b < run_bytes; b += 64) __builtin_prefetch(next + b, 0, 3);
      }
      for (int32_t h = h0; h < h1; ++h) {
        uint8_t* from = t.base + src * t.token_stride + h * t.head_bytes;
        uint8_t* to = t.base + dst * t.token_stride + h * t.head_bytes;
        // from and to are distinct rows: n_discard * token_stride >= head_bytes apart
        if (move_simd) {
          ops::cpu::shift_move_head_simd(t.kind, from, to, t.head_bytes, l, c, s);
          continue;
        }
        if (t.kind == ShiftKind::Copy) {
          std::memcpy(to, from, t.head_bytes);
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
}

void rope_shift_rows(const ops::RopeShiftRowsParams& p) {
  const ShiftTensorParams& t = p.k;
  const math::RopeLayout& l = p.table.layout;
  const bool big = p.rows * t.n_heads >= kParallelMin;
  const bool simd = ops::cpu::simd_on();
  constexpr int32_t kPadded = math::RopeTable::kMaxPairs + 16;
  float freq[kPadded] = {};  // zero padded for the SIMD angles
  std::copy(p.table.freq, p.table.freq + l.n_pairs(), freq);
  if (simd && ops::cpu::shift_simd_serves(t.kind)) return ops::cpu::shift_rows_simd(p, freq, big);
#pragma omp parallel for schedule(static) if (big)
  for (int64_t r = 0; r < p.rows; ++r) {
    const int32_t delta = p.delta[r];
    if (delta == 0) continue;
    float c[kPadded], s[kPadded];
    if (simd) ops::cpu::shift_cos_sin_row_simd(freq, l.n_pairs(), delta, c, s);
    else
      for (int32_t i = 0; i < l.n_pairs(); ++i) math::shift_sincos(delta, p.table.freq[i], &s[i], &c[i]);
    float scratch[ops::kShiftFp8ScratchDims];
    for (int64_t h = 0; h < t.n_heads; ++h) {
      uint8_t* head = t.base + r * t.token_stride + h * t.head_bytes;
      uint8_t* scales = t.maybe_scales ? t.maybe_scales + r * t.scale_token_stride + h * t.scale_head_bytes : nullptr;
      rotate_head(t, head, scales, l, c, s, scratch, simd);
    }
  }
}

}  // namespace kvcore::cpu
