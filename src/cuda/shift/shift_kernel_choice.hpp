// Which CUDA kernel runs shift_dense: one rule, in plain C++ so a CPU test
// checks it (tests/shift_kernel_choice_test.cpp). Benchmarks and tests may force a
// kernel through ShiftDenseParams::kernel (src/ops/tuning.hpp).
//
// The rule follows where each kernel reaches the highest share of copy bandwidth
// (the measurements are in bench/results, shift_*):
//   FP8 keys                     -> chain: a head per thread in registers, no shared-memory
//                                   staging or barriers, which the requantizing rotation needs
//   DeepSeek-V4 rows, or overlap -> single: band-ordered tiles keep every layout and band
//                                   width busy where the sweep's one-window walk cannot
//   16-bit rows, no overlap      -> sweep: one contiguous window of 16-byte chunks, tickets
//                                   so faster blocks take more (closest to a plain copy)
// A kernel that does not take the call's layout falls back to single, which takes every
// layout:
//   chain -> single (a layout the chain kernels do not handle)
//   sweep -> single (overlap, FP8 keys, rows not 8-byte aligned, heads over 512 bytes or
//                    not a power of two, 584-byte rows with odd n_discard)
#pragma once
#include "ops/shift_params.hpp"

namespace kvcore::ops::cuda {

using ops::ShiftKernel;

struct ShiftCall {
  bool any_fp8_keys = false;   // some K tensor holds e4m3 codes + ue8m0 scales
  bool overlap = false;        // n_discard < n_moved: sources and destinations overlap
  bool any_dsv4_rows = false;  // some K tensor holds DeepSeek-V4 packed rows
};

// The kernel tried first (never Auto); the launcher falls back as described above.
inline ShiftKernel choose_shift_kernel(ShiftKernel requested, const ShiftCall& call) {
  if (requested != ShiftKernel::Auto) return requested;
  if (call.any_fp8_keys) return ShiftKernel::Chain;
  if (call.any_dsv4_rows || call.overlap) return ShiftKernel::Single;
  return ShiftKernel::Sweep;
}

}  // namespace kvcore::ops::cuda
