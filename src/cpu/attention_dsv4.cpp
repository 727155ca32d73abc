// CPU DeepSeek-V4 sparse decode attention: per (query row, split) task, each
// key row is decoded to f32 once and used by every head (MQA; K = V). With SIMD
// on (simd_targets.hpp), the decoding, the dots and the weighted sums run in
// vectors (dsv4_simd.hpp): the same values up to the float sums' order.
#include <omp.h>

#include <algorithm>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "cpu/attention_merge.hpp"
#include "cpu/dsv4_simd.hpp"
#include "cpu/simd_targets.hpp"
#include "kvcore/math/attention_rows.hpp"
#include "kvcore/math/softmax.hpp"
#include "ops/attention_params.hpp"

namespace kvcore::ops::cpu {

namespace {

constexpr int32_t kD = math::Dsv4RowLayout::kHeadDim;
constexpr int kTile = 16;

// Key j of row r as f32 (false when masked): window rows first, then the compressed picks.
bool load_key(const Dsv4AttentionParams& p, int32_t r, int32_t j, float* dst, bool simd) {
  if (j < p.n_window) {
    if (j >= p.window_len[r]) return false;
    const int64_t off = dsv4_window_base(p, r) + int64_t{j} * p.win_tok_stride;
    if (simd && p.window_f16) {
      dsv4_f16_decode_simd(static_cast<const uint16_t*>(p.window_kv) + off, kD, dst);
      return true;
    }
    for (int32_t d = 0; d < kD; ++d)
      dst[d] = p.window_f16 ? math::f16_bits_to_f32(static_cast<const uint16_t*>(p.window_kv)[off + d])
                            : static_cast<const float*>(p.window_kv)[off + d];
    return true;
  }
  const int32_t idx = p.maybe_comp_idx[int64_t{r} * p.comp_idx_stride + (j - p.n_window)];
  if (idx < 0) return false;
  const uint8_t* row = p.maybe_comp_rows + int64_t{idx} * p.comp_stride;
  if (simd) {
    dsv4_row_decode_simd(row, dst);
    return true;
  }
  for (int32_t d = 0; d < kD; ++d) dst[d] = math::dsv4_row_value(row, d);
  return true;
}

// Per-thread buffers of the heads-in-lanes path, kept between calls (a task's
// queries and sums are 128 KB each at 64 heads).
float* lanes_scratch(size_t floats) {
  thread_local hwy::AlignedFreeUniquePtr<float[]> buf;
  thread_local size_t cap = 0;
  if (cap < floats) buf = hwy::AllocateAligned<float>(floats), cap = floats;
  return buf.get();
}

// Heads [h0, h1) of row r over the keys of one split, with SIMD: every head at once, in
// lanes (dsv4_heads_tile_simd), a tile of keys at a time.
void run_task_lanes(const Dsv4AttentionParams& p, int32_t r, int32_t split, int32_t h0, int32_t h1) {
  // Keys a tile (96 KB decoded): a multiple of the keys a score block takes (6, 8, 12 or 24
  // at 4, 3, 2 or 1 vectors of heads), so only a split's last tile runs partial blocks.
  constexpr int32_t kKeys = 48;
  const int32_t H = h1 - h0, lanes = dsv4_head_lanes(), hp = (H + lanes - 1) / lanes * lanes;
  const CellRange range = attention_split_range(p.n_window + p.comp_k, split, p.num_splits);
  auto padded = [](size_t n) { return (n + 15) / 16 * 16; };
  const size_t n_qt = padded(size_t{kD} * hp), n_acc = padded(size_t{kD} * H), n_hp = padded(hp),
               n_keys = size_t{kKeys} * kD;
  const size_t n_s = std::max(size_t{kKeys}, size_t{kD}) * hp;  // the tile's scores; first the query rows
  float* qt = lanes_scratch(n_qt + n_acc + 3 * n_hp + n_keys + n_s);
  float* acc = qt + n_qt;
  float *m = acc + n_acc, *l = m + n_hp, *rescale = l + n_hp;
  float* keys = rescale + n_hp;
  float* s = keys + n_keys;
  const float scale = p.softmax_scale * math::kLog2e;
  // The queries transposed, times the scale: gathered where they are (f32, whole vectors of
  // heads), else first as f32 rows (padding heads zero).
  const int64_t q0 = int64_t{r} * p.q_row_stride + int64_t{h0} * p.q_head_stride;
  if (p.q_elem == QElem::F32 && hp == H && p.q_head_stride * hp < (int64_t{1} << 31)) {
    dsv4_transpose_heads_simd(static_cast<const float*>(p.q) + q0, p.q_head_stride, hp, kD, scale, qt);
  } else {
    float* qrows = s;  // the scratch's first use: hp rows of 512 floats
    for (int32_t h = 0; h < hp; ++h) {
      float* dst = qrows + static_cast<size_t>(h) * kD;
      if (h >= H) std::fill(dst, dst + kD, 0.0f);
      else
        for (int32_t d = 0; d < kD; ++d) dst[d] = q_elem_to_f32(p.q, q0 + int64_t{h} * p.q_head_stride + d, p.q_elem);
    }
    dsv4_transpose_heads_simd(qrows, kD, hp, kD, scale, qt);
  }
  std::fill(m, m + hp, math::neg_inf_f32());
  std::fill(l, l + hp, 0.0f);
  std::fill(acc, acc + size_t{kD} * H, 0.0f);
  bool live[kKeys];
  for (int32_t t0 = range.begin; t0 < range.end; t0 += kKeys) {
    const int32_t n = std::min(kKeys, range.end - t0);
    for (int32_t i = 0; i < n; ++i) {
      float* row = keys + static_cast<size_t>(i) * kD;
      live[i] = load_key(p, r, t0 + i, row, true);
      if (!live[i]) std::fill(row, row + kD, 0.0f);  // weighs 0: finite values
    }
    dsv4_heads_tile_simd(qt, H, hp, keys, live, n, m, l, acc, s, rescale);
  }
  for (int32_t h = 0; h < H; ++h) {
    const int64_t part = (int64_t{r} * p.n_heads + h0 + h) * p.num_splits + split;
    const math::OnlineSoftmax sm{m[h], l[h]};
    const float inv = sm.l > 0.0f ? 1.0f / sm.l : 0.0f;
    for (int32_t d = 0; d < kD; ++d) p.o_part[part * kD + d] = acc[static_cast<size_t>(h) * kD + d] * inv;
    p.lse_part[part] = sm.lse();
  }
}

// Heads [h0, h1) of row r over the keys of one split, the scalar path.
void run_task(const Dsv4AttentionParams& p, int32_t r, int32_t split, int32_t h0, int32_t h1) {
  const int32_t H = h1 - h0;
  const int32_t n_keys = p.n_window + p.comp_k;
  const CellRange range = attention_split_range(n_keys, split, p.num_splits);
  std::vector<float> q(static_cast<size_t>(H) * kD), acc(static_cast<size_t>(H) * kD, 0.0f);
  const float scale = p.softmax_scale * math::kLog2e;
  for (int32_t h = 0; h < H; ++h)
    for (int32_t d = 0; d < kD; ++d)
      q[static_cast<size_t>(h) * kD + d] =
          q_elem_to_f32(p.q, int64_t{r} * p.q_row_stride + int64_t{h0 + h} * p.q_head_stride + d, p.q_elem) * scale;
  std::vector<math::OnlineSoftmax> sm(static_cast<size_t>(H));
  std::vector<float> keys(static_cast<size_t>(kTile) * kD), s(static_cast<size_t>(kTile));
  bool live[kTile];
  for (int32_t t0 = range.begin; t0 < range.end; t0 += kTile) {
    const int32_t n = std::min(kTile, range.end - t0);
    for (int32_t i = 0; i < n; ++i) live[i] = load_key(p, r, t0 + i, &keys[static_cast<size_t>(i) * kD], false);
    for (int32_t h = 0; h < H; ++h) {
      const float* qh = &q[static_cast<size_t>(h) * kD];
      float mx = math::neg_inf_f32();
      for (int32_t i = 0; i < n; ++i) {
        float dot = math::neg_inf_f32();
        if (live[i]) {
          dot = 0.0f;
          const float* k = &keys[static_cast<size_t>(i) * kD];
          for (int32_t d = 0; d < kD; ++d) dot += qh[d] * k[d];
        }
        s[i] = dot;
        mx = math::max_f32(mx, dot);
      }
      const float rescale = sm[h].begin_tile(mx);
      float* a = &acc[static_cast<size_t>(h) * kD];
      if (rescale != 1.0f)
        for (int32_t d = 0; d < kD; ++d) a[d] *= rescale;
      for (int32_t i = 0; i < n; ++i) {
        const float w = sm[h].weight(s[i]);
        sm[h].add(w);
        if (w == 0.0f) continue;
        const float* k = &keys[static_cast<size_t>(i) * kD];
        for (int32_t d = 0; d < kD; ++d) a[d] += w * k[d];
      }
    }
  }
  for (int32_t h = 0; h < H; ++h) {
    const int64_t part = (int64_t{r} * p.n_heads + h0 + h) * p.num_splits + split;
    const float inv = sm[h].l > 0.0f ? 1.0f / sm[h].l : 0.0f;
    for (int32_t d = 0; d < kD; ++d) p.o_part[part * kD + d] = acc[static_cast<size_t>(h) * kD + d] * inv;
    p.lse_part[part] = sm[h].lse();
  }
}

}  // namespace

void attention_dsv4(const Dsv4AttentionParams& p) {
  const bool simd = simd_on();
  const bool parallel = int64_t{p.n_rows} * (p.n_window + p.comp_k) * p.n_heads * kD > (int64_t{1} << 20);
  // Tasks: (row, split, group of heads). Heads are grouped only as far as the threads need
  // tasks, each task decoding its keys once: the scalar path two tasks a thread, at least 8
  // heads a group; the SIMD path, whose heads share each key's loads, one task a thread and
  // groups of a multiple of 16 heads (the widest vector's lanes).
  const int64_t row_splits = int64_t{p.n_rows} * p.num_splits;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const int64_t want = simd ? threads : 2 * threads, min_heads = simd ? 16 : 8;
  const int32_t groups = static_cast<int32_t>(
      std::clamp<int64_t>((want + row_splits - 1) / row_splits, 1, (p.n_heads + min_heads - 1) / min_heads));
  const int32_t per_group =
      static_cast<int32_t>((int64_t{(p.n_heads + groups - 1) / groups} + min_heads - 1) / min_heads * min_heads);
  const int64_t tasks = row_splits * groups;
  // The value's rope tail carries each key's rotation; undo the query's: each row's cos and
  // sin once (math::rope_rotate_row's, the same bits), then every head.
  const int32_t n_pairs = p.rope.layout.n_pairs();
  std::vector<float> cs(static_cast<size_t>(p.n_rows) * n_pairs), sn(cs.size());
  for (int32_t r = 0; r < p.n_rows; ++r)
    for (int32_t i = 0; i < n_pairs; ++i)
      math::rope_cos_sin(-static_cast<float>(p.q_positions[r]), p.rope.freq[i], 1.0f,
                         &cs[static_cast<size_t>(r) * n_pairs + i], &sn[static_cast<size_t>(r) * n_pairs + i]);
  const int64_t heads = int64_t{p.n_rows} * p.n_heads;
  // One parallel region: the tasks, then (after the loop's barrier) the merge over heads.
#pragma omp parallel if (parallel)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t rs = t / groups;
      const int32_t r = static_cast<int32_t>(rs / p.num_splits), split = static_cast<int32_t>(rs % p.num_splits);
      const int32_t h0 = static_cast<int32_t>(t % groups) * per_group, h1 = std::min(p.n_heads, h0 + per_group);
      if (h0 >= h1) continue;
      if (simd) run_task_lanes(p, r, split, h0, h1);
      else run_task(p, r, split, h0, h1);
    }
#pragma omp for schedule(static)
    for (int64_t rh = 0; rh < heads; ++rh) {
      const int32_t r = static_cast<int32_t>(rh / p.n_heads), h = static_cast<int32_t>(rh % p.n_heads);
      float row[kD];
      merge_partials(p.o_part + rh * p.num_splits * kD, p.lse_part + rh * p.num_splits, p.num_splits, kD,
                     p.maybe_sinks ? p.maybe_sinks[h] : math::neg_inf_f32(), row);
      for (int32_t i = 0; i < n_pairs; ++i)
        math::rotate_pair(row[p.rope.layout.dim0(i)], row[p.rope.layout.dim1(i)],
                          cs[static_cast<size_t>(r) * n_pairs + i], sn[static_cast<size_t>(r) * n_pairs + i]);
      const int64_t off = int64_t{r} * p.out_row_stride + int64_t{h} * p.out_head_stride;
      switch (p.out_elem) {  // store_q_elem, the switch out of the loop
        case QElem::F32:
          std::copy(row, row + kD, static_cast<float*>(p.out) + off);
          break;
        default:
          for (int32_t d = 0; d < kD; ++d) store_q_elem(p.out, off + d, p.out_elem, row[d]);
      }
    }
  }
}

}  // namespace kvcore::ops::cpu
