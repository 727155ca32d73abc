// Tensors crossing the Python boundary: any object with __dlpack__ (or the buffer protocol)
// becomes a kvcore::TensorRef without a copy; the nanobind ndarray that backs it holds a
// reference to the caller's object for as long as the call needs it.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <vector>

#include "kvcore/device.hpp"
#include "kvcore/dtype.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore::py {

namespace nb = nanobind;

// A caller's tensor seen by kvcore. `held` keeps the exporting object alive.
struct Tensor {
  nb::ndarray<> held;
  TensorRef ref;
};

// Converts `obj` (argument `name`) to a TensorRef. 1-byte unsigned tensors become `u8_as`
// (FP8 codes and scale bytes travel as uint8, since frameworks do not all export float8 through
// DLPack). Throws kvcore::Error(InvalidArgument) naming the argument for an object that is not a
// tensor and NotSupported for an element type or device kvcore has no use for.
Tensor to_tensor(nb::handle obj, const char* name, DType u8_as = DType::U8);
// None -> an empty TensorRef (an optional argument left out).
Tensor to_optional_tensor(nb::handle obj, const char* name, DType u8_as = DType::U8);

// The stream a call runs on. CPU: the default stream (ignored). CUDA: `stream` when given (an
// int handle, an object with .cuda_stream such as torch.cuda.Stream, or one with
// __cuda_stream__), else torch's current stream on that device when torch is loaded, else the
// default stream.
Stream resolve_stream(nb::handle stream, Device device);

// A new tensor in the framework of `like` (torch, numpy; numpy for other CPU tensors), allocated
// by that framework (kvcore.tensors.empty_like): for outputs the caller did not pass.
nb::object new_tensor_like(nb::handle like, const std::vector<int64_t>& shape, DType dtype);

// Views of memory kvcore owns, exported to Python: `owner` is kept alive by the view.
// framework: "numpy" (CPU only), "torch", or "dlpack" (a nanobind ndarray with __dlpack__).
nb::object export_view(const TensorRef& t, nb::handle owner, const char* framework);

Device parse_device(nb::handle device);
const char* dtype_py_name(DType t);  // "float32", ..., as numpy and torch spell them
DType parse_dtype(nb::handle dtype);  // a string, numpy dtype or torch dtype

}  // namespace kvcore::py

namespace kvcore::py {

// An output argument: the caller's tensor `out`, or (None) a new one shaped `shape` of `dtype`
// in the framework of `like`. `obj` is what the binding returns.
struct Output {
  nb::object obj;
  Tensor t;
};
Output output(nb::handle out, const char* name, nb::handle like, const std::vector<int64_t>& shape, DType dtype,
              DType u8_as = DType::U8);

// `t`'s shape with its last dim replaced by `last`.
std::vector<int64_t> shape_with_last(const TensorRef& t, int64_t last);

}  // namespace kvcore::py
