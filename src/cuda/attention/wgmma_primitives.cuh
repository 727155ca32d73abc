// Hopper (sm_90a) warpgroup MMA building blocks, from the PTX ISA (9.7.15 "Asynchronous
// Warpgroup Level Matrix Instructions"): shared-memory matrix descriptors over 128-byte
// swizzled tiles, wgmma.mma_async m64nNk16 with A from registers (f32 += f16 / bf16), and
// the fences and groups that order them. Compiled only for sm_90a (the caller guards with
// KVCORE_WGMMA_ARCH); the tests reach every piece through wgmma_selftest_sm90a.cu.
//
// Tile layout (K tile of S = Q K^T and V tile of O += P V alike): a tile of `rows` rows of
// 64 * R 16-bit elements is R regions of rows x 128 bytes, region r holding elements
// [64 r, 64 r + 64) of every row; 16-byte chunk c of row i sits at chunk c ^ (i % 8) of its
// 128-byte line. Each region starts 1024-byte aligned, so address bits [7:9] are i % 8 and the
// layout is exactly the PTX "128B swizzling" pattern (Swizzle<3,4,3>: bits [4:6] ^= bits [7:9]).
#pragma once
#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVCORE_WGMMA_ARCH 1
#else
#define KVCORE_WGMMA_ARCH 0
#endif

namespace kvcore::ops::cuda::wgmma {

constexpr int kLineBytes = 128;     // one swizzled line: 64 16-bit elements
constexpr int kAtomBytes = 1024;    // 8 lines: the unit the swizzle repeats over

// Byte offset of 16-byte chunk `c` (0 .. 8 R - 1) of row `i` in a tile of `rows` rows.
template <int ROWS>
__host__ __device__ constexpr int tile_chunk_offset(int i, int c) {
  return (c / 8) * ROWS * kLineBytes + i * kLineBytes + (((c % 8) ^ (i % 8)) * 16);
}
// Byte offset of 16-bit element e of row i (the host reference of the selftest uses it too).
template <int ROWS>
__host__ __device__ constexpr int tile_elem_offset(int i, int e) {
  return tile_chunk_offset<ROWS>(i, e / 8) + (e % 8) * 2;
}

// Shared-memory matrix descriptor (PTX "Matrix Descriptor Format"): bits 0-13 start address
// >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4,
// 49-51 base offset (0: every swizzle atom is 1024-byte aligned), 62-63 swizzle (1: 128B).
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= uint64_t{(smem_addr >> 4) & 0x3fffu};
  d |= uint64_t{(lbo_bytes >> 4) & 0x3fffu} << 16;
  d |= uint64_t{(sbo_bytes >> 4) & 0x3fffu} << 32;
  d |= uint64_t{1} << 62;
  return d;
}

// B of S = Q K^T for k-step ks (dims 16 ks .. 16 ks + 15) over a K tile [key][dim]: B[k][n] =
// K[n][k] is K-major. Canonical K-major 128B layout ((8,m),(T,2k)):((8T,SBO),(1,T)): 8 keys
// a 1024-byte atom (SBO = 1024 to the next 8 keys), the 16 dims of a k-step contiguous (two
// 16-byte chunks) inside a line, so the step starts 32 bytes further in its region (the
// hardware swizzles the full address, which is what the copies did); LBO is unused for
// swizzled K-major layouts (encoded as 16 bytes). 4 k-steps a 64-dim region.
// The step's descriptor is the tile's plus the step's offset >> 4 in the address field, which
// cannot carry out of it (shared memory addresses are below 2^18): one add a wgmma, the tile's
// descriptor made once.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile, int ks) {
  return make_desc(tile, 16, kAtomBytes) + static_cast<uint32_t>(((ks / 4) * ROWS * kLineBytes + (ks % 4) * 32) >> 4);
}

// B of O += P V for k-step kk (keys 16 kk .. 16 kk + 15) over a V tile [key][dim]: B[k][n] =
// V[k][n] has N (dims) contiguous: MN-major, the transpose bit set. Canonical MN-major 128B
// layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): 64 dims along a line, the next 64 dims LBO
// further (the next region: ROWS lines), 8 keys an atom, the next 8 keys SBO = 1024 further;
// a k-step of 16 keys starts 2 atoms further.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile, int kk) {
  return make_desc(tile, ROWS * kLineBytes, kAtomBytes) + static_cast<uint32_t>((kk * 2 * kAtomBytes) >> 4);
}

#if KVCORE_WGMMA_ARCH
// Orders this thread's prior register and shared-memory accesses before the next wgmma
// (PTX: wgmma.fence is required before the first wgmma and whenever the accumulator or A
// registers were touched since).
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy
// that wgmma reads through; then a barrier orders them for the other threads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#endif

#if KVCORE_WGMMA_ARCH
// mbarrier (PTX 9.7.13.15) in shared memory, for the producer / consumer pipeline: `count`
// arrivals complete a phase; a waiter of phase k (0, 1, 2, ...) passes parity k & 1.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrive (release at CTA scope: this thread's prior writes are visible to a waiter that passes).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Wait (acquire) until the phase of the given parity completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n .reg .pred done;\n"  // labels are local to the braces: one copy per inlined call
      "KVCORE_MBAR_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra KVCORE_MBAR_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
#endif

#if KVCORE_WGMMA_ARCH
// Warp specialization: a warpgroup gives registers back to (dec) or takes them from (inc) the
// SM's pool; every warp of the warpgroup executes it. N: registers per thread, a multiple of 8
// in [24, 256].
template <int N>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif

// Keeps the compiler from moving reads or writes of registers across a wgmma wait: the
// registers are "changed" here, after the wait, as far as the compiler knows.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) asm volatile("" : "+f"(d[j][x])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) asm volatile("" : "+r"(a[j][x])::"memory");
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}: D (64 x N, f32) = A (64 x 16, registers)
// x B (16 x N, shared memory by descriptor) + (accumulate ? D : 0). TRANS_B 0: B K-major, 1:
// MN-major. A's fragment (PTX "Register fragment for matrix A", wgmma-64N16-A): warp w of the
// warpgroup holds rows 16 w .. 16 w + 15; with g = lane / 4, t = lane % 4, a[0] packs (row g,
// cols 2t, 2t+1), a[1] (row g+8, cols 2t, 2t+1), a[2] (row g, cols 2t+8, 2t+9), a[3] (row g+8,
// cols 2t+8, 2t+9), the lower column in the low 16 bits. D's fragment (wgmma-64N16-D) below.
#if KVCORE_WGMMA_ARCH
// d[j][x]: row 16 * warp + g + 8 * (x >> 1), column 8 * j + 2 * t + (x & 1) (g = lane / 4, t = lane % 4)
template <bool BF16, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  if constexpr (BF16) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(TRANS_B));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(TRANS_B));
  }
}

// d[j][x]: row 16 * warp + g + 8 * (x >> 1), column 8 * j + 2 * t + (x & 1) (g = lane / 4, t = lane % 4)
template <bool BF16, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  if constexpr (BF16) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(TRANS_B));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(TRANS_B));
  }
}

// The same with A from shared memory too (wgmma's SS form): A (64 x 16) by descriptor, K-major
// (a tile of 64 rows laid out as a K tile: desc_k_major<64>), B K-major (no transposes). S = Q K^T
// of the wide-tile kernel, whose Q stays in shared memory to leave its registers to S and P.
// d[j][x]: row 16 * warp + g + 8 * (x >> 1), column 8 * j + 2 * t + (x & 1)
#define KVCORE_WGMMA_M64N128K16_SS(TYPE) \
  asm volatile( \
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " \
      "{" \
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63" \
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
      "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
      "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
      "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
      "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
      : "l"(a_desc), "l"(b_desc), "r"(accumulate))
template <bool BF16>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  if constexpr (BF16) {
    KVCORE_WGMMA_M64N128K16_SS("bf16");
  } else {
    KVCORE_WGMMA_M64N128K16_SS("f16");
  }
}
#undef KVCORE_WGMMA_M64N128K16_SS

#endif  // KVCORE_WGMMA_ARCH

}  // namespace kvcore::ops::cuda::wgmma
