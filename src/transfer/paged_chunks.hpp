// How a PagedCache payload (array-major: every pool array's blocks in export order) is cut into
// packed chunks: consecutive whole blocks, at most chunk_bytes per chunk (a block larger than
// that travels alone). Both ends compute the same cut from the manifest and the header.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace kvcore::xfer {

struct PagedSegment {
  int32_t array = 0;       // pool array index
  int32_t first = 0, n = 0;  // export blocks [first, first + n)
  uint64_t offset = 0;     // byte offset in the chunk
};
struct PagedChunk {
  uint64_t bytes = 0;
  std::vector<PagedSegment> segments;
};

std::vector<PagedChunk> paged_chunks(std::span<const int64_t> array_block_bytes, int32_t n_blocks, uint64_t chunk_bytes);

}  // namespace kvcore::xfer
