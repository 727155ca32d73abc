// The "sweep" form of the CUDA shift_dense kernel, for shifts without overlap
// (n_discard >= n_moved): written like the plain copy kernel that defines the copy
// ceiling. One index space of 16-byte chunks over every tensor of a launch, walked
// in tickets of 16 KB of contiguous chunk positions that blocks take from a counter
// (faster blocks take more), so at any moment the grid works on one contiguous
// window of the call's bytes, every warp on 512 contiguous bytes. No shared memory
// staging and no barrier inside a ticket.
//
// The index space is laid out in bands (band b holding tokens [bD, (b+1)D) of every
// tensor at the same place in each band, a band `band_len` chunks long); without
// overlap a shift has one band, so nothing the kernel reads is written while it runs.
//
// Rotation happens in registers. Each tensor's part of a band starts at a
// multiple of 32 chunks and tickets and band_len are multiples of 32, so the chunk a
// lane holds is always at position lane % (chunks per head) of a head (heads
// of at most 32 chunks, a power of two): a lane's cos/sin never change within
// a layer's table, and a NeoX partner chunk is in the same warp,
// half-a-rotated-region of lanes away (one shuffle per word).
//
// Handles K of f32 / f16 / bf16 and V rows whose base, token stride and head
// size are multiples of 16 bytes, heads of 16..512 bytes (a power of two), the
// rotated region on 16-byte boundaries ("units"). Tensors whose rows allow only
// 8-byte accesses but are packed back to back (the 584-byte DeepSeek-V4 row) are
// moved as one byte range per band ("range"): aligned
// 16-byte chunks, 8-byte halves at the ends, 16-bit interleaved pairs rotated
// word by word (their cos/sin vary along the range: read from shared memory).
// It needs the same phase mod 16 at source and destination (D * row a multiple
// of 16). Anything else (FP8 keys, odd strides) takes another kernel. The body is host+device code:
// tests/shift_sweep_test.cpp runs every warp on the host in random order.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/shift/shift_chain.hpp"
#include "kvcore/math/dsv4_row.hpp"

namespace kvcore::ops::cuda::shift_sweep {

inline constexpr int kMaxPairs = 1024;  // cos/sin entries per launch (layers sharing a table share entries)
// The kernel (shift_sweep.cu): a ticket is kDynBatch chunk positions for
// each of kDynThreads threads, contiguous.
inline constexpr int kDynThreads = 256, kDynBatch = 4;

// One tensor of a launch.
struct Stream {
  uint8_t* src0 = nullptr;    // first moved byte of band 0 (row n_keep + D)
  int64_t token_stride = 0;   // bytes
  int64_t band_step = 0;      // D * token_stride: next band's source; also source - destination
  int32_t row_chunks = 0;     // 16-byte chunks of a row
  int32_t contiguous = 0;     // token_stride == 16 * row_chunks: a band is one byte range
  int32_t offset = 0, end = 0;  // the stream's chunk positions in a band: [offset, end), multiples of 32
  int32_t full_chunks = 0;    // real chunks in a band (D tokens, or n_moved with one band)
  int32_t last_chunks = 0;    // real chunks in the last band
  int32_t elem = shift_chain::kCopy;  // kCopy, kF32, kF16 or kBF16
  int32_t head_mask = 0;      // chunks per head - 1
  int32_t rot_lo = 0, rot_hi = 0;  // rotated chunks of a head
  int32_t half = 0;           // NeoX: partner distance in chunks (lanes); 0: interleaved pairs
  int32_t pair_base = 0;      // first cos/sin entry of the layer
  int32_t pairs_per_chunk = 0;
  // range shape (range != 0): chunk c of a band covers bytes [16c - phase, 16c - phase + 16)
  // of the band's moved bytes, clipped to them; rotated 16-bit pairs at row bytes [rot_lo, rot_hi)
  int32_t range = 0, phase = 0, row_bytes = 0;
  int32_t full_bytes = 0, last_bytes = 0;  // moved bytes of a band / of the last band
};

struct Params {
  int32_t range = 0;  // every stream a range (1) or units (0)
  int32_t n_streams = 0, n_pairs = 0, n_bands = 0;
  uint32_t band_len = 0;  // chunks per band: width rounded up to whole tickets
  int64_t width = 0;      // chunk positions used in a band: streams[n_streams - 1].end
  Stream streams[shift_plan::kMaxStreams];
  float cos_t[kMaxPairs], sin_t[kMaxPairs];
};
static_assert(sizeof(Params) < 32000, "kernel parameters are limited to 32764 bytes");

// A thread's place: chunk position `pos` of band `b`; `s` the stream searched from.
struct Cursor {
  int32_t b = 0;
  uint32_t pos = 0;
  int32_t s = 0;
};

// One chunk of a thread: its stream (-1: none, a band's padding) and source (null: padding
// inside the stream's place). Both are the same for the 32 lanes of a warp except src.
struct Item {
  int32_t s = -1;
  uint8_t* src = nullptr;
  int32_t bytes = 16;  // 16, or 8 at a range's ends
  int32_t q = 0;       // range: offset of src in the band's moved bytes
};

KVCORE_HD Item locate(const Params& p, Cursor& c) {
  Item it;
  if (c.b >= p.n_bands) return it;
  while (c.s < p.n_streams && c.pos >= static_cast<uint32_t>(p.streams[c.s].end)) ++c.s;
  if (c.s >= p.n_streams) return it;
  const Stream& st = p.streams[c.s];
  it.s = c.s;
  const uint32_t ch = c.pos - static_cast<uint32_t>(st.offset);
  const uint32_t real = static_cast<uint32_t>(c.b == p.n_bands - 1 ? st.last_chunks : st.full_chunks);
  if (ch >= real) return it;
  uint8_t* band = st.src0 + int64_t{c.b} * st.band_step;
  if (st.range) {
    const int32_t real_bytes = c.b == p.n_bands - 1 ? st.last_bytes : st.full_bytes;
    int32_t q = static_cast<int32_t>(ch) * 16 - st.phase;
    int32_t end = q + 16;
    if (q < 0) q = 0;
    if (end > real_bytes) end = real_bytes;
    if (q >= end) return it;
    it.src = band + q;
    it.bytes = end - q;
    it.q = q;
  } else if (st.contiguous) {
    it.src = band + int64_t{ch} * 16;
  } else {
    const uint32_t U = static_cast<uint32_t>(st.row_chunks);
    const uint32_t row = ch / U;
    it.src = band + int64_t{row} * st.token_stride + int64_t{ch - row * U} * 16;
  }
  return it;
}

// What a lane does to its chunk of a K stream.
struct Role {
  int32_t pair0 = -1;   // first cos/sin entry; -1: the chunk does not rotate
  int32_t partner = 0;  // NeoX: lanes to the partner chunk (+ lower half, - upper half); 0: interleaved
};

KVCORE_HD Role lane_role(const Stream& st, int32_t lane) {
  Role r;
  if (st.elem == shift_chain::kCopy || st.range) return r;
  const int32_t p = lane & st.head_mask;
  if (p < st.rot_lo || p >= st.rot_hi) return r;
  const int32_t k = p - st.rot_lo;
  if (st.half == 0) {
    r.pair0 = st.pair_base + k * st.pairs_per_chunk;
    return r;
  }
  const bool lower = k < st.half;
  r.partner = lower ? st.half : -st.half;
  r.pair0 = st.pair_base + (lower ? k : k - st.half) * st.pairs_per_chunk;
  return r;
}

// The cos/sin a lane needs (up to 8 entries from pair0). NeoX: y = x*c + partner*s', with
// s' = -s in the lower half and +s in the upper one, which is rotate_pair's arithmetic
// (x0 c - x1 s and x0 s + x1 c, with no contraction) term by term.
KVCORE_HD void lane_trig(const Role& r, const float* cos_t, const float* sin_t, int32_t n_pairs, float (&c)[8],
                         float (&s)[8]) {
  KVCORE_SHIFT_UNROLL
  for (int e = 0; e < 8; ++e) {
    const bool in = r.pair0 + e < n_pairs;
    c[e] = in ? cos_t[r.pair0 + e] : 0.0f;
    s[e] = in ? (r.partner > 0 ? -sin_t[r.pair0 + e] : sin_t[r.pair0 + e]) : 0.0f;
  }
}

// Rotates a lane's chunk `a` (NeoX: with the partner's chunk `b`).
template <int kTag>
KVCORE_HD void rotate_lane(shift_chain::Chunk& a, const shift_chain::Chunk& b, bool neox, const float (&c)[8],
                           const float (&s)[8]) {
  using math::rope_detail::fadd;
  using math::rope_detail::fmul;
  constexpr int kElems = kTag == shift_chain::kF32 ? 4 : 8;
  if (neox) {
    KVCORE_SHIFT_UNROLL
    for (int e = 0; e < kElems; ++e) {
      const float x = shift_chain::chunk_get<kTag>(a, e), y = shift_chain::chunk_get<kTag>(b, e);
      shift_chain::chunk_set<kTag>(a, e, fadd(fmul(x, c[e]), fmul(y, s[e])));
    }
  } else {
    KVCORE_SHIFT_UNROLL
    for (int e = 0; e < kElems / 2; ++e) {
      float x0 = shift_chain::chunk_get<kTag>(a, 2 * e), x1 = shift_chain::chunk_get<kTag>(a, 2 * e + 1);
      math::rotate_pair(x0, x1, c[e], s[e]);
      shift_chain::chunk_set<kTag>(a, 2 * e, x0);
      shift_chain::chunk_set<kTag>(a, 2 * e + 1, x1);
    }
  }
}

KVCORE_HD void rotate_any(int32_t elem, shift_chain::Chunk& a, const shift_chain::Chunk& b, bool neox, const float (&c)[8],
                          const float (&s)[8]) {
  switch (elem) {
    case shift_chain::kF32: rotate_lane<shift_chain::kF32>(a, b, neox, c, s); break;
    case shift_chain::kF16: rotate_lane<shift_chain::kF16>(a, b, neox, c, s); break;
    case shift_chain::kBF16: rotate_lane<shift_chain::kBF16>(a, b, neox, c, s); break;
    default: break;
  }
}

// Rotates the 16-bit interleaved pairs held by a range item's words (word w: row byte
// (q + 4w) mod row_bytes; an item may straddle two rows).
template <int kTag>
KVCORE_HD void rotate_range(const Stream& st, const Item& it, shift_chain::Chunk& a, const float* cos_t, const float* sin_t) {
  const uint32_t row = static_cast<uint32_t>(st.row_bytes);
  const uint32_t off = static_cast<uint32_t>(it.q) % row;
  KVCORE_SHIFT_UNROLL
  for (int w = 0; w < 4; ++w) {  // constant word indices: the chunk stays in registers
    if (4 * w >= it.bytes) break;
    uint32_t o = off + 4 * w;
    if (o >= row) o -= row;
    if (o >= static_cast<uint32_t>(st.rot_lo) && o < static_cast<uint32_t>(st.rot_hi)) {
      const int32_t pair = st.pair_base + static_cast<int32_t>((o - st.rot_lo) / 4);
      float x0 = shift_chain::chunk_get<kTag>(a, 2 * w), x1 = shift_chain::chunk_get<kTag>(a, 2 * w + 1);
      math::rotate_pair(x0, x1, cos_t[pair], sin_t[pair]);
      shift_chain::chunk_set<kTag>(a, 2 * w, x0);
      shift_chain::chunk_set<kTag>(a, 2 * w + 1, x1);
    }
  }
}

KVCORE_HD void rotate_range_any(const Stream& st, const Item& it, shift_chain::Chunk& a, const float* cos_t,
                                const float* sin_t) {
  if (st.elem == shift_chain::kF16) rotate_range<shift_chain::kF16>(st, it, a, cos_t, sin_t);
  else if (st.elem == shift_chain::kBF16) rotate_range<shift_chain::kBF16>(st, it, a, cos_t, sin_t);
}

// ---- host side ----------------------------------------------------------------------------
inline int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

// A tensor the unit shape cannot take as a range stream: rows packed back to back, 8-byte
// aligned, source and destination in the same phase mod 16 in every band; rotated dims
// (if any) 16-bit interleaved pairs of one head on 4-byte boundaries.
inline bool make_range(const shift_plan::LaunchParams& L, const shift_plan::TileStream& ts, Stream& s) {
  const ops::ShiftTensorParams& t = ts.t;
  const int64_t row = int64_t{t.n_heads} * t.head_bytes;
  const uintptr_t src0 = reinterpret_cast<uintptr_t>(t.base + (L.n_keep + L.n_discard) * t.token_stride);
  if (t.token_stride != row || row % 8 != 0 || src0 % 8 != 0 || (L.n_discard * row) % 16 != 0) return false;
  const int64_t band_tokens = std::min(L.n_discard, L.n_moved);
  if (band_tokens * row >= (int64_t{1} << 30)) return false;
  s.range = 1;
  s.phase = static_cast<int32_t>(src0 % 16);
  s.row_bytes = static_cast<int32_t>(row);
  s.full_bytes = static_cast<int32_t>(band_tokens * row);
  s.last_bytes = static_cast<int32_t>((L.n_moved - (L.n_bands - 1) * band_tokens) * row);
  s.full_chunks = (s.full_bytes + s.phase + 15) / 16;
  s.last_chunks = (s.last_bytes + s.phase + 15) / 16;
  if (s.elem == shift_chain::kCopy) return true;
  const math::RopeLayout& l = L.layout[t.layer];
  if (t.n_heads != 1 || !l.interleaved || !(s.elem == shift_chain::kF16 || s.elem == shift_chain::kBF16)) return false;
  s.rot_lo = t.kind == ops::ShiftKind::Dsv4 ? math::Dsv4RowLayout::kRopeOffset + (l.first_dim - math::Dsv4RowLayout::kNope) * 2
                                            : l.first_dim * 2;
  s.rot_hi = s.rot_lo + 2 * l.n_rot;
  s.pair_base = L.pair_offset[t.layer];
  return s.rot_lo % 4 == 0;
}

// One tensor as a sweep stream; false when the sweep kernel does not handle it.
inline bool make_stream(const shift_plan::LaunchParams& L, const shift_plan::TileStream& ts, Stream& s) {
  const ops::ShiftTensorParams& t = ts.t;
  const int32_t elem = shift_chain::elem_of(t.kind);
  if (!(elem == shift_chain::kCopy || elem == shift_chain::kF32 || elem == shift_chain::kF16 || elem == shift_chain::kBF16))
    return false;
  s = Stream{};
  s.elem = elem;
  s.token_stride = t.token_stride;
  s.src0 = t.base + (L.n_keep + L.n_discard) * t.token_stride;
  s.band_step = L.n_discard * t.token_stride;
  if (t.kind == ops::ShiftKind::Dsv4 || ts.vec != 16) return make_range(L, ts, s);
  const int64_t row = int64_t{t.n_heads} * t.head_bytes;
  s.row_chunks = static_cast<int32_t>(row / 16);
  s.contiguous = t.token_stride == row;
  const int64_t band_tokens = std::min(L.n_discard, L.n_moved);
  const int64_t last_tokens = L.n_moved - (L.n_bands - 1) * band_tokens;
  if (band_tokens * s.row_chunks >= (int64_t{1} << 30)) return false;
  s.full_chunks = static_cast<int32_t>(band_tokens * s.row_chunks);
  s.last_chunks = static_cast<int32_t>(last_tokens * s.row_chunks);
  if (elem == shift_chain::kCopy) return true;
  const math::RopeLayout& l = L.layout[t.layer];
  const int32_t cph = t.head_bytes / 16;
  if (cph > 32 || (cph & (cph - 1)) != 0) return false;  // a head inside a warp, at a fixed lane position
  const int eb = elem == shift_chain::kF32 ? 4 : 2;
  const int rot_byte = l.first_dim * eb, rot_bytes = l.n_rot * eb;
  const bool neox = !l.interleaved;
  if (rot_byte % 16 != 0 || (neox ? (rot_bytes / 2) % 16 : rot_bytes % 16) != 0) return false;
  s.head_mask = cph - 1;
  s.rot_lo = rot_byte / 16;
  s.rot_hi = s.rot_lo + rot_bytes / 16;
  s.half = neox ? rot_bytes / 32 : 0;
  s.pair_base = L.pair_offset[t.layer];
  s.pairs_per_chunk = neox ? 16 / eb : 8 / eb;
  return true;
}

// The sweep launches for a plan: per plan launch, one for its unit streams and one for its
// range streams, either absent when no stream has that shape (so at most 2 *
// plan.launches.size()); the kernel is compiled for one shape, which keeps the unit
// kernel's registers for its loads. Grid not yet set; empty when some tensor or table is
// not handled.
inline std::vector<std::unique_ptr<Params>> make_launches(const shift_plan::Plan& plan) {
  std::vector<std::unique_ptr<Params>> out;
  for (const auto& Lp : plan.launches) {
    const shift_plan::LaunchParams& L = *Lp;
    if (L.n_pairs > kMaxPairs) return {};
    Stream all[shift_plan::kMaxStreams];
    bool shapes[2] = {false, false};
    for (int32_t k = 0; k < L.n_streams; ++k) {
      if (!make_stream(L, L.streams[k], all[k])) return {};
      shapes[all[k].range] = shapes[all[k].range] || all[k].full_chunks > 0;
    }
    for (const int32_t range : {0, 1}) {
      if (!shapes[range]) continue;
      // ~16 KB: the cos/sin entries past n_pairs stay uninitialized (host time a small GPU
      // shift waits for)
      std::unique_ptr<Params> P(new Params);
      P->range = range;
      P->n_pairs = L.n_pairs;
      P->n_bands = L.n_bands;
      std::copy(L.cos_t, L.cos_t + L.n_pairs, P->cos_t);
      std::copy(L.sin_t, L.sin_t + L.n_pairs, P->sin_t);
      int64_t width = 0;
      for (int32_t k = 0; k < L.n_streams; ++k) {
        if (all[k].range != range || all[k].full_chunks == 0) continue;
        Stream& s = P->streams[P->n_streams++];
        s = all[k];
        s.offset = static_cast<int32_t>(width);
        width += round_up(s.full_chunks, 32);
        if (width >= (int64_t{1} << 30)) return {};  // pos + threads stays below 2^32
        s.end = static_cast<int32_t>(width);
      }
      P->width = width;
      out.push_back(std::move(P));
    }
  }
  return out;
}

// Runs the plan with the sweep kernel (src/cuda/shift/shift_sweep.cu) on `stream` (a
// cudaStream_t); `counters`: 2 * plan.launches.size() ints zeroed on the stream. False, with
// nothing queued, when it does not apply: overlap, no counters, or a layout it does not take.
bool launch(const shift_plan::Plan& plan, int device, void* stream, int* counters);

}  // namespace kvcore::ops::cuda::shift_sweep
