// Register moves of one shift unit (1, 2, 4, 8 or 16 bytes) between global memory and a
// shift_chain::Chunk, for the chain shift kernel. Streaming loads: a shift
// reads every byte once.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/shift/shift_chain.hpp"

namespace kvcore::ops::cuda {

using shift_chain::Chunk;

__device__ __forceinline__ Chunk load_chunk(const uint8_t* g, int vec) {
  Chunk c{};
  switch (vec) {
    case 16: {
      const uint4 v = __ldcs(reinterpret_cast<const uint4*>(g));
      c.w[0] = v.x, c.w[1] = v.y, c.w[2] = v.z, c.w[3] = v.w;
    } break;
    case 8: {
      const uint2 v = __ldcs(reinterpret_cast<const uint2*>(g));
      c.w[0] = v.x, c.w[1] = v.y;
    } break;
    case 4: c.w[0] = __ldcs(reinterpret_cast<const unsigned int*>(g)); break;
    case 2: c.w[0] = *reinterpret_cast<const uint16_t*>(g); break;
    default: c.w[0] = *g; break;
  }
  return c;
}

__device__ __forceinline__ void store_chunk(uint8_t* g, const Chunk& c, int vec) {
  switch (vec) {
    case 16: *reinterpret_cast<uint4*>(g) = make_uint4(c.w[0], c.w[1], c.w[2], c.w[3]); break;
    case 8: *reinterpret_cast<uint2*>(g) = make_uint2(c.w[0], c.w[1]); break;
    case 4: *reinterpret_cast<uint32_t*>(g) = c.w[0]; break;
    case 2: *reinterpret_cast<uint16_t*>(g) = static_cast<uint16_t>(c.w[0]); break;
    default: *g = static_cast<uint8_t>(c.w[0]); break;
  }
}

}  // namespace kvcore::ops::cuda
