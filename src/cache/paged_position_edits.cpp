// PagedCache position-range edits: remove_positions and add_positions (llama.cpp's seq_rm
// and seq_add). Each plans over every cell of the sequence first (which live tokens lie in
// the range, which blocks keep a live token, which blocks change and whether they are
// shared), checks every new position and the copies the plan needs, and only then changes
// the metadata, inside one PagedTxn (strong guarantee, as every PagedCache operation).
#include <algorithm>

#include "cache/paged_impl.hpp"
#include "kvcore/error.hpp"

namespace kvcore {

void PagedCache::Impl::edit_positions(std::string_view op, SeqId id, int32_t p0, int32_t p1, bool remove, int32_t delta) {
  check_usable();
  PagedMeta& mt = meta;
  const PagedSeq& s0 = mt.seq(id);
  require_arg(p0 >= 0 && p1 >= p0, op, ": need 0 <= p0 <= p1, got p0 = ", p0, ", p1 = ", p1);
  const int32_t bs = cfg.block_size, off = s0.pos_offset;
  const bool stored = cfg.rope_mode == RopeMode::RopeStored;
  const size_t nb = s0.blocks.size();

  // Plan: per block, live tokens in the range (hit) and outside it (left); every new position.
  std::vector<int32_t> hit(nb, 0), left(nb, 0);
  int64_t n_hit = 0;
  int32_t last_kept = -1;  // remove: span index of the last live cell outside the range
  int64_t prev = -1;       // add: the previous token's new position (strict_positions)
  for (size_t bi = 0; bi < nb; ++bi) {
    const int32_t b = s0.blocks[bi], used = mt.cells_in_block(s0, bi);
    for (int32_t j = 0; j < used; ++j) {
      const int64_t c = mt.cell(b, j);
      if (!mt.valid[c]) continue;
      const int64_t p = static_cast<int64_t>(mt.pos(c)) - off;
      const bool in = p >= p0 && p < p1;
      if (!in) {
        ++left[bi];
        last_kept = static_cast<int32_t>(bi) * bs + j;
      } else {
        ++hit[bi];
        ++n_hit;
      }
      if (remove) continue;
      const int64_t np = in ? p + delta : p;
      if (in) {
        require_arg(np >= 0 && np + off < kPosEnd, op, ": position ", p, " of sequence ", id, " + delta ", delta, " = ", np,
                    " leaves [0, ", static_cast<int64_t>(kPosEnd) - off, ")");
        const int64_t pend = static_cast<int64_t>(mt.pending[c]) + (stored ? delta : 0);
        require_arg(pend >= INT32_MIN && pend <= INT32_MAX, op, ": the rotation owed to position ", p, " of sequence ",
                    id, " overflows i32 (call prepare() first)");
      }
      if (cfg.strict_positions)
        require_arg(np > prev, op, ": delta ", delta, " on positions [", p0, ", ", p1, ") of sequence ", id,
                    " gives position ", np, " after ", prev, " (positions must increase)");
      prev = np;
    }
  }
  if (n_hit == 0 || (!remove && delta == 0)) return;
  enum class Fate : uint8_t { Keep, Drop, Edit, Bulk };
  std::vector<Fate> fates(nb, Fate::Keep);
  const size_t last_block = last_kept < 0 ? 0 : static_cast<size_t>(last_kept / bs);
  const int32_t last_used = last_kept % bs + 1;  // remove: cells of the new last block
  int64_t copies = 0;
  for (size_t bi = 0; bi < nb; ++bi) {
    const bool shared = mt.refcount[s0.blocks[bi]] > 1;
    if (remove) {
      if (last_kept < 0 || bi > last_block || left[bi] == 0) {
        fates[bi] = Fate::Drop;
      } else if (bi < last_block) {
        fates[bi] = hit[bi] > 0 ? Fate::Edit : Fate::Keep;
      } else {  // the new last block: edit what lies in the range before its new end
        const int32_t b = s0.blocks[bi];
        bool edit = false;
        for (int32_t j = 0; j < last_used && !edit; ++j) {
          const int64_t c = mt.cell(b, j);
          const int64_t p = static_cast<int64_t>(mt.pos(c)) - off;
          edit = mt.valid[c] && p >= p0 && p < p1;
        }
        fates[bi] = edit ? Fate::Edit : Fate::Keep;
      }
    } else if (hit[bi] > 0) {
      const bool whole = left[bi] == 0 && mt.cells_in_block(s0, bi) == bs;
      fates[bi] = whole && !shared ? Fate::Bulk : Fate::Edit;
    }
    if (fates[bi] == Fate::Edit && shared) ++copies;
  }
  require(copies <= static_cast<int64_t>(mt.free_list.size()), ErrorCode::OutOfMemory, op, ": sequence ", id,
          " shares ", copies, " blocks the edit must change; copying them needs ", copies, " free blocks, the pool has ",
          mt.free_list.size());

  PagedTxn txn(mt);
  PagedSeq& s = txn.seq(id);
  std::vector<int32_t> cow, bulk, dropped, kept;
  kept.reserve(nb);
  for (size_t bi = 0; bi < nb; ++bi) {
    int32_t b = s.blocks[bi];
    const Fate f = fates[bi];
    if (f == Fate::Drop) {
      dropped.push_back(b);
      continue;
    }
    const bool is_last = remove && bi == last_block;
    const int32_t used = is_last ? last_used : mt.cells_in_block(s, bi);  // s.n_cells is unchanged so far
    if (f == Fate::Edit) {
      if (mt.refcount[b] > 1) {
        const int32_t copy = txn.copy_block(b, used);  // cells past `used` are cleared in the copy
        cow.push_back(b);
        cow.push_back(copy);
        b = copy;
      }
      for (int32_t j = 0; j < used; ++j) {
        const int64_t c = mt.cell(b, j);
        if (!mt.valid[c]) continue;
        const int32_t p = mt.pos(c) - off;
        if (p < p0 || p >= p1) continue;
        if (remove) txn.set_cell(b, j, mt.pos(c), 0, 0);
        else txn.set_cell(b, j, mt.pos(c) + delta, 1, mt.pending[c] + (stored ? delta : 0));
      }
    } else if (f == Fate::Bulk) {
      bulk.push_back(b);
    }
    if (is_last && mt.refcount[b] == 1) {  // a block only this sequence holds: clear the cells past the new end
      for (int32_t j = last_used; j < bs; ++j)
        if (mt.valid[mt.cell(b, j)] || mt.pending[mt.cell(b, j)]) txn.set_cell(b, j, 0, 0, 0);
    }
    kept.push_back(b);
  }
  // After the copies: a dropped block must never become a copy's target (a failed transaction
  // gives it back to the sequence with its bytes intact).
  txn.release_blocks(dropped);
  txn.bulk_edit(std::move(bulk), -delta, stored ? -delta : 0);
  s.blocks = std::move(kept);
  if (remove) {
    s.n_cells = s.blocks.empty() ? 0 : static_cast<int32_t>(s.blocks.size() - 1) * bs + last_used;
    s.n_live -= static_cast<int32_t>(n_hit);
  }
  s.version = txn.next_version();
  finish(txn, cow);
}

void PagedCache::remove_positions(SeqId seq, int32_t p0, int32_t p1) {
  impl().edit_positions("PagedCache::remove_positions", seq, p0, p1, true, 0);
}

void PagedCache::add_positions(SeqId seq, int32_t p0, int32_t p1, int32_t delta) {
  impl().edit_positions("PagedCache::add_positions", seq, p0, p1, false, delta);
}

}  // namespace kvcore
