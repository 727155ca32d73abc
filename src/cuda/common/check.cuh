// Checked CUDA calls and launches: every failure becomes kvcore::Error(DeviceError)
// naming the call, the file and line, and CUDA's own message.
#pragma once
#include <cuda_runtime.h>

#include "kvcore/error.hpp"
#include "kvcore/stream.hpp"

namespace kvcore::ops::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  cudaGetLastError();  // clear a sticky non-fatal error so the next call starts clean
  throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::OutOfMemory : ErrorCode::DeviceError,
              detail::concat(what, " failed at ", file, ":", line, ": ", cudaGetErrorName(e), " (",
                             cudaGetErrorString(e), ")"));
}

inline cudaStream_t native(Stream s) { return static_cast<cudaStream_t>(s.handle); }

}  // namespace kvcore::ops::cuda

#define KVCORE_CUDA_CHECK(call)                                                  \
  do {                                                                           \
    cudaError_t kvcore_err_ = (call);                                            \
    if (kvcore_err_ != cudaSuccess) ::kvcore::ops::cuda::throw_cuda(kvcore_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: catches bad configurations at once (asynchronous
// faults surface at the next checked call on the stream).
#define KVCORE_CUDA_CHECK_LAUNCH(name)                                           \
  do {                                                                           \
    cudaError_t kvcore_err_ = cudaGetLastError();                                \
    if (kvcore_err_ != cudaSuccess) ::kvcore::ops::cuda::throw_cuda(kvcore_err_, "launch of " name, __FILE__, __LINE__); \
  } while (0)
