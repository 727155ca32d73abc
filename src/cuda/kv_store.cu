// CUDA kernels of the kv_store family. One warp per (token or cell, head) row:
// the row is staged in shared memory as f32 (coalesced loads), rotated pair by
// pair, then encoded; an FP8 group's amax is one warp reduction (32 lanes x 2
// values = 64 dims). Per-element math comes from ops/kv_store_row.hpp, shared
// with the CPU kernels, so both give the same bytes for the same floats.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/common/fp8_hw.cuh"
#include "cuda/kv_store_chunk.cuh"
#include "ops/kv_store_params.hpp"
#include "ops/kv_store_row.hpp"
#include "ops/kv_store_vec.hpp"

namespace kvcore::ops::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxDim = kMaxKvHeadDim;  // a warp's staged f32 row (18 KiB of shared memory per block)
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
    const uint32_t pair = fp8_hw::encode2_scaled(v0, v1, math::pow2f(-k));  // kvrow::fp8_code of both (fp8_hw.cuh)
    codes[lane] = static_cast<uint8_t>(pair & 0xffu);
    codes[32 + lane] = static_cast<uint8_t>(pair >> 8);
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
  if (p.maybe_angles) {
    const float* a = p.maybe_angles + static_cast<int64_t>(t) * p.rope.layout.n_pairs() * 2;
    const float mag = p.rope.attention_factor;
    for (int32_t i = lane; i < p.rope.layout.n_pairs(); i += 32)
      math::rotate_pair(row[p.rope.layout.dim0(i)], row[p.rope.layout.dim1(i)], a[2 * i] * mag, a[2 * i + 1] * mag);
    __syncwarp();
  } else if (p.maybe_positions) {
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

// Thin kernels over the vectorized bodies (ops/kv_store_vec.hpp).
template <KvFormat F>
__global__ void __launch_bounds__(256) kv_rotate_vec_kernel(const __grid_constant__ KvRotateParams p) {
  kvvec::kv_rotate_vec_unit<F>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
}

template <KvFormat F>
__global__ void __launch_bounds__(256) kv_store_vec_kernel(const __grid_constant__ KvStoreParams p) {
  kvvec::kv_store_vec_unit<F>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
}

// ---- FP8 store: R = head_dim / 16 threads per (token, head) row, 16 dims each -------------------
// Contiguous mode (no rotation, or interleaved pairs over the whole row): thread u holds dims
// [16u, 16u + 16), an FP8 group is 4 lanes. NeoX mode (pairs (i, i + head_dim/2) over the whole
// row): thread u holds dims [8u, 8u + 8) and [head_dim/2 + 8u, ...), so it rotates in registers;
// each of its two chunks belongs to a group of 8 lanes. Group amax: xor shuffles inside those
// lanes (R divides 32, so rows never straddle a warp). Same per-element math as the CPU kernel:
// identical bytes for identical floats. Every lane reaches the shuffles (no early return).
enum class Fp8Mode : int { None = 0, Contiguous = 1, Neox = 2 };

Fp8Mode fp8_vec_mode(const KvStoreParams& p) {
  if (p.format != KvFormat::Fp8) return Fp8Mode::None;
  const int32_t D = p.head_dim;
  if (D != 64 && D != 128 && D != 256 && D != 512) return Fp8Mode::None;
  const int64_t es = p.src_dtype == DType::F32 ? 4 : 2;
  const bool src_aligned = reinterpret_cast<uintptr_t>(p.src) % 16 == 0 && (p.src_token_stride * es) % 16 == 0 &&
                           (p.src_head_stride * es) % 16 == 0;
  if (!src_aligned || reinterpret_cast<uintptr_t>(p.pool) % 16 != 0) return Fp8Mode::None;
  const math::RopeLayout& l = p.rope.layout;
  if (!p.maybe_positions || l.n_rot == 0) return Fp8Mode::Contiguous;
  if (l.first_dim != 0 || l.n_rot != D) return Fp8Mode::None;
  if (l.interleaved) return Fp8Mode::Contiguous;
  return D >= 128 ? Fp8Mode::Neox : Fp8Mode::None;
}

template <Fp8Mode M>
__global__ void __launch_bounds__(256) kv_store_fp8_kernel(const __grid_constant__ KvStoreParams p) {
  const int32_t R = p.head_dim / 16;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = static_cast<int64_t>(p.n_tokens) * p.n_heads * R;
  const int32_t u = static_cast<int32_t>(tid % R);
  const int64_t row = tid / R;
  const int32_t h = static_cast<int32_t>(row % p.n_heads);
  const int32_t t = static_cast<int32_t>(row / p.n_heads);
  const int32_t cell = tid < total ? p.slots[t] : -1;
  const bool active = cell >= 0 && cell < p.num_cells;
  const int32_t half = p.head_dim / 2;
  const int32_t d0 = M == Fp8Mode::Neox ? 8 * u : 16 * u;
  const int32_t d1 = M == Fp8Mode::Neox ? half + 8 * u : d0 + 8;
  float x[16];
  if (active) {
    const int64_t src = t * p.src_token_stride + h * p.src_head_stride;
    kvvec::load_src8(p, src + d0, x);
    kvvec::load_src8(p, src + d1, x + 8);
    if (p.maybe_positions && p.rope.layout.n_rot > 0) {
      float sn[8], cs[8];
      kvvec::angles8(p, t, u, cs, sn);
      kvvec::rotate8(x, M == Fp8Mode::Contiguous, cs, sn, p.rope.attention_factor);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 16; ++k) x[k] = 0.0f;
  }
  float a0 = chunk_amax(x), a1 = chunk_amax(x + 8);
  if (M == Fp8Mode::Contiguous) {  // both chunks in one group of 4 lanes
    a0 = fmaxf(a0, a1);
    a0 = fmaxf(a0, __shfl_xor_sync(kFull, a0, 1));
    a0 = fmaxf(a0, __shfl_xor_sync(kFull, a0, 2));
    a1 = a0;
  } else {  // lo chunks of 8 lanes form one group, hi chunks another
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
      a0 = fmaxf(a0, __shfl_xor_sync(kFull, a0, off));
      a1 = fmaxf(a1, __shfl_xor_sync(kFull, a1, off));
    }
  }
  if (!active) return;
  const int k0 = math::e4m3_scale_exponent(a0), k1 = math::e4m3_scale_exponent(a1);
  const int64_t row_index = static_cast<int64_t>(cell) * p.n_heads + h;
  uint8_t* dst = static_cast<uint8_t*>(p.pool) + row_index * p.head_dim;
  uint8_t* scales = p.maybe_scales + row_index * (p.head_dim / 64);
  const uint2 c0 = fp8_codes8(x, k0), c1 = fp8_codes8(x + 8, k1);
  if (M == Fp8Mode::Contiguous) {
    *reinterpret_cast<uint4*>(dst + d0) = make_uint4(c0.x, c0.y, c1.x, c1.y);
    if (u % 4 == 0) scales[u / 4] = math::ue8m0_encode(k0);
  } else {
    *reinterpret_cast<uint2*>(dst + d0) = c0;
    *reinterpret_cast<uint2*>(dst + d1) = c1;
    if (u % 8 == 0) {
      scales[d0 / 64] = math::ue8m0_encode(k0);
      scales[d1 / 64] = math::ue8m0_encode(k1);
    }
  }
}

__global__ void __launch_bounds__(256) kv_rope_angles_kernel(const __grid_constant__ KvAnglesParams p) {
  const int32_t np = p.rope.layout.n_pairs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.n) * np) return;
  const int32_t t = static_cast<int32_t>(i / np), k = static_cast<int32_t>(i % np);
  float sv, cv;
  math::sincos_f32(math::rope_angle(static_cast<float>(p.positions[t]), p.rope.freq[k]), &sv, &cv);
  reinterpret_cast<float2*>(p.out)[i] = make_float2(cv, sv);
}

}  // namespace

void kv_rope_angles(const KvAnglesParams& p, Stream stream) {
  const int64_t n = static_cast<int64_t>(p.n) * p.rope.layout.n_pairs();
  if (n == 0) return;
  kv_rope_angles_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, native(stream)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("kv_rope_angles_kernel");
}

void kv_store(const KvStoreParams& p, Stream stream) {
  const int64_t rows = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  if (rows == 0) return;
  if (kvvec::vec_store_ok(p)) {
    const int64_t threads = kvvec::kv_store_vec_threads(p);
    const unsigned grid = static_cast<unsigned>((threads + 255) / 256);
    if (p.format == KvFormat::F16) kv_store_vec_kernel<KvFormat::F16><<<grid, 256, 0, native(stream)>>>(p);
    else if (p.format == KvFormat::BF16) kv_store_vec_kernel<KvFormat::BF16><<<grid, 256, 0, native(stream)>>>(p);
    else kv_store_vec_kernel<KvFormat::F32><<<grid, 256, 0, native(stream)>>>(p);
    KVCORE_CUDA_CHECK_LAUNCH("kv_store_vec_kernel");
    return;
  }
  const Fp8Mode m = fp8_vec_mode(p);
  if (m != Fp8Mode::None) {
    const int64_t threads = rows * (p.head_dim / 16);
    const unsigned grid = static_cast<unsigned>((threads + 255) / 256);
    if (m == Fp8Mode::Neox) kv_store_fp8_kernel<Fp8Mode::Neox><<<grid, 256, 0, native(stream)>>>(p);
    else kv_store_fp8_kernel<Fp8Mode::Contiguous><<<grid, 256, 0, native(stream)>>>(p);
    KVCORE_CUDA_CHECK_LAUNCH("kv_store_fp8_kernel");
    return;
  }
  kv_store_kernel<<<grid_for(rows), kWarps * 32, 0, native(stream)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("kv_store_kernel");
}

void kv_rotate_blocks(const KvRotateParams& p, Stream stream) {
  const int64_t rows = static_cast<int64_t>(p.n_blocks) * p.block_size * p.n_heads;
  if (rows == 0) return;
  if (kvvec::vec_rotate_ok(p)) {
    const int64_t threads = static_cast<int64_t>(p.n_blocks) * p.block_size * (p.rope.layout.n_pairs() / 8);
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

}  // namespace kvcore::ops::cuda
