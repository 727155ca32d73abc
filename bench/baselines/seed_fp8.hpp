// Seed 002's kernel_dsv4_fp8_kv_quantize_f32 (Metal), ported as literally as possible to
// CUDA (seed_fp8.cu) and to the CPU (seed_fp8_cpu.cpp), as the baseline of `kvcore bench fp8`:
// one 64-thread group per row, a shared-memory tree reduction for each block's amax, the
// scale from float log2/exp2, and the E4M3 value found by binary search over the code table.
// Like the seed, it expects n_nope to be a multiple of 64.
#pragma once
#include <cstdint>

namespace kvcore::baselines {

// ggml-style arguments: extents ne*, byte strides nb0* (src) and nb* (dst).
struct SeedFp8Args {
  int64_t ne00, ne01, ne02, ne03;
  uint64_t nb00, nb01, nb02, nb03;
  uint64_t nb0, nb1, nb2, nb3;
  int n_rot;
};

void seed_fp8_kv_quantize_cpu(const SeedFp8Args& args, const void* src, void* dst);
void seed_fp8_kv_quantize_cuda(const SeedFp8Args& args, const void* src, void* dst, void* stream);  // CUDA builds only

}  // namespace kvcore::baselines
