// CUDA paged attention kernel (decode, and prefill one query row at a time).
//
// One CTA of 4 warps per (query row, split of the row's cells, kv head, chunk
// of up to G query heads of that kv head's group): K and V are read once for
// the whole group. Inside a warp, a row of head_dim values is spread over
// kLpr lanes with 16-byte loads (kRpw rows side by side). kLpr is a power of
// two (the shuffle reductions halve it): where a row's 16-byte vectors do not
// fill the lanes (head dims 80, 96, 112, 192, 576), the lanes past the row load
// nothing and hold zeros, so they add nothing to dot products or sums. K rows
// (HDK, also the query's width) and V rows (HDV, the output's width) may differ
// in width (MLA: K 576, V 512); they share the lanes of a row. Every lane keeps
// kUnroll cells of K and V in flight, the dot products are reduced with warp
// shuffles, and each row group keeps its own online-softmax state, merged
// across row groups (shuffles) and warps (shared memory) at the end. The
// result is a normalized partial (o, lse) per split; attention_merge (in
// attention.cu) combines the splits, adds the sink and stores the output.
//
// Two ways to feed a step (a template flag): ASYNC = false loads K/V straight
// into registers (__ldg, kUnroll cells per lane issued before any math);
// ASYNC = true (head_dim 128, 16-bit and FP8 pages: the benchmarked shapes)
// copies them with cp.async into a per-warp ring of kStages steps in shared
// memory, kStages - 1 steps ahead of the math, and prefetches the step's
// metadata (scales, valid, positions) into L1. ops::AttentionTuning::kernel
// (attention_tuning.hpp) picks one for testing; both compute the same function.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/cp_async.cuh"
#include "kvcore/math/softmax.hpp"
#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::attn {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

constexpr int next_pow2(int n) { return n <= 1 ? 1 : 2 * next_pow2((n + 1) / 2); }

template <int HDK, int HDV, math::KvElem KV, int G>
struct DecodeShape {
  static constexpr int kBytes = KV == math::KvElem::F32 ? 4 : KV == math::KvElem::E4M3 ? 1 : 2;
  static constexpr int kVec = 16 / kBytes;                          // elements per 16-byte load
  static_assert(HDK % kVec == 0 && HDV % kVec == 0, "rows of whole 16-byte vectors");
  static constexpr int kVecsK = HDK / kVec, kVecsV = HDV / kVec;    // 16-byte vectors per K and V row
  static constexpr int kVecsMax = kVecsK > kVecsV ? kVecsK : kVecsV;
  static constexpr int kLpr = next_pow2(kVecsMax) < 32 ? next_pow2(kVecsMax) : 32;  // lanes per row
  static constexpr int kVplK = (kVecsK + kLpr - 1) / kLpr;         // 16-byte vectors per lane and K row
  static constexpr int kVplV = (kVecsV + kLpr - 1) / kLpr;         // ... and V row
  static constexpr int kVplMax = kVplK > kVplV ? kVplK : kVplV;
  static constexpr int kRpw = 32 / kLpr;                            // rows side by side in a warp
  static constexpr int kEplK = kVec * kVplK;                        // K (and q) elements per lane and row
  static constexpr int kEplV = kVec * kVplV;                        // V (and accumulator) elements per lane
  static constexpr int kRowPad = kLpr * kEplK;                      // K row width rounded up to the lanes
  // Cells per lane in flight: 4 rows of 16 bytes, halved when q and the accumulators
  // (G * (kEplK + kEplV) registers) leave too little room.
  static constexpr int kUnrollBase = kVplMax >= 4 ? 1 : 4 / kVplMax;
  static constexpr int kUnroll = (G * (kEplK + kEplV) >= 128 && kUnrollBase > 1) ? kUnrollBase / 2 : kUnrollBase;
  static constexpr int kStep = kRpw * kUnroll;                      // cells per warp step
  static constexpr int kStageVecs = kUnroll * (kVplK + kVplV);      // 16-byte chunks per lane per step (K and V)
  static constexpr int kStagesRaw = 12288 / (kStageVecs * 512);      // ~12 KB of copies in flight per warp
  static constexpr int kStages = kStagesRaw < 2 ? 2 : kStagesRaw > 4 ? 4 : kStagesRaw;
  // Dim of element e of vector v held by lane li of a row group.
  static constexpr __device__ int dim(int v, int li, int e) { return (v * kLpr + li) * kVec + e; }
  // Whether vector v of lane li lies inside a K (V) row (known at compile time when rows fill the lanes).
  static constexpr __device__ bool in_k(int v, int li) { return kVecsK % kLpr == 0 || v * kLpr + li < kVecsK; }
  static constexpr __device__ bool in_v(int v, int li) { return kVecsV % kLpr == 0 || v * kLpr + li < kVecsV; }
};

// 16 bytes of pool storage -> kVec floats (scales applied by the caller).
// E4M3 uses the hardware e4m3x2 -> f16x2 conversion, exact and equal to math::e4m3_decode.
template <math::KvElem KV>
__device__ __forceinline__ void dequant16(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (KV == math::KvElem::F32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
  } else if constexpr (KV == math::KvElem::F16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      memcpy(&h, &w[i], 4);
      const float2 f = __half22float2(h);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else if constexpr (KV == math::KvElem::BF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * k)) & 0xffffu);
        const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
        const float2 f = __half22float2(h);
        out[4 * i + 2 * k] = f.x;
        out[4 * i + 2 * k + 1] = f.y;
      }
    }
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) { kvcore::ops::cuda::cp_async<16>(smem, gmem); }
// Pull a line into L1 ahead of use (metadata read a few steps later by ordinary loads).
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p)); }

using kvcore::ops::cuda::cp_async_commit;
using kvcore::ops::cuda::cp_async_wait;

template <int HDK, int HDV, int G, int EPL>
struct DecodeSmem {
  float q[G][HDK];
  float red[kWarps][G][HDV];     // per-warp accumulators for the final merge
  float m[kWarps][G], l[kWarps][G];
  float kbuf[kWarps][32 * EPL];  // rope-on-read: one warp step's K rows (kRowPad apart), to find pair partners
  float freq[math::RopeTable::kMaxPairs];
};

template <int HDK, int HDV, math::KvElem KV, int G>
using DecodeSmemOf = DecodeSmem<HDK, HDV, G, DecodeShape<HDK, HDV, KV, G>::kEplK>;

template <int HDK, int HDV, math::KvElem KV, int G, bool ASYNC>
__device__ __forceinline__ void decode_body(const PagedAttentionParams& p, DecodeSmemOf<HDK, HDV, KV, G>& sm,
                                            uint4* async_buf, int row, int split, int kvh, int chunk) {
  using S = DecodeShape<HDK, HDV, KV, G>;
  constexpr int E = S::kEplK, EV = S::kEplV;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int li = lane % S::kLpr, rs = lane / S::kLpr;
  const int b = attention_row_seq(p, row);
  const int bs = p.layout.block_size;
  const int n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, bs);
  const CellRange range = attention_split_range(n_cells, split, p.num_splits);
  const int q_pos = p.maybe_q_positions ? p.maybe_q_positions[row] : 0;
  const int pos_off = p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[b] : 0;
  const int h0 = kvh * p.group + chunk * G;
  const int n_h = min(G, p.group - chunk * G);
  const int n_pairs = p.rope.layout.n_pairs();

  // ---- queries of this chunk -> shared (f32), rotated if asked, then to registers scaled to log2 units
  for (int i = tid; i < G * HDK; i += kThreads) {
    const int g = i / HDK, d = i % HDK;
    sm.q[g][d] = g < n_h ? q_elem_to_f32(p.q, int64_t{row} * p.q_row_stride + int64_t{h0 + g} * p.q_head_stride + d,
                                         p.q_elem)
                         : 0.0f;
  }
  if (p.rope_on_read)
    for (int i = tid; i < n_pairs; i += kThreads) sm.freq[i] = p.rope.freq[i];
  __syncthreads();
  if (p.rotate_query) {
    for (int i = tid; i < G * n_pairs; i += kThreads) {
      const int g = i / n_pairs, pi = i % n_pairs;
      float sn, cs;
      math::sincos_f32(math::rope_angle(static_cast<float>(q_pos), sm.freq[pi]), &sn, &cs);
      math::rotate_pair(sm.q[g][p.rope.layout.dim0(pi)], sm.q[g][p.rope.layout.dim1(pi)], cs * p.rope.attention_factor,
                        sn * p.rope.attention_factor);
    }
    __syncthreads();
  }
  float qr[G][E];
  {
    const float qs = p.softmax_scale * math::kLog2e;
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int v = 0; v < S::kVplK; ++v)
#pragma unroll
        for (int e = 0; e < S::kVec; ++e)
          qr[g][v * S::kVec + e] = S::in_k(v, li) ? sm.q[g][S::dim(v, li, e)] * qs : 0.0f;
  }

  float acc[G][EV];
  math::OnlineSoftmax st[G];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < EV; ++e) acc[g][e] = 0.0f;

  const int32_t* blocks = p.indices + p.indptr[b];
  const int n_kv = p.layout.n_kv_heads;
  const char* kbase = static_cast<const char*>(p.k);
  const char* vbase = static_cast<const char*>(p.v);
  const bool pow2_bs = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  const float mag = p.rope.attention_factor;

  // Steps of this warp: cells from base(i) = range.begin + (i * kWarps + warp) * kStep.
  const int span = range.end - range.begin - warp * S::kStep;
  const int n_steps = span > 0 ? (span + kWarps * S::kStep - 1) / (kWarps * S::kStep) : 0;
  // ASYNC: every lane copies its own 16-byte chunks of step i into stage i % kStages with
  // cp.async, kStages - 1 steps ahead, and reads back only what it copied (no warp sync).
  auto stage_ptr = [&](int i) { return async_buf + (warp * S::kStages + i % S::kStages) * S::kStageVecs * 32; };
  auto issue = [&](int i) {
    if constexpr (ASYNC) {
      if (i < n_steps) {
        const int base = range.begin + (i * kWarps + warp) * S::kStep;
        uint4* stage = stage_ptr(i);
#pragma unroll
        for (int u = 0; u < S::kUnroll; ++u) {
          const int j = base + u * S::kRpw + rs;
          if (j < range.end) {
            const int blk = blocks[pow2_bs ? j >> bs_shift : j / bs];
            const int64_t cell = int64_t{blk} * bs + (pow2_bs ? j & (bs - 1) : j % bs);
            const int64_t row_id = cell * n_kv + kvh;
            const uint4* kp = reinterpret_cast<const uint4*>(kbase + row_id * HDK * S::kBytes);
            const uint4* vp = reinterpret_cast<const uint4*>(vbase + row_id * p.v_row_stride * S::kBytes);
#pragma unroll
            for (int v = 0; v < S::kVplK; ++v)
              if (S::in_k(v, li)) cp_async16(&stage[(u * S::kVplK + v) * 32 + lane], kp + v * S::kLpr + li);
#pragma unroll
            for (int v = 0; v < S::kVplV; ++v)
              if (S::in_v(v, li))
                cp_async16(&stage[(S::kUnroll * S::kVplK + u * S::kVplV + v) * 32 + lane], vp + v * S::kLpr + li);
            // The metadata this step will read: in L1 by then.
            if constexpr (KV == math::KvElem::E4M3) {
              if (p.scale_mode == math::KvScaleMode::Ue8m0Per64) {
                prefetch_l1(p.maybe_k_scale_u8 + row_id * (HDK / 64) + S::dim(0, li, 0) / 64);
                prefetch_l1(p.maybe_v_scale_u8 + row_id * p.v_scale_row_stride + S::dim(0, li, 0) / 64);
              } else {
                prefetch_l1(p.maybe_k_scale_f32 + row_id);
                prefetch_l1(p.maybe_v_scale_f32 + row_id);
              }
            }
            if (li == 0) {
              if (p.maybe_valid) prefetch_l1(p.maybe_valid + cell);
              if (p.maybe_positions) prefetch_l1(p.maybe_positions + cell);
            }
          }
        }
      }
      cp_async_commit();  // one group per step, empty or not, so wait counts stay exact
    }
  };
  if constexpr (ASYNC) {
#pragma unroll
    for (int i = 0; i < S::kStages - 1; ++i) issue(i);
  }
  (void)issue;
  (void)stage_ptr;

  for (int i = 0; i < n_steps; ++i) {
    const int base = range.begin + (i * kWarps + warp) * S::kStep;
    if constexpr (ASYNC) {
      issue(i + S::kStages - 1);
      cp_async_wait<S::kStages - 1>();  // step i's group has landed
    }
    const uint4* stage = ASYNC ? stage_ptr(i) : nullptr;
    uint4 kraw[S::kUnroll][S::kVplK], vraw[S::kUnroll][S::kVplV];
    float ksc[S::kUnroll][S::kVplK], vsc[S::kUnroll][S::kVplV];  // e4m3: each vector's scale
    int kpos[S::kUnroll];
    bool vis[S::kUnroll];
    // ---- this step's cells (sync: issue every load of the step first)
#pragma unroll
    for (int u = 0; u < S::kUnroll; ++u) {
      const int j = base + u * S::kRpw + rs;
      vis[u] = false;
      kpos[u] = 0;
#pragma unroll
      for (int v = 0; v < S::kVplK; ++v) kraw[u][v] = make_uint4(0, 0, 0, 0), ksc[u][v] = 1.0f;
#pragma unroll
      for (int v = 0; v < S::kVplV; ++v) vraw[u][v] = make_uint4(0, 0, 0, 0), vsc[u][v] = 1.0f;
      if (j < range.end) {
        const int blk = blocks[pow2_bs ? j >> bs_shift : j / bs];
        const int slot = pow2_bs ? j & (bs - 1) : j % bs;
        const int64_t cell = int64_t{blk} * bs + slot;
        vis[u] = attention_cell_visible(p, cell, q_pos + pos_off);  // == key position vs q_pos
        if (vis[u]) {
          const int64_t row_id = cell * n_kv + kvh;
          if constexpr (ASYNC) {
#pragma unroll
            for (int v = 0; v < S::kVplK; ++v)
              if (S::in_k(v, li)) kraw[u][v] = stage[(u * S::kVplK + v) * 32 + lane];
#pragma unroll
            for (int v = 0; v < S::kVplV; ++v)
              if (S::in_v(v, li)) vraw[u][v] = stage[(S::kUnroll * S::kVplK + u * S::kVplV + v) * 32 + lane];
          } else {
            const uint4* kp = reinterpret_cast<const uint4*>(kbase + row_id * HDK * S::kBytes);
            const uint4* vp = reinterpret_cast<const uint4*>(vbase + row_id * p.v_row_stride * S::kBytes);
#pragma unroll
            for (int v = 0; v < S::kVplK; ++v)
              if (S::in_k(v, li)) kraw[u][v] = __ldg(kp + v * S::kLpr + li);
#pragma unroll
            for (int v = 0; v < S::kVplV; ++v)
              if (S::in_v(v, li)) vraw[u][v] = __ldg(vp + v * S::kLpr + li);
          }
          if constexpr (KV == math::KvElem::E4M3) {
            if (p.scale_mode == math::KvScaleMode::Ue8m0Per64) {  // a 16-byte vector lies in one 64-dim block
#pragma unroll
              for (int v = 0; v < S::kVplK; ++v)
                if (S::in_k(v, li))
                  ksc[u][v] = math::ue8m0_decode(p.maybe_k_scale_u8[row_id * (HDK / 64) + S::dim(v, li, 0) / 64]);
#pragma unroll
              for (int v = 0; v < S::kVplV; ++v)
                if (S::in_v(v, li))
                  vsc[u][v] = math::ue8m0_decode(p.maybe_v_scale_u8[row_id * p.v_scale_row_stride + S::dim(v, li, 0) / 64]);
            } else {
              const float ks = p.maybe_k_scale_f32[row_id], vs = p.maybe_v_scale_f32[row_id];
#pragma unroll
              for (int v = 0; v < S::kVplK; ++v) ksc[u][v] = ks;
#pragma unroll
              for (int v = 0; v < S::kVplV; ++v) vsc[u][v] = vs;
            }
          }
          if (p.rope_on_read) kpos[u] = p.maybe_positions[cell] - pos_off;
        }
      }
    }
    // ---- scores
    float s[S::kUnroll][G];
#pragma unroll
    for (int u = 0; u < S::kUnroll; ++u) {
      float kf[E];
#pragma unroll
      for (int v = 0; v < S::kVplK; ++v) dequant16<KV>(kraw[u][v], kf + v * S::kVec);
      // One scale for the lane's whole row slice: applied to the dot product once. Else (rope on
      // read: a pair may straddle two scale blocks; several vectors a lane) to the elements first.
      float post_scale = ksc[u][0];
      if (S::kVplK > 1 || p.rope_on_read) {
#pragma unroll
        for (int v = 0; v < S::kVplK; ++v)
#pragma unroll
          for (int e = 0; e < S::kVec; ++e) kf[v * S::kVec + e] *= ksc[u][v];
        post_scale = 1.0f;
      }
      if (p.rope_on_read) {  // uniform branch: every lane takes part in the exchange
        float* rowbuf = &sm.kbuf[warp][rs * S::kRowPad];
#pragma unroll
        for (int v = 0; v < S::kVplK; ++v)
#pragma unroll
          for (int e = 0; e < S::kVec; ++e) rowbuf[S::dim(v, li, e)] = kf[v * S::kVec + e];
        __syncwarp();
#pragma unroll
        for (int v = 0; v < S::kVplK; ++v)
#pragma unroll
          for (int e = 0; e < S::kVec; ++e) {
            math::RopeDim rd;
            if (math::rope_dim(p.rope.layout, S::dim(v, li, e), &rd)) {
              float sn, cs;
              math::sincos_f32(math::rope_angle(static_cast<float>(kpos[u]), sm.freq[rd.pair]), &sn, &cs);
              float& x = kf[v * S::kVec + e];
              x = math::rope_rotated_dim(x, rowbuf[rd.partner], rd.second, cs * mag, sn * mag);
            }
          }
        __syncwarp();
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float part = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) part = fmaf(qr[g][e], kf[e], part);
        part *= post_scale;
#pragma unroll
        for (int off = S::kLpr / 2; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
        s[u][g] = vis[u] ? part : math::neg_inf_f32();
      }
    }
    // ---- one rescale per step, then the value pass
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mx = s[0][g];
#pragma unroll
      for (int u = 1; u < S::kUnroll; ++u) mx = math::max_f32(mx, s[u][g]);
      const float r = st[g].begin_tile(mx);
#pragma unroll
      for (int e = 0; e < EV; ++e) acc[g][e] *= r;
    }
#pragma unroll
    for (int u = 0; u < S::kUnroll; ++u) {
      float vf[EV];
#pragma unroll
      for (int v = 0; v < S::kVplV; ++v) dequant16<KV>(vraw[u][v], vf + v * S::kVec);  // zeros when masked
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float w = st[g].weight(s[u][g]);
        st[g].add(w);
#pragma unroll
        for (int v = 0; v < S::kVplV; ++v) {
          const float wv = w * vsc[u][v];
#pragma unroll
          for (int e = 0; e < S::kVec; ++e) acc[g][v * S::kVec + e] = fmaf(wv, vf[v * S::kVec + e], acc[g][v * S::kVec + e]);
        }
      }
    }
  }

  if constexpr (ASYNC) cp_async_wait<0>();

  // ---- merge the row groups of this warp
#pragma unroll
  for (int off = S::kLpr; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float mo = __shfl_xor_sync(0xffffffffu, st[g].m, off);
      const float lo = __shfl_xor_sync(0xffffffffu, st[g].l, off);
      const math::MergeFactors f = math::merge_states(st[g].m, st[g].l, mo, lo);
#pragma unroll
      for (int e = 0; e < EV; ++e) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], off);
        acc[g][e] = acc[g][e] * f.a + ao * f.b;
      }
    }
  }
  // ---- merge the warps through shared memory, write the normalized partial
  if (rs == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int v = 0; v < S::kVplV; ++v)
        if (S::in_v(v, li))
#pragma unroll
          for (int e = 0; e < S::kVec; ++e) sm.red[warp][g][S::dim(v, li, e)] = acc[g][v * S::kVec + e];
    if (li == 0)
#pragma unroll
      for (int g = 0; g < G; ++g) sm.m[warp][g] = st[g].m, sm.l[warp][g] = st[g].l;
  }
  __syncthreads();
  for (int i = tid; i < n_h * HDV; i += kThreads) {
    const int g = i / HDV, d = i % HDV;
    float mx = sm.m[0][g];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mx = math::max_f32(mx, sm.m[w][g]);
    float l = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = math::softmax_rescale(sm.m[w][g], mx);
      l += sm.l[w][g] * f;
      o += sm.red[w][g][d] * f;
    }
    const int64_t part = (int64_t{row} * p.n_q_heads + h0 + g) * p.num_splits + split;
    p.o_part[part * HDV + d] = l > 0.0f ? o / l : 0.0f;
    if (d == 0) p.lse_part[part] = l > 0.0f ? mx + math::log2_f32(l) : math::neg_inf_f32();
  }
}

template <int HDK, int HDV, math::KvElem KV, int G, bool ASYNC>
__global__ void __launch_bounds__(kThreads) paged_decode_kernel(const PagedAttentionParams p, int chunks) {
  __shared__ DecodeSmemOf<HDK, HDV, KV, G> sm;
  extern __shared__ uint4 async_buf[];  // ASYNC: [kWarps][kStages][kStageVecs][32 lanes]
  const int row = blockIdx.x / p.num_splits, split = blockIdx.x % p.num_splits;
  const int kvh = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  decode_body<HDK, HDV, KV, G, ASYNC>(p, sm, async_buf, row, split, kvh, chunk);
}

// Launch, or (blocks_per_sm != nullptr) only report how many CTAs of this kernel fit on an SM.
template <int HDK, int HDV, math::KvElem KV, int G, bool ASYNC>
void launch_paged(const PagedAttentionParams& p, int chunks, dim3 grid, cudaStream_t stream, int* blocks_per_sm) {
  using S = DecodeShape<HDK, HDV, KV, G>;
  constexpr auto kernel = paged_decode_kernel<HDK, HDV, KV, G, ASYNC>;
  const size_t dyn = ASYNC ? size_t{kWarps} * S::kStages * S::kStageVecs * 32 * sizeof(uint4) : 0;
  if constexpr (ASYNC) smem_opt_in(kernel, dyn, p.device);
  if (blocks_per_sm) {
    KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, kThreads, dyn));
    return;
  }
  kernel<<<grid, kThreads, dyn, stream>>>(p, chunks);
  KVCORE_CUDA_CHECK_LAUNCH("paged_decode_kernel");
}

// Head dims and formats that also get the cp.async pipeline (the benchmarked shapes).
template <int HDK, int HDV, math::KvElem KV>
constexpr bool has_async() {
  return HDK == 128 && HDV == 128 && KV != math::KvElem::F32;
}

// Instantiated per (K, V) head-dim pair in instantiations/attention_decode_d*.cu.
template <int HDK, int HDV>
void launch_paged_hd(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream,
                     int* blocks_per_sm = nullptr);

// Heads per CTA (hd: K's head dim): the largest value registers (q and accumulators:
// G * (kEplK + kEplV)) and shared memory (4 warps x G x head_dim floats) allow.
constexpr int max_heads_per_cta(int hd, math::KvElem kv) {
  return hd <= 128 ? (kv == math::KvElem::E4M3 ? 4 : 8) : hd <= 256 ? 4 : 2;
}

// ---- per-head_dim launchers (each attention_decode_d*.cu instantiates one head-dim pair) ----
template <int HDK, int HDV, math::KvElem KV, int G>
void launch_v(const PagedAttentionParams& p, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  if constexpr (has_async<HDK, HDV, KV>()) {
    if (p.kernel_variant != 1) return launch_paged<HDK, HDV, KV, G, true>(p, chunks, grid, stream, q);
  }
  launch_paged<HDK, HDV, KV, G, false>(p, chunks, grid, stream, q);
}

template <int HDK, int HDV, math::KvElem KV>
void launch_g(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  if (G == 1) return launch_v<HDK, HDV, KV, 1>(p, chunks, grid, stream, q);
  if constexpr (max_heads_per_cta(HDK, KV) >= 4) {
    if (G == 4) return launch_v<HDK, HDV, KV, 4>(p, chunks, grid, stream, q);
  }
  if constexpr (max_heads_per_cta(HDK, KV) == 8) {
    if (G == 8) return launch_v<HDK, HDV, KV, 8>(p, chunks, grid, stream, q);
  }
  if constexpr (max_heads_per_cta(HDK, KV) == 2) {
    if (G == 2) return launch_v<HDK, HDV, KV, 2>(p, chunks, grid, stream, q);
  }
  throw Error(ErrorCode::NotSupported, detail::concat("attention: no kernel for ", G, " heads per CTA at head_dim ", HDK));
}

// The body of every launch_paged_hd<HDK, HDV> specialization: dispatch on the pool's element
// type. e4m3 pages need head dims that are multiples of 64 (one UE8M0 scale per 64 values;
// ops::attention_cannot_read refuses the others before a launch).
template <int HDK, int HDV>
void launch_paged_hd_all(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  switch (p.kv_elem) {
    case math::KvElem::F32: return launch_g<HDK, HDV, math::KvElem::F32>(p, G, chunks, grid, stream, q);
    case math::KvElem::F16: return launch_g<HDK, HDV, math::KvElem::F16>(p, G, chunks, grid, stream, q);
    case math::KvElem::BF16: return launch_g<HDK, HDV, math::KvElem::BF16>(p, G, chunks, grid, stream, q);
    case math::KvElem::E4M3:
      if constexpr (HDK % 64 == 0 && HDV % 64 == 0) {
        return launch_g<HDK, HDV, math::KvElem::E4M3>(p, G, chunks, grid, stream, q);
      } else {
        break;
      }
  }
  throw Error(ErrorCode::NotSupported, detail::concat("attention: no e4m3 kernel for head_dim ", HDK, " / v_head_dim ", HDV));
}

}  // namespace kvcore::ops::cuda::attn
