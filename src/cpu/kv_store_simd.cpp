// kv_store and kv_rotate_blocks with SIMD: per token (cell) the pairs' cos and
// sin in double lanes (simd_rope-inl.h), per head the source row widened to f32
// a vector at a time, NeoX pairs rotated a vector at a time, and f32 / f16 /
// bf16 pools written a vector at a time, FP8 groups decoded and encoded a vector at
// a time (a rotation touches only the groups holding rotated dims). Every byte equals
// the scalar kernels': the same operations per element, the same roundings.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv_store_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <algorithm>
#include <cstring>

#include "cpu/kv_store_simd.hpp"
#include "cpu/simd_kv-inl.h"
#include "cpu/simd_rope-inl.h"
#include "ops/kv_store_row.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 17;  // as the scalar kernels
constexpr int32_t kPairsPadded = math::RopeTable::kMaxPairs + 16;

template <class T>
void LoadRow(const T* src, int32_t n, float* row) {
  const hn::ScalableTag<float> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  for (; d + N <= n; d += N) hn::StoreU(LoadAsF32(df, src + d), df, row + d);
  for (; d < n; ++d) row[d] = to_f32(src[d]);
}

template <class T>
void StoreRow(const float* row, int32_t n, T* dst) {
  const hn::ScalableTag<float> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  for (; d + N <= n; d += N) StoreFromF32(df, hn::LoadU(df, row + d), dst + d);
  for (; d < n; ++d) dst[d] = from_f32<T>(row[d]);
}

void LoadSrc(const void* src, DType t, int64_t base, int32_t n, float* row) {
  switch (t) {
    case DType::F16: return LoadRow(static_cast<const f16*>(src) + base, n, row);
    case DType::BF16: return LoadRow(static_cast<const bf16*>(src) + base, n, row);
    default: return LoadRow(static_cast<const float*>(src) + base, n, row);
  }
}

void EncodeRow(KvFormat f, const float* row, void* dst, uint8_t* scales, int32_t n) {
  switch (f) {
    case KvFormat::F32: return StoreRow(row, n, static_cast<float*>(dst));
    case KvFormat::F16: return StoreRow(row, n, static_cast<f16*>(dst));
    case KvFormat::BF16: return StoreRow(row, n, static_cast<bf16*>(dst));
    default: {  // FP8 groups a vector at a time, then the plain tail (kvrow::encode_row's order)
      const int32_t groups = kvrow::n_fp8_groups(f, n);
      for (int32_t g = 0; g < groups; ++g)
        EncodeFp8Group(row + g * math::kFp8Block, kvrow::group_codes(f, dst, g), kvrow::group_scale(f, dst, scales, g));
      for (int32_t d = groups * math::kFp8Block; d < n; ++d) kvrow::encode_plain(f, dst, d, row[d]);
      if (f == KvFormat::Dsv4Row) static_cast<uint8_t*>(dst)[kvrow::Dsv4::kPadOffset] = 0;
    }
  }
}

// The first rotated dim outside the FP8 groups of an FP8 row (Fp8, Dsv4Row): the rotated dims
// past it are plain (the Dsv4Row's bf16 tail); an Fp8 row has none (the end of the rotation).
int32_t FirstPlainRotatedDim(KvFormat f, const math::RopeLayout& l) {
  const int32_t end = l.first_dim + l.n_rot;
  return f == KvFormat::Dsv4Row ? std::min(std::max(l.first_dim, kvrow::Dsv4::kNope), end) : end;
}

// The dims of an FP8 row (Fp8, Dsv4Row) that a rotation reads: every group holding a rotated
// dim, decoded a vector at a time (the e4m3 value times the power-of-two scale: exact, the
// same floats as kvrow::decode), and the rotated plain dims (the Dsv4Row's bf16 tail).
void DecodeRotated(KvFormat f, void* dst, uint8_t* scales, int32_t n, const math::RopeLayout& l, float* row) {
  const hn::ScalableTag<float> df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  const int32_t groups = kvrow::n_fp8_groups(f, n);
  for (int32_t g = 0; g < groups; ++g) {
    if (!kvrow::group_rotates(l, g)) continue;
    const uint8_t* codes = kvrow::group_codes(f, dst, g);
    const auto scale = hn::Set(df, math::ue8m0_decode(*kvrow::group_scale(f, dst, scales, g)));
    for (int32_t i = 0; i < math::kFp8Block; i += N)
      hn::StoreU(hn::Mul(LoadKv<math::KvElem::E4M3>(df, codes, i), scale), df, row + g * math::kFp8Block + i);
  }
  for (int32_t d = FirstPlainRotatedDim(f, l); d < l.first_dim + l.n_rot; ++d) row[d] = kvrow::decode(f, dst, scales, d);
}

// kvrow::encode_rotated with the groups encoded a vector at a time (EncodeFp8Group: the same
// bytes): only what the rotation changed is written, every other byte stays.
void EncodeRotated(KvFormat f, const float* row, void* dst, uint8_t* scales, int32_t n, const math::RopeLayout& l) {
  const int32_t groups = kvrow::n_fp8_groups(f, n);
  for (int32_t g = 0; g < groups; ++g)
    if (kvrow::group_rotates(l, g))
      EncodeFp8Group(row + g * math::kFp8Block, kvrow::group_codes(f, dst, g), kvrow::group_scale(f, dst, scales, g));
  for (int32_t d = FirstPlainRotatedDim(f, l); d < l.first_dim + l.n_rot; ++d) kvrow::encode_plain(f, dst, d, row[d]);
}

}  // namespace

void KvStore(const KvStoreParams& p) {
  const size_t elem = dtype_size(kv_format_dtype(p.format));
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
  const int32_t n_pairs = p.rope.layout.n_pairs();
  HWY_ALIGN float freq[kPairsPadded] = {};
  std::memcpy(freq, p.rope.freq, sizeof(float) * n_pairs);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(p.n_tokens) * p.n_heads * p.head_dim >= kParallelMin)
  for (int32_t t = 0; t < p.n_tokens; ++t) {
    const int32_t cell = p.slots[t];
    if (cell < 0 || cell >= p.num_cells) continue;
    HWY_ALIGN float c[kPairsPadded], s[kPairsPadded];
    if (p.maybe_angles) {  // kv_rope_angles' table: the same floats, the same products
      const float* a = p.maybe_angles + static_cast<int64_t>(t) * n_pairs * 2;
      for (int32_t i = 0; i < n_pairs; ++i) c[i] = a[2 * i] * p.rope.attention_factor, s[i] = a[2 * i + 1] * p.rope.attention_factor;
    } else if (p.maybe_positions) {
      RopeCosSinRow(freq, n_pairs, static_cast<float>(p.maybe_positions[t]), p.rope.attention_factor, c, s);
    }
    for (int32_t h = 0; h < p.n_heads; ++h) {
      HWY_ALIGN float row[kMaxKvHeadDim];
      LoadSrc(p.src, p.src_dtype, t * p.src_token_stride + h * p.src_head_stride, p.head_dim, row);
      if (p.maybe_positions) RotatePairs(p.rope.layout, row, row, c, s);
      const int64_t row_index = static_cast<int64_t>(cell) * p.n_heads + h;
      void* dst = static_cast<uint8_t*>(p.pool) + row_index * p.row_width * static_cast<int64_t>(elem);
      uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
      EncodeRow(p.format, row, dst, scales, p.head_dim);
    }
  }
}

void KvRotateBlocks(const KvRotateParams& p) {
  const int64_t cells = static_cast<int64_t>(p.n_blocks) * p.block_size;
  const size_t elem = dtype_size(kv_format_dtype(p.format));
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
  const int32_t n_pairs = p.rope.layout.n_pairs();
  const bool plain = p.format == KvFormat::F32 || p.format == KvFormat::F16 || p.format == KvFormat::BF16;
  HWY_ALIGN float freq[kPairsPadded] = {};
  std::memcpy(freq, p.rope.freq, sizeof(float) * n_pairs);
#pragma omp parallel for schedule(static) if (cells * p.n_heads * p.head_dim >= kParallelMin)
  for (int64_t i = 0; i < cells; ++i) {
    const int64_t cell = static_cast<int64_t>(p.blocks[i / p.block_size]) * p.block_size + i % p.block_size;
    const int32_t delta = p.cell_delta[cell];
    if (delta == 0) continue;
    HWY_ALIGN float c[kPairsPadded], s[kPairsPadded];
    RopeCosSinRow(freq, n_pairs, static_cast<float>(delta), 1.0f, c, s);
    for (int32_t h = 0; h < p.n_heads; ++h) {
      const int64_t row_index = cell * p.n_heads + h;
      void* dst = static_cast<uint8_t*>(p.pool) + row_index * p.row_width * static_cast<int64_t>(elem);
      uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
      if (plain) {  // only the rotated dims change: rotate them in place
        switch (p.format) {
          case KvFormat::F32: RotatePairs(p.rope.layout, static_cast<float*>(dst), static_cast<float*>(dst), c, s); break;
          case KvFormat::F16: RotatePairs(p.rope.layout, static_cast<f16*>(dst), static_cast<f16*>(dst), c, s); break;
          default: RotatePairs(p.rope.layout, static_cast<bf16*>(dst), static_cast<bf16*>(dst), c, s); break;
        }
        continue;
      }
      HWY_ALIGN float row[kMaxKvHeadDim];
      DecodeRotated(p.format, dst, scales, p.head_dim, p.rope.layout, row);
      RotatePairs(p.rope.layout, row, row, c, s);
      EncodeRotated(p.format, row, dst, scales, p.head_dim, p.rope.layout);
    }
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(KvStore);
HWY_EXPORT(KvRotateBlocks);
void kv_store_simd(const KvStoreParams& p) { HWY_DYNAMIC_DISPATCH(KvStore)(p); }
void kv_rotate_blocks_simd(const KvRotateParams& p) { HWY_DYNAMIC_DISPATCH(KvRotateBlocks)(p); }
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
