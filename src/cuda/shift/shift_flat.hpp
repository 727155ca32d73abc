// The "flat" form of the CUDA shift_dense kernel, for shifts without overlap
// (n_discard >= n_moved: sources and destinations are disjoint, so any order
// is correct). That is a copy plus one constant rotation of K, and is written
// like a copy: a 2-D grid (blockIdx.y = tensor), every thread walks its
// tensor's items grid-stride, kFlatBatch items loaded before any is stored,
// no shared-memory staging, no atomics, no counters, no memset.
//
// Items come in two shapes:
//  * units (the chain kernel's decomposition, shift_chain.hpp): a chunk of a
//    row, or for NeoX a chunk of the lower rotated half plus its partner
//    n_rot/2 dims on; the widest access that the rows allow.
//  * range: a tensor whose moved rows are one contiguous byte range (whole
//    rows, token stride = row bytes) with 16-bit interleaved pairs, e.g. the
//    DeepSeek-V4 584-byte row, whose stride allows only 8-byte accesses per
//    row. When source and destination have the same phase mod 16 (0 or 8) the
//    range is moved in aligned 16-byte chunks (8-byte halves at its two
//    ends), and each 4-byte word of a chunk that holds a rotated pair of its
//    row is rotated in registers.
// The body is host+device code: tests/shift_flat_test.cpp runs every item on
// the host and compares with the CPU op.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/shift/shift_chain.hpp"

namespace kvcore::cuda::shift_flat {

inline constexpr int kFlatBatch = 2;  // items a thread loads before it stores

enum Shape : int32_t { kUnits = 0, kRange = 1 };

struct Stream {
  shift_chain::Stream u;  // the unit decomposition (kUnits); u.elem / u.pair_base also for kRange
  int32_t shape = kUnits;
  int64_t n_items = 0;
  uint8_t* src0 = nullptr;  // first moved byte (row n_keep + D)
  int64_t shift = 0;        // dst = src - shift
  // kRange
  int32_t phase = 0;        // src0 % 16: 0 or 8
  int64_t range_bytes = 0;  // n_moved * row bytes (a multiple of 8)
  int32_t row_bytes = 0;
  int32_t rot_lo = 0, rot_hi = 0;  // rotated byte range in a row (interleaved 16-bit pairs)
};

struct Params {
  int32_t n_streams = 0, n_pairs = 0;
  Stream streams[shift_plan::kMaxStreams];
  float cos_t[shift_plan::kMaxPairsTotal], sin_t[shift_plan::kMaxPairsTotal];
};
static_assert(sizeof(Params) < 32000, "kernel parameters are limited to 32764 bytes");

// One item: where it is and how to move it.
struct Item {
  uint8_t* src = nullptr;  // units: the chunk; range: the 16-byte aligned chunk
  int32_t bytes = 0;       // units: vec; range: 16, or 8 at an end (then `src` is that half)
  int32_t partner = 0;     // units, NeoX rotated: byte distance to the partner chunk
  int32_t pair0 = -1;      // units, rotated: cos/sin entry of its first pair
  int64_t q = 0;           // range: offset of the item's first byte in the range
};

// Item i (< st.n_items) of a stream.
KVCORE_HD Item decode(const Stream& st, int64_t i) {
  Item it;
  if (st.shape == kRange) {
    // chunk i covers range bytes [16i - phase, 16i - phase + 16), clipped to [0, range_bytes)
    int64_t q = 16 * i - st.phase;
    int64_t end = q + 16;
    if (q < 0) q = 0;
    if (end > st.range_bytes) end = st.range_bytes;
    it.q = q;
    it.src = st.src0 + q;
    it.bytes = static_cast<int32_t>(end - q);
    return it;
  }
  const shift_chain::Stream& s = st.u;
  const int64_t U = s.units_per_row;
  const int64_t r = i / U;
  const shift_chain::UnitPlace pl = shift_chain::unit_place(s, static_cast<uint32_t>(i - r * U));
  it.partner = pl.partner;
  it.pair0 = pl.pair0;
  it.src = st.src0 + r * s.token_stride + pl.off;
  it.bytes = s.vec;
  return it;
}

// Rotate the words of a range item that hold rotated pairs (interleaved 16-bit pairs).
template <int kTag>
KVCORE_HD void rotate_range(const Stream& st, const Item& it, shift_chain::Chunk& c, const float* cos_t,
                            const float* sin_t) {
  const int64_t rb = st.row_bytes;
  int64_t off = it.q % rb;  // offset of the item's first byte in its row
  KVCORE_SHIFT_UNROLL
  for (int w = 0; w < 4; ++w) {  // constant word indices: the chunk stays in registers
    if (4 * w >= it.bytes) break;
    const int64_t o = off + 4 * w < rb ? off + 4 * w : off + 4 * w - rb;  // an item may straddle two rows
    if (o >= st.rot_lo && o < st.rot_hi) {
      const int32_t pair = st.u.pair_base + static_cast<int32_t>((o - st.rot_lo) / 4);
      float x0 = shift_chain::chunk_get<kTag>(c, 2 * w), x1 = shift_chain::chunk_get<kTag>(c, 2 * w + 1);
      math::rotate_pair(x0, x1, cos_t[pair], sin_t[pair]);
      shift_chain::chunk_set<kTag>(c, 2 * w, x0);
      shift_chain::chunk_set<kTag>(c, 2 * w + 1, x1);
    }
  }
}

// Rotate an item in registers (a: the item's bytes; b: a NeoX partner chunk).
KVCORE_HD void rotate(const Stream& st, const Item& it, shift_chain::Chunk& a, shift_chain::Chunk& b, const float* cos_t,
                      const float* sin_t) {
  if (st.shape == kRange) {
    if (st.rot_hi <= st.rot_lo) return;
    if (st.u.elem == shift_chain::kF16) rotate_range<shift_chain::kF16>(st, it, a, cos_t, sin_t);
    else rotate_range<shift_chain::kBF16>(st, it, a, cos_t, sin_t);
    return;
  }
  if (it.pair0 < 0) return;
  shift_chain::Item ci;
  ci.pair0 = it.pair0;
  ci.partner = it.partner;
  shift_chain::rotate_item(st.u, ci, a, b, cos_t, sin_t);
}

// ---- host side ----------------------------------------------------------------------------
// A range stream for a tensor the units decomposition moves with 8-byte accesses or less,
// when its rows allow 16-byte chunks: whole contiguous rows, 16-bit interleaved pairs
// (or none) on 4-byte boundaries, source and destination in the same phase mod 16.
inline bool make_range(const shift_plan::LaunchParams& L, const shift_plan::TileStream& ts, const Stream& units,
                       Stream& out) {
  const ops::ShiftTensorParams& t = ts.t;
  const int64_t row = int64_t{t.n_heads} * t.head_bytes;
  if (ts.vec >= 16 || t.kind == ops::ShiftKind::Fp8 || t.token_stride != row || row % 8 != 0) return false;
  const uint8_t* src0 = t.base + (L.n_keep + L.n_discard) * t.token_stride;
  const uint8_t* dst0 = t.base + L.n_keep * t.token_stride;
  const uintptr_t ph = reinterpret_cast<uintptr_t>(src0) % 16;
  if (ph % 8 != 0 || reinterpret_cast<uintptr_t>(dst0) % 16 != ph) return false;
  out = units;
  out.shape = kRange;
  out.phase = static_cast<int32_t>(ph);
  out.row_bytes = static_cast<int32_t>(row);
  out.range_bytes = L.n_moved * row;
  out.n_items = (out.range_bytes + ph + 15) / 16;
  if (t.kind != ops::ShiftKind::Copy) {
    const math::RopeLayout& l = L.layout[t.layer];
    const shift_chain::Stream& u = units.u;
    // one head per row, 16-bit interleaved pairs on 4-byte boundaries
    if (t.n_heads != 1 || !l.interleaved || (u.elem != shift_chain::kF16 && u.elem != shift_chain::kBF16) ||
        u.rot_byte % 4 != 0)
      return false;
    out.rot_lo = u.rot_byte;
    out.rot_hi = u.rot_byte + 2 * l.n_rot;
  }
  return true;
}

// The flat launches for a plan without overlap (one per plan launch); empty when some
// tensor is not handled (FP8 keys, or a layout the unit decomposition rejects).
inline std::vector<std::unique_ptr<Params>> make_launches(const shift_plan::Plan& plan) {
  std::vector<std::unique_ptr<Params>> out;
  for (const auto& Lp : plan.launches) {
    const shift_plan::LaunchParams& L = *Lp;
    if (L.n_discard < L.n_moved) return {};
    auto P = std::make_unique<Params>();
    P->n_pairs = L.n_pairs;
    std::copy(L.cos_t, L.cos_t + L.n_pairs, P->cos_t);
    std::copy(L.sin_t, L.sin_t + L.n_pairs, P->sin_t);
    for (int32_t k = 0; k < L.n_streams; ++k) {
      const shift_plan::TileStream& ts = L.streams[k];
      if (ts.t.kind == ops::ShiftKind::Fp8) return {};
      Stream s;
      if (!shift_chain::make_stream(ts, L.layout[ts.t.layer], L.pair_offset[ts.t.layer], s.u)) return {};
      s.shape = kUnits;
      s.src0 = ts.t.base + (L.n_keep + L.n_discard) * ts.t.token_stride;
      s.shift = L.n_discard * ts.t.token_stride;
      s.n_items = L.n_moved * s.u.units_per_row;
      Stream r;
      if (make_range(L, ts, s, r)) s = r;
      if (s.n_items > 0) P->streams[P->n_streams++] = s;
    }
    if (P->n_streams > 0) out.push_back(std::move(P));
  }
  return out;
}

// Runs the plan with the flat kernel on `stream` (a cudaStream_t); false, with nothing
// queued, when it does not apply (src/cuda/shift/shift_flat.cu).
bool launch(const shift_plan::Plan& plan, int device, void* stream);

}  // namespace kvcore::cuda::shift_flat
