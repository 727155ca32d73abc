// KV transfer: moving sequences from a cache on one device to a cache on another (prefill/decode
// disaggregation), over a Transport (kvcore/transfer/transport.hpp: NCCL between GPUs, or the
// in-process loopback).
//
// Protocol (both ends run it in lockstep; the sender calls transfer_send, the receiver
// transfer_receive):
//   1. sender -> receiver: a 64-byte header (magic "KVCXFER\0", version, what is sent, packing,
//      manifest and payload sizes, chunk size, xxh3 of the layout fingerprint, xxh3 of the
//      header), then the manifest: a kvcore snapshot container without its payload
//      (kvcore/persist/snapshot.hpp: fingerprint, model id, the sequences' block lists and cell
//      metadata with block ids replaced by indices; for a Dsv4Cache the per-layer lengths).
//   2. The receiver checks everything that needs no data -- the header's checksum and version,
//      the fingerprint against its own cache, the model id, the manifest's structure, the
//      payload size the manifest implies -- and that it has room (free blocks; for a Dsv4Cache,
//      an empty target sequence). receiver -> sender: a 256-byte reply, accepted or refused with
//      the error code and message. A refusal throws kvcore::Error on both ends (the receiver's
//      own error; ErrorCode of the receiver's on the sender) and leaves the link usable.
//   3. The payload moves: every pool byte of the sequences' blocks (all layers, K and V, FP8
//      scales), array-major as a snapshot's payload. Packed: gathered on the device into a
//      staging buffer, one send per chunk of at most chunk_bytes, two chunks in flight. In place:
//      one send per block per pool array, straight from the sender's pool into the receiver's
//      free blocks, up to ops_per_group sends in one group. The receiver remaps block ids: its
//      blocks come from its own free list.
//   4. The receiver commits (sequences, refcounts, positions and validity, device mirrors) only
//      after every byte arrived, then sends a 256-byte final acknowledgement.
// A failure after acceptance (the peer gone, a timeout, a device error, a size mismatch) throws
// on the receiver with its cache exactly as before the call (the blocks it wrote were free and
// stay free) and breaks the link (Transport::abort); so does a header that fails its checksum
// (the stream cannot be resynchronized). The sender's cache is never changed, except that
// pending RopeStored rotations are applied first (as snapshots do); it must not be changed while
// a send runs.
//
// Dsv4Cache: one sequence's window ring, compressor and indexer states and emitted rows (what a
// Dsv4Cache snapshot holds), into an empty sequence of the receiver's (create() it first).
// Always staged on the receiver: the slot is written only after every byte arrived.
//
// Thread safety: as the caches' and the transport's (one thread drives each end).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/transfer/transport.hpp"

namespace kvcore {

enum class TransferPacking : uint32_t {
  Packed = 0,   // gather into staging chunks: few large sends
  InPlace = 1,  // one send per block per pool array: no staging, many small sends
};

// Device buffers a transfer uses (control messages, block lists, staging chunks). Pass one in
// TransferOptions::maybe_buffers to keep them between calls: a loop of transfers then allocates
// nothing after the first (cudaMalloc / cudaFree cost more than a small transfer). One object
// serves one transfer at a time, on one device; buffers too small or on another device are
// replaced.
struct TransferBuffers {
  Buffer control, blocks, staging[2];
};

struct TransferOptions {
  std::string model_id;                      // both ends must give the same
  TransferPacking packing = TransferPacking::Packed;  // the sender's choice; the header carries it
  size_t chunk_bytes = size_t{64} << 20;     // packed: staging chunk (two are allocated)
  int32_t ops_per_group = 1024;              // in place: sends or receives per grouped call
  TransferBuffers* maybe_buffers = nullptr;  // null: allocated per call
};

struct TransferStats {
  uint64_t payload_bytes = 0;   // K/V bytes moved (all layers, scales included)
  uint64_t manifest_bytes = 0;  // metadata bytes moved
  int32_t n_blocks = 0;         // PagedCache: distinct blocks moved
  int64_t n_ops = 0;            // payload sends (sender) or receives (receiver)
  int64_t n_groups = 0;         // grouped calls the payload took
  TransferPacking packing = TransferPacking::Packed;
};

struct PagedReceived {
  std::vector<SeqId> ids;       // the new sequences, in the order they were sent
  std::vector<SeqId> sent_ids;  // their ids in the sender's cache
  TransferStats stats;
  bool ack_delivered = true;    // false: committed, but the final acknowledgement failed
};

// Sends `seqs` (distinct ids, at least one) of `cache`; returns when the receiver acknowledged
// its commit. cache.device() must be transport.device().
TransferStats transfer_send(PagedCache& cache, std::span<const SeqId> seqs, Transport& transport,
                            const TransferOptions& options);
// Receives what one transfer_send sends and adds it as new sequences (new ids, new blocks).
PagedReceived transfer_receive(PagedCache& cache, Transport& transport, const TransferOptions& options);

TransferStats transfer_send(Dsv4Cache& cache, SeqId seq, Transport& transport, const TransferOptions& options);
// `into` must be a sequence of `cache` holding no token in any layer.
TransferStats transfer_receive(Dsv4Cache& cache, SeqId into, Transport& transport, const TransferOptions& options);

}  // namespace kvcore
