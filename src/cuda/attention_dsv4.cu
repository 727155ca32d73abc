// CUDA DeepSeek-V4 sparse decode attention. One CTA of 8 warps per (query
// row, split of the key list, 8 heads): a tile of 16 key rows (window rows or
// packed 584-byte compressed rows) is decoded once into shared memory as f32
// and read by the 8 heads (one warp each; MQA, K = V). Each lane owns 16 of
// the 512 dims. Partials go through the shared merge kernel, which also
// rotates the output tail back by the query position.
#include "cuda/attention_merge.cuh"
#include "cuda/check.cuh"
#include "kvcore/math/attention_rows.hpp"
#include "kvcore/math/softmax.hpp"

namespace kvcore::ops::cuda {

namespace {

constexpr int kD = math::Dsv4RowLayout::kHeadDim;
constexpr int kHeadsPerCta = 8;
constexpr int kThreads = kHeadsPerCta * 32;
constexpr int kTile = 16;

// Lane l's dims: 4l + 128j + c for j, c < 4 (float4 reads of a row are conflict-free).
__device__ __forceinline__ int lane_dim(int lane, int j, int c) { return 4 * lane + 128 * j + c; }

__global__ void __launch_bounds__(kThreads) dsv4_kernel(const Dsv4AttentionParams p) {
  __shared__ __align__(16) float keys[kTile][kD];
  __shared__ bool live[kTile];
  const int row = blockIdx.x / p.num_splits, split = blockIdx.x % p.num_splits;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y * kHeadsPerCta + warp;
  const bool head_ok = h < p.n_heads;
  const int n_keys = p.n_window + p.comp_k;
  const CellRange range = attention_split_range(n_keys, split, p.num_splits);
  const int wlen = p.window_len[row];

  float q[16], acc[16];
  const float qs = p.softmax_scale * math::kLog2e;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int d = lane_dim(lane, j, c);
      q[4 * j + c] = head_ok ? q_elem_to_f32(p.q, int64_t{row} * p.q_row_stride + int64_t{h} * p.q_head_stride + d, p.q_elem) * qs
                             : 0.0f;
      acc[4 * j + c] = 0.0f;
    }
  math::OnlineSoftmax st;

  for (int t0 = range.begin; t0 < range.end; t0 += kTile) {
    const int n = min(kTile, range.end - t0);
    __syncthreads();  // the previous tile is consumed
    // ---- decode the tile (masked rows become zeros)
    for (int i = threadIdx.x; i < kTile * kD; i += kThreads) {
      const int t = i / kD, d = i % kD;
      const int jk = t0 + t;
      float x = 0.0f;
      bool ok = false;
      if (t < n) {
        if (jk < p.n_window) {
          ok = jk < wlen;
          if (ok) {
            const int64_t off = dsv4_window_base(p, row) + int64_t{jk} * p.win_tok_stride + d;
            x = p.window_f16 ? math::f16_bits_to_f32(static_cast<const uint16_t*>(p.window_kv)[off])
                             : static_cast<const float*>(p.window_kv)[off];
          }
        } else {
          const int idx = p.maybe_comp_idx[int64_t{row} * p.comp_idx_stride + (jk - p.n_window)];
          ok = idx >= 0;
          if (ok) x = math::dsv4_row_value(p.maybe_comp_rows + int64_t{idx} * p.comp_stride, d);
        }
      }
      keys[t][d] = x;
      if (d == 0) live[t] = ok;
    }
    __syncthreads();
    // ---- scores of this warp's head
    float s[kTile];
    float mx = math::neg_inf_f32();
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      float part = 0.0f;
      if (t < n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 k4 = *reinterpret_cast<const float4*>(&keys[t][lane_dim(lane, j, 0)]);
          part = fmaf(q[4 * j], k4.x, part);
          part = fmaf(q[4 * j + 1], k4.y, part);
          part = fmaf(q[4 * j + 2], k4.z, part);
          part = fmaf(q[4 * j + 3], k4.w, part);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
      }
      s[t] = (t < n && live[t]) ? part : math::neg_inf_f32();
      mx = math::max_f32(mx, s[t]);
    }
    const float r = st.begin_tile(mx);
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[e] *= r;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      const float w = st.weight(s[t]);
      st.add(w);
      if (w == 0.0f) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 k4 = *reinterpret_cast<const float4*>(&keys[t][lane_dim(lane, j, 0)]);
        acc[4 * j] = fmaf(w, k4.x, acc[4 * j]);
        acc[4 * j + 1] = fmaf(w, k4.y, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(w, k4.z, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(w, k4.w, acc[4 * j + 3]);
      }
    }
  }
  if (!head_ok) return;
  const int64_t part = (int64_t{row} * p.n_heads + h) * p.num_splits + split;
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) p.o_part[part * kD + lane_dim(lane, j, c)] = acc[4 * j + c] * inv;
  if (lane == 0) p.lse_part[part] = st.lse();
}

}  // namespace

void attention_dsv4(const Dsv4AttentionParams& p) {
  KVCORE_CUDA_CHECK(cudaSetDevice(p.device));
  cudaStream_t stream = kvcore::cuda::native(p.stream);
  const int64_t gx = int64_t{p.n_rows} * p.num_splits;
  const int gy = (p.n_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  require_arg(gx < (int64_t{1} << 31) && gy < 65536, "attention_dsv4_decode: grid too large");
  dsv4_kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kThreads, 0, stream>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4_kernel");
  attn::MergeArgs m{};
  m.o_part = p.o_part;
  m.lse_part = p.lse_part;
  m.n_rows = p.n_rows;
  m.n_heads = p.n_heads;
  m.splits = p.num_splits;
  m.head_dim = kD;
  m.maybe_sinks = p.maybe_sinks;
  m.out = p.out;
  m.out_elem = p.out_elem;
  m.out_row_stride = p.out_row_stride;
  m.out_head_stride = p.out_head_stride;
  m.maybe_inverse_rope_pos = p.q_positions;
  m.rope = p.rope;
  attn::launch_merge(m, stream);
}

}  // namespace kvcore::ops::cuda
