// The CUDA runtime calls the core needs, declared without CUDA headers.
// Implemented in src/cuda/common/runtime.cu; only referenced when KVCORE_WITH_CUDA.
#pragma once
#include <cstddef>
#include <string>

namespace kvcore::cuda_backend {

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };

int device_count();
std::string device_name(int index);
void* allocate(size_t bytes, int index);  // throws OutOfMemory / DeviceError
void release(void* ptr, int index) noexcept;
void copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream);
void fill(void* dst, int value, size_t bytes, void* stream);
void synchronize(int index, void* stream);

}  // namespace kvcore::cuda_backend
