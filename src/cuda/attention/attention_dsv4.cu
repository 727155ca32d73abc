// CUDA DeepSeek-V4 sparse decode attention. One CTA of 8 warps per (query
// row, split of the key list, 8 heads): a tile of 16 key rows (window rows or
// packed 584-byte compressed rows) is decoded once into shared memory as f32
// and read by the 8 heads (one warp each; MQA, K = V). Each lane owns 16 of
// the 512 dims. Partials go through the shared merge kernel, which also
// rotates the output tail back by the query position.
// Tile loads (rows 8-byte aligned, the common case): a warp brings in 2 rows, a lane 16
// consecutive dims by 8-byte loads, and the next tile's bytes are loaded into registers while
// this tile is scored (its row indices one tile earlier still). The element-by-element decode
// (kept for unaligned rows) waited a global round trip per element and took ~85 us a call at
// batch 1 whatever the context (GPU run C).
#include "cuda/attention/attention_merge.cuh"
#include "cuda/common/check.cuh"
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

// The bytes of one key row a lane holds between load and decode: dims 16 lane .. 16 lane + 15.
// Packed rows: nope lanes (< 28) hold 16 E4M3 codes (x[0], x[1]) and their block's scale byte;
// rope lanes hold 16 bf16 (x[0..3]). Window rows: 16 f16 (x[0..3]) or 16 f32 (x[0..7]).
struct RawRow {
  uint2 x[8];
  uint32_t scale;
  bool live;
};
constexpr int kLanesNope = math::Dsv4RowLayout::kNope / 16;  // 28

// Loads key jk (window row jk, or packed row `idx` for the compressed keys) of query row `row`.
__device__ __forceinline__ void load_raw(const Dsv4AttentionParams& p, int row, int jk, int idx, int wlen, int lane,
                                         RawRow& r) {
  using L = math::Dsv4RowLayout;
  r.live = false;
  if (jk < p.n_window) {
    if (jk >= wlen) return;
    r.live = true;
    const int64_t off = dsv4_window_base(p, row) + int64_t{jk} * p.win_tok_stride + 16 * lane;
    if (p.window_f16) {
      const uint2* src = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.window_kv) + off);
#pragma unroll
      for (int i = 0; i < 4; ++i) r.x[i] = src[i];
    } else {
      const uint2* src = reinterpret_cast<const uint2*>(static_cast<const float*>(p.window_kv) + off);
#pragma unroll
      for (int i = 0; i < 8; ++i) r.x[i] = src[i];
    }
    return;
  }
  if (idx < 0) return;
  r.live = true;
  const uint8_t* base = p.maybe_comp_rows + int64_t{idx} * p.comp_stride;
  if (lane < kLanesNope) {
    const uint2* src = reinterpret_cast<const uint2*>(base + L::kNopeOffset + 16 * lane);
    r.x[0] = src[0];
    r.x[1] = src[1];
    r.scale = base[L::kScaleOffset + lane / 4];
  } else {
    const uint2* src = reinterpret_cast<const uint2*>(base + L::kRopeOffset + 32 * (lane - kLanesNope));
#pragma unroll
    for (int i = 0; i < 4; ++i) r.x[i] = src[i];
  }
}

// Decodes a lane's 16 dims of the row into dst[16 lane ..] as f32 (dsv4_row_value's values; dead: zeros).
__device__ __forceinline__ void store_raw(const Dsv4AttentionParams& p, const RawRow& r, bool window, int lane, float* dst) {
  float v[16];
  if (!r.live) {
#pragma unroll
    for (int c = 0; c < 16; ++c) v[c] = 0.0f;
  } else if (window && !p.window_f16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[2 * i] = __uint_as_float(r.x[i].x), v[2 * i + 1] = __uint_as_float(r.x[i].y);
  } else if (window || lane >= kLanesNope) {  // 16-bit values: f16 window rows, bf16 rope tail
    const bool f16 = window;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const uint32_t w = h < 2 ? r.x[i].x : r.x[i].y;
        const uint16_t b = static_cast<uint16_t>(h % 2 ? w >> 16 : w & 0xffffu);
        v[4 * i + h] = f16 ? math::f16_bits_to_f32(b) : math::bf16_bits_to_f32(b);
      }
  } else {
    const float sc = math::ue8m0_decode(static_cast<uint8_t>(r.scale));
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint32_t w = c < 4 ? r.x[i].x : r.x[i].y;
        v[8 * i + c] = math::e4m3_decode(static_cast<uint8_t>(w >> (8 * (c % 4)))) * sc;
      }
  }
#pragma unroll
  for (int c = 0; c < 16; c += 4) *reinterpret_cast<float4*>(dst + 16 * lane + c) = make_float4(v[c], v[c + 1], v[c + 2], v[c + 3]);
}

template <bool kVec>
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

  // kVec: warp w loads rows 2w and 2w + 1 of every tile (see the file comment).
  auto comp_idx_of = [&](int jk) {
    return jk >= p.n_window && jk < range.end ? p.maybe_comp_idx[int64_t{row} * p.comp_idx_stride + (jk - p.n_window)] : -1;
  };
  RawRow raw[2];
  int next_idx[2];
  auto load_tile_rows = [&](int t0, const int (&idx)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int jk = t0 + 2 * warp + e;
      raw[e].live = false;
      if (jk < range.end) load_raw(p, row, jk, idx[e], wlen, lane, raw[e]);
    }
  };
  if constexpr (kVec) {
    int idx0[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) idx0[e] = comp_idx_of(range.begin + 2 * warp + e);
    load_tile_rows(range.begin, idx0);
#pragma unroll
    for (int e = 0; e < 2; ++e) next_idx[e] = comp_idx_of(range.begin + kTile + 2 * warp + e);
  }

  for (int t0 = range.begin; t0 < range.end; t0 += kTile) {
    const int n = min(kTile, range.end - t0);
    __syncthreads();  // the previous tile is consumed
    // ---- decode the tile (masked rows become zeros)
    if constexpr (kVec) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 2 * warp + e;
        store_raw(p, raw[e], t0 + t < p.n_window, lane, &keys[t][0]);
        if (lane == 0) live[t] = raw[e].live;
      }
      __syncthreads();
      // The next tile's rows (their indices were read a tile ago) and the indices of the one
      // after: in flight while this tile is scored.
      load_tile_rows(t0 + kTile, next_idx);
#pragma unroll
      for (int e = 0; e < 2; ++e) next_idx[e] = comp_idx_of(t0 + 2 * kTile + 2 * warp + e);
    } else {  // rows not 8-byte aligned: element by element
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
    }
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
  cudaStream_t stream = kvcore::ops::cuda::native(p.stream);
  const int64_t gx = int64_t{p.n_rows} * p.num_splits;
  const int gy = (p.n_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  require_arg(gx < (int64_t{1} << 31) && gy < 65536, "attention_dsv4_decode: grid too large");
  // 8-byte loads of the rows need 8-byte aligned rows (the cache's own storage always is).
  const auto aligned8 = [](const void* ptr, int64_t stride_bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % 8 == 0 && stride_bytes % 8 == 0;
  };
  const int64_t win_elem = p.window_f16 ? 2 : 4;
  const bool vec = aligned8(p.window_kv, p.win_row_stride * win_elem) && p.win_tok_stride * win_elem % 8 == 0 &&
                   (p.comp_k == 0 || aligned8(p.maybe_comp_rows, p.comp_stride));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  if (vec) dsv4_kernel<true><<<grid, kThreads, 0, stream>>>(p);
  else dsv4_kernel<false><<<grid, kThreads, 0, stream>>>(p);
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
