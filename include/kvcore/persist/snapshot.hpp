// Snapshots: sequences of a PagedCache saved to a file (or a byte string) and loaded back.
//
// What a snapshot holds: the sequences' cell metadata (token positions, validity), their block
// lists (blocks two saved sequences share are saved once and shared again after loading), every
// pool byte of their blocks (all layers, K and V, FP8 scales), a layout fingerprint, the model
// id the caller gave, and the kvcore version that wrote it. K is saved as the cache stores it:
// rotated (rope-stored) or not (rope-on-read); a rope-on-read snapshot can therefore be loaded
// at another position base (SnapshotLoadOptions::position_delta) by metadata alone.
//
// Loading checks the whole file before it touches the cache: magic, version, every checksum,
// the footer, the structure, the fingerprint against the target cache and the model id against
// the caller's; then it needs enough free blocks. A truncated or corrupted file throws Corrupt;
// another layout, another model id or a newer major version InvalidArgument; too few free blocks
// OutOfMemory. The cache is then exactly as it was. Loaded sequences get new ids.
//
// File format, version 1.0 (little-endian; every chunk starts at a multiple of 8 bytes):
//   header (32 B)  char magic[8] = "KVCSNAP\0"; u16 major; u16 minor; u32 kind (1: PagedCache
//                  sequences); u32 header_bytes = 32; u32 flags = 0; u64 xxh3_64 of bytes [0, 24)
//   chunk*         u32 type; u32 flags (bit 0: a reader that does not know `type` must refuse the
//                  file); u64 body_bytes; u64 xxh3_64 of the body; body; zero padding to 8 bytes
//   footer (32 B)  char magic[8] = "KVCSEND\0"; u64 n_chunks; u64 file_bytes (footer included);
//                  u64 xxh3_64 of every chunk's 24-byte head, in order (the header has its own)
// Chunk types (each exactly once unless noted):
//   1 fingerprint  text, "key value" lines: what makes the bytes meaningful (layout_fingerprint())
//   2 model id     the caller's bytes (e.g. repo, revision, dtype, tokenizer hash)
//   3 sequences    u32 n_seqs, u32 block_size, u32 n_blocks, u32 n_arrays, i64 array_block_bytes
//                  [n_arrays] (per layer: K data, K scales if any, V data, V scales if any); per
//                  sequence: i64 saved id, i32 n_cells, i32 n_live, u32 n_blocks, i32 block [n_blocks]
//                  (indices into the snapshot's blocks)
//   4 cells        i32 positions [n_blocks * block_size] (token positions; 0 in dead cells), then
//                  u8 valid [n_blocks * block_size]
//   5 payload      any number, concatenated in order: array-major pool bytes, array a holding
//                  n_blocks * array_block_bytes[a] bytes (cells past every holder's span zeroed)
//   6 producer     text: the kvcore version that wrote the file (informational)
// Compatibility: a reader loads every file of its major version; a newer minor may add chunk
// types, which an older reader skips unless their flag bit 0 is set. A new major is refused.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"

namespace kvcore {

inline constexpr uint16_t kSnapshotMajor = 1;
inline constexpr uint16_t kSnapshotMinor = 0;

// The canonical text of what makes a PagedCache's bytes meaningful: formats, head dims, block
// size, layer count, RoPE mode and every layer's RopeSpec (exact, hex floats). The pool size and
// the position rule are not part of it: a snapshot loads into a cache of any size.
std::string layout_fingerprint(const PagedCacheConfig& config);
// xxh3_64 of layout_fingerprint(): the layout part of a store key.
uint64_t layout_fingerprint_hash(const PagedCacheConfig& config);

struct SnapshotLoadOptions {
  std::string model_id;        // must equal the file's
  int32_t position_delta = 0;  // added to every loaded position (rope-on-read caches only)
};

// The ids of the loaded sequences, in the order they were saved, beside their saved ids.
struct SnapshotLoaded {
  std::vector<SeqId> saved_ids;
  std::vector<SeqId> ids;
};

// ---- bytes ----
// Encodes `seqs` (distinct ids; empty: every sequence of the cache). Calls the cache's
// pending-rotation step first (RopeStored), as read() does.
std::vector<uint8_t> snapshot_encode(PagedCache& cache, std::span<const SeqId> seqs, std::string_view model_id);
SnapshotLoaded snapshot_decode(PagedCache& cache, std::span<const uint8_t> bytes, const SnapshotLoadOptions& options);

// ---- files ----
// Written to a temporary file in the same directory, fsync'ed, renamed over `path`, then the
// directory fsync'ed: after a crash `path` holds the old file or the new one, never a mix.
void snapshot_save(PagedCache& cache, const std::string& path, std::string_view model_id,
                   std::span<const SeqId> seqs = {});
SnapshotLoaded snapshot_load(PagedCache& cache, const std::string& path, const SnapshotLoadOptions& options);

// ---- inspection ----
struct SnapshotSummary {
  uint16_t major = 0, minor = 0;
  uint32_t kind = 0;
  uint64_t file_bytes = 0;
  int64_t n_chunks = 0;
  std::string fingerprint, model_id, producer;
  int32_t block_size = 0, n_blocks = 0;
  int64_t bytes_per_block = 0;
  struct Seq {
    SeqId saved_id = 0;
    int32_t n_cells = 0, n_live = 0, n_blocks = 0;
    int32_t first_position = -1, last_position = -1;
  };
  std::vector<Seq> seqs;
  std::vector<uint32_t> skipped_chunk_types;  // optional chunks of a newer minor
};
// Checks everything a load checks that needs no cache (throws Corrupt or InvalidArgument).
SnapshotSummary snapshot_inspect(std::span<const uint8_t> bytes);
std::string snapshot_describe(const SnapshotSummary& s);
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace kvcore
