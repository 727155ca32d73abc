// The snapshot byte format (spec: include/kvcore/persist/snapshot.hpp): encoding a PagedExport
// into pieces, and parsing untrusted bytes back with every check that needs no cache.
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <string_view>
#include <vector>

#include "cache/paged_export.hpp"
#include "kvcore/persist/snapshot.hpp"

namespace kvcore::persist {

enum SnapshotChunk : uint32_t { kFingerprint = 1, kModelId = 2, kSequences = 3, kCells = 4, kPayload = 5, kProducer = 6 };
inline constexpr uint32_t kChunkRequired = 1;   // chunk flag: readers that do not know the type refuse the file
inline constexpr uint32_t kKindPagedSequences = 1;
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
EncodedSnapshot encode_snapshot(const PagedExport& ex, std::string_view fingerprint, std::string_view model_id);

struct ParsedSnapshot {
  SnapshotSummary summary;
  PagedExport ex;
};
// Throws Corrupt (truncated, bad checksum, broken structure) or InvalidArgument (newer major).
ParsedSnapshot parse_snapshot(std::span<const uint8_t> bytes);

}  // namespace kvcore::persist
