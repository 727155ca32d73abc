// Core types: Error, TensorRef, Buffer, DLPack round trip.
#include <gtest/gtest.h>

#include <vector>

#include "kvcore/kvcore.hpp"
#if KVCORE_HAVE_DLPACK
#include "kvcore/dlpack.hpp"
#endif

using namespace kvcore;

TEST(Error, CarriesCodeAndMessage) {
  try {
    require_arg(false, "x must be > 0, got ", -3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("x must be > 0, got -3"), std::string::npos);
  }
}

TEST(TensorRef, ContiguousStridesAndSpan) {
  std::vector<float> v(2 * 3 * 4);
  TensorRef t(v.data(), DType::F32, Device::cpu(), {2, 3, 4});
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.span_bytes(), 96);
  EXPECT_EQ(t.describe(), "f32[2, 3, 4] on cpu");
  TensorRef s(v.data(), DType::F32, Device::cpu(), {2, 4}, {12, 1});
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.span_bytes(), (12 + 3 + 1) * 4);
}

TEST(TensorRef, RejectsBadShapes) {
  EXPECT_THROW(TensorRef(nullptr, DType::F32, Device::cpu(), {2, -1}), Error);
  EXPECT_THROW(TensorRef(nullptr, DType::F32, Device::cpu(), {1, 1, 1, 1, 1, 1, 1}), Error);
  Buffer b(64, Device::cpu());
  EXPECT_THROW(TensorRef::of(b, DType::F32, {17}), Error);
  EXPECT_NO_THROW(TensorRef::of(b, DType::F32, {16}));
}

TEST(Buffer, HostRoundTripAndMove) {
  std::vector<int> v{1, 2, 3, 4, 5};
  Buffer b = Buffer::from_host(v, Device::cpu());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  Buffer c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(c.to_host<int>(), v);
  EXPECT_THROW(c.copy_from_host(v.data(), 4), Error);
}

TEST(Buffer, CudaWithoutBackendOrGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    Buffer b(16, Device::cuda(0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::NotSupported || e.code() == ErrorCode::DeviceError) << e.what();
  }
}

TEST(Runtime, DefaultDeviceIsCpuWithoutGpu) {
  if (cuda_device_count() == 0) {
    EXPECT_TRUE(default_device().is_cpu());
  }
  EXPECT_STREQ(version(), "0.1.0");
}

#if KVCORE_HAVE_DLPACK
TEST(DLPack, RoundTripKeepsViewAndRejectsUnknownTypes) {
  std::vector<uint16_t> v(3 * 5 * 8);
  TensorRef t(v.data() + 1, DType::BF16, Device::cpu(), {3, 5}, {40, 8});
  DLTensor d = to_dlpack(t);
  EXPECT_EQ(d.ndim, 2);
  EXPECT_EQ(d.dtype.code, kDLBfloat);
  TensorRef back = from_dlpack(d);
  EXPECT_EQ(back.data(), t.data());
  EXPECT_EQ(back.dtype(), DType::BF16);
  EXPECT_EQ(back.stride(0), 40);
  EXPECT_EQ(back.size(1), 5);
  d.byte_offset = 2;
  EXPECT_EQ(from_dlpack(d).data(), static_cast<void*>(v.data() + 2));
  d.strides = nullptr;  // DLPack: contiguous
  EXPECT_EQ(from_dlpack(d).stride(0), 5);
  d.dtype = {kDLComplex, 64, 1};
  EXPECT_THROW(from_dlpack(d), Error);
  d.dtype = {kDLUInt, 8, 1};
  EXPECT_EQ(from_dlpack(d, DType::E4M3).dtype(), DType::E4M3);
  d.dtype = {kDLFloat, 32, 4};
  EXPECT_THROW(from_dlpack(d), Error);
}
#endif
