// Which CUDA kernel runs shift_dense: one rule, in plain C++ so a CPU test
// checks it (tests/shift_kernel_choice_test.cpp).
//
// KVCORE_SHIFT_KERNEL=flat|chain|single|pipelined|sweep|sweep_cs|sweep_b8|sweep_dyn
// forces a kernel (benchmarks compare them in one run); any other value, or none, leaves the choice to the
// measured rule (H200, GPU runs 4 and 5):
//   FP8 keys              -> chain  (51% of copy vs 22% for the tile kernels)
//   16-bit / DSV4 keys    -> single (80-82% / 66-71% vs the chain's 64-69% / 30%;
//                                    the flat kernel, run 4: 60-76% / 43-46%)
// A kernel that does not take the call's layout falls back along
//   flat -> single (overlap, FP8 keys, or a layout the unit decomposition rejects)
//   chain -> single (a layout the chain kernels do not handle)
//   sweep* -> single (DeepSeek-V4 rows, FP8 keys, rows not 16-byte aligned, heads over
//                     512 bytes; unforced also overlap with bands too narrow for the device)
// so the tile kernel, which takes every layout, always ends the chain.
#pragma once
#include <cstring>
#include <optional>

namespace kvcore::cuda {

enum class ShiftKernel { Flat, Chain, Single, Pipelined, Sweep, SweepCs, SweepB8, SweepDyn };

inline bool is_sweep(ShiftKernel k) {
  return k == ShiftKernel::Sweep || k == ShiftKernel::SweepCs || k == ShiftKernel::SweepB8 || k == ShiftKernel::SweepDyn;
}

// The variant number shift_sweep::launch takes.
inline int sweep_variant(ShiftKernel k) {
  return k == ShiftKernel::SweepCs ? 1 : k == ShiftKernel::SweepB8 ? 2 : k == ShiftKernel::SweepDyn ? 3 : 0;
}

inline std::optional<ShiftKernel> parse_shift_kernel(const char* v) {
  if (!v) return std::nullopt;
  if (std::strcmp(v, "flat") == 0) return ShiftKernel::Flat;
  if (std::strcmp(v, "chain") == 0) return ShiftKernel::Chain;
  if (std::strcmp(v, "single") == 0) return ShiftKernel::Single;
  if (std::strcmp(v, "pipelined") == 0) return ShiftKernel::Pipelined;
  if (std::strcmp(v, "sweep") == 0) return ShiftKernel::Sweep;
  if (std::strcmp(v, "sweep_cs") == 0) return ShiftKernel::SweepCs;
  if (std::strcmp(v, "sweep_b8") == 0) return ShiftKernel::SweepB8;
  if (std::strcmp(v, "sweep_dyn") == 0) return ShiftKernel::SweepDyn;
  return std::nullopt;
}

struct ShiftCall {
  bool any_fp8_keys = false;  // some K tensor holds e4m3 codes + ue8m0 scales
  bool overlap = false;       // n_discard < n_moved: sources and destinations overlap
};

// The kernel tried first; the launcher falls back as described above.
inline ShiftKernel choose_shift_kernel(std::optional<ShiftKernel> forced, const ShiftCall& call) {
  if (forced) return *forced;
  if (call.any_fp8_keys) return ShiftKernel::Chain;
  return ShiftKernel::Single;
}

}  // namespace kvcore::cuda
