// Host metadata of a PagedCache and the journal that makes each mutation
// all-or-nothing. Every change goes through PagedTxn, which records what it
// overwrites (a block's cell arrays the first time they change, old refcounts and
// flags, free-list pops and pushes, old sequence states, and bulk position edits
// as their inverse); rollback() restores it. Callers count what an operation needs
// (blocks, copies) before they start a transaction, so a transaction only fails on
// a device error. The journal costs O(what changes).
//
// Positions: a cell stores a position; the position a sequence's token has is the stored
// one minus the sequence's pos_offset. Every sequence holding a block has the same
// pos_offset (a shift that changes a sequence's offset first makes its blocks its own), so
// "stored - offset" is well defined per cell and prepare() can fold the offsets in.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"

namespace kvcore {

struct PagedSeq {
  std::vector<int32_t> blocks;
  int32_t n_cells = 0;  // cells spanned: (blocks - 1) * block_size + cells used in the last block
  int32_t n_live = 0;   // live cells (tokens)
  uint64_t version = 0;
  int32_t pos_offset = 0;  // token position = stored cell position - pos_offset (rope-on-read shifts)
  // Invariants: blocks.size() == ceil(n_cells / block_size); n_cells > 0 => cell n_cells - 1 is
  // live; every block holds a live cell of the span; every block but the last is fully spanned.
};

struct PagedMeta {
  int32_t block_size = 0, num_blocks = 0;
  // Per cell [num_blocks * block_size]: the layout contract's arrays, plus the pending deltas.
  // Cells of free blocks, and cells past the end of a sequence, hold stale values: nothing
  // reads them (block tables never list free blocks; readers stop at last_page_len).
  std::vector<int32_t> positions;
  std::vector<uint8_t> valid;
  std::vector<int32_t> pending;  // RopeStored: rotation owed to this cell's K (prepare() applies it)
  // Per block.
  std::vector<int32_t> block_live;    // valid cells of the block (all block_size cells)
  std::vector<int32_t> refcount;      // sequences holding the block (0: free)
  std::vector<uint8_t> pending_flag;  // some cell of the block may have a non-zero pending delta
  std::vector<uint32_t> txn_mark;     // journal scratch: the transaction that saved the block's cells
  std::vector<int32_t> free_list;     // a stack: pop_back() is the next block handed out
  std::map<SeqId, PagedSeq> seqs;
  SeqId next_id = 0;
  uint64_t next_version = 1;
  uint32_t next_txn = 1;
  int32_t shared_blocks = 0;  // blocks with refcount > 1 (0: no sequence shares anything)
  bool any_pending = false;   // a pending_flag may be set

  void init(int32_t block_size, int32_t num_blocks);
  int64_t cell(int32_t block, int32_t slot) const { return static_cast<int64_t>(block) * block_size + slot; }
  // Cells of `s` that lie in its block index bi.
  int32_t cells_in_block(const PagedSeq& s, size_t bi) const {
    return bi + 1 < s.blocks.size() ? block_size : s.n_cells - static_cast<int32_t>(bi) * block_size;
  }
  // Cell index (in the sequence's span) of live token t, 0 <= t < n_live.
  int32_t locate(const PagedSeq& s, int32_t t) const;
  const PagedSeq& seq(SeqId id) const;  // throws InvalidArgument naming the id
  // The stored position of cell c.
  int32_t pos(int64_t c) const { return positions[c]; }
  // Does any block of `s` have another holder?
  bool any_shared(const PagedSeq& s) const;
  // positions -= delta and pending -= pending_delta on the valid cells of `blocks` (host arrays).
  void shift_cells(const std::vector<int32_t>& blocks, int32_t delta, int32_t pending_delta);
};

class PagedTxn {
 public:
  explicit PagedTxn(PagedMeta& m) : m_(m), id_(m.next_txn++) {
    if (m_.next_txn == 0) m_.next_txn = 1;  // 0 marks "never saved"
  }
  ~PagedTxn() {
    if (!done_) rollback();
  }
  PagedTxn(const PagedTxn&) = delete;
  PagedTxn& operator=(const PagedTxn&) = delete;

  void set_cell(int32_t block, int32_t slot, int32_t position, uint8_t valid, int32_t pending);
  // set_cell(block, slot + j, positions[j] + add, 1, 0) for j < n, in one pass.
  void set_run(int32_t block, int32_t slot, int32_t n, const int32_t* positions, int32_t add);
  void set_refcount(int32_t block, int32_t value);
  // refcount += delta on every listed block (distinct; none may reach 0): one journal record,
  // so fork() and the release of shared blocks cost O(blocks) with a small constant.
  void add_refs(const std::vector<int32_t>& blocks, int32_t delta);
  // release_block() of many blocks at once: those still held elsewhere lose a reference in bulk,
  // the others go back to the free list in one journal record (shift() drops whole runs).
  void release_blocks(const std::vector<int32_t>& blocks);
  void set_pending_flag(int32_t block, uint8_t value);
  int32_t pop_free();
  void push_free(int32_t block);
  PagedSeq& seq(SeqId id);  // the sequence, saved before its first change in this transaction
  SeqId add_seq(PagedSeq s);
  void remove_seq(SeqId id);
  uint64_t next_version();

  // Release one reference; a block that reaches 0 goes back to the free list (its cells are not
  // cleared: nothing reads a free block, and every cell is rewritten before a sequence spans it).
  void release_block(int32_t block);
  // Copy block `src`'s cell metadata to a fresh block from the free list, keeping only its
  // first `used` cells (the rest cleared); one reference moves from src to the new block.
  int32_t copy_block(int32_t src, int32_t used);
  // positions -= pos_delta and pending -= pending_delta on every valid cell of `blocks` (O(cells),
  // vectorized). Journaled as its inverse. None of these blocks may be changed otherwise in
  // this transaction.
  void bulk_edit(std::vector<int32_t> blocks, int32_t pos_delta, int32_t pending_delta);
  struct Bulk {
    std::vector<int32_t> blocks;
    int32_t pos_delta, pending_delta;
    std::vector<uint8_t> old_flags;
  };
  const std::vector<Bulk>& bulk() const { return bulk_; }

  // Blocks whose cell arrays changed through set_cell (each once).
  std::vector<int32_t> dirty_blocks() const {
    std::vector<int32_t> v;
    v.reserve(blocks_.size());
    for (const SavedBlock& s : blocks_) v.push_back(s.block);
    return v;
  }

  void commit();
  void rollback() noexcept;

 private:
  struct SavedBlock {
    int32_t block, live;
    size_t cells;  // offset into the saved cell vectors
  };
  void save_cells(int32_t block);

  PagedMeta& m_;
  uint32_t id_;
  bool done_ = false;
  std::vector<SavedBlock> blocks_;
  std::vector<int32_t> saved_pos_, saved_pending_;
  std::vector<uint8_t> saved_valid_;
  std::vector<std::pair<int32_t, int32_t>> refcounts_;  // (block, old value), in order
  std::vector<std::pair<int32_t, uint8_t>> flags_;      // (block, old value), in order
  std::vector<std::pair<bool, int32_t>> free_ops_;      // (pushed?, block)
  std::vector<std::pair<SeqId, std::optional<PagedSeq>>> seqs_;
  std::vector<Bulk> bulk_;
  std::vector<std::pair<std::vector<int32_t>, int32_t>> ref_bulk_;  // (blocks, delta)
  std::vector<std::vector<int32_t>> freed_bulk_;  // blocks released from refcount 1, in bulk
  // free_ops_ entries with a negative block: -(k + 1) marks freed_bulk_[k] pushed as a whole
  SeqId saved_next_id_ = 0;
  uint64_t saved_next_version_ = 0;
  bool saved_counters_ = false;
};

}  // namespace kvcore
