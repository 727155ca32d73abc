// The persistence hook of Dsv4Cache: everything else a snapshot needs is public (the row stores,
// the compressor states and the window ring are views); only a sequence's lengths are private.
#pragma once
#include <cstdint>
#include <span>

#include "kvcore/cache/dsv4_cache.hpp"

namespace kvcore {
// Sets the token count of every layer of sequence `seq` (lengths[layer]); the caller has written
// the rows those lengths make valid. No checks beyond the sizes: persistence checks first.
void dsv4_set_lengths(Dsv4Cache& cache, SeqId seq, std::span<const int64_t> lengths);
}  // namespace kvcore
