// Pending rope-stored shifts of every layer's K pool on the CPU, with SIMD
// (PagedCache::prepare through kv_rotate_blocks_layers): all layers share one table, so a
// cell's cos/sin are computed once (simd_rope-inl.h) and applied to every layer, instead
// of once per layer as kv_rotate_blocks does. Work goes a listed block at a time: the
// block's cos/sin first, then each layer's block rows, which are contiguous. The bytes of
// kv_rotate_blocks' SIMD path layer by layer: the same cos/sin and RotatePairs per head.
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/paged_rotate_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <cstring>
#include <vector>

#include "cpu/paged_rotate_simd.hpp"
#include "cpu/simd_rope-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 17;  // rotated elements below which one thread does the work

template <class T>
void RotateBlocks(const PagedRotateParams& p) {
  const math::RopeLayout& l = p.rope.layout;
  const int32_t n_pairs = l.n_pairs();
  const int32_t padded = (n_pairs + 15) / 16 * 16;
  std::vector<float> freq(static_cast<size_t>(padded), 0.0f);
  std::memcpy(freq.data(), p.rope.freq, sizeof(float) * n_pairs);
  const int64_t cell_elems = int64_t{p.n_heads} * p.row_width;
  const int64_t work = int64_t{p.n_blocks} * p.block_size * p.n_layers * p.n_heads * l.n_rot;
#pragma omp parallel if (work >= kParallelMin)
  {
    // cos, sin of each cell of the block: [block_size][2][padded]
    std::vector<float> angles(static_cast<size_t>(p.block_size) * 2 * padded);
#pragma omp for schedule(static)
    for (int32_t b = 0; b < p.n_blocks; ++b) {
      const int64_t first = int64_t{p.blocks[b]} * p.block_size;
      for (int32_t c = 0; c < p.block_size; ++c) {
        const int32_t delta = p.cell_delta[first + c];
        float* cs = angles.data() + int64_t{c} * 2 * padded;
        if (delta != 0) RopeCosSinRow(freq.data(), n_pairs, static_cast<float>(delta), 1.0f, cs, cs + padded);
      }
      for (int32_t layer = 0; layer < p.n_layers; ++layer) {
        T* rows = static_cast<T*>(p.pools[layer]) + first * cell_elems;
        for (int32_t c = 0; c < p.block_size; ++c) {
          if (p.cell_delta[first + c] == 0) continue;
          const float* cs = angles.data() + int64_t{c} * 2 * padded;
          for (int32_t h = 0; h < p.n_heads; ++h) {
            T* row = rows + c * cell_elems + int64_t{h} * p.row_width;
            RotatePairs(l, row, row, cs, cs + padded, true);  // shift angles: |cos|, |sin| <= 1
          }
        }
      }
    }
  }
}

}  // namespace

void PagedRotateLayers(const PagedRotateParams& p) {
  switch (p.format) {
    case KvFormat::F32: return RotateBlocks<float>(p);
    case KvFormat::F16: return RotateBlocks<f16>(p);
    case KvFormat::BF16: return RotateBlocks<bf16>(p);
    default: return;  // not served (paged_rotate_layers_cpu_serves)
  }
}

}  // namespace kvcore::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcore::ops::cpu {
HWY_EXPORT(PagedRotateLayers);
void paged_rotate_layers_simd(const PagedRotateParams& p) { HWY_DYNAMIC_DISPATCH(PagedRotateLayers)(p); }
}  // namespace kvcore::ops::cpu
#endif  // HWY_ONCE
