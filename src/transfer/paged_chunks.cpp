#include "transfer/paged_chunks.hpp"

#include <algorithm>

namespace kvcore::xfer {

std::vector<PagedChunk> paged_chunks(std::span<const int64_t> array_block_bytes, int32_t n_blocks, uint64_t chunk_bytes) {
  std::vector<PagedChunk> out;
  for (size_t a = 0; a < array_block_bytes.size(); ++a) {
    const uint64_t bb = static_cast<uint64_t>(array_block_bytes[a]);
    for (int32_t e = 0; e < n_blocks;) {
      if (out.empty() || (out.back().bytes > 0 && out.back().bytes + bb > chunk_bytes)) out.emplace_back();
      PagedChunk& c = out.back();
      const uint64_t room = chunk_bytes > c.bytes ? (chunk_bytes - c.bytes) / bb : 0;
      const int32_t n = static_cast<int32_t>(std::min<uint64_t>(std::max<uint64_t>(room, 1), n_blocks - e));
      c.segments.push_back({static_cast<int32_t>(a), e, n, c.bytes});
      c.bytes += n * bb;
      e += n;
    }
  }
  return out;
}

}  // namespace kvcore::xfer
