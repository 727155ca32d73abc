// The SIMD kernel of one CPU paged-attention task (attention_tasks.hpp), written
// once with Highway and compiled for every target of simd_config.hpp.
//
// A task covers query rows of one sequence (decode: one; prefill: a block of rows
// whose query vectors sit side by side as one larger group, so each K/V tile read
// serves them all), a range of kv heads and one split of the cells.
// Per tile of kTile cells: the visible cells are listed once (block table, masks);
// then per kv head, the score pass takes kKeys K rows at a time and walks the head
// dims in vectors: each vector of each row is decoded to f32 once and multiplied
// into every query head of the group, whose query vectors are loaded once for the
// kKeys rows; each (row, head) keeps a vector accumulator, reduced across lanes once
// at the end, four sums at a time. Rope on read decodes and rotates the tile's K
// rows into an f32 buffer first (cos/sin once per cell for every head). The tile's
// scores get one rescale and exp2 per query head (vectors over cells); then the
// value pass walks the head dims in columns of kCols vectors and, per column, every
// visible V row, so the group's accumulators stay in registers while the rows
// stream by. The next tile's rows are prefetched into L2. E4M3 tiles under many query
// vectors (MLA) are decoded to f32 once a tile instead (kDecodeOnceHeads). Shapes: K and V
// head dims that are multiples of 8 (a column is a full vector, or 8 lanes at the end),
// equal or not (MLA: K 576, V 512), V rows at their own stride: a pool of their own or a
// view of K's rows (their first v_head_dim dims and K's first v_head_dim / 64 scales).
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <algorithm>
#include <vector>

#include "cpu/attention_tasks.hpp"
#include "cpu/simd_kv-inl.h"
#include "cpu/simd_rope-inl.h"
#include "kvcore/math/softmax.hpp"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DTail = hn::CappedTag<float, 8>;  // the last 8 dims when a full vector holds 16

constexpr int32_t kTile = 32;  // cells per tile (a multiple of every target's lane count and of kKeys)
constexpr int32_t kHeads = 4;  // query heads per register block
// Register blocking: K rows per score block and vectors per value column. Targets
// with 32 vector registers hold 4 rows x 4 heads of score accumulators (plus 4 query
// vectors) and 4 heads x 4 vectors of value accumulators; the others half of each.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kKeys = 4;
constexpr int kCols = 4;
#else
constexpr int kKeys = 2;
constexpr int kCols = 2;
#endif

// A K or V row of one (cell, kv head): its bytes and its e4m3 scales.
struct KvRow {
  const uint8_t* data;
  const uint8_t* scale_u8;  // Ue8m0Per64: one byte per 64 dims
  float scale_f32;          // F32PerRow (else 1)
};

struct Task {
  const PagedAttentionParams& p;
  int32_t D, DV, G;  // K (and q) head dim, V head dim, group size
  int32_t Dp, DVp;   // D and DV padded to two vectors: the q and acc strides
  float* q;          // [G][Dp] scaled queries, zero padded
  float* acc;        // [G][DVp]
  float* s;          // [G][kTile] scores, then weights, of the tile's visible cells in order (-inf past them)
};

// What the tile's kv heads share: the visible cells and, per kv head in turn, their rows.
struct Tile {
  int32_t n_vis;
  int64_t cells[kTile];  // the visible cells, in order
  KvRow krows[kTile];    // K rows of the current kv head (padded to a multiple of kKeys)
  KvRow vrows[kTile];    // V rows of the current kv head
  bool f32_rows;         // K and V rows decoded to f32 once a tile (decode_once_heads)
  float* kbuf;           // rope on read or f32_rows: [kTile][Dp] the K rows as f32 (rotated)
  float* vbuf;           // f32_rows: [kTile][DVp] the V rows as f32
  float* freq;           // rope on read: [padded pairs] frequencies, zero padded
  float* cs;             // rope on read: [kTile][padded pairs] cos and sin at each visible key's position
  float* sn;
  int32_t pairs_p;
  int32_t n_next;
  int64_t next_cells[kTile];  // the next tile's cells (visible or not), for prefetching
};

template <math::KvElem E>
HWY_INLINE float ChunkScale(const KvRow& row, int32_t d) {
  if constexpr (E != math::KvElem::E4M3) {
    return 1.0f;
  } else {
    return row.scale_u8 ? math::ue8m0_decode(row.scale_u8[d / 64]) : row.scale_f32;
  }
}

// An e4m3 row's values at dims [off, off + Lanes(d)), 2^-8 times the e4m3 values.
template <bool kFinite, class D>
HWY_INLINE hn::Vec<D> LoadOver256(D d, const KvRow& row, int32_t off) {
  if constexpr (kFinite) return LoadE4m3Over256Finite(d, row.data, off);
  else return LoadE4m3Over256(d, row.data, off);
}

// The row's values at dims [off, off + Lanes(d)) times their scale. E4M3 multiplies the
// widened byte by 256 * scale at once: the same value as the scalar path's
// (value * 256) * scale unless 256 * scale overflows (scales of 2^120 and more).
// kFinite: the row holds no e4m3 NaN code (E4m3RowHasNan), which a shorter decode needs.
template <math::KvElem E, bool kFinite = false, class D>
HWY_INLINE hn::Vec<D> LoadScaled(D d, const KvRow& row, int32_t off) {
  if constexpr (E != math::KvElem::E4M3) return LoadKv<E>(d, row.data, off);
  else return hn::Mul(LoadOver256<kFinite>(d, row, off), hn::Set(d, 256.0f * ChunkScale<E>(row, off)));
}

// Scores of K rows rows[0 .. kK) against query heads g0 .. g0 + kG, into
// s[g][j0 + k]: each vector of dims of each row is decoded once and multiplied into
// every head; the heads' query vectors are loaded once for all kK rows.
template <math::KvElem E, bool kFinite, int kK, int kG>
HWY_INLINE void DotsKeys(const Task& t, const KvRow* rows, int32_t g0, int32_t j0) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  hn::Vec<DF> a[kK][kG];
  for (int k = 0; k < kK; ++k)
    for (int g = 0; g < kG; ++g) a[k][g] = hn::Zero(df);
  // E4M3: each row's scale times 2^8, once per chunk of 64 dims (UE8M0) or per row.
  hn::Vec<DF> sc[kK];
  const bool per_chunk = E == math::KvElem::E4M3 && rows[0].scale_u8 != nullptr;
  const auto scales_at = [&](int32_t d) {
    for (int k = 0; k < kK; ++k) sc[k] = hn::Set(df, 256.0f * ChunkScale<E>(rows[k], d));
  };
  if constexpr (E == math::KvElem::E4M3) scales_at(0);
  int32_t d = 0;
  for (; d + N <= t.D; d += N) {
    if (per_chunk && d > 0 && d % 64 == 0) scales_at(d);
    hn::Vec<DF> q[kG];
    for (int g = 0; g < kG; ++g) q[g] = hn::LoadU(df, t.q + (g0 + g) * t.Dp + d);
    for (int k = 0; k < kK; ++k) {
      hn::Vec<DF> kv;
      if constexpr (E == math::KvElem::E4M3) kv = hn::Mul(LoadOver256<kFinite>(df, rows[k], d), sc[k]);
      else kv = LoadKv<E>(df, rows[k].data, d);
      for (int g = 0; g < kG; ++g) a[k][g] = hn::MulAdd(q[g], kv, a[k][g]);
    }
  }
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(df) >= 16) {
    if (d < t.D) {  // the last 8 dims of a 16-lane vector; q is zero padded past D
      const hn::Half<DF> dh;
      hn::Vec<DF> q[kG];
      for (int g = 0; g < kG; ++g) q[g] = hn::LoadU(df, t.q + (g0 + g) * t.Dp + d);
      for (int k = 0; k < kK; ++k) {
        const auto kv = hn::ZeroExtendVector(df, LoadScaled<E, kFinite>(dh, rows[k], d));
        for (int g = 0; g < kG; ++g) a[k][g] = hn::MulAdd(q[g], kv, a[k][g]);
      }
    }
  }
#endif
  for (int g = 0; g < kG; ++g) {
    float* out = t.s + (g0 + g) * kTile + j0;
    if constexpr (kK == 4) {
      SumOfLanes4(df, a[0][g], a[1][g], a[2][g], a[3][g], out);
    } else {
      for (int k = 0; k < kK; ++k) out[k] = hn::GetLane(hn::SumOfLanes(df, a[k][g]));
    }
  }
}

// One cache line toward L2 (a tile ahead is more than L1 holds). An asm statement on
// x86: GCC deletes loops whose only effect is __builtin_prefetch (it assumes such
// loops finish without effects).
HWY_INLINE void PrefetchLine(const uint8_t* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*p));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// The next tile's K and V bytes of the task's kv heads (a contiguous run per cell and
// pool), asked for in address order a few lines at a time while the current tile is
// computed: spread over the work, since a burst of requests fills the core's miss
// queues and stalls it, and in order, so that the L2 stream prefetcher follows on.
// A line of K and one of V at a time, over the longer of the two runs (the shorter's extra
// lines belong to its next row: a few wasted requests, but no branch in the hot loops that
// ask). V rows inside K's (MLA's latent: a view of K's rows) ask for K's lines twice.
struct NextRows {
  const uint8_t* k;  // K and V pools at the first kv head's row of cell 0
  const uint8_t* v;
  const int64_t* cells;  // the next tile's cells
  int64_t k_cell_bytes, v_cell_bytes;  // n_kv_heads rows
  int64_t run_lines;     // 64-byte lines per cell: the longer of K's and V's runs
  int64_t total;         // lines in all: cells x run_lines
  int64_t cursor = 0;
  int64_t cell_i = 0, line_i = 0;  // the cursor's cell and line in its run

  // Runs of lines inside one cell: one base address each, then a line a prefetch
  // (the address arithmetic per line was a third as many instructions as the FMAs).
  HWY_INLINE void ask(int64_t lines) {
    int64_t left = std::min(lines, total - cursor);
    cursor += left;
    while (left > 0) {
      const int64_t n = std::min(left, run_lines - line_i);
      const uint8_t* kp = k + cells[cell_i] * k_cell_bytes + line_i * 64;
      const uint8_t* vp = v + cells[cell_i] * v_cell_bytes + line_i * 64;
      for (int64_t i = 0; i < n; ++i) {
        PrefetchLine(kp + i * 64);
        PrefetchLine(vp + i * 64);
      }
      left -= n;
      line_i += n;
      if (line_i == run_lines) line_i = 0, ++cell_i;
    }
  }
};

// The prefetch runs of cells `cells[0 .. n)` for kv heads [h0, h0 + H): K's H rows side by
// side; V's from the first head's row to the end of the last one's (V rows of their own
// pool are as contiguous; a strided view inside K's rows is K's run).
template <math::KvElem E>
NextRows CellRuns(const PagedAttentionParams& p, int32_t h0, int32_t H, const int64_t* cells, int32_t n) {
  constexpr int64_t kBytes = E == math::KvElem::F32 ? 4 : E == math::KvElem::E4M3 ? 1 : 2;
  const int64_t nkv = p.layout.n_kv_heads, k_row = int64_t{p.layout.head_dim} * kBytes, v_row = p.v_row_stride * kBytes;
  NextRows r{};
  r.k = static_cast<const uint8_t*>(p.k) + h0 * k_row;
  r.v = static_cast<const uint8_t*>(p.v) + h0 * v_row;
  r.cells = cells;
  r.k_cell_bytes = nkv * k_row;
  r.v_cell_bytes = nkv * v_row;
  const int64_t k_lines = (H * k_row + 63) / 64;
  const int64_t v_lines = ((H - 1) * v_row + int64_t{p.v_head_dim} * kBytes + 63) / 64;
  r.run_lines = std::max(k_lines, v_lines);
  r.total = n * r.run_lines;
  return r;
}

// Scores of the tile's visible cells for every head of the task's group, kKeys
// rows at a time (tile.krows is padded to a multiple of kKeys).
template <math::KvElem E, bool kFinite>
void ScoresAll(const Task& t, const Tile& tile, NextRows& next, int64_t lines_per_block) {
  for (int32_t j0 = 0; j0 < tile.n_vis; j0 += kKeys) {
    next.ask(lines_per_block);
    for (int32_t g0 = 0; g0 < t.G; g0 += kHeads) {
      switch (std::min(kHeads, t.G - g0)) {
        case 1: DotsKeys<E, kFinite, kKeys, 1>(t, tile.krows + j0, g0, j0); break;
        case 2: DotsKeys<E, kFinite, kKeys, 2>(t, tile.krows + j0, g0, j0); break;
        case 3: DotsKeys<E, kFinite, kKeys, 3>(t, tile.krows + j0, g0, j0); break;
        default: DotsKeys<E, kFinite, kKeys, 4>(t, tile.krows + j0, g0, j0); break;
      }
    }
  }
  for (int32_t g = 0; g < t.G; ++g)
    for (int32_t j = tile.n_vis; j < kTile; ++j) t.s[g * kTile + j] = math::neg_inf_f32();
}

// acc[g][d .. d + kU * Lanes) += sum over the visible cells j of s[g][j] * V_j, heads g0 .. g0 + kG.
// An e4m3 column lies inside one scale chunk of 64 dims (widths and offsets are powers
// of two up to 64), so the chunk's scale (times 2^8) goes into the weights: a power of
// two, exact either way.
template <math::KvElem E, bool kFinite, int kG, int kU, class D>
HWY_INLINE void ValueColumns(D dv, const Task& t, const KvRow* vrows, int32_t g0, int32_t n_vis, int32_t d, NextRows& next,
                             int64_t lines_per_block) {
  const int32_t N = static_cast<int32_t>(hn::Lanes(dv));
  hn::Vec<D> a[kG][kU];
  for (int g = 0; g < kG; ++g)
    for (int u = 0; u < kU; ++u) a[g][u] = hn::LoadU(dv, t.acc + (g0 + g) * t.DVp + d + u * N);
  for (int32_t j = 0; j < n_vis; ++j) {
    if (j % kKeys == 0) next.ask(lines_per_block);
    hn::Vec<D> v[kU];
    float scale = 1.0f;
    if constexpr (E == math::KvElem::E4M3) {
      for (int u = 0; u < kU; ++u) v[u] = LoadOver256<kFinite>(dv, vrows[j], d + u * N);
      scale = 256.0f * ChunkScale<E>(vrows[j], d);
    } else {
      for (int u = 0; u < kU; ++u) v[u] = LoadScaled<E>(dv, vrows[j], d + u * N);
    }
    for (int g = 0; g < kG; ++g) {
      const float w = t.s[(g0 + g) * kTile + j];
      const auto wg = hn::Set(dv, E == math::KvElem::E4M3 ? w * scale : w);
      for (int u = 0; u < kU; ++u) a[g][u] = hn::MulAdd(wg, v[u], a[g][u]);
    }
  }
  for (int g = 0; g < kG; ++g)
    for (int u = 0; u < kU; ++u) hn::StoreU(a[g][u], dv, t.acc + (g0 + g) * t.DVp + d + u * N);
}

template <math::KvElem E, bool kFinite, int kG>
void ValuePass(const Task& t, const KvRow* vrows, int32_t g0, int32_t n_vis, NextRows& next, int64_t lines_per_block) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  for (; d + kCols * N <= t.DV; d += kCols * N) ValueColumns<E, kFinite, kG, kCols>(df, t, vrows, g0, n_vis, d, next, lines_per_block);
  for (; d + N <= t.DV; d += N) ValueColumns<E, kFinite, kG, 1>(df, t, vrows, g0, n_vis, d, next, lines_per_block);
  if (d < t.DV) ValueColumns<E, kFinite, kG, 1>(DTail(), t, vrows, g0, n_vis, d, next, lines_per_block);
}

template <math::KvElem E, bool kFinite>
void ValuePassAll(const Task& t, const KvRow* vrows, int32_t n_vis, NextRows& next, int64_t lines_per_block) {
  for (int32_t g0 = 0; g0 < t.G; g0 += kHeads) {
    switch (std::min(kHeads, t.G - g0)) {
      case 1: ValuePass<E, kFinite, 1>(t, vrows, g0, n_vis, next, lines_per_block); break;
      case 2: ValuePass<E, kFinite, 2>(t, vrows, g0, n_vis, next, lines_per_block); break;
      case 3: ValuePass<E, kFinite, 3>(t, vrows, g0, n_vis, next, lines_per_block); break;
      default: ValuePass<E, kFinite, 4>(t, vrows, g0, n_vis, next, lines_per_block); break;
    }
  }
}

// Per head: the tile's max, the rescale of its accumulator, scores -> weights
// (masked cells weigh 0) and the running sum.
void SoftmaxTile(const Task& t, math::OnlineSoftmax* sm) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  for (int32_t g = 0; g < t.G; ++g) {
    float* sg = t.s + g * kTile;
    auto mx = hn::Set(df, math::neg_inf_f32());
    for (int32_t i = 0; i < kTile; i += N) mx = hn::Max(mx, hn::LoadU(df, sg + i));
    const float rescale = sm[g].begin_tile(hn::GetLane(hn::MaxOfLanes(df, mx)));
    if (rescale != 1.0f) {
      float* ag = t.acc + g * t.DVp;
      const auto r = hn::Set(df, rescale);
      for (int32_t d = 0; d < t.DVp; d += N) hn::StoreU(hn::Mul(hn::LoadU(df, ag + d), r), df, ag + d);
    }
    const auto m = hn::Set(df, sm[g].m);
    auto sum = hn::Zero(df);
    for (int32_t i = 0; i < kTile; i += N) {
      const auto wi = Exp2NonPositive(df, hn::Sub(hn::LoadU(df, sg + i), m));
      sum = hn::Add(sum, wi);
      hn::StoreU(wi, df, sg + i);
    }
    sm[g].add(hn::GetLane(hn::SumOfLanes(df, sum)));
  }
}

// Asks for the K and V rows of cells [j0, j1) of sequence b, kv heads [h0, h1), ahead of
// their use: blocks sit anywhere, which the hardware prefetchers cannot follow.
template <math::KvElem E>
void PrefetchCells(const PagedAttentionParams& p, int32_t b, int32_t h0, int32_t h1, int32_t j0, int32_t j1) {
  const int32_t bs = p.layout.block_size;
  int64_t cells[kTile];
  const int32_t n = std::min(j1 - j0, kTile);
  for (int32_t i = 0; i < n; ++i) cells[i] = p.layout.cell(p.indices[p.indptr[b] + (j0 + i) / bs], (j0 + i) % bs);
  NextRows rows = CellRuns<E>(p, h0, h1 - h0, cells, n);
  rows.ask(rows.total);
}

struct Scratch {
  std::vector<float> f;
  std::vector<math::OnlineSoftmax> sm;
  std::vector<Task> tasks;
  std::vector<int32_t> q_pos;  // the rows' query positions plus the sequence's position offset
  Tile tile;
};

// Lists the visible cells of cells [t0, t0 + n) of sequence b for a query at q_pos.
void ListVisible(const PagedAttentionParams& p, int32_t b, int32_t t0, int32_t n, int32_t q_pos, Tile& tile) {
  const int32_t bs = p.layout.block_size;
  tile.n_vis = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t j = t0 + i;
    const int64_t cell = p.layout.cell(p.indices[p.indptr[b] + j / bs], j % bs);
    if (attention_cell_visible(p, cell, q_pos)) tile.cells[tile.n_vis++] = cell;
  }
}

// Query vectors from which a task decodes its tile's K and V rows to f32 once (tile.kbuf,
// tile.vbuf) rather than in every register block of heads: each row serves
// G / kHeads blocks, and with many heads (MLA: 128 over one kv head) the repeated decode
// of 16- and 8-bit rows takes issue slots the FMAs need. The f32 rows of a tile stay in L2.
constexpr int32_t kDecodeOnceHeads = 16;

// A row's dims [0, D) as f32 (times its scale) into dst.
template <math::KvElem E>
HWY_INLINE void DecodeRow(const KvRow& row, int32_t D, float* dst) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  for (; d + N <= D; d += N) hn::StoreU(LoadScaled<E>(df, row, d), df, dst + d);
  if (d < D) hn::StoreU(LoadScaled<E>(DTail(), row, d), DTail(), dst + d);
}

HWY_INLINE void PointAtF32(KvRow& row, const float* data) {
  row.data = reinterpret_cast<const uint8_t*>(data);
  row.scale_u8 = nullptr;
  row.scale_f32 = 1.0f;
}

// The K and V rows of the tile's visible cells for kv head kvh, padded to a multiple of
// kKeys with the first row (their scores are overwritten with -inf). With rope on read
// the K rows are decoded and rotated into tile.kbuf (cos/sin of tile.cs / tile.sn); with
// tile.f32_rows the K and V rows are decoded into tile.kbuf and tile.vbuf.
template <math::KvElem E>
void TileRows(const PagedAttentionParams& p, const Task& t, int32_t kvh, Tile& tile) {
  const int32_t n = tile.n_vis;
  // Field by field: whole KvRow values built on the stack cost a store-forwarding stall each.
  constexpr int64_t kBytes = E == math::KvElem::F32 ? 4 : E == math::KvElem::E4M3 ? 1 : 2;
  const int64_t nkv = p.layout.n_kv_heads, k_row = int64_t{t.D} * kBytes, v_row = p.v_row_stride * kBytes;
  const auto* kb = static_cast<const uint8_t*>(p.k) + kvh * k_row;
  const auto* vb = static_cast<const uint8_t*>(p.v) + kvh * v_row;
  for (int32_t j = 0; j < n; ++j) {
    tile.krows[j].data = kb + tile.cells[j] * nkv * k_row;
    tile.vrows[j].data = vb + tile.cells[j] * nkv * v_row;
  }
  if (p.scale_mode == math::KvScaleMode::Ue8m0Per64) {
    const int64_t k_chunks = t.D / 64, v_chunks = p.v_scale_row_stride;
    for (int32_t j = 0; j < n; ++j) {
      const int64_t row = tile.cells[j] * nkv + kvh;
      tile.krows[j].scale_u8 = p.maybe_k_scale_u8 + row * k_chunks;
      tile.vrows[j].scale_u8 = p.maybe_v_scale_u8 + row * v_chunks;
      tile.krows[j].scale_f32 = tile.vrows[j].scale_f32 = 1.0f;
    }
  } else if (p.scale_mode == math::KvScaleMode::F32PerRow) {
    for (int32_t j = 0; j < n; ++j) {
      const int64_t row = tile.cells[j] * nkv + kvh;
      tile.krows[j].scale_u8 = tile.vrows[j].scale_u8 = nullptr;
      tile.krows[j].scale_f32 = p.maybe_k_scale_f32[row];
      tile.vrows[j].scale_f32 = p.maybe_v_scale_f32[row];
    }
  } else {
    for (int32_t j = 0; j < n; ++j) {
      tile.krows[j].scale_u8 = tile.vrows[j].scale_u8 = nullptr;
      tile.krows[j].scale_f32 = tile.vrows[j].scale_f32 = 1.0f;
    }
  }
  if (p.rope_on_read || tile.f32_rows) {
    for (int32_t j = 0; j < n; ++j) {
      float* row = tile.kbuf + j * t.Dp;
      DecodeRow<E>(tile.krows[j], t.D, row);
      if (p.rope_on_read) RotatePairs(p.rope.layout, row, row, tile.cs + j * tile.pairs_p, tile.sn + j * tile.pairs_p);
      PointAtF32(tile.krows[j], row);
    }
  }
  if (tile.f32_rows) {
    for (int32_t j = 0; j < n; ++j) {
      float* row = tile.vbuf + j * t.DVp;
      DecodeRow<E>(tile.vrows[j], t.DV, row);
      PointAtF32(tile.vrows[j], row);
    }
  }
  for (int32_t j = n; j % kKeys != 0; ++j) tile.krows[j] = tile.krows[0];
}

// Whether a K or V row of the tile's current kv head holds an e4m3 NaN code. (With rope
// on read the K rows are f32 by now; their e4m3 decode already took the NaN-aware path.)
bool TileHasNan(const Tile& tile, int32_t D, int32_t DV, bool k_is_f32) {
  for (int32_t j = 0; j < tile.n_vis; ++j)
    if ((!k_is_f32 && E4m3RowHasNan(tile.krows[j].data, D)) || E4m3RowHasNan(tile.vrows[j].data, DV)) return true;
  return false;
}

// Lists the cells of [t0, t0 + n) of sequence b that any of the rows' queries (at
// q_pos[0 .. R)) sees; returns whether every listed cell is visible to all of them
// (then the rows can share the tile's scores and values pass).
bool ListVisibleRows(const PagedAttentionParams& p, int32_t b, int32_t t0, int32_t n, const int32_t* q_pos, int32_t R,
                     Tile& tile) {
  const int32_t bs = p.layout.block_size;
  bool uniform = true;
  tile.n_vis = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t j = t0 + i;
    const int64_t cell = p.layout.cell(p.indices[p.indptr[b] + j / bs], j % bs);
    int32_t seen = 0;
    for (int32_t r = 0; r < R; ++r) seen += attention_cell_visible(p, cell, q_pos[r]) ? 1 : 0;
    if (seen > 0) tile.cells[tile.n_vis++] = cell;
    uniform = uniform && (seen == 0 || seen == R);
  }
  return uniform;
}

// The listed cells of a tile for kv heads h0 .. h0 + H: per kv head kh, the scores,
// softmax step and values of tasks[kh]'s query vectors (softmax states sm + kh * sm_stride).
template <math::KvElem E>
void RunTile(const PagedAttentionParams& p, int32_t b, int32_t h0, int32_t H, const Task* tasks, math::OnlineSoftmax* sm,
             int32_t sm_stride, Tile& tile, NextRows& next) {
  if (tile.n_vis == 0) return;
  // The next tile's lines, spread evenly over the points that ask for them: every kKeys
  // rows of the score pass and of each value column pass (bursts of prefetches stall
  // on the miss queue, the more so while another core streams from memory too).
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df)), DV = tasks[0].DV;
  const int64_t columns = DV / (kCols * N) + DV % (kCols * N) / N + (DV % N != 0 ? 1 : 0);
  const int64_t passes = 1 + (tasks[0].G + kHeads - 1) / kHeads * columns;
  const int64_t blocks = int64_t{H} * ((tile.n_vis + kKeys - 1) / kKeys) * passes;
  const int64_t lines_per_block = (next.total + blocks - 1) / blocks;
  if (p.rope_on_read) {  // math::rope_rotate_row's cos and sin, once per cell for every head
    const int32_t n_pairs = p.rope.layout.n_pairs();
    for (int32_t j = 0; j < tile.n_vis; ++j)
      RopeCosSinRow(tile.freq, n_pairs, static_cast<float>(attention_key_position(p, tile.cells[j], b)),
                    p.rope.attention_factor, tile.cs + j * tile.pairs_p, tile.sn + j * tile.pairs_p);
  }
  for (int32_t kh = 0; kh < H; ++kh) {
    const Task& t = tasks[kh];
    TileRows<E>(p, t, h0 + kh, tile);
    if (tile.f32_rows) {  // decoded NaN-aware already
      ScoresAll<math::KvElem::F32, false>(t, tile, next, lines_per_block);
      SoftmaxTile(t, sm + kh * sm_stride);
      ValuePassAll<math::KvElem::F32, false>(t, tile.vrows, tile.n_vis, next, lines_per_block);
      continue;
    }
    // E4M3 rows without NaN codes (all of them but corrupted or hand-made ones) take the shorter decode.
    const bool finite = E == math::KvElem::E4M3 && !TileHasNan(tile, t.D, t.DV, p.rope_on_read);
    if (p.rope_on_read) ScoresAll<math::KvElem::F32, false>(t, tile, next, lines_per_block);
    else if (finite) ScoresAll<E, true>(t, tile, next, lines_per_block);
    else ScoresAll<E, false>(t, tile, next, lines_per_block);
    SoftmaxTile(t, sm + kh * sm_stride);
    if (finite) ValuePassAll<E, true>(t, tile.vrows, tile.n_vis, next, lines_per_block);
    else ValuePassAll<E, false>(t, tile.vrows, tile.n_vis, next, lines_per_block);
  }
}

// Rows [r0, r1) of one sequence (decode: one row), kv heads [h0, h1), split `split`.
// Per kv head the task's query vectors are the rows' groups side by side (row i's head g
// at i * G + g), so every K and V row a tile reads serves all rows at once. Per tile, the
// cells any row sees are listed once; where every listed cell is visible to every row
// (the prefix before a causal diagonal or window edge) the rows share the scores and
// values pass; otherwise each row takes the tile alone with its own list, so a masked
// cell never enters a row's sums (0 times a NaN or infinite V would).
template <math::KvElem E>
void RunTask(const PagedAttentionParams& p, int32_t r0, int32_t r1, int32_t h0, int32_t h1, int32_t split) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  const int32_t D = p.layout.head_dim, DV = p.v_head_dim, G = p.group, H = h1 - h0, bs = p.layout.block_size, R = r1 - r0,
                GR = G * R;
  const int32_t Dp = (D + 2 * N - 1) / (2 * N) * (2 * N), DVp = (DV + 2 * N - 1) / (2 * N) * (2 * N);
  const int32_t n_pairs = p.rope_on_read ? p.rope.layout.n_pairs() : 0;
  const int32_t pairs_p = (n_pairs + 15) / 16 * 16;
  const int64_t per_head = GR * (Dp + DVp + kTile);  // q, acc, s
  const bool f32_rows = E == math::KvElem::E4M3 && GR >= kDecodeOnceHeads;
  const int64_t row_floats = (p.rope_on_read || f32_rows ? kTile * Dp : 0) + (f32_rows ? kTile * DVp : 0);
  const int64_t rope_floats = p.rope_on_read ? pairs_p + 2 * kTile * pairs_p : 0;
  thread_local Scratch scratch;
  scratch.f.assign(static_cast<size_t>(H * per_head + row_floats + rope_floats), 0.0f);
  scratch.sm.assign(static_cast<size_t>(H) * GR, math::OnlineSoftmax{});
  scratch.tasks.clear();
  for (int32_t h = 0; h < H; ++h) {  // tasks[0, H): all rows; then H per row: row i's slice
    float* f = scratch.f.data() + h * per_head;
    scratch.tasks.push_back(Task{p, D, DV, GR, Dp, DVp, f, f + GR * Dp, f + GR * (Dp + DVp)});
  }
  for (int32_t i = 0; i < R && R > 1; ++i)
    for (int32_t h = 0; h < H; ++h) {
      const Task& all = scratch.tasks[h];
      scratch.tasks.push_back(Task{p, D, DV, G, Dp, DVp, all.q + i * G * Dp, all.acc + i * G * DVp, all.s + i * G * kTile});
    }
  Tile& tile = scratch.tile;
  tile.f32_rows = f32_rows;
  tile.kbuf = scratch.f.data() + H * per_head;
  tile.vbuf = tile.kbuf + (p.rope_on_read || f32_rows ? kTile * Dp : 0);
  float* rope = scratch.f.data() + H * per_head + row_floats;
  tile.freq = rope;
  tile.cs = tile.freq + pairs_p;
  tile.sn = tile.cs + kTile * pairs_p;
  tile.pairs_p = pairs_p;
  for (int32_t i = 0; i < n_pairs; ++i) tile.freq[i] = p.rope.freq[i];
  const Task* tasks = scratch.tasks.data();

  const int32_t b = attention_row_seq(p, r0);
  const int32_t n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, p.layout.block_size);
  const CellRange range = attention_split_range(n_cells, split, p.num_splits);
  const int32_t pos_off = p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[b] : 0;
  scratch.q_pos.resize(static_cast<size_t>(R));
  for (int32_t i = 0; i < R; ++i) scratch.q_pos[i] = (p.maybe_q_positions ? p.maybe_q_positions[r0 + i] : 0) + pos_off;

  // Queries of each kv head's group per row, rotated if asked, scaled into the log2 domain (as the scalar path).
  for (int32_t kh = 0; kh < H; ++kh)
    for (int32_t i = 0; i < R; ++i)
      for (int32_t g = 0; g < G; ++g) {
        const int32_t h = (h0 + kh) * G + g, r = r0 + i;
        float* qg = tasks[kh].q + (i * G + g) * Dp;
        const int64_t off = int64_t{r} * p.q_row_stride + int64_t{h} * p.q_head_stride;
        for (int32_t d = 0; d < D; ++d) qg[d] = q_elem_to_f32(p.q, off + d, p.q_elem);
        const float q_pos = static_cast<float>(scratch.q_pos[i] - pos_off);
        if (p.rotate_query) math::rope_rotate_row(qg, p.rope, q_pos, p.rope.attention_factor);
        const float scale = p.softmax_scale * math::kLog2e;
        for (int32_t d = 0; d < D; ++d) qg[d] *= scale;
      }

  PrefetchCells<E>(p, b, h0, h1, range.begin, std::min(range.begin + kTile, range.end));
  for (int32_t t0 = range.begin; t0 < range.end; t0 += kTile) {
    const int32_t n = std::min(kTile, range.end - t0);
    tile.n_next = std::max(0, std::min(kTile, range.end - (t0 + kTile)));
    for (int32_t i = 0; i < tile.n_next; ++i) {
      const int32_t j = t0 + kTile + i;
      tile.next_cells[i] = p.layout.cell(p.indices[p.indptr[b] + j / bs], j % bs);
    }
    NextRows next = CellRuns<E>(p, h0, H, tile.next_cells, tile.n_next);
    if (ListVisibleRows(p, b, t0, n, scratch.q_pos.data(), R, tile)) {
      RunTile<E>(p, b, h0, H, tasks, scratch.sm.data(), GR, tile, next);
    } else {
      for (int32_t i = 0; i < R; ++i) {
        ListVisible(p, b, t0, n, scratch.q_pos[i], tile);
        RunTile<E>(p, b, h0, H, tasks + H * (1 + i), scratch.sm.data() + i * G, GR, tile, next);
      }
    }
    next.ask(next.total);
  }
  for (int32_t kh = 0; kh < H; ++kh)
    for (int32_t i = 0; i < R; ++i)
      for (int32_t g = 0; g < G; ++g) {
        const math::OnlineSoftmax& sm = scratch.sm[kh * GR + i * G + g];
        const int32_t h = (h0 + kh) * G + g;
        const int64_t part = (int64_t{r0 + i} * p.n_q_heads + h) * p.num_splits + split;
        const float inv = sm.l > 0.0f ? 1.0f / sm.l : 0.0f;
        float* o = p.o_part + part * DV;
        const float* acc = tasks[kh].acc + (i * G + g) * DVp;
        for (int32_t d = 0; d < DV; ++d) o[d] = acc[d] * inv;
        p.lse_part[part] = sm.lse();
      }
}

}  // namespace

void AttentionTask(const PagedAttentionParams& p, int32_t r0, int32_t r1, int32_t h0, int32_t h1, int32_t split) {
  switch (p.kv_elem) {
    case math::KvElem::F32: return RunTask<math::KvElem::F32>(p, r0, r1, h0, h1, split);
    case math::KvElem::F16: return RunTask<math::KvElem::F16>(p, r0, r1, h0, h1, split);
    case math::KvElem::BF16: return RunTask<math::KvElem::BF16>(p, r0, r1, h0, h1, split);
    case math::KvElem::E4M3: return RunTask<math::KvElem::E4M3>(p, r0, r1, h0, h1, split);
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {

HWY_EXPORT(AttentionTask);

bool attention_simd_serves(const PagedAttentionParams& p) {
  // Rows of whole 8-lane columns; V rows at any stride (a pool of their own or a view of K's).
  return p.layout.head_dim % 8 == 0 && p.v_head_dim % 8 == 0;
}

void attention_task_simd(const PagedAttentionParams& p, int32_t r0, int32_t r1, int32_t h0, int32_t h1, int32_t split) {
  HWY_DYNAMIC_DISPATCH(AttentionTask)(p, r0, r1, h0, h1, split);
}

}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
