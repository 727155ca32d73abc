// PagedCache internals shared by its translation units.
#pragma once
#include <string_view>
#include <vector>

#include "cache/paged_meta.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "ops/paged_blocks_params.hpp"

namespace kvcore {

struct PagedCache::Impl {
  PagedCacheConfig cfg;
  Device dev;
  PagedLayout lay;
  PagedMeta meta;
  std::vector<math::RopeTable> rope;  // per layer
  // One pool array: memory the cache allocated (owned), or the caller's (owned empty).
  struct PoolMem {
    Buffer owned;
    uint8_t* data = nullptr;
  };
  std::vector<PoolMem> k_data, k_scales, v_data, v_scales;  // per layer
  bool owns_pools = true;
  // CUDA mirrors of the per-cell arrays (on the CPU the host arrays are the contract arrays).
  Buffer pos_dev, valid_dev, pending_dev;
  // Every pool array, for copy-on-write block copies (device table on CUDA).
  std::vector<PagedPoolArray> arrays;
  Buffer arrays_dev;
  Buffer csr;      // block tables handed out by block_tables()
  // append(): every layer's RoPE table has the same frequencies, so one kv_rope_angles() table
  // of the call's positions serves all layers' K stores (f32 [n_tokens, n_pairs, 2]).
  bool shared_angles = false;
  // Every layer's RoPE table is the same whole-row rotation (or K is stored unrotated): one
  // kv_store_layers() call stores a step's K and V of every layer (store_all).
  bool one_rope = false;
  std::vector<KvPool> k_pools, v_pools;  // pool(true, l), pool(false, l) of every layer (v empty without V)
  Buffer angles;
  Buffer scratch;  // transient i32 lists for device kernels (every user synchronizes before returning)
  AppendTicket append_ticket;  // reused by append(): no allocation per call once it is large enough
  std::vector<int32_t> host_slots;  // reserve(): the new tokens' cell ids (reused scratch)
  // Tickets: this cache's process-unique id (moves with the cache) and the key of their stamps.
  uint64_t id = 0, ticket_key = 0;
  // Every pool array holds one more block than the pools expose: block num_blocks, all zeros.
  // Blocks leaving the free list in reserve() are copied from it (zeroed in every layer).
  int32_t zero_block() const { return cfg.num_blocks; }
  int64_t bytes_per_block = 0;
  bool corrupt = false;

  // Are there V pools? (Not with v_head_dim 0, nor when V is read from K's latent.)
  bool has_v() const { return cfg.v_head_dim > 0 && !cfg.v_from_k_latent; }
  // Are the contract's cell arrays separate mirrors of the host metadata (CUDA, or debug_mirror)?
  bool mirrored() const { return dev.is_cuda() || cfg.debug_mirror; }
  // The mirror kernels (ops/paged_blocks_params.hpp) on this cache's device; lists live in device memory.
  ops::PagedCellArrays cell_arrays();
  void mirror_edit(const int32_t* blocks, int32_t n_blocks, int32_t delta, int32_t pending_delta, bool clear_pending,
                   const int32_t* maybe_block_delta = nullptr);
  void mirror_scatter(const int32_t* packed, int32_t n_blocks);
  void mirror_set_cells(const int32_t* slots, const int32_t* stored, int32_t n);  // device lists
  // The constructors' body: validates, then allocates the pools (maybe_pools: the caller's, checked).
  void init(PagedCacheConfig config, Device device, const std::span<const TensorRef>* maybe_pools);
  void check_usable() const;
  int64_t num_cells() const { return static_cast<int64_t>(cfg.num_blocks) * cfg.block_size; }

  KvPool pool(bool is_k, int32_t layer) const;
  // v_from_k_latent: V as a strided view of K's pool `k` (data and scales), for attention.
  KvPool v_in_k_view(const KvPool& k) const;
  TensorRef pending_view() const;
  // Upload the per-cell arrays of blocks [lo, hi) to the device mirrors. No-op on CPU.
  void sync_cells(int32_t lo, int32_t hi);
  // The same for a list of blocks, in one packed upload and one scatter kernel.
  void sync_blocks(const std::vector<int32_t>& blocks);
  // Device side of a transaction: COW block copies; then, after `device_work`, mirror the
  // cell arrays; on any failure undo the host changes and rethrow.
  void copy_blocks(const std::vector<int32_t>& pairs);
  // Apply PagedMeta::shift_cells to the device mirrors (no-op on CPU, where they are the host arrays).
  void device_shift_cells(const std::vector<int32_t>& blocks, int32_t delta, int32_t pending_delta);
  // sync_dirty false: device_work mirrors every cell change itself, except those of the
  // copies' target blocks, which are synced here. The first n_zero_fills pairs copy the zero
  // block into blocks just taken from the free list: their targets' cells need no sync.
  template <class F>
  void finish(PagedTxn& txn, const std::vector<int32_t>& cow_pairs, F&& device_work, bool sync_dirty = true,
              size_t n_zero_fills = 0) {
    size_t bulk_done = 0;
    try {
      copy_blocks(cow_pairs);
      for (const PagedTxn::Bulk& b : txn.bulk()) {
        device_shift_cells(b.blocks, b.pos_delta, b.pending_delta);
        ++bulk_done;
      }
      device_work();
      if (sync_dirty) {
        sync_blocks(txn.dirty_blocks());
      } else {
        std::vector<int32_t> targets;
        for (size_t i = 2 * n_zero_fills + 1; i < cow_pairs.size(); i += 2) targets.push_back(cow_pairs[i]);
        sync_blocks(targets);
      }
    } catch (...) {
      const std::vector<int32_t> dirty = txn.dirty_blocks();
      std::vector<PagedTxn::Bulk> undo(txn.bulk().begin(), txn.bulk().begin() + static_cast<std::ptrdiff_t>(bulk_done));
      txn.rollback();
      try {  // put the old values back on the device (best effort: the device may be gone)
        for (const PagedTxn::Bulk& b : undo) device_shift_cells(b.blocks, -b.pos_delta, -b.pending_delta);
        sync_blocks(dirty);
      } catch (...) {
      }
      throw;
    }
    txn.commit();
  }
  void finish(PagedTxn& txn, const std::vector<int32_t>& cow_pairs) {
    finish(txn, cow_pairs, [] {});
  }

  // Steps shared by append() and reserve().
  // Free blocks reserving counts[i] tokens for seqs[i] takes; validates the arguments.
  int64_t plan_blocks(std::string_view op, std::span<const SeqId> seqs, std::span<const int32_t> counts) const;
  uint64_t stamp_of(const AppendTicket& t) const;  // keyed hash of every field of the ticket
  // Throws InvalidArgument unless `t` is a current, unaltered ticket of this cache.
  void check_ticket(std::string_view op, const AppendTicket& t) const;
  // Caches without V pools take no V: v must be empty (or hold no element).
  void check_no_v(std::string_view op, const TensorRef& v) const;
  // Upload an i32 list into `scratch` (grown when too small); returns its device address.
  int32_t* upload_list(const std::vector<int32_t>& v);
  void reserve_impl(AppendTicket& t, std::span<const SeqId> seqs, std::span<const int32_t> counts,
                    std::span<const int32_t> positions, const TensorRef* k_all, const TensorRef* v_all);
  void store_rows(const AppendTicket& t, int32_t layer, const TensorRef& k, const TensorRef& v,
                  const TensorRef& maybe_angles = {});
  // Every layer's rows: k_all [n_layers, n, H, D], v_all likewise (or empty); maybe_angles as store_rows'.
  void store_all(const AppendTicket& t, const TensorRef& k_all, const TensorRef& v_all, const TensorRef& maybe_angles);
  void truncate_impl(SeqId id, int32_t n);
  // remove_positions (remove) or add_positions (delta) on the tokens with positions in [p0, p1).
  void edit_positions(std::string_view op, SeqId id, int32_t p0, int32_t p1, bool remove, int32_t delta);
  void fold_offsets();    // prepare()'s first step: every sequence's pos_offset into its cells
  void rotate_pending();  // prepare()'s second step (RopeStored)
  // Writes the tables into `storage` (grown when too small) and returns views into it.
  BlockTable tables(std::span<const SeqId> seqs, bool with_offsets, Buffer& storage);
};

}  // namespace kvcore
