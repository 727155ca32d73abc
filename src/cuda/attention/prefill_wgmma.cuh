// Causal prefill over 16-bit pages on Hopper's warpgroup MMA (sm_90a), FlashAttention-3 style:
// a CTA takes 32 query rows of one sequence and up to 4 query heads of one kv head; each of its
// two warpgroups owns 16 of the rows for all 4 heads, packed into the M = 64 rows of a wgmma
// (warp w of the warpgroup: head w, rows 16 w .. 16 w + 15 of M = that head's 16 query rows).
// K/V tiles of 64 keys are copied from the pages by cp.async into 128-byte swizzled shared
// memory (wgmma_primitives.cuh), 4 stages, two tiles in flight, one barrier a tile; both
// warpgroups read every tile.
//
//   S = Q K^T   wgmma m64n64k16, A = q rows from registers (loaded once), B = K tile (K-major)
//   O += P V    wgmma m64n{HD}k16, A = P from S's accumulators converted in registers,
//               B = V tile (MN-major: the transpose bit)
//
// Online softmax in f32 with the SFU's exp2 on scores pre-scaled by scale * log2(e), as the
// mma.sync prefill kernel (attention_prefill.cuh), with the same masks: valid byte, causal by
// position (k_pos <= q_pos), sliding window, sinks in the denominator at the end. Warp 0 turns a
// landed tile's per-key metadata into positions (INT_MAX: no key) and a summary one tile ahead,
// so a warpgroup skips a tile none of its rows sees and drops the masks of a tile all its rows
// see whole. The P V of tile i stays in flight (wgmma is asynchronous) while the warpgroup
// passes the next barrier, issues the next copies and the next S; its stage is reused two
// tiles later, after every warpgroup waited for it.
// q must be exact in the page type (f16 q on f16 pages, bf16 on bf16) and the output 16-bit:
// P is one 16-bit value (2^-9 relative for bf16, under a 16-bit output's own rounding); other
// calls take the mma.sync kernel.
#pragma once
#include <climits>

#include "cuda/attention/mma_primitives.cuh"
#include "cuda/attention/wgmma_primitives.cuh"
#include "kvcore/math/softmax.hpp"
#include "ops/attention_params.hpp"
#include "ops/prefill_row_blocks.hpp"

namespace kvcore::ops::cuda::prefill_wgmma {

using mma_attn::cp_async16;
using mma_attn::cp_async4;
using mma_attn::cp_async_commit;
using mma_attn::cp_async_wait;
using mma_attn::Exp2Ftz;
using mma_attn::smem_addr;

constexpr int kHeads = 4;     // query heads per CTA (of one kv head): the 4 warps of a warpgroup
constexpr int kKeys = 64;     // keys per tile: S is m64n64
constexpr int kStages = 4;    // tile i + 2 is copied into the stage of tile i - 2 (see above)
constexpr int kGroups = 2;    // warpgroups per CTA
constexpr int kThreads = 128 * kGroups;
constexpr int kRows = 16 * kGroups;  // query rows per CTA

template <int HD>
struct Shape {
  static constexpr int kChunks = HD / 8;             // 16-byte chunks per K or V row
  static constexpr int kTileBytes = kKeys * HD * 2;  // a multiple of 1024: regions stay aligned
  static constexpr int kStageBytes = 2 * kTileBytes; // K tile, then V tile
  static constexpr int kMetaInts = 3 * kKeys + 4;    // per key: cell, position, valid word; summary
  static constexpr int kMetaOffset = kStages * kStageBytes;
  // + 1024: the dynamic shared memory is aligned up to 1024 bytes in the kernel
  static constexpr int kSmemBytes = kMetaOffset + kStages * kMetaInts * 4 + 1024;
  static constexpr int kKSteps = HD / 16;  // k-steps of S over dims
  static constexpr int kDTiles = HD / 8;   // 8-dim column blocks of O
  static constexpr int kNTiles = kKeys / 8;
  static constexpr int kRowsPerIt = kThreads / kChunks;
  static constexpr int kCopyIts = kKeys / kRowsPerIt;  // rows a thread copies per tile
};

template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

#if KVCORE_WGMMA_ARCH
// O += P V over one tile: N = HD (64 or 128).
template <int HD, bool BF16>
__device__ __forceinline__ void pv_step(float (&o)[HD / 8][4], const uint32_t (&pa)[4], uint64_t desc) {
  if constexpr (HD == 128) wgmma::wgmma_m64n128k16_rs<BF16, 1>(o, pa, desc, 1);
  else wgmma::wgmma_m64n64k16_rs<BF16, 1>(o, pa, desc, 1);
}
#endif

template <int HD, bool BF16>
__global__ void __launch_bounds__(kThreads, 1) prefill_wgmma_kernel(const PagedAttentionParams p, int chunk_heads) {
#if KVCORE_WGMMA_ARCH
  using S = Shape<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzle atoms must start 1024-byte aligned (base offset 0 in the descriptors).
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const PrefillRowBlock rb = prefill_row_block<kRows>(p, static_cast<int>(blockIdx.x));
  if (rb.n_r <= 0) return;
  const int row = rb.row, b = rb.b, n_r = rb.n_r;
  const int chunks = (p.group + chunk_heads - 1) / chunk_heads;
  const int kvh = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int h0 = kvh * p.group + chunk * chunk_heads;
  const int n_h = min(chunk_heads, p.group - chunk * chunk_heads);
  const int hw = warp % kHeads, r0 = 16 * (warp / kHeads);  // this warp's head and first row
  const bool wg_live = r0 < n_r;               // warpgroup-uniform: it has rows
  const bool active = wg_live && hw < n_h;     // warp-uniform: its head exists
  const int head = h0 + (hw < n_h ? hw : 0);
  const int bs = p.layout.block_size, n_kv = p.layout.n_kv_heads;
  const int n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, bs);
  const int32_t* blocks = p.indices + p.indptr[b];
  const bool pow2_bs = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  const uint8_t* valid = p.maybe_valid;
  const char* kbase = static_cast<const char*>(p.k);
  const char* vbase = static_cast<const char*>(p.v);
  const int n_tiles = (n_cells + kKeys - 1) / kKeys;
  auto stage_of = [&](int s) { return smem + s * S::kStageBytes; };
  auto meta_of = [&](int s) { return reinterpret_cast<int*>(smem + S::kMetaOffset) + s * S::kMetaInts; };

  // Block ids of the rows this thread copies for tile i (-1: past the keys), loaded a tile
  // before the copies that need them.
  auto load_blocks = [&](int i, int (&blk)[S::kCopyIts]) {
#pragma unroll
    for (int it = 0; it < S::kCopyIts; ++it) {
      const int j = i * kKeys + tid / S::kChunks + it * S::kRowsPerIt;
      blk[it] = i < n_tiles && j < n_cells ? __ldg(blocks + (pow2_bs ? j >> bs_shift : j / bs)) : -1;
    }
  };
  // Copy tile i (K rows, V rows into the swizzled layout; per-key cell / position / valid word)
  // into stage s. Rows past the keys are zero-filled.
  auto issue = [&](int i, int s, const int (&blk)[S::kCopyIts]) {
    if (i < n_tiles) {
      unsigned char* st = stage_of(s);
      int* meta = meta_of(s);
      const int c = tid % S::kChunks;
#pragma unroll
      for (int it = 0; it < S::kCopyIts; ++it) {
        const int r = tid / S::kChunks + it * S::kRowsPerIt, j = i * kKeys + r;
        const bool in = blk[it] >= 0;
        int cell = -1;
        if (in) cell = blk[it] * bs + (pow2_bs ? (j & (bs - 1)) : j % bs);
        const size_t off = in ? (size_t(cell) * n_kv + kvh) * (HD * 2) + c * 16 : 0;
        const int dst = wgmma::tile_chunk_offset<kKeys>(r, c);
        cp_async16(smem_addr(st + dst), kbase + off, in);
        cp_async16(smem_addr(st + S::kTileBytes + dst), vbase + off, in);
        if (c == 0) {
          meta[r] = cell;
          if (in) {
            cp_async4(smem_addr(meta + kKeys + r), p.maybe_positions + cell);
            if (valid) cp_async4(smem_addr(meta + 2 * kKeys + r), valid + (cell & ~3));
          }
        }
      }
    }
    cp_async_commit();
  };

  // ---- positions of this thread's rows (g, g + 8; INT_MIN past the chunk: sees nothing) and
  // their range over the warp's rows (the same rows for every warp of a warpgroup)
  const int64_t pos_off = p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[b] : 0;
  int qp[2];
  int qmin = INT_MAX, qmax = INT_MIN;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const bool real = r0 + g + 8 * e < n_r;
    qp[e] = real ? p.maybe_q_positions[row + r0 + g + 8 * e] : INT_MIN;
    if (real) qmin = min(qmin, qp[e]), qmax = max(qmax, qp[e]);
  }
#pragma unroll
  for (int x = 4; x < 32; x <<= 1) {  // lanes of equal g hold the same rows
    qmin = min(qmin, __shfl_xor_sync(0xffffffffu, qmin, x));
    qmax = max(qmax, __shfl_xor_sync(0xffffffffu, qmax, x));
  }
  auto sees = [&](int q, int kp) {
    return kp != INT_MAX && kp <= q && (p.window <= 0 || int64_t{q} - kp < p.window);
  };

  // ---- q rows as A fragments, once (A layout in wgmma_primitives.cuh): qa[ks][2h + e] packs
  // (row g + 8e, dims 16 ks + 8h + 2t, + 1) of this warp's head; zeros for rows past the chunk
  // and heads past the group.
  uint32_t qa[S::kKSteps][4];
  {
    const uint16_t* q16 = static_cast<const uint16_t*>(p.q);
    int64_t qbase[2];
    bool qreal[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      qreal[e] = active && r0 + g + 8 * e < n_r;
      qbase[e] = qreal[e] ? int64_t{row + r0 + g + 8 * e} * p.q_row_stride + int64_t{head} * p.q_head_stride : 0;
    }
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t at = qbase[e] + 16 * ks + 8 * h + 2 * t;
          const uint32_t lo = qreal[e] ? q16[at] : 0u, hi = qreal[e] ? q16[at + 1] : 0u;
          qa[ks][2 * h + e] = lo | (hi << 16);
        }
  }

  float o[S::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < S::kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {math::neg_inf_f32(), math::neg_inf_f32()}, l[2] = {0.0f, 0.0f};
  const float sl2 = p.softmax_scale * math::kLog2e;

  // Warp 0, once the copies of tile i landed (and a barrier passed): each key's position as rows
  // compare it (stored - offset; INT_MAX for no key or a dead cell) and the tile's summary.
  // Dead cells' V bytes may be anything (NaN): their weight is 0 but 0 * NaN is not, so they are
  // zeroed (then made visible to wgmma's async proxy). Nobody reads the tile before the next
  // barrier.
  auto prepare = [&](int i, int s) {
    if (warp != 0 || i >= n_tiles) return;
    unsigned char* st = stage_of(s);
    int* meta = meta_of(s);
    int* kpos = meta + kKeys;
    int kmin = INT_MAX, kmax = INT_MIN;
    bool all_live = true, zeroed = false;
#pragma unroll
    for (int r = lane; r < kKeys; r += 32) {
      const int cell = meta[r];
      bool live = cell >= 0;
      if (live && valid) live = ((static_cast<uint32_t>(meta[2 * kKeys + r]) >> (8 * (cell & 3))) & 0xffu) != 0;
      const int64_t kp = int64_t{kpos[r]} - pos_off;
      const int64_t lo = INT_MIN, hi = INT_MAX - 1;
      const int k = static_cast<int>(kp < lo ? lo : kp > hi ? hi : kp);
      kpos[r] = live ? k : INT_MAX;
      if (live) kmin = min(kmin, k), kmax = max(kmax, k);
      all_live = all_live && live;
      if (cell >= 0 && !live) {
        zeroed = true;
        for (int c = 0; c < S::kChunks; ++c)
          *reinterpret_cast<uint4*>(st + S::kTileBytes + wgmma::tile_chunk_offset<kKeys>(r, c)) = make_uint4(0, 0, 0, 0);
      }
    }
    if (zeroed) wgmma::fence_proxy_async();
#pragma unroll
    for (int x = 1; x < 32; x <<= 1) {
      kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, x));
      kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, x));
    }
    all_live = __all_sync(0xffffffffu, all_live);
    if (lane == 0) {
      int* sum = meta + 3 * kKeys;
      sum[0] = kmin, sum[1] = kmax, sum[2] = all_live ? 1 : 0;
    }
  };

  // Tile i lives in stage i % 4. Before tile i is read: tile i + 1 landed and prepared (during
  // tile i's step), tile i + 2 in flight into the stage of tile i - 2, whose P V every
  // warpgroup waited for before the barrier (only the latest P V may be pending past a step).
  int blk[S::kCopyIts];
  load_blocks(0, blk);
  issue(0, 0, blk);
  load_blocks(1, blk);
  issue(1, 1, blk);
  load_blocks(2, blk);
  cp_async_wait<1>();
  wgmma::fence_proxy_async();
  __syncthreads();
  prepare(0, 0);
  for (int i = 0; i < n_tiles; ++i) {
    const int s = i % kStages;
    cp_async_wait<0>();  // this thread's copies of tile i + 1
    wgmma::fence_proxy_async();
    __syncthreads();  // tile i prepared, tile i + 1 landed, stage (i + 2) % 4 free
    prepare(i + 1, (i + 1) % kStages);
    issue(i + 2, (i + 2) % kStages, blk);
    load_blocks(i + 3, blk);
    const int* meta = meta_of(s);
    const int* kpos = meta + kKeys;
    // The warpgroup's rows against the tile (warpgroup-uniform): none sees a key -> skip; every
    // key live and seen by every row -> no masks.
    const int kmin = meta[3 * kKeys], kmax = meta[3 * kKeys + 1];
    const bool none = kmin == INT_MAX || kmin > qmax || (p.window > 0 && int64_t{qmin} - kmax >= p.window);
    const bool full = meta[3 * kKeys + 2] != 0 && kmax <= qmin && (p.window <= 0 || int64_t{qmax} - kmin < p.window);
    if (!wg_live) continue;
    if (none) {
      wgmma::wait<0>();  // the previous tile's P V: its stage is refilled next step
      continue;
    }
    const uint32_t k_s = smem_addr(stage_of(s)), v_s = k_s + S::kTileBytes;
    float sc[S::kNTiles][4];
#pragma unroll
    for (int j = 0; j < S::kNTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks)
      wgmma::wgmma_m64n64k16_rs<BF16, 0>(sc, qa[ks], wgmma::desc_k_major<kKeys>(k_s, ks), ks > 0 ? 1 : 0);
    wgmma::commit();
    wgmma::wait<0>();  // S of this tile and the P V of the previous one
    wgmma::fence_regs(sc);
    wgmma::fence_regs(o);
    // masks and scale; sc[j][x]: row g + 8 (x >> 1), key 8j + 2t + (x & 1)
    if (full) {
#pragma unroll
      for (int j = 0; j < S::kNTiles; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) sc[j][x] *= sl2;
    } else {
#pragma unroll
      for (int j = 0; j < S::kNTiles; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x)
          sc[j][x] = sees(qp[x >> 1], kpos[8 * j + 2 * t + (x & 1)]) ? sc[j][x] * sl2 : math::neg_inf_f32();
    }
    // online softmax per row (the 4 lanes of a row hold its keys)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float mx = math::neg_inf_f32();
#pragma unroll
      for (int j = 0; j < S::kNTiles; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * e], sc[j][2 * e + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[e], mx);
      const float rs = math::softmax_rescale(m[e], mn, Exp2Ftz{});
      m[e] = mn;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < S::kNTiles; ++j) {
        sc[j][2 * e] = math::softmax_weight(sc[j][2 * e], mn, Exp2Ftz{});
        sc[j][2 * e + 1] = math::softmax_weight(sc[j][2 * e + 1], mn, Exp2Ftz{});
        sum += sc[j][2 * e] + sc[j][2 * e + 1];
      }
      l[e] = l[e] * rs + sum;
#pragma unroll
      for (int dt = 0; dt < S::kDTiles; ++dt) o[dt][2 * e] *= rs, o[dt][2 * e + 1] *= rs;
    }
    // P's A fragment of k-step kk (keys 16 kk .. 16 kk + 15) is S's accumulators of column
    // blocks 2 kk (A cols 0-7: a[0] row g, a[1] row g + 8) and 2 kk + 1 (A cols 8-15: a[2], a[3]).
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pa[kk][0] = pack2<BF16>(sc[2 * kk][0], sc[2 * kk][1]);
      pa[kk][1] = pack2<BF16>(sc[2 * kk][2], sc[2 * kk][3]);
      pa[kk][2] = pack2<BF16>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      pa[kk][3] = pack2<BF16>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
    }
    wgmma::fence_regs(o);
    wgmma::fence_regs(pa);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) pv_step<HD, BF16>(o, pa[kk], wgmma::desc_mn_major<kKeys>(v_s, kk));
    wgmma::commit();  // left in flight: waited for at the next S (or skip, or the end)
  }
  wgmma::wait<0>();  // every warpgroup (unconditionally: a wait under a branch made ptxas serialize the wgmmas)
  wgmma::fence_regs(o);
  cp_async_wait<0>();

  if (!active) return;
  // ---- normalize (sinks join the denominator) and store rows g, g + 8; o[dt][x]: row
  // g + 8 (x >> 1), dim 8 dt + 2t + (x & 1)
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 1);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 2);
    const int rr = r0 + g + 8 * e;
    if (rr >= n_r) continue;
    float den = l[e];
    if (p.maybe_sinks && !math::is_neg_inf(m[e])) den += math::exp2_f32(p.maybe_sinks[head] * math::kLog2e - m[e]);
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    const int64_t base = int64_t{row + rr} * p.out_row_stride + int64_t{head} * p.out_head_stride;
#pragma unroll
    for (int dt = 0; dt < S::kDTiles; ++dt) {
      const int d = dt * 8 + 2 * t;
      store_q_elem(p.out, base + d, p.out_elem, o[dt][2 * e] * inv);
      store_q_elem(p.out, base + d + 1, p.out_elem, o[dt][2 * e + 1] * inv);
    }
  }
#else
  (void)p;
  (void)chunk_heads;
  __trap();  // built for sm_90a only; the launcher checks the device
#endif
}

}  // namespace kvcore::ops::cuda::prefill_wgmma
