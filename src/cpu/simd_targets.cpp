// Target list and the scalar / SIMD switch (see simd_targets.hpp).
#include "cpu/simd_targets.hpp"

#include "cpu/simd_config.hpp"
// clang-format off
#include <hwy/highway.h>
#include <hwy/targets.h>
// clang-format on

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kvcore/error.hpp"

namespace kvcore::ops::cpu {
namespace {

std::atomic<bool> g_scalar{false};

std::vector<SimdTarget> compiled_and_supported() {
  std::vector<SimdTarget> out;
  hwy::SetSupportedTargetsForTest(0);  // the real CPU, not a pin
  const int64_t have = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t t = have; t != 0; t &= t - 1) {
    const int64_t bit = t & -t;  // lower bits are better targets
    out.push_back({bit, hwy::TargetName(bit)});
  }
  return out;
}

// What the CPU offers (computed before any pin) and what KVCORE_CPU_SIMD asks for.
struct Defaults {
  std::vector<SimdTarget> targets;
  int64_t env_choice = kSimdDefault;
};

const Defaults& defaults() {
  static const Defaults d = [] {
    Defaults r;
    r.targets = compiled_and_supported();
    const char* env = std::getenv("KVCORE_CPU_SIMD");
    if (env && *env) {
      if (!std::strcmp(env, "off") || !std::strcmp(env, "scalar") || !std::strcmp(env, "0")) {
        r.env_choice = kSimdScalar;
      } else {
        for (const SimdTarget& t : r.targets)
          if (t.name == env) r.env_choice = t.bits;
      }
    }
    return r;
  }();
  return d;
}

void apply(int64_t bits) {
  g_scalar.store(bits == kSimdScalar);
  hwy::SetSupportedTargetsForTest(bits > 0 ? bits : 0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

void ensure_applied() {
  static std::once_flag once;
  std::call_once(once, [] { apply(defaults().env_choice); });
}

}  // namespace

std::vector<SimdTarget> simd_targets() { return defaults().targets; }

bool simd_on() {
  ensure_applied();
  return !g_scalar.load(std::memory_order_relaxed);
}

std::string simd_active_name() {
  if (!simd_on()) return "scalar";
  const int64_t have = hwy::SupportedTargets() & HWY_TARGETS;
  return have ? hwy::TargetName(have & -have) : "scalar";
}

void simd_pin(int64_t bits) {
  ensure_applied();
  if (bits == kSimdDefault) return apply(defaults().env_choice);
  if (bits == kSimdScalar) return apply(kSimdScalar);
  bool known = false;
  for (const SimdTarget& t : defaults().targets) known = known || t.bits == bits;
  require_arg(known, "simd_pin: target bits ", bits, " are not a compiled target this CPU supports");
  apply(bits);
}

}  // namespace kvcore::ops::cpu
