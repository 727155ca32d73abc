// The DeepSeek-V4 context shift of one sequence: plans the moves (ops/dsv4_shift.hpp) and
// runs them on the cache's device. Every argument was checked by Dsv4Cache::shift.
#include "ops/dsv4_shift.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/shift_rotate.hpp"
#include "kvcore/runtime.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::ops {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// cos / sin of delta * w_i for every table the call rotates with, each appended once.
struct SinCos {
  std::vector<float> cos_t, sin_t;
  std::map<const math::RopeTable*, int32_t> offset;
  int32_t delta = 0;
  int32_t of(const math::RopeTable* t) {
    auto it = offset.find(t);
    if (it != offset.end()) return it->second;
    const int32_t at = static_cast<int32_t>(cos_t.size());
    for (int32_t i = 0; i < t->layout.n_pairs(); ++i) {
      float s, c;
      math::shift_sincos(delta, t->freq[i], &s, &c);
      cos_t.push_back(c);
      sin_t.push_back(s);
    }
    offset.emplace(t, at);
    return at;
  }
};

// A region of a tensor that must be copied aside before the jobs run.
struct Snapshot {
  const uint8_t* from = nullptr;
  size_t bytes = 0;
  size_t at = 0;  // offset in scratch
};

// Compressed attention rows of every layer with this ratio, through the dense shift kernels:
// rows are the unit of the move, -n_discard tokens the angle.
void shift_attention_rows(const Dsv4ShiftCall& c, int32_t ratio, SinCos& sc) {
  const int64_t keep = c.n_keep / ratio, discard = c.n_discard / ratio, moved = c.length / ratio - keep - discard;
  if (moved <= 0) return;
  std::vector<ShiftTensorParams> tensors;
  std::vector<math::RopeLayout> layouts;
  std::vector<int32_t> pair_offset;
  for (const Dsv4ShiftLayerViews& L : c.layers) {
    if (L.ratio != ratio) continue;
    ShiftTensorParams t;
    t.base = static_cast<uint8_t*>(L.rows.data());
    t.n_heads = 1;
    if (c.rows_packed) {
      t.kind = ShiftKind::Dsv4;
      t.head_bytes = math::Dsv4RowLayout::kBytes;
    } else {
      t.kind = ShiftKind::F32;
      t.head_bytes = c.head_dim * 4;
    }
    t.token_stride = t.head_bytes;
    t.layer = static_cast<int32_t>(tensors.size());
    tensors.push_back(t);
    layouts.push_back(c.comp_rope->layout);
    pair_offset.push_back(0);
  }
  if (tensors.empty()) return;
  const int32_t off = sc.of(c.comp_rope);
  ShiftDenseParams p;
  p.tensors = tensors.data();
  p.n_tensors = static_cast<int32_t>(tensors.size());
  p.layouts = layouts.data();
  p.pair_offset = pair_offset.data();
  p.cos_t = sc.cos_t.data() + off;
  p.sin_t = sc.sin_t.data() + off;
  p.n_layers = p.n_tensors;
  p.n_keep = keep;
  p.n_discard = discard;
  p.n_moved = moved;
  p.device_index = c.device.index;
  if (c.device.is_cpu()) {
    cpu::shift_dense(p);
  } else {
#if KVCORE_WITH_CUDA
    cuda::shift_dense(p, c.stream);
#endif
  }
}

}  // namespace

void dsv4_shift_sequence(const Dsv4ShiftCall& c, Buffer& scratch) {
  const int64_t K = c.n_keep, D = c.n_discard, Lp = c.length - c.n_discard;
  SinCos sc;
  sc.delta = static_cast<int32_t>(-D);
  std::vector<Dsv4ShiftJob> jobs;
  std::vector<Snapshot> snaps;
  size_t scratch_bytes = 0;
  auto snapshot = [&](const uint8_t* from, size_t bytes) {
    snaps.push_back({from, bytes, scratch_bytes});
    scratch_bytes += align_up(bytes);
    return snaps.back().at;
  };
  // Scratch addresses are known only once it is allocated: jobs record offsets first.
  std::vector<std::pair<size_t, size_t>> src_from_scratch;  // (job, offset)

  // Raw rings: the last min(L', W) new positions q, from old token q (q < n_keep) or q + D.
  const int32_t W = c.window;
  const int64_t q0 = std::max<int64_t>(0, Lp - W), t0 = std::max(q0, K);
  const bool ring_in_place = D % W == 0;  // o(q) % W == q % W: only the tail rotates
  for (const Dsv4ShiftLayerViews& L : c.layers) {
    Dsv4ShiftJob j;
    j.dst = static_cast<uint8_t*>(L.ring.data());
    j.row_bytes = L.ring.size(1) * static_cast<int64_t>(L.ring.element_size());
    j.modulus = W;
    j.dim = c.head_dim;
    j.kind = c.quant ? Dsv4ShiftRowKind::F16 : Dsv4ShiftRowKind::F32;
    j.layout = L.raw_rope->layout;
    j.pair_offset = sc.of(L.raw_rope);
    size_t snap = 0;
    if (ring_in_place) {
      j.src = j.dst;
    } else {
      snap = snapshot(j.dst, static_cast<size_t>(W * j.row_bytes));
    }
    if (!ring_in_place && q0 < K) {  // kept prefix rows in the new window (only when L <= W)
      Dsv4ShiftJob pre = j;
      pre.src_row0 = static_cast<int32_t>(q0);
      pre.dst_row0 = static_cast<int32_t>(q0);
      pre.n_rows = static_cast<int32_t>(K - q0);
      pre.rotate = 0;
      src_from_scratch.emplace_back(jobs.size(), snap);
      jobs.push_back(pre);
    }
    if (Lp > t0) {
      j.src_row0 = static_cast<int32_t>((t0 + D) % W);
      j.dst_row0 = static_cast<int32_t>(t0 % W);
      j.n_rows = static_cast<int32_t>(Lp - t0);
      j.rotate = 1;
      if (!ring_in_place) src_from_scratch.emplace_back(jobs.size(), snap);
      jobs.push_back(j);
    }
  }

  // Indexer rows: rows K/m + D/m + i -> K/m + i, rotated in the plain domain.
  for (const Dsv4ShiftLayerViews& L : c.layers) {
    if (L.idx_rows.empty()) continue;
    const int64_t m = L.ratio, keep = K / m, discard = D / m, moved = c.length / m - keep - discard;
    if (moved <= 0) continue;
    Dsv4ShiftJob j;
    j.dst = static_cast<uint8_t*>(L.idx_rows.data());
    j.row_bytes = L.idx_rows.size(1) * static_cast<int64_t>(L.idx_rows.element_size());
    j.dim = c.index_dim;
    j.kind = !c.quant ? Dsv4ShiftRowKind::F32 : c.idx_packed ? Dsv4ShiftRowKind::Fp4Packed : Dsv4ShiftRowKind::Fp4F32;
    j.layout = c.idx_rope->layout;
    j.pair_offset = sc.of(c.idx_rope);
    j.rotate = 1;
    j.dst_row0 = static_cast<int32_t>(keep);
    j.n_rows = static_cast<int32_t>(moved);
    const uint8_t* first_src = j.dst + (keep + discard) * j.row_bytes;
    if (discard >= moved) {  // sources and destinations are disjoint
      j.src = j.dst;
      j.src_row0 = static_cast<int32_t>(keep + discard);
    } else {
      src_from_scratch.emplace_back(jobs.size(), snapshot(first_src, static_cast<size_t>(moved * j.row_bytes)));
      j.src_row0 = 0;
    }
    jobs.push_back(j);
  }
  sc.of(c.comp_rope);  // the attention rows' table, computed before anything runs

  // Everything that can fail on the host (allocation) happens before the first write.
  if (scratch.size() < scratch_bytes || scratch.device() != c.device) scratch = Buffer(std::max<size_t>(scratch_bytes, 1), c.device);
  auto* base = static_cast<uint8_t*>(scratch.data());
  for (const auto& [ji, at] : src_from_scratch) jobs[ji].src = base + at;
  for (const Snapshot& s : snaps) copy_bytes(base + s.at, c.device, s.from, c.device, s.bytes, c.stream);

  std::vector<int32_t> ratios;
  for (const Dsv4ShiftLayerViews& L : c.layers)
    if (L.ratio > 0 && std::find(ratios.begin(), ratios.end(), L.ratio) == ratios.end()) ratios.push_back(L.ratio);
  for (int32_t r : ratios) shift_attention_rows(c, r, sc);

  if (jobs.empty()) return;
  std::vector<int64_t> row_start(jobs.size() + 1, 0);
  for (size_t i = 0; i < jobs.size(); ++i) row_start[i + 1] = row_start[i] + jobs[i].n_rows;
  Dsv4ShiftJobsParams p;
  p.jobs = jobs.data();
  p.row_start = row_start.data();
  p.n_jobs = static_cast<int32_t>(jobs.size());
  p.total_rows = row_start.back();
  p.cos_t = sc.cos_t.data();
  p.sin_t = sc.sin_t.data();
  p.device_index = c.device.index;
  if (c.device.is_cpu()) {
    cpu::dsv4_shift_jobs(p);
  } else {
#if KVCORE_WITH_CUDA
    cuda::dsv4_shift_jobs(p, c.stream);
#endif
  }
}

}  // namespace kvcore::ops
