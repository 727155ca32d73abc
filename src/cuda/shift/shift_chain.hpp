// The "chain" form of the CUDA shift_dense kernel, in plain C++ (KVCORE_HD) so
// that a CPU test can run its threads in any order (tests/shift_chain_test.cpp).
//
// Token j (0 <= j < n_moved) moves from n_keep + D + j to n_keep + j (D =
// n_discard), so writing token j overwrites the source of token j - D, and
// only that. Cut every row into units (16-byte chunks, say) and call a column
// the units at one position u of the tokens j = r, r + D, r + 2D, ... (one
// residue r < D). Writing a unit of column (r, u) only overwrites a source of
// the same column, one step earlier. So a thread that walks its column in
// increasing j, loading each step before it stores the step after, can never
// clobber bytes someone else still has to read: no bands, no counters, no
// barriers, whatever the overlap. Without overlap (D >= n_moved) every column
// is one step long and this is a plain copy.
//
// A unit that rotates holds whole pairs: NeoX units take a chunk of the lower
// half of the rotated dims plus its partner chunk n_rot/2 dims on; interleaved
// units a chunk of adjacent pairs. The rotation happens in registers with the
// cos/sin of the layer (the same for every token: delta = -D), which each block
// keeps in shared memory. A thread keeps kItems items (unit x step) in flight:
// all loads of a group before any store, steps of one column in order.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "cuda/shift/shift_tiling.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::ops::cuda::shift_chain {

inline constexpr int kItems = 4;  // (unit, step) items a thread loads before it stores
#if defined(__CUDA_ARCH__)
#define KVCORE_SHIFT_UNROLL _Pragma("unroll")
#else
#define KVCORE_SHIFT_UNROLL
#endif  // (unit, step) items a thread loads before it stores

enum Elem : int32_t { kCopy = 0, kF32 = 4, kF16 = 2, kBF16 = 3, kFp8 = 5 };

// One tensor of a launch, cut into units.
struct Stream {
  uint8_t* base = nullptr;
  int64_t token_stride = 0;  // bytes
  int64_t col_begin = 0;     // first global column of this stream
  int64_t col_end = 0;
  int32_t units_per_row = 0, units_per_head = 0, head_bytes = 0;
  int32_t rot_units = 0;   // units per head that rotate (first in a head's unit order)
  int32_t pre_chunks = 0;  // plain chunks of a head before its rotated region
  int32_t rot_chunks = 0;  // chunks of the rotated region: 2 * rot_units (NeoX) or rot_units (interleaved)
  int32_t rot_byte = 0;    // byte offset of the rotated region in a head
  int32_t half_bytes = 0;  // NeoX: partner chunk distance; 0: interleaved
  int32_t vec = 1;         // bytes per chunk: 1, 2, 4, 8 or 16
  int32_t elem = kCopy;    // element type of rotated units
  int32_t pair_base = 0;   // first cos/sin entry of the layer
  int32_t pairs_per_unit = 0;
  uint8_t* scales = nullptr;  // FP8 keys: ue8m0 scales, head_bytes / 64 per head
  int64_t scale_stride = 0;
  int32_t scale_head_bytes = 0;
};

struct Params {
  int64_t n_keep = 0, n_discard = 0, n_moved = 0;
  int64_t total_cols = 0;  // < 2^31
  int32_t n_streams = 0, n_pairs = 0;
  int32_t fp8_head_dim = 0, fp8_interleaved = 0;  // FP8 launches: every stream's head (64 or 128) and pairing
  Stream streams[shift_plan::kMaxStreams];
  float cos_t[shift_plan::kMaxPairsTotal], sin_t[shift_plan::kMaxPairsTotal];
};
static_assert(sizeof(Params) < 32000, "kernel parameters are limited to 32764 bytes");

// One unit at one step.
struct Item {
  uint8_t* src;  // the destination is src - n_discard * token_stride
  int32_t stream;
  int32_t partner;  // NeoX rotated unit: byte distance to the partner chunk; else 0
  int32_t pair0;    // rotated unit: cos/sin entry of its first pair; -1: plain copy
};

// Where unit u (< units_per_row) of a row lies: its byte offset in the row, the distance to
// its rotation partner (0: not rotated) and its first pair (-1: none).
struct UnitPlace {
  int64_t off = 0;
  int32_t partner = 0;
  int32_t pair0 = -1;
};
KVCORE_HD UnitPlace unit_place(const Stream& st, uint32_t u) {
  const uint32_t uph = static_cast<uint32_t>(st.units_per_head);
  const uint32_t h = u / uph;
  int32_t w = static_cast<int32_t>(u - h * uph);
  UnitPlace pl;
  pl.off = int64_t{h} * st.head_bytes;
  if (w < st.rot_units) {
    pl.off += st.rot_byte + int64_t{w} * st.vec;
    pl.partner = st.half_bytes;
    pl.pair0 = st.pair_base + w * st.pairs_per_unit;
  } else {
    w -= st.rot_units;
    pl.off += int64_t{w < st.pre_chunks ? w : w + st.rot_chunks} * st.vec;
  }
  return pl;
}

// A thread's walk: columns G = first, first + T, ... ; every step of a column in order.
struct Cursor {
  uint32_t G = 0;     // total_cols < 2^31 and fewer threads than columns: G + n_threads < 2^32
  int32_t s = 0;
  int32_t left = 0;  // steps of the current column not yet handed out (n_moved < 2^31)
  uint8_t* src = nullptr;
  int64_t step = 0;
  int32_t partner = 0, pair0 = -1;
};

// Positions the cursor on column c.G (< total_cols).
KVCORE_HD void start_column(const Params& p, Cursor& c) {
  while (int64_t{c.G} >= p.streams[c.s].col_end) ++c.s;  // G only grows
  const Stream& st = p.streams[c.s];
  const uint32_t g = static_cast<uint32_t>(int64_t{c.G} - st.col_begin);
  const uint32_t U = static_cast<uint32_t>(st.units_per_row);
  const uint32_t r = g / U, u = g - r * U;
  const int64_t D = p.n_discard;
  c.left = D >= p.n_moved ? 1 : static_cast<int32_t>((static_cast<uint32_t>(p.n_moved) - 1 - r) / static_cast<uint32_t>(D) + 1);
  const UnitPlace pl = unit_place(st, u);
  c.partner = pl.partner;
  c.pair0 = pl.pair0;
  c.step = D * st.token_stride;
  c.src = st.base + (p.n_keep + D + int64_t{r}) * st.token_stride + pl.off;
}

KVCORE_HD Cursor first_cursor(const Params& p, uint32_t thread) {
  Cursor c;
  c.G = thread;
  if (int64_t{c.G} < p.total_cols) start_column(p, c);
  return c;
}

// The next item of this thread, or false when it has none left.
KVCORE_HD bool next_item(const Params& p, uint32_t n_threads, Cursor& c, Item& it) {
  if (c.left == 0) {
    if (int64_t{c.G} >= p.total_cols) return false;
    c.G += n_threads;
    if (int64_t{c.G} >= p.total_cols) return false;
    start_column(p, c);
  }
  it.src = c.src;
  it.stream = c.s;
  it.partner = c.partner;
  it.pair0 = c.pair0;
  c.src += c.step;
  --c.left;
  return true;
}

// ---- rotation of a unit held as 16-byte words --------------------------------------------
struct Chunk {
  uint32_t w[4];
};

// Element e of a chunk; kTag is an Elem (kF32, kF16 or kBF16).
template <int kTag>
KVCORE_HD float chunk_get(const Chunk& c, int e) {
  if constexpr (kTag == kF32) return math::bits_float(c.w[e]);
  else {
    const uint16_t b = static_cast<uint16_t>(c.w[e >> 1] >> ((e & 1) * 16));
    return kTag == kF16 ? math::f16_bits_to_f32(b) : math::bf16_bits_to_f32(b);
  }
}

template <int kTag>
KVCORE_HD void chunk_set(Chunk& c, int e, float x) {
  if constexpr (kTag == kF32) c.w[e] = math::float_bits(x);
  else {
    const uint32_t b = kTag == kF16 ? math::f32_to_f16_bits(x) : math::f32_to_bf16_bits(x);
    const int sh = (e & 1) * 16;
    c.w[e >> 1] = (c.w[e >> 1] & ~(0xffffu << sh)) | (b << sh);
  }
}

// Rotates the pairs of a unit: NeoX pairs (a[e], b[e]), interleaved (a[2e], a[2e+1]).
template <int kTag>
KVCORE_HD void rotate_chunk(Chunk& a, Chunk& b, bool neox, int vec, int pair0, const float* cos_t, const float* sin_t) {
  constexpr int kBytes = kTag == kF32 ? 4 : 2;
  constexpr int kMax = 16 / kBytes;
  const int n = vec / kBytes;  // elements in a chunk
  if (neox) {
    KVCORE_SHIFT_UNROLL
    for (int e = 0; e < kMax; ++e) {
      if (e < n) {
        float x0 = chunk_get<kTag>(a, e), x1 = chunk_get<kTag>(b, e);
        math::rotate_pair(x0, x1, cos_t[pair0 + e], sin_t[pair0 + e]);
        chunk_set<kTag>(a, e, x0);
        chunk_set<kTag>(b, e, x1);
      }
    }
  } else {
    KVCORE_SHIFT_UNROLL
    for (int e = 0; e < kMax / 2; ++e) {
      if (2 * e < n) {
        float x0 = chunk_get<kTag>(a, 2 * e), x1 = chunk_get<kTag>(a, 2 * e + 1);
        math::rotate_pair(x0, x1, cos_t[pair0 + e], sin_t[pair0 + e]);
        chunk_set<kTag>(a, 2 * e, x0);
        chunk_set<kTag>(a, 2 * e + 1, x1);
      }
    }
  }
}

KVCORE_HD void rotate_item(const Stream& st, const Item& it, Chunk& a, Chunk& b, const float* cos_t, const float* sin_t) {
  const bool neox = st.half_bytes != 0;
  switch (st.elem) {
    case kF32: rotate_chunk<kF32>(a, b, neox, st.vec, it.pair0, cos_t, sin_t); break;
    case kF16: rotate_chunk<kF16>(a, b, neox, st.vec, it.pair0, cos_t, sin_t); break;
    case kBF16: rotate_chunk<kBF16>(a, b, neox, st.vec, it.pair0, cos_t, sin_t); break;
    default: break;
  }
}

// ---- FP8 keys: one thread per head ------------------------------------------------------------
// A unit is a whole head (64 or 128 e4m3 codes and their ue8m0 scales, fully
// rotated): the rotation mixes both 64-blocks and each block's new scale needs
// its whole amax, so a thread holds the head in registers (8 x 16 bytes at
// most), takes the amax of the rotated blocks in a first pass and encodes in a
// second (recomputing the rotation: cheaper than 128 more registers). FP8
// streams get their own launch (Params with FP8 streams only), after the other
// streams'; other FP8 layouts (partial rotary, bigger heads) take a tile kernel.

struct Fp8Cursor {
  uint32_t G = 0;
  int32_t s = 0;
  int32_t left = 0;
  uint8_t* src = nullptr;     // codes of the head at the next step
  uint8_t* sc = nullptr;      // its scales
  int64_t step = 0, sc_step = 0;
};

KVCORE_HD void start_fp8_column(const Params& p, Fp8Cursor& c) {
  while (int64_t{c.G} >= p.streams[c.s].col_end) ++c.s;
  const Stream& st = p.streams[c.s];
  const uint32_t g = static_cast<uint32_t>(int64_t{c.G} - st.col_begin);
  const uint32_t U = static_cast<uint32_t>(st.units_per_row);  // heads
  const uint32_t r = g / U, h = g - r * U;
  const int64_t D = p.n_discard;
  c.left = D >= p.n_moved ? 1 : static_cast<int32_t>((static_cast<uint32_t>(p.n_moved) - 1 - r) / static_cast<uint32_t>(D) + 1);
  const int64_t tok = p.n_keep + D + int64_t{r};
  c.step = D * st.token_stride;
  c.sc_step = D * st.scale_stride;
  c.src = st.base + tok * st.token_stride + int64_t{h} * st.head_bytes;
  c.sc = st.scales + tok * st.scale_stride + int64_t{h} * st.scale_head_bytes;
}

KVCORE_HD Fp8Cursor first_fp8_cursor(const Params& p, uint32_t thread) {
  Fp8Cursor c;
  c.G = thread;
  if (int64_t{c.G} < p.total_cols) start_fp8_column(p, c);
  return c;
}

// The next head (codes, scales, stream) of this thread, or false.
KVCORE_HD bool next_fp8(const Params& p, uint32_t n_threads, Fp8Cursor& c, uint8_t*& src, uint8_t*& sc, int32_t& stream) {
  if (c.left == 0) {
    if (int64_t{c.G} >= p.total_cols) return false;
    c.G += n_threads;
    if (int64_t{c.G} >= p.total_cols) return false;
    start_fp8_column(p, c);
  }
  src = c.src;
  sc = c.sc;
  stream = c.s;
  c.src += c.step;
  c.sc += c.sc_step;
  --c.left;
  return true;
}

// The integer E4M3 codec of math/fp8.hpp, two codes at a time (the CUDA kernel
// uses the hardware conversions, which give the same codes).
struct Fp8SoftCodec {
  KVCORE_HD static void decode2(uint32_t two, float& a, float& b) {
    a = math::e4m3_decode(static_cast<uint8_t>(two & 0xffu));
    b = math::e4m3_decode(static_cast<uint8_t>((two >> 8) & 0xffu));
  }
  KVCORE_HD static uint32_t encode2(float a, float b, float inv) {
    return uint32_t{math::e4m3_encode(math::e4m3_scaled(a, inv))} |
           (uint32_t{math::e4m3_encode(math::e4m3_scaled(b, inv))} << 8);
  }
};

// Dequantize, rotate, requantize one fully rotated FP8 head held as words
// (4 codes each, little-endian) and its scales, exactly as math::shift_rotate_head_fp8.
template <int HD, bool kInterleaved, class Codec>
KVCORE_HD void rotate_fp8_head(uint32_t (&w)[HD / 4], uint8_t (&sc)[HD / 64], const float* cos_t, const float* sin_t) {
  constexpr int kBlocks = HD / 64, kSteps = HD / 4;  // a step: pairs 2q and 2q + 1
  float scale[kBlocks], amax[kBlocks], inv[kBlocks];
  KVCORE_SHIFT_UNROLL
  for (int b = 0; b < kBlocks; ++b) scale[b] = math::ue8m0_decode(sc[b]), amax[b] = 0.0f;
  // Step q's four rotated values: codes at dims p0, p0 + 1 (a0, b0) and p1, p1 + 1 (a1, b1).
  auto rotated = [&](int q, int p0, int p1, float& a0, float& b0, float& a1, float& b1) {
    Codec::decode2(w[p0 >> 2] >> ((p0 & 3) * 8), a0, b0);
    Codec::decode2(w[p1 >> 2] >> ((p1 & 3) * 8), a1, b1);
    a0 = a0 * scale[p0 / 64], b0 = b0 * scale[p0 / 64];
    a1 = a1 * scale[p1 / 64], b1 = b1 * scale[p1 / 64];
    if (kInterleaved) {  // pairs (p0, p0 + 1) and (p1, p1 + 1)
      math::rotate_pair(a0, b0, cos_t[2 * q], sin_t[2 * q]);
      math::rotate_pair(a1, b1, cos_t[2 * q + 1], sin_t[2 * q + 1]);
    } else {  // pairs (p0, p1) and (p0 + 1, p1 + 1)
      math::rotate_pair(a0, a1, cos_t[2 * q], sin_t[2 * q]);
      math::rotate_pair(b0, b1, cos_t[2 * q + 1], sin_t[2 * q + 1]);
    }
  };
  // (device: a compiler fence every 4 steps keeps the scheduler from hoisting all 128 cos/sin
  // loads of a pass to its top, which costs more registers than a thread has)
  KVCORE_SHIFT_UNROLL
  for (int q = 0; q < kSteps; ++q) {
    const int p0 = kInterleaved ? 4 * q : 2 * q, p1 = kInterleaved ? 4 * q + 2 : 2 * q + HD / 2;
#if defined(__CUDA_ARCH__)
    if (q % 4 == 0) asm volatile("" ::: "memory");
#endif
    float a0, b0, a1, b1;
    rotated(q, p0, p1, a0, b0, a1, b1);
    amax[p0 / 64] = math::finite_abs_max(math::finite_abs_max(amax[p0 / 64], a0), b0);
    amax[p1 / 64] = math::finite_abs_max(math::finite_abs_max(amax[p1 / 64], a1), b1);
  }
#if defined(__CUDA_ARCH__)
  // The second pass recomputes what the first computed; without this the compiler would keep
  // all 128 rotated values (and the cos/sin) live across the passes and spill.
  KVCORE_SHIFT_UNROLL
  for (int i = 0; i < HD / 4; ++i) asm volatile("" : "+r"(w[i])::"memory");
#endif
  KVCORE_SHIFT_UNROLL
  for (int b = 0; b < kBlocks; ++b) {
    const int k = math::e4m3_scale_exponent(amax[b]);
    inv[b] = math::pow2f(-k);
    sc[b] = math::ue8m0_encode(k);
  }
  KVCORE_SHIFT_UNROLL
  for (int q = 0; q < kSteps; ++q) {  // step q reads and rewrites only its own codes
    const int p0 = kInterleaved ? 4 * q : 2 * q, p1 = kInterleaved ? 4 * q + 2 : 2 * q + HD / 2;
#if defined(__CUDA_ARCH__)
    if (q % 4 == 0) asm volatile("" ::: "memory");
#endif
    float a0, b0, a1, b1;
    rotated(q, p0, p1, a0, b0, a1, b1);
    const uint32_t c0 = Codec::encode2(a0, b0, inv[p0 / 64]) & 0xffffu, c1 = Codec::encode2(a1, b1, inv[p1 / 64]) & 0xffffu;
    w[p0 >> 2] = (w[p0 >> 2] & ~(0xffffu << ((p0 & 3) * 8))) | (c0 << ((p0 & 3) * 8));
    w[p1 >> 2] = (w[p1 >> 2] & ~(0xffffu << ((p1 & 3) * 8))) | (c1 << ((p1 & 3) * 8));
  }
}

// ---- host side ----------------------------------------------------------------------------
inline int32_t elem_of(ops::ShiftKind k) {
  switch (k) {
    case ops::ShiftKind::Copy: return kCopy;
    case ops::ShiftKind::F32: return kF32;
    case ops::ShiftKind::F16: return kF16;
    case ops::ShiftKind::BF16:
    case ops::ShiftKind::Dsv4: return kBF16;
    case ops::ShiftKind::Fp8: return kFp8;
    default: return -1;
  }
}

// Cuts one tensor into units; false when the chain kernels do not handle it.
inline bool make_stream(const shift_plan::TileStream& ts, const math::RopeLayout& l, int32_t pair_base, Stream& s) {
  const ops::ShiftTensorParams& t = ts.t;
  const int32_t elem = elem_of(t.kind);
  if (elem < 0) return false;
  s = Stream{};
  if (elem == kFp8) {
    // a whole head per thread: 64 or 128 codes, every dim rotated, 16-byte aligned rows
    const int hd = t.head_bytes;
    if (!((hd == 64 || hd == 128) && l.first_dim == 0 && l.n_rot == hd && t.scale_head_bytes == hd / 64 && ts.vec == 16))
      return false;
    s.base = t.base;
    s.token_stride = t.token_stride;
    s.head_bytes = hd;
    s.elem = kFp8;
    s.vec = 16;
    s.units_per_row = t.n_heads;
    s.units_per_head = 1;
    s.rot_units = 1;
    s.pair_base = pair_base;
    s.scales = t.maybe_scales;
    s.scale_stride = t.scale_token_stride;
    s.scale_head_bytes = t.scale_head_bytes;
    return true;
  }
  s.base = t.base;
  s.token_stride = t.token_stride;
  s.head_bytes = t.head_bytes;
  s.elem = elem;
  int vec = ts.vec;  // widest access that base, stride and head_bytes allow
  if (elem == kCopy) {
    // A copied row is one run of chunks (heads are packed in a token).
    s.vec = vec;
    s.units_per_row = t.n_heads * t.head_bytes / vec;
    s.units_per_head = s.units_per_row;
    s.head_bytes = t.n_heads * t.head_bytes;
    s.pre_chunks = s.units_per_row;
    return true;
  }
  const int eb = elem == kF32 ? 4 : 2;
  const bool neox = !l.interleaved;
  s.rot_byte = t.kind == ops::ShiftKind::Dsv4 ? math::Dsv4RowLayout::kRopeOffset + (l.first_dim - math::Dsv4RowLayout::kNope) * eb
                                              : l.first_dim * eb;
  const int rot_bytes = l.n_rot * eb;
  const int min_vec = neox ? eb : 2 * eb;
  while (vec > min_vec && (s.rot_byte % vec != 0 || (neox ? (rot_bytes / 2) % vec : rot_bytes % vec) != 0)) vec /= 2;
  if (vec < min_vec || s.rot_byte % vec != 0 || (neox ? (rot_bytes / 2) % vec : rot_bytes % vec) != 0) return false;
  s.vec = vec;
  const int chunks_per_head = t.head_bytes / vec;
  s.rot_chunks = rot_bytes / vec;
  s.rot_units = neox ? s.rot_chunks / 2 : s.rot_chunks;
  s.half_bytes = neox ? rot_bytes / 2 : 0;
  s.pre_chunks = s.rot_byte / vec;
  s.units_per_head = chunks_per_head - (neox ? s.rot_units : 0);
  s.units_per_row = s.units_per_head * t.n_heads;
  s.pair_base = pair_base;
  s.pairs_per_unit = neox ? vec / eb : vec / eb / 2;
  return true;
}

// The chain launches for a plan: per plan launch, one Params for its FP8 key
// streams (fp8_head_dim != 0) after one for the others (either may be absent).
// Empty when some tensor is not handled (the caller then runs a tile kernel).
inline std::vector<std::unique_ptr<Params>> make_launches(const shift_plan::Plan& plan) {
  std::vector<std::unique_ptr<Params>> out;
  int32_t fp8_hd = 0, fp8_il = -1;  // one FP8 layout per call: the FP8 kernel is templated on it
  for (const auto& Lp : plan.launches) {
    const shift_plan::LaunchParams& L = *Lp;
    const int64_t residues = std::min(L.n_discard, L.n_moved);
    for (const bool fp8 : {false, true}) {
      auto P = std::make_unique<Params>();
      P->n_keep = L.n_keep;
      P->n_discard = L.n_discard;
      P->n_moved = L.n_moved;
      P->n_pairs = L.n_pairs;
      std::copy(L.cos_t, L.cos_t + L.n_pairs, P->cos_t);
      std::copy(L.sin_t, L.sin_t + L.n_pairs, P->sin_t);
      int64_t cols = 0;
      for (int32_t k = 0; k < L.n_streams; ++k) {
        const shift_plan::TileStream& ts = L.streams[k];
        if ((ts.t.kind == ops::ShiftKind::Fp8) != fp8) continue;
        const math::RopeLayout& lay = L.layout[ts.t.layer];
        Stream& s = P->streams[P->n_streams];
        if (!make_stream(ts, lay, L.pair_offset[ts.t.layer], s)) return {};
        if (fp8) {
          if ((fp8_hd != 0 && fp8_hd != s.head_bytes) || (fp8_il >= 0 && fp8_il != lay.interleaved)) return {};
          fp8_hd = s.head_bytes;
          fp8_il = lay.interleaved;
        }
        s.col_begin = cols;
        cols += residues * s.units_per_row;
        s.col_end = cols;
        ++P->n_streams;
      }
      if (cols >= (int64_t{1} << 31) || L.n_moved >= (int64_t{1} << 31)) return {};
      P->total_cols = cols;
      if (fp8) P->fp8_head_dim = fp8_hd, P->fp8_interleaved = fp8_il;
      if (P->n_streams > 0) out.push_back(std::move(P));
    }
  }
  return out;
}

// Runs the plan with the chain kernel on `stream` (a cudaStream_t); false, with
// nothing queued, when some tensor is not handled (src/cuda/shift/shift_chain.cu).
bool launch(const shift_plan::Plan& plan, int device, void* stream);

}  // namespace kvcore::ops::cuda::shift_chain
