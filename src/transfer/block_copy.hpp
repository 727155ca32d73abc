// The transfer's device-side copies: gather a list of pool blocks into a contiguous staging
// buffer and scatter it back, on the CPU (memcpy) or on a CUDA device (one kernel each).
#pragma once
#include <cstdint>

#include "kvcore/device.hpp"
#include "kvcore/stream.hpp"

namespace kvcore::xfer {

// Block list `blocks` [n] lives on `device` (a device copy on CUDA). Block b of the pool is
// bytes [b * block_bytes, (b + 1) * block_bytes) of `pool`; the staging buffer holds the n
// blocks back to back.
struct BlockCopy {
  uint8_t* pool = nullptr;
  int64_t block_bytes = 0;
  const int32_t* blocks = nullptr;
  int32_t n = 0;
  uint8_t* staging = nullptr;
};

void gather_blocks(const BlockCopy& c, Device device, Stream stream);   // pool -> staging
void scatter_blocks(const BlockCopy& c, Device device, Stream stream);  // staging -> pool

// Makes `device` current for the calling thread (CUDA; nothing on the CPU).
void use_device(Device device);

namespace cuda {
void gather_blocks(const BlockCopy& c, Stream stream);
void scatter_blocks(const BlockCopy& c, Stream stream);
void use_device(int index);
}  // namespace cuda

}  // namespace kvcore::xfer
