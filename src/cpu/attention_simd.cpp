// The SIMD kernel of one CPU paged-attention task (attention_tasks.hpp), written
// once with Highway and compiled for every target of simd_config.hpp.
//
// A task covers one query row, a range of kv heads and one split of the cells.
// Per tile of kTile cells, cell by cell and within a cell head by head (a cell's
// heads lie side by side, so the task reads contiguous runs): each visible K row
// is decoded to f32 once (rotated when rope-on-read asks, with cos/sin computed
// once per cell), then dotted with every query head of its group (four heads at
// a time, vectors over head dims). Per kv head, the tile's scores get one rescale
// and exp2 per query head (vectors over cells); then the value pass walks the
// head dims in vector columns and, per column, every visible V row, so each
// group's accumulators stay in registers while the rows stream by. The next
// tile's rows are prefetched into L2. Shapes: any head dim that is a multiple of
// 8 (a column is a full vector, or 8 lanes at the end).
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

constexpr int32_t kTile = 32;  // cells per tile (a multiple of every target's lane count)
constexpr int32_t kHeads = 4;  // query heads per register block

// A K or V row of one (cell, kv head): its bytes and its e4m3 scales.
struct KvRow {
  const uint8_t* data;
  const uint8_t* scale_u8;  // Ue8m0Per64: one byte per 64 dims
  float scale_f32;          // F32PerRow (else 1)
};

struct Task {
  const PagedAttentionParams& p;
  int32_t D, G, Dp;  // head dim, group size, head dim padded to two vectors (q, acc and krow strides)
  float* q;          // [G][Dp] scaled queries, zero padded
  float* acc;        // [G][Dp]
  float* krow;       // [Dp] the current K row as f32, zero padded (shared by the task's kv heads)
  float* s;          // [G][kTile] scores, then weights
  float* w;          // [G][kTile] weights of the visible cells, in order
  KvRow* vrows;      // [kTile] V rows of the visible cells
  float* freq;       // rope-on-read: [padded pairs] frequencies, zero padded
  float* cs;         // rope-on-read: [padded pairs] cos and sin at the current key's position
  float* sn;
};

template <math::KvElem E>
HWY_INLINE float ChunkScale(const KvRow& row, int32_t d) {
  if constexpr (E != math::KvElem::E4M3) {
    return 1.0f;
  } else {
    return row.scale_u8 ? math::ue8m0_decode(row.scale_u8[d / 64]) : row.scale_f32;
  }
}

// The row's values at dims [off, off + Lanes(d)) times their scale. E4M3 multiplies the
// widened byte by 256 * scale at once: the same value as the scalar path's
// (value * 256) * scale unless 256 * scale overflows (scales of 2^120 and more).
template <math::KvElem E, class D>
HWY_INLINE hn::Vec<D> LoadScaled(D d, const KvRow& row, int32_t off) {
  if constexpr (E != math::KvElem::E4M3) return LoadKv<E>(d, row.data, off);
  else return hn::Mul(LoadE4m3Over256(d, row.data, off), hn::Set(d, 256.0f * ChunkScale<E>(row, off)));
}

template <math::KvElem E>
KvRow RowOf(const PagedAttentionParams& p, bool is_k, int64_t cell, int32_t kvh) {
  const int64_t row = cell * p.layout.n_kv_heads + kvh;
  constexpr int64_t kBytes = E == math::KvElem::F32 ? 4 : E == math::KvElem::E4M3 ? 1 : 2;
  KvRow r{static_cast<const uint8_t*>(is_k ? p.k : p.v) + row * p.layout.head_dim * kBytes, nullptr, 1.0f};
  if (p.scale_mode == math::KvScaleMode::Ue8m0Per64)
    r.scale_u8 = (is_k ? p.maybe_k_scale_u8 : p.maybe_v_scale_u8) + row * (p.layout.head_dim / 64);
  else if (p.scale_mode == math::KvScaleMode::F32PerRow)
    r.scale_f32 = (is_k ? p.maybe_k_scale_f32 : p.maybe_v_scale_f32)[row];
  return r;
}

// krow[0, D) = the K row as f32.
template <math::KvElem E>
void DecodeRow(const Task& t, const KvRow& row) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  for (; d + N <= t.D; d += N) hn::StoreU(LoadScaled<E>(df, row, d), df, t.krow + d);
  if (d < t.D) {
    const DTail dt;
    hn::StoreU(LoadScaled<E>(dt, row, d), dt, t.krow + d);
  }
}

// Scores of heads g0 .. g0 + kG against krow, into s[g][i].
template <int kG>
void Dots(const Task& t, int32_t g0, int32_t i) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  hn::Vec<DF> a0[kG], a1[kG];
  for (int g = 0; g < kG; ++g) a0[g] = a1[g] = hn::Zero(df);
  for (int32_t d = 0; d < t.Dp; d += 2 * N) {
    const auto k0 = hn::LoadU(df, t.krow + d), k1 = hn::LoadU(df, t.krow + d + N);
    for (int g = 0; g < kG; ++g) {
      const float* qg = t.q + (g0 + g) * t.Dp + d;
      a0[g] = hn::MulAdd(hn::LoadU(df, qg), k0, a0[g]);
      a1[g] = hn::MulAdd(hn::LoadU(df, qg + N), k1, a1[g]);
    }
  }
  if constexpr (kG == 4) {
    float sums[4];
    SumOfLanes4(df, hn::Add(a0[0], a1[0]), hn::Add(a0[1], a1[1]), hn::Add(a0[2], a1[2]), hn::Add(a0[3], a1[3]), sums);
    for (int g = 0; g < 4; ++g) t.s[(g0 + g) * kTile + i] = sums[g];
  } else {
    for (int g = 0; g < kG; ++g) t.s[(g0 + g) * kTile + i] = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0[g], a1[g])));
  }
}

// acc[g][d .. d + kU * Lanes) += sum over the visible cells j of w[g][j] * V_j, heads g0 .. g0 + kG.
template <math::KvElem E, int kG, int kU, class D>
HWY_INLINE void ValueColumns(D dv, const Task& t, int32_t g0, int32_t n_vis, int32_t d) {
  const int32_t N = static_cast<int32_t>(hn::Lanes(dv));
  hn::Vec<D> a[kG][kU];
  for (int g = 0; g < kG; ++g)
    for (int u = 0; u < kU; ++u) a[g][u] = hn::LoadU(dv, t.acc + (g0 + g) * t.Dp + d + u * N);
  for (int32_t j = 0; j < n_vis; ++j) {
    hn::Vec<D> v[kU];
    for (int u = 0; u < kU; ++u) v[u] = LoadScaled<E>(dv, t.vrows[j], d + u * N);
    for (int g = 0; g < kG; ++g) {
      const auto wg = hn::Set(dv, t.w[(g0 + g) * kTile + j]);
      for (int u = 0; u < kU; ++u) a[g][u] = hn::MulAdd(wg, v[u], a[g][u]);
    }
  }
  for (int g = 0; g < kG; ++g)
    for (int u = 0; u < kU; ++u) hn::StoreU(a[g][u], dv, t.acc + (g0 + g) * t.Dp + d + u * N);
}

template <math::KvElem E, int kG>
void ValuePass(const Task& t, int32_t g0, int32_t n_vis) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  for (; d + 2 * N <= t.D; d += 2 * N) ValueColumns<E, kG, 2>(df, t, g0, n_vis, d);
  for (; d + N <= t.D; d += N) ValueColumns<E, kG, 1>(df, t, g0, n_vis, d);
  if (d < t.D) ValueColumns<E, kG, 1>(DTail(), t, g0, n_vis, d);
}

template <math::KvElem E>
void ValuePassAll(const Task& t, int32_t n_vis) {
  for (int32_t g0 = 0; g0 < t.G; g0 += kHeads) {
    switch (std::min(kHeads, t.G - g0)) {
      case 1: ValuePass<E, 1>(t, g0, n_vis); break;
      case 2: ValuePass<E, 2>(t, g0, n_vis); break;
      case 3: ValuePass<E, 3>(t, g0, n_vis); break;
      default: ValuePass<E, 4>(t, g0, n_vis); break;
    }
  }
}

void DotsAll(const Task& t, int32_t i) {
  for (int32_t g0 = 0; g0 < t.G; g0 += kHeads) {
    switch (std::min(kHeads, t.G - g0)) {
      case 1: Dots<1>(t, g0, i); break;
      case 2: Dots<2>(t, g0, i); break;
      case 3: Dots<3>(t, g0, i); break;
      default: Dots<4>(t, g0, i); break;
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
      float* ag = t.acc + g * t.Dp;
      const auto r = hn::Set(df, rescale);
      for (int32_t d = 0; d < t.Dp; d += N) hn::StoreU(hn::Mul(hn::LoadU(df, ag + d), r), df, ag + d);
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

// Asks for the K and V rows of cells [j0, j1) of sequence b, kv heads [h0, h1) (contiguous
// in a cell), ahead of their use: blocks sit anywhere, which the hardware prefetchers
// cannot follow.
void PrefetchCells(const PagedAttentionParams& p, int32_t b, int32_t h0, int32_t h1, int32_t j0, int32_t j1,
                   int64_t row_bytes) {
  const int32_t bs = p.layout.block_size;
  const auto* k = static_cast<const uint8_t*>(p.k);
  const auto* v = static_cast<const uint8_t*>(p.v);
  const int64_t bytes = (h1 - h0) * row_bytes;
  for (int32_t j = j0; j < j1; ++j) {
    const int64_t first = (p.layout.cell(p.indices[p.indptr[b] + j / bs], j % bs) * p.layout.n_kv_heads + h0) * row_bytes;
    for (int64_t off = 0; off < bytes; off += 64) {
      PrefetchLine(k + first + off);
      PrefetchLine(v + first + off);
    }
  }
}

struct Scratch {
  std::vector<float> f;
  std::vector<KvRow> rows;
  std::vector<math::OnlineSoftmax> sm;
  std::vector<Task> tasks;
};

// Kv heads [h0, h1) of row r, split `split`. Cells are walked in order and, per cell,
// the heads in order, so K (and, prefetched, V) are read as contiguous runs of
// (h1 - h0) rows: the pool keeps a cell's heads side by side.
template <math::KvElem E>
void RunTask(const PagedAttentionParams& p, int32_t r, int32_t h0, int32_t h1, int32_t split) {
  const DF df;
  const int32_t N = static_cast<int32_t>(hn::Lanes(df));
  const int32_t D = p.layout.head_dim, G = p.group, bs = p.layout.block_size, H = h1 - h0;
  const int32_t Dp = (D + 2 * N - 1) / (2 * N) * (2 * N);
  const int32_t n_pairs = p.rope_on_read ? p.rope.layout.n_pairs() : 0;
  const int32_t pairs_p = (n_pairs + 15) / 16 * 16;
  const int64_t per_head = 2 * G * Dp + 2 * G * kTile;  // q, acc, s, w
  thread_local Scratch scratch;
  scratch.f.assign(static_cast<size_t>(H * per_head + Dp + 3 * pairs_p), 0.0f);
  scratch.rows.resize(static_cast<size_t>(H) * kTile);
  scratch.sm.assign(static_cast<size_t>(H) * G, math::OnlineSoftmax{});
  scratch.tasks.clear();
  float* shared = scratch.f.data() + H * per_head;
  float* rope = shared + Dp;
  for (int32_t h = 0; h < H; ++h) {
    float* f = scratch.f.data() + h * per_head;
    scratch.tasks.push_back(Task{p, D, G, Dp, f, f + G * Dp, shared, f + 2 * G * Dp, f + 2 * G * Dp + G * kTile,
                                 scratch.rows.data() + h * kTile, rope, rope + pairs_p, rope + 2 * pairs_p});
  }
  for (int32_t i = 0; i < n_pairs; ++i) rope[i] = p.rope.freq[i];
  const Task* tasks = scratch.tasks.data();

  const int32_t b = attention_row_seq(p, r);
  const int32_t n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, bs);
  const CellRange range = attention_split_range(n_cells, split, p.num_splits);
  const int32_t q_pos = p.maybe_q_positions ? p.maybe_q_positions[r] : 0;
  const int32_t pos_off = p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[b] : 0;

  // Queries of each kv head's group, rotated if asked, scaled into the log2 domain (as the scalar path).
  for (int32_t kh = 0; kh < H; ++kh)
    for (int32_t g = 0; g < G; ++g) {
      const int32_t h = (h0 + kh) * G + g;
      float* qg = tasks[kh].q + g * Dp;
      const int64_t off = int64_t{r} * p.q_row_stride + int64_t{h} * p.q_head_stride;
      for (int32_t d = 0; d < D; ++d) qg[d] = q_elem_to_f32(p.q, off + d, p.q_elem);
      if (p.rotate_query) math::rope_rotate_row(qg, p.rope, static_cast<float>(q_pos), p.rope.attention_factor);
      const float scale = p.softmax_scale * math::kLog2e;
      for (int32_t d = 0; d < D; ++d) qg[d] *= scale;
    }

  constexpr int64_t kBytes = E == math::KvElem::F32 ? 4 : E == math::KvElem::E4M3 ? 1 : 2;
  const int64_t row_bytes = int64_t{D} * kBytes;
  PrefetchCells(p, b, h0, h1, range.begin, std::min(range.begin + kTile, range.end), row_bytes);
  for (int32_t t0 = range.begin; t0 < range.end; t0 += kTile) {
    const int32_t n = std::min(kTile, range.end - t0);
    PrefetchCells(p, b, h0, h1, t0 + kTile, std::min(t0 + 2 * kTile, range.end), row_bytes);
    int32_t n_vis = 0, vis[kTile];
    for (int32_t i = 0; i < kTile; ++i) {
      const int32_t j = t0 + i;
      int64_t cell = -1;
      if (i < n) {
        cell = p.layout.cell(p.indices[p.indptr[b] + j / bs], j % bs);
        if (!attention_cell_visible(p, cell, q_pos + pos_off)) cell = -1;
      }
      if (cell < 0) {
        for (int32_t kh = 0; kh < H; ++kh)
          for (int32_t g = 0; g < G; ++g) tasks[kh].s[g * kTile + i] = math::neg_inf_f32();
        continue;
      }
      if (p.rope_on_read)  // math::rope_rotate_row's cos and sin, once for every head of the cell
        RopeCosSinRow(tasks[0].freq, n_pairs, static_cast<float>(attention_key_position(p, cell, b)),
                      p.rope.attention_factor, tasks[0].cs, tasks[0].sn);
      for (int32_t kh = 0; kh < H; ++kh) {
        const Task& t = tasks[kh];
        DecodeRow<E>(t, RowOf<E>(p, true, cell, h0 + kh));
        if (p.rope_on_read) RotatePairs(p.rope.layout, t.krow, t.krow, t.cs, t.sn);
        DotsAll(t, i);
        t.vrows[n_vis] = RowOf<E>(p, false, cell, h0 + kh);
      }
      vis[n_vis++] = i;
    }
    for (int32_t kh = 0; kh < H; ++kh) {
      const Task& t = tasks[kh];
      SoftmaxTile(t, scratch.sm.data() + kh * G);
      // The visible cells' weights, compacted in the order of t.vrows.
      for (int32_t g = 0; g < G; ++g)
        for (int32_t j = 0; j < n_vis; ++j) t.w[g * kTile + j] = t.s[g * kTile + vis[j]];
      if (n_vis > 0) ValuePassAll<E>(t, n_vis);
    }
  }
  for (int32_t kh = 0; kh < H; ++kh)
    for (int32_t g = 0; g < G; ++g) {
      const math::OnlineSoftmax& sm = scratch.sm[kh * G + g];
      const int32_t h = (h0 + kh) * G + g;
      const int64_t part = (int64_t{r} * p.n_q_heads + h) * p.num_splits + split;
      const float inv = sm.l > 0.0f ? 1.0f / sm.l : 0.0f;
      float* o = p.o_part + part * D;
      for (int32_t d = 0; d < D; ++d) o[d] = tasks[kh].acc[g * Dp + d] * inv;
      p.lse_part[part] = sm.lse();
    }
}

}  // namespace

void AttentionTask(const PagedAttentionParams& p, int32_t r, int32_t h0, int32_t h1, int32_t split) {
  switch (p.kv_elem) {
    case math::KvElem::F32: return RunTask<math::KvElem::F32>(p, r, h0, h1, split);
    case math::KvElem::F16: return RunTask<math::KvElem::F16>(p, r, h0, h1, split);
    case math::KvElem::BF16: return RunTask<math::KvElem::BF16>(p, r, h0, h1, split);
    case math::KvElem::E4M3: return RunTask<math::KvElem::E4M3>(p, r, h0, h1, split);
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {

HWY_EXPORT(AttentionTask);

bool attention_simd_serves(const PagedAttentionParams& p) {
  return p.layout.head_dim % 8 == 0 && p.v_head_dim == p.layout.head_dim;
}

void attention_task_simd(const PagedAttentionParams& p, int32_t r, int32_t h0, int32_t h1, int32_t split) {
  HWY_DYNAMIC_DISPATCH(AttentionTask)(p, r, h0, h1, split);
}

}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
