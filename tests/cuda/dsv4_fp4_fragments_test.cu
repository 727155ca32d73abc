// The FP4 decode of the DeepSeek-V4 indexer's tensor-core scorer on the device, bit for bit:
//   math::e2m1x4_scaled_bf16 for every 4 codes and every scale byte == the CPU reference
//     (bf16 of the f32 product, tests/fp4_bf16_reference.hpp) and == the same f32 product
//     rounded on the device (__floats2bfloat162_rn: what the scorer computed before);
//   scores_mma::row_fragments on random rows == the CPU reference placed as its A fragments.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/dsv4/dsv4_scores_mma.cuh"
#include "fp4_bf16_reference.hpp"
#include "kvcore/math/fp4_bf16.hpp"
#include "kvcore/runtime.hpp"

using namespace kvcore::math;
namespace mma = kvcore::ops::cuda::dsv4::scores_mma;

namespace {

bool have_gpu() { return kvcore::cuda_device_count() > 0; }

template <class T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  KVCORE_CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  KVCORE_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct Tally {
  unsigned long long vs_cpu, vs_f32;
  unsigned int first[4][4];  // b, t, p01, p23 of the first mismatches with the CPU
};

__device__ uint32_t f32_pair(uint32_t c0, uint32_t c1, uint32_t b) {
  const float s = ue8m0_decode(static_cast<uint8_t>(b));
  const __nv_bfloat162 v = __floats2bfloat162_rn(e2m1_decode(static_cast<uint8_t>(c0)) * s, e2m1_decode(static_cast<uint8_t>(c1)) * s);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Thread i: scale byte i >> 16, codes t = i & 0xffff (garbage above them, which must not matter).
__global__ void every_case_kernel(const uint16_t* ref, Tally* tally) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t b = i >> 16, t = i & 0xffffu;
  uint32_t p01, p23;
  e2m1x4_scaled_bf16(t | (t * 0x9e370000u), ue8m0_bf16x2(b << 16, 2), p01, p23);
  const uint16_t* r = ref + 16 * b;
  const uint32_t c0 = t & 0xfu, c1 = (t >> 4) & 0xfu, c2 = (t >> 8) & 0xfu, c3 = t >> 12;
  if (p01 != (r[c0] | (uint32_t{r[c1]} << 16)) || p23 != (r[c2] | (uint32_t{r[c3]} << 16))) {
    const unsigned long long n = atomicAdd(&tally->vs_cpu, 1ull);
    if (n < 4) {
      tally->first[n][0] = b;
      tally->first[n][1] = t;
      tally->first[n][2] = p01;
      tally->first[n][3] = p23;
    }
  }
  if (p01 != f32_pair(c0, c1, b) || p23 != f32_pair(c2, c3, b)) atomicAdd(&tally->vs_f32, 1ull);
}

// Warp w takes rows 16w .. 16w + 15 of `rows` (kRowWords nibble words and a scale word each) and
// writes every lane's fragments: out[((w * 32 + lane) * kSteps + k) * 4 + e] = a[k][e].
__global__ void row_fragments_kernel(const uint32_t* rows, uint32_t* out) {
  const int lane = threadIdx.x & 31, w = blockIdx.x, g = lane >> 2, tq = lane & 3;
  mma::RowWords ra, rb;
  const uint32_t* src_a = rows + (16 * w + g) * (mma::kRowWords + 1);
  const uint32_t* src_b = src_a + 8 * (mma::kRowWords + 1);
  for (int j = 0; j < mma::kRowWords; ++j) {
    ra.nib[j] = src_a[j];
    rb.nib[j] = src_b[j];
  }
  ra.scales = src_a[mma::kRowWords];
  rb.scales = src_b[mma::kRowWords];
  uint32_t a[mma::kSteps][4];
  mma::row_fragments(ra, rb, tq, a);
  for (int k = 0; k < mma::kSteps; ++k)
    for (int e = 0; e < 4; ++e) out[((w * 32 + lane) * mma::kSteps + k) * 4 + e] = a[k][e];
}

}  // namespace

TEST(Dsv4Fp4Fragments, EveryFourCodesTimesEveryScale) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  uint16_t* ref = device_copy(fp4_bf16_test::ref_table());
  Tally* d = nullptr;
  KVCORE_CUDA_CHECK(cudaMalloc(&d, sizeof(Tally)));
  KVCORE_CUDA_CHECK(cudaMemset(d, 0, sizeof(Tally)));
  every_case_kernel<<<(1u << 24) / 256, 256>>>(ref, d);
  KVCORE_CUDA_CHECK_LAUNCH("every_case_kernel");
  Tally c{};
  KVCORE_CUDA_CHECK(cudaMemcpy(&c, d, sizeof(Tally), cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaFree(d));
  KVCORE_CUDA_CHECK(cudaFree(ref));
  for (unsigned long long n = 0; n < 4 && n < c.vs_cpu; ++n)
    std::printf("  b 0x%02x t 0x%04x: 0x%08x 0x%08x\n", c.first[n][0], c.first[n][1], c.first[n][2], c.first[n][3]);
  EXPECT_EQ(c.vs_cpu, 0u) << "of 2^24 cases differ from the CPU reference";
  EXPECT_EQ(c.vs_f32, 0u) << "of 2^24 cases differ from the f32 product rounded on the device";
}

TEST(Dsv4Fp4Fragments, RowFragmentsHoldTheirColumns) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  constexpr int kWarps = 64, kRows = 16 * kWarps, kWords = mma::kRowWords + 1;
  std::mt19937 rng(20240611);
  std::vector<uint32_t> rows(kRows * kWords);
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < mma::kRowWords; ++j) rows[r * kWords + j] = rng();
    // scale bytes: the encoder's range mostly, every byte now and then (0 and 0xff included)
    uint32_t sc = 0;
    for (int b = 0; b < 4; ++b) sc |= (rng() % 4 ? 112 + rng() % 142 : rng() % 256) << (8 * b);
    rows[r * kWords + mma::kRowWords] = sc;
  }
  const std::vector<uint16_t> ref = fp4_bf16_test::ref_table();
  // The reference value of row r, column c: its code is nibble c of the row (value c in byte
  // c / 2, the low nibble for even c), its scale byte c / 32 of the scale word.
  auto value = [&](int r, int c) -> uint32_t {
    const uint32_t word = rows[r * kWords + c / 8], code = (word >> (4 * (c % 8))) & 0xfu;
    const uint32_t b = (rows[r * kWords + mma::kRowWords] >> (8 * (c / 32))) & 0xffu;
    return ref[16 * b + code];
  };
  uint32_t* d_rows = device_copy(rows);
  uint32_t* d_out = nullptr;
  const size_t n_out = size_t{kWarps} * 32 * mma::kSteps * 4;
  KVCORE_CUDA_CHECK(cudaMalloc(&d_out, n_out * sizeof(uint32_t)));
  row_fragments_kernel<<<kWarps, 32>>>(d_rows, d_out);
  KVCORE_CUDA_CHECK_LAUNCH("row_fragments_kernel");
  std::vector<uint32_t> out(n_out);
  KVCORE_CUDA_CHECK(cudaMemcpy(out.data(), d_out, n_out * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaFree(d_rows));
  KVCORE_CUDA_CHECK(cudaFree(d_out));
  int bad = 0;
  for (int w = 0; w < kWarps; ++w)
    for (int lane = 0; lane < 32; ++lane)
      for (int k = 0; k < mma::kSteps; ++k)
        for (int e = 0; e < 4; ++e) {
          // a[k][0] row g, columns 16k + 2tq (+1); a[k][1] row g + 8; a[k][2], a[k][3] columns + 8
          const int r = 16 * w + (lane >> 2) + 8 * (e & 1), c = 16 * k + 2 * (lane & 3) + 8 * (e >> 1);
          const uint32_t want = value(r, c) | (value(r, c + 1) << 16);
          const uint32_t got = out[((w * 32 + lane) * mma::kSteps + k) * 4 + e];
          if (got != want && ++bad <= 4) std::printf("  warp %d lane %d a[%d][%d]: 0x%08x, want 0x%08x\n", w, lane, k, e, got, want);
        }
  EXPECT_EQ(bad, 0);
}
