// Core runtime on a real GPU: buffers, copies, fills, error reporting.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kvcore/kvcore.hpp"

using namespace kvcore;

TEST(CudaCore, BufferRoundTripCopyAndFill) {
  ASSERT_GT(cuda_device_count(), 0);
  std::vector<int> v(1000003);
  std::iota(v.begin(), v.end(), -17);
  Buffer a = Buffer::from_host(v, Device::cuda(0));
  Buffer b(a.size(), Device::cuda(0));
  copy_bytes(b.data(), b.device(), a.data(), a.device(), a.size());
  EXPECT_EQ(b.to_host<int>(), v);
  fill_bytes(b.data(), b.device(), 0xff, b.size());
  synchronize(b.device());
  for (int x : b.to_host<int>()) ASSERT_EQ(x, -1);
}

TEST(CudaCore, ImpossibleAllocationIsOutOfMemory) {
  try {
    Buffer huge(size_t{1} << 50, Device::cuda(0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfMemory) << e.what();
  }
  Buffer fine(64, Device::cuda(0));  // the failure left the device usable
  EXPECT_NE(fine.data(), nullptr);
}

TEST(CudaCore, BadDeviceIndexIsDeviceError) {
  EXPECT_THROW(Buffer(64, Device::cuda(cuda_device_count() + 3)), Error);
}

TEST(CudaCore, DefaultDeviceIsTheGpu) {
  EXPECT_TRUE(default_device().is_cuda());
  EXPECT_NE(device_name(Device::cuda(0)).find("H"), std::string::npos);
}
