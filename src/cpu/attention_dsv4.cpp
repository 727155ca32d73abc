// CPU DeepSeek-V4 sparse decode attention: per (query row, split) task, each
// key row is decoded to f32 once and used by every head (MQA; K = V). With SIMD
// on (simd_targets.hpp), the decoding, the dots and the weighted sums run in
// vectors (dsv4_simd.hpp): the same values up to the float sums' order.
#include <omp.h>

#include <algorithm>
#include <vector>

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

// Heads [h0, h1) of row r over the keys of one split.
void run_task(const Dsv4AttentionParams& p, int32_t r, int32_t split, int32_t h0, int32_t h1, bool simd) {
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
  std::vector<float> s2(simd ? static_cast<size_t>(H) * kTile : 0);  // the SIMD path's scores, then weights, per head
  bool live[kTile];
  for (int32_t t0 = range.begin; t0 < range.end; t0 += kTile) {
    const int32_t n = std::min(kTile, range.end - t0);
    for (int32_t i = 0; i < n; ++i) live[i] = load_key(p, r, t0 + i, &keys[static_cast<size_t>(i) * kD], simd);
    if (simd) {  // scores four heads at a time, softmax weights, then the sums two heads at a time
      for (int32_t h = 0; h < H; h += 4) {
        const int32_t nh = std::min(4, H - h);
        float* s0 = &s2[static_cast<size_t>(h) * kTile];
        const float* qh0 = &q[static_cast<size_t>(h) * kD];
        if (nh == 4) {
          dsv4_tile_dots4_simd(qh0, keys.data(), live, n, kD, s0, kTile);
        } else {
          for (int32_t e = 0; e < nh; e += 2) {
            if (e + 1 < nh) dsv4_tile_dots2_simd(qh0 + e * kD, qh0 + (e + 1) * kD, keys.data(), live, n, kD, s0 + e * kTile, s0 + (e + 1) * kTile);
            else dsv4_tile_dots_simd(qh0 + e * kD, keys.data(), live, n, kD, s0 + e * kTile);
          }
        }
        float rescale[4];
        for (int32_t e = 0; e < nh; ++e) {
          math::OnlineSoftmax& m = sm[static_cast<size_t>(h + e)];
          float* se = s0 + e * kTile;
          float mx = math::neg_inf_f32();
          for (int32_t i = 0; i < n; ++i) mx = math::max_f32(mx, se[i]);
          rescale[e] = m.begin_tile(mx);
          m.add(dsv4_tile_weights_simd(se, n, m.m));
        }
        for (int32_t e = 0; e < nh; e += 2) {
          float* a0 = &acc[static_cast<size_t>(h + e) * kD];
          if (e + 1 < nh)
            dsv4_tile_accumulate2_simd(a0, a0 + kD, rescale[e], rescale[e + 1], keys.data(), s0 + e * kTile,
                                       s0 + (e + 1) * kTile, n, kD);
          else dsv4_tile_accumulate_simd(a0, rescale[e], keys.data(), s0 + e * kTile, n, kD);
        }
      }
      continue;
    }
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
  // tasks (two a thread), at least 8 heads a group: each task decodes its keys once.
  const int64_t row_splits = int64_t{p.n_rows} * p.num_splits;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const int32_t groups = static_cast<int32_t>(
      std::clamp<int64_t>((2 * threads + row_splits - 1) / row_splits, 1, (p.n_heads + 7) / 8));
  const int32_t per_group = (p.n_heads + groups - 1) / groups;
  const int64_t tasks = row_splits * groups;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t rs = t / groups;
    const int32_t h0 = static_cast<int32_t>(t % groups) * per_group, h1 = std::min(p.n_heads, h0 + per_group);
    if (h0 < h1) run_task(p, static_cast<int32_t>(rs / p.num_splits), static_cast<int32_t>(rs % p.num_splits), h0, h1, simd);
  }
  const int64_t heads = int64_t{p.n_rows} * p.n_heads;
#pragma omp parallel for schedule(static) if (heads * p.num_splits * kD > (int64_t{1} << 18))
  for (int64_t rh = 0; rh < heads; ++rh) {
    const int32_t r = static_cast<int32_t>(rh / p.n_heads), h = static_cast<int32_t>(rh % p.n_heads);
    float row[kD];
    merge_partials(p.o_part + rh * p.num_splits * kD, p.lse_part + rh * p.num_splits, p.num_splits, kD,
                   p.maybe_sinks ? p.maybe_sinks[h] : math::neg_inf_f32(), row);
    // The value's rope tail carries each key's rotation; undo the query's.
    math::rope_rotate_row(row, p.rope, -static_cast<float>(p.q_positions[r]), 1.0f);
    const int64_t off = int64_t{r} * p.out_row_stride + int64_t{h} * p.out_head_stride;
    for (int32_t d = 0; d < kD; ++d) store_q_elem(p.out, off + d, p.out_elem, row[d]);
  }
}

}  // namespace kvcore::ops::cpu
