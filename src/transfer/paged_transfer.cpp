// KV transfer of PagedCache sequences (protocol: include/kvcore/transfer/transfer.hpp).
#include <algorithm>
#include <sstream>

#include "cache/paged_export.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "kvcore/runtime.hpp"
#include "kvcore/transfer/transfer.hpp"
#include "persist/checksum.hpp"
#include "persist/snapshot_format.hpp"
#include "transfer/block_copy.hpp"
#include "transfer/paged_chunks.hpp"
#include "transfer/protocol.hpp"

namespace kvcore {

namespace {

using xfer::Control;
using xfer::PagedChunk;

uint64_t max_chunk(const std::vector<PagedChunk>& chunks) {
  uint64_t m = 1;
  for (const PagedChunk& c : chunks) m = std::max(m, c.bytes);
  return m;
}

// Posts `ops` in groups of at most `per_group`; returns the number of groups.
int64_t post_grouped(Transport& t, const std::vector<TransferOp>& ops, int32_t per_group) {
  int64_t groups = 0;
  for (size_t i = 0; i < ops.size(); i += static_cast<size_t>(per_group)) {
    const size_t n = std::min(ops.size() - i, static_cast<size_t>(per_group));
    t.post(std::span<const TransferOp>(ops.data() + i, n));
    ++groups;
  }
  t.wait_all();
  return groups;
}

// One op per block per pool array, in payload order; `blocks` maps export index -> cache block.
std::vector<TransferOp> in_place_ops(const std::vector<PagedPoolArray>& arrays, std::span<const int32_t> blocks,
                                     TransferOp::Kind kind) {
  std::vector<TransferOp> ops;
  ops.reserve(arrays.size() * blocks.size());
  for (const PagedPoolArray& a : arrays)
    for (int32_t b : blocks) ops.push_back({kind, a.base + b * a.block_bytes, static_cast<size_t>(a.block_bytes)});
  return ops;
}

// Gathers (sender) or scatters (receiver) one chunk between the pools and `staging`.
void move_chunk(const PagedChunk& c, const std::vector<PagedPoolArray>& arrays, const int32_t* blocks_dev, uint8_t* staging,
                bool gather, Device dev, Stream stream) {
  for (const xfer::PagedSegment& s : c.segments) {
    const PagedPoolArray& a = arrays[static_cast<size_t>(s.array)];
    const xfer::BlockCopy bc{a.base, a.block_bytes, blocks_dev + s.first, s.n, staging + s.offset};
    if (gather) xfer::gather_blocks(bc, dev, stream);
    else xfer::scatter_blocks(bc, dev, stream);
  }
}

// `v` copied into `b` (grown when too small).
const Buffer& upload(Buffer& b, const std::vector<int32_t>& v, Device dev) {
  xfer::grow(b, std::max<size_t>(v.size(), 1) * sizeof(int32_t), dev);
  copy_bytes(b.data(), dev, v.data(), Device::cpu(), v.size() * sizeof(int32_t));
  return b;
}

// The first line where two fingerprints differ, for a refusal's message.
std::string fingerprint_difference(const std::string& theirs, const std::string& mine) {
  std::istringstream a(theirs), b(mine);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) return "(none)";
    if (!ga) la = "(nothing)";
    if (!gb) lb = "(nothing)";
    if (la != lb) return "the sender has '" + la + "', the receiver '" + lb + "'";
  }
}

}  // namespace

TransferStats transfer_send(PagedCache& cache, std::span<const SeqId> seqs, Transport& t, const TransferOptions& o) {
  xfer::check_options(o, "transfer_send");
  require_arg(!seqs.empty(), "transfer_send: no sequence to send");
  const Device dev = cache.device();
  require_arg(dev == t.device(), "transfer_send: the cache is on ", dev.str(), ", the transport on ", t.device().str());
  xfer::use_device(dev);
  const PagedExportPlan plan = paged_export_plan(cache, seqs);
  const PagedExport& ex = plan.manifest;
  const std::string fingerprint = layout_fingerprint(cache.config());
  const std::vector<uint8_t> manifest = persist::encode_snapshot(ex, fingerprint, o.model_id).concat();
  xfer::Header h;
  h.kind = xfer::kKindPaged;
  h.packing = o.packing;
  h.manifest_bytes = manifest.size();
  h.payload_bytes = static_cast<uint64_t>(ex.payload_bytes());
  h.chunk_bytes = o.chunk_bytes;
  h.fingerprint_hash = persist::xxh3_64(fingerprint.data(), fingerprint.size());
  const std::vector<uint8_t> header = xfer::encode_header(h);

  TransferStats st;
  st.payload_bytes = h.payload_bytes;
  st.manifest_bytes = h.manifest_bytes;
  st.n_blocks = ex.n_blocks;
  st.packing = o.packing;
  // Buffers in flight outlive the abort that a failure triggers (freeing them first could wait
  // on a transfer kernel that only the abort ends).
  TransferBuffers local;
  TransferBuffers& buf = o.maybe_buffers ? *o.maybe_buffers : local;
  Control ctl(t, buf.control);
  const xfer::Reply reply = xfer::abort_on_failure(t, [&] {
    ctl.send({header, manifest});
    return ctl.recv_reply();
  });
  if (!reply.ok) xfer::throw_refused(reply, "transfer_send");

  xfer::abort_on_failure(t, [&] {
    const std::vector<PagedPoolArray> arrays = paged_pool_arrays(cache);
    const Stream stream = cache.config().stream;
    // The transport's stream does not wait for the cache's: the pool bytes must be final first.
    synchronize(dev, stream);
    if (o.packing == TransferPacking::InPlace) {
      const std::vector<TransferOp> ops = in_place_ops(arrays, plan.cache_blocks, TransferOp::Send);
      st.n_ops = static_cast<int64_t>(ops.size());
      st.n_groups = post_grouped(t, ops, o.ops_per_group);
    } else {
      const std::vector<PagedChunk> chunks = xfer::paged_chunks(ex.array_block_bytes, ex.n_blocks, o.chunk_bytes);
      const Buffer& blocks_dev = upload(buf.blocks, plan.cache_blocks, dev);
      const uint64_t cap = max_chunk(chunks);
      Buffer* staging = buf.staging;
      xfer::grow(staging[0], cap, dev);
      xfer::grow(staging[1], chunks.size() > 1 ? cap : 1, dev);
      std::vector<uint64_t> group(chunks.size());
      // Two chunks in flight: chunk c + 1 is gathered while chunk c is sent.
      for (size_t c = 0; c < chunks.size(); ++c) {
        if (c == 0) {
          move_chunk(chunks[0], arrays, blocks_dev.as<int32_t>(), staging[0].as<uint8_t>(), true, dev, stream);
          synchronize(dev, stream);
        }
        const TransferOp op = TransferOp::send(staging[c % 2].data(), chunks[c].bytes);
        group[c] = t.post({&op, 1});
        if (c + 1 < chunks.size()) {
          if (c >= 1) t.wait(group[c - 1]);  // the buffer chunk c + 1 goes into is free again
          move_chunk(chunks[c + 1], arrays, blocks_dev.as<int32_t>(), staging[(c + 1) % 2].as<uint8_t>(), true, dev, stream);
          synchronize(dev, stream);
        }
      }
      t.wait_all();
      st.n_ops = st.n_groups = static_cast<int64_t>(chunks.size());
    }
    const xfer::Reply ack = ctl.recv_reply();
    if (!ack.ok) xfer::throw_refused(ack, "transfer_send (commit)");
  });
  return st;
}

PagedReceived transfer_receive(PagedCache& cache, Transport& t, const TransferOptions& o) {
  xfer::check_options(o, "transfer_receive");
  const Device dev = cache.device();
  require_arg(dev == t.device(), "transfer_receive: the cache is on ", dev.str(), ", the transport on ", t.device().str());
  xfer::use_device(dev);
  TransferBuffers local;  // outlives the abort a failure triggers (see transfer_send)
  TransferBuffers& buf = o.maybe_buffers ? *o.maybe_buffers : local;
  Control ctl(t, buf.control);
  const xfer::Control::Opening opening = ctl.recv_opening();
  const xfer::Header& h = opening.header;
  const std::vector<uint8_t>& manifest = opening.manifest;

  PagedReceived out;
  bool accepted = false;
  Buffer* staging = buf.staging;
  try {
    require_arg(h.kind == xfer::kKindPaged, "transfer_receive: the sender sends a Dsv4Cache sequence, this is a PagedCache");
    persist::ParsedSnapshot p = persist::parse_snapshot(manifest, /*with_payload=*/false);
    const std::string mine = layout_fingerprint(cache.config());
    require_arg(p.summary.fingerprint == mine, "transfer_receive: another layout: ",
                fingerprint_difference(p.summary.fingerprint, mine));
    require(h.fingerprint_hash == persist::xxh3_64(mine.data(), mine.size()), ErrorCode::Corrupt,
            "transfer_receive: the header's fingerprint hash does not match the manifest's fingerprint");
    require_arg(p.summary.model_id == o.model_id, "transfer_receive: model id '", p.summary.model_id,
                "' of the sender differs from '", o.model_id, "'");
    const PagedExport& ex = p.ex;
    require(h.payload_bytes == static_cast<uint64_t>(ex.payload_bytes()), ErrorCode::Corrupt, "transfer_receive: header says ",
            h.payload_bytes, " payload bytes, the manifest's blocks hold ", ex.payload_bytes());
    out.stats.payload_bytes = h.payload_bytes;
    out.stats.manifest_bytes = h.manifest_bytes;
    out.stats.n_blocks = ex.n_blocks;
    out.stats.packing = h.packing;
    for (const PagedExport::Seq& s : ex.seqs) out.sent_ids.push_back(s.id);
    // Cells spanned per export block (its widest holder): the cells past it are zeroed on arrival.
    const int32_t bs = ex.block_size;
    std::vector<int32_t> span(static_cast<size_t>(ex.n_blocks), 0);
    for (const PagedExport::Seq& s : ex.seqs)
      for (size_t bi = 0; bi < s.blocks.size(); ++bi)
        span[s.blocks[bi]] = std::max(span[s.blocks[bi]], std::min(bs, s.n_cells - static_cast<int32_t>(bi) * bs));

    out.ids = paged_import_with(cache, ex, 0, [&](std::span<const int32_t> blocks) {
      // Staging first (OutOfMemory here is still a refusal), then accept.
      const std::vector<PagedPoolArray> arrays = paged_pool_arrays(cache);
      const Stream stream = cache.config().stream;
      std::vector<PagedChunk> chunks;
      if (h.packing == TransferPacking::Packed) {
        chunks = xfer::paged_chunks(ex.array_block_bytes, ex.n_blocks, h.chunk_bytes);
        upload(buf.blocks, std::vector<int32_t>(blocks.begin(), blocks.end()), dev);
        const uint64_t cap = max_chunk(chunks);
        xfer::grow(staging[0], cap, dev);
        xfer::grow(staging[1], chunks.size() > 1 ? cap : 1, dev);
      }
      synchronize(dev, stream);  // nothing of the cache's still in flight touches these blocks
      ctl.send_reply({});  // accepted: every check passed and the blocks are taken (not committed)
      accepted = true;
      if (h.packing == TransferPacking::InPlace) {
        const std::vector<TransferOp> ops = in_place_ops(arrays, blocks, TransferOp::Recv);
        out.stats.n_ops = static_cast<int64_t>(ops.size());
        out.stats.n_groups = post_grouped(t, ops, o.ops_per_group);
      } else {
        std::vector<uint64_t> group(chunks.size());
        auto post_recv = [&](size_t c) {
          const TransferOp op = TransferOp::recv(staging[c % 2].data(), chunks[c].bytes);
          group[c] = t.post({&op, 1});
        };
        // Two chunks in flight: chunk c + 1 arrives while chunk c is scattered.
        if (!chunks.empty()) post_recv(0);
        for (size_t c = 0; c < chunks.size(); ++c) {
          if (c + 1 < chunks.size()) post_recv(c + 1);  // its buffer's last scatter (chunk c - 1) finished
          t.wait(group[c]);
          move_chunk(chunks[c], arrays, buf.blocks.as<int32_t>(), staging[c % 2].as<uint8_t>(), false, dev, stream);
          synchronize(dev, stream);
        }
        out.stats.n_ops = out.stats.n_groups = static_cast<int64_t>(chunks.size());
      }
      for (int32_t e = 0; e < ex.n_blocks; ++e) {  // no stale sender bytes past the spans
        if (span[e] == bs) continue;
        for (const PagedPoolArray& a : arrays) {
          const int64_t cell = a.block_bytes / bs;
          fill_bytes(a.base + blocks[e] * a.block_bytes + span[e] * cell, dev, 0, static_cast<size_t>((bs - span[e]) * cell),
                     stream);
        }
      }
      synchronize(dev, stream);
    });
  } catch (const std::exception& e) {
    if (!accepted) {  // refused before any payload: tell the sender, keep the link
      try {
        ctl.send_reply(xfer::reply_of(e));
      } catch (...) {
        t.abort();
      }
    } else {
      t.abort();
    }
    throw;
  }
  try {
    ctl.send_reply({});  // committed
  } catch (...) {
    out.ack_delivered = false;
    t.abort();
  }
  return out;
}

}  // namespace kvcore
