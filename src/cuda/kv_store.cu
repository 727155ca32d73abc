// CUDA kernels of the kv_store family. One warp per (token or cell, head) row:
// the row is staged in shared memory as f32 (coalesced loads), rotated pair by
// pair, then encoded; an FP8 group's amax is one warp reduction (32 lanes x 2
// values = 64 dims). Per-element math comes from ops/kv_store_row.hpp, shared
// with the CPU kernels, so both give the same bytes for the same floats.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/check.cuh"
#include "ops/kv_store_params.hpp"
#include "ops/kv_store_row.hpp"

namespace kvcore::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxDim = 2 * math::RopeTable::kMaxPairs;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ void* row_ptr(void* pool, int64_t row_index, int32_t row_width, KvFormat f) {
  return static_cast<uint8_t*>(pool) + row_index * row_width * static_cast<int64_t>(dtype_size(kv_format_dtype(f)));
}

// Rotate the staged row by `position` (every lane takes pairs lane, lane + 32, ...).
__device__ __forceinline__ void warp_rotate(float* row, const math::RopeTable& rope, float position, float magnitude,
                                            int lane) {
  for (int32_t i = lane; i < rope.layout.n_pairs(); i += 32) {
    float s, c;
    math::sincos_f32(math::rope_angle(position, rope.freq[i]), &s, &c);
    math::rotate_pair(row[rope.layout.dim0(i)], row[rope.layout.dim1(i)], c * magnitude, s * magnitude);
  }
}

// Encode the staged row into dst. only_rotated: re-encode just the FP8 groups holding rotated
// dims and the rotated plain dims (kv_rotate_blocks), leaving every other byte alone.
__device__ void warp_encode(KvFormat f, const float* row, void* dst, uint8_t* scales, int32_t head_dim,
                            const math::RopeLayout& l, bool only_rotated, int lane) {
  const int32_t groups = kvrow::n_fp8_groups(f, head_dim);
  for (int32_t g = 0; g < groups; ++g) {
    if (only_rotated && !kvrow::group_rotates(l, g)) continue;
    const float v0 = row[g * math::kFp8Block + lane];
    const float v1 = row[g * math::kFp8Block + 32 + lane];
    float amax = math::finite_abs_max(math::finite_abs_max(0.0f, v0), v1);
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
    const int k = math::e4m3_scale_exponent(amax);
    uint8_t* codes = kvrow::group_codes(f, dst, g);
    codes[lane] = kvrow::fp8_code(v0, k);
    codes[32 + lane] = kvrow::fp8_code(v1, k);
    if (lane == 0) *kvrow::group_scale(f, dst, scales, g) = math::ue8m0_encode(k);
  }
  if (only_rotated) {
    for (int32_t d = l.first_dim + lane; d < l.first_dim + l.n_rot; d += 32)
      if (!kvrow::is_fp8_dim(f, d)) kvrow::encode_plain(f, dst, d, row[d]);
  } else {
    for (int32_t d = groups * math::kFp8Block + lane; d < head_dim; d += 32) kvrow::encode_plain(f, dst, d, row[d]);
    if (f == KvFormat::Dsv4Row && lane == 0) static_cast<uint8_t*>(dst)[math::Dsv4RowLayout::kPadOffset] = 0;
  }
}

__device__ void kv_store_row(const KvStoreParams& p, float* row, int64_t r, int lane) {
  const int32_t t = static_cast<int32_t>(r / p.n_heads);
  const int32_t h = static_cast<int32_t>(r % p.n_heads);
  const int32_t cell = p.slots[t];
  if (cell < 0 || cell >= p.num_cells) return;
  const int64_t base = t * p.src_token_stride + h * p.src_head_stride;
  for (int32_t d = lane; d < p.head_dim; d += 32) row[d] = kvrow::load_src(p.src, p.src_dtype, base + d);
  __syncwarp();
  if (p.maybe_positions) {
    warp_rotate(row, p.rope, static_cast<float>(p.maybe_positions[t]), p.rope.attention_factor, lane);
    __syncwarp();
  }
  const int64_t row_index = static_cast<int64_t>(cell) * p.n_heads + h;
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
  void* dst = row_ptr(p.pool, row_index, p.row_width, p.format);
  uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
  warp_encode(p.format, row, dst, scales, p.head_dim, p.rope.layout, false, lane);
}

__device__ void kv_rotate_row(const KvRotateParams& p, float* row, int64_t r, int lane) {
  const int64_t bs_heads = static_cast<int64_t>(p.block_size) * p.n_heads;
  const int32_t b = p.blocks[r / bs_heads];
  const int32_t slot = static_cast<int32_t>((r % bs_heads) / p.n_heads);
  const int32_t h = static_cast<int32_t>(r % p.n_heads);
  const int64_t cell = static_cast<int64_t>(b) * p.block_size + slot;
  const int32_t delta = p.cell_delta[cell];
  if (delta == 0) return;
  const int64_t row_index = cell * p.n_heads + h;
  const int32_t groups = kvrow::n_fp8_groups(p.format, p.head_dim);
  void* dst = row_ptr(p.pool, row_index, p.row_width, p.format);
  uint8_t* scales = p.maybe_scales ? p.maybe_scales + row_index * groups : nullptr;
  for (int32_t d = lane; d < p.head_dim; d += 32) row[d] = kvrow::decode(p.format, dst, scales, d);
  __syncwarp();
  warp_rotate(row, p.rope, static_cast<float>(delta), 1.0f, lane);
  __syncwarp();
  warp_encode(p.format, row, dst, scales, p.head_dim, p.rope.layout, true, lane);
}

__global__ void __launch_bounds__(kWarps * 32) kv_store_kernel(const __grid_constant__ KvStoreParams p) {
  __shared__ float smem[kWarps][kMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= static_cast<int64_t>(p.n_tokens) * p.n_heads) return;  // warp-uniform
  kv_store_row(p, smem[warp], r, lane);
}

__global__ void __launch_bounds__(kWarps * 32) kv_rotate_kernel(const __grid_constant__ KvRotateParams p) {
  __shared__ float smem[kWarps][kMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= static_cast<int64_t>(p.n_blocks) * p.block_size * p.n_heads) return;  // warp-uniform
  kv_rotate_row(p, smem[warp], r, lane);
}

unsigned grid_for(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

// ---- fast rotation path: f32 / f16 / bf16 rows, 8 pairs per thread, 16-byte accesses --------
// One thread per (listed block, slot, head, group of 8 pairs): NeoX pairs (i, i + n_rot/2) read
// 8 consecutive dims from each half; interleaved pairs read 16 consecutive dims. Same per-pair
// math (sincos_f32 of the same f32 angle, rotate_pair, the same conversions) as the warp path,
// so both paths give identical bytes.

template <class T>
struct alignas(16) Vec8 {
  T v[8];
};

template <KvFormat F>
__device__ __forceinline__ float to_float(const typename std::conditional<F == KvFormat::F32, float, uint16_t>::type x) {
  if constexpr (F == KvFormat::F32) return x;
  else if constexpr (F == KvFormat::F16) return math::f16_bits_to_f32(x);
  else return math::bf16_bits_to_f32(x);
}

template <KvFormat F>
__device__ __forceinline__ auto from_float(float x) {
  if constexpr (F == KvFormat::F32) return x;
  else if constexpr (F == KvFormat::F16) return math::f32_to_f16_bits(x);
  else return math::f32_to_bf16_bits(x);
}

template <KvFormat F>
__global__ void __launch_bounds__(256) kv_rotate_vec_kernel(const __grid_constant__ KvRotateParams p) {
  using T = typename std::conditional<F == KvFormat::F32, float, uint16_t>::type;
  const math::RopeLayout& l = p.rope.layout;
  const int32_t groups = l.n_pairs() / 8;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid >= static_cast<int64_t>(p.n_blocks) * p.block_size * p.n_heads * groups) return;
  const int32_t g = static_cast<int32_t>(tid % groups);
  const int64_t row = tid / groups;  // (listed block, slot, head)
  const int32_t h = static_cast<int32_t>(row % p.n_heads);
  const int64_t cell_in_list = row / p.n_heads;
  const int32_t b = p.blocks[cell_in_list / p.block_size];
  const int64_t cell = static_cast<int64_t>(b) * p.block_size + cell_in_list % p.block_size;
  const int32_t delta = p.cell_delta[cell];
  if (delta == 0) return;
  T* base = static_cast<T*>(p.pool) + (cell * p.n_heads + h) * p.row_width + l.first_dim;
  Vec8<T>* lo;
  Vec8<T>* hi;
  if (l.interleaved) {
    lo = reinterpret_cast<Vec8<T>*>(base + 16 * g);
    hi = lo + 1;
  } else {
    lo = reinterpret_cast<Vec8<T>*>(base + 8 * g);
    hi = reinterpret_cast<Vec8<T>*>(base + l.n_pairs() + 8 * g);
  }
  Vec8<T> a = *lo, c = *hi;
  float x[16];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    x[k] = to_float<F>(a.v[k]);
    x[8 + k] = to_float<F>(c.v[k]);
  }
  const float pos = static_cast<float>(delta);
  float sn[8], cs[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) math::sincos_f32(math::rope_angle(pos, p.rope.freq[8 * g + k]), &sn[k], &cs[k]);
  // Interleaved: pair k is (x[2k], x[2k+1]) of the 16 consecutive dims; NeoX: (x[k], x[8+k]).
  // Constant indices in both branches keep x in registers.
  if (l.interleaved) {
#pragma unroll
    for (int k = 0; k < 8; ++k) math::rotate_pair(x[2 * k], x[2 * k + 1], cs[k] * 1.0f, sn[k] * 1.0f);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) math::rotate_pair(x[k], x[8 + k], cs[k] * 1.0f, sn[k] * 1.0f);
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    a.v[k] = from_float<F>(x[k]);
    c.v[k] = from_float<F>(x[8 + k]);
  }
  *lo = a;
  *hi = c;
}

// ---- fast store path: f32 / f16 / bf16 pools, 8 dims per 16-byte access ------------------------
// One thread per (token, head, unit): a unit is a group of 8 rotated pairs (2 x 8 dims) or 8
// non-rotated dims. Loads the source as vectors, rotates with the same per-pair math as the warp
// path, converts with the same functions: identical bytes.

template <class T>
__device__ __forceinline__ void load8(const void* src, DType t, int64_t i, float* out) {
  const Vec8<T> v = *reinterpret_cast<const Vec8<T>*>(static_cast<const T*>(src) + i);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if constexpr (sizeof(T) == 4) out[k] = v.v[k];
    else out[k] = t == DType::F16 ? math::f16_bits_to_f32(v.v[k]) : math::bf16_bits_to_f32(v.v[k]);
  }
}

__device__ __forceinline__ void load_src8(const KvStoreParams& p, int64_t i, float* out) {
  if (p.src_dtype == DType::F32) load8<float>(p.src, p.src_dtype, i, out);
  else load8<uint16_t>(p.src, p.src_dtype, i, out);
}

template <KvFormat F>
__device__ __forceinline__ void store8(void* pool, int64_t i, const float* x) {
  using T = typename std::conditional<F == KvFormat::F32, float, uint16_t>::type;
  Vec8<T> v;
#pragma unroll
  for (int k = 0; k < 8; ++k) v.v[k] = from_float<F>(x[k]);
  *reinterpret_cast<Vec8<T>*>(static_cast<T*>(pool) + i) = v;
}

template <KvFormat F>
__global__ void __launch_bounds__(256) kv_store_vec_kernel(const __grid_constant__ KvStoreParams p) {
  const bool rotate = p.maybe_positions != nullptr;
  const math::RopeLayout l = rotate ? p.rope.layout : math::RopeLayout{};
  const int32_t rot_units = l.n_pairs() / 8, plain_units = (p.head_dim - l.n_rot) / 8;
  const int32_t units = rot_units + plain_units;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid >= static_cast<int64_t>(p.n_tokens) * p.n_heads * units) return;
  const int32_t u = static_cast<int32_t>(tid % units);
  const int64_t row = tid / units;
  const int32_t h = static_cast<int32_t>(row % p.n_heads);
  const int32_t t = static_cast<int32_t>(row / p.n_heads);
  const int32_t cell = p.slots[t];
  if (cell < 0 || cell >= p.num_cells) return;
  const int64_t src = t * p.src_token_stride + h * p.src_head_stride;
  const int64_t dst = (static_cast<int64_t>(cell) * p.n_heads + h) * p.row_width;
  float x[16];
  if (u >= rot_units) {  // 8 dims that do not rotate
    const int32_t q = 8 * (u - rot_units);
    const int32_t d = q < l.first_dim ? q : q + l.n_rot;
    load_src8(p, src + d, x);
    store8<F>(p.pool, dst + d, x);
    return;
  }
  // 8 pairs: NeoX dims first + 8u .. +8 and first + n_pairs + 8u .. +8; interleaved 16 dims from first + 16u.
  const int32_t d0 = l.first_dim + (l.interleaved ? 16 * u : 8 * u);
  const int32_t d1 = l.interleaved ? d0 + 8 : l.first_dim + l.n_pairs() + 8 * u;
  load_src8(p, src + d0, x);
  load_src8(p, src + d1, x + 8);
  const float pos = static_cast<float>(p.maybe_positions[t]);
  const float mag = p.rope.attention_factor;
  float sn[8], cs[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) math::sincos_f32(math::rope_angle(pos, p.rope.freq[8 * u + k]), &sn[k], &cs[k]);
  if (l.interleaved) {
#pragma unroll
    for (int k = 0; k < 8; ++k) math::rotate_pair(x[2 * k], x[2 * k + 1], cs[k] * mag, sn[k] * mag);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) math::rotate_pair(x[k], x[8 + k], cs[k] * mag, sn[k] * mag);
  }
  store8<F>(p.pool, dst + d0, x);
  store8<F>(p.pool, dst + d1, x + 8);
}

bool vec_store_ok(const KvStoreParams& p) {
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

// Can the fast path take these params? (16-byte aligned groups of 8 pairs in 16-bit or f32 rows)
bool vec_rotate_ok(const KvRotateParams& p) {
  if (p.format != KvFormat::F16 && p.format != KvFormat::BF16 && p.format != KvFormat::F32) return false;
  const math::RopeLayout& l = p.rope.layout;
  const int64_t es = p.format == KvFormat::F32 ? 4 : 2;
  const bool aligned = reinterpret_cast<uintptr_t>(p.pool) % 16 == 0 && (p.row_width * es) % 16 == 0 &&
                       (l.first_dim * es) % 16 == 0 && (l.n_pairs() * es) % 16 == 0;
  return l.n_pairs() > 0 && l.n_pairs() % 8 == 0 && aligned;
}

}  // namespace

void kv_store(const KvStoreParams& p, Stream stream) {
  const int64_t rows = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  if (rows == 0) return;
  if (vec_store_ok(p)) {
    const int32_t n_rot = p.maybe_positions ? p.rope.layout.n_rot : 0;
    const int64_t threads = rows * ((n_rot / 2) / 8 + (p.head_dim - n_rot) / 8);
    const unsigned grid = static_cast<unsigned>((threads + 255) / 256);
    if (p.format == KvFormat::F16) kv_store_vec_kernel<KvFormat::F16><<<grid, 256, 0, native(stream)>>>(p);
    else if (p.format == KvFormat::BF16) kv_store_vec_kernel<KvFormat::BF16><<<grid, 256, 0, native(stream)>>>(p);
    else kv_store_vec_kernel<KvFormat::F32><<<grid, 256, 0, native(stream)>>>(p);
    KVCORE_CUDA_CHECK_LAUNCH("kv_store_vec_kernel");
    return;
  }
  kv_store_kernel<<<grid_for(rows), kWarps * 32, 0, native(stream)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("kv_store_kernel");
}

void kv_rotate_blocks(const KvRotateParams& p, Stream stream) {
  const int64_t rows = static_cast<int64_t>(p.n_blocks) * p.block_size * p.n_heads;
  if (rows == 0) return;
  if (vec_rotate_ok(p)) {
    const int64_t threads = rows * (p.rope.layout.n_pairs() / 8);
    const unsigned grid = static_cast<unsigned>((threads + 255) / 256);
    if (p.format == KvFormat::F16) kv_rotate_vec_kernel<KvFormat::F16><<<grid, 256, 0, native(stream)>>>(p);
    else if (p.format == KvFormat::BF16) kv_rotate_vec_kernel<KvFormat::BF16><<<grid, 256, 0, native(stream)>>>(p);
    else kv_rotate_vec_kernel<KvFormat::F32><<<grid, 256, 0, native(stream)>>>(p);
    KVCORE_CUDA_CHECK_LAUNCH("kv_rotate_vec_kernel");
    return;
  }
  kv_rotate_kernel<<<grid_for(rows), kWarps * 32, 0, native(stream)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("kv_rotate_kernel");
}

}  // namespace kvcore::cuda
