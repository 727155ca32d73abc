// Causal prefill over 16-bit pages on Hopper's warpgroup MMA (sm_90a), FlashAttention-3 style:
// a CTA takes 32 query rows of one sequence and up to 4 query heads of one kv head; each of its
// two consumer warpgroups owns 16 of the rows for all 4 heads, packed into the M = 64 rows of a
// wgmma (warp w of the warpgroup: head w, rows 16 w .. 16 w + 15 of M = that head's 16 query
// rows). K/V tiles of 64 keys are copied from the pages by cp.async into 128-byte swizzled
// shared memory (wgmma_primitives.cuh), 4 stages; both warpgroups read every tile.
//
//   S = Q K^T   wgmma m64n64k16, A = q rows from registers (loaded once), B = K tile (K-major)
//   O += P V    wgmma m64n{HD}k16, A = P from S's accumulators converted in registers,
//               B = V tile (MN-major: the transpose bit)
//
// Online softmax in f32 with the SFU's exp2 on scores pre-scaled by scale * log2(e), as the
// mma.sync prefill kernel (attention_prefill.cuh), with the same masks: valid byte, causal by
// position (k_pos <= q_pos), sliding window, sinks in the denominator at the end. A landed
// tile's per-key metadata becomes positions (INT_MAX: no key) and a summary (prepare_tile), so a
// warpgroup drops the masks of a tile all its rows see whole. A warpgroup's tiles are pipelined
// (pipelined_step): a tile's softmax overlaps the previous tile's P V.
// These kernels share the pieces:
//  - prefill_wgmma_kernel (this file): every thread copies, one CTA barrier a tile, tiles i + 1
//    and i + 2 in flight while tile i is read;
//  - prefill_wgmma_ws_kernel (prefill_wgmma_ws.cuh): a producer warpgroup copies and prepares,
//    mbarriers hand stages to the two warpgroups, which then run unsynchronized (one's softmax
//    overlaps the other's wgmma); prefill_wgmma_tma_kernel (prefill_wgmma_tma.cuh) with TMA copies;
//  - prefill_wgmma_wide_kernel (prefill_wgmma_wide.cuh): tiles of 128 keys (S m64n128) with q in
//    shared memory, the automatic choice.
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
constexpr int kKeys = 64;     // keys per tile of variants 5-8: S is m64n64 (the wide kernel's: kWideKeys)
constexpr int kStages = 4;
constexpr int kGroups = 2;    // consumer warpgroups per CTA
constexpr int kConsumerThreads = 128 * kGroups;
constexpr int kRows = 16 * kGroups;  // query rows per CTA

// A tile of KEYS keys; the layout of the 4-stage kernels' shared memory (variants 5-8).
template <int HD, int KEYS = kKeys>
struct Shape {
  static constexpr int kChunks = HD / 8;             // 16-byte chunks per K or V row
  static constexpr int kTileBytes = KEYS * HD * 2;   // a multiple of 1024: regions stay aligned
  static constexpr int kStageBytes = 2 * kTileBytes; // K tile, then V tile
  static constexpr int kMetaInts = 3 * KEYS + 4;     // per key: cell, position, valid word; summary, spare word
  static constexpr int kMetaOffset = kStages * kStageBytes;
  static constexpr int kBarOffset = kMetaOffset + kStages * kMetaInts * 4;  // 8-byte aligned
  // mbarriers (full, empty per stage; the warp-specialized kernel), + 1024: the dynamic shared
  // memory is aligned up to 1024 bytes in the kernels
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;
  static constexpr int kKSteps = HD / 16;  // k-steps of S over dims
  static constexpr int kDTiles = HD / 8;   // 8-dim column blocks of O
  static constexpr int kNTiles = KEYS / 8;
};

// What a CTA works on: rows [row, row + n_r) of sequence b, heads h0 .. h0 + n_h - 1 of kv head
// kvh, the sequence's n_cells cells (n_tiles tiles). The grid is (row blocks, kv heads x head
// chunks) as for the mma.sync kernel, but its linear index is read head-fastest with the row
// blocks reversed: CTAs start in launch order, so the last rows of a chunk (the most keys under
// the causal mask) start first and the short ones fill the tail of the last wave.
struct Cta {
  int row, b, n_r, kvh, h0, n_h, bs, n_kv, n_cells, n_tiles, bs_shift;
  bool pow2_bs;
  int64_t pos_off;
  const int32_t* blocks;
};

__device__ __forceinline__ bool make_cta(const PagedAttentionParams& p, int chunk_heads, Cta& c) {
  const int64_t lin = blockIdx.x + int64_t{blockIdx.y} * gridDim.x;
  const int heads = gridDim.y;  // kv heads x head chunks
  const int x_rev = static_cast<int>(lin / heads), y = static_cast<int>(lin % heads);
  const int n_blocks = (p.n_rows + kRows - 1) / kRows;  // then one CTA per sequence (prefill_row_blocks.hpp)
  const int x = x_rev < n_blocks ? n_blocks - 1 - x_rev : x_rev;
  const PrefillRowBlock rb = prefill_row_block<kRows>(p, x);
  if (rb.n_r <= 0) return false;
  c.row = rb.row, c.b = rb.b, c.n_r = rb.n_r;
  const int chunks = (p.group + chunk_heads - 1) / chunk_heads;
  c.kvh = y / chunks;
  const int chunk = y % chunks;
  c.h0 = c.kvh * p.group + chunk * chunk_heads;
  c.n_h = min(chunk_heads, p.group - chunk * chunk_heads);
  c.bs = p.layout.block_size, c.n_kv = p.layout.n_kv_heads;
  c.n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, c.b, c.bs);
  c.n_tiles = (c.n_cells + kKeys - 1) / kKeys;  // the wide kernel counts its own (tiles_seen)
  c.pow2_bs = (c.bs & (c.bs - 1)) == 0;
  c.bs_shift = __ffs(c.bs) - 1;
  c.pos_off = p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[c.b] : 0;
  c.blocks = p.indices + p.indptr[c.b];
  return true;
}

// Block id holding key j of the sequence (-1: past its keys).
__device__ __forceinline__ int block_of(const Cta& c, int j) {
  return j < c.n_cells ? __ldg(c.blocks + (c.pow2_bs ? j >> c.bs_shift : j / c.bs)) : -1;
}
__device__ __forceinline__ int cell_of(const Cta& c, int blk, int j) {
  return blk < 0 ? -1 : blk * c.bs + (c.pow2_bs ? (j & (c.bs - 1)) : j % c.bs);
}

// Whether a key (cell `cell`, -1: none; its valid word: the 4 valid bytes around it, read where
// p.maybe_valid is set) is live, and a live key's position as rows compare it: stored minus the
// sequence's offset, clamped to int below INT_MAX (which stands for no key).
__device__ __forceinline__ bool key_live(const PagedAttentionParams& p, int cell, uint32_t valid_word) {
  return cell >= 0 && (!p.maybe_valid || ((valid_word >> (8 * (cell & 3))) & 0xffu) != 0);
}
__device__ __forceinline__ int key_position(const Cta& ct, int stored) {
  const int64_t kp = int64_t{stored} - ct.pos_off;
  return static_cast<int>(kp < INT_MIN ? INT_MIN : kp > INT_MAX - 1 ? INT_MAX - 1 : kp);
}

// Copies of key r of a tile (cell `cell`, -1: none) into a stage: its cell, position and
// valid word (copy_key_meta), 16-byte chunk c of its K and V rows (copy_key_chunk; zero-filled
// past the keys).
__device__ __forceinline__ void copy_key_meta(const PagedAttentionParams& p, int* meta, int r, int cell) {
  meta[r] = cell;
  if (cell >= 0) {
    cp_async4(smem_addr(meta + kKeys + r), p.maybe_positions + cell);
    if (p.maybe_valid) cp_async4(smem_addr(meta + 2 * kKeys + r), p.maybe_valid + (cell & ~3));
  }
}
template <int HD>
__device__ __forceinline__ void copy_key_chunk(const PagedAttentionParams& p, const Cta& ct, unsigned char* st, int r, int c,
                                               int cell) {
  using S = Shape<HD>;
  const bool in = cell >= 0;
  const size_t off = in ? (size_t(cell) * ct.n_kv + ct.kvh) * (HD * 2) + c * 16 : 0;
  const int dst = wgmma::tile_chunk_offset<kKeys>(r, c);
  cp_async16(smem_addr(st + dst), static_cast<const char*>(p.k) + off, in);
  cp_async16(smem_addr(st + S::kTileBytes + dst), static_cast<const char*>(p.v) + off, in);
}

// One warp (all 32 lanes), once a tile's copies landed: each key's position as rows compare it
// (stored - offset; INT_MAX for no key or a dead cell) and the tile's summary (smallest /
// largest live position, every key live). Dead cells' V bytes may be anything (NaN): their
// weight is 0 but 0 * NaN is not, so they are zeroed, then made visible to wgmma's async proxy.
// kZeroPast: the V rows of keys past the sequence too (copies that land whole pages, where
// cp.async zero-fills them).
template <int HD, bool kZeroPast = false>
__device__ __forceinline__ void prepare_tile(const PagedAttentionParams& p, const Cta& ct, unsigned char* st, int* meta,
                                             int lane) {
  using S = Shape<HD>;
  int* kpos = meta + kKeys;
  int kmin = INT_MAX, kmax = INT_MIN;
  bool all_live = true;
#pragma unroll
  for (int r = lane; r < kKeys; r += 32) {
    const int cell = meta[r];
    const bool live = key_live(p, cell, static_cast<uint32_t>(meta[2 * kKeys + r]));
    const int k = key_position(ct, kpos[r]);
    kpos[r] = live ? k : INT_MAX;
    if (live) kmin = min(kmin, k), kmax = max(kmax, k);
    all_live = all_live && live;
    if ((kZeroPast || cell >= 0) && !live)
      for (int c = 0; c < S::kChunks; ++c)
        *reinterpret_cast<uint4*>(st + S::kTileBytes + wgmma::tile_chunk_offset<kKeys>(r, c)) = make_uint4(0, 0, 0, 0);
  }
#if KVCORE_WGMMA_ARCH
  wgmma::fence_proxy_async();  // this lane's copies and zeros, before wgmma reads them
#endif
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
}

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

// One consumer thread's share of its warpgroup's 64 rows: rows g and g + 8 of its warp
// (g = lane / 4, t = lane % 4), i.e. query rows r0 + g, r0 + g + 8 of head `head`.
template <int HD>
struct RowState {
  float o[HD / 8][4];  // O accumulators: o[dt][x] row g + 8 (x >> 1), dim 8 dt + 2t + (x & 1)
  float m[2], l[2];    // running max (log2 domain) and row sum of this thread's keys
  int qp[2];           // positions (INT_MIN past the chunk: sees nothing)
  int qmin, qmax;      // over the warpgroup's rows (the same rows in its 4 warps)
};
// With q as A fragments in registers (layout in wgmma_primitives.cuh): variants 5-8.
template <int HD>
struct Rows : RowState<HD> {
  uint32_t qa[HD / 16][4];
};

// Positions and a zero state.
template <int HD>
__device__ __forceinline__ void init_state(const PagedAttentionParams& p, const Cta& ct, int r0, int g, RowState<HD>& w) {
  w.qmin = INT_MAX, w.qmax = INT_MIN;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const bool real = r0 + g + 8 * e < ct.n_r;
    w.qp[e] = real ? p.maybe_q_positions[ct.row + r0 + g + 8 * e] : INT_MIN;
    if (real) w.qmin = min(w.qmin, w.qp[e]), w.qmax = max(w.qmax, w.qp[e]);
  }
#pragma unroll
  for (int x = 4; x < 32; x <<= 1) {  // lanes of equal g hold the same rows
    w.qmin = min(w.qmin, __shfl_xor_sync(0xffffffffu, w.qmin, x));
    w.qmax = max(w.qmax, __shfl_xor_sync(0xffffffffu, w.qmax, x));
  }
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) w.o[dt][0] = w.o[dt][1] = w.o[dt][2] = w.o[dt][3] = 0.0f;
  w.m[0] = w.m[1] = math::neg_inf_f32();
  w.l[0] = w.l[1] = 0.0f;
}

// Positions, q fragments (qa[ks][2h + e] packs row g + 8e, dims 16 ks + 8h + 2t, + 1; zeros for
// rows past the chunk and heads past the group) and a zero state.
template <int HD>
__device__ __forceinline__ void init_rows(const PagedAttentionParams& p, const Cta& ct, int r0, bool head_live, int head,
                                          int g, int t, Rows<HD>& w) {
  using S = Shape<HD>;
  init_state<HD>(p, ct, r0, g, w);
  const uint16_t* q16 = static_cast<const uint16_t*>(p.q);
  int64_t qbase[2];
  bool qreal[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    qreal[e] = head_live && r0 + g + 8 * e < ct.n_r;
    qbase[e] = qreal[e] ? int64_t{ct.row + r0 + g + 8 * e} * p.q_row_stride + int64_t{head} * p.q_head_stride : 0;
  }
#pragma unroll
  for (int ks = 0; ks < S::kKSteps; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t at = qbase[e] + 16 * ks + 8 * h + 2 * t;
        const uint32_t lo = qreal[e] ? q16[at] : 0u, hi = qreal[e] ? q16[at + 1] : 0u;
        w.qa[ks][2 * h + e] = lo | (hi << 16);
      }
}

// Whether the warpgroup's rows see a prepared tile whole (warpgroup-uniform): some row sees a
// key, every key is live and every row sees every key. Such a tile's masks are dropped; every
// other tile is masked key by key (a tile no row sees gives all-masked scores).
// sum: the tile's summary (smallest, largest live position, every key live; prepare_tile).
template <int HD>
__device__ __forceinline__ bool tile_seen_whole(const PagedAttentionParams& p, const int* sum, const RowState<HD>& w) {
  const int kmin = sum[0], kmax = sum[1];
  const bool none = kmin == INT_MAX || kmin > w.qmax || (p.window > 0 && int64_t{w.qmin} - kmax >= p.window);
  return !none && sum[2] != 0 && kmax <= w.qmin && (p.window <= 0 || int64_t{w.qmax} - kmin < p.window);
}

#if KVCORE_WGMMA_ARCH
template <int KEYS>
using Scores = float[KEYS / 8][4];     // S accumulators: [j][x] row g + 8 (x >> 1), key 8j + 2t + (x & 1)
template <int KEYS>
using PFrags = uint32_t[KEYS / 16][4];  // P as A fragments, one per k-step of 16 keys

// Issues S = Q K^T over a tile (not committed).
template <int HD, bool BF16>
__device__ __forceinline__ void issue_s(const Rows<HD>& w, uint32_t k_s, Scores<kKeys>& sc) {
  using S = Shape<HD>;
#pragma unroll
  for (int j = 0; j < S::kNTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < S::kKSteps; ++ks)
    wgmma::wgmma_m64n64k16_rs<BF16, 0>(sc, w.qa[ks], wgmma::desc_k_major<kKeys>(k_s, ks), ks > 0 ? 1 : 0);
}

// Masks and online softmax of a tile's scores (raw q.k): sc becomes the weights (relative to the
// new running max), l is updated, rs[e] is the factor O's row e must be rescaled by before this
// tile's P V is added. Each weight is one FFMA and one exp2: exp2(s * sl2 - offset), the scale
// folded in and the all-masked row handled once a row (math::softmax_offset), since the consumer
// warps' instruction stream, not the tensor cores, bounds the kernel.
template <int HD, int KEYS>
__device__ __forceinline__ void softmax_tile(const PagedAttentionParams& p, RowState<HD>& w, Scores<KEYS>& sc,
                                             const int* kpos, bool full, float sl2, int t, float (&rs)[2]) {
  using S = Shape<HD, KEYS>;
  if (!full) {
#pragma unroll
    for (int j = 0; j < S::kNTiles; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int q = w.qp[x >> 1], kp = kpos[8 * j + 2 * t + (x & 1)];
        const bool sees = kp != INT_MAX && kp <= q && (p.window <= 0 || int64_t{q} - kp < p.window);
        if (!sees) sc[j][x] = math::neg_inf_f32();
      }
  }
  // per row (the 4 lanes of a row hold its keys)
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float mx = math::neg_inf_f32();
#pragma unroll
    for (int j = 0; j < S::kNTiles; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * e], sc[j][2 * e + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(w.m[e], mx * sl2);  // sl2 > 0: the max of the scaled scores
    rs[e] = math::softmax_rescale(w.m[e], mn, Exp2Ftz{});
    w.m[e] = mn;
    const float off = math::softmax_offset(mn);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < S::kNTiles; ++j) {
      sc[j][2 * e] = Exp2Ftz{}(fmaf(sc[j][2 * e], sl2, -off));
      sc[j][2 * e + 1] = Exp2Ftz{}(fmaf(sc[j][2 * e + 1], sl2, -off));
      sum += sc[j][2 * e] + sc[j][2 * e + 1];
    }
    w.l[e] = w.l[e] * rs[e] + sum;
  }
}

// P's A fragment of k-step kk (keys 16 kk .. 16 kk + 15) is S's accumulators of column blocks
// 2 kk (A cols 0-7: a[0] row g, a[1] row g + 8) and 2 kk + 1 (A cols 8-15: a[2], a[3]).
template <int KEYS, bool BF16>
__device__ __forceinline__ void pack_p(const Scores<KEYS>& sc, PFrags<KEYS>& pa) {
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
    pa[kk][0] = pack2<BF16>(sc[2 * kk][0], sc[2 * kk][1]);
    pa[kk][1] = pack2<BF16>(sc[2 * kk][2], sc[2 * kk][3]);
    pa[kk][2] = pack2<BF16>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
    pa[kk][3] = pack2<BF16>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
  }
}

// Issues O += P V over a tile (not committed): N = HD (64 or 128).
template <int HD, bool BF16, int KEYS>
__device__ __forceinline__ void issue_pv(RowState<HD>& w, PFrags<KEYS>& pa, uint32_t v_s) {
  wgmma::fence_regs(w.o);
  wgmma::fence_regs(pa);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
    const uint64_t desc = wgmma::desc_mn_major<KEYS>(v_s, kk);
    if constexpr (HD == 128) wgmma::wgmma_m64n128k16_rs<BF16, 1>(w.o, pa[kk], desc, 1);
    else wgmma::wgmma_m64n64k16_rs<BF16, 1>(w.o, pa[kk], desc, 1);
  }
}

// A warpgroup's tile loop is FlashAttention-3's intra-warpgroup pipeline: tile i's S is issued
// just before tile i - 1's P V and waited for first, so tile i's softmax runs while that P V does;
// O is rescaled by a tile's factor just before its own P V is issued. P stays in registers from
// one step to the next (Pipeline::pa). That is also what keeps Q's registers Q's: with P made and
// consumed within one step, ptxas (CUDA 13.0) gave P and the softmax's temporaries the registers
// of Q at head dim 64, so every tile after the first took the previous tile's P for Q
// (tests/tools/check_wgmma_sass.py, a ctest, reads the built machine code for it).
// Branch-free around the wgmmas (a wgmma or a register write feeding one under a branch made
// ptxas serialize them): every tile takes the full path (a tile no row sees gives all-masked
// scores, weight 0, factor 1), and the first step's P V adds a zero P.
template <int HD, int KEYS = kKeys>
struct Pipeline {
  Scores<KEYS> sc = {};
  PFrags<KEYS> pa = {};             // P of the previous tile; its P V is issued in the next step
  float rs_prev[2] = {1.0f, 1.0f};  // O's rescale before that P V
};

template <int HD>
__device__ __forceinline__ void rescale_o(RowState<HD>& w, const float (&rs)[2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int dt = 0; dt < Shape<HD>::kDTiles; ++dt) w.o[dt][2 * e] *= rs[e], w.o[dt][2 * e + 1] *= rs[e];
}

// Where a step's wgmmas are issued: `turn.begin()` just before the first, `turn.end()` right
// after the last is committed. NoTurn: whenever the warpgroup gets there (PingPongTurn,
// prefill_wgmma_ws.cuh: in turns with the other warpgroup).
struct NoTurn {
  __device__ __forceinline__ void begin() const {}
  __device__ __forceinline__ void end() const {}
};

// One step: issue_s(sc) issues tile i's S = Q K^T, the previous tile's V is at v_prev; kpos and
// sum are tile i's prepared positions and summary (sum[3]: a spare word, see below). `after_pv`
// runs once the previous tile's P V completed (its stage may be released).
// ptxas schedules a wgmma wait as early as its dependences allow, and the wait for the previous
// P V has none on the softmax's registers: it went above the softmax, which then ran after that
// P V instead of beside it. A store of the row sums (which need every weight) to sum[3] just
// before the wait is such a dependence (a store stays before a wait that follows it).
template <int HD, bool BF16, int KEYS, class IssueS, class AfterPv, class Turn = NoTurn>
__device__ __forceinline__ void pipelined_step(const PagedAttentionParams& p, RowState<HD>& w, Pipeline<HD, KEYS>& pl,
                                               IssueS issue_s_of, uint32_t v_prev, const int* kpos, int* sum, float sl2,
                                               int t, AfterPv after_pv, Turn turn = {}) {
  const bool full = tile_seen_whole<HD>(p, sum, w);
  rescale_o<HD>(w, pl.rs_prev);
  wgmma::fence_regs(w.o);  // the rescale stays before the S issue (ptxas waited for S otherwise)
  turn.begin();
  issue_s_of(pl.sc);
  wgmma::commit();  // S of tile i
  issue_pv<HD, BF16, KEYS>(w, pl.pa, v_prev);
  wgmma::commit();  // P V of tile i - 1 (a zero P at i = 0)
  turn.end();
  wgmma::wait<1>();  // S of tile i
  wgmma::fence_regs(pl.sc);
  float rs[2];
  softmax_tile<HD, KEYS>(p, w, pl.sc, kpos, full, sl2, t, rs);
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem_addr(sum + 3)), "f"(w.l[0] + w.l[1]) : "memory");
  wgmma::wait<0>();  // the P V of tile i - 1
  wgmma::fence_regs(w.o);
  wgmma::fence_regs(pl.pa);
  after_pv();
  pack_p<KEYS, BF16>(pl.sc, pl.pa);
  pl.rs_prev[0] = rs[0], pl.rs_prev[1] = rs[1];
}

// The step of the kernels with q in registers: tile i's keys in the stage at k_s (V at k_s +
// kTileBytes), its metadata at meta (prepare_tile).
template <int HD, bool BF16, class AfterPv, class Turn = NoTurn>
__device__ __forceinline__ void pipelined_tile(const PagedAttentionParams& p, Rows<HD>& w, Pipeline<HD>& pl, uint32_t k_s,
                                               uint32_t v_prev, int* meta, float sl2, int t, AfterPv after_pv,
                                               Turn turn = {}) {
  pipelined_step<HD, BF16, kKeys>(
      p, w, pl, [&](Scores<kKeys>& sc) { issue_s<HD, BF16>(w, k_s, sc); }, v_prev, meta + kKeys, meta + 3 * kKeys, sl2, t,
      after_pv, turn);
}

// After the last step: the last tile's P V (V at v_prev). Without tiles that P V read a stage
// never filled (0 * NaN is not 0), so O is zeroed.
template <int HD, bool BF16, int KEYS = kKeys>
__device__ __forceinline__ void pipelined_finish(RowState<HD>& w, Pipeline<HD, KEYS>& pl, uint32_t v_prev, bool any_tile) {
  rescale_o<HD>(w, pl.rs_prev);
  issue_pv<HD, BF16, KEYS>(w, pl.pa, v_prev);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_regs(w.o);
  if (!any_tile)
#pragma unroll
    for (int dt = 0; dt < Shape<HD>::kDTiles; ++dt) w.o[dt][0] = w.o[dt][1] = w.o[dt][2] = w.o[dt][3] = 0.0f;
}
#endif

// Normalize (sinks join the denominator) and store this thread's rows g, g + 8 (after every
// wgmma completed). The caller's warp is whole (shuffles).
template <int HD>
__device__ __forceinline__ void store_rows(const PagedAttentionParams& p, const Cta& ct, RowState<HD>& w, int r0, int head,
                                           int g, int t) {
  using S = Shape<HD>;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    w.l[e] += __shfl_xor_sync(0xffffffffu, w.l[e], 1);
    w.l[e] += __shfl_xor_sync(0xffffffffu, w.l[e], 2);
    const int rr = r0 + g + 8 * e;
    if (rr >= ct.n_r) continue;
    float den = w.l[e];
    if (p.maybe_sinks && !math::is_neg_inf(w.m[e])) den += math::exp2_f32(p.maybe_sinks[head] * math::kLog2e - w.m[e]);
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    const int64_t base = int64_t{ct.row + rr} * p.out_row_stride + int64_t{head} * p.out_head_stride;
#pragma unroll
    for (int dt = 0; dt < S::kDTiles; ++dt) {
      const int d = dt * 8 + 2 * t;
      store_q_elem(p.out, base + d, p.out_elem, w.o[dt][2 * e] * inv);
      store_q_elem(p.out, base + d + 1, p.out_elem, w.o[dt][2 * e + 1] * inv);
    }
  }
}

// Every thread copies (a chunk of a K and a V row per step), one CTA barrier a tile: tile i
// lives in stage i % 4; before tile i is read, tile i + 1 landed and was prepared (by warp 0
// during tile i - 1's step) and tile i + 2 is in flight into the stage of tile i - 2, whose
// P V (issued in step i - 1) every warpgroup waited for before the barrier.
template <int HD, bool BF16>
__global__ void __launch_bounds__(kConsumerThreads, 1) prefill_wgmma_kernel(const PagedAttentionParams p, int chunk_heads) {
#if KVCORE_WGMMA_ARCH
  using S = Shape<HD>;
  constexpr int kRowsPerIt = kConsumerThreads / S::kChunks;
  constexpr int kCopyIts = kKeys / kRowsPerIt;  // rows a thread copies per tile
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzle atoms must start 1024-byte aligned (base offset 0 in the descriptors).
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  Cta ct;
  if (!make_cta(p, chunk_heads, ct)) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int hw = warp % kHeads, r0 = 16 * (warp / kHeads);  // this warp's head and first row
  const bool wg_live = r0 < ct.n_r;             // warpgroup-uniform: it has rows
  const bool active = wg_live && hw < ct.n_h;   // warp-uniform: its rows and head exist
  const int head = ct.h0 + (hw < ct.n_h ? hw : 0);
  auto stage_of = [&](int s) { return smem + s * S::kStageBytes; };
  auto meta_of = [&](int s) { return reinterpret_cast<int*>(smem + S::kMetaOffset) + s * S::kMetaInts; };
  // Block ids of the rows this thread copies for tile i, loaded a tile before their copies.
  auto load_blocks = [&](int i, int (&blk)[kCopyIts]) {
#pragma unroll
    for (int it = 0; it < kCopyIts; ++it) blk[it] = i < ct.n_tiles ? block_of(ct, i * kKeys + tid / S::kChunks + it * kRowsPerIt) : -1;
  };
  auto issue = [&](int i, int s, const int (&blk)[kCopyIts]) {
    if (i < ct.n_tiles) {
#pragma unroll
      for (int it = 0; it < kCopyIts; ++it) {
        const int r = tid / S::kChunks + it * kRowsPerIt, c = tid % S::kChunks;
        const int cell = cell_of(ct, blk[it], i * kKeys + r);
        copy_key_chunk<HD>(p, ct, stage_of(s), r, c, cell);
        if (c == 0) copy_key_meta(p, meta_of(s), r, cell);
      }
    }
    cp_async_commit();
  };
  auto prepare = [&](int i) {
    if (warp == 0 && i < ct.n_tiles) prepare_tile<HD>(p, ct, stage_of(i % kStages), meta_of(i % kStages), lane);
  };

  Rows<HD> w;
  init_rows<HD>(p, ct, r0, active, head, g, t, w);
  const float sl2 = p.softmax_scale * math::kLog2e;
  Pipeline<HD> pl;
  int prev = 0;  // stage of the tile whose P is in pl.pa

  int blk[kCopyIts];
  load_blocks(0, blk);
  issue(0, 0, blk);
  load_blocks(1, blk);
  issue(1, 1, blk);
  load_blocks(2, blk);
  cp_async_wait<1>();
  wgmma::fence_proxy_async();
  __syncthreads();
  prepare(0);
  // A warpgroup without rows runs the steps too (its rows see nothing): no branch around the wgmmas.
  for (int i = 0; i < ct.n_tiles; ++i) {
    const int s = i % kStages;
    cp_async_wait<0>();  // this thread's copies of tile i + 1
    wgmma::fence_proxy_async();
    __syncthreads();  // tile i prepared, tile i + 1 landed, stage (i + 2) % 4 free
    prepare(i + 1);
    issue(i + 2, (i + 2) % kStages, blk);
    load_blocks(i + 3, blk);
    const uint32_t k_s = smem_addr(stage_of(s));
    pipelined_tile<HD, BF16>(p, w, pl, k_s, smem_addr(stage_of(prev)) + S::kTileBytes, meta_of(s), sl2, t, [] {});
    prev = s;
  }
  pipelined_finish<HD, BF16>(w, pl, smem_addr(stage_of(prev)) + S::kTileBytes, ct.n_tiles > 0);
  cp_async_wait<0>();
  if (active) store_rows<HD>(p, ct, w, r0, head, g, t);
#else
  (void)p;
  (void)chunk_heads;
  __trap();  // built for sm_90a only; the launcher checks the device
#endif
}

}  // namespace kvcore::ops::cuda::prefill_wgmma
