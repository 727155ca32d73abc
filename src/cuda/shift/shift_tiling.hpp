// The work plan of the CUDA shift_dense kernel, in plain C++ so that a CPU
// test can replay the kernel's protocol (tests/shift_tiling_test.cpp):
// which launches (groups of layers), how each tensor is cut into tiles,
// how a ticket maps to a tile, and the bands that order the writes.
//
// Token j (0 <= j < n_moved) moves from n_keep + D + j to n_keep + j, with
// D = n_discard. Bands: tokens [b*D, (b+1)*D). Writing a token of band b
// overwrites the source of a token of band b - 1 and nothing else, so a tile
// of band b may be written once every tile of band b - 1 has been read.
// Tickets are numbered band-major: all tiles of band b come before band b + 1.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "kvcore/error.hpp"
#include "kvcore/math/hd.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::ops::cuda::shift_plan {

inline constexpr int kTileBytes = 16384;    // shared memory per tile
inline constexpr int kMaxStreams = 80;      // tensors per launch
inline constexpr int kMaxLayers = 64;       // layers per launch
inline constexpr int kMaxPairsTotal = 2048;  // cos/sin entries per launch

// One tensor of a launch plus how it is cut into tiles.
struct TileStream {
  ops::ShiftTensorParams t;  // t.layer: index into this launch's tables
  int32_t heads_per_chunk, n_chunks, tokens_per_tile;
  int32_t vec, scale_vec;    // widest aligned access, bytes
};

// Everything a launch needs, passed by value (__grid_constant__, < 32 KB).
struct LaunchParams {
  int64_t n_keep, n_discard, n_moved;
  int32_t n_streams, n_bands;
  int32_t n_layers, n_pairs;       // layers of this launch; cos/sin entries used (layers sharing a table share entries)
  int32_t tiles_full, tiles_last;  // tiles of a full band / of the last band, all streams
  int64_t total_tiles;
  int* counters;  // [0]: next ticket; [1 + b]: tiles of band b already read
  int32_t prefix_full[kMaxStreams + 1], prefix_last[kMaxStreams + 1];  // first tile of each stream in a band
  TileStream streams[kMaxStreams];
  math::RopeLayout layout[kMaxLayers];
  int32_t pair_offset[kMaxLayers];
  float cos_t[kMaxPairsTotal], sin_t[kMaxPairsTotal];
};
static_assert(sizeof(LaunchParams) < 32000, "kernel parameters are limited to 32764 bytes");

// Where a ticket's tile lies.
struct Tile {
  int band;
  int stream;
  int64_t t0;  // first moved token (0-based among the moved ones)
  int nt;      // tokens
  int h0, nh;  // heads
};

KVCORE_HD Tile decode_ticket(const LaunchParams& p, int ticket) {
  Tile tile;
  int o;
  bool last;
  if (p.n_bands == 1) {
    tile.band = 0, o = ticket, last = true;
  } else {
    tile.band = ticket / p.tiles_full;
    last = tile.band >= p.n_bands - 1;
    if (last) tile.band = p.n_bands - 1;
    o = ticket - tile.band * p.tiles_full;
  }
  const int32_t* prefix = last ? p.prefix_last : p.prefix_full;
  int lo = 0, hi = p.n_streams;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (prefix[mid] <= o) lo = mid;
    else hi = mid;
  }
  tile.stream = lo;
  const TileStream& st = p.streams[lo];
  const int j = o - prefix[lo];
  const int jt = j / st.n_chunks, c = j - jt * st.n_chunks;
  const int64_t band_begin = int64_t{tile.band} * p.n_discard;
  const int64_t band_end = last ? p.n_moved : band_begin + p.n_discard;
  tile.t0 = band_begin + int64_t{jt} * st.tokens_per_tile;
  const int64_t left = band_end - tile.t0;
  tile.nt = static_cast<int>(left < st.tokens_per_tile ? left : st.tokens_per_tile);
  tile.h0 = c * st.heads_per_chunk;
  tile.nh = st.t.n_heads - tile.h0 < st.heads_per_chunk ? st.t.n_heads - tile.h0 : st.heads_per_chunk;
  return tile;
}

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int widest_access(uintptr_t base, int64_t stride, int32_t head_bytes) {
  for (int v = 16; v > 1; v /= 2)
    if (base % v == 0 && stride % v == 0 && head_bytes % v == 0) return v;
  return 1;
}

// Whole heads, as many tokens as fit in a tile (at most one band).
inline TileStream make_stream(const ops::ShiftTensorParams& t, int64_t band_tokens) {
  TileStream s{};
  s.t = t;
  const int per_head = t.head_bytes + t.scale_head_bytes;
  const int budget = kTileBytes - (t.scale_head_bytes ? 16 : 0);  // room for the scales' alignment
  s.heads_per_chunk = std::max(1, std::min(t.n_heads, budget / per_head));
  s.n_chunks = static_cast<int32_t>(ceil_div64(t.n_heads, s.heads_per_chunk));
  s.tokens_per_tile = static_cast<int32_t>(std::clamp<int64_t>(budget / (s.heads_per_chunk * per_head), 1, band_tokens));
  s.vec = widest_access(reinterpret_cast<uintptr_t>(t.base), t.token_stride, t.head_bytes);
  s.scale_vec = t.maybe_scales
                    ? widest_access(reinterpret_cast<uintptr_t>(t.maybe_scales), t.scale_token_stride, t.scale_head_bytes)
                    : 1;
  return s;
}

inline int32_t tiles_in_band(const TileStream& s, int64_t band_tokens) {
  return static_cast<int32_t>(ceil_div64(band_tokens, s.tokens_per_tile) * s.n_chunks);
}

struct Plan {
  std::vector<std::unique_ptr<LaunchParams>> launches;  // counters left null
  int64_t n_bands = 0;
  bool any_fp8 = false;   // some tensor holds FP8 keys
  bool any_dsv4 = false;  // some tensor holds DeepSeek-V4 packed rows
};

// Groups layers into launches that fit the parameter block and tiles every
// tensor. Throws InvalidArgument (before any work is queued) when a launch
// would need more than 2^31 tiles.
inline Plan make_plan(const ops::ShiftDenseParams& p) {
  Plan plan;
  const int64_t D = p.n_discard;
  plan.n_bands = ceil_div64(p.n_moved, D);
  require_arg(plan.n_bands < (int64_t{1} << 30), "shift_dense: ", plan.n_bands, " bands of ", D, " tokens are too many");
  const int64_t full_len = std::min(D, p.n_moved);
  const int64_t last_len = p.n_moved - (plan.n_bands - 1) * D;
  std::vector<int32_t> layer_to_local(p.n_layers, -1);
  int32_t n_layers_here = 0, n_pairs_here = 0;
  std::map<int32_t, int32_t> table_here;  // the call's pair_offset -> this launch's (layers often share one table)
  LaunchParams* cur = nullptr;
  for (int32_t i = 0; i < p.n_tensors; ++i) {
    const ops::ShiftTensorParams& t = p.tensors[i];
    const int32_t layer = t.layer;
    const int32_t pairs = p.layouts[layer].n_pairs();
    int32_t layer_tensors = 0;  // tensors of one layer are adjacent
    for (int32_t k = i; k < p.n_tensors && p.tensors[k].layer == layer; ++k) ++layer_tensors;
    if (layer_to_local[layer] < 0) {
      const bool shared_table = cur && table_here.count(p.pair_offset[layer]) > 0;
      if (!cur || cur->n_streams + layer_tensors > kMaxStreams || n_layers_here + 1 > kMaxLayers ||
          (!shared_table && n_pairs_here + pairs > kMaxPairsTotal)) {
        plan.launches.push_back(std::make_unique<LaunchParams>());  // value-initialized: zeroed once
        cur = plan.launches.back().get();
        n_layers_here = 0;
        n_pairs_here = 0;
        table_here.clear();
      }
      layer_to_local[layer] = n_layers_here;
      cur->layout[n_layers_here] = p.layouts[layer];
      const auto known = table_here.find(p.pair_offset[layer]);
      if (known != table_here.end()) {
        cur->pair_offset[n_layers_here] = known->second;
      } else {
        cur->pair_offset[n_layers_here] = n_pairs_here;
        table_here[p.pair_offset[layer]] = n_pairs_here;
        for (int32_t q = 0; q < pairs; ++q) {
          cur->cos_t[n_pairs_here + q] = p.cos_t[p.pair_offset[layer] + q];
          cur->sin_t[n_pairs_here + q] = p.sin_t[p.pair_offset[layer] + q];
        }
        n_pairs_here += pairs;
      }
      ++n_layers_here;
      cur->n_layers = n_layers_here;
      cur->n_pairs = n_pairs_here;
    }
    TileStream ts = make_stream(t, full_len);
    ts.t.layer = layer_to_local[layer];
    plan.any_fp8 = plan.any_fp8 || t.kind == ops::ShiftKind::Fp8;
    plan.any_dsv4 = plan.any_dsv4 || t.kind == ops::ShiftKind::Dsv4;
    cur->streams[cur->n_streams++] = ts;
  }
  for (auto& Lp : plan.launches) {
    LaunchParams& L = *Lp;
    L.n_keep = p.n_keep;
    L.n_discard = D;
    L.n_moved = p.n_moved;
    L.n_bands = static_cast<int32_t>(plan.n_bands);
    L.prefix_full[0] = L.prefix_last[0] = 0;
    for (int32_t k = 0; k < L.n_streams; ++k) {
      L.prefix_full[k + 1] = L.prefix_full[k] + tiles_in_band(L.streams[k], full_len);
      L.prefix_last[k + 1] = L.prefix_last[k] + tiles_in_band(L.streams[k], last_len);
    }
    L.tiles_full = L.prefix_full[L.n_streams];
    L.tiles_last = L.prefix_last[L.n_streams];
    L.total_tiles = (plan.n_bands - 1) * int64_t{L.tiles_full} + L.tiles_last;
    require_arg(L.total_tiles < (int64_t{1} << 31) - (int64_t{1} << 20), "shift_dense: ", L.total_tiles,
                " tiles exceed one launch; shift fewer tokens or layers per call");
  }
  return plan;
}

}  // namespace kvcore::ops::cuda::shift_plan
