// Runs the CUDA flat kernel's items on the CPU (src/cuda/shift/shift_flat.hpp): the same
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

#include "cuda/shift/shift_flat.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "shift_replay_util.hpp"
#include "kvcore/math/half.hpp"

using namespace kvcore;
using namespace kvcore::cuda;

namespace {

using shift_replay::Tensor;

struct Config {
  int layers = 1;
  int64_t cap = 0, length = 0, n_keep = 0, n_discard = 0;
  bool dsv4 = false;  // every K a DeepSeek-V4 row (1 head), no V; odd n_discard: phases differ
  int n_threads = 64;
};

using shift_replay::fill;

void run(const Config& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> ts;
  shift_replay::Tables tab(cfg.layers);
  auto& [layouts, pair_offset, cos_t, sin_t] = tab;
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
  std::vector<ops::ShiftTensorParams> tp_ref, tp;
  cpu::shift_dense(shift_replay::params(ref, tp_ref, tab, cfg));
  const ops::ShiftDenseParams p = shift_replay::params(ts, tp, tab, cfg);
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

  shift_replay::check_written_once_and_equal(ts, ref, writes, cfg.n_keep, p.n_moved);
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
