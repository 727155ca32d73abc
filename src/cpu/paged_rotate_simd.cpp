// Pending rope-stored shifts of every layer's K pool on the CPU, with SIMD
// (PagedCache::prepare through kv_rotate_blocks_layers): all layers share one table, so a
// cell's cos/sin are computed once (simd_rope-inl.h) and applied to every layer, instead
// of once per layer as kv_rotate_blocks does. Work goes a listed block at a time: the
// block's cos/sin first, then each layer's block rows, which are contiguous. The bytes of
// kv_rotate_blocks' SIMD path layer by layer: the same cos/sin and RotatePairs per head;
// FP8 rows (Fp8, Dsv4Row) decode the rotated groups, rotate and re-encode them with fresh
// scales per layer (RotateFp8Row, the function kv_rotate_blocks calls).
#include "cpu/simd_config.hpp"
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/paged_rotate_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/paged_rotate_simd.hpp"
#include "cpu/simd_fp8_rotate-inl.h"
#include "cpu/simd_rope-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcore::ops::cpu::HWY_NAMESPACE {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 17;  // rotated elements below which one thread does the work

// Layer `layer`'s rows of cell first + c (every head), rotated in place by cos cs, sin sn.
template <class T>
HWY_INLINE void RotateCell(const PagedRotateParams& p, int32_t layer, int64_t first, int32_t c, const float* cs,
                           const float* sn) {
  const int64_t cell_elems = int64_t{p.n_heads} * p.row_width;
  T* rows = static_cast<T*>(p.pools[layer]) + (first + c) * cell_elems;
  for (int32_t h = 0; h < p.n_heads; ++h) {
    T* row = rows + int64_t{h} * p.row_width;
    if constexpr (std::is_same_v<T, uint8_t>) {
      const int64_t row_index = (first + c) * p.n_heads + h;
      uint8_t* scales = p.scales[layer] ? p.scales[layer] + row_index * (p.head_dim / math::kFp8Block) : nullptr;
      RotateFp8Row(p.format, row, scales, p.head_dim, p.rope.layout, cs, sn);
    } else {
      RotatePairs(p.rope.layout, row, row, cs, sn, true);  // shift angles: |cos|, |sin| <= 1
    }
  }
}

// T: the pool's element type (uint8_t: FP8 rows, Fp8 or Dsv4Row).
template <class T>
void RotateBlocks(const PagedRotateParams& p) {
  const math::RopeLayout& l = p.rope.layout;
  const int32_t n_pairs = l.n_pairs();
  const int32_t padded = (n_pairs + 15) / 16 * 16;
  std::vector<float> freq(static_cast<size_t>(padded), 0.0f);
  std::memcpy(freq.data(), p.rope.freq, sizeof(float) * n_pairs);
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
        for (int32_t c = 0; c < p.block_size; ++c) {
          if (p.cell_delta[first + c] == 0) continue;
          const float* cs = angles.data() + int64_t{c} * 2 * padded;
          RotateCell<T>(p, layer, first, c, cs, cs + padded);
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
    case KvFormat::Fp8:
    case KvFormat::Dsv4Row: return RotateBlocks<uint8_t>(p);
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
