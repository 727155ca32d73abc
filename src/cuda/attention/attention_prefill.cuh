// Tensor-core causal prefill over 16-bit pages, FlashAttention-2 style: a CTA takes 32 query
// rows of one sequence and up to 4 query heads of one kv head (a warp per head and 16-row
// block); its K/V tiles of 64 keys are copied once into shared memory (cp.async, 3 stages,
// one barrier a tile) and read by all 8 warps.
// The decode kernel (attention_mma.cuh) puts tokens on the mma's M side and serves prefill by
// packing 16 / group rows per CTA, so each CTA re-reads the whole prefix for a few rows: far
// slower than a FlashAttention-style kernel on a prefill chunk.
//
//   S = Q K^T   (A: q rows by ldmatrix, hi + lo halves unless q is exact in the page type;
//                B: K rows by ldmatrix)
//   O += P V    (A: P straight from S's accumulators, hi + lo when the output is f32;
//                B: V rows by ldmatrix.trans)
//
// Masks per key: valid byte, causal by position (k_pos <= q_pos), sliding window. A warp skips
// a tile none of its rows can see and drops the masks of a tile all its rows see whole (most
// tiles of a long prefix), from a per-tile summary of the key positions. Sinks join the
// denominator at the end. These, the row-block grid, block ids loaded a tile ahead and one key
// pass a tile each cut the prefill time (bench/results, prefill rows). The output is
// written directly (no split-K: a prefill call has rows enough to fill the GPU; the launcher
// leaves small calls to the split-K decode kernel).
#pragma once
#include <climits>

#include "cuda/attention/mma_primitives.cuh"
#include "kvcore/math/softmax.hpp"
#include "ops/attention_params.hpp"
#include "ops/prefill_row_blocks.hpp"

namespace kvcore::ops::cuda::prefill_attn {

using namespace mma_attn;  // tiles, copies, ldmatrix, mma, hi/lo splits, Exp2Ftz

constexpr int kHeads = 4;  // query heads per CTA (of one kv head)
constexpr int kKeys = 64;  // keys per tile
// Three stages: tile i is read while tile i + 1 (landed) gets its key summary and tile i + 2
// is in flight, so one barrier a tile suffices (two stages needed three).
constexpr int kStages = 3;

// RB: 16-row blocks per CTA (1 or 2); warp w takes head w % 4 and rows 16 * (w / 4) ..
template <int HD, bool QSPLIT, int RB>
struct Shape {
  static constexpr int kWarps = kHeads * RB;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16 * RB;
  static constexpr int kChunks = HD * 2 / 16;  // 16-byte chunks per K or V row
  static constexpr int kTileBytes = kKeys * HD * 2;
  static constexpr int kMetaOffset = 2 * kTileBytes;  // per key: cell, position, valid word; then the summary
  static constexpr int kSummaryInts = 4;              // smallest / largest live key position, every key live
  static constexpr int kStageBytes = kMetaOffset + (3 * kKeys + kSummaryInts) * 4;
  // After the stages: each warp's q rows as 16-bit hi and lo tiles [16][HD] (A fragments by
  // ldmatrix: held in registers they pushed the kernel past 255 and into spills).
  static constexpr int kQTileBytes = 16 * HD * 2;
  static constexpr int kQTiles = QSPLIT ? 2 : 1;
  static constexpr int kQOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kQOffset + kWarps * kQTiles * kQTileBytes;
  static constexpr int kKSteps = HD / 16;   // k-steps of S over dims
  static constexpr int kDTiles = HD / 8;    // n-tiles of O over dims
  static constexpr int kNTiles = kKeys / 8; // n-tiles of S over keys
  static constexpr int kRowsPerIt = kThreads / kChunks;
  static constexpr int kCopyIts = kKeys / kRowsPerIt;  // rows a thread copies per tile
};

// QSPLIT: q is not exact in the page type (f32, or the other 16-bit type): hi + lo halves.
// PSPLIT: f32 output: P as hi + lo halves (f32 accuracy); else one 16-bit P (2^-12 relative,
// below a 16-bit output's own rounding).
// PASSES: a tile's 64 keys go through S, softmax and PV in 1 pass or 2 of 32 keys (fewer
// registers, shorter dependency chains per pass).
template <int HD, bool BF16, bool QSPLIT, bool PSPLIT, int RB, int PASSES>
__global__ void __launch_bounds__(Shape<HD, QSPLIT, RB>::kThreads, 1)
    prefill_kernel(const PagedAttentionParams p, int chunk_heads) {
  using S = Shape<HD, QSPLIT, RB>;
  constexpr int kRows = S::kRows;
  extern __shared__ __align__(16) unsigned char smem[];
  const PrefillRowBlock rb = prefill_row_block<kRows>(p, static_cast<int>(blockIdx.x));
  if (rb.n_r <= 0) return;
  const int row = rb.row, b = rb.b, n_r = rb.n_r;
  const int chunks = (p.group + chunk_heads - 1) / chunk_heads;
  const int kvh = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int h0 = kvh * p.group + chunk * chunk_heads;
  const int n_h = min(chunk_heads, p.group - chunk * chunk_heads);
  const int hw = warp % kHeads, r0 = 16 * (warp / kHeads);  // this warp's head and first row
  const bool active = hw < n_h && r0 < n_r;
  const int head = h0 + (active ? hw : 0);
  const int bs = p.layout.block_size, n_kv = p.layout.n_kv_heads;
  const int n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, bs);
  const int32_t* blocks = p.indices + p.indptr[b];
  const bool pow2_bs = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  const uint8_t* valid = p.maybe_valid;
  const char* kbase = static_cast<const char*>(p.k);
  const char* vbase = static_cast<const char*>(p.v);
  const int n_tiles = (n_cells + kKeys - 1) / kKeys;

  // Block ids of the rows this thread copies for tile i (-1: past the keys). Loaded a tile before
  // the copies that need them: a load right before its copies stalled every warp for an L2 round
  // trip each tile.
  auto load_blocks = [&](int i, int (&blk)[S::kCopyIts]) {
#pragma unroll
    for (int it = 0; it < S::kCopyIts; ++it) {
      const int j = i * kKeys + tid / S::kChunks + it * S::kRowsPerIt;
      blk[it] = i < n_tiles && j < n_cells ? __ldg(blocks + (pow2_bs ? j >> bs_shift : j / bs)) : -1;
    }
  };
  // Copy tile i (K rows, V rows, per-key cell / position / valid word) into stage s.
  auto issue = [&](int i, int s, const int (&blk)[S::kCopyIts]) {
    if (i < n_tiles) {
      unsigned char* st = smem + s * S::kStageBytes;
      int* meta = reinterpret_cast<int*>(st + S::kMetaOffset);
      const int c = tid % S::kChunks;
#pragma unroll
      for (int it = 0; it < S::kCopyIts; ++it) {
        const int r = tid / S::kChunks + it * S::kRowsPerIt, j = i * kKeys + r;
        const bool in = blk[it] >= 0;
        int cell = -1;
        if (in) cell = blk[it] * bs + (pow2_bs ? (j & (bs - 1)) : j % bs);
        const size_t off = in ? (size_t(cell) * n_kv + kvh) * (HD * 2) + c * 16 : 0;
        cp_async16(smem_addr(st + swz<S::kChunks>(r, c)), kbase + off, in);
        cp_async16(smem_addr(st + S::kTileBytes + swz<S::kChunks>(r, c)), vbase + off, in);
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
  // their range over the warp's rows
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
  // Key at position kp (INT_MAX: no key) seen from position q.
  auto sees = [&](int q, int kp) {
    return kp != INT_MAX && kp <= q && (p.window <= 0 || int64_t{q} - kp < p.window);
  };
  unsigned char* q_hi = smem + S::kQOffset + warp * S::kQTiles * S::kQTileBytes;
  unsigned char* q_lo = q_hi + (QSPLIT ? S::kQTileBytes : 0);
  if (active) {
    for (int i = lane; i < 16 * HD / 8; i += 32) {  // 8 dims (one 16-byte chunk) at a time
      const int rr = i / (HD / 8), c = i % (HD / 8);
      float x[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        x[k] = r0 + rr < n_r ? q_elem_to_f32(p.q, int64_t{row + r0 + rr} * p.q_row_stride + int64_t{head} * p.q_head_stride +
                                                      8 * c + k,
                                                  p.q_elem)
                             : 0.0f;
      uint4 h, l;
      split2<BF16>(x[0], x[1], h.x, l.x);
      split2<BF16>(x[2], x[3], h.y, l.y);
      split2<BF16>(x[4], x[5], h.z, l.z);
      split2<BF16>(x[6], x[7], h.w, l.w);
      *reinterpret_cast<uint4*>(q_hi + swz<S::kChunks>(rr, c)) = h;
      if constexpr (QSPLIT) *reinterpret_cast<uint4*>(q_lo + swz<S::kChunks>(rr, c)) = l;
    }
    __syncwarp();
  }
  const unsigned qh_s = smem_addr(q_hi), ql_s = smem_addr(q_lo);

  float o[S::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < S::kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {math::neg_inf_f32(), math::neg_inf_f32()}, l[2] = {0.0f, 0.0f};
  const float sl2 = p.softmax_scale * math::kLog2e;
  const int mi = lane / 8, mr = lane % 8;

  // Warp 0, once the copies of tile i landed (and a barrier passed): each key's position as rows
  // compare it (stored - offset; INT_MAX for no key or a dead cell, so a mask is one load and
  // two compares an element) and the tile's summary, so a warp can skip the tile or its masks.
  // Dead cells' V bytes may be anything (NaN): their weight is 0, but 0 * NaN is not, so they
  // are zeroed. Nobody reads the tile until the next barrier.
  auto prepare = [&](int i, int s) {
    if (warp != 0 || i >= n_tiles) return;
    unsigned char* st = smem + s * S::kStageBytes;
    int* meta = reinterpret_cast<int*>(st + S::kMetaOffset);
    int* kpos = meta + kKeys;
    int kmin = INT_MAX, kmax = INT_MIN;
    bool all_live = true;
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
      if (cell >= 0 && !live)
        for (int c = 0; c < S::kChunks; ++c)
          *reinterpret_cast<uint4*>(st + S::kTileBytes + swz<S::kChunks>(r, c)) = make_uint4(0, 0, 0, 0);
    }
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

  // Tile i lives in stage i % 3. Before tile i is read: tile i + 1 landed and prepared (during
  // tile i's step), tile i + 2 in flight; one barrier a tile orders all of it.
  int blk[S::kCopyIts];
  load_blocks(0, blk);
  issue(0, 0, blk);
  load_blocks(1, blk);
  issue(1, 1, blk);
  load_blocks(2, blk);
  cp_async_wait<1>();
  __syncthreads();
  prepare(0, 0);
  for (int i = 0, s = 0; i < n_tiles; ++i, s = s + 1 == kStages ? 0 : s + 1) {
    cp_async_wait<0>();  // this thread's copies of tile i + 1
    __syncthreads();     // tile i prepared, tile i + 1 landed, every warp done with tile i - 1
    const int s1 = s + 1 == kStages ? 0 : s + 1, s2 = s1 + 1 == kStages ? 0 : s1 + 1;
    prepare(i + 1, s1);
    issue(i + 2, s2, blk);  // into the stage tile i - 1 used
    load_blocks(i + 3, blk);
    unsigned char* st = smem + s * S::kStageBytes;
    const int* meta = reinterpret_cast<const int*>(st + S::kMetaOffset);
    const int* kpos = meta + kKeys;
    // This warp's rows against the tile (warp-uniform): none sees a key -> skip; every key live
    // and seen by every row -> no masks.
    const int kmin = meta[3 * kKeys], kmax = meta[3 * kKeys + 1];
    const bool none = kmin == INT_MAX || kmin > qmax || (p.window > 0 && int64_t{qmin} - kmax >= p.window);
    const bool full = meta[3 * kKeys + 2] != 0 && kmax <= qmin && (p.window <= 0 || int64_t{qmax} - kmin < p.window);
    if (active && !none) {
      const unsigned k_s = smem_addr(st), v_s = smem_addr(st + S::kTileBytes);
      // PASSES passes of kPassKeys keys: S, softmax and PV of one pass at a time.
      constexpr int kPassKeys = kKeys / PASSES;
#pragma unroll
      for (int half = 0; half < PASSES; ++half) {
        constexpr int kN = S::kNTiles / PASSES;  // n-tiles of 8 keys in a pass
        float sc[kN][4];
#pragma unroll
        for (int j = 0; j < kN; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
        // Fragments of k-step ks + 1 are loaded before the mma of ks (double buffer), so the
        // shared-memory latency hides behind the tensor cores.
        // q: (rows 0-7, dims 0-7), (rows 8-15, dims 0-7), (rows 0-7, dims 8-15), (rows 8-15, dims 8-15)
        // K: (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15)
        uint32_t qa[2][4], qb[2][4], kb[2][kN / 2][4];
        auto load_s = [&](int ks, int buf) {
          const int qoff = swz<S::kChunks>((mi & 1) * 8 + mr, 2 * ks + mi / 2);
          ldsm_x4(qa[buf], qh_s + qoff);
          if constexpr (QSPLIT) ldsm_x4(qb[buf], ql_s + qoff);
#pragma unroll
          for (int jj = 0; jj < kN / 2; ++jj)
            ldsm_x4(kb[buf][jj], k_s + swz<S::kChunks>(half * kPassKeys + jj * 16 + (mi / 2) * 8 + mr, 2 * ks + (mi & 1)));
        };
        load_s(0, 0);
#pragma unroll
        for (int ks = 0; ks < S::kKSteps; ++ks) {
          const int cur = ks & 1;
          if (ks + 1 < S::kKSteps) load_s(ks + 1, cur ^ 1);
#pragma unroll
          for (int jj = 0; jj < kN / 2; ++jj) {
            mma16816<BF16>(sc[2 * jj], qa[cur], kb[cur][jj][0], kb[cur][jj][1]);
            mma16816<BF16>(sc[2 * jj + 1], qa[cur], kb[cur][jj][2], kb[cur][jj][3]);
            if constexpr (QSPLIT) {
              mma16816<BF16>(sc[2 * jj], qb[cur], kb[cur][jj][0], kb[cur][jj][1]);
              mma16816<BF16>(sc[2 * jj + 1], qb[cur], kb[cur][jj][2], kb[cur][jj][3]);
            }
          }
        }
        // masks and scale; x: row g + 8 * (x >> 1), key half * kPassKeys + 8j + 2t + (x & 1)
        if (full) {
#pragma unroll
          for (int j = 0; j < kN; ++j)
#pragma unroll
            for (int x = 0; x < 4; ++x) sc[j][x] *= sl2;
        } else {
#pragma unroll
          for (int j = 0; j < kN; ++j)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
              const int r = half * kPassKeys + 8 * j + 2 * t + (x & 1);
              sc[j][x] = sees(qp[x >> 1], kpos[r]) ? sc[j][x] * sl2 : math::neg_inf_f32();
            }
        }
        // online softmax per row (the 4 lanes of a row hold its keys)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float mx = math::neg_inf_f32();
#pragma unroll
          for (int j = 0; j < kN; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * e], sc[j][2 * e + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float mn = fmaxf(m[e], mx);
          const float rs = math::softmax_rescale(m[e], mn, Exp2Ftz{});
          m[e] = mn;
          float sum = 0.0f;
#pragma unroll
          for (int j = 0; j < kN; ++j) {
            sc[j][2 * e] = math::softmax_weight(sc[j][2 * e], mn, Exp2Ftz{});
            sc[j][2 * e + 1] = math::softmax_weight(sc[j][2 * e + 1], mn, Exp2Ftz{});
            sum += sc[j][2 * e] + sc[j][2 * e + 1];
          }
          l[e] = l[e] * rs + sum;
          if (rs != 1.0f)
#pragma unroll
            for (int dt = 0; dt < S::kDTiles; ++dt) o[dt][2 * e] *= rs, o[dt][2 * e + 1] *= rs;
        }
        // O += P V: P's A fragment for 16 keys is S's accumulators of two n-tiles
#pragma unroll
        for (int kk = 0; kk < kN / 2; ++kk) {
          uint32_t ph[4], pl[4];
          split2<BF16>(sc[2 * kk][0], sc[2 * kk][1], ph[0], pl[0]);
          split2<BF16>(sc[2 * kk][2], sc[2 * kk][3], ph[1], pl[1]);
          split2<BF16>(sc[2 * kk + 1][0], sc[2 * kk + 1][1], ph[2], pl[2]);
          split2<BF16>(sc[2 * kk + 1][2], sc[2 * kk + 1][3], ph[3], pl[3]);
          // V: (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 8-15);
          // the next 16 dims' fragments load before this 16's mma
          uint32_t vb[2][4];
          auto load_v = [&](int dp, int buf) {
            ldsm_x4_t(vb[buf], v_s + swz<S::kChunks>(half * kPassKeys + kk * 16 + (mi & 1) * 8 + mr, 2 * dp + mi / 2));
          };
          load_v(0, 0);
#pragma unroll
          for (int dp = 0; dp < S::kDTiles / 2; ++dp) {
            const int cur = dp & 1;
            if (dp + 1 < S::kDTiles / 2) load_v(dp + 1, cur ^ 1);
            mma16816<BF16>(o[2 * dp], ph, vb[cur][0], vb[cur][1]);
            mma16816<BF16>(o[2 * dp + 1], ph, vb[cur][2], vb[cur][3]);
            if constexpr (PSPLIT) {
              mma16816<BF16>(o[2 * dp], pl, vb[cur][0], vb[cur][1]);
              mma16816<BF16>(o[2 * dp + 1], pl, vb[cur][2], vb[cur][3]);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  if (!active) return;
  // ---- normalize (sinks join the denominator) and store rows g, g + 8
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
}

}  // namespace kvcore::ops::cuda::prefill_attn
