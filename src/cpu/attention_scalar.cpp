// The scalar path of one CPU paged-attention task (attention_tasks.hpp): one
// element at a time, the reference the SIMD kernels are tested against and the
// fallback for shapes they do not serve (head dims that are not multiples of 8). The task streams its cells in tiles
// (scores first, one rescale per tile, then the value pass) and writes a
// normalized partial.
#include <algorithm>
#include <vector>

#include "cpu/attention_tasks.hpp"
#include "kvcore/math/softmax.hpp"

namespace kvcore::ops::cpu {

namespace {

constexpr int kTile = 32;

// Dequantized K row (head_dim wide) or V row (v_head_dim wide) of (cell, head) into dst.
void load_row(const PagedAttentionParams& p, bool is_k, int64_t cell, int32_t head, float* dst) {
  const int32_t d_n = is_k ? p.layout.head_dim : p.v_head_dim;
  const int64_t row = (cell * p.layout.n_kv_heads + head);
  const void* base = is_k ? p.k : p.v;
  const int64_t off = row * (is_k ? d_n : p.v_row_stride);
  for (int32_t d = 0; d < d_n; ++d) dst[d] = math::kv_elem_to_f32(base, off + d, p.kv_elem);
  if (p.scale_mode == math::KvScaleMode::Ue8m0Per64) {
    const uint8_t* s = is_k ? p.maybe_k_scale_u8 + row * (d_n / 64) : p.maybe_v_scale_u8 + row * p.v_scale_row_stride;
    for (int32_t d = 0; d < d_n; ++d) dst[d] *= math::ue8m0_decode(s[d / 64]);
  } else if (p.scale_mode == math::KvScaleMode::F32PerRow) {
    const float s = (is_k ? p.maybe_k_scale_f32 : p.maybe_v_scale_f32)[row];
    for (int32_t d = 0; d < d_n; ++d) dst[d] *= s;
  }
}

}  // namespace

void attention_task_scalar(const PagedAttentionParams& p, int32_t r, int32_t kvh, int32_t split) {
  const int32_t D = p.layout.head_dim, DV = p.v_head_dim, G = p.group, bs = p.layout.block_size;
  const int32_t b = attention_row_seq(p, r);
  const int32_t n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, bs);
  const CellRange range = attention_split_range(n_cells, split, p.num_splits);
  const int32_t q_pos = p.maybe_q_positions ? p.maybe_q_positions[r] : 0;
  const int32_t pos_off = p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[b] : 0;

  // Queries of this kv head's group, rotated if asked, scaled into the log2 domain.
  std::vector<float> q(static_cast<size_t>(G) * D), acc(static_cast<size_t>(G) * DV, 0.0f);
  for (int32_t g = 0; g < G; ++g) {
    const int32_t h = kvh * G + g;
    float* qg = &q[static_cast<size_t>(g) * D];
    const int64_t off = int64_t{r} * p.q_row_stride + int64_t{h} * p.q_head_stride;
    for (int32_t d = 0; d < D; ++d) qg[d] = q_elem_to_f32(p.q, off + d, p.q_elem);
    if (p.rotate_query) math::rope_rotate_row(qg, p.rope, static_cast<float>(q_pos), p.rope.attention_factor);
    const float scale = p.softmax_scale * math::kLog2e;
    for (int32_t d = 0; d < D; ++d) qg[d] *= scale;
  }
  std::vector<math::OnlineSoftmax> sm(static_cast<size_t>(G));
  std::vector<float> krow(static_cast<size_t>(D)), vrow(static_cast<size_t>(DV));
  std::vector<float> s(static_cast<size_t>(G) * kTile);
  int64_t cells[kTile];

  for (int32_t t0 = range.begin; t0 < range.end; t0 += kTile) {
    const int32_t n = std::min(kTile, range.end - t0);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t j = t0 + i;
      const int32_t block = p.indices[p.indptr[b] + j / bs];
      const int64_t cell = p.layout.cell(block, j % bs);
      cells[i] = cell;
      if (!attention_cell_visible(p, cell, q_pos + pos_off)) {  // == key position vs q_pos
        for (int32_t g = 0; g < G; ++g) s[static_cast<size_t>(g) * kTile + i] = math::neg_inf_f32();
        cells[i] = -1;
        continue;
      }
      load_row(p, true, cell, kvh, krow.data());
      if (p.rope_on_read)
        math::rope_rotate_row(krow.data(), p.rope, static_cast<float>(attention_key_position(p, cell, b)),
                              p.rope.attention_factor);
      for (int32_t g = 0; g < G; ++g) {
        const float* qg = &q[static_cast<size_t>(g) * D];
        float dot = 0.0f;
        for (int32_t d = 0; d < D; ++d) dot += qg[d] * krow[d];
        s[static_cast<size_t>(g) * kTile + i] = dot;
      }
    }
    for (int32_t g = 0; g < G; ++g) {
      float mx = math::neg_inf_f32();
      for (int32_t i = 0; i < n; ++i) mx = math::max_f32(mx, s[static_cast<size_t>(g) * kTile + i]);
      const float rescale = sm[g].begin_tile(mx);
      float* ag = &acc[static_cast<size_t>(g) * DV];
      if (rescale != 1.0f)
        for (int32_t d = 0; d < DV; ++d) ag[d] *= rescale;
      for (int32_t i = 0; i < n; ++i) {
        float& si = s[static_cast<size_t>(g) * kTile + i];
        si = sm[g].weight(si);  // score -> weight, reused by the value pass
        sm[g].add(si);
      }
    }
    for (int32_t i = 0; i < n; ++i) {
      if (cells[i] < 0) continue;
      load_row(p, false, cells[i], kvh, vrow.data());
      for (int32_t g = 0; g < G; ++g) {
        const float w = s[static_cast<size_t>(g) * kTile + i];
        float* ag = &acc[static_cast<size_t>(g) * DV];
        for (int32_t d = 0; d < DV; ++d) ag[d] += w * vrow[d];
      }
    }
  }
  for (int32_t g = 0; g < G; ++g) {
    const int32_t h = kvh * G + g;
    const int64_t part = (int64_t{r} * p.n_q_heads + h) * p.num_splits + split;
    const float inv = sm[g].l > 0.0f ? 1.0f / sm[g].l : 0.0f;
    float* o = p.o_part + part * DV;
    for (int32_t d = 0; d < DV; ++d) o[d] = acc[static_cast<size_t>(g) * DV + d] * inv;
    p.lse_part[part] = sm[g].lse();
  }
}

}  // namespace kvcore::ops::cpu
