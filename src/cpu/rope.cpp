// rope_apply on the CPU: the SIMD path (rope_simd.cpp) unless the scalar path is
// asked for (simd_targets.hpp). Scalar path: one token per iteration (OpenMP);
// cos/sin of every pair computed once per token and reused for all heads. Math
// from kvcore/math/rope.hpp; both paths give the same bits.
#include <cstring>
#include <vector>

#include "cpu/rope_simd.hpp"
#include "cpu/simd_targets.hpp"

#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"
#include "ops/rope_params.hpp"

namespace kvcore::cpu {
namespace {

template <class T>
void rotate_rows(const RopeApplyParams& p) {
  const math::RopeLayout& l = p.table.layout;
  const int32_t n_pairs = l.n_pairs();
  const int32_t rot_end = l.first_dim + l.n_rot;
  const int64_t work = p.tokens * p.heads * p.head_dim;
#pragma omp parallel if (work > (1 << 15))
  {
    std::vector<float> cs(n_pairs), sn(n_pairs);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.tokens; ++t) {
      const int64_t pos = p.pos_dtype == DType::I32 ? static_cast<const int32_t*>(p.positions)[t * p.pos_stride]
                                                    : static_cast<const int64_t*>(p.positions)[t * p.pos_stride];
      const float fp = math::rope_position(pos);
      for (int32_t i = 0; i < n_pairs; ++i) math::rope_cos_sin(fp, p.table.freq[i], p.magnitude, &cs[i], &sn[i]);
      for (int64_t h = 0; h < p.heads; ++h) {
        const T* xr = static_cast<const T*>(p.x) + t * p.x_stride_token + h * p.x_stride_head;
        T* orow = static_cast<T*>(p.out) + t * p.out_stride_token + h * p.out_stride_head;
        if (!p.in_place) {  // pass-through dims keep their exact bits
          std::memcpy(orow, xr, sizeof(T) * l.first_dim);
          std::memcpy(orow + rot_end, xr + rot_end, sizeof(T) * (p.head_dim - rot_end));
        }
        for (int32_t i = 0; i < n_pairs; ++i) {
          const int32_t d0 = l.dim0(i), d1 = l.dim1(i);
          float x0 = to_f32(xr[d0]), x1 = to_f32(xr[d1]);
          math::rotate_pair(x0, x1, cs[i], sn[i]);
          orow[d0] = from_f32<T>(x0);
          orow[d1] = from_f32<T>(x1);
        }
      }
    }
  }
}

}  // namespace

void rope_apply(const RopeApplyParams& p) {
  if (ops::cpu::simd_on()) return ops::cpu::rope_apply_simd(p);
  switch (p.dtype) {
    case DType::F32: return rotate_rows<float>(p);
    case DType::F16: return rotate_rows<f16>(p);
    case DType::BF16: return rotate_rows<bf16>(p);
    default: break;  // validated by the entry point
  }
}

}  // namespace kvcore::cpu
