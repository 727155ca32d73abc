// Snapshots of one Dsv4Cache sequence slot: every layer's token count, window ring, compressor
// and indexer states and emitted rows (not the weights: the model id stands for them).
//
// Same container as PagedCache snapshots (kvcore/persist/snapshot.hpp), kind 2: chunks
// fingerprint (dsv4_layout_fingerprint()), model id, producer, 7 = lengths (u32 n_layers, i64
// length per layer), then payload: per layer in order, the ring (all window rows), for CSA and
// HCA layers the compressor's state kv and score and its first compressed_rows rows, for CSA
// layers the indexer's state kv and score and its first indexer_rows rows, each in the cache's
// storage format. Loading checks everything (checksums, fingerprint, model id, lengths within
// max_context, the payload's exact size for those lengths) before writing, and needs an empty
// slot (reset() it first); on a refusal the cache is unchanged.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcore/cache/dsv4_cache.hpp"

namespace kvcore {

std::string dsv4_layout_fingerprint(const Dsv4Cache& cache);

std::vector<uint8_t> snapshot_encode(Dsv4Cache& cache, SeqId seq, std::string_view model_id);
void snapshot_decode(Dsv4Cache& cache, SeqId seq, std::span<const uint8_t> bytes, std::string_view model_id);
void snapshot_save(Dsv4Cache& cache, SeqId seq, const std::string& path, std::string_view model_id);
void snapshot_load(Dsv4Cache& cache, SeqId seq, const std::string& path, std::string_view model_id);

}  // namespace kvcore
