// PagedCache: a multi-sequence paged KV cache on the CPU or one CUDA device.
//
// Per layer a K pool and a V pool of fixed-size blocks (kvcore/paged_layout.hpp);
// sequences own lists of blocks; blocks are reference counted, so fork() shares
// a whole sequence and the partly filled tail block is copied on the first write
// (copy on write; so is any block a shift must edit while it is shared).
//
// RoPE modes:
//   RopeStored: K is rotated at its position when written. shift() records a
//     pending position delta per kept cell; prepare() rotates every pending cell
//     once, so k shifts cost one rounding, not k.
//   RopeOnRead: K is stored unrotated; readers rotate at the cached positions.
//     shift() edits metadata only: no K or V byte moves.
// shift() never moves V (nor K): it frees blocks whose cells are all cut and marks the
// other cut cells dead (valid = 0).
//
// Positions. A cell stores a position; a sequence has a position offset (pos_offset), and the
// position of its token in that cell is stored - pos_offset. Every sequence holding a block
// has the same offset. RopeStored: shift() lowers the stored positions of the cells after the
// cut (their K must be rotated anyway: O(those cells)); the offset stays 0. RopeOnRead: shift()
// edits whichever side of the cut is smaller -- it lowers the cells after the cut, or it raises
// the cells before the cut and adds n_discard to the offset -- so a shift costs
// O(min(n_keep, tokens after the cut) + n_discard / block_size + block_size) host work and
// uploads only the blocks it edited, whatever the context length. (A sequence that shares
// blocks with another one always lowers the cells after the cut, copying shared blocks first.)
//
// Attention: paged_kv(layer) is the layer's view for ops/attention.hpp (pools, scales, positions,
// valid flags, RoPE mode and table); block_tables(seqs) the batch's tables in the one
// BlockTable type attention takes.
//
// Readers: block_tables(seqs, PagedPositions::Offsets) exports each sequence's offset beside
// its block table (key position = positions()[cell] - pos_offset[b]; for rope-on-read attention
// adding pos_offset[b] to the query positions is equivalent), and costs nothing more.
// prepare() -- and block_tables(seqs) with the default PagedPositions::Materialized -- folds
// every offset into the cells (O(cells of the sequences with an offset), once per shift), so
// positions() holds token positions for readers that take no offsets.
//
// prepare() also rotates what shifts left pending (RopeStored). read() and block_tables() call
// what they need; an attention path that reads positions(), valid() or the pools directly
// must call prepare() (or block_tables()) after the last change and before it reads.
//
// Metadata (block tables, refcounts, free list, positions, validity) lives on
// the host and is mirrored to the device arrays of the layout contract after
// each change. Strong guarantee: every public call that throws (bad argument,
// exhausted pool, device error) leaves every sequence, every pool byte of a
// used block and every count exactly as before: placement is planned and
// counted before anything is written, device writes before the commit go only
// to cells no sequence uses, and the host commit is undone if mirroring fails.
// (prepare() is the one exception: a device fault in the middle of its rotations
// cannot be undone; the cache then refuses further calls with Corrupt.)
//
// Conventions, the same as Dsv4Cache's: sequences are SeqId values from create() until
// erase(); positions and counts are int32_t; every device operation runs on the stream of
// the config (PagedCacheConfig::stream); optional arguments are named maybe_*; every failing
// call throws kvcore::Error naming the argument; a moved-from cache throws on every call.
//
// Thread safety: none inside. Calls that change the cache -- every non-const member, read()
// and block_tables() included (they apply pending work) -- must not overlap any other call on
// the same cache; const members may run concurrently with each other. A ticket belongs to one
// thread at a time. Distinct caches share nothing.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/paged_layout.hpp"
#include "kvcore/cache/seq_id.hpp"
#include "kvcore/device.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// RopeMode (RopeStored, RopeOnRead) is declared with the attention that reads it (ops/attention.hpp).

struct PagedCacheConfig {
  int32_t n_layers = 1;
  int32_t n_kv_heads = 1;
  // Row widths, 1..kMaxKvHeadDim (576). DeepSeek-V2/V3 MLA: head_dim 576 (the 512-dim latent,
  // then 64 RoPE dims), v_head_dim 512, and a RopeSpec with slice Tail, n_rot 64, interleaved
  // pairs: RoPE rotates at most 512 dims of a row, so wider rows rotate a head or tail slice.
  int32_t head_dim = 128;
  int32_t v_head_dim = 128;  // 0: no V pools (K and V are one row, as in DeepSeek-V4); see v_from_k_latent
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  KvFormat k_format = KvFormat::F16;
  KvFormat v_format = KvFormat::F16;  // ignored when v_head_dim == 0 or v_from_k_latent; never Dsv4Row
  // MLA's shared layout (FlashMLA's): V is K's latent. No V pools: V of a cell is the first
  // v_head_dim dims of its K row -- the same bytes, K's format and, FP8, K's first v_head_dim / 64
  // scale groups -- so a token costs one 576-dim row instead of 576 + 512. store(), store_layers()
  // and append() take K only (v must be empty: the latent is written once, inside K); paged_kv()
  // hands attention a V view of K's pool with K's row stride; read() returns V as K's first
  // v_head_dim dims. Requires 1 <= v_head_dim <= head_dim, k_format f32, f16, bf16 or fp8 (fp8:
  // v_head_dim % 64 == 0), and RoPE specs that rotate no dim below v_head_dim (a stored-RoPE
  // rotation, or a shift's, would change V). v_format is ignored (V has K's format).
  bool v_from_k_latent = false;
  std::vector<RopeSpec> rope;         // one spec for every layer, or one per layer
  RopeMode rope_mode = RopeMode::RopeStored;
  // Appended positions must be >= 0 and strictly increase along a sequence (its last
  // live token included). false: any positions >= 0.
  bool strict_positions = true;
  Stream stream;  // CUDA stream for every device operation of the cache
  // Testing aid, CPU caches only: keep the contract's cell arrays as separate mirrors updated
  // the way a CUDA cache updates its device copies (bulk edits, packed scatters, pending
  // edits), by CPU versions of the same kernels; lets CPU tests check the mirroring logic.
  bool debug_mirror = false;
  // The pools are read by kvcore's attention (ops/attention.hpp): the constructor refuses formats
  // and head dims it cannot read on the cache's device (src/ops/attention_support.hpp). false: the
  // engine reads the pools with its own kernels, any layout the contract allows. (Dsv4Row caches
  // are read by DeepSeek-V4 attention, never by paged attention: the rule does not apply.)
  bool kvcore_attention = true;

  // Throws InvalidArgument naming the field.
  void validate() const;
  const RopeSpec& rope_for(int32_t layer) const { return rope.size() == 1 ? rope[0] : rope[layer]; }
};

struct PagedStats {
  int32_t sequences = 0;
  int32_t blocks_total = 0, blocks_used = 0, blocks_free = 0;
  int32_t blocks_shared = 0;      // used blocks with refcount > 1
  int64_t bytes_per_block = 0;    // all layers, K and V, scales included
  int64_t bytes_total = 0;        // every pool byte
  int64_t bytes_used = 0;         // blocks_used * bytes_per_block
  int64_t tokens_live = 0;        // live tokens summed over sequences (shared cells counted per sequence)
  int64_t tokens_dead = 0;        // dead cells inside sequences' spans (cut by shifts)
  int64_t cells_pending = 0;      // RopeStored: cells whose rotation waits for prepare()
};

struct SeqInfo {
  int32_t n_live = 0;    // tokens
  int32_t n_cells = 0;   // cells spanned (live + dead)
  int32_t n_blocks = 0;
  int32_t last_position = -1;  // position of the last token (-1: empty)
};

// How block_tables() hands out positions.
enum class PagedPositions : uint8_t {
  Materialized,  // fold every offset into the cells first (prepare()): positions() are token positions
  Offsets,       // leave the cells as stored; BlockTable::pos_offset says what to subtract (no O(cells) work)
};

class AppendTicket;

// Engine-owned pool memory. An engine may allocate the pools itself (so its allocator, e.g.
// PyTorch's, accounts for them) and hand them to PagedCache(config, device, pools). The pools
// are a list of arrays; paged_pool_specs(config) says what each must be, in the order the
// constructor takes them: per layer K data, K scales (FP8 K only), V data (v_head_dim > 0 and not
// v_from_k_latent), V scales (FP8 V only). Every array has num_blocks + 1 blocks: block num_blocks is the cache's
// zero block (kept all zeros; blocks are copied from it when they leave the free list), which
// the engine must not write.
enum class PoolPart : uint8_t { KData, KScales, VData, VScales };
const char* pool_part_name(PoolPart part);  // "k", "k_scales", "v", "v_scales"

struct PagedPoolSpec {
  int32_t layer = 0;
  PoolPart part = PoolPart::KData;
  DType dtype = DType::F16;  // E4M3 codes and UE8M0 scales also accepted as U8 tensors
  std::array<int64_t, 4> shape{};  // [num_blocks + 1, block_size, n_kv_heads, row width], contiguous
  int64_t bytes = 0;
  static constexpr size_t kAlignment = 16;  // bytes: the data pointer's alignment (vector loads)
};
// Throws what config.validate() throws.
std::vector<PagedPoolSpec> paged_pool_specs(const PagedCacheConfig& config);

// Read-back of one layer of one sequence as f32, K rotated to current positions.
struct PagedReadBack {
  std::vector<int32_t> positions;  // [n_live]
  std::vector<float> k;            // [n_live, n_kv_heads, head_dim]
  std::vector<float> v;            // [n_live, n_kv_heads, v_head_dim] (empty when v_head_dim is 0)
};

class PagedCache {
 public:
  PagedCache(PagedCacheConfig config, Device device);
  // Over pool memory the caller owns: pools[i] is the array paged_pool_specs(config)[i] describes
  // (exact dtype, shape, contiguous, PagedPoolSpec::kAlignment-byte aligned, on `device`, no two
  // arrays overlapping; each refusal is InvalidArgument naming pools[i]). The cache zeroes them
  // and never frees them: they must stay allocated until the cache is destroyed.
  PagedCache(PagedCacheConfig config, Device device, std::span<const TensorRef> pools);
  ~PagedCache();
  PagedCache(PagedCache&&) noexcept;
  PagedCache& operator=(PagedCache&&) noexcept;
  PagedCache(const PagedCache&) = delete;
  PagedCache& operator=(const PagedCache&) = delete;

  // ---- sequences -------------------------------------------------------------------
  SeqId create();
  // A new sequence sharing every block of `seq` (no copy now; copy on first write).
  SeqId fork(SeqId seq);
  void erase(SeqId seq);
  // Append n tokens to every layer: positions [n] (host); k [n_layers, n, n_kv_heads, head_dim],
  // v [n_layers, n, n_kv_heads, v_head_dim] (empty without V pools: v_head_dim 0 or v_from_k_latent);
  // f32, f16 or bf16 on the cache's device.
  void append(SeqId seq, std::span<const int32_t> positions, const TensorRef& k, const TensorRef& v);
  // Free blocks a reserve() of counts[i] new tokens for seqs[i] would take (new blocks plus
  // copies of shared tail blocks), and whether the pool has them. Change nothing; they throw
  // only for bad arguments (unknown or repeated ids, negative counts), as reserve() would.
  int64_t blocks_needed(std::span<const SeqId> seqs, std::span<const int32_t> counts) const;
  bool can_fit(std::span<const SeqId> seqs, std::span<const int32_t> counts) const;
  bool can_fit(SeqId seq, int32_t n_tokens) const;
  // Reserve cells for counts[i] new tokens of seqs[i] (distinct ids); positions concatenated
  // in that order. The tokens are live at once; store() then writes them layer by layer.
  // Until a layer is stored, its reserved cells read as zeros (every block is zeroed in every
  // layer when it leaves the free list) or, in a block the sequence already held, as tokens
  // that the sequence itself (or the sequence it was forked from) wrote there and later
  // dropped: never another sequence's K/V.
  AppendTicket reserve(std::span<const SeqId> seqs, std::span<const int32_t> counts, std::span<const int32_t> positions);
  AppendTicket reserve(SeqId seq, std::span<const int32_t> positions);
  // The same, reusing `reuse`'s device buffers when they are large enough (a decode loop
  // allocates nothing per step). On failure `reuse` is left stale, the cache unchanged.
  void reserve(AppendTicket& reuse, std::span<const SeqId> seqs, std::span<const int32_t> counts,
               std::span<const int32_t> positions);
  // k [n_tokens, n_kv_heads, head_dim], v [n_tokens, n_kv_heads, v_head_dim] (empty without V pools).
  void store(const AppendTicket& ticket, int32_t layer, const TensorRef& k, const TensorRef& v);
  // Every layer at once (a decode step's K/V in one launch on CUDA; the same bytes as a store()
  // per layer): k [n_layers, n_tokens, n_kv_heads, head_dim], v [n_layers, n_tokens, n_kv_heads,
  // v_head_dim] (empty without V pools).
  void store_layers(const AppendTicket& ticket, const TensorRef& k, const TensorRef& v);
  // Keep tokens [0, n_keep), drop [n_keep, n_keep + n_discard), later tokens move down by
  // n_discard positions (context-shift.md). n_keep + n_discard must not exceed the length.
  void shift(SeqId seq, int32_t n_keep, int32_t n_discard);
  // Keep the first n tokens (speculative-decoding rollback).
  void truncate(SeqId seq, int32_t n);
  // Position-range edits (llama.cpp's seq_rm and seq_add), on token positions, not token
  // indices: remove_positions drops every token of `seq` whose position p has p0 <= p < p1;
  // add_positions adds `delta` (either sign) to the positions of those tokens. p1 = kPosEnd
  // reaches the end. Refused (InvalidArgument, nothing changed) when p0 < 0 or p1 < p0, when a
  // new position would be negative or reach kPosEnd, or, with strict_positions, when positions
  // would no longer increase along the sequence. RopeStored: the moved tokens' K is rotated by
  // `delta` at the next prepare(), as after shift(); RopeOnRead: metadata only. Blocks left
  // without a live token are freed; shared blocks that must change are copied first
  // (OutOfMemory, nothing changed, when the pool lacks the copies). Host work O(cells of `seq`).
  static constexpr int32_t kPosEnd = std::numeric_limits<int32_t>::max();  // appended positions are < kPosEnd
  void remove_positions(SeqId seq, int32_t p0, int32_t p1);
  void add_positions(SeqId seq, int32_t p0, int32_t p1, int32_t delta);
  // Apply what shifts left pending: fold every sequence's position offset into its cells
  // (RopeOnRead) and, RopeStored, rotate every cell with a pending delta, once. A no-op when
  // nothing is pending.
  void prepare();
  bool needs_prepare() const;

  // ---- reading ---------------------------------------------------------------------
  PagedReadBack read(SeqId seq, int32_t layer);  // calls prepare()
  // Block tables of seqs (CSR, kvcore/paged_layout.hpp); pos_offset is always set (zeros when
  // Materialized). Materialized: calls prepare(). Offsets: applies pending rotations only.
  // In buffers the cache owns: valid until the next block_tables() call or until the cache changes.
  BlockTable block_tables(std::span<const SeqId> seqs, PagedPositions positions = PagedPositions::Materialized);
  // The same in `storage`, which the caller owns (grown on the cache's device when too small, else
  // reused): valid while storage lives and is not reused, so two batches can be in flight at once.
  BlockTable block_tables(std::span<const SeqId> seqs, Buffer& storage,
                          PagedPositions positions = PagedPositions::Materialized);
  // Layer `layer`'s pages as attention reads them: pools, scales, positions, valid flags, the
  // cache's RoPE mode and the layer's RoPE table (views into the cache; with v_from_k_latent, V and
  // its scales are strided views of K's pool: the first v_head_dim dims of each row). Positions are stored
  // positions: read them with tables of the same moment (block_tables() prepares what it must).
  PagedKV paged_kv(int32_t layer) const;
  TensorRef positions() const;  // i32 [num_blocks, block_size]: stored positions (token positions after prepare())
  TensorRef valid() const;      // u8  [num_blocks, block_size] (always current)
  KvPool k_pool(int32_t layer) const;
  KvPool v_pool(int32_t layer) const;  // data empty without V pools (v_head_dim 0 or v_from_k_latent)
  const math::RopeTable& rope_table(int32_t layer) const;

  // ---- inspection ------------------------------------------------------------------
  PagedStats stats() const;
  SeqInfo info(SeqId seq) const;
  bool contains(SeqId seq) const;
  std::vector<SeqId> sequences() const;
  // Canonical text of all host metadata (sequences, block lists, refcounts, free list,
  // per-sequence position offsets, per-cell stored positions / validity / pending deltas of
  // used blocks): tests compare it.
  std::string debug_state() const;
  const PagedCacheConfig& config() const;
  Device device() const;
  bool owns_pools() const;  // false when built over the caller's pool memory
  // The stream of every later device operation (config().stream changes with it); lets a binding
  // run each call on its caller's current stream. Work of earlier calls stays ordered on their
  // streams: when the stream changes, ordering across the two is the caller's (as for any buffer
  // two streams share), e.g. a block table still read on the old stream.
  void set_stream(Stream stream);
  PagedLayout layout() const;

  struct Impl;

 private:
  // The implementation; throws InvalidArgument on a moved-from cache (every public call goes through it).
  Impl& impl();
  const Impl& impl() const;
  friend struct PagedCacheAccess;  // the persistence hooks (src/cache/paged_export.cpp)
  std::unique_ptr<Impl> impl_;
};

// Cells reserved for one step's new tokens (PagedCache::reserve()); layers are then stored one
// at a time with PagedCache::store(). Opaque and move-only: only the cache that issued it reads
// or changes what it holds. store() refuses it (InvalidArgument) when it is stale (any of its
// sequences changed since reserve()), was issued by another cache, was never issued (default
// constructed, moved from, or its reserve() failed), or its contents were altered.
class AppendTicket {
 public:
  AppendTicket() = default;
  AppendTicket(AppendTicket&& other) noexcept;  // `other` is left holding no reservation
  AppendTicket& operator=(AppendTicket&& other) noexcept;
  AppendTicket(const AppendTicket&) = delete;
  AppendTicket& operator=(const AppendTicket&) = delete;

  int32_t n_tokens() const { return n_tokens_; }
  // Device views for an engine's own store kernels (read them, never write them): i32
  // [n_tokens] cell ids (block * block_size + slot) in the order of the positions given to
  // reserve(), and those positions.
  TensorRef slot_mapping() const;
  TensorRef position_view() const;

 private:
  friend class PagedCache;
  friend struct PagedCache::Impl;
  friend struct AppendTicketAccess;  // tests only: forges tickets to check that store() refuses them
  uint64_t owner_ = 0;  // id of the issuing cache (0: not a valid ticket)
  uint64_t stamp_ = 0;  // the issuing cache's keyed hash of every field below
  std::vector<SeqId> seqs_;
  std::vector<uint64_t> versions_;
  std::vector<int32_t> counts_;
  int32_t n_tokens_ = 0;
  Buffer slots_;      // i32 [n_tokens] on the cache's device
  Buffer positions_;  // i32 [n_tokens] on the cache's device
};

}  // namespace kvcore
