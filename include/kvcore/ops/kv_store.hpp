// kv_store: write K or V rows into the cells of a paged pool, in one fused
// pass per row: load (f32, f16 or bf16 source), rotate (optional: K at its
// position, rope-stored caches), quantize to the pool's format, place into the
// cell a slot mapping names. kv_rotate_blocks: rotate the K rows of listed
// blocks in place by a per-cell position delta (how a paged cache applies the
// deltas that shifts accumulate, once, before the keys are read).
//
// Pools follow kvcore/paged_layout.hpp: data [num_blocks, block_size, n_heads, row_width]
// where row_width is head_dim (f32, f16, bf16, e4m3 codes) or 584 bytes (the
// DeepSeek-V4 row, math/dsv4_row.hpp). A cell id is block * block_size + slot.
//
// Thread safety: calls may come from several threads at once (what they cache per device is
// guarded) as long as no call writes memory that another one reads or writes.
#pragma once
#include <cstdint>
#include <string_view>

#include "kvcore/dtype.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// How one row of head_dim values is stored in a pool.
enum class KvFormat : uint8_t {
  F32,
  F16,
  BF16,
  Fp8,      // e4m3 codes [.., head_dim] + one UE8M0 scale byte per 64 dims [.., head_dim / 64]
  Dsv4Row,  // 584 bytes: 448 e4m3 + 64 bf16 rope tail + 7 UE8M0 scales + 1 pad (head_dim 512, K only)
};

constexpr std::string_view kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::F32: return "f32";
    case KvFormat::F16: return "f16";
    case KvFormat::BF16: return "bf16";
    case KvFormat::Fp8: return "fp8";
    case KvFormat::Dsv4Row: return "dsv4row";
  }
  return "?";
}

// dtype of the pool's data tensor.
constexpr DType kv_format_dtype(KvFormat f) {
  switch (f) {
    case KvFormat::F32: return DType::F32;
    case KvFormat::F16: return DType::F16;
    case KvFormat::BF16: return DType::BF16;
    case KvFormat::Fp8: return DType::E4M3;
    case KvFormat::Dsv4Row: return DType::U8;
  }
  return DType::U8;
}

// Elements of the data tensor per (cell, head).
constexpr int32_t kv_row_width(KvFormat f, int32_t head_dim) {
  return f == KvFormat::Dsv4Row ? math::Dsv4RowLayout::kBytes : head_dim;
}

constexpr bool kv_format_has_scales(KvFormat f) { return f == KvFormat::Fp8; }

// Bytes one (cell, head) row takes, scales included.
constexpr int64_t kv_row_bytes(KvFormat f, int32_t head_dim) {
  return static_cast<int64_t>(kv_row_width(f, head_dim)) * static_cast<int64_t>(dtype_size(kv_format_dtype(f))) +
         (kv_format_has_scales(f) ? head_dim / 64 : 0);
}

// The widest row the kv_store family (and so PagedCache) holds: DeepSeek-V2/V3 MLA's K row of
// 576 dims (512 latent dims and a 64-dim RoPE tail). RoPE rotates at most 2 * RopeTable::kMaxPairs
// = 512 of a row's dims, so a row wider than that must rotate a slice of it (MLA: the tail).
inline constexpr int32_t kMaxKvHeadDim = 576;

// One layer's pool of K (or V) rows.
struct KvPool {
  KvFormat format = KvFormat::F16;
  int32_t head_dim = 0;  // logical dims per row, 1..kMaxKvHeadDim (512 for Dsv4Row)
  TensorRef data;        // [num_blocks, block_size, n_heads, kv_row_width(format, head_dim)] of kv_format_dtype(format)
  TensorRef scales;      // Fp8 only: UE8M0 [num_blocks, block_size, n_heads, head_dim / 64]; else empty
};

// Store n_tokens rows per head into the pool.
//   src:             [n_tokens, n_heads, head_dim] f32, f16 or bf16 (any token/head strides, last stride 1)
//   slots:           i32 [n_tokens] cell ids (block * block_size + slot); a negative id skips the row
//   maybe_positions: i32 [n_tokens] (with maybe_rope): rotate each row at its position first, cos and
//                    sin scaled by rope.attention_factor (what a model's RoPE does at write time)
// Fp8 and the Dsv4Row nope dims: per 64 dims, scale = 2^ceil(log2(max(amax, 1e-4) / 448)), codes
// e4m3(v / scale) (math/fp8.hpp); Dsv4Row's last 64 dims are stored as bf16 and the RoPE slice must
// lie inside them. On CUDA, slot ids outside the pool are skipped (they cannot be checked on the host).
//   maybe_angles:    f32 [n_tokens, rope.n_pairs, 2] (optional, with maybe_positions): the cos and sin
//                    kv_rope_angles() computed for these positions and a table with the same
//                    frequencies; the kernels then read them instead of computing them (the same
//                    bytes result: layers that share a RoPE table compute their angles once).
void kv_store(const TensorRef& src, const TensorRef& slots, const KvPool& pool, const TensorRef& maybe_positions,
              const math::RopeTable* maybe_rope, Stream stream = {}, const TensorRef& maybe_angles = {});

// cos and sin (math::sincos_f32 of rope_angle(position, freq[i]), unscaled) of every pair at every
// position: positions i32 [n], out f32 [n, rope.n_pairs, 2] (cos, sin), on one device.
void kv_rope_angles(const TensorRef& positions, const math::RopeTable& rope, const TensorRef& out, Stream stream = {});

// Rotate, in place, every row of the listed blocks whose cell delta is non-zero by the angle
// delta * freq[i] per pair (magnitude 1: a shift never re-applies the attention factor).
//   blocks:     i32 [n] block ids (distinct)
//   cell_delta: i32 [num_blocks, block_size] position delta per cell (0: leave the cell alone)
// Only the rotated dims change: 16-bit and f32 rows rewrite those dims; Fp8 rows re-quantize
// the 64-dim groups that contain rotated dims (dequantize, rotate, quantize: lossy); Dsv4Row
// rewrites its bf16 tail and never touches the FP8 bytes.
void kv_rotate_blocks(const KvPool& pool, const TensorRef& blocks, const TensorRef& cell_delta,
                      const math::RopeTable& rope, Stream stream = {});

}  // namespace kvcore
