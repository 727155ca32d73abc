// Which CUDA kernel runs shift_dense: one rule, in plain C++ so a CPU test
// checks it (tests/shift_kernel_choice_test.cpp).
//
// KVCORE_SHIFT_KERNEL=sweep_dyn|sweep|flat|chain|single|pipelined forces a kernel
// (benchmarks compare them in one run); any other value, or none, leaves the
// choice to the measured rule (H200; shares of copy bandwidth):
//   FP8 keys                     -> chain     (51% of copy vs 22% for the tile kernels, runs 4-9)
//   DeepSeek-V4 rows             -> single    (half: 65/71% vs the sweep's 59/64%, run B)
//   overlap (n_discard < moved)  -> single    (d256: 70/71% vs the sweep's 64/66%, run B)
//   16-bit rows, no overlap      -> sweep_dyn (half: 77/91/92% at 4k/32k/128k vs single's
//                                              69/82/80%, run B)
// A kernel that does not take the call's layout falls back along
//   flat -> single (overlap, FP8 keys, or a layout the unit decomposition rejects)
//   chain -> single (a layout the chain kernels do not handle)
//   sweep, sweep_dyn -> single (FP8 keys, rows not 8-byte aligned, heads over 512 bytes or
//                               not a power of two, 584-byte rows with odd n_discard; unforced
//                               also overlap with bands too narrow to fill the device)
// (sweep_dyn with overlap is the static sweep) so the tile kernel, which takes every layout,
// always ends the chain.
#pragma once
#include <cstring>
#include <optional>

namespace kvcore::cuda {

enum class ShiftKernel { Flat, Chain, Single, Pipelined, Sweep, SweepDyn };

inline std::optional<ShiftKernel> parse_shift_kernel(const char* v) {
  if (!v) return std::nullopt;
  if (std::strcmp(v, "flat") == 0) return ShiftKernel::Flat;
  if (std::strcmp(v, "chain") == 0) return ShiftKernel::Chain;
  if (std::strcmp(v, "single") == 0) return ShiftKernel::Single;
  if (std::strcmp(v, "pipelined") == 0) return ShiftKernel::Pipelined;
  if (std::strcmp(v, "sweep") == 0) return ShiftKernel::Sweep;
  if (std::strcmp(v, "sweep_dyn") == 0) return ShiftKernel::SweepDyn;
  return std::nullopt;
}

struct ShiftCall {
  bool any_fp8_keys = false;   // some K tensor holds e4m3 codes + ue8m0 scales
  bool overlap = false;        // n_discard < n_moved: sources and destinations overlap
  bool any_dsv4_rows = false;  // some K tensor holds DeepSeek-V4 packed rows
};

// The kernel tried first; the launcher falls back as described above.
inline ShiftKernel choose_shift_kernel(std::optional<ShiftKernel> forced, const ShiftCall& call) {
  if (forced) return *forced;
  if (call.any_fp8_keys) return ShiftKernel::Chain;
  if (call.any_dsv4_rows || call.overlap) return ShiftKernel::Single;
  return ShiftKernel::SweepDyn;
}

}  // namespace kvcore::cuda
