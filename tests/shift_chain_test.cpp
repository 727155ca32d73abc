// Runs the CUDA chain kernel's threads on the CPU (src/cuda/shift/shift_chain.hpp):
// the same unit decoding, the same item order (a group of kItems loads, then
// its stores) and the same register rotation, with the threads' groups
// interleaved at random. Because a thread only ever overwrites bytes it has
// read itself, any interleaving must give exactly the CPU op's bytes; every
// moved byte must be written exactly once and nothing else touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/shift/shift_chain.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "shift_replay_util.hpp"

using namespace kvcore;
using namespace kvcore::ops::cuda;

namespace {

using shift_replay::Tensor;

struct Config {
  int layers = 1;
  int64_t cap = 0, length = 0, n_keep = 0, n_discard = 0;
  int n_threads = 64;
  bool odd_strides = false;  // paddings that leave 1- and 2-byte aligned rows
  int fp8_head_dim = 0;      // > 0: every K is FP8 (e4m3 + ue8m0 scales), fully rotated
  bool fp8_interleaved = false;
};

// The FP8 kernel's body on the CPU: one head per item, its codes and scales in "registers".
template <int HD, bool IL>
void fp8_item(uint8_t* src, uint8_t* sc, const shift_chain::Stream& st, const shift_chain::Params& P) {
  uint32_t w[HD / 4];
  uint8_t scales[HD / 64];
  std::memcpy(w, src, HD);
  std::memcpy(scales, sc, HD / 64);
  shift_chain::rotate_fp8_head<HD, IL, shift_chain::Fp8SoftCodec>(w, scales, P.cos_t + st.pair_base, P.sin_t + st.pair_base);
  std::memcpy(src - P.n_discard * st.token_stride, w, HD);
  std::memcpy(sc - P.n_discard * st.scale_stride, scales, HD / 64);
}

// Byte equality, except that two stored values that are both NaN (in the tensor's element
// format) match whatever their payloads.
bool same_up_to_nan_payloads(ops::ShiftKind kind, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return false;
  const bool f32 = kind == ops::ShiftKind::F32;
  const bool is16 = kind == ops::ShiftKind::F16 || kind == ops::ShiftKind::BF16 || kind == ops::ShiftKind::Dsv4;
  if (!f32 && !is16) return a == b;
  const size_t w = f32 ? 4 : 2;
  auto nan = [&](const uint8_t* p) {
    if (f32) {
      uint32_t x;
      std::memcpy(&x, p, 4);
      return (x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu) != 0;
    }
    uint16_t x;
    std::memcpy(&x, p, 2);
    if (kind == ops::ShiftKind::F16) return (x & 0x7c00u) == 0x7c00u && (x & 0x03ffu) != 0;
    return (x & 0x7f80u) == 0x7f80u && (x & 0x007fu) != 0;  // bf16 (and the DeepSeek-V4 tail)
  };
  for (size_t i = 0; i < a.size(); i += w) {
    const size_t n = std::min(w, a.size() - i);
    if (std::memcmp(&a[i], &b[i], n) == 0) continue;
    if (n < w || !nan(&a[i]) || !nan(&b[i])) return false;
  }
  return true;
}

void run(const Config& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> ts;
  shift_replay::Tables tab(cfg.layers);
  auto& [layouts, pair_offset, cos_t, sin_t] = tab;
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  for (int l = 0; l < cfg.layers; ++l) {
    Tensor k;
    const int form = cfg.fp8_head_dim ? 4 : int(rng() % 4);  // f16, bf16, f32, DeepSeek-V4 row, FP8
    math::RopeLayout& lay = layouts[l];
    if (form == 4) {
      k.p.kind = ops::ShiftKind::Fp8;
      k.p.head_bytes = cfg.fp8_head_dim;
      k.p.scale_head_bytes = cfg.fp8_head_dim / 64;
      k.p.n_heads = 1 + int(rng() % 4);
      k.p.scale_token_stride = int64_t{k.p.n_heads} * k.p.scale_head_bytes + int(rng() % 3);
      lay.n_rot = cfg.fp8_head_dim;
      lay.interleaved = cfg.fp8_interleaved;
    } else if (form == 3) {
      k.p.kind = ops::ShiftKind::Dsv4;
      k.p.head_bytes = math::Dsv4RowLayout::kBytes;
      k.p.n_heads = 1 + int(rng() % 2);
      lay.n_rot = 64;
      lay.first_dim = math::Dsv4RowLayout::kNope;
      lay.interleaved = int(rng() % 2);
    } else {
      k.p.kind = form == 0 ? ops::ShiftKind::F16 : form == 1 ? ops::ShiftKind::BF16 : ops::ShiftKind::F32;
      const int hd = 16 * (1 + int(rng() % 8));
      const int eb = form == 2 ? 4 : 2;
      k.p.head_bytes = hd * eb;
      k.p.n_heads = 1 + int(rng() % 4);
      lay.n_rot = std::min(hd, 2 * (1 + int(rng() % (hd / 2))));
      if (rng() % 2) lay.n_rot = hd;
      lay.first_dim = rng() % 2 ? 0 : hd - lay.n_rot;
      lay.interleaved = int(rng() % 2);
    }
    k.p.layer = l;
    // K strides in whole elements (as tensors give them), whole pairs for interleaved pairs: the
    // chain kernel needs a unit to hold whole pairs (rows aligned to one element only, with
    // interleaved pairs, go to a tile kernel)
    const int eb = k.p.kind == ops::ShiftKind::F32 ? 4 : 2;
    const int kpad = form == 4 ? 16 * int(rng() % 2)
                               : cfg.odd_strides ? eb * (lay.interleaved ? 2 : 1) * int(rng() % 3) : 16 * int(rng() % 2);
    k.p.token_stride = int64_t{k.p.n_heads} * k.p.head_bytes + kpad;
    ts.push_back(std::move(k));
    if (l > 0 && std::memcmp(&layouts[l], &layouts[l - 1], sizeof(math::RopeLayout)) == 0 && rng() % 2) {
      pair_offset[l] = pair_offset[l - 1];  // layers sharing one table, as the op passes them
    } else {
      pair_offset[l] = static_cast<int32_t>(cos_t.size());
      for (int i = 0; i < lay.n_pairs(); ++i) cos_t.push_back(unit(rng)), sin_t.push_back(unit(rng));
    }
    if (rng() % 4 != 0) {  // a V tensor
      Tensor v;
      v.p.kind = ops::ShiftKind::Copy;
      v.p.n_heads = 1 + int(rng() % 4);
      v.p.head_bytes = cfg.odd_strides ? 1 + int(rng() % 200) : 16 * (1 + int(rng() % 16));
      v.p.token_stride = int64_t{v.p.n_heads} * v.p.head_bytes + (cfg.odd_strides ? int(rng() % 3) : 0);
      v.p.layer = l;
      ts.push_back(std::move(v));
    }
  }
  for (auto& t : ts) {
    t.bytes.resize(cfg.cap * t.p.token_stride);
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    t.scales.resize(cfg.cap * t.p.scale_token_stride);
    for (auto& b : t.scales) b = static_cast<uint8_t>(120 + rng() % 15);  // scales 2^-7 .. 2^7
  }
  std::vector<Tensor> ref = ts;
  std::vector<ops::ShiftTensorParams> tp_ref, tp;
  cpu::shift_dense(shift_replay::params(ref, tp_ref, tab, cfg));
  const ops::ShiftDenseParams p = shift_replay::params(ts, tp, tab, cfg);

  const shift_plan::Plan plan = shift_plan::make_plan(p);
  const auto launches = shift_chain::make_launches(plan);
  ASSERT_FALSE(launches.empty()) << "the chain kernels must handle these layouts";

  // writes per byte of every tensor
  std::vector<std::vector<uint8_t>> writes(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) writes[i].assign(ts[i].bytes.size(), 0);
  auto tensor_of = [&](const uint8_t* ptr) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ptr >= ts[i].bytes.data() && ptr < ts[i].bytes.data() + ts[i].bytes.size()) return i;
    ADD_FAILURE() << "a store outside every tensor";
    return size_t{0};
  };

  for (const auto& P : launches) {
    const int n_threads = cfg.n_threads;
    std::vector<shift_chain::Cursor> cursors;
    for (int t = 0; t < n_threads; ++t) cursors.push_back(shift_chain::first_cursor(*P, static_cast<uint32_t>(t)));
    std::vector<int> live(n_threads);
    for (int t = 0; t < n_threads; ++t) live[t] = t;
    if (P->fp8_head_dim) {  // the FP8 kernel: a head per item, threads interleaved at random
      std::vector<shift_chain::Fp8Cursor> fc;
      for (int t = 0; t < n_threads; ++t) fc.push_back(shift_chain::first_fp8_cursor(*P, static_cast<uint32_t>(t)));
      while (!live.empty()) {
        const size_t pick = rng() % live.size();
        uint8_t* src;
        uint8_t* sc;
        int32_t si;
        if (!shift_chain::next_fp8(*P, static_cast<uint32_t>(n_threads), fc[live[pick]], src, sc, si)) {
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
          continue;
        }
        const shift_chain::Stream& st = P->streams[si];
        ASSERT_EQ(st.elem, shift_chain::kFp8);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(src) % 16, 0u);
        const bool il = P->fp8_interleaved != 0;
        if (P->fp8_head_dim == 64) il ? fp8_item<64, true>(src, sc, st, *P) : fp8_item<64, false>(src, sc, st, *P);
        else il ? fp8_item<128, true>(src, sc, st, *P) : fp8_item<128, false>(src, sc, st, *P);
        uint8_t* d = src - P->n_discard * st.token_stride;
        const size_t ti = tensor_of(d);
        for (int q = 0; q < st.head_bytes; ++q) ++writes[ti][d - ts[ti].bytes.data() + q];
      }
      continue;
    }
    while (!live.empty()) {
      const size_t pick = rng() % live.size();
      shift_chain::Cursor& cur = cursors[live[pick]];
      shift_chain::Item it[shift_chain::kItems];
      bool ok[shift_chain::kItems];
      shift_chain::Chunk a[shift_chain::kItems], b[shift_chain::kItems];
      for (int i = 0; i < shift_chain::kItems; ++i) ok[i] = shift_chain::next_item(*P, static_cast<uint32_t>(n_threads), cur, it[i]);
      if (!ok[0]) {
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
        continue;
      }
      for (int i = 0; i < shift_chain::kItems; ++i) {
        a[i] = b[i] = shift_chain::Chunk{};
        if (!ok[i]) continue;
        const shift_chain::Stream& st = P->streams[it[i].stream];
        ASSERT_EQ(reinterpret_cast<uintptr_t>(it[i].src) % st.vec, 0u) << "misaligned load";
        std::memcpy(a[i].w, it[i].src, st.vec);
        if (it[i].partner) std::memcpy(b[i].w, it[i].src + it[i].partner, st.vec);
      }
      for (int i = 0; i < shift_chain::kItems; ++i) {
        if (!ok[i]) continue;
        const shift_chain::Stream& st = P->streams[it[i].stream];
        if (it[i].pair0 >= 0) {
          ASSERT_LE(it[i].pair0 + st.pairs_per_unit, P->n_pairs);
          shift_chain::rotate_item(st, it[i], a[i], b[i], P->cos_t, P->sin_t);
        }
        uint8_t* dst = it[i].src - P->n_discard * st.token_stride;
        for (int half = 0; half < (it[i].partner ? 2 : 1); ++half) {
          uint8_t* d = dst + half * it[i].partner;
          std::memcpy(d, half ? b[i].w : a[i].w, st.vec);
          const size_t ti = tensor_of(d);
          for (int q = 0; q < st.vec; ++q) ++writes[ti][d - ts[ti].bytes.data() + q];
        }
      }
    }
  }

  const int64_t n_moved = p.n_moved;
  for (size_t i = 0; i < ts.size(); ++i) {
    const ops::ShiftTensorParams& t = ts[i].p;
    const int64_t row = int64_t{t.n_heads} * t.head_bytes;
    for (int64_t x = 0; x < static_cast<int64_t>(ts[i].bytes.size()); ++x) {
      const int64_t tok = x / t.token_stride, col = x % t.token_stride;
      const bool moved = tok >= cfg.n_keep && tok < cfg.n_keep + n_moved && col < row;
      ASSERT_EQ(writes[i][x], moved ? 1 : 0) << "tensor " << i << " token " << tok << " byte " << col;
    }
    // Values equal the CPU op's bit for bit, except NaN payloads: the rows hold random bytes,
    // so some rotated values are NaNs, and which operand's payload a NaN result carries
    // depends on the order the compiler gives the operands of a commutative operation (the
    // ASan/UBSan build orders them differently from the optimized one). Any NaN matches any NaN.
    EXPECT_TRUE(same_up_to_nan_payloads(t.kind, ts[i].bytes, ref[i].bytes))
        << "tensor " << i << " (kind " << int(t.kind) << ") differs from the CPU op";
    ASSERT_EQ(ts[i].scales, ref[i].scales) << "tensor " << i << ": FP8 scales differ from the CPU op";
  }
}

}  // namespace

TEST(ShiftChain, NoOverlap) {
  run({.layers = 3, .cap = 64, .length = 60, .n_keep = 4, .n_discard = 30, .n_threads = 97}, 1);
  run({.layers = 2, .cap = 64, .length = 64, .n_keep = 0, .n_discard = 40, .n_threads = 5}, 2);
}

TEST(ShiftChain, OverlapAnyInterleaving) {
  uint32_t seed = 10;
  for (int64_t d : {1, 2, 3, 7, 16, 25})
    for (int threads : {1, 13, 256}) run({.layers = 2, .cap = 61, .length = 59, .n_keep = 3, .n_discard = d, .n_threads = threads}, ++seed);
}

TEST(ShiftChain, OddStridesAndManyLayers) {
  uint32_t seed = 100;
  for (int rep = 0; rep < 4; ++rep)
    run({.layers = 5, .cap = 40, .length = 40, .n_keep = 2, .n_discard = 9, .n_threads = 31, .odd_strides = true}, ++seed);
  // 45 layers: more tensors than one launch holds
  run({.layers = 45, .cap = 12, .length = 12, .n_keep = 1, .n_discard = 4, .n_threads = 50}, 200);
}

TEST(ShiftChain, FewerThreadsThanColumnsAndMore) {
  run({.layers = 2, .cap = 50, .length = 48, .n_keep = 4, .n_discard = 20, .n_threads = 1}, 300);
  run({.layers = 2, .cap = 50, .length = 48, .n_keep = 4, .n_discard = 20, .n_threads = 5000}, 301);
}

TEST(ShiftChain, Fp8KeysAHeadPerThread) {
  uint32_t seed = 400;
  for (int hd : {64, 128})
    for (bool il : {false, true})
      for (int64_t d : {2, 11, 30}) {
        Config c{.layers = 3, .cap = 44, .length = 43, .n_keep = 3, .n_discard = d, .n_threads = 17};
        c.fp8_head_dim = hd;
        c.fp8_interleaved = il;
        run(c, ++seed);
      }
}
