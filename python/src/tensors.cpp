#include "tensors.hpp"

#include <string>

#include "kvcore/error.hpp"

namespace kvcore::py {

namespace {

std::string py_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

// Python helpers of kvcore/tensors.py, looked up once (they live as long as the interpreter).
nb::object helper(const char* fn) {
  static nb::object* module = new nb::object(nb::module_::import_("kvcore.tensors"));  // never freed: lives as long as the interpreter
  return module->attr(fn);
}

DType dtype_of(const nb::dlpack::dtype& dt, const char* name, DType u8_as) {
  using nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    const auto code = static_cast<dtype_code>(dt.code);
    if (code == dtype_code::Float && dt.bits == 32) return DType::F32;
    if (code == dtype_code::Float && dt.bits == 16) return DType::F16;
    if (code == dtype_code::Bfloat && dt.bits == 16) return DType::BF16;
    if (code == dtype_code::Int && dt.bits == 32) return DType::I32;
    if (code == dtype_code::Int && dt.bits == 64) return DType::I64;
    if (code == dtype_code::UInt && dt.bits == 8) return u8_as;
    if (code == dtype_code::Float8_E4M3FN && dt.bits == 8) return DType::E4M3;
    if (code == dtype_code::Float8_E8M0FNU && dt.bits == 8) return DType::UE8M0;
  }
  throw Error(ErrorCode::NotSupported,
              detail::concat("argument '", name, "': element type (DLPack code ", int(dt.code), ", bits ", int(dt.bits),
                             ", lanes ", int(dt.lanes),
                             ") is not one kvcore reads (float32, float16, bfloat16, int32, int64, uint8, "
                             "float8_e4m3fn)"));
}

nb::dlpack::dtype dl_dtype(DType t) {
  using nb::dlpack::dtype_code;
  switch (t) {
    case DType::F32: return {uint8_t(dtype_code::Float), 32, 1};
    case DType::F16: return {uint8_t(dtype_code::Float), 16, 1};
    case DType::BF16: return {uint8_t(dtype_code::Bfloat), 16, 1};
    case DType::I32: return {uint8_t(dtype_code::Int), 32, 1};
    case DType::I64: return {uint8_t(dtype_code::Int), 64, 1};
    default: return {uint8_t(dtype_code::UInt), 8, 1};  // codes and scale bytes travel as uint8
  }
}

// torch.Tensor and torch.utils.dlpack.to_dlpack, once torch is imported (looked up in sys.modules;
// never freed: they live as long as the interpreter), else null.
struct TorchApi {
  PyObject* tensor_type = nullptr;
  PyObject* to_dlpack = nullptr;
};
const TorchApi* torch_api() {
  static TorchApi api;
  if (api.tensor_type) return &api;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (!torch) return nullptr;
  nb::object to_dlpack = nb::module_::import_("torch.utils.dlpack").attr("to_dlpack");
  api.to_dlpack = to_dlpack.release().ptr();
  api.tensor_type = nb::object(nb::borrow(torch).attr("Tensor")).release().ptr();
  return &api;
}

// A torch tensor's DLPack capsule, taken with torch.utils.dlpack.to_dlpack. Not through
// Tensor.__dlpack__(), which a generic consumer calls: that Python method costs microseconds per
// tensor, and without a stream argument it makes the legacy default stream wait for torch's
// current one (an event record and wait per tensor, illegal while a CUDA graph is captured).
// kvcore's work runs on torch's current stream (or on the caller's stream=, whose ordering is the
// caller's), so no synchronization is wanted. Tensors that require grad are refused as
// __dlpack__ refuses them.
bool torch_capsule(nb::handle obj, const char* name, nb::object& capsule) {
  const TorchApi* torch = torch_api();
  if (!torch || !PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(torch->tensor_type))) return false;
  require_arg(!nb::cast<bool>(obj.attr("requires_grad")), "argument '", name,
              "': a torch tensor that requires grad (pass tensor.detach())");
  try {
    capsule = nb::handle(torch->to_dlpack)(obj);
  } catch (nb::python_error& e) {
    throw Error(ErrorCode::InvalidArgument, detail::concat("argument '", name, "': this ", py_type_name(obj),
                                                           " could not be taken through DLPack: ",
                                                           nb::str(e.value()).c_str()));
  }
  return true;
}

}  // namespace

Tensor to_tensor(nb::handle obj, const char* name, DType u8_as) {
  Tensor t;
  nb::object capsule;
  if (!obj.is_none() && torch_capsule(obj, name, capsule)) {
    if (!nb::try_cast(capsule, t.held, /*convert=*/false))
      throw Error(ErrorCode::InvalidArgument,
                  detail::concat("argument '", name, "': torch's DLPack capsule was refused"));
  } else if (obj.is_none() || !nb::try_cast(obj, t.held, /*convert=*/false)) {
    if (!obj.is_none() && nb::hasattr(obj, "__dlpack__"))
      throw Error(ErrorCode::InvalidArgument,
                  detail::concat("argument '", name, "': this ", py_type_name(obj),
                                 " could not be taken through DLPack (read-only arrays are refused: kvcore may "
                                 "write)"));
    throw Error(ErrorCode::InvalidArgument,
                detail::concat("argument '", name,
                               "' must be a tensor (an object with __dlpack__, such as a numpy array or a torch "
                               "tensor), got ",
                               py_type_name(obj)));
  }
  const DType dtype = dtype_of(t.held.dtype(), name, u8_as);
  Device dev;
  switch (t.held.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: dev = Device::cpu(); break;
    case nb::device::cuda::value: dev = Device::cuda(t.held.device_id()); break;
    default:
      throw Error(ErrorCode::NotSupported, detail::concat("argument '", name, "': DLPack device type ",
                                                          t.held.device_type(), " is neither CPU nor CUDA"));
  }
  const int ndim = static_cast<int>(t.held.ndim());
  require_arg(ndim <= TensorRef::kMaxDims, "argument '", name, "': ", ndim, " dimensions, kvcore takes at most ",
              TensorRef::kMaxDims);
  t.ref = TensorRef(t.held.data(), dtype, dev, ndim, t.held.shape_ptr(), t.held.stride_ptr());
  return t;
}

Tensor to_optional_tensor(nb::handle obj, const char* name, DType u8_as) {
  if (obj.is_none()) return {};
  return to_tensor(obj, name, u8_as);
}

Stream resolve_stream(nb::handle stream, Device device) {
  if (device.is_cpu()) return {};
  nb::object s = nb::borrow(stream);
  if (s.is_none()) s = helper("current_stream")(device.index);
  if (nb::hasattr(s, "__cuda_stream__")) s = nb::object(s.attr("__cuda_stream__")())[1];
  else if (nb::hasattr(s, "cuda_stream")) s = s.attr("cuda_stream");
  uintptr_t handle = 0;
  if (!nb::try_cast(s, handle))
    throw Error(ErrorCode::InvalidArgument,
                detail::concat("argument 'stream' must be None, an int handle or a CUDA stream object, got ",
                               py_type_name(stream)));
  return Stream::from_native(reinterpret_cast<void*>(handle));
}

nb::object new_tensor_like(nb::handle like, const std::vector<int64_t>& shape, DType dtype) {
  nb::list dims;
  for (int64_t d : shape) dims.append(d);
  return helper("empty_like")(like, nb::tuple(dims), dtype_py_name(dtype));
}

nb::object export_view(const TensorRef& t, nb::handle owner, const char* framework) {
  size_t shape[TensorRef::kMaxDims];
  for (int d = 0; d < t.ndim(); ++d) shape[d] = static_cast<size_t>(t.size(d));
  const int dev_type = t.device().is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  const std::string fw = framework;
  if (fw == "numpy") {
    require(t.device().is_cpu(), ErrorCode::NotSupported, "framework 'numpy' holds CPU memory only; this view is on ",
            t.device().str(), " (use framework='torch' or 'dlpack')");
    nb::ndarray<nb::numpy> a(t.data(), t.ndim(), shape, owner, t.strides_data(), dl_dtype(t.dtype()), dev_type,
                             t.device().index);
    return a.cast(nb::rv_policy::reference);
  }
  if (fw == "torch") {
    nb::ndarray<nb::pytorch> a(t.data(), t.ndim(), shape, owner, t.strides_data(), dl_dtype(t.dtype()), dev_type,
                               t.device().index);
    nb::object out = a.cast(nb::rv_policy::reference);
    if (t.dtype() == DType::E4M3) out = out.attr("view")(nb::module_::import_("torch").attr("float8_e4m3fn"));
    return out;
  }
  require_arg(fw == "dlpack", "argument 'framework' must be 'numpy', 'torch' or 'dlpack', got '", fw, "'");
  nb::ndarray<nb::array_api> a(t.data(), t.ndim(), shape, owner, t.strides_data(), dl_dtype(t.dtype()), dev_type,
                             t.device().index);
  return a.cast(nb::rv_policy::reference);
}

Device parse_device(nb::handle device) {
  if (device.is_none()) return Device::cpu();
  if (nb::isinstance<nb::int_>(device)) return Device::cuda(nb::cast<int>(device));
  const std::string s = nb::str(device).c_str();
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      const int i = std::stoi(s.substr(5), &used);
      if (used == s.size() - 5 && i >= 0) return Device::cuda(i);
    } catch (const std::exception&) {
    }
  }
  throw Error(ErrorCode::InvalidArgument,
              detail::concat("argument 'device' must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got '", s, "'"));
}

const char* dtype_py_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    default: return "uint8";
  }
}

DType parse_dtype(nb::handle dtype) {
  std::string s = nb::str(dtype).c_str();
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "float32" || s == "f32" || s == "float") return DType::F32;
  if (s == "float16" || s == "f16" || s == "half") return DType::F16;
  if (s == "bfloat16" || s == "bf16") return DType::BF16;
  throw Error(ErrorCode::InvalidArgument,
              detail::concat("argument 'dtype' must be float32, float16 or bfloat16, got '", s, "'"));
}

}  // namespace kvcore::py

namespace kvcore::py {

Output output(nb::handle out, const char* name, nb::handle like, const std::vector<int64_t>& shape, DType dtype,
              DType u8_as) {
  Output o;
  o.obj = out.is_none() ? new_tensor_like(like, shape, dtype) : nb::borrow(out);
  o.t = to_tensor(o.obj, name, u8_as);
  return o;
}

std::vector<int64_t> shape_with_last(const TensorRef& t, int64_t last) {
  std::vector<int64_t> s(t.shape_data(), t.shape_data() + t.ndim());
  if (s.empty()) s.push_back(last);
  else s.back() = last;
  return s;
}

}  // namespace kvcore::py
