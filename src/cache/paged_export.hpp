// The two hooks persistence uses to reach PagedCache's internals: export a set of sequences
// (their blocks' pool bytes and cell metadata, block ids replaced by indices into the export)
// and import such a set as new sequences on fresh blocks. Everything else of persistence
// (file format, checksums, tiers) works on PagedExport and never sees the cache's insides.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"
#include "ops/paged_blocks_params.hpp"

namespace kvcore {

struct PagedExport {
  struct Seq {
    SeqId id = 0;             // the id in the cache it came from
    int32_t n_cells = 0;      // cells spanned (live + dead)
    int32_t n_live = 0;
    std::vector<int32_t> blocks;  // indices into the export's blocks
  };
  int32_t block_size = 0;
  int32_t n_blocks = 0;
  // Bytes one block takes in each pool array, in the cache's order (per layer: K data, K scales
  // when the K format has them, V data, V scales).
  std::vector<int64_t> array_block_bytes;
  std::vector<Seq> seqs;
  std::vector<int32_t> positions;  // [n_blocks * block_size] token positions (offsets folded in)
  std::vector<uint8_t> valid;      // [n_blocks * block_size]
  // Array-major: array a holds n_blocks * array_block_bytes[a] bytes, export block order.
  // Cells past a sequence's span in its last block are zero (no stale bytes leave the cache).
  std::vector<uint8_t> payload;

  int64_t bytes_per_block() const;
  int64_t payload_bytes() const { return bytes_per_block() * n_blocks; }
};

// Bytes one block takes in each pool array of `cache` (what PagedExport::array_block_bytes holds).
std::vector<int64_t> paged_array_block_bytes(const PagedCache& cache);

// Calls cache.prepare() (positions materialized, pending rotations applied), then copies the
// listed sequences (distinct ids) out. Blocks shared between them are exported once.
PagedExport paged_export(PagedCache& cache, std::span<const SeqId> seqs);

// paged_export without the payload copy (payload left empty), for callers that move the pool
// bytes themselves (KV transfer): also says where each export block lives in the cache and how
// many of its cells the widest holder spans (the cells past it are not part of the export).
struct PagedExportPlan {
  PagedExport manifest;
  std::vector<int32_t> cache_blocks;  // [n_blocks]
  std::vector<int32_t> spans;         // [n_blocks]
};
PagedExportPlan paged_export_plan(PagedCache& cache, std::span<const SeqId> seqs);

// Every pool array of the cache (base address on the cache's device, bytes per block), in the
// order of PagedExport::array_block_bytes.
std::vector<PagedPoolArray> paged_pool_arrays(const PagedCache& cache);

// paged_import with the payload written by the caller: runs every check of paged_import on
// `manifest` (whose payload is ignored) and takes its blocks off the free list inside a
// transaction, then calls write_payload(blocks) -- blocks[e] is the cache block export block e
// lands in -- which must write every pool byte of those blocks; only then commits. If
// write_payload throws, the transaction rolls back: the cache is exactly as before.
using PagedPayloadWriter = std::function<void(std::span<const int32_t> blocks)>;
std::vector<SeqId> paged_import_with(PagedCache& cache, const PagedExport& manifest, int32_t position_delta,
                                     const PagedPayloadWriter& write_payload);

// Checks `ex` against the cache (array sizes, block size, structure: block indices, spans,
// live counts, positions >= 0 after adding position_delta, strictly increasing when the cache
// requires it; a position delta only in rope-on-read) and that enough blocks are free, then adds
// its sequences as new ones; returns their ids in export order. Throws InvalidArgument,
// Corrupt or OutOfMemory before changing anything; a device error rolls everything back.
std::vector<SeqId> paged_import(PagedCache& cache, const PagedExport& ex, int32_t position_delta = 0);

// The structural checks of paged_import that need no cache (the snapshot parser uses them):
// throws Corrupt naming the first broken rule. with_payload false: a manifest, whose payload
// travels separately (its size is not checked).
void paged_export_check(const PagedExport& ex, bool with_payload = true);

}  // namespace kvcore

namespace kvcore {
// Prefix caching's check: the largest k <= n such that cells [0, k) of `seq`'s span are all live
// at token positions 0 .. k-1 (offsets applied). Host metadata only, O(k).
int32_t paged_prefix_in_place(const PagedCache& cache, SeqId seq, int32_t n);
}  // namespace kvcore
