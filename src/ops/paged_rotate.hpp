// Applying pending rope-stored shifts to every layer's K pool in ONE launch
// (PagedCache::prepare). kv_rotate_blocks rotates one layer per call: each
// call recomputes the cos/sin of every (cell, pair) and is its own launch with
// its own tail. Here a thread owns one (listed cell, group of 8 pairs) and a
// run of kRotateLayersPerThread layers: it computes its 8 angles once and
// applies them to every head of those layers, loading a batch of heads (two
// 16-byte vectors each) before storing any, so a thread keeps
// kRotateHeadBatch * 32 bytes in flight.
//
// The body is a host+device function of (params, thread index): the CUDA
// kernel is a thin wrapper, and tests/paged_rotate_layers_test.cpp runs every
// thread index on the host and compares the bytes with the CPU kernel of
// kv_rotate_blocks, layer by layer. Same per-pair math as kv_rotate_blocks'
// vectorized path (sincos_f32 of the f32 angle delta * w, rotate_pair, the same
// conversions): identical bytes on both backends.
#pragma once
#include <cstdint>
#include <span>
#include <type_traits>

#include "kvcore/ops/kv_store.hpp"
#include "kvcore/stream.hpp"
#include "ops/kv_store_vec.hpp"

namespace kvcore {

inline constexpr int32_t kRotateMaxLayers = 64;       // layers per launch
inline constexpr int32_t kRotateLayersPerThread = 8;  // angles computed once per 8 layers
inline constexpr int32_t kRotateHeadBatch = 2;        // heads loaded before any is stored

struct PagedRotateParams {
  void* pools[kRotateMaxLayers] = {};  // per layer: [num_cells, n_heads, row_width] of the format's dtype
  int32_t n_layers = 0;
  KvFormat format = KvFormat::F16;     // F32, F16 or BF16; the CPU pass also Fp8 and Dsv4Row
  int32_t n_heads = 0, row_width = 0, block_size = 0;
  int32_t head_dim = 0;                           // FP8 rows (the CPU pass): logical dims per row
  uint8_t* scales[kRotateMaxLayers] = {};         // Fp8 (the CPU pass): per layer, [num_cells, n_heads, head_dim / 64]
  const int32_t* blocks = nullptr;     // [n_blocks]
  int32_t n_blocks = 0;
  const int32_t* cell_delta = nullptr;  // [num_cells]; 0: nothing to do
  math::RopeTable rope{};               // shared by every layer of the launch
};

// Threads of one launch: (layer run, listed cell, pair group), the group fastest.
KVCORE_HD int64_t paged_rotate_threads(const PagedRotateParams& p) {
  const int64_t runs = (p.n_layers + kRotateLayersPerThread - 1) / kRotateLayersPerThread;
  return runs * p.n_blocks * p.block_size * (p.rope.layout.n_pairs() / 8);
}

// Where a thread keeps its 8 cos/sin: local arrays on the host; on the device a
// column of shared memory (computed one pair at a time, so the double-precision
// sincos never holds 8 angles' temporaries in registers beside the loaded rows).
struct PagedRotateLocalAngles {
  float c[8], s[8];
  KVCORE_HD float& cos(int k) { return c[k]; }
  KVCORE_HD float& sin(int k) { return s[k]; }
};

template <KvFormat F, class Angles>
KVCORE_HD void paged_rotate_unit(const PagedRotateParams& p, int64_t tid, Angles& ang) {
  using T = typename std::conditional<F == KvFormat::F32, float, uint16_t>::type;
  using V = kvvec::Vec8<T>;
  const math::RopeLayout& l = p.rope.layout;
  const int32_t groups = l.n_pairs() / 8;
  const int64_t listed = static_cast<int64_t>(p.n_blocks) * p.block_size;
  if (tid >= paged_rotate_threads(p)) return;
  const int32_t g = static_cast<int32_t>(tid % groups);
  const int64_t rest = tid / groups;
  const int64_t cl = rest % listed;
  const int32_t run = static_cast<int32_t>(rest / listed);
  const int64_t cell = static_cast<int64_t>(p.blocks[cl / p.block_size]) * p.block_size + cl % p.block_size;
  const int32_t delta = p.cell_delta[cell];
  if (delta == 0) return;
  const float pos = static_cast<float>(delta);
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int k = 0; k < 8; ++k) math::sincos_f32(math::rope_angle(pos, p.rope.freq[8 * g + k]), &ang.sin(k), &ang.cos(k));
  // NeoX: dims first + 8g .. +8 and first + n_pairs + 8g .. +8; interleaved: 16 dims from first + 16g.
  const int32_t d0 = l.first_dim + (l.interleaved ? 16 * g : 8 * g);
  const int32_t d1 = l.interleaved ? d0 + 8 : l.first_dim + l.n_pairs() + 8 * g;
  const bool interleaved = l.interleaved != 0;
  const int32_t l1 = (run + 1) * kRotateLayersPerThread < p.n_layers ? (run + 1) * kRotateLayersPerThread : p.n_layers;
  for (int32_t layer = run * kRotateLayersPerThread; layer < l1; ++layer) {
    T* cell_rows = static_cast<T*>(p.pools[layer]) + cell * p.n_heads * p.row_width;
    for (int32_t h0 = 0; h0 < p.n_heads; h0 += kRotateHeadBatch) {
      const int32_t nh = p.n_heads - h0 < kRotateHeadBatch ? p.n_heads - h0 : kRotateHeadBatch;
      V a[kRotateHeadBatch], c[kRotateHeadBatch];
      // every load of the batch before any store: the batch's bytes are in flight together
KVCORE_VEC_UNROLL
      for (int32_t i = 0; i < kRotateHeadBatch; ++i) {
        if (i < nh) {
          const T* row = cell_rows + (h0 + i) * p.row_width;
          a[i] = *reinterpret_cast<const V*>(row + d0);
          c[i] = *reinterpret_cast<const V*>(row + d1);
        }
      }
KVCORE_VEC_UNROLL
      for (int32_t i = 0; i < kRotateHeadBatch; ++i) {
        if (i < nh) {
          float x[16];
KVCORE_VEC_UNROLL
          for (int k = 0; k < 8; ++k) {
            x[k] = kvvec::to_float<F>(a[i].v[k]);
            x[8 + k] = kvvec::to_float<F>(c[i].v[k]);
          }
          if (interleaved) {
KVCORE_VEC_UNROLL
            for (int k = 0; k < 8; ++k) math::rotate_pair(x[2 * k], x[2 * k + 1], ang.cos(k), ang.sin(k));
          } else {
KVCORE_VEC_UNROLL
            for (int k = 0; k < 8; ++k) math::rotate_pair(x[k], x[8 + k], ang.cos(k), ang.sin(k));
          }
KVCORE_VEC_UNROLL
          for (int k = 0; k < 8; ++k) {
            a[i].v[k] = kvvec::from_float<F>(x[k]);
            c[i].v[k] = kvvec::from_float<F>(x[8 + k]);
          }
          T* row = cell_rows + (h0 + i) * p.row_width;
          *reinterpret_cast<V*>(row + d0) = a[i];
          *reinterpret_cast<V*>(row + d1) = c[i];
        }
      }
    }
  }
}

// Rotate the listed blocks of every pool in `pools` (one model's K pools, one per layer,
// all of one format and shape) by cell_delta, each layer with ropes[layer]. On CUDA, when
// every layer's pool takes kv_rotate_blocks' vectorized path and all layers share one
// table, launches cover up to kRotateMaxLayers layers each; on the CPU (SIMD on) one pass
// over every layer of any format with one shared table (cpu/paged_rotate_simd.hpp);
// otherwise (CUDA FP8 / DSV4 rows, unaligned rows, per-layer tables) it is
// kv_rotate_blocks, layer by layer. Same bytes either way.
void kv_rotate_blocks_layers(std::span<const KvPool> pools, const TensorRef& blocks, const TensorRef& cell_delta,
                             std::span<const math::RopeTable> ropes, Stream stream = {});

// Would kv_rotate_blocks_layers take the one-launch path? (exposed for tests)
bool paged_rotate_fused_ok(std::span<const KvPool> pools, std::span<const math::RopeTable> ropes);
// Would it take the CPU's one pass over every layer, for pools and tables that pass
// kv_rotate_blocks' checks? (exposed for tests)
bool paged_rotate_cpu_ok(std::span<const KvPool> pools, std::span<const math::RopeTable> ropes);

namespace ops::cuda {
void paged_rotate_layers(const PagedRotateParams& p, Stream stream);
}  // namespace ops::cuda

}  // namespace kvcore
