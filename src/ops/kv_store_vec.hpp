// Vectorized bodies of the CUDA kv_store and kv_rotate_blocks kernels for f32 / f16 / bf16
// pools, as host+device functions of (params, thread index): the CUDA kernels are thin
// wrappers, and a CPU test runs every thread index on the host and compares the bytes with
// the CPU kernels (tests/kv_store_vec_test.cpp), so the index math is checked without a GPU.
#pragma once
#include <cstdint>
#include <type_traits>

#include "ops/kv_store_params.hpp"
#include "ops/kv_store_row.hpp"

// Unroll on the device; host compilers would warn about the pragma.
#if defined(__CUDA_ARCH__)
#define KVCORE_VEC_UNROLL _Pragma("unroll")
#else
#define KVCORE_VEC_UNROLL
#endif

namespace kvcore::kvvec {

// ---- rotation: f32 / f16 / bf16 rows, 8 pairs per thread, 16-byte accesses ---------------------
// One thread per (listed block, slot, group of 8 pairs), looping over the heads: NeoX pairs
// (i, i + n_rot/2) read 8 consecutive dims from each half; interleaved pairs read 16 consecutive dims. Same per-pair
// math (sincos_f32 of the same f32 angle, rotate_pair, the same conversions) as the warp path,
// so both paths give identical bytes.

template <class T>
struct alignas(16) Vec8 {
  T v[8];
};

template <KvFormat F>
KVCORE_HD float to_float(const typename std::conditional<F == KvFormat::F32, float, uint16_t>::type x) {
  if constexpr (F == KvFormat::F32) return x;
  else if constexpr (F == KvFormat::F16) return math::f16_bits_to_f32(x);
  else return math::bf16_bits_to_f32(x);
}

template <KvFormat F>
KVCORE_HD auto from_float(float x) {
  if constexpr (F == KvFormat::F32) return x;
  else if constexpr (F == KvFormat::F16) return math::f32_to_f16_bits(x);
  else return math::f32_to_bf16_bits(x);
}

// Rotate the 8 pairs of group g of one row (16 values in x) by the angles in cs/sn.
KVCORE_HD void rotate8(float* x, bool interleaved, const float* cs, const float* sn, float mag) {
  if (interleaved) {
KVCORE_VEC_UNROLL
    for (int k = 0; k < 8; ++k) math::rotate_pair(x[2 * k], x[2 * k + 1], cs[k] * mag, sn[k] * mag);
  } else {
KVCORE_VEC_UNROLL
    for (int k = 0; k < 8; ++k) math::rotate_pair(x[k], x[8 + k], cs[k] * mag, sn[k] * mag);
  }
}

// Thread `tid` of the rotation: tid < n_blocks * block_size * n_pairs / 8.
template <KvFormat F>
KVCORE_HD void kv_rotate_vec_unit(const KvRotateParams& p, int64_t tid) {
  using T = typename std::conditional<F == KvFormat::F32, float, uint16_t>::type;
  const math::RopeLayout& l = p.rope.layout;
  const int32_t groups = l.n_pairs() / 8;
  if (tid >= static_cast<int64_t>(p.n_blocks) * p.block_size * groups) return;
  const int32_t g = static_cast<int32_t>(tid % groups);
  const int64_t cell_in_list = tid / groups;  // (listed block, slot)
  const int32_t b = p.blocks[cell_in_list / p.block_size];
  const int64_t cell = static_cast<int64_t>(b) * p.block_size + cell_in_list % p.block_size;
  const int32_t delta = p.cell_delta[cell];
  if (delta == 0) return;
  // The angles depend on the cell and the pair only: computed once, applied to every head.
  const float pos = static_cast<float>(delta);
  float sn[8], cs[8];
KVCORE_VEC_UNROLL
  for (int k = 0; k < 8; ++k) math::sincos_f32(math::rope_angle(pos, p.rope.freq[8 * g + k]), &sn[k], &cs[k]);
  // NeoX: dims first + 8g .. +8 and first + n_pairs + 8g .. +8; interleaved: 16 dims from first + 16g.
  const int32_t d0 = l.first_dim + (l.interleaved ? 16 * g : 8 * g);
  const int32_t d1 = l.interleaved ? d0 + 8 : l.first_dim + l.n_pairs() + 8 * g;
  for (int32_t h = 0; h < p.n_heads; ++h) {
    T* row = static_cast<T*>(p.pool) + (cell * p.n_heads + h) * p.row_width;
    Vec8<T>* lo = reinterpret_cast<Vec8<T>*>(row + d0);
    Vec8<T>* hi = reinterpret_cast<Vec8<T>*>(row + d1);
    Vec8<T> a = *lo, c = *hi;
    float x[16];
KVCORE_VEC_UNROLL
    for (int k = 0; k < 8; ++k) {
      x[k] = to_float<F>(a.v[k]);
      x[8 + k] = to_float<F>(c.v[k]);
    }
    rotate8(x, l.interleaved != 0, cs, sn, 1.0f);
KVCORE_VEC_UNROLL
    for (int k = 0; k < 8; ++k) {
      a.v[k] = from_float<F>(x[k]);
      c.v[k] = from_float<F>(x[8 + k]);
    }
    *lo = a;
    *hi = c;
  }
}

// ---- store: f32 / f16 / bf16 pools, 8 dims per 16-byte access -------------------------------------
// One thread per (token, pair of heads, unit): a unit is a group of 8 rotated pairs (2 x 8 dims)
// or 8 non-rotated dims. (Looping over all 8 heads in one thread left a 4096-token launch with
// 128 CTAs on a 132-SM GPU: too few bytes in flight.) Loads the source as vectors, rotates with the same per-pair math as the warp
// path, converts with the same functions: identical bytes.

template <class T>
KVCORE_HD void load8(const void* src, DType t, int64_t i, float* out) {
  const Vec8<T> v = *reinterpret_cast<const Vec8<T>*>(static_cast<const T*>(src) + i);
KVCORE_VEC_UNROLL
  for (int k = 0; k < 8; ++k) {
    if constexpr (sizeof(T) == 4) out[k] = v.v[k];
    else out[k] = t == DType::F16 ? math::f16_bits_to_f32(v.v[k]) : math::bf16_bits_to_f32(v.v[k]);
  }
}

KVCORE_HD void load_src8(const KvStoreParams& p, int64_t i, float* out) {
  if (p.src_dtype == DType::F32) load8<float>(p.src, p.src_dtype, i, out);
  else load8<uint16_t>(p.src, p.src_dtype, i, out);
}

template <KvFormat F>
KVCORE_HD void store8(void* pool, int64_t i, const float* x) {
  using T = typename std::conditional<F == KvFormat::F32, float, uint16_t>::type;
  Vec8<T> v;
KVCORE_VEC_UNROLL
  for (int k = 0; k < 8; ++k) v.v[k] = from_float<F>(x[k]);
  *reinterpret_cast<Vec8<T>*>(static_cast<T*>(pool) + i) = v;
}

// cos and sin of pairs 8u .. 8u + 7 of token t: from kv_rope_angles' table when given, else computed.
KVCORE_HD void angles8(const KvStoreParams& p, int32_t t, int32_t u, float* cs, float* sn) {
  if (p.maybe_angles) {
    const float* a = p.maybe_angles + (static_cast<int64_t>(t) * p.rope.layout.n_pairs() + 8 * u) * 2;
KVCORE_VEC_UNROLL
    for (int k = 0; k < 8; ++k) {
      cs[k] = a[2 * k];
      sn[k] = a[2 * k + 1];
    }
    return;
  }
  const float pos = static_cast<float>(p.maybe_positions[t]);
KVCORE_VEC_UNROLL
  for (int k = 0; k < 8; ++k) math::sincos_f32(math::rope_angle(pos, p.rope.freq[8 * u + k]), &sn[k], &cs[k]);
}

// Units per (token, head) row of the store: groups of 8 rotated pairs + groups of 8 plain dims.
KVCORE_HD int32_t kv_store_vec_units(const KvStoreParams& p) {
  const int32_t n_rot = p.maybe_positions ? p.rope.layout.n_rot : 0;
  return (n_rot / 2) / 8 + (p.head_dim - n_rot) / 8;
}
// Heads one thread stores: 2 share the angles of their token (half the trig per byte) while a
// 4096-token launch still has ~128k threads in flight.
constexpr int32_t kVecHeadsPerThread = 2;
KVCORE_HD int32_t kv_store_vec_head_groups(const KvStoreParams& p) {
  return (p.n_heads + kVecHeadsPerThread - 1) / kVecHeadsPerThread;
}
// Threads of one store launch: one per (token, head pair, unit), the unit fastest.
KVCORE_HD int64_t kv_store_vec_threads(const KvStoreParams& p) {
  return static_cast<int64_t>(p.n_tokens) * kv_store_vec_head_groups(p) * kv_store_vec_units(p);
}

// Thread `tid` of the store: tid < kv_store_vec_threads(p).
template <KvFormat F>
KVCORE_HD void kv_store_vec_unit(const KvStoreParams& p, int64_t tid) {
  const bool rotate = p.maybe_positions != nullptr;
  const math::RopeLayout l = rotate ? p.rope.layout : math::RopeLayout{};
  const int32_t rot_units = l.n_pairs() / 8;
  const int32_t units = kv_store_vec_units(p), groups = kv_store_vec_head_groups(p);
  if (tid >= kv_store_vec_threads(p)) return;
  const int32_t u = static_cast<int32_t>(tid % units);
  const int64_t row = tid / units;
  const int32_t h0 = static_cast<int32_t>(row % groups) * kVecHeadsPerThread;
  const int32_t t = static_cast<int32_t>(row / groups);
  const int32_t nh = p.n_heads - h0 < kVecHeadsPerThread ? p.n_heads - h0 : kVecHeadsPerThread;
  const int32_t cell = p.slots[t];
  if (cell < 0 || cell >= p.num_cells) return;
  const int64_t src = t * p.src_token_stride + h0 * p.src_head_stride;
  const int64_t dst = (static_cast<int64_t>(cell) * p.n_heads + h0) * p.row_width;
  float x[kVecHeadsPerThread][16];
  if (u >= rot_units) {  // 8 dims that do not rotate
    const int32_t q = 8 * (u - rot_units);
    const int32_t d = q < l.first_dim ? q : q + l.n_rot;
    for (int32_t i = 0; i < nh; ++i) load_src8(p, src + i * p.src_head_stride + d, x[i]);
    for (int32_t i = 0; i < nh; ++i) store8<F>(p.pool, dst + i * p.row_width + d, x[i]);
    return;
  }
  // 8 pairs: NeoX dims first + 8u .. +8 and first + n_pairs + 8u .. +8; interleaved 16 dims from first + 16u.
  const int32_t d0 = l.first_dim + (l.interleaved ? 16 * u : 8 * u);
  const int32_t d1 = l.interleaved ? d0 + 8 : l.first_dim + l.n_pairs() + 8 * u;
  for (int32_t i = 0; i < nh; ++i) {  // loads first: their latency hides behind the angle math
    load_src8(p, src + i * p.src_head_stride + d0, x[i]);
    load_src8(p, src + i * p.src_head_stride + d1, x[i] + 8);
  }
  float sn[8], cs[8];
  angles8(p, t, u, cs, sn);
  for (int32_t i = 0; i < nh; ++i) {
    rotate8(x[i], l.interleaved != 0, cs, sn, p.rope.attention_factor);
    store8<F>(p.pool, dst + i * p.row_width + d0, x[i]);
    store8<F>(p.pool, dst + i * p.row_width + d1, x[i] + 8);
  }
}

inline bool vec_store_ok(const KvStoreParams& p) {
  if (p.format != KvFormat::F16 && p.format != KvFormat::BF16 && p.format != KvFormat::F32) return false;
  const int64_t ses = p.src_dtype == DType::F32 ? 4 : 2, pes = p.format == KvFormat::F32 ? 4 : 2;
  const bool src_aligned = reinterpret_cast<uintptr_t>(p.src) % 16 == 0 && (p.src_token_stride * ses) % 16 == 0 &&
                           (p.src_head_stride * ses) % 16 == 0;
  const bool pool_aligned = reinterpret_cast<uintptr_t>(p.pool) % 16 == 0 && (p.row_width * pes) % 16 == 0;
  if (!src_aligned || !pool_aligned || p.head_dim % 8 != 0) return false;
  if (!p.maybe_positions) return true;
  const math::RopeLayout& l = p.rope.layout;
  return l.n_pairs() % 8 == 0 && l.first_dim % 8 == 0;
}

// Can the vectorized path take these params? (16-byte aligned groups of 8 pairs in 16-bit or f32 rows)
inline bool vec_rotate_ok(const KvRotateParams& p) {
  if (p.format != KvFormat::F16 && p.format != KvFormat::BF16 && p.format != KvFormat::F32) return false;
  const math::RopeLayout& l = p.rope.layout;
  const int64_t es = p.format == KvFormat::F32 ? 4 : 2;
  const bool aligned = reinterpret_cast<uintptr_t>(p.pool) % 16 == 0 && (p.row_width * es) % 16 == 0 &&
                       (l.first_dim * es) % 16 == 0 && (l.n_pairs() * es) % 16 == 0;
  return l.n_pairs() > 0 && l.n_pairs() % 8 == 0 && aligned;
}

}  // namespace kvcore::kvvec
