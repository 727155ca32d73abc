// kv_store, kv_rotate_blocks and kv_rope_angles with SIMD: per token (cell) the pairs'
// cos and sin in double lanes (simd_rope-inl.h) or scaled from the angle table, per
// head the source row widened to f32 a vector at a time, NeoX pairs rotated a vector
// at a time, and f32 / f16 / bf16 pools written a vector at a time (16-bit pools from
// sources of their own type straight from the source row), FP8 groups decoded and
// encoded a vector at a time, a row's groups together (a rotation touches only the
// groups holding rotated dims). Every byte equals the scalar kernels': the same
// operations per element, the same roundings.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv_store_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/kv_store_simd.hpp"
#include "cpu/simd_fp8_rotate-inl.h"
#include "cpu/simd_kv-inl.h"
#include "cpu/simd_rope-inl.h"
#include "ops/kv_store_row.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 17;  // as the scalar kernels
// kv_store into FP8 pools splits over tokens from 32k values on (a 64-token append of 8 heads x
// 128 dims is 64k a call, about 25 us of encoding on one core, several times a fork and join);
// 16-bit pools (about 10 us a call that size) keep the scalar kernels' threshold.
constexpr int64_t kFp8StoreParallelMin = int64_t{1} << 15;
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

using DF = hn::ScalableTag<float>;

void EncodeRow(KvFormat f, const float* row, void* dst, uint8_t* scales, int32_t n, const E4m3InRangeConsts<DF>& kc) {
  switch (f) {
    case KvFormat::F32: return StoreRow(row, n, static_cast<float*>(dst));
    case KvFormat::F16: return StoreRow(row, n, static_cast<f16*>(dst));
    case KvFormat::BF16: return StoreRow(row, n, static_cast<bf16*>(dst));
    default: {  // FP8 groups a vector at a time, then the plain tail (kvrow::encode_row's order)
      const int32_t groups = kvrow::n_fp8_groups(f, n);  // codes and scale bytes of a row are contiguous
      EncodeFp8Groups(DF(), row, groups, kvrow::group_codes(f, dst, 0), kvrow::group_scale(f, dst, scales, 0), 1, kc);
      for (int32_t d = groups * math::kFp8Block; d < n; ++d) kvrow::encode_plain(f, dst, d, row[d]);
      if (f == KvFormat::Dsv4Row) static_cast<uint8_t*>(dst)[kvrow::Dsv4::kPadOffset] = 0;
    }
  }
}

// n 16-bit values (f16 or bf16 bits) copied as a round trip through f32 writes them
// (math/half.hpp): every value but NaN exactly, NaN as the canonical quiet NaN `qnan`
// (magnitude above `inf`, the infinity's bits).
void CopyCanonical16(const uint16_t* src, uint16_t* dst, int32_t n, uint16_t inf, uint16_t qnan) {
  const hn::ScalableTag<uint16_t> d16;
  const int32_t N = static_cast<int32_t>(hn::Lanes(d16));
  const auto mag = hn::Set(d16, uint16_t{0x7fff}), vinf = hn::Set(d16, inf), vnan = hn::Set(d16, qnan);
  int32_t i = 0;
  for (; i + N <= n; i += N) {
    const auto x = hn::LoadU(d16, src + i);
    hn::StoreU(hn::IfThenElse(hn::Gt(hn::And(x, mag), vinf), vnan, x), d16, dst + i);
  }
  for (; i < n; ++i) dst[i] = (src[i] & 0x7fffu) > inf ? qnan : src[i];
}

// One row of a 16-bit pool from a source row of the same type, without the f32 row:
// the rotated dims rotated source to pool (RotatePairs: the same operations), the others
// copied (CopyCanonical16). The bytes of LoadSrc + RotatePairs + EncodeRow.
template <class T>
void StoreRow16(const T* src, T* dst, int32_t n, const math::RopeLayout* rotate, const float* c, const float* s) {
  constexpr bool kF16 = std::is_same_v<T, f16>;
  const uint16_t inf = kF16 ? 0x7c00u : 0x7f80u, qnan = kF16 ? 0x7e00u : 0x7fc0u;
  const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
  uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
  if (!rotate || rotate->n_rot == 0) return CopyCanonical16(s16, d16, n, inf, qnan);
  const int32_t lo = rotate->first_dim, hi = rotate->first_dim + rotate->n_rot;
  CopyCanonical16(s16, d16, lo, inf, qnan);
  CopyCanonical16(s16 + hi, d16 + hi, n - hi, inf, qnan);
  RotatePairs(*rotate, src, dst, c, s);
}

}  // namespace

void KvStore(const KvStoreParams& p) {
  const size_t elem = dtype_size(kv_format_dtype(p.format));
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
  const int32_t n_pairs = p.rope.layout.n_pairs();
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  const E4m3InRangeConsts<DF> kc(df);
  // 16-bit pools written from sources of their own type skip the f32 row
  const bool same16 = (p.format == KvFormat::F16 && p.src_dtype == DType::F16) ||
                      (p.format == KvFormat::BF16 && p.src_dtype == DType::BF16);
  const float factor = p.rope.attention_factor;
  HWY_ALIGN float freq[kPairsPadded] = {};
  std::memcpy(freq, p.rope.freq, sizeof(float) * n_pairs);
  const int64_t parallel_min = groups > 0 ? kFp8StoreParallelMin : kParallelMin;
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(p.n_tokens) * p.n_heads * p.head_dim >= parallel_min)
  for (int32_t t = 0; t < p.n_tokens; ++t) {
    const int32_t cell = p.slots[t];
    if (cell < 0 || cell >= p.num_cells) continue;
    HWY_ALIGN float c[kPairsPadded], s[kPairsPadded];
    if (p.maybe_angles) {  // kv_rope_angles' table: the same floats, the same products
      const float* a = p.maybe_angles + static_cast<int64_t>(t) * n_pairs * 2;
      int32_t i = 0;
#if HWY_TARGET != HWY_SCALAR
      const auto f = hn::Set(df, factor);
      for (; i + N <= n_pairs; i += N) {
        hn::Vec<DF> cv, sv;
        hn::LoadInterleaved2(df, a + 2 * i, cv, sv);
        hn::Store(hn::Mul(cv, f), df, c + i);
        hn::Store(hn::Mul(sv, f), df, s + i);
      }
#endif
      for (; i < n_pairs; ++i) c[i] = a[2 * i] * factor, s[i] = a[2 * i + 1] * factor;
    } else if (p.maybe_positions) {
      RopeCosSinRow(freq, n_pairs, static_cast<float>(p.maybe_positions[t]), factor, c, s);
    }
    const math::RopeLayout* rotate = p.maybe_positions ? &p.rope.layout : nullptr;
    for (int32_t h = 0; h < p.n_heads; ++h) {
      const int64_t base = t * p.src_token_stride + h * p.src_head_stride;
      const int64_t row_index = static_cast<int64_t>(cell) * p.n_heads + h;
      void* dst = static_cast<uint8_t*>(p.pool) + row_index * p.row_width * static_cast<int64_t>(elem);
      if (same16) {
        if (p.format == KvFormat::F16) StoreRow16(static_cast<const f16*>(p.src) + base, static_cast<f16*>(dst), p.head_dim, rotate, c, s);
        else StoreRow16(static_cast<const bf16*>(p.src) + base, static_cast<bf16*>(dst), p.head_dim, rotate, c, s);
        continue;
      }
      HWY_ALIGN float row[kMaxKvHeadDim];
      LoadSrc(p.src, p.src_dtype, base, p.head_dim, row);
      if (rotate) RotatePairs(*rotate, row, row, c, s);
      uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
      EncodeRow(p.format, row, dst, scales, p.head_dim, kc);
    }
  }
  (void)N;
}

// kv_rope_angles: per token the pairs' cos and sin (RopeCosSinRow, math::sincos_f32's
// bits; times 1, exact), interleaved as the table holds them.
void KvRopeAngles(const KvAnglesParams& p) {
  const int32_t n_pairs = p.rope.layout.n_pairs();
  HWY_ALIGN float freq[kPairsPadded] = {};
  std::memcpy(freq, p.rope.freq, sizeof(float) * n_pairs);
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  for (int32_t t = 0; t < p.n; ++t) {
    HWY_ALIGN float c[kPairsPadded], s[kPairsPadded];
    RopeCosSinRow(freq, n_pairs, static_cast<float>(p.positions[t]), 1.0f, c, s);
    float* out = p.out + static_cast<int64_t>(t) * n_pairs * 2;
    int32_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    for (; i + N <= n_pairs; i += N) hn::StoreInterleaved2(hn::Load(df, c + i), hn::Load(df, s + i), df, out + 2 * i);
#endif
    for (; i < n_pairs; ++i) out[2 * i] = c[i], out[2 * i + 1] = s[i];
  }
  (void)N;
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
      RotateFp8Row(p.format, dst, scales, p.head_dim, p.rope.layout, c, s);
    }
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(KvStore);
HWY_EXPORT(KvRotateBlocks);
HWY_EXPORT(KvRopeAngles);
void kv_store_simd(const KvStoreParams& p) { HWY_DYNAMIC_DISPATCH(KvStore)(p); }
void kv_rotate_blocks_simd(const KvRotateParams& p) { HWY_DYNAMIC_DISPATCH(KvRotateBlocks)(p); }
void kv_rope_angles_simd(const KvAnglesParams& p) { HWY_DYNAMIC_DISPATCH(KvRopeAngles)(p); }
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
