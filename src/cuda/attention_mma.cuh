// Tensor-core paged decode attention (head_dim 64 / 128; f16, bf16 and FP8 pages; K
// stored rotated, or, for 16-bit pages, rotated while read). The SIMT kernel (attention_decode.cuh) spends ~80 instructions per
// cached row on dot products, shuffles and conversions and so tops out at ~35% of the
// H200's read bandwidth whatever the format; with mma.sync a warp handles a 16-token
// tile of K and V in ~80 instructions, so the kernel is bound by memory again.
//
// CTA = 4 warps for one (block of query rows, split, kv head, chunk of <= 16 query heads).
// The M rows of m16n8k16 are (query row, head) pairs: decode has one row per sequence,
// prefill packs up to 16 / heads rows of one sequence, so a K/V tile read from memory
// serves all of them (each row keeps its own causal limit). Padding rows are zero. Each warp owns every
// 4th 16-token tile of the split and a private cp.async ring of kStages tiles (K, V and
// the tile's metadata words), so the main loop needs only __syncwarp. Per tile:
//   S = Q K^T (ldmatrix of K rows; FP8 rows are converted in registers), masked,
//   online softmax in registers, O += P V (ldmatrix.trans of V rows).
// Precision: q and P are split into hi + lo halves of the mma type (two mma each), so
// scores and outputs carry ~f32 accuracy and match the CPU op at the f32 tolerances.
// Rope on read (16-bit pages): after a tile lands, the warp rotates its K rows in shared
// memory at their cached positions (f32 math, cos/sin by a Cody-Waite reduction of the
// same f32 angle the CPU uses plus the SFU on [-pi/4, pi/4]), keeping hi in place and lo
// in a per-warp tile, and adds the q_hi K_lo product.
// FP8 scales: K's per-64 (or per-row) scale multiplies the partial score of its dims;
// V's scale is folded into P, normalised by the tile's largest scale so P stays <= 1.
// The warps' states are merged in shared memory into one normalized partial (o, lse)
// per split, combined by attention_merge like the SIMT kernel's.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/check.cuh"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/softmax.hpp"
#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::mma_attn {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 16;      // tokens per warp step (the k of the P V mma)
constexpr int kMetaWords = 5;  // per token of a stage: cell, position, valid word, K scale word, V scale word

template <int HD, math::KvElem KV, bool ROPE = false>
struct Shape {
  static constexpr bool kFp8 = KV == math::KvElem::E4M3;
  static constexpr int kRowBytes = HD * (kFp8 ? 1 : 2);
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per cached row
  static constexpr int kTileBytes = kTile * kRowBytes;
  static constexpr int kKSteps = HD / 16;         // k-steps of Q K^T
  static constexpr int kNBlocks = HD / 8;         // 8-dim n-blocks of the output
  static constexpr int kScaleBlocks = kFp8 ? HD / 64 : 1;
  static constexpr int kStages = kFp8 ? 4 : 3;
  static constexpr int kStageBytes = 2 * kTileBytes + kTile * kMetaWords * 4;
  static constexpr int kPipeBytes = kWarps * kStages * kStageBytes;
  static constexpr int kMergeBytes = kWarps * 16 * (HD + 2) * 4;
  static constexpr int kQBytes = 16 * HD * 4;
  static constexpr int kBaseBytes =
      kPipeBytes > kMergeBytes ? (kPipeBytes > kQBytes ? kPipeBytes : kQBytes) : (kMergeBytes > kQBytes ? kMergeBytes : kQBytes);
  // Rope on read: after the base area, each warp's K lo tile and the pair frequencies.
  static constexpr int kRopeBytes = ROPE ? kWarps * kTileBytes + HD / 2 * 4 : 0;
  static constexpr int kSmemBytes = kBaseBytes + kRopeBytes;
  static_assert(kChunks == 4 || kChunks >= 8, "swizzle needs 4 or >= 8 chunks per row");
  static_assert(!(ROPE && kFp8), "FP8 pages rotate on read in the SIMT kernel (pairs cross scale blocks)");
};

// Byte offset of 16-byte chunk `c` of tile row `r`, XOR-swizzled so that the 8 rows an
// ldmatrix phase reads at one logical chunk fall in 8 different bank groups.
template <int CHUNKS>
__device__ __forceinline__ int swz(int r, int c) {
  if constexpr (CHUNKS >= 8) return (r * CHUNKS + (c ^ (r & 7))) * 16;
  else return (r * CHUNKS + (c ^ ((r >> 1) & 3))) * 16;  // 64-byte rows: two per 128 bytes
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool fill) {
  const int n = fill ? 16 : 0;  // 0: write zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b, m16n8k16, f32 accumulators; BF16 picks the bf16 variant.
template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> hi and lo halves of the mma type, packed (x in the low 16 bits).
template <bool BF16>
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo) {
  if constexpr (BF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  } else {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  }
}

// Two E4M3 codes (low byte first) -> f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

// sin and cos of an f32 angle: Cody-Waite reduction by pi/2 in three f32 parts (FMA keeps
// each step exact to ~1 ulp of the remainder for |a| < ~2^17 * pi), then the SFU on
// |r| <= pi/4 (abs. error < 4e-7). The CPU reference rounds a double result (0.5 ulp).
__device__ __forceinline__ void sincos_reduced(float a, float* s, float* c) {
  const float k = rintf(a * 0.636619772367581343f);
  float r = fmaf(-k, 0x1.921fb6p+0f, a);
  r = fmaf(-k, -0x1.777a5cp-25f, r);
  r = fmaf(-k, -0x1.ee59dap-50f, r);
  float sr, cr;
  __sincosf(r, &sr, &cr);
  const int q = static_cast<int>(k) & 3;
  *s = q == 0 ? sr : q == 1 ? cr : q == 2 ? -sr : -cr;
  *c = q == 0 ? cr : q == 1 ? -sr : q == 2 ? -cr : sr;
}

// 16-bit element d of tile row r (swizzled like the cp.async copies).
template <int CHUNKS>
__device__ __forceinline__ int elem_off(int r, int d) {
  return swz<CHUNKS>(r, d / 8) + (d % 8) * 2;
}

template <bool BF16>
__device__ __forceinline__ float ld16(const unsigned char* p) {
  const uint16_t b = *reinterpret_cast<const uint16_t*>(p);
  return BF16 ? __uint_as_float(uint32_t{b} << 16) : __half2float(__ushort_as_half(b));
}
template <bool BF16>
__device__ __forceinline__ void st16_split(unsigned char* hi, unsigned char* lo, float x) {
  if constexpr (BF16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    const __nv_bfloat16 l = __float2bfloat16_rn(x - __bfloat162float(h));
    *reinterpret_cast<__nv_bfloat16*>(hi) = h;
    *reinterpret_cast<__nv_bfloat16*>(lo) = l;
  } else {
    const __half h = __float2half_rn(x);
    const __half l = __float2half_rn(x - __half2float(h));
    *reinterpret_cast<__half*>(hi) = h;
    *reinterpret_cast<__half*>(lo) = l;
  }
}

// Output dim held in accumulator element e (0: c0/c2, 1: c1/c3) of n-block nb by a
// thread of quad position t. FP8 V fragments interleave even and odd dims (see PV).
template <bool FP8>
__device__ __forceinline__ int out_dim(int nb, int e, int t) {
  if constexpr (FP8) return (nb >> 1) * 16 + 4 * t + 2 * e + (nb & 1);
  else return nb * 8 + 2 * t + e;
}

template <int HD, math::KvElem KV, bool ROPE>
__device__ __forceinline__ void decode_body(const PagedAttentionParams& p, unsigned char* smem, int row, int split, int kvh,
                                            int chunk, int chunk_heads) {
  using S = Shape<HD, KV, ROPE>;
  constexpr bool kFp8 = S::kFp8;
  constexpr bool kBf16 = KV == math::KvElem::BF16;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates
  const int b = attention_row_seq(p, row);
  const int bs = p.layout.block_size;
  const int n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, bs);
  const CellRange range = attention_split_range(n_cells, split, p.num_splits);
  const int h0 = kvh * p.group + chunk * chunk_heads;
  const int n_h = min(chunk_heads, p.group - chunk * chunk_heads);
  // Prefill: this CTA serves rows row .. row + n_r - 1 of sequence b when row starts a
  // block of 16 / chunk_heads rows of b; the CTAs of the other rows have nothing to do.
  int n_r = 1;
  if (p.maybe_qo_indptr) {
    const int per = 16 / chunk_heads, first = p.maybe_qo_indptr[b];
    if ((row - first) % per != 0) return;
    n_r = min(per, p.maybe_qo_indptr[b + 1] - row);
  }
  // M row m = rr * chunk_heads + gg: query row row + rr, head h0 + gg.
  auto m_real = [&](int m) { return m / chunk_heads < n_r && m % chunk_heads < n_h; };
  auto m_qpos = [&](int m) {
    return p.maybe_q_positions && m / chunk_heads < n_r ? p.maybe_q_positions[row + m / chunk_heads] : 0;
  };
  const int q_pos0 = m_qpos(g), q_pos1 = m_qpos(g + 8);  // this thread's two M rows

  // ---- queries -> shared f32 [16][HD] (padding rows zero) -> hi/lo A fragments in registers
  uint32_t qhi[S::kKSteps][4], qlo[S::kKSteps][4];
  {
    float* qs = reinterpret_cast<float*>(smem);
    for (int i = tid; i < 16 * HD; i += kThreads) {
      const int m = i / HD, d = i % HD;
      qs[i] = m_real(m) ? q_elem_to_f32(p.q,
                                        int64_t{row + m / chunk_heads} * p.q_row_stride +
                                            int64_t{h0 + m % chunk_heads} * p.q_head_stride + d,
                                        p.q_elem)
                        : 0.0f;
    }
    float* freq = reinterpret_cast<float*>(smem + S::kBaseBytes + kWarps * S::kTileBytes);
    if constexpr (ROPE) {
      for (int i = tid; i < p.rope.layout.n_pairs(); i += kThreads) freq[i] = p.rope.freq[i];
      // K lo tiles start at zero: the dims RoPE leaves alone keep a zero lo part.
      for (int i = tid; i < kWarps * S::kTileBytes / 16; i += kThreads)
        reinterpret_cast<uint4*>(smem + S::kBaseBytes)[i] = make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    if (ROPE && p.rotate_query) {  // q at its own position, exactly as the CPU does it
      const int n_pairs = p.rope.layout.n_pairs();
      for (int i = tid; i < 16 * n_pairs; i += kThreads) {
        const int h = i / n_pairs, pi = i % n_pairs;
        if (!m_real(h)) continue;
        float sn, cs;
        math::sincos_f32(math::rope_angle(static_cast<float>(m_qpos(h)), freq[pi]), &sn, &cs);
        math::rotate_pair(qs[h * HD + p.rope.layout.dim0(pi)], qs[h * HD + p.rope.layout.dim1(pi)],
                          cs * p.rope.attention_factor, sn * p.rope.attention_factor);
      }
      __syncthreads();
    }
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) {
      // k index pairs (2t, 2t+1) and (2t+8, 2t+9) of this k-step; FP8 K fragments hold
      // dims 4t..4t+3 of the 16-dim chunk in their place (a permutation of k, shared by q).
      const int d0 = kFp8 ? ks * 16 + 4 * t : ks * 16 + 2 * t;
      const int d1 = kFp8 ? d0 + 2 : d0 + 8;
      split2<kBf16>(qs[g * HD + d0], qs[g * HD + d0 + 1], qhi[ks][0], qlo[ks][0]);
      split2<kBf16>(qs[(g + 8) * HD + d0], qs[(g + 8) * HD + d0 + 1], qhi[ks][1], qlo[ks][1]);
      split2<kBf16>(qs[g * HD + d1], qs[g * HD + d1 + 1], qhi[ks][2], qlo[ks][2]);
      split2<kBf16>(qs[(g + 8) * HD + d1], qs[(g + 8) * HD + d1 + 1], qhi[ks][3], qlo[ks][3]);
    }
    __syncthreads();  // the q area becomes pipeline stages
  }

  const int32_t* blocks = p.indices + p.indptr[b];
  const int n_kv = p.layout.n_kv_heads;
  const char* kbase = static_cast<const char*>(p.k);
  const char* vbase = static_cast<const char*>(p.v);
  const bool pow2_bs = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  const bool need_pos = ROPE || p.causal || p.window > 0;
  const bool per64 = kFp8 && p.scale_mode == math::KvScaleMode::Ue8m0Per64;

  unsigned char* wbase = smem + warp * S::kStages * S::kStageBytes;
  const int span = range.end - range.begin - warp * kTile;
  const int n_steps = span > 0 ? (span + kWarps * kTile - 1) / (kWarps * kTile) : 0;

  // Copy step i's tile (K rows, V rows, metadata words) into stage i % kStages.
  auto issue = [&](int i) {
    if (i < n_steps) {
      unsigned char* st = wbase + (i % S::kStages) * S::kStageBytes;
      int* meta = reinterpret_cast<int*>(st + 2 * S::kTileBytes);
      const int j0 = range.begin + (i * kWarps + warp) * kTile;
      const int j = j0 + (lane & 15);
      int cell = -1;
      if (j < range.end) {
        const int blk = blocks[pow2_bs ? j >> bs_shift : j / bs];
        cell = blk * bs + (pow2_bs ? (j & (bs - 1)) : j % bs);
      }
      const int64_t row_id = int64_t{cell} * n_kv + kvh;
      if (lane < 16) {
        meta[lane] = cell;
        if (cell >= 0 && need_pos) cp_async4(smem_addr(meta + kTile + lane), p.maybe_positions + cell);
        if (cell >= 0 && p.maybe_valid) cp_async4(smem_addr(meta + 2 * kTile + lane), p.maybe_valid + (cell & ~3));
      } else if constexpr (kFp8) {
        if (cell >= 0) {
          if (per64) {
            const int64_t si = (row_id * (HD / 64)) & ~int64_t{3};
            cp_async4(smem_addr(meta + 3 * kTile + (lane - 16)), p.maybe_k_scale_u8 + si);
            cp_async4(smem_addr(meta + 4 * kTile + (lane - 16)), p.maybe_v_scale_u8 + si);
          } else {
            cp_async4(smem_addr(meta + 3 * kTile + (lane - 16)), p.maybe_k_scale_f32 + row_id);
            cp_async4(smem_addr(meta + 4 * kTile + (lane - 16)), p.maybe_v_scale_f32 + row_id);
          }
        }
      }
      const unsigned ks_ = smem_addr(st), vs_ = smem_addr(st + S::kTileBytes);
#pragma unroll
      for (int q = lane; q < kTile * S::kChunks; q += 32) {
        const int r = q / S::kChunks, c = q % S::kChunks;
        const int rc = __shfl_sync(0xffffffffu, cell, r);
        const int64_t off = (int64_t{rc} * n_kv + kvh) * S::kRowBytes + c * 16;
        const bool in = rc >= 0;
        cp_async16(ks_ + swz<S::kChunks>(r, c), in ? kbase + off : kbase, in);
        cp_async16(vs_ + swz<S::kChunks>(r, c), in ? vbase + off : vbase, in);
      }
    }
    cp_async_commit();  // one group per step, empty or not, so the wait counts stay exact
  };

#pragma unroll
  for (int i = 0; i < S::kStages - 1; ++i) issue(i);

  float o[S::kNBlocks][4];
#pragma unroll
  for (int nb = 0; nb < S::kNBlocks; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
  float m0 = math::neg_inf_f32(), m1 = math::neg_inf_f32(), l0 = 0.0f, l1 = 0.0f;
  const float sl2 = p.softmax_scale * math::kLog2e;

  for (int i = 0; i < n_steps; ++i) {
    __syncwarp();  // every lane is done reading the stage the next issue overwrites
    issue(i + S::kStages - 1);
    cp_async_wait<S::kStages - 1>();
    __syncwarp();  // step i's copies of every lane are visible
    unsigned char* st = wbase + (i % S::kStages) * S::kStageBytes;
    const int* meta = reinterpret_cast<const int*>(st + 2 * S::kTileBytes);
    const unsigned k_s = smem_addr(st), v_s = smem_addr(st + S::kTileBytes);

    // ---- this thread's 4 keys: tile rows nb * 8 + 2t + e. vis: live and in range (every
    // M row); seen[nb][x]: also within C element x's row's causal and window limits.
    bool vis[2][2], seen[2][4];
    float ksc[S::kScaleBlocks][2][2], vsc[S::kScaleBlocks][2][2];
    bool any_hidden = false;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = nb * 8 + 2 * t + e;
        const int cell = meta[r];
        bool v = cell >= 0;
        if (v && p.maybe_valid) v = ((static_cast<uint32_t>(meta[2 * kTile + r]) >> (8 * (cell & 3))) & 0xffu) != 0;
        vis[nb][e] = v;
        seen[nb][e] = seen[nb][2 + e] = v;
        if (v && need_pos) {
          const int k_pos = meta[kTile + r];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int qp = half ? q_pos1 : q_pos0;
            bool ok = !(p.causal && k_pos > qp);
            if (p.window > 0 && static_cast<int64_t>(qp) - k_pos >= p.window) ok = false;
            seen[nb][2 * half + e] = ok;
          }
        }
#pragma unroll
        for (int c = 0; c < S::kScaleBlocks; ++c) ksc[c][nb][e] = vsc[c][nb][e] = 1.0f;
        if constexpr (kFp8) {
          const uint32_t kw = static_cast<uint32_t>(meta[3 * kTile + r]), vw = static_cast<uint32_t>(meta[4 * kTile + r]);
          if (per64) {
            const int sh = static_cast<int>(((int64_t{cell} * n_kv + kvh) * (HD / 64)) & 3);
#pragma unroll
            for (int c = 0; c < S::kScaleBlocks; ++c) {
              ksc[c][nb][e] = math::ue8m0_decode(static_cast<uint8_t>(kw >> (8 * (sh + c))));
              vsc[c][nb][e] = v ? math::ue8m0_decode(static_cast<uint8_t>(vw >> (8 * (sh + c)))) : 0.0f;
            }
          } else {
#pragma unroll
            for (int c = 0; c < S::kScaleBlocks; ++c) {  // one scale for the row: every block gets it
              ksc[c][nb][e] = __uint_as_float(kw);
              vsc[c][nb][e] = v ? __uint_as_float(vw) : 0.0f;
            }
          }
        }
      }
    any_hidden = !(vis[0][0] && vis[0][1] && vis[1][0] && vis[1][1]);

    if constexpr (ROPE) {  // rotate the tile's K rows: lane -> row lane / 2, every other pair
      unsigned char* klo = smem + S::kBaseBytes + warp * S::kTileBytes;
      const float* freq = reinterpret_cast<const float*>(smem + S::kBaseBytes + kWarps * S::kTileBytes);
      const int r = lane / 2;
      if (meta[r] >= 0) {
        const float pos = static_cast<float>(meta[kTile + r]);
        const float mag = p.rope.attention_factor;
        const int n_pairs = p.rope.layout.n_pairs();
        for (int pi = lane % 2; pi < n_pairs; pi += 2) {
          const int o0 = elem_off<S::kChunks>(r, p.rope.layout.dim0(pi));
          const int o1 = elem_off<S::kChunks>(r, p.rope.layout.dim1(pi));
          const float x0 = ld16<kBf16>(st + o0), x1 = ld16<kBf16>(st + o1);
          float sn, cs;
          sincos_reduced(math::rope_angle(pos, freq[pi]), &sn, &cs);
          cs *= mag;
          sn *= mag;
          st16_split<kBf16>(st + o0, klo + o0, x0 * cs - x1 * sn);
          st16_split<kBf16>(st + o1, klo + o1, x0 * sn + x1 * cs);
        }
      }
      __syncwarp();
    }

    // ---- S = Q K^T for the 16 keys (n-block nb: keys nb*8 .. nb*8+7), per scale block
    float s[2][4];
    {
      float acc[S::kScaleBlocks][2][4];
#pragma unroll
      for (int c = 0; c < S::kScaleBlocks; ++c)
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) acc[c][nb][0] = acc[c][nb][1] = acc[c][nb][2] = acc[c][nb][3] = 0.0f;
      const int mi = lane / 8, mr = lane % 8;
      if constexpr (kFp8) {
        // matrices: (keys 0-7, chunk ks), (keys 8-15, ks), (keys 0-7, ks+1), (keys 8-15, ks+1)
#pragma unroll
        for (int ks = 0; ks < S::kKSteps; ks += 2) {
          uint32_t r[4];
          ldsm_x4(r, k_s + swz<S::kChunks>((mi & 1) * 8 + mr, ks + mi / 2));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int c = (ks + h) / 4;
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) {
              const uint32_t x = r[2 * h + nb];
              const uint32_t b0 = e4m3x2_to_f16x2(x), b1 = e4m3x2_to_f16x2(x >> 16);
              mma16816<false>(acc[c][nb], qhi[ks + h], b0, b1);
              mma16816<false>(acc[c][nb], qlo[ks + h], b0, b1);
            }
          }
        }
      } else {
        // matrices: (keys 0-7, chunk 2ks), (keys 0-7, 2ks+1), (keys 8-15, 2ks), (keys 8-15, 2ks+1)
#pragma unroll
        for (int ks = 0; ks < S::kKSteps; ++ks) {
          uint32_t r[4];
          const int off = swz<S::kChunks>((mi / 2) * 8 + mr, 2 * ks + (mi & 1));
          ldsm_x4(r, k_s + off);
          mma16816<kBf16>(acc[0][0], qhi[ks], r[0], r[1]);
          mma16816<kBf16>(acc[0][0], qlo[ks], r[0], r[1]);
          mma16816<kBf16>(acc[0][1], qhi[ks], r[2], r[3]);
          mma16816<kBf16>(acc[0][1], qlo[ks], r[2], r[3]);
          if constexpr (ROPE) {  // + q_hi K_lo: the rotated keys' rounding remainder
            uint32_t rl[4];
            ldsm_x4(rl, smem_addr(smem + S::kBaseBytes + warp * S::kTileBytes) + off);
            mma16816<kBf16>(acc[0][0], qhi[ks], rl[0], rl[1]);
            mma16816<kBf16>(acc[0][1], qhi[ks], rl[2], rl[3]);
          }
        }
      }
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          float v = 0.0f;
#pragma unroll
          for (int c = 0; c < S::kScaleBlocks; ++c) v = fmaf(acc[c][nb][x], ksc[c][nb][x & 1], v);
          s[nb][x] = seen[nb][x] ? v * sl2 : math::neg_inf_f32();
        }
    }

    // ---- online softmax over rows g (x = 0, 1) and g + 8 (x = 2, 3)
    float p_[2][4];
    {
      float mx0 = math::max_f32(math::max_f32(s[0][0], s[0][1]), math::max_f32(s[1][0], s[1][1]));
      float mx1 = math::max_f32(math::max_f32(s[0][2], s[0][3]), math::max_f32(s[1][2], s[1][3]));
      mx0 = math::max_f32(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = math::max_f32(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = math::max_f32(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = math::max_f32(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float n0 = math::max_f32(m0, mx0), n1 = math::max_f32(m1, mx1);
      const float r0 = math::softmax_rescale(m0, n0), r1 = math::softmax_rescale(m1, n1);
      m0 = n0;
      m1 = n1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        p_[nb][0] = math::softmax_weight(s[nb][0], n0);
        p_[nb][1] = math::softmax_weight(s[nb][1], n0);
        p_[nb][2] = math::softmax_weight(s[nb][2], n1);
        p_[nb][3] = math::softmax_weight(s[nb][3], n1);
        sum0 += p_[nb][0] + p_[nb][1];
        sum1 += p_[nb][2] + p_[nb][3];
      }
      l0 = l0 * r0 + sum0;
      l1 = l1 * r1 + sum1;
#pragma unroll
      for (int nb = 0; nb < S::kNBlocks; ++nb) o[nb][0] *= r0, o[nb][1] *= r0, o[nb][2] *= r1, o[nb][3] *= r1;
    }

    // Hidden keys weigh 0, but 0 * NaN is NaN: a dead cell's V bytes (never written) must
    // not reach the mma. Rare (dead cells, the tail tile), so zero those rows in place.
    if (__any_sync(0xffffffffu, any_hidden)) {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool hide = !vis[nb][e];
          if (hide) {
            const int r = nb * 8 + 2 * t + e;
            for (int c = g; c < S::kChunks; c += 8)
              *reinterpret_cast<uint4*>(st + S::kTileBytes + swz<S::kChunks>(r, c)) = make_uint4(0, 0, 0, 0);
          }
        }
      __syncwarp();
    }

    // ---- O += P V
    const int mi = lane / 8, mr = lane % 8;
    if constexpr (kFp8) {
      // Per scale block (64 dims = 4 chunks): P' = P * vsc / max(vsc), O += max(vsc) * (P' V).
      constexpr int kChunksPerBlock = S::kChunks / S::kScaleBlocks;
      // (F32PerRow: every block holds the row's one scale.)
#pragma unroll
      for (int c = 0; c < S::kScaleBlocks; ++c) {
        const int sc = c;
        float smax = math::max_f32(math::max_f32(vsc[sc][0][0], vsc[sc][0][1]), math::max_f32(vsc[sc][1][0], vsc[sc][1][1]));
        smax = math::max_f32(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
        smax = math::max_f32(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
        const float inv = smax > 0.0f ? 1.0f / smax : 0.0f;
        uint32_t ph[4], pl[4];
        split2<false>(p_[0][0] * (vsc[sc][0][0] * inv), p_[0][1] * (vsc[sc][0][1] * inv), ph[0], pl[0]);
        split2<false>(p_[0][2] * (vsc[sc][0][0] * inv), p_[0][3] * (vsc[sc][0][1] * inv), ph[1], pl[1]);
        split2<false>(p_[1][0] * (vsc[sc][1][0] * inv), p_[1][1] * (vsc[sc][1][1] * inv), ph[2], pl[2]);
        split2<false>(p_[1][2] * (vsc[sc][1][0] * inv), p_[1][3] * (vsc[sc][1][1] * inv), ph[3], pl[3]);
#pragma unroll
        for (int cc = 0; cc < kChunksPerBlock; cc += 2) {
          const int ch = c * kChunksPerBlock + cc;
          // matrices: (keys 0-7, chunk ch), (keys 8-15, ch), (keys 0-7, ch+1), (keys 8-15, ch+1)
          uint32_t r[4];
          ldsm_x4_t(r, v_s + swz<S::kChunks>((mi & 1) * 8 + mr, ch + mi / 2));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // r[2h]: keys 2t, 2t+1 at dims 2g, 2g+1 of chunk ch+h; r[2h+1]: keys 8+2t, 9+2t.
            const uint32_t lo_pair = __byte_perm(r[2 * h], 0, 0x3120), hi_pair = __byte_perm(r[2 * h + 1], 0, 0x3120);
#pragma unroll
            for (int par = 0; par < 2; ++par) {  // even dims, then odd dims
              const uint32_t b0 = e4m3x2_to_f16x2(lo_pair >> (16 * par)), b1 = e4m3x2_to_f16x2(hi_pair >> (16 * par));
              float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma16816<false>(tmp, ph, b0, b1);
              mma16816<false>(tmp, pl, b0, b1);
              float(&acc)[4] = o[2 * (ch + h) + par];
#pragma unroll
              for (int x = 0; x < 4; ++x) acc[x] = fmaf(smax, tmp[x], acc[x]);
            }
          }
        }
      }
    } else {
      uint32_t ph[4], pl[4];
      split2<kBf16>(p_[0][0], p_[0][1], ph[0], pl[0]);
      split2<kBf16>(p_[0][2], p_[0][3], ph[1], pl[1]);
      split2<kBf16>(p_[1][0], p_[1][1], ph[2], pl[2]);
      split2<kBf16>(p_[1][2], p_[1][3], ph[3], pl[3]);
      // matrices: (keys 0-7, chunk c), (keys 8-15, c), (keys 0-7, c+1), (keys 8-15, c+1)
#pragma unroll
      for (int c = 0; c < S::kNBlocks; c += 2) {
        uint32_t r[4];
        ldsm_x4_t(r, v_s + swz<S::kChunks>((mi & 1) * 8 + mr, c + mi / 2));
        mma16816<kBf16>(o[c], ph, r[0], r[1]);
        mma16816<kBf16>(o[c], pl, r[0], r[1]);
        mma16816<kBf16>(o[c + 1], ph, r[2], r[3]);
        mma16816<kBf16>(o[c + 1], pl, r[2], r[3]);
      }
    }
  }
  cp_async_wait<0>();

  // ---- merge the 4 warps in shared memory and write the normalized partial
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  __syncthreads();  // every warp is done with its pipeline stages
  float* red = reinterpret_cast<float*>(smem);           // [kWarps][16][HD]
  float* ml = red + kWarps * 16 * HD;                    // [kWarps][16][2]: m, l
#pragma unroll
  for (int nb = 0; nb < S::kNBlocks; ++nb)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int d = out_dim<kFp8>(nb, e, t);
      red[(warp * 16 + g) * HD + d] = o[nb][e];
      red[(warp * 16 + g + 8) * HD + d] = o[nb][2 + e];
    }
  if (t == 0) {
    ml[(warp * 16 + g) * 2] = m0, ml[(warp * 16 + g) * 2 + 1] = l0;
    ml[(warp * 16 + g + 8) * 2] = m1, ml[(warp * 16 + g + 8) * 2 + 1] = l1;
  }
  __syncthreads();
  for (int i = tid; i < 16 * HD; i += kThreads) {
    const int h = i / HD, d = i % HD;
    if (!m_real(h)) continue;
    float mx = ml[h * 2];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mx = math::max_f32(mx, ml[(w * 16 + h) * 2]);
    float l = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = math::softmax_rescale(ml[(w * 16 + h) * 2], mx);
      l += ml[(w * 16 + h) * 2 + 1] * f;
      acc += red[(w * 16 + h) * HD + d] * f;
    }
    const int64_t part = (int64_t{row + h / chunk_heads} * p.n_q_heads + h0 + h % chunk_heads) * p.num_splits + split;
    p.o_part[part * HD + d] = l > 0.0f ? acc / l : 0.0f;
    if (d == 0) p.lse_part[part] = l > 0.0f ? mx + math::log2_f32(l) : math::neg_inf_f32();
  }
}

template <int HD, math::KvElem KV, bool ROPE>
__global__ void __launch_bounds__(kThreads) mma_decode_kernel(const PagedAttentionParams p, int chunks, int chunk_heads) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int row = blockIdx.x / p.num_splits, split = blockIdx.x % p.num_splits;
  const int kvh = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  decode_body<HD, KV, ROPE>(p, smem, row, split, kvh, chunk, chunk_heads);
}

}  // namespace kvcore::ops::cuda::mma_attn
