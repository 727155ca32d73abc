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
#include "ops/kv_store_vec.hpp"

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

// Thin kernels over the vectorized bodies (ops/kv_store_vec.hpp).
template <KvFormat F>
__global__ void __launch_bounds__(256) kv_rotate_vec_kernel(const __grid_constant__ KvRotateParams p) {
  kvvec::kv_rotate_vec_unit<F>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
}

template <KvFormat F>
__global__ void __launch_bounds__(256) kv_store_vec_kernel(const __grid_constant__ KvStoreParams p) {
  kvvec::kv_store_vec_unit<F>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
}

}  // namespace

void kv_store(const KvStoreParams& p, Stream stream) {
  const int64_t rows = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  if (rows == 0) return;
  if (kvvec::vec_store_ok(p)) {
    const int32_t n_rot = p.maybe_positions ? p.rope.layout.n_rot : 0;
    const int64_t threads = static_cast<int64_t>(p.n_tokens) * ((n_rot / 2) / 8 + (p.head_dim - n_rot) / 8);
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

}  // namespace kvcore::cuda
