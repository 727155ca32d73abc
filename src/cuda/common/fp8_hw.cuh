// E4M3 conversions on the GPU, two values at a time. On sm_89+ they use the hardware
// conversions (cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2): 4-8x fewer
// instructions than the integer codec, which matters for a kernel that must keep up with
// HBM. They compute exactly math::fp8_encode_scaled / e4m3_decode (same codes for every
// input: tests/cuda/codec_hardware_cuda_test.cu checks all 2^32 floats), with NaN mapped
// to 0x7f as in math/fp8.hpp. Older GPUs use the shared integer code.
// Define KVCORE_FP8_INTEGER_CODEC to force the integer code everywhere.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kvcore/math/fp8.hpp"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(KVCORE_FP8_INTEGER_CODEC)
#define KVCORE_FP8_HW 1
#else
#define KVCORE_FP8_HW 0
#endif

namespace kvcore::ops::cuda::fp8_hw {

// Codes of a * inv_scale (low byte) and b * inv_scale (high byte); inv_scale a power of two.
__device__ __forceinline__ uint32_t encode2_scaled(float a, float b, float inv_scale) {
#if KVCORE_FP8_HW
  // satfinite saturates |x| > 448 and +-inf to +-448, as the clamp of math::e4m3_scaled does
  uint32_t w = __nv_cvt_float2_to_fp8x2(make_float2(a * inv_scale, b * inv_scale), __NV_SATFINITE, __NV_E4M3);
  if (a != a) w = (w & 0xff00u) | 0x7fu;  // NaN -> 0x7f whatever its sign
  if (b != b) w = (w & 0x00ffu) | 0x7f00u;
  return w;
#else
  return uint32_t(math::e4m3_encode(math::e4m3_scaled(a, inv_scale))) |
         (uint32_t(math::e4m3_encode(math::e4m3_scaled(b, inv_scale))) << 8);
#endif
}

// The values of two codes (low byte first), exactly (every E4M3 value is an f16 value).
__device__ __forceinline__ float2 decode2(uint32_t w) {
#if KVCORE_FP8_HW
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  return make_float2(__half2float(__ushort_as_half(h.x)), __half2float(__ushort_as_half(h.y)));
#else
  return make_float2(math::e4m3_decode(uint8_t(w & 0xffu)), math::e4m3_decode(uint8_t((w >> 8) & 0xffu)));
#endif
}

}  // namespace kvcore::ops::cuda::fp8_hw
