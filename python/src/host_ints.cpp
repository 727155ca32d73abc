#include "host_ints.hpp"

#include <nanobind/stl/vector.h>

#include <limits>

#include "kvcore/error.hpp"
#include "tensors.hpp"

namespace kvcore::py {

namespace nb = nanobind;

std::vector<int64_t> host_i64(nb::handle obj, const char* name) {
  if (nb::isinstance<nb::int_>(obj)) return {nb::cast<int64_t>(obj)};
  if (nb::hasattr(obj, "__dlpack__")) {
    Tensor t = to_tensor(obj, name);
    require_arg(t.ref.device().is_cpu() && t.ref.ndim() == 1 &&
                    (t.ref.dtype() == DType::I32 || t.ref.dtype() == DType::I64),
                "argument '", name, "' must be a list of ints or a 1-D int32/int64 CPU tensor, got ",
                described(t.ref));
    std::vector<int64_t> v(static_cast<size_t>(t.ref.size(0)));
    for (size_t i = 0; i < v.size(); ++i) {
      const int64_t off = static_cast<int64_t>(i) * t.ref.stride(0);
      v[i] = t.ref.dtype() == DType::I32 ? int64_t{t.ref.data_as<int32_t>()[off]} : t.ref.data_as<int64_t>()[off];
    }
    return v;
  }
  std::vector<int64_t> v;
  if (!nb::try_cast(obj, v))
    throw Error(ErrorCode::InvalidArgument,
                detail::concat("argument '", name, "' must be an int, a list of ints or a 1-D int tensor, got ",
                               nb::type_name(obj.type()).c_str()));
  return v;
}

std::vector<int32_t> host_i32(nb::handle obj, const char* name) {
  const std::vector<int64_t> w = host_i64(obj, name);
  std::vector<int32_t> v(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    require_arg(w[i] >= std::numeric_limits<int32_t>::min() && w[i] <= std::numeric_limits<int32_t>::max(),
                "argument '", name, "'[", i, "] = ", w[i], " does not fit int32");
    v[i] = static_cast<int32_t>(w[i]);
  }
  return v;
}

}  // namespace kvcore::py
