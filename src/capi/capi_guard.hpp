// The C API's boundary: every kvc_* entry point runs its body through guard(), which turns any
// C++ exception into a kvc_status and the thread-local last-error message, so no exception
// crosses into C. Plus the conversions the entry points share (DLTensor, versioned structs).
#pragma once
#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "kvcore/dlpack.hpp"
#include "kvcore/error.hpp"
#include "kvcore/kvcore.h"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/stream.hpp"

namespace kvcore::capi {

void set_last_error(const char* message);
void clear_last_error();

template <class F>
kvc_status guard(F&& body) noexcept {
  try {
    body();
    clear_last_error();
    return KVC_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    switch (e.code()) {
      case ErrorCode::InvalidArgument: return KVC_E_INVALID_ARGUMENT;
      case ErrorCode::OutOfMemory: return KVC_E_OUT_OF_MEMORY;
      case ErrorCode::NotSupported: return KVC_E_NOT_SUPPORTED;
      case ErrorCode::Corrupt: return KVC_E_CORRUPT;
      case ErrorCode::DeviceError: return KVC_E_DEVICE;
    }
    return KVC_E_INTERNAL;
  } catch (const std::bad_alloc&) {
    set_last_error("OutOfMemory: host allocation failed");
    return KVC_E_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error((std::string("Internal: ") + e.what()).c_str());
    return KVC_E_INTERNAL;
  } catch (...) {
    set_last_error("Internal: unknown exception");
    return KVC_E_INTERNAL;
  }
}

// Throws InvalidArgument naming `what` when p is NULL.
template <class T>
T* need(T* p, const char* fn, const char* what) {
  require_arg(p != nullptr, fn, ": ", what, " is NULL");
  return p;
}

// A caller's versioned struct: `T`'s defaults overlaid with the first struct_size bytes the
// caller filled (an older, shorter struct keeps the newer fields' defaults).
template <class T>
T read_versioned(const T* p, const T& defaults, const char* fn, const char* what) {
  need(p, fn, what);
  require_arg(p->struct_size >= sizeof(uint32_t), fn, ": ", what, "->struct_size is ", p->struct_size,
              " (fill the struct with its kvc_*_init function first)");
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), p, std::min<size_t>(p->struct_size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

// NULL -> an empty TensorRef. 1-byte unsigned tensors become `u8_as`.
inline TensorRef tensor(const DLTensor* d, DType u8_as = DType::U8) {
  return d ? from_dlpack(*d, u8_as) : TensorRef{};
}

inline Stream stream(void* s) { return Stream::from_native(s); }

inline Device device(kvc_device d) {
  require_arg(d.kind == KVC_DEVICE_CPU || d.kind == KVC_DEVICE_CUDA, "kvc_device.kind must be KVC_DEVICE_CPU or "
              "KVC_DEVICE_CUDA, got ", d.kind);
  require_arg(d.index >= 0, "kvc_device.index must be >= 0, got ", d.index);
  return d.kind == KVC_DEVICE_CPU ? Device::cpu() : Device::cuda(d.index);
}

RopeSpec rope_spec(const kvc_rope_spec* spec, const char* fn);

}  // namespace kvcore::capi
