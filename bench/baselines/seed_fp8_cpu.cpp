// CPU port of seed 002's kernel_dsv4_fp8_kv_quantize_f32 (see seed_fp8.hpp): the 64
// threads of a row's threadgroup become a loop; rows run in parallel (OpenMP).
#include <cmath>

#include "bench/baselines/seed_fp8.hpp"

namespace kvcore::baselines {
namespace {

const float dsv4_e4m3fn_exp_scale[16] = {
    0.0f, 0.015625f, 0.03125f, 0.0625f, 0.125f, 0.25f, 0.5f, 1.0f,
    2.0f, 4.0f, 8.0f, 16.0f, 32.0f, 64.0f, 128.0f, 256.0f,
};

inline float dsv4_e4m3fn_value(int i) {
  const int exp = (i >> 3) & 0x0f;
  const int mant = i & 0x07;
  return exp == 0 ? float(mant) * 0.001953125f : (1.0f + float(mant) * 0.125f) * dsv4_e4m3fn_exp_scale[exp];
}

inline float dsv4_e4m3fn_dequant(float x) {
  const float sign = x < 0.0f ? -1.0f : 1.0f;
  const float ax = std::fmin(std::fabs(x), 448.0f);
  int lo = 0;
  int hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (dsv4_e4m3fn_value(mid) <= ax) lo = mid;
    else hi = mid - 1;
  }
  int best = lo;
  if (best < 126) {
    const float best_diff = std::fabs(ax - dsv4_e4m3fn_value(best));
    const float next_diff = std::fabs(ax - dsv4_e4m3fn_value(best + 1));
    if (next_diff < best_diff || (next_diff == best_diff && ((best + 1) & 1) == 0 && (best & 1) != 0)) best = best + 1;
  }
  return sign * dsv4_e4m3fn_value(best);
}

}  // namespace

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
      const float amax = std::fmax(scratch[0], 1.0e-4f);
      const float scale = std::exp2(std::ceil(std::log2(amax / 448.0f)));
      for (int tid = 0; tid < 64; ++tid) {
        const float q = dsv4_e4m3fn_dequant(std::fmin(std::fmax(v[tid] / scale, -448.0f), 448.0f)) * scale;
        *reinterpret_cast<float*>(dst_base + (off + tid) * args.nb0) = q;
      }
    }
    for (int64_t i = n_nope; i < args.ne00; ++i)
      *reinterpret_cast<float*>(dst_base + i * args.nb0) = *reinterpret_cast<const float*>(src_base + i * args.nb00);
  }
}

}  // namespace kvcore::baselines
