// CUDA runtime calls of the device offload tier (src/persist/async_copy.hpp).
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "persist/async_copy.hpp"

namespace kvcore::persist::gpu {

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::OutOfMemory, detail::concat("BlockOffloader: cudaHostAlloc of ", bytes,
                                                       " pinned bytes failed: ", cudaGetErrorString(e)));
  }
  return p;
}

void pinned_free(void* p) noexcept {
  if (p) cudaFreeHost(p);
}

void* device_pointer(void* pinned) {
  void* d = nullptr;
  KVCORE_CUDA_CHECK(cudaHostGetDevicePointer(&d, pinned, 0));
  return d;
}

void* event_create() {
  cudaEvent_t e = nullptr;
  KVCORE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void event_destroy(void* e) noexcept {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void event_record(void* e, Stream s) {
  KVCORE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s.handle)));
}

bool event_done(void* e) {
  const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
  if (r == cudaErrorNotReady) return false;
  KVCORE_CUDA_CHECK(r);
  return true;
}

void event_wait_host(void* e) { KVCORE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); }

void stream_wait(Stream s, void* e) {
  KVCORE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle), static_cast<cudaEvent_t>(e), 0));
}

Stream stream_create(int device) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  KVCORE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream::from_native(s);
}

void stream_destroy(Stream s) noexcept {
  if (s.handle) cudaStreamDestroy(static_cast<cudaStream_t>(s.handle));
}

void set_device(int device) { KVCORE_CUDA_CHECK(cudaSetDevice(device)); }

}  // namespace kvcore::persist::gpu
