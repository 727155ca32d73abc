// The snapshot byte format (spec: include/kvcore/persist/snapshot.hpp): encoding a PagedExport
// into pieces, and parsing untrusted bytes back with every check that needs no cache.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string_view>
#include <vector>

#include "cache/paged_export.hpp"
#include "kvcore/persist/snapshot.hpp"

namespace kvcore::persist {

enum SnapshotChunk : uint32_t {
  kFingerprint = 1, kModelId = 2, kSequences = 3, kCells = 4, kPayload = 5, kProducer = 6, kDsv4Lengths = 7,
  kLastChunk = kDsv4Lengths
};
inline constexpr uint32_t kChunkRequired = 1;   // chunk flag: readers that do not know the type refuse the file
inline constexpr uint32_t kKindPagedSequences = 1, kKindDsv4Sequence = 2;
inline constexpr size_t kHeaderBytes = 32, kChunkHeadBytes = 24, kFooterBytes = 32;
inline constexpr size_t kPayloadChunkBytes = size_t{16} << 20;

// An encoded snapshot as a list of pieces: small parts it owns and views of the export's payload
// (which must outlive it). Written to a file piece by piece, or concatenated.
struct EncodedSnapshot {
  std::deque<std::vector<uint8_t>> owned;
  std::vector<std::span<const uint8_t>> pieces;
  uint64_t bytes = 0;
  std::vector<uint8_t> concat() const;
};
// The container: header, fingerprint, model id, producer, the given single chunks, the payload
// in chunks of at most kPayloadChunkBytes, footer.
EncodedSnapshot encode_container(uint32_t kind, std::string_view fingerprint, std::string_view model_id,
                                 std::vector<std::pair<uint32_t, std::vector<uint8_t>>> singles,
                                 std::span<const uint8_t> payload);
EncodedSnapshot encode_snapshot(const PagedExport& ex, std::string_view fingerprint, std::string_view model_id);

// A parsed container: every checksum, the footer and the chunk list checked; summary fields
// major, minor, kind, file_bytes, n_chunks, fingerprint, model_id, producer filled.
struct Container {
  SnapshotSummary summary;
  std::map<uint32_t, std::span<const uint8_t>> singles;  // known chunk types other than payload
  std::vector<std::span<const uint8_t>> payload;
  uint64_t payload_bytes = 0;
  std::span<const uint8_t> single(uint32_t type) const;  // Corrupt when missing
};
Container parse_container(std::span<const uint8_t> bytes);

struct ParsedSnapshot {
  SnapshotSummary summary;
  PagedExport ex;
};
// Throws Corrupt (truncated, bad checksum, broken structure) or InvalidArgument (newer major).
// with_payload false: a manifest (KV transfer), a container that must hold no payload chunk;
// the export's payload stays empty and travels separately.
ParsedSnapshot parse_snapshot(std::span<const uint8_t> bytes, bool with_payload = true);

}  // namespace kvcore::persist
