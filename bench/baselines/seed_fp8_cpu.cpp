// CPU port of seed 002's kernel_dsv4_fp8_kv_quantize_f32 (see seed_fp8.hpp): the 64
// threads of a row's threadgroup become a loop; rows run in parallel (OpenMP).
#include <cmath>

#include "bench/baselines/seed_fp8.hpp"
#include "bench/baselines/seed_fp8_replica.hpp"

namespace kvcore::baselines {

void seed_fp8_kv_quantize_cpu(const SeedFp8Args& args, const void* src0, void* dst) {
  const int64_t n_rows = args.ne01 * args.ne02 * args.ne03;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n_rows; ++row) {
    const int64_t i1 = row % args.ne01;
    const int64_t i2 = (row / args.ne01) % args.ne02;
    const int64_t i3 = row / (args.ne01 * args.ne02);
    const char* src_base = static_cast<const char*>(src0) + i1 * args.nb01 + i2 * args.nb02 + i3 * args.nb03;
    char* dst_base = static_cast<char*>(dst) + i1 * args.nb1 + i2 * args.nb2 + i3 * args.nb3;
    const int64_t n_nope = args.ne00 - args.n_rot;
    for (int64_t off = 0; off < n_nope; off += 64) {
      float v[64], scratch[64];
      for (int tid = 0; tid < 64; ++tid) {
        v[tid] = *reinterpret_cast<const float*>(src_base + (off + tid) * args.nb00);
        scratch[tid] = std::fabs(v[tid]);
      }
      for (int stride = 32; stride > 0; stride >>= 1)
        for (int tid = 0; tid < stride; ++tid) scratch[tid] = std::fmax(scratch[tid], scratch[tid + stride]);
      const float scale = codec_seed::block_scale(scratch[0]);
      for (int tid = 0; tid < 64; ++tid) {
        const float q = codec_seed::round_trip(v[tid], scale);
        *reinterpret_cast<float*>(dst_base + (off + tid) * args.nb0) = q;
      }
    }
    for (int64_t i = n_nope; i < args.ne00; ++i)
      *reinterpret_cast<float*>(dst_base + i * args.nb0) = *reinterpret_cast<const float*>(src_base + i * args.nb00);
  }
}

}  // namespace kvcore::baselines
