// The SIMD path of rope_apply on the CPU (Highway, every target of
// simd_config.hpp): the same bits as the scalar path in src/cpu/rope.cpp.
#pragma once
#include "ops/rope_params.hpp"

namespace kvcore::ops::cpu {
void rope_apply_simd(const RopeApplyParams& p);
}
