// The reference of kvcore/math/fp4_bf16.hpp's decode, shared by its CPU and CUDA tests:
// bf16(e2m1_decode(c) * ue8m0_decode(b)), what the tensor-core scorer once decoded in f32.
#pragma once
#include <cstdint>
#include <vector>

#include "kvcore/math/fp4.hpp"
#include "kvcore/math/half.hpp"

namespace fp4_bf16_test {

// A NaN (b = 0xff) as the GPU's conversion gives it, the canonical 0x7fff (f32_to_bf16_bits says 0x7fc0).
inline uint16_t ref_bf16(uint32_t c, uint32_t b) {
  const float v = kvcore::math::e2m1_decode(static_cast<uint8_t>(c)) * kvcore::math::ue8m0_decode(static_cast<uint8_t>(b));
  return v != v ? 0x7fffu : kvcore::math::f32_to_bf16_bits(v);
}

// ref_bf16 of every scale byte b and code c, at [16 b + c].
inline std::vector<uint16_t> ref_table() {
  std::vector<uint16_t> ref(256 * 16);
  for (uint32_t b = 0; b < 256; ++b)
    for (uint32_t c = 0; c < 16; ++c) ref[b * 16 + c] = ref_bf16(c, b);
  return ref;
}

}  // namespace fp4_bf16_test
