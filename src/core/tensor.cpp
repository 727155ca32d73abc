#include "kvcore/tensor.hpp"

#include <algorithm>
#include <sstream>

#include "kvcore/error.hpp"

namespace kvcore {

TensorRef::TensorRef(void* data, DType dtype, Device device, int ndim, const int64_t* shape, const int64_t* strides)
    : data_(data), dtype_(dtype), device_(device), ndim_(ndim) {
  require_arg(ndim >= 0 && ndim <= kMaxDims, "TensorRef: ndim must be in [0, ", kMaxDims, "], got ", ndim);
  for (int d = 0; d < ndim; ++d) {
    require_arg(shape[d] >= 0, "TensorRef: shape[", d, "] must be >= 0, got ", shape[d]);
    shape_[d] = shape[d];
  }
  // Every element count and byte offset a view implies must fit int64: numel(), the
  // contiguous strides and span_bytes() compute without overflow checks afterwards.
  int64_t s = 1, count = 1, last = 0;
  bool empty = false;
  for (int d = ndim - 1; d >= 0; --d) {
    if (__builtin_mul_overflow(count, std::max<int64_t>(shape_[d], 1), &count))
      require_arg(false, "TensorRef: the shape ", shape_of(*this), " has more elements than int64 counts");
    strides_[d] = strides ? strides[d] : s;
    s *= shape_[d];  // <= count: cannot overflow
    empty = empty || shape_[d] == 0;
  }
  for (int d = 0; d < ndim && !empty; ++d) {
    const int64_t stride = strides_[d] < 0 ? -strides_[d] : strides_[d];
    int64_t extent = 0;
    if (strides_[d] == INT64_MIN || __builtin_mul_overflow(shape_[d] - 1, stride, &extent) ||
        __builtin_add_overflow(last, extent, &last))
      require_arg(false, "TensorRef: shape ", shape_of(*this), " with stride[", d, "] = ", strides_[d],
                  " spans more than int64 elements");
  }
  int64_t bytes = 0;
  if (!empty && (__builtin_add_overflow(last, 1, &last) ||
                 __builtin_mul_overflow(last, static_cast<int64_t>(dtype_size(dtype)), &bytes)))
    require_arg(false, "TensorRef: shape ", shape_of(*this), " spans more than int64 bytes");
}

TensorRef::TensorRef(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape)
    : TensorRef(data, dtype, device, static_cast<int>(shape.size()), shape.begin(), nullptr) {}

TensorRef::TensorRef(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                     std::initializer_list<int64_t> strides)
    : TensorRef(data, dtype, device, static_cast<int>(shape.size()), shape.begin(), strides.begin()) {
  require_arg(shape.size() == strides.size(), "TensorRef: ", shape.size(), " dims in shape but ", strides.size(), " strides");
}

TensorRef TensorRef::of(const Buffer& buffer, DType dtype, std::initializer_list<int64_t> shape) {
  TensorRef t(buffer.data(), dtype, buffer.device(), shape);
  require_arg(static_cast<size_t>(t.span_bytes()) <= buffer.size(), "TensorRef::of: shape ", shape_of(t), " of ",
              dtype_name(dtype), " needs ", t.span_bytes(), " bytes, buffer has ", buffer.size());
  return t;
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool TensorRef::is_contiguous() const {
  int64_t s = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != s) return false;
    s *= shape_[d];
  }
  return true;
}

int64_t TensorRef::span_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < ndim_; ++d) last += (shape_[d] - 1) * strides_[d];
  return (last + 1) * static_cast<int64_t>(element_size());
}

std::string TensorRef::shape_str() const {
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < ndim_; ++d) os << (d ? ", " : "") << shape_[d];
  os << "]";
  return os.str();
}

std::string TensorRef::describe() const {
  return std::string(dtype_name(dtype_)) + shape_str() + " on " + device_.str();
}

}  // namespace kvcore
