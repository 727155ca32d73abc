// Host interface of the Hopper (sm_90a) wgmma prefill kernel (prefill_wgmma.cuh), and a
// selftest of its building blocks for the CUDA tests.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::prefill_wgmma {

// Which wgmma kernel the automatic choice (kernel_variant 0) takes where one serves: 0 none
// (the mma.sync prefill kernel, attention_prefill.cuh), 5 warp-specialized, 6 every thread
// copies, 7 warp-specialized with TMA copies, 8 that with the consumers in ping-pong
// (ops::AttentionKernel), 9 and 10 tiles of 128 keys (prefill_wgmma_wide.cuh). 9 and 10 are
// 1.8-2.1x 6 (the best of the others) on every benched shape and within 3% of each other, 9
// ahead on 3 of the 4 (bench/results/2026-12-06-runK-*); kernel_variant 5 to 10 forces one.
constexpr int kAutomaticVariant = 9;

// Causal prefill (qo_indptr set) over f16 / bf16 pages with head_dim 64 or 128 (= v_head_dim),
// no rope on read, q exact in the page type, a 16-bit output, on a device of compute
// capability 9.0 exactly (sm_90a code), with rows enough to fill the GPU (kernel_variant 5 to
// 10: any size).
bool serves(const PagedAttentionParams& p, int sm_count);
void launch(const PagedAttentionParams& p, cudaStream_t stream);
// Launches of the wgmma kernels in this process (tests check that a forced call took one).
int64_t launch_count();

// One warpgroup's tiles through the kernel's primitives (wgmma_primitives.cuh), for a test
// against a host reference: s = q k^T (q: 64 x head_dim rows, k: 64 keys x head_dim, both
// row-major 16-bit bits of the page type) and o = p v (p: 64 x 64, v: 64 keys x head_dim),
// f32 out, row-major. Host pointers; runs on `device` (compute capability 9.0) and synchronizes.
void selftest_tiles(int device, bool bf16, int head_dim, const uint16_t* q, const uint16_t* k, const uint16_t* p,
                    const uint16_t* v, float* s, float* o);

// Compute capability 9.0 (the only devices sm_90a code runs on).
bool device_is_sm90(int device);

}  // namespace kvcore::ops::cuda::prefill_wgmma
