// Shared pieces of the CPU replays of the CUDA shift kernels' plans (shift_chain_test,
// shift_sweep_test): the tensors a replay shifts, their random contents,
// and the op's parameters over them.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"
#include "ops/shift_params.hpp"

namespace shift_replay {

using namespace kvcore;

struct Tensor {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> scales;  // FP8 keys
  size_t lead = 0;              // bytes before the tensor's base inside `bytes` (moves its phase mod 16)
  ops::ShiftTensorParams p;
};

// The rotation tables of every layer, as the op passes them.
struct Tables {
  std::vector<math::RopeLayout> layouts;
  std::vector<int32_t> pair_offset;
  std::vector<float> cos_t, sin_t;
  explicit Tables(int layers) : layouts(layers), pair_offset(layers) {}
};

// Random finite 16-bit / 32-bit values for the rotated dims (DeepSeek-V4 rows: the rope
// tail), random bytes elsewhere.
inline void fill(std::mt19937& rng, Tensor& t) {
  for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
  if (t.p.kind == ops::ShiftKind::Copy) return;
  std::uniform_real_distribution<float> unit(-2.f, 2.f);
  uint8_t* base = t.bytes.data() + t.lead;
  const int64_t row = int64_t{t.p.n_heads} * t.p.head_bytes;
  for (int64_t tok = 0; tok * t.p.token_stride + row <= static_cast<int64_t>(t.bytes.size() - t.lead); ++tok) {
    uint8_t* r = base + tok * t.p.token_stride;
    if (t.p.kind == ops::ShiftKind::F32) {
      for (int64_t i = 0; i < row / 4; ++i) {
        const float v = unit(rng);
        std::memcpy(r + 4 * i, &v, 4);
      }
    } else {
      const int64_t lo = t.p.kind == ops::ShiftKind::Dsv4 ? math::Dsv4RowLayout::kRopeOffset : 0;
      const int64_t hi = t.p.kind == ops::ShiftKind::Dsv4 ? lo + 2 * math::Dsv4RowLayout::kRope : row;
      for (int64_t i = lo / 2; i < hi / 2; ++i) {
        const float v = unit(rng);
        const uint16_t h = t.p.kind == ops::ShiftKind::F16 ? math::f32_to_f16_bits(v) : math::f32_to_bf16_bits(v);
        std::memcpy(r + 2 * i, &h, 2);
      }
    }
  }
}

// The op's parameters over `v`: each tensor's base (and scales) set inside its own bytes,
// `tp` holding the tensor parameters the result points at. Cfg: layers, length, n_keep, n_discard.
template <class Cfg>
ops::ShiftDenseParams params(std::vector<Tensor>& v, std::vector<ops::ShiftTensorParams>& tp, const Tables& tab,
                             const Cfg& cfg) {
  tp.clear();
  for (auto& t : v) {
    t.p.base = t.bytes.data() + t.lead;
    t.p.maybe_scales = t.scales.empty() ? nullptr : t.scales.data();
    tp.push_back(t.p);
  }
  ops::ShiftDenseParams p;
  p.tensors = tp.data();
  p.n_tensors = static_cast<int32_t>(tp.size());
  p.layouts = tab.layouts.data();
  p.pair_offset = tab.pair_offset.data();
  p.cos_t = tab.cos_t.data();
  p.sin_t = tab.sin_t.data();
  p.n_layers = cfg.layers;
  p.n_keep = cfg.n_keep;
  p.n_discard = cfg.n_discard;
  p.n_moved = cfg.length - cfg.n_keep - cfg.n_discard;
  return p;
}

// After a replay: every byte of the moved tokens' rows written exactly once (`writes` counts
// the stores per byte), nothing else written, and every tensor equal to the CPU op's `ref`.
inline void check_written_once_and_equal(const std::vector<Tensor>& ts, const std::vector<Tensor>& ref,
                                         const std::vector<std::vector<uint8_t>>& writes, int64_t n_keep,
                                         int64_t n_moved) {
  for (size_t i = 0; i < ts.size(); ++i) {
    const ops::ShiftTensorParams& t = ts[i].p;
    const int64_t row = int64_t{t.n_heads} * t.head_bytes;
    for (int64_t x = 0; x < static_cast<int64_t>(ts[i].bytes.size()); ++x) {
      const int64_t y = x - static_cast<int64_t>(ts[i].lead);
      const int64_t tok = y < 0 ? -1 : y / t.token_stride, col = y < 0 ? 0 : y % t.token_stride;
      const bool moved = tok >= n_keep && tok < n_keep + n_moved && col < row;
      ASSERT_EQ(writes[i][x], moved ? 1 : 0) << "tensor " << i << " token " << tok << " byte " << col;
    }
    ASSERT_EQ(ts[i].bytes, ref[i].bytes) << "tensor " << i << " (kind " << int(t.kind) << ") differs from the CPU op";
  }
}

}  // namespace shift_replay
