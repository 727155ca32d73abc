// Backend dispatch of the transfer's block copies (block_copy.hpp).
#include "transfer/block_copy.hpp"

#include <cstring>

namespace kvcore::xfer {

void gather_blocks(const BlockCopy& c, Device device, Stream stream) {
  if (c.n == 0) return;
  if (device.is_cpu()) {
    for (int32_t i = 0; i < c.n; ++i)
      std::memcpy(c.staging + i * c.block_bytes, c.pool + c.blocks[i] * c.block_bytes, static_cast<size_t>(c.block_bytes));
    return;
  }
#if KVCORE_WITH_CUDA
  cuda::gather_blocks(c, stream);
#endif
  (void)stream;
}

void scatter_blocks(const BlockCopy& c, Device device, Stream stream) {
  if (c.n == 0) return;
  if (device.is_cpu()) {
    for (int32_t i = 0; i < c.n; ++i)
      std::memcpy(c.pool + c.blocks[i] * c.block_bytes, c.staging + i * c.block_bytes, static_cast<size_t>(c.block_bytes));
    return;
  }
#if KVCORE_WITH_CUDA
  cuda::scatter_blocks(c, stream);
#endif
  (void)stream;
}

void use_device(Device device) {
#if KVCORE_WITH_CUDA
  if (device.is_cuda()) cuda::use_device(device.index);
#endif
  (void)device;
}

}  // namespace kvcore::xfer
