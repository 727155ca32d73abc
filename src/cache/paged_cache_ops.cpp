// PagedCache sequence operations. Each one: validate, count what it needs (blocks
// for new cells and for copy-on-write) and throw before touching anything when
// that is not available; then change the host metadata inside a PagedTxn, do the
// device work (block copies, stores: only into cells no sequence uses yet), mirror
// the changed cell arrays, and commit. Any failure rolls the host changes back.
#include <algorithm>

#include "cache/paged_impl.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/hd.hpp"
#include "kvcore/ops/kv_store_layers.hpp"
#include "kvcore/runtime.hpp"
#include "ops/checks.hpp"
#include "ops/paged_rotate.hpp"

namespace kvcore {

SeqId PagedCache::create() {
  Impl& m = impl();
  m.check_usable();
  PagedTxn txn(m.meta);
  const SeqId id = txn.add_seq(PagedSeq{});
  txn.commit();
  return id;
}

SeqId PagedCache::fork(SeqId seq) {
  Impl& m = impl();
  m.check_usable();
  m.meta.seq(seq);
  PagedTxn txn(m.meta);
  PagedSeq& src = txn.seq(seq);
  src.version = txn.next_version();  // outstanding tickets of src must not write into shared blocks
  PagedSeq copy = src;
  txn.add_refs(copy.blocks, 1);
  const SeqId id = txn.add_seq(std::move(copy));
  txn.commit();
  return id;
}

void PagedCache::erase(SeqId seq) {
  Impl& m = impl();
  m.check_usable();
  m.meta.seq(seq);
  PagedTxn txn(m.meta);
  // Blocks another sequence still holds lose one reference in bulk; the others go back to the free list.
  std::vector<int32_t> shared;
  for (int32_t b : txn.seq(seq).blocks) {
    if (m.meta.refcount[b] > 1) shared.push_back(b);
    else txn.release_block(b);
  }
  txn.add_refs(shared, -1);
  txn.remove_seq(seq);
  m.finish(txn, {});
}

// ---- append / reserve / store ---------------------------------------------------------

namespace {

void check_rows(std::string_view op, std::string_view name, const TensorRef& t, int dims, const int64_t* want,
                Device dev) {
  checks::not_null(op, name, t);
  checks::ndim_is(op, name, t, dims);
  require_arg(t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16, op, ": ", name,
              " must be f32, f16 or bf16, got ", dtype_name(t.dtype()));
  for (int i = 0; i < dims; ++i) checks::size_is(op, name, t, i, want[i]);
  checks::innermost_contiguous(op, name, t);
  checks::non_negative_strides(op, name, t);
  if (t.device() != dev)  // messages that format are built only on failure
    require_arg(false, op, ": ", name, " is on ", t.device().str(), " but the cache is on ", dev.str());
}

// The [n, H, D] slice of layer l of a [L, n, H, D] tensor.
TensorRef layer_slice(const TensorRef& t, int32_t l) {
  const int64_t shape[3] = {t.size(1), t.size(2), t.size(3)};
  const int64_t strides[3] = {t.stride(1), t.stride(2), t.stride(3)};
  char* base = static_cast<char*>(t.data()) + l * t.stride(0) * static_cast<int64_t>(t.element_size());
  return TensorRef(base, t.dtype(), t.device(), 3, shape, strides);
}

}  // namespace

int64_t PagedCache::Impl::plan_blocks(std::string_view op, std::span<const SeqId> seqs,
                                      std::span<const int32_t> counts) const {
  require_arg(seqs.size() == counts.size(), op, ": ", seqs.size(), " sequence ids but ", counts.size(), " counts");
  int64_t need = 0;
  std::vector<int32_t> shared_tails;  // partly filled tail blocks held by others too, once per appending holder
  for (size_t i = 0; i < seqs.size(); ++i) {
    require_arg(counts[i] >= 0, op, ": counts[", i, "] must be >= 0, got ", counts[i]);
    for (size_t j = 0; j < i; ++j) require_arg(seqs[j] != seqs[i], op, ": sequence id ", seqs[i], " appears twice");
    const PagedSeq& s = meta.seq(seqs[i]);
    if (counts[i] == 0) continue;
    const int64_t cells = static_cast<int64_t>(s.n_cells) + counts[i];
    require_arg(cells <= INT32_MAX / 2, op, ": sequence ", seqs[i], " would span ", cells, " cells");
    need += math::ceil_div<int64_t>(cells, cfg.block_size) - static_cast<int64_t>(s.blocks.size());
    if (s.n_cells % cfg.block_size != 0 && meta.refcount[s.blocks.back()] > 1) shared_tails.push_back(s.blocks.back());
  }
  // Copy on write: of k appending holders of a tail block with refcount r, each copies while
  // the block has another holder, so min(k, r - 1) copies.
  std::sort(shared_tails.begin(), shared_tails.end());
  for (size_t i = 0; i < shared_tails.size();) {
    size_t j = i;
    while (j < shared_tails.size() && shared_tails[j] == shared_tails[i]) ++j;
    need += std::min<int64_t>(static_cast<int64_t>(j - i), meta.refcount[shared_tails[i]] - 1);
    i = j;
  }
  return need;
}

int64_t PagedCache::blocks_needed(std::span<const SeqId> seqs, std::span<const int32_t> counts) const {
  const Impl& m = impl();
  m.check_usable();
  return m.plan_blocks("PagedCache::blocks_needed", seqs, counts);
}

bool PagedCache::can_fit(std::span<const SeqId> seqs, std::span<const int32_t> counts) const {
  const Impl& m = impl();
  m.check_usable();
  return m.plan_blocks("PagedCache::can_fit", seqs, counts) <= static_cast<int64_t>(m.meta.free_list.size());
}

bool PagedCache::can_fit(SeqId seq, int32_t n_tokens) const {
  const SeqId ids[1] = {seq};
  const int32_t counts[1] = {n_tokens};
  return can_fit(ids, counts);
}

uint64_t PagedCache::Impl::stamp_of(const AppendTicket& t) const {
  uint64_t h = ticket_key;
  auto mix = [&h](uint64_t x) {
    h = (h ^ x) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
  };
  mix(t.owner_);
  mix(static_cast<uint64_t>(t.n_tokens_));
  mix(t.seqs_.size());
  for (size_t i = 0; i < t.seqs_.size(); ++i) {
    mix(static_cast<uint64_t>(t.seqs_[i]));
    mix(i < t.versions_.size() ? t.versions_[i] : ~uint64_t{0});
    mix(i < t.counts_.size() ? static_cast<uint64_t>(t.counts_[i]) : ~uint64_t{0});
  }
  mix(t.versions_.size() ^ (t.counts_.size() << 32));
  mix(reinterpret_cast<uintptr_t>(t.slots_.data()) ^ (t.slots_.size() << 1));
  mix(reinterpret_cast<uintptr_t>(t.positions_.data()) ^ (t.positions_.size() << 1));
  return h;
}

void PagedCache::Impl::check_no_v(std::string_view op, const TensorRef& v) const {
  if (v.empty() || v.numel() == 0) return;
  if (cfg.v_from_k_latent)
    require_arg(false, op, ": this cache reads V from K's latent (v_from_k_latent: V is the first v_head_dim = ",
                cfg.v_head_dim, " dims of each K row, written with K), so v must be empty, got ", described(v));
  require_arg(false, op, ": this cache has no V pools, but v = ", described(v));
}

void PagedCache::Impl::check_ticket(std::string_view op, const AppendTicket& t) const {
  if (t.owner_ != id || t.stamp_ != stamp_of(t)) {
    require_arg(t.owner_ != 0, op, ": the ticket holds no reservation (default constructed, moved from, or its "
                "reserve() failed)");
    require_arg(t.owner_ == id, op, ": the ticket was issued by another cache");
    require_arg(false, op, ": the ticket was altered after reserve()");
  }
  for (size_t i = 0; i < t.seqs_.size(); ++i) {
    auto it = meta.seqs.find(t.seqs_[i]);
    require_arg(it != meta.seqs.end() && it->second.version == t.versions_[i], op, ": the ticket of sequence ",
                t.seqs_[i], " is stale (the sequence changed or was erased since reserve())");
  }
}

void PagedCache::Impl::reserve_impl(AppendTicket& t, std::span<const SeqId> seqs, std::span<const int32_t> counts,
                                    std::span<const int32_t> positions, const TensorRef* k_all, const TensorRef* v_all) {
  constexpr std::string_view op = "PagedCache::reserve";
  check_usable();
  t.owner_ = 0;  // from here on `t` holds no reservation until this one succeeds
  const int64_t need = plan_blocks(op, seqs, counts);
  int64_t total = 0;
  for (int32_t c : counts) total += c;
  require_arg(total == static_cast<int64_t>(positions.size()), op, ": counts add up to ", total, " tokens but ",
              positions.size(), " positions were given");
  require_arg(total <= INT32_MAX / 2, op, ": too many tokens in one call: ", total);
  size_t at = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const PagedSeq& s = meta.seq(seqs[i]);
    int32_t last = -1;
    if (s.n_cells > 0) {
      const int32_t c = s.n_cells - 1;
      last = meta.pos(meta.cell(s.blocks[c / cfg.block_size], c % cfg.block_size)) - s.pos_offset;
    }
    for (int32_t j = 0; j < counts[i]; ++j, ++at) {
      const int32_t p = positions[at];
      require_arg(p >= 0, op, ": positions[", at, "] = ", p, " is negative");
      require_arg(p < INT32_MAX - s.pos_offset, op, ": positions[", at, "] = ", p, " overflows i32 with sequence ", seqs[i],
                  "'s position offset ", s.pos_offset);
      if (cfg.strict_positions)
        require_arg(p > last, op, ": positions[", at, "] = ", p, " of sequence ", seqs[i], " does not follow position ",
                    last, " (positions must increase)");
      last = p;
    }
  }
  require(need <= static_cast<int64_t>(meta.free_list.size()), ErrorCode::OutOfMemory, op, ": ", total,
          " new tokens need ", need, " free blocks, the pool has ", meta.free_list.size(), " of ", cfg.num_blocks);

  // The ticket's device buffers are reused when they are large enough (and on this device).
  const size_t bytes = static_cast<size_t>(total) * 4;
  if (t.slots_.size() < bytes || t.slots_.device() != dev) t.slots_ = Buffer(bytes, dev);
  if (t.positions_.size() < bytes || t.positions_.device() != dev) t.positions_ = Buffer(bytes, dev);
  t.seqs_.assign(seqs.begin(), seqs.end());
  t.counts_.assign(counts.begin(), counts.end());
  t.versions_.clear();
  t.n_tokens_ = static_cast<int32_t>(total);
  host_slots.resize(static_cast<size_t>(total));

  PagedTxn txn(meta);
  // Block copies, as (source, target) pairs: blocks taken from the free list are zeroed first
  // (copied from the zero block: no sequence's old K/V shows in a layer not stored yet), then
  // the copies of shared tail blocks.
  std::vector<int32_t> zero, cow;
  at = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    PagedSeq& s = txn.seq(seqs[i]);
    if (counts[i] > 0) {
      const int32_t tail_used = s.n_cells % cfg.block_size;
      if (tail_used != 0 && meta.refcount[s.blocks.back()] > 1) {
        const int32_t src = s.blocks.back();
        s.blocks.back() = txn.copy_block(src, tail_used);
        cow.push_back(src);
        cow.push_back(s.blocks.back());
      }
      for (int32_t j = 0; j < counts[i];) {  // one run of cells per block
        const int32_t c = s.n_cells + j;
        if (c % cfg.block_size == 0 && static_cast<size_t>(c / cfg.block_size) == s.blocks.size()) {
          const int32_t b = txn.pop_free();
          txn.set_refcount(b, 1);
          s.blocks.push_back(b);
          zero.push_back(zero_block());
          zero.push_back(b);
        }
        const int32_t b = s.blocks[c / cfg.block_size], slot = c % cfg.block_size;
        const int32_t run = std::min(cfg.block_size - slot, counts[i] - j);
        txn.set_run(b, slot, run, positions.data() + at, s.pos_offset);
        const int32_t first = static_cast<int32_t>(meta.cell(b, slot));
        for (int32_t k = 0; k < run; ++k) host_slots[at + k] = first + k;
        j += run;
        at += run;
      }
      s.n_cells += counts[i];
      s.n_live += counts[i];
    }
    s.version = txn.next_version();
    t.versions_.push_back(s.version);
  }
  const size_t n_zero = zero.size() / 2;
  zero.insert(zero.end(), cow.begin(), cow.end());
  // The new cells' mirrors come from the ticket's device lists (one small kernel) when the stored
  // positions are the given ones (no position offset); otherwise the changed blocks are uploaded.
  bool plain = true;
  for (SeqId id : seqs) plain = plain && meta.seqs.at(id).pos_offset == 0;
  finish(txn, zero, [&] {
    copy_bytes(t.slots_.data(), dev, host_slots.data(), Device::cpu(), host_slots.size() * 4, cfg.stream);
    copy_bytes(t.positions_.data(), dev, positions.data(), Device::cpu(), positions.size() * 4, cfg.stream);
    if (plain) mirror_set_cells(t.slots_.as<int32_t>(), t.positions_.as<int32_t>(), t.n_tokens_);
    if (k_all) {
      TensorRef angle_view;  // the call's angles, computed once for every layer's K
      if (!one_rope && shared_angles && cfg.n_layers > 1 && t.n_tokens_ > 0) {
        const int64_t np = rope[0].layout.n_pairs();
        const size_t bytes = static_cast<size_t>(t.n_tokens_) * np * 2 * sizeof(float);
        if (angles.size() < bytes || angles.device() != dev) angles = Buffer(bytes, dev);
        angle_view = TensorRef(angles.data(), DType::F32, dev, {t.n_tokens_, np, 2});
        kv_rope_angles(t.position_view(), rope[0], angle_view, cfg.stream);
      }
      store_all(t, *k_all, has_v() ? *v_all : TensorRef(), angle_view);
    }
    if (dev.is_cuda()) synchronize(dev, cfg.stream);  // surface kernel faults before the commit
  }, /*sync_dirty=*/!plain, n_zero);
  t.owner_ = id;
  t.stamp_ = stamp_of(t);
}

void PagedCache::Impl::store_rows(const AppendTicket& t, int32_t layer, const TensorRef& k, const TensorRef& v,
                                  const TensorRef& maybe_angles) {
  const bool stored = cfg.rope_mode == RopeMode::RopeStored;
  kv_store(k, t.slot_mapping(), pool(true, layer), stored ? t.position_view() : TensorRef(),
           stored ? &rope[layer] : nullptr, cfg.stream, stored ? maybe_angles : TensorRef());
  if (has_v()) kv_store(v, t.slot_mapping(), pool(false, layer), TensorRef(), nullptr, cfg.stream);
}

void PagedCache::Impl::store_all(const AppendTicket& t, const TensorRef& k_all, const TensorRef& v_all,
                                 const TensorRef& maybe_angles) {
  if (!one_rope) {  // per-layer tables or a partial rotation: one store per layer
    for (int32_t l = 0; l < cfg.n_layers; ++l)
      store_rows(t, l, layer_slice(k_all, l), has_v() ? layer_slice(v_all, l) : TensorRef(), maybe_angles);
    return;
  }
  const bool stored = cfg.rope_mode == RopeMode::RopeStored;
  kv_store_layers(k_all, v_all, t.slot_mapping(), k_pools, v_pools, stored ? t.position_view() : TensorRef(),
                  stored ? &rope[0] : nullptr, cfg.stream);
}

void PagedCache::append(SeqId seq, std::span<const int32_t> positions, const TensorRef& k, const TensorRef& v) {
  Impl& m = impl();
  constexpr std::string_view op = "PagedCache::append";
  const int64_t n = static_cast<int64_t>(positions.size());
  const int64_t kw[4] = {m.cfg.n_layers, n, m.cfg.n_kv_heads, m.cfg.head_dim};
  check_rows(op, "k", k, 4, kw, m.dev);
  if (m.has_v()) {
    const int64_t vw[4] = {m.cfg.n_layers, n, m.cfg.n_kv_heads, m.cfg.v_head_dim};
    check_rows(op, "v", v, 4, vw, m.dev);
  } else {
    m.check_no_v(op, v);
  }
  const SeqId ids[1] = {seq};
  const int32_t counts[1] = {static_cast<int32_t>(n)};
  m.reserve_impl(m.append_ticket, ids, counts, positions, &k, &v);
  m.append_ticket.owner_ = 0;  // internal: append() already wrote every layer
}

AppendTicket PagedCache::reserve(std::span<const SeqId> seqs, std::span<const int32_t> counts,
                                 std::span<const int32_t> positions) {
  AppendTicket t;
  impl().reserve_impl(t, seqs, counts, positions, nullptr, nullptr);
  return t;
}

AppendTicket PagedCache::reserve(SeqId seq, std::span<const int32_t> positions) {
  const SeqId ids[1] = {seq};
  const int32_t counts[1] = {static_cast<int32_t>(positions.size())};
  return reserve(ids, counts, positions);
}

void PagedCache::reserve(AppendTicket& reuse, std::span<const SeqId> seqs, std::span<const int32_t> counts,
                         std::span<const int32_t> positions) {
  impl().reserve_impl(reuse, seqs, counts, positions, nullptr, nullptr);
}

void PagedCache::store(const AppendTicket& t, int32_t layer, const TensorRef& k, const TensorRef& v) {
  Impl& m = impl();
  constexpr std::string_view op = "PagedCache::store";
  m.check_usable();
  require_arg(layer >= 0 && layer < m.cfg.n_layers, op, ": layer ", layer, " outside [0, ", m.cfg.n_layers, ")");
  m.check_ticket(op, t);
  const int64_t kw[3] = {t.n_tokens_, m.cfg.n_kv_heads, m.cfg.head_dim};
  check_rows(op, "k", k, 3, kw, m.dev);
  if (m.has_v()) {
    const int64_t vw[3] = {t.n_tokens_, m.cfg.n_kv_heads, m.cfg.v_head_dim};
    check_rows(op, "v", v, 3, vw, m.dev);
  } else {
    m.check_no_v(op, v);
  }
  if (t.n_tokens_ == 0) return;
  m.store_rows(t, layer, k, v);
}

void PagedCache::store_layers(const AppendTicket& t, const TensorRef& k, const TensorRef& v) {
  Impl& m = impl();
  constexpr std::string_view op = "PagedCache::store_layers";
  m.check_usable();
  m.check_ticket(op, t);
  const int64_t kw[4] = {m.cfg.n_layers, t.n_tokens_, m.cfg.n_kv_heads, m.cfg.head_dim};
  check_rows(op, "k", k, 4, kw, m.dev);
  if (m.has_v()) {
    const int64_t vw[4] = {m.cfg.n_layers, t.n_tokens_, m.cfg.n_kv_heads, m.cfg.v_head_dim};
    check_rows(op, "v", v, 4, vw, m.dev);
  } else {
    m.check_no_v(op, v);
  }
  if (t.n_tokens_ == 0) return;
  if (!m.one_rope && m.shared_angles && m.cfg.n_layers > 1) {  // one angle table for every layer's K
    const int64_t np = m.rope[0].layout.n_pairs();
    const size_t bytes = static_cast<size_t>(t.n_tokens_) * np * 2 * sizeof(float);
    if (m.angles.size() < bytes || m.angles.device() != m.dev) m.angles = Buffer(bytes, m.dev);
    const TensorRef angle_view(m.angles.data(), DType::F32, m.dev, {t.n_tokens_, np, 2});
    kv_rope_angles(t.position_view(), m.rope[0], angle_view, m.cfg.stream);
    m.store_all(t, k, v, angle_view);
    return;
  }
  m.store_all(t, k, v, TensorRef());
}

// ---- truncate / shift -------------------------------------------------------------------

void PagedCache::Impl::truncate_impl(SeqId id, int32_t n) {
  const PagedSeq& s0 = meta.seq(id);
  if (n == s0.n_live) return;
  const int32_t new_cells = n == 0 ? 0 : meta.locate(s0, n - 1) + 1;
  const size_t new_blocks = static_cast<size_t>(math::ceil_div(new_cells, cfg.block_size));
  PagedTxn txn(meta);
  PagedSeq& s = txn.seq(id);
  for (size_t bi = new_blocks; bi < s.blocks.size(); ++bi) txn.release_block(s.blocks[bi]);
  s.blocks.resize(new_blocks);
  if (new_blocks > 0 && meta.refcount[s.blocks.back()] == 1) {
    // A block only this sequence holds: clear the cells past the new end.
    const int32_t b = s.blocks.back();
    for (int32_t j = new_cells - static_cast<int32_t>(new_blocks - 1) * cfg.block_size; j < cfg.block_size; ++j)
      if (meta.valid[meta.cell(b, j)] || meta.pending[meta.cell(b, j)]) txn.set_cell(b, j, 0, 0, 0);
  }
  s.n_cells = new_cells;
  s.n_live = n;
  s.version = txn.next_version();
  finish(txn, {});
}

void PagedCache::truncate(SeqId seq, int32_t n) {
  Impl& m = impl();
  m.check_usable();
  const PagedSeq& s = m.meta.seq(seq);
  require_arg(n >= 0 && n <= s.n_live, "PagedCache::truncate: n = ", n, " outside [0, ", s.n_live, "] for sequence ", seq);
  m.truncate_impl(seq, n);
}

void PagedCache::shift(SeqId seq, int32_t n_keep, int32_t n_discard) {
  Impl& m = impl();
  constexpr std::string_view op = "PagedCache::shift";
  m.check_usable();
  PagedMeta& mt = m.meta;
  const PagedSeq& s0 = mt.seq(seq);
  require_arg(n_keep >= 0 && n_discard >= 0, op, ": n_keep = ", n_keep, " and n_discard = ", n_discard, " must be >= 0");
  require_arg(static_cast<int64_t>(n_keep) + n_discard <= s0.n_live, op, ": n_keep + n_discard = ",
              static_cast<int64_t>(n_keep) + n_discard, " exceeds the ", s0.n_live, " tokens of sequence ", seq);
  if (n_discard == 0) return;
  if (n_keep + n_discard == s0.n_live) {  // nothing after the cut: the same as a rollback
    m.truncate_impl(seq, n_keep);
    return;
  }
  const int32_t bs = m.cfg.block_size;
  const int32_t c0 = mt.locate(s0, n_keep), c1 = mt.locate(s0, n_keep + n_discard - 1);
  const size_t b0 = static_cast<size_t>(c0 / bs), b1 = static_cast<size_t>(c1 / bs), nb = s0.blocks.size();
  const bool stored = m.cfg.rope_mode == RopeMode::RopeStored;
  // Which side of the cut moves. RopeStored: the cells after it (their K rotates anyway).
  // RopeOnRead: the smaller side; raising the cells before the cut adds n_discard to the
  // sequence's offset, which needs every block of the sequence to be its own.
  const int64_t tail_cells = static_cast<int64_t>(s0.n_cells) - 1 - c1;
  const bool raise = !stored && c0 < tail_cells && !mt.any_shared(s0);
  if (raise)
    require_arg(s0.pos_offset <= INT32_MAX - n_discard, op, ": sequence ", seq, "'s position offset ", s0.pos_offset,
                " + ", n_discard, " overflows i32");
  // Plan, over the blocks that change only. Before b0: raised in bulk (raise) or untouched.
  // b0 and b1 are edited cell by cell (dropped if nothing live is left); blocks strictly
  // between them hold only cut or dead cells: dropped. After b1: lowered in bulk (not raise;
  // edited cell by cell when shared: copied first) or untouched.
  enum class Fate : uint8_t { Keep, Drop, Edit, Bulk };
  auto fate_of = [&](size_t bi) -> Fate {
    if (bi < b0) return raise ? Fate::Bulk : Fate::Keep;
    if (bi > b1) return raise ? Fate::Keep : (mt.refcount[s0.blocks[bi]] > 1 ? Fate::Edit : Fate::Bulk);
    if (bi > b0 && bi < b1) return Fate::Drop;
    const int32_t b = s0.blocks[bi];
    int32_t live_after = 0;
    for (int32_t j = 0; j < mt.cells_in_block(s0, bi); ++j) {
      const int32_t c = static_cast<int32_t>(bi) * bs + j;
      live_after += mt.valid[mt.cell(b, j)] && (c < c0 || c > c1) ? 1 : 0;
    }
    return live_after == 0 && bi + 1 < nb ? Fate::Drop : Fate::Edit;
  };
  // Blocks the plan visits: [0, b0) when raising, [b0, b1], (b1, nb) when lowering.
  const size_t lo = raise ? 0 : b0, hi = raise ? b1 + 1 : nb;
  std::vector<Fate> fates(hi - lo);
  int64_t copies = 0;
  for (size_t bi = lo; bi < hi; ++bi) {
    fates[bi - lo] = fate_of(bi);
    if (fates[bi - lo] == Fate::Edit && mt.refcount[s0.blocks[bi]] > 1) ++copies;
  }
  require(copies <= static_cast<int64_t>(mt.free_list.size()), ErrorCode::OutOfMemory, op, ": sequence ", seq,
          " shares ", copies, " blocks the shift must edit; copying them needs ", copies, " free blocks, the pool has ",
          mt.free_list.size());

  PagedTxn txn(mt);
  PagedSeq& s = txn.seq(seq);
  std::vector<int32_t> cow, bulk, dropped;
  size_t out = lo;  // s.blocks is compacted in place over [lo, hi): dropped blocks leave
  for (size_t bi = lo; bi < hi; ++bi) {
    int32_t b = s.blocks[bi];
    switch (fates[bi - lo]) {
      case Fate::Keep: break;
      case Fate::Drop: dropped.push_back(b); continue;
      case Fate::Bulk: bulk.push_back(b); break;
      case Fate::Edit: {
        const int32_t used = mt.cells_in_block(s, bi);  // s.n_cells and s.blocks.size() are unchanged so far
        if (mt.refcount[b] > 1) {
          const int32_t copy = txn.copy_block(b, used);
          cow.push_back(b);
          cow.push_back(copy);
          b = copy;
        }
        for (int32_t j = 0; j < used; ++j) {
          const int32_t c = static_cast<int32_t>(bi) * bs + j;
          const int64_t cell = mt.cell(b, j);
          if (!mt.valid[cell]) continue;
          if (c < c0) {
            if (raise) txn.set_cell(b, j, mt.pos(cell) + n_discard, 1, mt.pending[cell]);
          } else if (c <= c1) {
            txn.set_cell(b, j, mt.pos(cell), 0, 0);
          } else if (!raise) {
            txn.set_cell(b, j, mt.pos(cell) - n_discard, 1, mt.pending[cell] - (stored ? n_discard : 0));
          }
        }
        break;
      }
    }
    s.blocks[out++] = b;
  }
  if (out != hi) s.blocks.erase(s.blocks.begin() + static_cast<std::ptrdiff_t>(out), s.blocks.begin() + static_cast<std::ptrdiff_t>(hi));
  // After the copies: a dropped block must never become a copy's target (a failed transaction
  // gives it back to the sequence with its bytes intact).
  txn.release_blocks(dropped);
  if (raise) {
    txn.bulk_edit(std::move(bulk), -n_discard, 0);
    s.pos_offset += n_discard;
  } else {
    txn.bulk_edit(std::move(bulk), n_discard, stored ? n_discard : 0);
  }
  s.n_cells -= static_cast<int32_t>(dropped.size()) * bs;
  s.n_live -= n_discard;
  s.version = txn.next_version();
  m.finish(txn, cow);
}

// ---- prepare --------------------------------------------------------------------------------

bool PagedCache::needs_prepare() const {
  const PagedMeta& mt = impl().meta;
  for (const auto& [id, sq] : mt.seqs)
    if (sq.pos_offset != 0) return true;
  if (!mt.any_pending) return false;
  for (int32_t b = 0; b < mt.num_blocks; ++b)
    if (mt.pending_flag[b] && mt.refcount[b] > 0) return true;
  return false;
}

// Fold every sequence's position offset into its cells: positions -= offset on the valid
// cells of its blocks (each block once: its holders share the offset), on the device first
// (one kernel over the listed blocks), then on the host.
void PagedCache::Impl::fold_offsets() {
  std::vector<int32_t> list;  // [blocks..., amounts...]
  std::vector<uint8_t> seen;
  for (const auto& [id, sq] : meta.seqs) {
    if (sq.pos_offset == 0) continue;
    if (seen.empty()) seen.assign(static_cast<size_t>(cfg.num_blocks), 0);
    for (int32_t b : sq.blocks)
      if (!seen[b]) {
        seen[b] = 1;
        list.push_back(b);
      }
  }
  if (seen.empty()) return;
  const size_t n = list.size();
  std::vector<int32_t> amount(n);
  {
    std::vector<int32_t> block_off(static_cast<size_t>(cfg.num_blocks), 0);
    for (const auto& [id, sq] : meta.seqs)
      for (int32_t b : sq.blocks) block_off[b] = sq.pos_offset;
    for (size_t i = 0; i < n; ++i) amount[i] = block_off[list[i]];
  }
  if (mirrored() && n > 0) {
    std::vector<int32_t> packed(list);
    packed.insert(packed.end(), amount.begin(), amount.end());
    const int32_t* d = upload_list(packed);
    mirror_edit(d, static_cast<int32_t>(n), 0, 0, false, d + n);
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t c0 = meta.cell(list[i], 0);
    for (int32_t j = 0; j < cfg.block_size; ++j) meta.positions[c0 + j] -= meta.valid[c0 + j] ? amount[i] : 0;
  }
  for (auto& [id, sq] : meta.seqs) sq.pos_offset = 0;
}

void PagedCache::Impl::rotate_pending() {
  PagedMeta& mt = meta;
  if (!mt.any_pending) return;
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b < mt.num_blocks; ++b)
    if (mt.pending_flag[b] && mt.refcount[b] > 0) blocks.push_back(b);
  if (blocks.empty()) {
    mt.any_pending = false;
    return;
  }
  int32_t* dev_blocks = upload_list(blocks);
  const TensorRef list(dev_blocks, DType::I32, dev, {static_cast<int64_t>(blocks.size())});
  try {
    // every layer in one launch where the layers allow it (ops/paged_rotate.hpp)
    std::vector<KvPool> k_pools;
    k_pools.reserve(static_cast<size_t>(cfg.n_layers));
    for (int32_t l = 0; l < cfg.n_layers; ++l) k_pools.push_back(pool(true, l));
    kv_rotate_blocks_layers(k_pools, list, pending_view(), std::span<const math::RopeTable>(rope.data(), rope.size()),
                            cfg.stream);
    synchronize(dev, cfg.stream);
    if (mirrored()) mirror_edit(dev_blocks, static_cast<int32_t>(blocks.size()), 0, 0, true);
  } catch (...) {
    corrupt = true;  // some layers may be rotated and others not: nothing consistent to return to
    throw;
  }
  for (int32_t b : blocks) {
    std::fill_n(mt.pending.begin() + mt.cell(b, 0), cfg.block_size, 0);
    mt.pending_flag[b] = 0;
  }
  mt.any_pending = false;
}

void PagedCache::prepare() {
  Impl& m = impl();
  m.check_usable();
  try {
    m.fold_offsets();
  } catch (...) {
    m.corrupt = true;  // the device positions are in an unknown state
    throw;
  }
  m.rotate_pending();
}

}  // namespace kvcore
