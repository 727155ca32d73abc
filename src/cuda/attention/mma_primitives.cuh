// Building blocks of the tensor-core attention kernels: swizzled shared-memory tiles,
// cp.async copies, ldmatrix, mma.sync m16n8k16, hi/lo splits, FP8 pairs, and the f32
// sin/cos used when keys are rotated while read.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/cp_async.cuh"

namespace kvcore::ops::cuda::mma_attn {

// Byte offset of 16-byte chunk `c` of tile row `r`, XOR-swizzled so that the 8 rows an
// ldmatrix phase reads at one logical chunk fall in 8 different bank groups.
template <int CHUNKS>
__device__ __forceinline__ int swz(int r, int c) {
  if constexpr (CHUNKS >= 8) return (r * CHUNKS + (c ^ (r & 7))) * 16;
  else return (r * CHUNKS + (c ^ ((r >> 1) & 3))) * 16;  // 64-byte rows: two per 128 bytes
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool fill) {
  const int n = fill ? 16 : 0;  // 0: write zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
using kvcore::ops::cuda::cp_async_commit;
using kvcore::ops::cuda::cp_async_wait;

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b, m16n8k16, f32 accumulators; BF16 picks the bf16 variant.
template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> hi and lo halves of the mma type, packed (x in the low 16 bits).
template <bool BF16>
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo) {
  if constexpr (BF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  } else {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  }
}

// 2^x on the SFU (ex2.approx: ~2 ulp), denormal results flushed to 0: the exp2 the online
// softmax passes to math::softmax_weight / softmax_rescale.
struct Exp2Ftz {
  __device__ __forceinline__ float operator()(float x) const {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  }
};

// Two E4M3 codes (low byte first) -> f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

// The two E4M3 codes in the HIGH half of `four` -> f16x2. On sm_89+ the conversion reads
// the upper half in place (F2FP ... R.H1), saving the shift `four >> 16` would cost.
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t four) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(four));
  return r;
#else
  return e4m3x2_to_f16x2(four >> 16);
#endif
}

// sin and cos of an f32 angle: Cody-Waite reduction by pi/2 in three f32 parts (FMA keeps
// each step exact to ~1 ulp of the remainder for |a| < ~2^17 * pi), then the SFU on
// |r| <= pi/4 (abs. error < 4e-7). The CPU reference rounds a double result (0.5 ulp).
// The quadrant is read from the bits of the rounding sum (exact for |a| < 2^22) and applied
// by a swap and two sign flips: the ternary chain compiled to an indexed constant load.
__device__ __forceinline__ void sincos_reduced(float a, float* s, float* c) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = fmaf(a, 0.636619772367581343f, kRound);
  const float k = t - kRound;
  const uint32_t q = __float_as_uint(t);  // low bits: k mod 4
  float r = fmaf(-k, 0x1.921fb6p+0f, a);
  r = fmaf(-k, -0x1.777a5cp-25f, r);
  r = fmaf(-k, -0x1.ee59dap-50f, r);
  float sr, cr;
  __sincosf(r, &sr, &cr);
  const bool swap = q & 1u;  // quadrants 1, 3: sin <- cos, cos <- sin
  const float s0 = swap ? cr : sr, c0 = swap ? sr : cr;
  *s = __uint_as_float(__float_as_uint(s0) ^ ((q & 2u) << 30));          // negative in quadrants 2, 3
  *c = __uint_as_float(__float_as_uint(c0) ^ (((q + 1u) & 2u) << 30));   // negative in quadrants 1, 2
}

// 16-bit element d of tile row r (swizzled like the cp.async copies).
template <int CHUNKS>
__device__ __forceinline__ int elem_off(int r, int d) {
  return swz<CHUNKS>(r, d / 8) + (d % 8) * 2;
}

template <bool BF16>
__device__ __forceinline__ float ld16(const unsigned char* p) {
  const uint16_t b = *reinterpret_cast<const uint16_t*>(p);
  return BF16 ? __uint_as_float(uint32_t{b} << 16) : __half2float(__ushort_as_half(b));
}
template <bool BF16>
__device__ __forceinline__ void st16_split(unsigned char* hi, unsigned char* lo, float x) {
  if constexpr (BF16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    const __nv_bfloat16 l = __float2bfloat16_rn(x - __bfloat162float(h));
    *reinterpret_cast<__nv_bfloat16*>(hi) = h;
    *reinterpret_cast<__nv_bfloat16*>(lo) = l;
  } else {
    const __half h = __float2half_rn(x);
    const __half l = __float2half_rn(x - __half2float(h));
    *reinterpret_cast<__half*>(hi) = h;
    *reinterpret_cast<__half*>(lo) = l;
  }
}

}  // namespace kvcore::ops::cuda::mma_attn
