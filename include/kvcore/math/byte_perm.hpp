// PTX prmt.b32 in its default mode, on host and device: bit-level code written with it (table
// lookups of 4 nibbles at once) runs the same on both, so the CPU tests can check it exhaustively.
#pragma once
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

// Byte j of the result is byte s_j of the 8-byte source {b:a} (a's bytes 0..3, b's 4..7), where
// s_j = bits 4j..4j+2 of sel; when bit 4j+3 is set it is instead that byte's sign bit replicated
// (0x00 or 0xff). The upper 16 bits of sel are ignored. Device code uses the instruction itself:
// CUDA documents __byte_perm with 3-bit selectors only, prmt's sign mode is PTX's.
KVCORE_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t src = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int j = 0; j < 4; ++j) {
    const uint32_t s = (sel >> (4 * j)) & 0xfu;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (s & 0x7u))) & 0xffu;
    if (s & 0x8u) byte = (byte & 0x80u) ? 0xffu : 0x00u;
    d |= byte << (8 * j);
  }
  return d;
#endif
}

}  // namespace kvcore::math
