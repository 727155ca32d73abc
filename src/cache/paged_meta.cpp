#include "cache/paged_meta.hpp"

#include <algorithm>

#include "kvcore/error.hpp"

namespace kvcore {

void PagedMeta::init(int32_t bs, int32_t nb) {
  block_size = bs;
  num_blocks = nb;
  const size_t cells = static_cast<size_t>(bs) * nb;
  positions.assign(cells, 0);
  valid.assign(cells, 0);
  pending.assign(cells, 0);
  block_live.assign(nb, 0);
  refcount.assign(nb, 0);
  pending_flag.assign(nb, 0);
  txn_mark.assign(nb, 0);
  free_list.resize(nb);
  // Hand out low block ids first: pop_back() takes the end.
  for (int32_t i = 0; i < nb; ++i) free_list[i] = nb - 1 - i;
}

int32_t PagedMeta::locate(const PagedSeq& s, int32_t t) const {
  int32_t seen = 0;
  for (size_t bi = 0; bi < s.blocks.size(); ++bi) {
    const int32_t b = s.blocks[bi];
    const int32_t used = cells_in_block(s, bi);
    // Full blocks know their live count; the last block may hold stale cells past the span.
    if (used == block_size && seen + block_live[b] <= t) {
      seen += block_live[b];
      continue;
    }
    for (int32_t j = 0; j < used; ++j) {
      if (!valid[cell(b, j)]) continue;
      if (seen == t) return static_cast<int32_t>(bi) * block_size + j;
      ++seen;
    }
  }
  throw Error(ErrorCode::Corrupt, detail::concat("PagedCache: token ", t, " not found in a sequence of ", s.n_live,
                                                 " live tokens"));
}

const PagedSeq& PagedMeta::seq(SeqId id) const {
  auto it = seqs.find(id);
  require_arg(it != seqs.end(), "PagedCache: unknown or erased sequence id ", id);
  return it->second;
}

bool PagedMeta::any_shared(const PagedSeq& s) const {
  if (shared_blocks == 0) return false;
  for (int32_t b : s.blocks)
    if (refcount[b] > 1) return true;
  return false;
}

void PagedMeta::shift_cells(const std::vector<int32_t>& blocks, int32_t delta, int32_t pending_delta) {
  int32_t* __restrict pos = positions.data();
  int32_t* __restrict pend = pending.data();
  const uint8_t* __restrict val = valid.data();
  const int32_t bs = block_size;
  for (int32_t b : blocks) {
    const int64_t c0 = cell(b, 0);
    for (int32_t j = 0; j < bs; ++j) {  // branch-free over restrict pointers: the loop vectorizes
      const int32_t on = val[c0 + j] != 0;
      pos[c0 + j] -= delta * on;
      pend[c0 + j] -= pending_delta * on;
    }
  }
}

void PagedTxn::save_cells(int32_t b) {
  if (m_.txn_mark[b] == id_) return;
  m_.txn_mark[b] = id_;
  const size_t off = saved_pos_.size();
  const size_t c0 = static_cast<size_t>(m_.cell(b, 0));
  saved_pos_.insert(saved_pos_.end(), m_.positions.begin() + c0, m_.positions.begin() + c0 + m_.block_size);
  saved_pending_.insert(saved_pending_.end(), m_.pending.begin() + c0, m_.pending.begin() + c0 + m_.block_size);
  saved_valid_.insert(saved_valid_.end(), m_.valid.begin() + c0, m_.valid.begin() + c0 + m_.block_size);
  blocks_.push_back({b, m_.block_live[b], off});
}

void PagedTxn::set_cell(int32_t b, int32_t slot, int32_t position, uint8_t valid, int32_t pending) {
  save_cells(b);
  const int64_t c = m_.cell(b, slot);
  m_.block_live[b] += static_cast<int32_t>(valid != 0) - static_cast<int32_t>(m_.valid[c] != 0);
  m_.positions[c] = position;
  m_.valid[c] = valid;
  m_.pending[c] = pending;
  if (pending != 0 && !m_.pending_flag[b]) set_pending_flag(b, 1);
}

void PagedTxn::set_run(int32_t b, int32_t slot, int32_t n, const int32_t* pos, int32_t add) {
  save_cells(b);
  const int64_t c0 = m_.cell(b, slot);
  int32_t became_live = 0;
  for (int32_t j = 0; j < n; ++j) {
    became_live += m_.valid[c0 + j] == 0 ? 1 : 0;
    m_.positions[c0 + j] = pos[j] + add;
    m_.valid[c0 + j] = 1;
    m_.pending[c0 + j] = 0;
  }
  m_.block_live[b] += became_live;
}

void PagedTxn::add_refs(const std::vector<int32_t>& blocks, int32_t delta) {
  if (blocks.empty() || delta == 0) return;
  int32_t shared = 0;
  for (int32_t b : blocks) {
    const int32_t rc = m_.refcount[b];
    require(rc + delta > 0, ErrorCode::Corrupt, "PagedCache: bulk reference change would free block ", b);
    shared += static_cast<int32_t>(rc + delta > 1) - static_cast<int32_t>(rc > 1);
    m_.refcount[b] = rc + delta;
  }
  m_.shared_blocks += shared;
  refcounts_.push_back({-static_cast<int32_t>(ref_bulk_.size()) - 1, 0});  // marker: ref_bulk_ entry, in order
  ref_bulk_.push_back({blocks, delta});
}

void PagedTxn::release_blocks(const std::vector<int32_t>& blocks) {
  std::vector<int32_t> shared, sole;
  for (int32_t b : blocks) {
    require(m_.refcount[b] > 0, ErrorCode::Corrupt, "PagedCache: releasing free block ", b);
    (m_.refcount[b] > 1 ? shared : sole).push_back(b);
  }
  add_refs(shared, -1);
  if (sole.empty()) return;
  for (int32_t b : sole) {
    m_.refcount[b] = 0;  // 1 -> 0: shared_blocks does not change
    if (m_.pending_flag[b]) set_pending_flag(b, 0);
  }
  m_.free_list.insert(m_.free_list.end(), sole.begin(), sole.end());
  free_ops_.push_back({true, -static_cast<int32_t>(freed_bulk_.size()) - 1});
  refcounts_.push_back({-static_cast<int32_t>(freed_bulk_.size()) - 1, 1});  // marker: back to refcount 1, in order
  freed_bulk_.push_back(std::move(sole));
}

void PagedTxn::set_refcount(int32_t b, int32_t value) {
  refcounts_.push_back({b, m_.refcount[b]});
  m_.shared_blocks += static_cast<int32_t>(value > 1) - static_cast<int32_t>(m_.refcount[b] > 1);
  m_.refcount[b] = value;
}

void PagedTxn::set_pending_flag(int32_t b, uint8_t value) {
  flags_.push_back({b, m_.pending_flag[b]});
  m_.pending_flag[b] = value;
  if (value) m_.any_pending = true;
}

int32_t PagedTxn::pop_free() {
  require(!m_.free_list.empty(), ErrorCode::Corrupt, "PagedCache: free list exhausted after planning");
  const int32_t b = m_.free_list.back();
  m_.free_list.pop_back();
  free_ops_.push_back({false, b});
  return b;
}

void PagedTxn::push_free(int32_t b) {
  m_.free_list.push_back(b);
  free_ops_.push_back({true, b});
}

PagedSeq& PagedTxn::seq(SeqId id) {
  auto it = m_.seqs.find(id);
  require_arg(it != m_.seqs.end(), "PagedCache: unknown or erased sequence id ", id);
  bool saved = false;
  for (const auto& s : seqs_) saved |= s.first == id;
  if (!saved) seqs_.push_back({id, it->second});
  return it->second;
}

uint64_t PagedTxn::next_version() {
  if (!saved_counters_) {
    saved_counters_ = true;
    saved_next_id_ = m_.next_id;
    saved_next_version_ = m_.next_version;
  }
  return m_.next_version++;
}

SeqId PagedTxn::add_seq(PagedSeq s) {
  next_version();  // saves the counters
  const SeqId id = m_.next_id++;
  seqs_.push_back({id, std::nullopt});
  s.version = next_version();
  m_.seqs.emplace(id, std::move(s));
  return id;
}

void PagedTxn::remove_seq(SeqId id) {
  seq(id);  // saves it
  m_.seqs.erase(id);
}

void PagedTxn::release_block(int32_t b) {
  const int32_t rc = m_.refcount[b];
  require(rc > 0, ErrorCode::Corrupt, "PagedCache: releasing free block ", b);
  set_refcount(b, rc - 1);
  if (rc - 1 > 0) return;
  if (m_.pending_flag[b]) set_pending_flag(b, 0);
  push_free(b);
}

int32_t PagedTxn::copy_block(int32_t src, int32_t used) {
  const int32_t dst = pop_free();
  set_refcount(dst, 1);
  set_refcount(src, m_.refcount[src] - 1);
  uint8_t any_pending = 0;
  for (int32_t j = 0; j < m_.block_size; ++j) {
    const int64_t c = m_.cell(src, j);
    if (j < used) {
      set_cell(dst, j, m_.pos(c), m_.valid[c], m_.pending[c]);
      any_pending |= static_cast<uint8_t>(m_.pending[c] != 0);
    } else {
      set_cell(dst, j, 0, 0, 0);
    }
  }
  if (m_.pending_flag[dst] != any_pending) set_pending_flag(dst, any_pending);
  return dst;
}

void PagedTxn::bulk_edit(std::vector<int32_t> blocks, int32_t pos_delta, int32_t pending_delta) {
  if (blocks.empty() || (pos_delta == 0 && pending_delta == 0)) return;
  Bulk rec{std::move(blocks), pos_delta, pending_delta, {}};
  m_.shift_cells(rec.blocks, pos_delta, pending_delta);
  if (pending_delta != 0) {
    rec.old_flags.reserve(rec.blocks.size());
    for (int32_t b : rec.blocks) {
      rec.old_flags.push_back(m_.pending_flag[b]);
      m_.pending_flag[b] = 1;
    }
    m_.any_pending = true;
  }
  bulk_.push_back(std::move(rec));
}

void PagedTxn::commit() { done_ = true; }

void PagedTxn::rollback() noexcept {
  done_ = true;
  for (auto it = bulk_.rbegin(); it != bulk_.rend(); ++it) {
    m_.shift_cells(it->blocks, -it->pos_delta, -it->pending_delta);
    for (size_t i = 0; i < it->old_flags.size(); ++i) m_.pending_flag[it->blocks[i]] = it->old_flags[i];
  }
  for (auto it = seqs_.rbegin(); it != seqs_.rend(); ++it) {
    if (it->second) m_.seqs[it->first] = *it->second;
    else m_.seqs.erase(it->first);
  }
  for (auto it = free_ops_.rbegin(); it != free_ops_.rend(); ++it) {
    if (it->first && it->second < 0) {  // a bulk release: its blocks leave the free list
      m_.free_list.resize(m_.free_list.size() - freed_bulk_[static_cast<size_t>(-it->second - 1)].size());
    } else if (it->first) {
      m_.free_list.pop_back();
    } else {
      m_.free_list.push_back(it->second);
    }
  }
  for (auto it = refcounts_.rbegin(); it != refcounts_.rend(); ++it) {
    auto set = [this](int32_t b, int32_t value) {
      m_.shared_blocks += static_cast<int32_t>(value > 1) - static_cast<int32_t>(m_.refcount[b] > 1);
      m_.refcount[b] = value;
    };
    if (it->first >= 0) {
      set(it->first, it->second);
    } else if (it->second == 0) {  // add_refs
      const auto& rec = ref_bulk_[static_cast<size_t>(-it->first - 1)];
      for (int32_t b : rec.first) set(b, m_.refcount[b] - rec.second);
    } else {  // release_blocks: back from 0 to 1
      for (int32_t b : freed_bulk_[static_cast<size_t>(-it->first - 1)]) set(b, 1);
    }
  }
  for (auto it = flags_.rbegin(); it != flags_.rend(); ++it) m_.pending_flag[it->first] = it->second;
  for (const SavedBlock& s : blocks_) {
    const size_t c0 = static_cast<size_t>(m_.cell(s.block, 0));
    std::copy_n(saved_pos_.begin() + s.cells, m_.block_size, m_.positions.begin() + c0);
    std::copy_n(saved_pending_.begin() + s.cells, m_.block_size, m_.pending.begin() + c0);
    std::copy_n(saved_valid_.begin() + s.cells, m_.block_size, m_.valid.begin() + c0);
    m_.block_live[s.block] = s.live;
    m_.txn_mark[s.block] = 0;
  }
  if (saved_counters_) {
    m_.next_id = saved_next_id_;
    m_.next_version = saved_next_version_;
  }
}

}  // namespace kvcore
