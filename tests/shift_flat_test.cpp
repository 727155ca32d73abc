// Runs the CUDA flat kernel's items on the CPU (src/cuda/shift_flat.hpp): the same
// item decoding, batches of kFlatBatch loads before their stores, the same register
// rotation, over random layouts (f16 / bf16 / f32 K, NeoX and interleaved, partial
// rotary at head and tail, DeepSeek-V4 rows in 16-byte range chunks at both phases,
// V of odd sizes). Shifts without overlap only (the kernel's domain): every moved
// byte must be written exactly once, nothing else touched, and the bytes must equal
// the CPU op's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/shift_flat.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/half.hpp"

using namespace kvcore;
using namespace kvcore::cuda;

namespace {

struct Tensor {
  std::vector<uint8_t> bytes;
  ops::ShiftTensorParams p;
  size_t lead = 0;  // bytes before the tensor's base inside `bytes` (moves its phase mod 16)
};

struct Config {
  int layers = 1;
  int64_t cap = 0, length = 0, n_keep = 0, n_discard = 0;
  bool dsv4 = false;  // every K a DeepSeek-V4 row (1 head), no V; odd n_discard: phases differ
  int n_threads = 64;
};

// Random finite 16-bit / 32-bit values for the rotated dims, random bytes elsewhere.
void fill(std::mt19937& rng, Tensor& t) {
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

void run(const Config& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> ts;
  std::vector<math::RopeLayout> layouts(cfg.layers);
  std::vector<int32_t> pair_offset(cfg.layers);
  std::vector<float> cos_t, sin_t;
  std::uniform_real_distribution<float> angle(-3.f, 3.f);
  for (int l = 0; l < cfg.layers; ++l) {
    Tensor k;
    math::RopeLayout& lay = layouts[l];
    if (cfg.dsv4) {
      k.p.kind = ops::ShiftKind::Dsv4;
      k.p.head_bytes = math::Dsv4RowLayout::kBytes;
      k.p.n_heads = 1;
      lay.n_rot = 64;
      lay.first_dim = math::Dsv4RowLayout::kNope;
      lay.interleaved = rng() % 4 != 0;  // NeoX tails take the unit path
      k.p.token_stride = k.p.head_bytes + (rng() % 4 == 0 ? 8 : 0);  // padded rows: the unit path
      k.lead = 8 * (rng() % 2);
    } else {
      const int form = int(rng() % 3);
      k.p.kind = form == 0 ? ops::ShiftKind::F16 : form == 1 ? ops::ShiftKind::BF16 : ops::ShiftKind::F32;
      const int hd = 16 * (1 + int(rng() % 8));
      const int eb = form == 2 ? 4 : 2;
      k.p.head_bytes = hd * eb;
      k.p.n_heads = 1 + int(rng() % 4);
      lay.n_rot = rng() % 2 ? hd : std::min(hd, 16 * (1 + int(rng() % (hd / 16))));
      lay.first_dim = rng() % 2 ? 0 : hd - lay.n_rot;
      lay.interleaved = int(rng() % 2);
      k.p.token_stride = int64_t{k.p.n_heads} * k.p.head_bytes + 16 * int(rng() % 2);
    }
    k.p.layer = l;
    ts.push_back(std::move(k));
    pair_offset[l] = static_cast<int32_t>(cos_t.size());
    for (int i = 0; i < lay.n_pairs(); ++i) {
      const float a = angle(rng);
      cos_t.push_back(std::cos(a)), sin_t.push_back(std::sin(a));
    }
    if (!cfg.dsv4 && rng() % 4 != 0) {  // a V tensor, sometimes with 8-byte rows only
      Tensor v;
      v.p.kind = ops::ShiftKind::Copy;
      v.p.n_heads = 1 + int(rng() % 4);
      v.p.head_bytes = rng() % 2 ? 16 * (1 + int(rng() % 16)) : 8 * (1 + 2 * int(rng() % 8));
      v.p.token_stride = int64_t{v.p.n_heads} * v.p.head_bytes;
      v.lead = 8 * (rng() % 2);
      v.p.layer = l;
      ts.push_back(std::move(v));
    }
  }
  for (auto& t : ts) {
    t.bytes.resize(t.lead + cfg.cap * t.p.token_stride);
    fill(rng, t);
  }
  std::vector<Tensor> ref = ts;
  auto params = [&](std::vector<Tensor>& v, std::vector<ops::ShiftTensorParams>& tp) {
    tp.clear();
    for (auto& t : v) {
      t.p.base = t.bytes.data() + t.lead;
      tp.push_back(t.p);
    }
    ops::ShiftDenseParams p;
    p.tensors = tp.data();
    p.n_tensors = static_cast<int32_t>(tp.size());
    p.layouts = layouts.data();
    p.pair_offset = pair_offset.data();
    p.cos_t = cos_t.data();
    p.sin_t = sin_t.data();
    p.n_layers = cfg.layers;
    p.n_keep = cfg.n_keep;
    p.n_discard = cfg.n_discard;
    p.n_moved = cfg.length - cfg.n_keep - cfg.n_discard;
    return p;
  };
  std::vector<ops::ShiftTensorParams> tp_ref, tp;
  cpu::shift_dense(params(ref, tp_ref));
  const ops::ShiftDenseParams p = params(ts, tp);
  ASSERT_GE(p.n_discard, p.n_moved) << "the flat kernel is for shifts without overlap";

  const shift_plan::Plan plan = shift_plan::make_plan(p);
  const auto launches = shift_flat::make_launches(plan);
  ASSERT_FALSE(launches.empty()) << "the flat kernel must handle these layouts";

  std::vector<std::vector<uint8_t>> writes(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) writes[i].assign(ts[i].bytes.size(), 0);
  auto tensor_of = [&](const uint8_t* ptr) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ptr >= ts[i].bytes.data() && ptr < ts[i].bytes.data() + ts[i].bytes.size()) return i;
    ADD_FAILURE() << "a store outside every tensor";
    return size_t{0};
  };
  int range_streams = 0;
  for (const auto& P : launches) {
    for (int32_t s = 0; s < P->n_streams; ++s) {
      const shift_flat::Stream& st = P->streams[s];
      range_streams += st.shape == shift_flat::kRange;
      const int64_t stride = cfg.n_threads;  // threads of this tensor
      for (int64_t t = 0; t < stride; ++t) {
        for (int64_t i0 = t; i0 < st.n_items; i0 += shift_flat::kFlatBatch * stride) {
          shift_flat::Item it[shift_flat::kFlatBatch];
          shift_chain::Chunk a[shift_flat::kFlatBatch], b[shift_flat::kFlatBatch];
          for (int k = 0; k < shift_flat::kFlatBatch; ++k) {
            const int64_t i = i0 + k * stride;
            if (i >= st.n_items) continue;
            it[k] = shift_flat::decode(st, i);
            ASSERT_TRUE(it[k].bytes == 1 || it[k].bytes == 2 || it[k].bytes == 4 || it[k].bytes == 8 || it[k].bytes == 16);
            ASSERT_EQ(reinterpret_cast<uintptr_t>(it[k].src) % it[k].bytes, 0u) << "misaligned load";
            a[k] = b[k] = shift_chain::Chunk{};
            std::memcpy(a[k].w, it[k].src, it[k].bytes);
            if (it[k].partner) std::memcpy(b[k].w, it[k].src + it[k].partner, it[k].bytes);
          }
          for (int k = 0; k < shift_flat::kFlatBatch; ++k) {
            if (i0 + k * stride >= st.n_items) continue;
            shift_flat::rotate(st, it[k], a[k], b[k], P->cos_t, P->sin_t);
            uint8_t* dst = it[k].src - st.shift;
            ASSERT_EQ(reinterpret_cast<uintptr_t>(dst) % it[k].bytes, 0u) << "misaligned store";
            for (int half = 0; half < (it[k].partner ? 2 : 1); ++half) {
              uint8_t* d = dst + half * it[k].partner;
              std::memcpy(d, half ? b[k].w : a[k].w, it[k].bytes);
              const size_t ti = tensor_of(d);
              for (int q = 0; q < it[k].bytes; ++q) ++writes[ti][d - ts[ti].bytes.data() + q];
            }
          }
        }
      }
    }
  }
  if (cfg.dsv4 && cfg.n_discard % 2 == 0) {  // 584 * D = 0 mod 16: same phase
    EXPECT_GT(range_streams, 0) << "no DeepSeek-V4 tensor took the 16-byte range path";
  }

  const int64_t n_moved = p.n_moved;
  for (size_t i = 0; i < ts.size(); ++i) {
    const ops::ShiftTensorParams& t = ts[i].p;
    const int64_t row = int64_t{t.n_heads} * t.head_bytes;
    for (int64_t x = 0; x < static_cast<int64_t>(ts[i].bytes.size()); ++x) {
      const int64_t y = x - static_cast<int64_t>(ts[i].lead);
      const int64_t tok = y < 0 ? -1 : y / t.token_stride, col = y < 0 ? 0 : y % t.token_stride;
      const bool moved = tok >= cfg.n_keep && tok < cfg.n_keep + n_moved && col < row;
      ASSERT_EQ(writes[i][x], moved ? 1 : 0) << "tensor " << i << " token " << tok << " byte " << col;
    }
    ASSERT_EQ(ts[i].bytes, ref[i].bytes) << "tensor " << i << " (kind " << int(t.kind) << ") differs from the CPU op";
  }
}

}  // namespace

TEST(ShiftFlat, PlainRowsManyLayouts) {
  uint32_t seed = 1;
  for (int rep = 0; rep < 6; ++rep)
    run({.layers = 4, .cap = 70, .length = 67, .n_keep = 3, .n_discard = 32, .n_threads = 1 + rep * 7}, ++seed);
  run({.layers = 2, .cap = 40, .length = 40, .n_keep = 0, .n_discard = 20, .n_threads = 3}, 50);
  run({.layers = 2, .cap = 40, .length = 40, .n_keep = 5, .n_discard = 34, .n_threads = 1000}, 51);  // one token moves
}

TEST(ShiftFlat, DeepSeekV4RowsBothPhases) {
  uint32_t seed = 100;
  // n_discard even and odd: source and destination in the same phase mod 16, or not
  for (int64_t d : {30, 31, 34, 33})
    for (int rep = 0; rep < 2; ++rep)
      run({.layers = 3, .cap = 70, .length = 61, .n_keep = 1 + rep, .n_discard = d, .dsv4 = true, .n_threads = 5 + rep},
          ++seed);
}

TEST(ShiftFlat, ManyLayersSeveralLaunches) {
  run({.layers = 45, .cap = 10, .length = 10, .n_keep = 1, .n_discard = 5, .n_threads = 9}, 300);
}
