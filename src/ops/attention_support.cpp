#include "ops/attention_support.hpp"

#include "kvcore/error.hpp"

namespace kvcore::ops {

namespace {

bool readable_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::E4M3; }

// Widths with a kernel instantiation (src/cuda/attention/instantiations/attention_decode_d*.cu)
// and a CPU test: K and V rows of one width, or MLA's 576-dim K with 512-dim V.
bool served_dims(int64_t d, int64_t dv) {
  if (d == 576) return dv == 512;
  const bool listed = d == 64 || d == 80 || d == 96 || d == 112 || d == 128 || d == 192 || d == 256 || d == 512;
  return listed && dv == d;
}

}  // namespace

std::string attention_cannot_read(Device device, const AttentionPagesFormat& f) {
  (void)device;  // both backends serve the same shapes
  if (!readable_type(f.k)) return detail::concat("K pages of type ", dtype_name(f.k), " (attention reads f32, f16, bf16 or e4m3)");
  if (!readable_type(f.v)) return detail::concat("V pages of type ", dtype_name(f.v), " (attention reads f32, f16, bf16 or e4m3)");
  if (f.k != f.v)
    return detail::concat("K pages are ", dtype_name(f.k), " but V pages are ", dtype_name(f.v),
                          " (attention reads K and V of one type)");
  if (!served_dims(f.head_dim, f.v_head_dim)) {
    if (f.v_head_dim != f.head_dim)
      return detail::concat("v_head_dim ", f.v_head_dim, " differs from head_dim ", f.head_dim,
                            " (attention reads V rows as wide as K rows, or head_dim 576 with v_head_dim 512)");
    return detail::concat("head_dim ", f.head_dim,
                          " has no attention kernel (64, 80, 96, 112, 128, 192, 256 or 512; 576 with v_head_dim 512)");
  }
  if (f.k == DType::E4M3 && (f.head_dim % 64 != 0 || f.v_head_dim % 64 != 0))
    return detail::concat("e4m3 pages with head_dim ", f.head_dim, " and v_head_dim ", f.v_head_dim,
                          " (e4m3 pages carry one scale per 64 values: head dims must be multiples of 64)");
  return {};
}

}  // namespace kvcore::ops
