// TensorRef: a non-owning view of device memory: pointer, dtype, device, shape
// and strides (in elements). Up to kMaxDims dims; shape and strides are held
// inline so a TensorRef is a plain value that can be copied into kernel Params.
//
// Thread safety: a plain value; concurrent reads of one TensorRef are safe. It does not
// own or guard the memory it points to.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kvcore/buffer.hpp"
#include "kvcore/device.hpp"
#include "kvcore/dtype.hpp"

namespace kvcore {

class TensorRef {
 public:
  static constexpr int kMaxDims = 6;

  TensorRef() = default;
  // Contiguous (row-major) view.
  TensorRef(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);
  // Strided view; strides in elements. Throws InvalidArgument on a bad rank or negative extent.
  TensorRef(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
            std::initializer_list<int64_t> strides);
  TensorRef(void* data, DType dtype, Device device, int ndim, const int64_t* shape,
            const int64_t* strides /* nullptr: contiguous */);
  // View of a whole Buffer with the given shape; throws if the buffer is too small.
  static TensorRef of(const Buffer& buffer, DType dtype, std::initializer_list<int64_t> shape);

  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int d) const { return shape_[d]; }
  int64_t stride(int d) const { return strides_[d]; }
  const int64_t* shape_data() const { return shape_.data(); }
  const int64_t* strides_data() const { return strides_.data(); }
  int64_t numel() const;
  size_t element_size() const { return dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool empty() const { return data_ == nullptr && ndim_ == 0; }
  bool is_contiguous() const;
  // Largest byte offset any element lives at, plus one element (0 when empty).
  int64_t span_bytes() const;
  std::string shape_str() const;  // "[4, 8, 128]"
  std::string describe() const;   // "f16[4, 8, 128] on cuda:0"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Device device_ = Device::cpu();
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace kvcore
