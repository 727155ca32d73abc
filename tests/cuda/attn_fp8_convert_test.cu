// The CUDA attention kernels decode FP8 with the hardware e4m3x2 -> f16x2
// conversion; it must give exactly math::e4m3_decode for every code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/attention/attention_decode.cuh"
#include "kvcore/kvcore.hpp"

namespace {

__global__ void decode_all(float* out) {
  const int t = threadIdx.x;  // 16 threads x 16 codes
  uint32_t w[4];
  for (int i = 0; i < 4; ++i)
    w[i] = (t * 16 + 4 * i) | ((t * 16 + 4 * i + 1) << 8) | ((t * 16 + 4 * i + 2) << 16) | ((t * 16 + 4 * i + 3) << 24);
  const uint4 raw = make_uint4(w[0], w[1], w[2], w[3]);
  kvcore::ops::cuda::attn::dequant16<kvcore::math::KvElem::E4M3>(raw, out + t * 16);
}

}  // namespace

TEST(AttnCuda, HardwareE4m3DecodeMatchesMath) {
  if (kvcore::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 256 * sizeof(float)), cudaSuccess);
  decode_all<<<1, 16>>>(d);
  std::vector<float> h(256);
  ASSERT_EQ(cudaMemcpy(h.data(), d, 256 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  for (int c = 0; c < 256; ++c) {
    const float want = kvcore::math::e4m3_decode(static_cast<uint8_t>(c));
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(h[c])) << c;
    else EXPECT_EQ(h[c], want) << "code " << c;
  }
}
