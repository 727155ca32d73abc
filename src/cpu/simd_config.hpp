// Which SIMD targets the CPU kernels are compiled for. Every translation unit
// that includes Highway includes this first, so all of them agree on the set.
//
// Highway compiles each kernel once per target (hwy/foreach_target.h) and picks
// the best the running CPU supports at its first call (HWY_DYNAMIC_DISPATCH):
// on x86-64 EMU128 (plain C++, any x86-64), SSE4, AVX2 (with FMA and F16C) and
// AVX3 (AVX-512 F/BW/DQ/VL). SSSE3 is left out: the CPUs that have SSSE3 but not
// SSE4.1 are rare enough that the EMU128 fallback serves them.
#pragma once

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif

// Lambdas handed to HWY_INLINE templates (vector arguments in registers): forced inline
// like the template, since a lambda call that stays a call passes vectors through memory.
#if defined(__GNUC__) || defined(__clang__)
#define KVCORE_INLINE_LAMBDA __attribute__((always_inline))
#else
#define KVCORE_INLINE_LAMBDA
#endif
