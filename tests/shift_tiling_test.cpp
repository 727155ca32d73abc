// Replays the CUDA shift_dense kernel's protocol on the CPU (src/cuda/shift/shift_tiling.hpp):
// tickets taken in order by a few "blocks" that a random scheduler interleaves;
// a block reads its tile, counts it for its band, takes its next ticket, waits
// until the previous band has been read, then writes. Checks that tiles cover every moved (tensor, token,
// head) exactly once, fit the shared-memory budget, never deadlock, and that the
// bytes end up exactly where a memmove would put them, for any interleaving.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/shift/shift_tiling.hpp"

using namespace kvcore;
using namespace kvcore::ops::cuda::shift_plan;

namespace {

struct Tensor {
  std::vector<uint8_t> bytes;
  ops::ShiftTensorParams p;
};

// Random tensors: (n_heads, head_bytes, padding) per layer, `per_layer` tensors each.
std::vector<Tensor> make_tensors(int layers, int per_layer, int64_t cap, std::mt19937& rng) {
  std::vector<Tensor> ts;
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < per_layer; ++k) {
      Tensor t;
      const int heads = 1 + int(rng() % 9);
      const int head_bytes = 2 * (1 + int(rng() % 300));
      const int pad = int(rng() % 3) * 2;
      t.p.n_heads = heads;
      t.p.head_bytes = head_bytes;
      t.p.token_stride = int64_t{heads} * head_bytes + pad;
      t.p.kind = k == 0 ? ops::ShiftKind::F16 : ops::ShiftKind::Copy;
      t.p.layer = l;
      t.bytes.resize(cap * t.p.token_stride);
      for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
      ts.push_back(std::move(t));
    }
  for (auto& t : ts) t.p.base = t.bytes.data();
  return ts;
}

// The tile kernel's order: a block takes a ticket, reads its tile, counts it as read for
// its band and takes its next ticket, waits for the previous band, writes, and moves on.
void replay(int layers, int per_layer, int64_t cap, int64_t length, int64_t n_keep, int64_t n_discard, int blocks,
            uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> ts = make_tensors(layers, per_layer, cap, rng);
  std::vector<std::vector<uint8_t>> before;
  for (auto& t : ts) before.push_back(t.bytes);
  std::vector<ops::ShiftTensorParams> tp;
  for (auto& t : ts) tp.push_back(t.p);
  std::vector<math::RopeLayout> layouts(layers);
  std::vector<int32_t> pair_offset(layers);
  for (int l = 0; l < layers; ++l) {
    layouts[l].n_rot = 64;
    pair_offset[l] = 32 * l;
  }
  std::vector<float> cs(32 * layers, 1.0f);
  ops::ShiftDenseParams p;
  p.tensors = tp.data();
  p.n_tensors = static_cast<int32_t>(tp.size());
  p.layouts = layouts.data();
  p.pair_offset = pair_offset.data();
  p.cos_t = cs.data();
  p.sin_t = cs.data();
  p.n_layers = layers;
  p.n_keep = n_keep;
  p.n_discard = n_discard;
  p.n_moved = length - n_keep - n_discard;
  const Plan plan = make_plan(p);

  std::vector<std::vector<int>> covered(ts.size());  // per tensor: moved token x head
  for (size_t i = 0; i < ts.size(); ++i) covered[i].assign(p.n_moved * ts[i].p.n_heads, 0);
  size_t first_tensor = 0;
  for (const auto& Lp : plan.launches) {
    const LaunchParams& L = *Lp;
    ASSERT_LE(L.n_streams, kMaxStreams);
    std::vector<int> band_read(plan.n_bands, 0);
    int next_ticket = 0;
    struct Block {
      int state = 0;  // 0 idle, 1 holds a ticket, 2 has read its tile (waiting / writing)
      Tile tile{};
      int next = -1;  // the next ticket, taken right after reading (as the kernel does)
      std::vector<uint8_t> data;
    };
    std::vector<Block> bs(blocks);
    int64_t done = 0;
    while (done < L.total_tiles) {
      // blocks that can make progress now (reading never waits; writing waits for band b - 1)
      std::vector<int> ready;
      for (int b = 0; b < blocks; ++b) {
        if (bs[b].state == 0 && next_ticket < L.total_tiles) ready.push_back(b);
        if (bs[b].state == 1) ready.push_back(b);
        if (bs[b].state == 2 && (bs[b].tile.band == 0 || band_read[bs[b].tile.band - 1] == L.tiles_full)) ready.push_back(b);
      }
      ASSERT_FALSE(ready.empty()) << "deadlock at " << done << " of " << L.total_tiles << " tiles";
      Block& blk = bs[ready[rng() % ready.size()]];
      if (blk.state == 0) {  // take a ticket
        blk.tile = decode_ticket(L, next_ticket++);
        blk.state = 1;
      } else if (blk.state == 1) {  // read the tile
        const Tile& t = blk.tile;
        const TileStream& st = L.streams[t.stream];
        ASSERT_GE(t.nt, 1);
        ASSERT_LE(t.nt * t.nh * (st.t.head_bytes + st.t.scale_head_bytes), kTileBytes);
        ASSERT_EQ(t.t0 / n_discard, t.band) << "tile starts outside its band";
        ASSERT_EQ((t.t0 + t.nt - 1) / n_discard, t.band) << "tile straddles two bands";
        const int chunk = t.nh * st.t.head_bytes;
        blk.data.resize(size_t(t.nt) * chunk);
        for (int j = 0; j < t.nt; ++j) {
          const uint8_t* src = st.t.base + (n_keep + n_discard + t.t0 + j) * st.t.token_stride + int64_t{t.h0} * st.t.head_bytes;
          std::memcpy(&blk.data[size_t(j) * chunk], src, chunk);
          for (int h = t.h0; h < t.h0 + t.nh; ++h) covered[first_tensor + t.stream][(t.t0 + j) * st.t.n_heads + h]++;
        }
        ++band_read[t.band];
        blk.next = next_ticket < L.total_tiles ? next_ticket++ : -1;
        blk.state = 2;
      } else {  // write it
        const Tile& t = blk.tile;
        const TileStream& st = L.streams[t.stream];
        const int chunk = t.nh * st.t.head_bytes;
        for (int j = 0; j < t.nt; ++j)
          std::memcpy(st.t.base + (n_keep + t.t0 + j) * st.t.token_stride + int64_t{t.h0} * st.t.head_bytes,
                      &blk.data[size_t(j) * chunk], chunk);
        blk.state = 0;
        if (blk.next >= 0) {
          blk.tile = decode_ticket(L, blk.next);
          blk.state = 1;
        }
        ++done;
      }
    }
    first_tensor += L.n_streams;
  }
  ASSERT_EQ(first_tensor, ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    for (int c : covered[i]) ASSERT_EQ(c, 1) << "a (token, head) of tensor " << i << " was moved " << c << " times";
    std::vector<uint8_t> want = before[i];
    const auto& q = ts[i].p;
    for (int64_t j = 0; j < p.n_moved; ++j)
      std::memcpy(&want[(n_keep + j) * q.token_stride], &before[i][(n_keep + n_discard + j) * q.token_stride],
                  int64_t{q.n_heads} * q.head_bytes);
    ASSERT_EQ(ts[i].bytes, want) << "tensor " << i << " (L " << length << ", keep " << n_keep << ", discard " << n_discard
                                 << ", " << blocks << " blocks)";
  }
}

}  // namespace

TEST(ShiftTiling, ReplayedProtocolMovesLikeMemmove) {
  uint32_t seed = 1;
  for (int blocks : {3, 40}) {
    replay(1, 2, 300, 300, 4, 1, blocks, ++seed);      // a band per token
    replay(2, 2, 300, 290, 0, 7, blocks, ++seed);      // heavy overlap
    replay(3, 1, 300, 300, 4, 100, blocks, ++seed);    // two bands
    replay(1, 2, 300, 300, 4, 148, blocks, ++seed);    // half discarded: one band
    replay(2, 2, 300, 250, 10, 200, blocks, ++seed);   // discard > moved
  }
  replay(45, 2, 40, 40, 2, 3, 16, ++seed);  // 90 tensors: two launches
}

TEST(ShiftTiling, BigRowsSplitIntoHeadChunks) {
  ops::ShiftTensorParams t;
  t.n_heads = 32;
  t.head_bytes = 2048;  // 64 KB per token
  t.token_stride = 32 * 2048;
  std::vector<uint8_t> mem(16);
  t.base = mem.data();
  const TileStream s = make_stream(t, 100);
  EXPECT_EQ(s.heads_per_chunk, 8);
  EXPECT_EQ(s.n_chunks, 4);
  EXPECT_EQ(s.tokens_per_tile, 1);
  EXPECT_EQ(tiles_in_band(s, 100), 400);
}
