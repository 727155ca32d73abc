// The SIMD targets of the CPU kernels and the switch between them and the
// scalar path.
//
// The scalar path (plain C++, one element at a time) is the reference every
// SIMD kernel is tested against and the fallback for shapes a SIMD kernel does
// not serve. By default the kernels use the best compiled SIMD target the CPU
// supports. The environment variable KVCORE_CPU_SIMD, read once, overrides it:
// "off" (or "scalar", "0") forces the scalar path; a target name (simd_targets()
// lists them, e.g. "AVX2") pins that target when the CPU supports it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvcore::ops::cpu {

struct SimdTarget {
  int64_t bits;      // Highway's target bit (HWY_AVX2, ...)
  std::string name;  // Highway's name ("AVX2", "AVX3", "SSE4", "EMU128")
};

// Compiled targets this CPU supports, best first.
std::vector<SimdTarget> simd_targets();

// Whether the SIMD kernels run (false: the scalar path serves every call).
bool simd_on();

// The target the SIMD kernels dispatch to now, or "scalar".
std::string simd_active_name();

// Pin one target (bits of an entry of simd_targets()), the scalar path (kSimdScalar),
// or return to the default (kSimdDefault). For tests and benchmarks; not thread-safe
// against kernels running at the same time.
inline constexpr int64_t kSimdDefault = 0;
inline constexpr int64_t kSimdScalar = -1;
void simd_pin(int64_t bits);

// Pins for a scope, then restores the default.
class SimdPin {
 public:
  explicit SimdPin(int64_t bits) { simd_pin(bits); }
  ~SimdPin() { simd_pin(kSimdDefault); }
  SimdPin(const SimdPin&) = delete;
  SimdPin& operator=(const SimdPin&) = delete;
};

}  // namespace kvcore::ops::cpu
