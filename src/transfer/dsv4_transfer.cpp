// KV transfer of one Dsv4Cache sequence (protocol: include/kvcore/transfer/transfer.hpp). The
// payload is the sequence's parts (persist/dsv4_parts.hpp) back to back, as in a snapshot.
// Packed: the sender gathers them into one staging buffer and sends it in chunk_bytes pieces; in
// place: one send per part. The receiver always lands the bytes in a staging buffer first and
// writes the target sequence only when all of them arrived.
#include <algorithm>

#include "cache/dsv4_export.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/persist/dsv4_snapshot.hpp"
#include "kvcore/runtime.hpp"
#include "kvcore/transfer/transfer.hpp"
#include "persist/checksum.hpp"
#include "persist/dsv4_parts.hpp"
#include "persist/snapshot_format.hpp"
#include "transfer/block_copy.hpp"
#include "transfer/protocol.hpp"

namespace kvcore {

namespace {

using xfer::Control;

std::vector<persist::Dsv4Part> all_parts(const Dsv4Cache& c, SeqId seq, std::span<const int64_t> lengths) {
  std::vector<persist::Dsv4Part> parts;
  for (int32_t l = 0; l < c.n_layers(); ++l)
    for (const persist::Dsv4Part& p : persist::dsv4_layer_parts(c, seq, l, lengths[l]))
      if (p.bytes) parts.push_back(p);
  return parts;
}

uint64_t total_bytes(const std::vector<persist::Dsv4Part>& parts) {
  uint64_t n = 0;
  for (const persist::Dsv4Part& p : parts) n += p.bytes;
  return n;
}

// Packed: pieces of chunk_bytes of the staged payload, one op each.
std::vector<TransferOp> packed_ops(uint8_t* staging, uint64_t bytes, uint64_t chunk, TransferOp::Kind kind) {
  std::vector<TransferOp> ops;
  for (uint64_t at = 0; at < bytes; at += chunk) ops.push_back({kind, staging + at, static_cast<size_t>(std::min(chunk, bytes - at))});
  return ops;
}

int64_t post_grouped(Transport& t, const std::vector<TransferOp>& ops, int32_t per_group) {
  int64_t groups = 0;
  for (size_t i = 0; i < ops.size(); i += static_cast<size_t>(per_group)) {
    t.post(std::span<const TransferOp>(ops.data() + i, std::min(ops.size() - i, static_cast<size_t>(per_group))));
    ++groups;
  }
  t.wait_all();
  return groups;
}

}  // namespace

TransferStats transfer_send(Dsv4Cache& c, SeqId seq, Transport& t, const TransferOptions& o) {
  xfer::check_options(o, "transfer_send(Dsv4Cache)");
  require_arg(c.contains(seq), "transfer_send(Dsv4Cache): seq ", seq, " is not a sequence of this cache");
  const Device dev = c.device();
  require_arg(dev == t.device(), "transfer_send(Dsv4Cache): the cache is on ", dev.str(), ", the transport on ",
              t.device().str());
  xfer::use_device(dev);
  std::vector<int64_t> lengths;
  for (int32_t l = 0; l < c.n_layers(); ++l) lengths.push_back(c.length(seq, l));
  const std::vector<persist::Dsv4Part> parts = all_parts(c, seq, lengths);
  const std::string fingerprint = dsv4_layout_fingerprint(c);
  std::vector<std::pair<uint32_t, std::vector<uint8_t>>> singles;
  singles.emplace_back(persist::kDsv4Lengths, persist::dsv4_encode_lengths(c, seq));
  const std::vector<uint8_t> manifest =
      persist::encode_container(persist::kKindDsv4Sequence, fingerprint, o.model_id, std::move(singles), {}).concat();
  xfer::Header h;
  h.kind = xfer::kKindDsv4;
  h.packing = o.packing;
  h.manifest_bytes = manifest.size();
  h.payload_bytes = total_bytes(parts);
  h.chunk_bytes = o.chunk_bytes;
  h.fingerprint_hash = persist::xxh3_64(fingerprint.data(), fingerprint.size());
  const std::vector<uint8_t> header = xfer::encode_header(h);
  TransferStats st;
  st.payload_bytes = h.payload_bytes;
  st.manifest_bytes = h.manifest_bytes;
  st.packing = o.packing;

  TransferBuffers local;  // outlives the abort a failure triggers
  TransferBuffers& buf = o.maybe_buffers ? *o.maybe_buffers : local;
  Control ctl(t, buf.control);
  const xfer::Reply reply = xfer::abort_on_failure(t, [&] {
    ctl.send({header, manifest});
    return ctl.recv_reply();
  });
  if (!reply.ok) xfer::throw_refused(reply, "transfer_send(Dsv4Cache)");
  xfer::abort_on_failure(t, [&] {
    std::vector<TransferOp> ops;
    synchronize(dev, c.config().stream);  // the transport's stream does not wait for the cache's
    if (o.packing == TransferPacking::InPlace) {
      for (const persist::Dsv4Part& p : parts) ops.push_back(TransferOp::send(p.view.data(), p.bytes));
    } else {
      const Buffer& staging = xfer::grow(buf.staging[0], std::max<uint64_t>(h.payload_bytes, 1), dev);
      uint64_t at = 0;
      for (const persist::Dsv4Part& p : parts) {
        copy_bytes(staging.as<uint8_t>() + at, dev, p.view.data(), dev, p.bytes, c.config().stream);
        at += p.bytes;
      }
      synchronize(dev, c.config().stream);
      ops = packed_ops(staging.as<uint8_t>(), h.payload_bytes, o.chunk_bytes, TransferOp::Send);
    }
    st.n_ops = static_cast<int64_t>(ops.size());
    st.n_groups = post_grouped(t, ops, o.ops_per_group);
    const xfer::Reply ack = ctl.recv_reply();
    if (!ack.ok) xfer::throw_refused(ack, "transfer_send(Dsv4Cache) (commit)");
  });
  return st;
}

TransferStats transfer_receive(Dsv4Cache& c, SeqId into, Transport& t, const TransferOptions& o) {
  xfer::check_options(o, "transfer_receive(Dsv4Cache)");
  const Device dev = c.device();
  require_arg(dev == t.device(), "transfer_receive(Dsv4Cache): the cache is on ", dev.str(), ", the transport on ",
              t.device().str());
  xfer::use_device(dev);
  TransferBuffers local;  // outlives the abort a failure triggers
  TransferBuffers& buf = o.maybe_buffers ? *o.maybe_buffers : local;
  Control ctl(t, buf.control);
  const xfer::Control::Opening opening = ctl.recv_opening();
  const xfer::Header& h = opening.header;
  const std::vector<uint8_t>& manifest = opening.manifest;

  TransferStats st;
  std::vector<int64_t> lengths;
  std::vector<persist::Dsv4Part> parts;
  try {
    require_arg(h.kind == xfer::kKindDsv4, "transfer_receive(Dsv4Cache): the sender sends PagedCache sequences");
    require_arg(c.contains(into), "transfer_receive(Dsv4Cache): seq ", into, " is not a sequence of this cache");
    for (int32_t l = 0; l < c.n_layers(); ++l)
      require_arg(c.length(into, l) == 0, "transfer_receive(Dsv4Cache): sequence ", into, " layer ", l, " holds ",
                  c.length(into, l), " tokens; receive into an empty sequence");
    const persist::Container k = persist::parse_container(manifest);
    require_arg(k.summary.kind == persist::kKindDsv4Sequence, "transfer_receive(Dsv4Cache): manifest kind ", k.summary.kind,
                " is not a Dsv4Cache sequence");
    require(k.payload_bytes == 0, ErrorCode::Corrupt, "transfer_receive(Dsv4Cache): the manifest carries a payload");
    const std::string mine = dsv4_layout_fingerprint(c);
    require_arg(k.summary.fingerprint == mine, "transfer_receive(Dsv4Cache): another DeepSeek-V4 layout: the sender's is\n",
                k.summary.fingerprint, "the receiver's\n", mine);
    require(h.fingerprint_hash == persist::xxh3_64(mine.data(), mine.size()), ErrorCode::Corrupt,
            "transfer_receive(Dsv4Cache): the header's fingerprint hash does not match the manifest's fingerprint");
    require_arg(k.summary.model_id == o.model_id, "transfer_receive(Dsv4Cache): model id '", k.summary.model_id,
                "' of the sender differs from '", o.model_id, "'");
    lengths = persist::dsv4_parse_lengths(c, k.single(persist::kDsv4Lengths));
    parts = all_parts(c, into, lengths);
    require(h.payload_bytes == total_bytes(parts), ErrorCode::Corrupt, "transfer_receive(Dsv4Cache): header says ",
            h.payload_bytes, " payload bytes, these lengths need ", total_bytes(parts));
    xfer::grow(buf.staging[0], std::max<uint64_t>(h.payload_bytes, 1), dev);  // OutOfMemory: a refusal
  } catch (const std::exception& e) {
    try {
      ctl.send_reply(xfer::reply_of(e));
    } catch (...) {
      t.abort();
    }
    throw;
  }
  st.payload_bytes = h.payload_bytes;
  st.manifest_bytes = h.manifest_bytes;
  st.packing = h.packing;

  const Buffer& staging = buf.staging[0];
  xfer::abort_on_failure(t, [&] {
    ctl.send_reply({});  // accepted
    std::vector<TransferOp> ops;
    if (h.packing == TransferPacking::InPlace) {
      uint64_t at = 0;
      for (const persist::Dsv4Part& p : parts) {
        ops.push_back(TransferOp::recv(staging.as<uint8_t>() + at, p.bytes));
        at += p.bytes;
      }
    } else {
      ops = packed_ops(staging.as<uint8_t>(), h.payload_bytes, h.chunk_bytes, TransferOp::Recv);
    }
    st.n_ops = static_cast<int64_t>(ops.size());
    st.n_groups = post_grouped(t, ops, o.ops_per_group);
  });
  // Every byte arrived: write the (empty) sequence, then its lengths. A device failure here
  // leaves it empty (lengths 0), as it was, and breaks the link (the sender waits for a commit).
  xfer::abort_on_failure(t, [&] {
    uint64_t at = 0;
    for (const persist::Dsv4Part& p : parts) {
      copy_bytes(p.view.data(), dev, staging.as<uint8_t>() + at, dev, p.bytes, c.config().stream);
      at += p.bytes;
    }
    synchronize(dev, c.config().stream);
  });
  dsv4_set_lengths(c, into, lengths);
  try {
    ctl.send_reply({});  // committed
  } catch (...) {
    t.abort();
  }
  return st;
}

}  // namespace kvcore
