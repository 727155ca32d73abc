// kvcore's codecs against the GPU's own conversions, over every f32 bit pattern:
//   e4m3_encode            == cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float_to_fp8, __NV_SATFINITE, __NV_E4M3)
//   e4m3_decode            == __nv_cvt_fp8_to_halfraw for all 256 codes
//   f32_to_bf16_bits       == __float2bfloat16_rn (device)
//   f32_to_f16_bits (host) == __float2half_rn (device), i.e. host and device agree
//   f16_bits_to_f32 (host) == __half2float (device) for all 65536 halves
//   e2m1_encode            == __nv_cvt_float_to_fp4 (__NV_E2M1, round to nearest)
// and the warp Hadamard and FP4 block on the device equal the host functions bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/common/fp8_hw.cuh"
#include "kvcore/math/fp4.hpp"
#include "kvcore/math/fp4_hadamard.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/hadamard.hpp"
#include "kvcore/math/half.hpp"

using namespace kvcore::math;

namespace {

constexpr uint64_t kAll = uint64_t{1} << 32;
// Whether the device pass uses the hardware conversions (sm_89+ unless KVCORE_FP8_INTEGER_CODEC).
#if !defined(KVCORE_FP8_INTEGER_CODEC)
constexpr int KVCORE_FP8_HW_HOST_VIEW = 1;
#else
constexpr int KVCORE_FP8_HW_HOST_VIEW = 0;
#endif

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

struct Counts {
  unsigned long long e4m3_bad, bf16_bad, fp4_bad, e4m3_finite, kernel_codec_bad;
  unsigned int first_e4m3_bad[4], first_bf16_bad[4], first_fp4_bad[4];
};

__device__ void note_first(unsigned int* slots, unsigned long long count_before, uint32_t u) {
  if (count_before < 4) slots[count_before] = u;
}

// One pass over all 2^32 patterns, grid-stride; per-thread tallies, one atomic each at the end.
__global__ void sweep_kernel(Counts* c) {
  unsigned long long finite = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < kAll; i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = __uint_as_float(u);
    const bool is_finite = (u & 0x7f800000u) != 0x7f800000u;
    const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
    if (is_finite) {
      ++finite;
      const uint8_t hw = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      if (hw != e4m3_encode(x)) note_first(c->first_e4m3_bad, atomicAdd(&c->e4m3_bad, 1ull), u);
    }
    if (!is_nan) {
      const uint16_t hw = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      if (hw != f32_to_bf16_bits(x)) note_first(c->first_bf16_bad, atomicAdd(&c->bf16_bad, 1ull), u);
    }
    // the codec the fp8 kernels use (src/cuda/common/fp8_hw.cuh), NaN and inf included, scaled by 2^-3
    const uint32_t w = kvcore::ops::cuda::fp8_hw::encode2_scaled(x, -x, 0.125f);
    const uint32_t want = uint32_t(e4m3_encode(e4m3_scaled(x, 0.125f))) | (uint32_t(e4m3_encode(e4m3_scaled(-x, 0.125f))) << 8);
    if (w != want) atomicAdd(&c->kernel_codec_bad, 1ull);
    const uint8_t hw4 = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    if (hw4 != e2m1_encode(x)) note_first(c->first_fp4_bad, atomicAdd(&c->fp4_bad, 1ull), u);
  }
  atomicAdd(&c->e4m3_finite, finite);
}

__global__ void specials_kernel(const float* in, int n, uint8_t* e4m3, uint16_t* bf16_out, uint16_t* f16_out, uint8_t* fp4) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  e4m3[i] = __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3);
  bf16_out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  f16_out[i] = __half_as_ushort(__float2half_rn(in[i]));
  fp4[i] = __nv_cvt_float_to_fp4(in[i], __NV_E2M1, cudaRoundNearest);
}

__global__ void f16_chunk_kernel(uint64_t begin, uint64_t n, uint16_t* out) {
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    out[i] = __half_as_ushort(__float2half_rn(__uint_as_float(static_cast<uint32_t>(begin + i))));
}

__global__ void f16_to_f32_kernel(float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 65536) out[i] = __half2float(__ushort_as_half(static_cast<unsigned short>(i)));
}

__global__ void e4m3_decode_kernel(float* hw, float* ours) {
  const int i = threadIdx.x;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(i), __NV_E4M3);
  hw[i] = __half2float(__half(h));
  ours[i] = e4m3_decode(static_cast<uint8_t>(i));
}

// 128-point Hadamard: per-thread (thread 0 of each warp) and warp-cooperative, one row per warp.
__global__ void hadamard_kernel(const float* in, float* per_thread, float* warp_out, int rows) {
  const int row = blockIdx.x;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  float v[4];
  for (int i = 0; i < 4; ++i) v[i] = in[row * 128 + 4 * lane + i];
  hadamard128_warp(v, lane);
  for (int i = 0; i < 4; ++i) warp_out[row * 128 + 4 * lane + i] = v[i];
  if (lane == 0) {
    float x[128];
    for (int i = 0; i < 128; ++i) x[i] = in[row * 128 + i];
    hadamard128(x);
    for (int i = 0; i < 128; ++i) per_thread[row * 128 + i] = x[i];
  }
}

__global__ void fp4_hadamard_warp_kernel(const float* in, float* out, int rows) {
  const int row = blockIdx.x;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  float v[4];
  for (int i = 0; i < 4; ++i) v[i] = in[row * 128 + 4 * lane + i];
  fp4_hadamard_round_trip128_warp(v, lane);
  for (int i = 0; i < 4; ++i) out[row * 128 + 4 * lane + i] = v[i];
}

__global__ void fp4_block_kernel(const float* in, float* out, int blocks) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < blocks) fp4_block_round_trip(in + 32 * b, out + 32 * b, 32);
}

template <class T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  KVCORE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

// Split [0, n) over the host's cores.
template <class Fn>
uint64_t parallel_count(uint64_t n, Fn fn) {
  const unsigned t = std::max(1u, std::thread::hardware_concurrency());
  std::vector<uint64_t> counts(t, 0);
  std::vector<std::thread> threads;
  for (unsigned k = 0; k < t; ++k)
    threads.emplace_back([&, k] {
      for (uint64_t i = n * k / t; i < n * (k + 1) / t; ++i) counts[k] += fn(i);
    });
  for (auto& th : threads) th.join();
  uint64_t s = 0;
  for (auto c : counts) s += c;
  return s;
}

}  // namespace

TEST(CodecHardware, EveryFloatAgainstTheGpuConversions) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  Counts* d = device_alloc<Counts>(1);
  KVCORE_CUDA_CHECK(cudaMemset(d, 0, sizeof(Counts)));
  sweep_kernel<<<132 * 16, 256>>>(d);
  KVCORE_CUDA_CHECK_LAUNCH("sweep_kernel");
  Counts c{};
  KVCORE_CUDA_CHECK(cudaMemcpy(&c, d, sizeof(Counts), cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaFree(d));
  std::printf("[hardware] e4m3: %llu finite inputs, %llu differ from cvt.rn.satfinite.e4m3x2.f32\n", c.e4m3_finite, c.e4m3_bad);
  std::printf("[hardware] bf16: %llu non-NaN inputs differ from __float2bfloat16_rn\n", c.bf16_bad);
  std::printf("[hardware] e2m1: %llu of all 2^32 inputs differ from __nv_cvt_float_to_fp4\n", c.fp4_bad);
  for (int i = 0; i < 4 && i < static_cast<int>(c.e4m3_bad); ++i) std::printf("  e4m3 mismatch at 0x%08x\n", c.first_e4m3_bad[i]);
  for (int i = 0; i < 4 && i < static_cast<int>(c.bf16_bad); ++i) std::printf("  bf16 mismatch at 0x%08x\n", c.first_bf16_bad[i]);
  for (int i = 0; i < 4 && i < static_cast<int>(c.fp4_bad); ++i) std::printf("  e2m1 mismatch at 0x%08x\n", c.first_fp4_bad[i]);
  EXPECT_EQ(c.e4m3_finite, kAll - (uint64_t{1} << 24));
  EXPECT_EQ(c.e4m3_bad, 0u);
  EXPECT_EQ(c.bf16_bad, 0u);
  EXPECT_EQ(c.fp4_bad, 0u);
  std::printf("[hardware] fp8 kernel codec (cuda/fp8_hw.cuh, hardware=%d): %llu mismatches with math::e4m3_encode\n",
              KVCORE_FP8_HW_HOST_VIEW, c.kernel_codec_bad);
  EXPECT_EQ(c.kernel_codec_bad, 0u);
}

__global__ void decode2_kernel(unsigned int* bad) {
  const uint32_t w = blockIdx.x * blockDim.x + threadIdx.x;  // every pair of codes
  if (w >= 65536) return;
  const float2 d = kvcore::ops::cuda::fp8_hw::decode2(w);
  const float a = e4m3_decode(uint8_t(w & 0xff)), b = e4m3_decode(uint8_t(w >> 8));
  const bool ok_a = (a != a) ? (d.x != d.x) : __float_as_uint(d.x) == __float_as_uint(a);
  const bool ok_b = (b != b) ? (d.y != d.y) : __float_as_uint(d.y) == __float_as_uint(b);
  if (!ok_a || !ok_b) atomicAdd(bad, 1u);
}

TEST(CodecHardware, KernelDecodeOfEveryCodePair) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  unsigned int* d = device_alloc<unsigned int>(1);
  KVCORE_CUDA_CHECK(cudaMemset(d, 0, 4));
  decode2_kernel<<<256, 256>>>(d);
  KVCORE_CUDA_CHECK_LAUNCH("decode2_kernel");
  unsigned int bad = 0;
  KVCORE_CUDA_CHECK(cudaMemcpy(&bad, d, 4, cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaFree(d));
  EXPECT_EQ(bad, 0u);
}

TEST(CodecHardware, WhatNanAndInfinityBecome) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const uint32_t specials[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0x7f800000u, 0xff800000u, 0x80000000u};
  const int n = 7;
  std::vector<float> in(n);
  for (int i = 0; i < n; ++i) in[i] = bits_float(specials[i]);
  float* din = device_alloc<float>(n);
  uint8_t* de4 = device_alloc<uint8_t>(n);
  uint16_t* dbf = device_alloc<uint16_t>(n);
  uint16_t* dh = device_alloc<uint16_t>(n);
  uint8_t* d4 = device_alloc<uint8_t>(n);
  KVCORE_CUDA_CHECK(cudaMemcpy(din, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  specials_kernel<<<1, 32>>>(din, n, de4, dbf, dh, d4);
  KVCORE_CUDA_CHECK_LAUNCH("specials_kernel");
  std::vector<uint8_t> e4(n), f4(n);
  std::vector<uint16_t> bf(n), h(n);
  KVCORE_CUDA_CHECK(cudaMemcpy(e4.data(), de4, n, cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaMemcpy(f4.data(), d4, n, cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaMemcpy(bf.data(), dbf, n * 2, cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaMemcpy(h.data(), dh, n * 2, cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(din), static_cast<void*>(de4), static_cast<void*>(dbf), static_cast<void*>(dh), static_cast<void*>(d4)})
    KVCORE_CUDA_CHECK(cudaFree(p));
  for (int i = 0; i < n; ++i) {
    std::printf("[hardware] f32 0x%08x -> e4m3 hw 0x%02x kvcore 0x%02x | bf16 hw 0x%04x kvcore 0x%04x | f16 hw 0x%04x kvcore 0x%04x | e2m1 hw 0x%x kvcore 0x%x\n",
                specials[i], e4[i], e4m3_encode(in[i]), bf[i], f32_to_bf16_bits(in[i]), h[i], f32_to_f16_bits(in[i]), f4[i],
                e2m1_encode(in[i]));
    const bool nan = (specials[i] & 0x7fffffffu) > 0x7f800000u;
    if (!nan) {
      EXPECT_EQ(e4[i], e4m3_encode(in[i]));
      EXPECT_EQ(bf[i], f32_to_bf16_bits(in[i]));
      EXPECT_EQ(h[i], f32_to_f16_bits(in[i]));
    } else {
      EXPECT_EQ(e4[i] & 0x7f, 0x7f) << "hardware NaN is an E4M3 NaN code";
    }
    EXPECT_EQ(f4[i], e2m1_encode(in[i]));
  }
}

TEST(CodecHardware, F16HostConversionEqualsDeviceForEveryFloat) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const uint64_t chunk = uint64_t{1} << 28;
  uint16_t* d = device_alloc<uint16_t>(chunk);
  std::vector<uint16_t> h(chunk);
  uint64_t bad = 0, nan_differ = 0;
  for (uint64_t begin = 0; begin < kAll; begin += chunk) {
    f16_chunk_kernel<<<132 * 16, 256>>>(begin, chunk, d);
    KVCORE_CUDA_CHECK_LAUNCH("f16_chunk_kernel");
    KVCORE_CUDA_CHECK(cudaMemcpy(h.data(), d, chunk * 2, cudaMemcpyDeviceToHost));
    bad += parallel_count(chunk, [&](uint64_t i) -> uint64_t {
      const uint32_t u = static_cast<uint32_t>(begin + i);
      if ((u & 0x7fffffffu) > 0x7f800000u) return 0;
      return h[i] != f32_to_f16_bits(bits_float(u));  // the host (integer) path
    });
    nan_differ += parallel_count(chunk, [&](uint64_t i) -> uint64_t {
      const uint32_t u = static_cast<uint32_t>(begin + i);
      return (u & 0x7fffffffu) > 0x7f800000u && h[i] != 0x7e00u;
    });
  }
  KVCORE_CUDA_CHECK(cudaFree(d));
  std::printf("[hardware] f16: %llu non-NaN inputs where the host algorithm differs from __float2half_rn; "
              "%llu NaN inputs where the device NaN is not 0x7e00 (kvcore canonicalizes NaN to 0x7e00 on both)\n",
              static_cast<unsigned long long>(bad), static_cast<unsigned long long>(nan_differ));
  EXPECT_EQ(bad, 0u);
}

TEST(CodecHardware, F16ToF32AndE4M3DecodeEveryCode) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  float* d = device_alloc<float>(65536);
  f16_to_f32_kernel<<<256, 256>>>(d);
  KVCORE_CUDA_CHECK_LAUNCH("f16_to_f32_kernel");
  std::vector<float> hw(65536);
  KVCORE_CUDA_CHECK(cudaMemcpy(hw.data(), d, 65536 * 4, cudaMemcpyDeviceToHost));
  int bad = 0, nan_payload = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float ours = f16_bits_to_f32(static_cast<uint16_t>(i));
    const bool nan = (i & 0x7c00u) == 0x7c00u && (i & 0x3ffu);
    if (nan) nan_payload += float_bits(ours) != float_bits(hw[i]);
    else bad += float_bits(ours) != float_bits(hw[i]);
  }
  std::printf("[hardware] f16->f32: %d non-NaN mismatches; %d NaN halves whose f32 bits differ (payload handling)\n", bad, nan_payload);
  EXPECT_EQ(bad, 0);
  float *dhw = device_alloc<float>(256), *dours = device_alloc<float>(256);
  e4m3_decode_kernel<<<1, 256>>>(dhw, dours);
  KVCORE_CUDA_CHECK_LAUNCH("e4m3_decode_kernel");
  std::vector<float> a(256), b(256);
  KVCORE_CUDA_CHECK(cudaMemcpy(a.data(), dhw, 1024, cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaMemcpy(b.data(), dours, 1024, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 256; ++i) {
    if ((i & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(a[i]) && std::isnan(b[i])) << i;
      continue;
    }
    EXPECT_EQ(float_bits(a[i]), float_bits(b[i])) << "code " << i;
    EXPECT_EQ(float_bits(b[i]), float_bits(e4m3_decode(static_cast<uint8_t>(i)))) << "device == host, code " << i;
  }
  for (void* p : {static_cast<void*>(d), static_cast<void*>(dhw), static_cast<void*>(dours)}) KVCORE_CUDA_CHECK(cudaFree(p));
}

TEST(CodecHardware, HadamardAndFp4BlockOnDeviceEqualHost) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const int rows = 333;
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> in(rows * 128);
  for (auto& v : in) v = n(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 30) - 15);
  float *din = device_alloc<float>(in.size()), *dpt = device_alloc<float>(in.size()), *dw = device_alloc<float>(in.size());
  KVCORE_CUDA_CHECK(cudaMemcpy(din, in.data(), in.size() * 4, cudaMemcpyHostToDevice));
  hadamard_kernel<<<rows, 32>>>(din, dpt, dw, rows);
  KVCORE_CUDA_CHECK_LAUNCH("hadamard_kernel");
  std::vector<float> pt(in.size()), w(in.size());
  KVCORE_CUDA_CHECK(cudaMemcpy(pt.data(), dpt, in.size() * 4, cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaMemcpy(w.data(), dw, in.size() * 4, cudaMemcpyDeviceToHost));
  size_t bad_pt = 0, bad_w = 0;
  for (int r = 0; r < rows; ++r) {
    float x[128];
    std::copy(in.begin() + r * 128, in.begin() + r * 128 + 128, x);
    hadamard128(x);
    for (int i = 0; i < 128; ++i) {
      bad_pt += float_bits(x[i]) != float_bits(pt[r * 128 + i]);
      bad_w += float_bits(x[i]) != float_bits(w[r * 128 + i]);
    }
  }
  EXPECT_EQ(bad_pt, 0u) << "per-thread device transform == host";
  EXPECT_EQ(bad_w, 0u) << "warp transform == host";
  // FP4 blocks of 32 (the indexer's quantization after the Hadamard)
  const int blocks = rows * 4;
  fp4_block_kernel<<<(blocks + 127) / 128, 128>>>(dw, dpt, blocks);
  KVCORE_CUDA_CHECK_LAUNCH("fp4_block_kernel");
  KVCORE_CUDA_CHECK(cudaMemcpy(pt.data(), dpt, in.size() * 4, cudaMemcpyDeviceToHost));
  size_t bad4 = 0;
  for (int b = 0; b < blocks; ++b) {
    float out[32];
    fp4_block_round_trip(w.data() + 32 * b, out, 32);
    for (int i = 0; i < 32; ++i) bad4 += float_bits(out[i]) != float_bits(pt[32 * b + i]);
  }
  EXPECT_EQ(bad4, 0u);
  // the indexer-row codec, warp version, against the host
  fp4_hadamard_warp_kernel<<<rows, 32>>>(din, dpt, rows);
  KVCORE_CUDA_CHECK_LAUNCH("fp4_hadamard_warp_kernel");
  KVCORE_CUDA_CHECK(cudaMemcpy(pt.data(), dpt, in.size() * 4, cudaMemcpyDeviceToHost));
  size_t bad_idx = 0;
  for (int r = 0; r < rows; ++r) {
    float x[128];
    std::copy(in.begin() + r * 128, in.begin() + r * 128 + 128, x);
    fp4_hadamard_round_trip128(x);
    for (int i = 0; i < 128; ++i) bad_idx += float_bits(x[i]) != float_bits(pt[r * 128 + i]);
  }
  EXPECT_EQ(bad_idx, 0u);
  for (void* p : {static_cast<void*>(din), static_cast<void*>(dpt), static_cast<void*>(dw)}) KVCORE_CUDA_CHECK(cudaFree(p));
}
