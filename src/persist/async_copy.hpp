// The CUDA runtime calls the device offload tier needs (pinned host memory, events, side
// streams), declared without CUDA headers. Implemented in src/cuda/persist/async_copy.cu; only
// referenced when KVCORE_WITH_CUDA. Events and streams travel as opaque pointers.
#pragma once
#include <cstddef>

#include "kvcore/stream.hpp"

namespace kvcore::persist::gpu {

// Page-locked host memory mapped into the device's address space (cudaHostAlloc, portable and
// mapped): the copy kernels read and write it directly. Throws OutOfMemory.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p) noexcept;
void* device_pointer(void* pinned);  // the device address of a pinned host address

void* event_create();                      // timing off: the cheapest kind
void event_destroy(void* e) noexcept;      // safe while the event is pending
void event_record(void* e, Stream s);
bool event_done(void* e);                  // cudaEventQuery: complete (or never recorded)
void event_wait_host(void* e);             // cudaEventSynchronize
void stream_wait(Stream s, void* e);       // later work on s waits for e

Stream stream_create(int device);  // a non-blocking stream (no implicit sync with stream 0)
void stream_destroy(Stream s) noexcept;
void set_device(int device);

}  // namespace kvcore::persist::gpu
