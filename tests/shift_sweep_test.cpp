// Runs the CUDA sweep kernel's warps on the CPU (src/cuda/shift/shift_sweep.hpp): the
// same cursor, the same batches (every load before any store), the NeoX partner
// taken from another lane's registers as a shuffle does, the same register
// rotation, with the tickets taken by blocks in random order. Every moved byte
// must be written exactly once, nothing else touched,
// and the bytes must equal the CPU op's; every warp must see one stream per step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/shift/shift_sweep.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "shift_replay_util.hpp"
#include "kvcore/math/half.hpp"

using namespace kvcore;
using namespace kvcore::ops::cuda;

namespace {

constexpr int kBatch = 4;  // the kernel's batch

using shift_replay::Tensor;

struct Config {
  int layers = 1;
  int64_t cap = 0, length = 0, n_keep = 0, n_discard = 0;
  int64_t threads = 256;  // resident threads: threads / 256 blocks draw tickets
  bool strided = false;  // some rows padded by 16 bytes
  bool dsv4 = false;     // K as DeepSeek-V4 rows (584 bytes: range streams), V rows of 8-byte multiples
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
    k.p.n_heads = 1 + int(rng() % 4);
    k.p.layer = l;
    const bool shared = l > 0 && rng() % 2;  // layers often share one table (same format and layout)
    if (cfg.dsv4) {
      k.p.kind = ops::ShiftKind::Dsv4;
      k.p.n_heads = 1;
      k.p.head_bytes = math::Dsv4RowLayout::kBytes;
      lay.n_rot = 64;
      lay.first_dim = math::Dsv4RowLayout::kNope;
      lay.interleaved = 1;
      pair_offset[l] = shared ? pair_offset[l - 1] : static_cast<int32_t>(cos_t.size());
      for (int i = 0; !shared && i < lay.n_pairs(); ++i) {
        const float a = angle(rng);
        cos_t.push_back(std::cos(a)), sin_t.push_back(std::sin(a));
      }
    } else if (shared) {
      const Tensor& prev = *std::find_if(ts.rbegin(), ts.rend(), [](const Tensor& t) { return t.p.kind != ops::ShiftKind::Copy; });
      k.p.kind = prev.p.kind;
      k.p.head_bytes = prev.p.head_bytes;
      lay = layouts[l - 1];
      pair_offset[l] = pair_offset[l - 1];
    } else {
      const int form = int(rng() % 3);
      k.p.kind = form == 0 ? ops::ShiftKind::F16 : form == 1 ? ops::ShiftKind::BF16 : ops::ShiftKind::F32;
      const int eb = form == 2 ? 4 : 2;
      k.p.head_bytes = 32 << (rng() % 5);  // 32 .. 512 bytes
      const int hd = k.p.head_bytes / eb;
      lay.interleaved = int(rng() % 2);
      const int step = lay.interleaved ? 16 / eb : 32 / eb;  // rotated dims per 16-byte boundary
      lay.n_rot = rng() % 2 ? hd : step * (1 + int(rng() % (hd / step)));
      lay.first_dim = rng() % 2 ? 0 : hd - lay.n_rot;
      pair_offset[l] = static_cast<int32_t>(cos_t.size());
      for (int i = 0; i < lay.n_pairs(); ++i) {
        const float a = angle(rng);
        cos_t.push_back(std::cos(a)), sin_t.push_back(std::sin(a));
      }
    }
    k.p.token_stride = int64_t{k.p.n_heads} * k.p.head_bytes + (cfg.strided && !cfg.dsv4 && rng() % 2 ? 16 : 0);
    ts.push_back(std::move(k));
    if (rng() % 4 != 0) {
      Tensor v;
      v.p.kind = ops::ShiftKind::Copy;
      v.p.n_heads = 1 + int(rng() % 4);
      v.p.head_bytes = cfg.dsv4 && rng() % 2 ? 8 * (1 + 2 * int(rng() % 8)) : 16 * (1 + int(rng() % 16));
      v.p.token_stride = int64_t{v.p.n_heads} * v.p.head_bytes + (cfg.strided && !cfg.dsv4 && rng() % 2 ? 32 : 0);
      v.p.layer = l;
      ts.push_back(std::move(v));
    }
  }
  for (auto& t : ts) {
    t.bytes.resize(32 + cfg.cap * t.p.token_stride);
    t.lead = (16 - reinterpret_cast<uintptr_t>(t.bytes.data()) % 16) % 16 + (cfg.dsv4 && rng() % 2 ? 8 : 0);
    fill(rng, t);
  }
  std::vector<Tensor> ref = ts;
  std::vector<ops::ShiftTensorParams> tp_ref, tp;
  // `ref` is copied before any base is set: set each copy's own bases
  cpu::shift_dense(shift_replay::params(ref, tp_ref, tab, cfg));
  const ops::ShiftDenseParams p = shift_replay::params(ts, tp, tab, cfg);

  const shift_plan::Plan plan = shift_plan::make_plan(p);
  auto launches = shift_sweep::make_launches(plan);
  ASSERT_FALSE(launches.empty()) << "the sweep kernel must handle these layouts";

  std::vector<std::vector<uint8_t>> writes(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) writes[i].assign(ts[i].bytes.size(), 0);
  auto tensor_of = [&](const uint8_t* ptr) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ptr >= ts[i].bytes.data() && ptr < ts[i].bytes.data() + ts[i].bytes.size()) return i;
    ADD_FAILURE() << "a store outside every tensor";
    return size_t{0};
  };
  int64_t ranges = 0;
  // One warp's batch: every load, then per item the shuffles' view of the registers, the
  // rotation and the stores. `it` holds the batch's items, located by the caller.
  auto move_warp = [&](const shift_sweep::Params& P, shift_sweep::Item (&it)[kBatch][32]) {
    shift_chain::Chunk a[kBatch][32];
    for (int k = 0; k < kBatch; ++k)
      for (int l = 0; l < 32; ++l) {
        ASSERT_EQ(it[k][l].s, it[k][0].s) << "a warp spans two streams";
        a[k][l] = shift_chain::Chunk{};
        if (it[k][l].src) {
          ASSERT_TRUE(it[k][l].bytes == 16 || it[k][l].bytes == 8);
          ASSERT_EQ(reinterpret_cast<uintptr_t>(it[k][l].src) % it[k][l].bytes, 0u) << "misaligned load";
          std::memcpy(a[k][l].w, it[k][l].src, it[k][l].bytes);
        }
      }
    for (int k = 0; k < kBatch; ++k) {
      if (it[k][0].s < 0) continue;
      const shift_sweep::Stream& st = P.streams[it[k][0].s];
      const std::vector<shift_chain::Chunk> regs(a[k], a[k] + 32);  // what the shuffles read
      ranges += st.range;
      for (int l = 0; l < 32; ++l) {
        const shift_sweep::Role r = shift_sweep::lane_role(st, l);
        if (st.range) {
          if (it[k][l].src) shift_sweep::rotate_range_any(st, it[k][l], a[k][l], P.cos_t, P.sin_t);
        } else if (r.pair0 >= 0) {
          ASSERT_GE(l + r.partner, 0);
          ASSERT_LT(l + r.partner, 32);
          float c[8], s[8];
          shift_sweep::lane_trig(r, P.cos_t, P.sin_t, P.n_pairs, c, s);
          shift_sweep::rotate_any(st.elem, a[k][l], regs[l + r.partner], st.half != 0, c, s);
        }
        if (it[k][l].src) {
          uint8_t* dst = it[k][l].src - st.band_step;
          ASSERT_EQ(reinterpret_cast<uintptr_t>(dst) % it[k][l].bytes, 0u) << "misaligned store";
          std::memcpy(dst, a[k][l].w, it[k][l].bytes);
          const size_t ti = tensor_of(dst);
          for (int q = 0; q < it[k][l].bytes; ++q) ++writes[ti][dst - ts[ti].bytes.data() + q];
        }
      }
    }
  };
  for (auto& Pp : launches) {
    shift_sweep::Params& P = *Pp;
    // tickets of kDynThreads * kBatch positions from one counter, blocks drawing in random order
    ASSERT_EQ(P.n_bands, 1) << "the sweep kernel is for shifts without overlap";
    ASSERT_EQ(shift_sweep::kDynBatch, kBatch);
    const uint32_t ticket = shift_sweep::kDynThreads * shift_sweep::kDynBatch;
    P.band_len = static_cast<uint32_t>(shift_sweep::round_up(P.width, ticket));
    const int64_t n_blocks = std::max<int64_t>(1, cfg.threads / shift_sweep::kDynThreads);
    std::vector<std::vector<shift_sweep::Cursor>> cur(n_blocks, std::vector<shift_sweep::Cursor>(shift_sweep::kDynThreads));
    uint32_t next = 0;
    while (next < P.band_len / ticket) {
      const int64_t blk = static_cast<int64_t>(rng() % n_blocks);
      const uint32_t t = next++;
      for (int w = 0; w < shift_sweep::kDynThreads / 32; ++w) {
        shift_sweep::Item it[kBatch][32];
        for (int k = 0; k < kBatch; ++k)
          for (int l = 0; l < 32; ++l) {
            shift_sweep::Cursor& c = cur[blk][w * 32 + l];
            c.pos = t * ticket + k * shift_sweep::kDynThreads + w * 32 + l;
            it[k][l] = shift_sweep::locate(P, c);
          }
        move_warp(P, it);
      }
    }
  }

  if (cfg.dsv4) {
    EXPECT_GT(ranges, 0) << "no range stream ran";
  }
  shift_replay::check_written_once_and_equal(ts, ref, writes, cfg.n_keep, p.n_moved);
}

}  // namespace

TEST(ShiftSweep, NoOverlapManyLayouts) {
  uint32_t seed = 1;
  for (int rep = 0; rep < 6; ++rep)
    run({.layers = 4, .cap = 70, .length = 67, .n_keep = 3, .n_discard = 32, .threads = 256 << (rep % 3), .strided = rep % 2 == 1},
        ++seed);
  run({.layers = 2, .cap = 40, .length = 40, .n_keep = 5, .n_discard = 34, .threads = 1024}, 50);  // one token moves
}

TEST(ShiftSweep, ManyLayersSeveralLaunches) {
  run({.layers = 45, .cap = 12, .length = 12, .n_keep = 1, .n_discard = 6, .threads = 512}, 300);
  run({.layers = 45, .cap = 12, .length = 12, .n_keep = 1, .n_discard = 8, .threads = 512}, 301);
}

TEST(ShiftSweep, DeepSeekV4RowsAsRanges) {
  uint32_t seed = 500;
  // even n_discard (584 * D = 0 mod 16): one phase at source and destination; both phases of
  // the base (n_keep odd and even)
  for (int64_t d : {30, 34, 44, 58})
    for (int64_t threads : {256, 1024, 8192})
      run({.layers = 3, .cap = 70, .length = 61, .n_keep = 1 + d % 3, .n_discard = d, .threads = threads, .dsv4 = true},
          ++seed);
}
