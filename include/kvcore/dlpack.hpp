// Conversion between TensorRef and DLPack's DLTensor (the exchange format of
// PyTorch, JAX, CuPy, ...). Needs <dlpack/dlpack.h> (Debian: libdlpack-dev);
// kvcore itself does not depend on it.
//
// Thread safety: pure conversions of plain values; safe to call from several threads.
#pragma once
#include <dlpack/dlpack.h>

#include "kvcore/error.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

inline DLDataType to_dl_dtype(DType t) {
  switch (t) {
    case DType::F32: return {kDLFloat, 32, 1};
    case DType::F16: return {kDLFloat, 16, 1};
    case DType::BF16: return {kDLBfloat, 16, 1};
    case DType::I32: return {kDLInt, 32, 1};
    case DType::I64: return {kDLInt, 64, 1};
    case DType::E4M3: case DType::UE8M0: case DType::E2M1: case DType::U8:
      return {kDLUInt, 8, 1};  // codes travel as raw bytes (older DLPack has no fp8 codes)
  }
  return {kDLUInt, 8, 1};
}

inline DType from_dl_dtype(DLDataType t) {
  require_arg(t.lanes == 1, "DLTensor.dtype.lanes must be 1, got ", int(t.lanes));
  if (t.code == kDLFloat && t.bits == 32) return DType::F32;
  if (t.code == kDLFloat && t.bits == 16) return DType::F16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::BF16;
  if (t.code == kDLInt && t.bits == 32) return DType::I32;
  if (t.code == kDLInt && t.bits == 64) return DType::I64;
  if (t.code == kDLUInt && t.bits == 8) return DType::U8;
  throw Error(ErrorCode::NotSupported,
              detail::concat("DLTensor.dtype (code ", int(t.code), ", bits ", int(t.bits), ") is not supported"));
}

// The DLTensor points into `t` for shape and strides: keep `t` alive while it is used.
inline DLTensor to_dlpack(const TensorRef& t) {
  DLTensor d{};
  d.data = t.data();
  d.device = {t.device().is_cuda() ? kDLCUDA : kDLCPU, t.device().index};
  d.ndim = t.ndim();
  d.dtype = to_dl_dtype(t.dtype());
  d.shape = const_cast<int64_t*>(t.shape_data());
  d.strides = const_cast<int64_t*>(t.strides_data());
  d.byte_offset = 0;
  return d;
}

// `as` reinterprets 1-byte DLPack tensors as a kvcore code type (e.g. DType::E4M3).
inline TensorRef from_dlpack(const DLTensor& d, DType as = DType::U8) {
  Device dev;
  if (d.device.device_type == kDLCPU) dev = Device::cpu();
  else if (d.device.device_type == kDLCUDA) dev = Device::cuda(d.device.device_id);
  else throw Error(ErrorCode::NotSupported, detail::concat("DLTensor.device.device_type ", int(d.device.device_type), " is not CPU or CUDA"));
  require_arg(d.ndim >= 0 && d.ndim <= TensorRef::kMaxDims, "DLTensor.ndim must be in [0, ", TensorRef::kMaxDims, "], got ", d.ndim);
  DType t = from_dl_dtype(d.dtype);
  if (t == DType::U8) t = as;
  require_arg(dtype_size(t) == d.dtype.bits / 8u, "from_dlpack: 'as' dtype ", dtype_name(as), " does not match a ", int(d.dtype.bits), "-bit DLTensor");
  char* base = static_cast<char*>(d.data) + d.byte_offset;
  return TensorRef(base, t, dev, d.ndim, d.shape, d.strides);
}

}  // namespace kvcore
