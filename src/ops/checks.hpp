// Argument checks shared by every op entry point. Each throws
// kvcore::Error(InvalidArgument) with a message that names the argument.
#pragma once
#include <cmath>
#include <string_view>

#include "kvcore/error.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore::checks {

inline void dtype_is(std::string_view op, std::string_view name, const TensorRef& t, DType want) {
  require_arg(t.dtype() == want, op, ": ", name, " must be ", dtype_name(want), ", got ", dtype_name(t.dtype()));
}

// Messages are built only on failure: these run on every op call of a decode loop.
inline void ndim_is(std::string_view op, std::string_view name, const TensorRef& t, int want) {
  if (t.ndim() != want) require_arg(false, op, ": ", name, " must have ", want, " dims, got ", described(t));
}

inline void size_is(std::string_view op, std::string_view name, const TensorRef& t, int dim, int64_t want) {
  if (t.size(dim) != want) require_arg(false, op, ": ", name, ".shape[", dim, "] must be ", want, ", got ", described(t));
}

inline void same_device(std::string_view op, std::string_view a_name, const TensorRef& a, std::string_view b_name,
                        const TensorRef& b) {
  if (a.device() != b.device())
    require_arg(false, op, ": ", a_name, " is on ", a.device().str(), " but ", b_name, " is on ", b.device().str());
}

inline void not_null(std::string_view op, std::string_view name, const TensorRef& t) {
  require_arg(t.data() != nullptr || t.numel() == 0, op, ": ", name, " has no data pointer");
}

inline void innermost_contiguous(std::string_view op, std::string_view name, const TensorRef& t) {
  require_arg(t.ndim() == 0 || t.stride(t.ndim() - 1) == 1, op, ": ", name, " must have stride 1 in its last dim, got ",
              t.stride(t.ndim() - 1));
}

inline void non_negative_strides(std::string_view op, std::string_view name, const TensorRef& t) {
  for (int d = 0; d < t.ndim(); ++d)
    require_arg(t.stride(d) >= 0, op, ": ", name, ".stride[", d, "] must be >= 0, got ", t.stride(d));
}

// A RoPE table built by hand (math::RopeTable is plain data): finite frequencies and a finite,
// positive attention factor. make_rope_table() only builds such tables.
inline void rope_table_finite(std::string_view op, std::string_view name, const math::RopeTable& t) {
  require_arg(std::isfinite(t.attention_factor) && t.attention_factor > 0, op, ": ", name,
              ".attention_factor must be finite and > 0, got ", t.attention_factor);
  for (int i = 0; i < t.layout.n_pairs() && i < math::RopeTable::kMaxPairs; ++i)
    if (!std::isfinite(t.freq[i])) require_arg(false, op, ": ", name, ".freq[", i, "] must be finite, got ", t.freq[i]);
}

// The device a cache or buffer is made for: a known kind, a CPU index of 0, a CUDA index >= 0.
inline void device_known(std::string_view op, Device d) {
  require_arg(d.is_cpu() || d.is_cuda(), op, ": device kind must be CPU or CUDA, got ", static_cast<int>(d.kind));
  require_arg(d.is_cpu() ? d.index == 0 : d.index >= 0, op, ": device index ", d.index, " is not valid for ",
              d.is_cpu() ? "the CPU" : "CUDA");
}

// Throws NotSupported when a CUDA tensor reaches a build without the CUDA backend.
inline void backend_available(std::string_view op, Device d) {
#if !KVCORE_WITH_CUDA
  require(d.is_cpu(), ErrorCode::NotSupported, op, ": tensors are on ", d.str(), " but this kvcore build has no CUDA backend");
#else
  (void)op;
  (void)d;
#endif
}

}  // namespace kvcore::checks
