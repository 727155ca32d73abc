// Context shift on a caller-owned dense KV cache (specs/context-shift.md),
// and the in-place re-rotation of K rows by per-row position deltas.
//
// shift_dense(layers, length, n_keep, n_discard): for every layer,
//   tokens [0, n_keep) keep their bytes; tokens [n_keep, n_keep + n_discard)
//   are dropped; every later token j < length moves to j - n_discard: its V
//   row and the non-rotated dims of its K row keep their exact bytes, its
//   rotated K dims are rotated by delta = -n_discard (a pure rotation: the
//   RopeSpec's attention_factor is never applied). Rows at and beyond
//   length - n_discard are left as they were (stale). n_discard == 0 or
//   nothing retained: no-op.
//
// K formats (chosen by k.dtype()):
//   f32 / f16 / bf16   k [capacity, n_kv_heads, head_dim]
//   u8                 DeepSeek-V4 packed rows, k [capacity, n_kv_heads, 584]
//                      (or [capacity, 584] for one head): 448 e4m3 + 64 bf16
//                      rope tail + 7 ue8m0 + pad; only the tail rotates, so the
//                      RopeSpec must rotate dims inside [448, 512) of head_dim 512.
//   e4m3               fully-FP8 keys, k [capacity, n_kv_heads, head_dim] with
//                      maybe_k_scales ue8m0 [capacity, n_kv_heads, head_dim / 64]:
//                      each 64-block holding rotated dims is dequantized, rotated
//                      and requantized with a fresh scale (lossy: see
//                      shift_rotate_head_fp8; blocks without rotated dims move
//                      byte-identical).
// V (optional: leave maybe_v default-constructed when K and V are one tensor):
//   f32 / f16 / bf16   [capacity, n_kv_heads, v_head_dim]; dtype independent of K.
// Rows: each token's [n_kv_heads, head_dim] block must be contiguous (strides
// [s, head_dim, 1], s >= n_kv_heads * head_dim, any s: K and V may interleave
// in one buffer). Tensors of different layers must not overlap.
//
// CUDA: one launch per group of layers (up to 40 Llama-like layers; FP8 keys
// in a second one), each retained byte read once and written once, no scratch
// copy, whatever the overlap; ordered on `stream`. 16-bit rows without overlap
// use a copy-like sweep over 16-byte chunks; with overlap, and DeepSeek-V4 rows,
// a band-ordered tile kernel; FP8 keys the "chain" kernel, which needs no
// synchronization between threads, except for layouts it does not take (partial
// rotary or heads over 128 dims), which take the tile kernel.
// CPU: OpenMP, same bytes for moves.
//
// Precision (measured by tests/shift_*_test.cpp, head_dim 128, N(0,1) keys,
// rms error relative to a float64 rotation at the final position):
//   angles: delta * w_i is reduced exactly enough in f32 (shift_sincos) that
//   rotating by -n_discard costs ~1e-7 rad even for n_discard ~ 1e5;
//   f16 keys: 2.1e-4 as written, 2.9e-4 after one shift; after 16 / 64 / 1000
//   shifts of -1 applied one by one 1.9e-3 / 6.2e-3 / 6.2e-2, but 2.9e-4 when
//   the same total is applied once (rope_shift_rows with the summed delta);
//   bf16 keys: 1.6e-3 written, 2.1e-3 after one shift, 1.2e-2 / 3.9e-2 / 0.53
//   after 16 / 64 / 1000 single shifts, 2.3e-3 when accumulated once;
//   FP8 e4m3 keys (fully rotated): 0.027 as written, 0.035 after one shift
//   (each shift requantizes: the error grows with every shift, so prefer
//   formats that keep the rotated dims in 16 bits, like DeepSeek-V4's row).
//
// Thread safety: calls may come from several threads at once (what they cache per device is
// guarded) as long as no call writes memory that another one reads or writes.
#pragma once
#include <cstdint>
#include <span>

#include "kvcore/math/rope_spec.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

struct ShiftDenseLayer {
  TensorRef k;               // see above: f32/f16/bf16, u8 (DeepSeek-V4 row) or e4m3
  TensorRef maybe_k_scales;  // ue8m0 [capacity, n_kv_heads, head_dim / 64]; only with e4m3 keys
  TensorRef maybe_v;         // f32/f16/bf16 [capacity, n_kv_heads, v_head_dim]; empty: no V
  RopeSpec rope;             // this layer's RoPE (per-layer theta allowed)
};

// Throws kvcore::Error (InvalidArgument, NotSupported) naming the bad value,
// with every cache byte unchanged, when: a count is negative, n_keep +
// n_discard > length, length > a tensor's capacity, K/V/scales shapes, dtypes,
// strides or devices disagree, or a RopeSpec does not fit its head.
void shift_dense(std::span<const ShiftDenseLayer> layers, int64_t length, int64_t n_keep, int64_t n_discard,
                 Stream stream = {});

// Rotate K rows in place: row r (all its heads) by angle delta[r] * w_i per
// pair: what a manager uses to apply accumulated shifts once. k: any K format
// above with `capacity` read as the number of rows; maybe_k_scales with e4m3;
// delta: i32 [rows], |delta| < 2^24, on k's device.
void rope_shift_rows(const TensorRef& k, const TensorRef& maybe_k_scales, const RopeSpec& rope, const TensorRef& delta,
                     Stream stream = {});

}  // namespace kvcore
