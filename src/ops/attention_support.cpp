#include "ops/attention_support.hpp"

#include "kvcore/error.hpp"

namespace kvcore::ops {

namespace {

bool readable_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::E4M3; }
bool served_head_dim(int64_t d) { return d == 64 || d == 128 || d == 256 || d == 512; }

}  // namespace

std::string attention_cannot_read(Device device, const AttentionPagesFormat& f) {
  (void)device;  // both backends serve the same shapes
  if (!readable_type(f.k)) return detail::concat("K pages of type ", dtype_name(f.k), " (attention reads f32, f16, bf16 or e4m3)");
  if (!readable_type(f.v)) return detail::concat("V pages of type ", dtype_name(f.v), " (attention reads f32, f16, bf16 or e4m3)");
  if (f.k != f.v)
    return detail::concat("K pages are ", dtype_name(f.k), " but V pages are ", dtype_name(f.v),
                          " (attention reads K and V of one type)");
  if (!served_head_dim(f.head_dim)) return detail::concat("head_dim ", f.head_dim, " has no attention kernel (64, 128, 256 or 512)");
  if (f.v_head_dim != f.head_dim)
    return detail::concat("v_head_dim ", f.v_head_dim, " differs from head_dim ", f.head_dim,
                          " (attention reads V rows as wide as K rows)");
  return {};
}

}  // namespace kvcore::ops
