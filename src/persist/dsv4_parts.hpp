// What one Dsv4Cache sequence consists of, in the order snapshots and KV transfer move it: per
// layer the window ring, for CSA and HCA layers the compressor's state kv and score and its
// emitted rows, for CSA layers the indexer's the same; each a view of the cache with the number
// of bytes that count for the layer's length (rows past it are not moved).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore::persist {

struct Dsv4Part {
  TensorRef view;
  size_t bytes;
};
std::vector<Dsv4Part> dsv4_layer_parts(const Dsv4Cache& cache, SeqId seq, int32_t layer, int64_t length);

// The lengths chunk (u32 n_layers, i64 length per layer) and its checked parse: Corrupt unless
// it names the cache's layer count and every length lies in [0, max_context].
std::vector<uint8_t> dsv4_encode_lengths(const Dsv4Cache& cache, SeqId seq);
std::vector<int64_t> dsv4_parse_lengths(const Dsv4Cache& cache, std::span<const uint8_t> chunk);

}  // namespace kvcore::persist
