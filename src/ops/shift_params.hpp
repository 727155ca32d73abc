// Plain parameter structs shared by the CPU and CUDA shift kernels. The entry
// point (src/ops/shift.cpp) validates everything and fills these; kernels
// trust them.
#pragma once
#include <cstdint>

#include "kvcore/math/rope.hpp"
#include "kvcore/stream.hpp"

namespace kvcore::ops {

// How one head of a tensor is stored, i.e. what a shift does to it.
enum class ShiftKind : int32_t {
  Copy = 0,  // V rows: bytes move untouched
  F32 = 1,   // K heads of f32 / f16 / bf16 values
  F16 = 2,
  BF16 = 3,
  Dsv4 = 4,  // DeepSeek-V4 packed row: 584 bytes, bf16 rope tail rotates
  Fp8 = 5,   // e4m3 codes + ue8m0 scales (separate tensor)
};

// One tensor a shift moves (a layer's K with its FP8 scales, or its V), as
// bytes: row of token t, head h starts at base + t * token_stride + h * head_bytes.
struct ShiftTensorParams {
  uint8_t* base = nullptr;           // [capacity][n_heads * head_bytes], token_stride bytes apart
  int64_t token_stride = 0;          // bytes between tokens
  uint8_t* maybe_scales = nullptr;   // Fp8: ue8m0 [capacity][n_heads * scale_head_bytes]
  int64_t scale_token_stride = 0;    // bytes
  int32_t n_heads = 0;
  int32_t head_bytes = 0;            // bytes of one head in base
  int32_t scale_head_bytes = 0;      // Fp8: head_dim / 64; else 0
  ShiftKind kind = ShiftKind::Copy;
  int32_t layer = 0;                 // index into ShiftDenseParams' per-layer tables
};

// Which CUDA kernel runs shift_dense (the CPU has one). Auto: the rule of
// src/cuda/shift/shift_kernel_choice.hpp. The others force a kernel for benchmarks and tests
// (src/ops/tuning.hpp); a forced kernel that does not take the call's layout falls back to
// Single, the band-ordered tile kernel that takes every layout. All compute the same bytes.
enum class ShiftKernel : int32_t {
  Auto = 0,
  Chain = 1,   // a thread per column of units, no ordering between threads (shift_chain.hpp)
  Single = 2,  // band-ordered tiles through shared memory (shift.cu)
  Sweep = 3,   // one window of 16-byte chunks over all tensors, tickets (shift_sweep.hpp); no overlap
};

// shift_dense on every tensor: move token n_keep + n_discard + j to n_keep + j
// for j in [0, n_moved), rotating K heads by delta = -n_discard.
// All arrays are host memory (the CUDA launcher copies them into kernel params).
struct ShiftDenseParams {
  const ShiftTensorParams* tensors = nullptr;  // [n_tensors], ordered by layer
  int32_t n_tensors = 0;
  const math::RopeLayout* layouts = nullptr;   // [n_layers]
  const int32_t* pair_offset = nullptr;        // [n_layers]: first entry of the layer in cos_t / sin_t
  const float* cos_t = nullptr;                // cos(-n_discard * w_i), all layers concatenated
  const float* sin_t = nullptr;
  int32_t n_layers = 0;
  int64_t n_keep = 0, n_discard = 0, n_moved = 0;
  int32_t device_index = 0;
  ShiftKernel kernel = ShiftKernel::Auto;  // CUDA only
};

// rope_shift_rows: rotate row r of `k` in place by delta[r] * w_i per pair.
struct RopeShiftRowsParams {
  ShiftTensorParams k;            // token_stride = row stride; rows = capacity
  int64_t rows = 0;
  const int32_t* delta = nullptr;  // [rows], on k's device
  math::RopeTable table;           // layout + f32 frequencies (attention_factor unused)
  int32_t device_index = 0;
};

// Largest head (bytes, FP8 scales included) the kernels accept; FP8 heads up
// to 576 dims (kMaxKvHeadDim: MLA's latent K, RoPE on its 64-dim tail). A rotation
// dequantizes only the 64-blocks holding rotated dims, at most 512 dims of them
// (n_rot <= 512 at the head or the tail of the head: 8 blocks), into a scratch of
// kShiftFp8ScratchDims floats (per warp in CUDA shared memory).
inline constexpr int32_t kShiftMaxHeadBytes = 8192;
inline constexpr int32_t kShiftMaxFp8HeadDim = 576;
inline constexpr int32_t kShiftFp8ScratchDims = 512;

}  // namespace kvcore::ops

namespace kvcore::cpu {
void shift_dense(const ops::ShiftDenseParams& p);
void rope_shift_rows(const ops::RopeShiftRowsParams& p);
}  // namespace kvcore::cpu

namespace kvcore::ops::cuda {
void shift_dense(const ops::ShiftDenseParams& p, Stream stream);
void rope_shift_rows(const ops::RopeShiftRowsParams& p, Stream stream);
}  // namespace kvcore::ops::cuda
