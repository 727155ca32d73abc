// One warpgroup's S = Q K^T and O = P V tiles through the wgmma building blocks
// (wgmma_primitives.cuh) exactly as the prefill kernel (prefill_wgmma.cuh) uses them: K and V
// in the 128-byte swizzled tile layout, A fragments from registers, the K-major and MN-major
// descriptors. A CUDA test compares the results with a host reference, so a descriptor or
// swizzle mistake shows apart from the kernel's masks and softmax. Compiled for sm_90a only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/attention/mma_primitives.cuh"
#include "cuda/attention/prefill_wgmma.hpp"
#include "cuda/attention/wgmma_primitives.cuh"
#include "cuda/common/check.cuh"
#include "kvcore/error.hpp"

namespace kvcore::ops::cuda::prefill_wgmma {

namespace {

constexpr int kTileRows = 64;  // keys of a K / V tile, rows of q and p

// A fragment of k-step ks of a row-major 16-bit matrix with `cols` columns (the rule in
// wgmma_primitives.cuh): a[2h + e] packs (row 16 w + g + 8e, cols 16 ks + 8h + 2t, + 1).
__device__ void load_a(const uint16_t* m, int cols, int ks, uint32_t (&a)[4]) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 2; ++e) {
      const int r = 16 * w + g + 8 * e, c = 16 * ks + 8 * h + 2 * t;
      a[2 * h + e] = uint32_t{m[r * cols + c]} | (uint32_t{m[r * cols + c + 1]} << 16);
    }
}

// d[j][x] -> out (row 16 w + g + 8 (x >> 1), col 8j + 2t + (x & 1)), row-major with `cols` columns.
template <int N>
__device__ void store_d(const float (&d)[N][4], int cols, float* out) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int j = 0; j < N; ++j)
    for (int x = 0; x < 4; ++x) out[(16 * w + g + 8 * (x >> 1)) * cols + 8 * j + 2 * t + (x & 1)] = d[j][x];
}

template <int HD, bool BF16>
__global__ void __launch_bounds__(128) selftest_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* p,
                                                       const uint16_t* v, float* s_out, float* o_out) {
#if KVCORE_WGMMA_ARCH
  constexpr int kTile = kTileRows * HD * 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (mma_attn::smem_addr(smem_raw) & 1023u)) & 1023u);
  // K and V rows into the swizzled layout, 16 bytes at a time (plain stores: generic proxy)
  for (int i = threadIdx.x; i < kTileRows * HD / 8; i += blockDim.x) {
    const int r = i / (HD / 8), c = i % (HD / 8);
    const int dst = wgmma::tile_chunk_offset<kTileRows>(r, c);
    *reinterpret_cast<uint4*>(smem + dst) = *reinterpret_cast<const uint4*>(k + r * HD + 8 * c);
    *reinterpret_cast<uint4*>(smem + kTile + dst) = *reinterpret_cast<const uint4*>(v + r * HD + 8 * c);
  }
  wgmma::fence_proxy_async();
  __syncthreads();
  const uint32_t k_s = mma_attn::smem_addr(smem), v_s = k_s + kTile;

  float sc[kTileRows / 8][4] = {};
  uint32_t qa[HD / 16][4];
  for (int ks = 0; ks < HD / 16; ++ks) load_a(q, HD, ks, qa[ks]);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks)
    wgmma::wgmma_m64n64k16_rs<BF16, 0>(sc, qa[ks], wgmma::desc_k_major<kTileRows>(k_s, ks), ks > 0 ? 1 : 0);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_regs(sc);
  store_d(sc, kTileRows, s_out);

  float o[HD / 8][4] = {};
  uint32_t pa[kTileRows / 16][4];
  for (int kk = 0; kk < kTileRows / 16; ++kk) load_a(p, kTileRows, kk, pa[kk]);
  wgmma::fence_regs(o);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kTileRows / 16; ++kk) {
    if constexpr (HD == 128) wgmma::wgmma_m64n128k16_rs<BF16, 1>(o, pa[kk], wgmma::desc_mn_major<kTileRows>(v_s, kk), 1);
    else wgmma::wgmma_m64n64k16_rs<BF16, 1>(o, pa[kk], wgmma::desc_mn_major<kTileRows>(v_s, kk), 1);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_regs(o);
  store_d(o, HD, o_out);
#else
  (void)q, (void)k, (void)p, (void)v, (void)s_out, (void)o_out;
  __trap();
#endif
}

template <int HD, bool BF16>
void run(const uint16_t* q, const uint16_t* k, const uint16_t* p, const uint16_t* v, float* s, float* o) {
  const size_t n16 = size_t{kTileRows} * HD, np = size_t{kTileRows} * kTileRows;
  uint16_t *dq, *dk, *dp, *dv;
  float *ds, *d_o;
  KVCORE_CUDA_CHECK(cudaMalloc(&dq, n16 * 2));
  KVCORE_CUDA_CHECK(cudaMalloc(&dk, n16 * 2));
  KVCORE_CUDA_CHECK(cudaMalloc(&dp, np * 2));
  KVCORE_CUDA_CHECK(cudaMalloc(&dv, n16 * 2));
  KVCORE_CUDA_CHECK(cudaMalloc(&ds, np * 4));
  KVCORE_CUDA_CHECK(cudaMalloc(&d_o, n16 * 4));
  KVCORE_CUDA_CHECK(cudaMemcpy(dq, q, n16 * 2, cudaMemcpyHostToDevice));
  KVCORE_CUDA_CHECK(cudaMemcpy(dk, k, n16 * 2, cudaMemcpyHostToDevice));
  KVCORE_CUDA_CHECK(cudaMemcpy(dp, p, np * 2, cudaMemcpyHostToDevice));
  KVCORE_CUDA_CHECK(cudaMemcpy(dv, v, n16 * 2, cudaMemcpyHostToDevice));
  const int smem = 2 * kTileRows * HD * 2 + 1024;
  KVCORE_CUDA_CHECK(cudaFuncSetAttribute(selftest_kernel<HD, BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  selftest_kernel<HD, BF16><<<1, 128, smem>>>(dq, dk, dp, dv, ds, d_o);
  KVCORE_CUDA_CHECK_LAUNCH("wgmma selftest_kernel");
  KVCORE_CUDA_CHECK(cudaDeviceSynchronize());
  KVCORE_CUDA_CHECK(cudaMemcpy(s, ds, np * 4, cudaMemcpyDeviceToHost));
  KVCORE_CUDA_CHECK(cudaMemcpy(o, d_o, n16 * 4, cudaMemcpyDeviceToHost));
  for (void* ptr : {static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dp), static_cast<void*>(dv),
                    static_cast<void*>(ds), static_cast<void*>(d_o)})
    KVCORE_CUDA_CHECK(cudaFree(ptr));
}

}  // namespace

void selftest_tiles(int device, bool bf16, int head_dim, const uint16_t* q, const uint16_t* k, const uint16_t* p,
                    const uint16_t* v, float* s, float* o) {
  require_arg(head_dim == 64 || head_dim == 128, "wgmma selftest: head_dim must be 64 or 128, got ", head_dim);
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  require_arg(device_is_sm90(device), "wgmma selftest: device ", device, " is not compute capability 9.0");
  if (head_dim == 64) return bf16 ? run<64, true>(q, k, p, v, s, o) : run<64, false>(q, k, p, v, s, o);
  return bf16 ? run<128, true>(q, k, p, v, s, o) : run<128, false>(q, k, p, v, s, o);
}

}  // namespace kvcore::ops::cuda::prefill_wgmma
