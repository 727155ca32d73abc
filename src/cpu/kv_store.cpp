// CPU kernels of the kv_store family: one token (or cell) per iteration, OpenMP over them;
// the pair angles are computed once per token and shared by its heads. kv_store and
// kv_rotate_blocks (and kv_rope_angles) take the SIMD path (kv_store_simd.cpp, the same bytes) unless the
// scalar path is asked for (simd_targets.hpp).
#include <cstdint>

#include "cpu/kv_store_simd.hpp"
#include "cpu/simd_targets.hpp"

#include "ops/kv_store_params.hpp"
#include "ops/kv_store_row.hpp"

namespace kvcore::cpu {

namespace {

// Below this many values a parallel region costs more than the work (decode steps, tests).
constexpr int64_t kParallelMin = int64_t{1} << 17;

// cos and sin of every pair at `position`, times `magnitude` (what math::rope_rotate_row computes
// per row, hoisted so the heads of one token share it: same floats, same results).
void pair_angles(const math::RopeTable& t, float position, float magnitude, float* c, float* s) {
  for (int32_t i = 0; i < t.layout.n_pairs(); ++i) {
    math::sincos_f32(math::rope_angle(position, t.freq[i]), &s[i], &c[i]);
    c[i] *= magnitude;
    s[i] *= magnitude;
  }
}

// The same from kv_rope_angles' table (cos, sin per pair): the same floats, the same products.
void table_angles(const float* a, int32_t n_pairs, float magnitude, float* c, float* s) {
  for (int32_t i = 0; i < n_pairs; ++i) {
    c[i] = a[2 * i] * magnitude;
    s[i] = a[2 * i + 1] * magnitude;
  }
}

void rotate_with(float* row, const math::RopeLayout& l, const float* c, const float* s) {
  for (int32_t i = 0; i < l.n_pairs(); ++i) math::rotate_pair(row[l.dim0(i)], row[l.dim1(i)], c[i], s[i]);
}

}  // namespace

void kv_store(const KvStoreParams& p) {
  if (ops::cpu::simd_on()) return ops::cpu::kv_store_simd(p);
  const size_t elem = dtype_size(kv_format_dtype(p.format));
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(p.n_tokens) * p.n_heads * p.head_dim >= kParallelMin)
  for (int32_t t = 0; t < p.n_tokens; ++t) {
    const int32_t cell = p.slots[t];
    if (cell < 0 || cell >= p.num_cells) continue;
    float c[math::RopeTable::kMaxPairs], s[math::RopeTable::kMaxPairs];
    if (p.maybe_angles)
      table_angles(p.maybe_angles + static_cast<int64_t>(t) * p.rope.layout.n_pairs() * 2, p.rope.layout.n_pairs(),
                   p.rope.attention_factor, c, s);
    else if (p.maybe_positions)
      pair_angles(p.rope, static_cast<float>(p.maybe_positions[t]), p.rope.attention_factor, c, s);
    for (int32_t h = 0; h < p.n_heads; ++h) {
      float row[kMaxKvHeadDim];
      const int64_t base = t * p.src_token_stride + h * p.src_head_stride;
      for (int32_t d = 0; d < p.head_dim; ++d) row[d] = kvrow::load_src(p.src, p.src_dtype, base + d);
      if (p.maybe_positions) rotate_with(row, p.rope.layout, c, s);
      const int64_t row_index = static_cast<int64_t>(cell) * p.n_heads + h;
      void* dst = static_cast<uint8_t*>(p.pool) + row_index * p.row_width * static_cast<int64_t>(elem);
      uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
      kvrow::encode_row(p.format, row, dst, scales, p.head_dim);
    }
  }
}

void kv_rope_angles(const KvAnglesParams& p) {
  if (ops::cpu::simd_on()) return ops::cpu::kv_rope_angles_simd(p);
  const int32_t np = p.rope.layout.n_pairs();
  for (int32_t t = 0; t < p.n; ++t)
    for (int32_t i = 0; i < np; ++i) {
      float sv, cv;
      math::sincos_f32(math::rope_angle(static_cast<float>(p.positions[t]), p.rope.freq[i]), &sv, &cv);
      p.out[(static_cast<int64_t>(t) * np + i) * 2] = cv;
      p.out[(static_cast<int64_t>(t) * np + i) * 2 + 1] = sv;
    }
}

void kv_rotate_blocks(const KvRotateParams& p) {
  if (ops::cpu::simd_on()) return ops::cpu::kv_rotate_blocks_simd(p);
  const int64_t cells = static_cast<int64_t>(p.n_blocks) * p.block_size;
  const size_t elem = dtype_size(kv_format_dtype(p.format));
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
#pragma omp parallel for schedule(static) if (cells * p.n_heads * p.head_dim >= kParallelMin)
  for (int64_t i = 0; i < cells; ++i) {
    const int64_t cell = static_cast<int64_t>(p.blocks[i / p.block_size]) * p.block_size + i % p.block_size;
    const int32_t delta = p.cell_delta[cell];
    if (delta == 0) continue;
    float c[math::RopeTable::kMaxPairs], s[math::RopeTable::kMaxPairs];
    pair_angles(p.rope, static_cast<float>(delta), 1.0f, c, s);
    for (int32_t h = 0; h < p.n_heads; ++h) {
      const int64_t row_index = cell * p.n_heads + h;
      void* dst = static_cast<uint8_t*>(p.pool) + row_index * p.row_width * static_cast<int64_t>(elem);
      uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
      float row[kMaxKvHeadDim];
      for (int32_t d = 0; d < p.head_dim; ++d) row[d] = kvrow::decode(p.format, dst, scales, d);
      rotate_with(row, p.rope.layout, c, s);
      kvrow::encode_rotated(p.format, row, dst, scales, p.head_dim, p.rope.layout);
    }
  }
}

}  // namespace kvcore::cpu
