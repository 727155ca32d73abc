// Backend queries and raw memory movement between devices.
//
// Thread safety: every function may be called concurrently; copies and fills that touch
// the same memory must be ordered by the caller (streams, synchronize()).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "kvcore/device.hpp"
#include "kvcore/stream.hpp"

namespace kvcore {

const char* version();
bool cuda_compiled();            // was this build made with the CUDA backend?
int cuda_device_count();         // 0 when not compiled or no GPU is present
std::string device_name(Device d);
// The device to run on when the caller does not say: CUDA 0 when a GPU is present, else CPU.
Device default_device();

// Copy bytes between any two devices. Ordered on `stream`; host<->device copies
// synchronize so the host side can be reused at once.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes,
                Stream stream = {});
void fill_bytes(void* dst, Device dev, int value, size_t bytes, Stream stream = {});
void synchronize(Device d, Stream stream = {});

}  // namespace kvcore
