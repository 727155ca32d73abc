// KV transfer over the loopback transport (CPU): packing and chunking, the protocol's messages,
// block remapping, refusals (no room, another layout or model) that keep the link usable, and
// fault injection (a peer that dies mid-transfer, a truncated message, a corrupted header or
// manifest) that leaves the receiver's cache exactly as it was. Received sequences read back
// bit-identical and give the sender's attention outputs; Dsv4Cache sequences the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "dsv4_sequence_util.hpp"
#include "kvcore/transfer/loopback.hpp"
#include "kvcore/transfer/nccl_transport.hpp"
#include "paged_configs.hpp"
#include "transfer/block_copy.hpp"
#include "transfer/paged_chunks.hpp"
#include "transfer/protocol.hpp"
#include "transfer_test_util.hpp"

using namespace kvcore;
using namespace transfer_test;
using paged_test::small_config;

namespace {

TransferOptions options(TransferPacking p, size_t chunk = size_t{64} << 20) {
  TransferOptions o;
  o.model_id = "llama-test";
  o.packing = p;
  o.chunk_bytes = chunk;
  o.ops_per_group = 7;  // several groups even for small transfers
  return o;
}

}  // namespace

TEST(TransferChunks, CoverEveryBlockOfEveryArrayOnceInPayloadOrder) {
  const std::vector<int64_t> bb = {256, 32, 256, 32};
  for (uint64_t chunk : {uint64_t{1}, uint64_t{32}, uint64_t{300}, uint64_t{1000}, uint64_t{1} << 30}) {
    SCOPED_TRACE(chunk);
    const std::vector<xfer::PagedChunk> cs = xfer::paged_chunks(bb, 5, chunk);
    uint64_t total = 0;
    int32_t array = 0, next = 0;
    for (const xfer::PagedChunk& c : cs) {
      uint64_t in_chunk = 0;
      for (const xfer::PagedSegment& s : c.segments) {
        if (next == 5) {
          ++array;
          next = 0;
        }
        EXPECT_EQ(s.array, array);
        EXPECT_EQ(s.first, next);
        EXPECT_EQ(s.offset, in_chunk);
        next += s.n;
        in_chunk += static_cast<uint64_t>(s.n) * static_cast<uint64_t>(bb[static_cast<size_t>(s.array)]);
      }
      EXPECT_EQ(in_chunk, c.bytes);
      // At most chunk bytes, unless one block alone is larger.
      EXPECT_TRUE(c.bytes <= chunk || (c.segments.size() == 1 && c.segments[0].n == 1)) << c.bytes;
      total += c.bytes;
    }
    EXPECT_EQ(array, 3);
    EXPECT_EQ(next, 5);
    EXPECT_EQ(total, 5u * (256 + 32 + 256 + 32));
  }
  EXPECT_TRUE(xfer::paged_chunks(bb, 0, 100).empty());
}

TEST(TransferChunks, GatherThenScatterMovesExactlyTheListedBlocks) {
  const int64_t bb = 24;
  std::vector<uint8_t> pool(10 * bb), staging(3 * bb), back(10 * bb, 0xee);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::vector<int32_t> blocks = {7, 2, 9};
  xfer::gather_blocks({pool.data(), bb, blocks.data(), 3, staging.data()}, Device::cpu(), {});
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(std::equal(staging.begin() + i * bb, staging.begin() + (i + 1) * bb, pool.begin() + blocks[i] * bb));
  xfer::scatter_blocks({back.data(), bb, blocks.data(), 3, staging.data()}, Device::cpu(), {});
  for (int32_t b = 0; b < 10; ++b) {
    const bool listed = std::find(blocks.begin(), blocks.end(), b) != blocks.end();
    for (int64_t j = 0; j < bb; ++j)
      EXPECT_EQ(back[b * bb + j], listed ? pool[b * bb + j] : 0xee) << "block " << b << " byte " << j;
  }
}

TEST(TransferProtocol, HeaderAndReplyRoundTripAndDamageIsCorrupt) {
  xfer::Header h;
  h.kind = xfer::kKindPaged;
  h.packing = TransferPacking::InPlace;
  h.manifest_bytes = 1234;
  h.payload_bytes = 1ull << 33;
  h.chunk_bytes = 1 << 20;
  h.fingerprint_hash = 0x0123456789abcdefull;
  const std::vector<uint8_t> b = xfer::encode_header(h);
  ASSERT_EQ(b.size(), xfer::kHeaderBytes);
  const xfer::Header g = xfer::decode_header(b);
  EXPECT_EQ(g.kind, h.kind);
  EXPECT_EQ(g.packing, h.packing);
  EXPECT_EQ(g.manifest_bytes, h.manifest_bytes);
  EXPECT_EQ(g.payload_bytes, h.payload_bytes);
  EXPECT_EQ(g.chunk_bytes, h.chunk_bytes);
  EXPECT_EQ(g.fingerprint_hash, h.fingerprint_hash);
  for (size_t i = 0; i < b.size(); ++i) {
    std::vector<uint8_t> d = b;
    d[i] ^= 0x10;
    try {
      xfer::decode_header(d);
      ADD_FAILURE() << "byte " << i << " flipped: accepted";
    } catch (const Error& e) {
      // The version fields are checked after the checksum: every flip is Corrupt.
      EXPECT_EQ(e.code(), ErrorCode::Corrupt) << "byte " << i << ": " << e.what();
    }
  }
  EXPECT_THROW(xfer::decode_header(std::span<const uint8_t>(b.data(), 63)), Error);

  xfer::Reply r;
  r.ok = false;
  r.code = ErrorCode::OutOfMemory;
  r.message = std::string(400, 'x');  // cut to what the reply holds
  const xfer::Reply q = xfer::decode_reply(xfer::encode_reply(r));
  EXPECT_FALSE(q.ok);
  EXPECT_EQ(q.code, ErrorCode::OutOfMemory);
  EXPECT_EQ(q.message, std::string(xfer::kReplyBytes - 8, 'x'));
  EXPECT_TRUE(xfer::decode_reply(xfer::encode_reply({})).ok);
}

TEST(TransferPaged, ReceivedSequencesAreBitIdenticalRemappedAndAttendTheSame) {
  for (KvFormat f : {KvFormat::F16, KvFormat::BF16, KvFormat::Fp8, KvFormat::Dsv4Row})
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead})
      for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace})
        for (size_t chunk : {size_t{1000}, size_t{64} << 20}) {
          if (p == TransferPacking::InPlace && chunk != 1000) continue;
          SCOPED_TRACE(std::string(kv_format_name(f)) + (mode == RopeMode::RopeOnRead ? " rope-on-read " : " rope-stored ") +
                       (p == TransferPacking::Packed ? "packed " : "in place ") + std::to_string(chunk));
          std::mt19937_64 rng(5);
          PagedCache src(small_config(f, mode, 8, 40), Device::cpu());
          const std::vector<SeqId> ids = fill(src, rng);
          // The receiver holds a sequence already, and a free list in another order: ids differ.
          PagedCache dst(small_config(f, mode, 8, 48), Device::cpu());
          const SeqId other = dst.create();
          append_random(dst, other, 13, rng);
          const SeqId gone = dst.create();
          append_random(dst, gone, 9, rng);
          dst.erase(gone);
          const SeqId before_other[1] = {other};
          const PagedExport other_before = paged_export(dst, before_other);

          auto [a, b] = LoopbackTransport::pair(Device::cpu());
          TransferStats sent;
          PagedReceived got;
          const BothEnds r = run_both([&] { sent = transfer_send(src, ids, *a, options(p, chunk)); },
                                      [&] { got = transfer_receive(dst, *b, options(p)); });
          ASSERT_FALSE(r.send_error) << message_of(r.send_error);
          ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
          ASSERT_EQ(got.sent_ids, ids);
          ASSERT_EQ(got.ids.size(), ids.size());
          EXPECT_TRUE(got.ack_delivered);
          EXPECT_EQ(sent.payload_bytes, got.stats.payload_bytes);
          EXPECT_EQ(sent.n_ops, got.stats.n_ops);
          EXPECT_GT(sent.payload_bytes, 0u);
          for (size_t i = 0; i < ids.size(); ++i) {
            EXPECT_TRUE(same_sequence_bytes(src, ids[i], dst, got.ids[i])) << "sequence " << i;
            EXPECT_EQ(src.info(ids[i]).last_position, dst.info(got.ids[i]).last_position);
            for (int32_t l = 0; l < 2; ++l) {
              const PagedReadBack x = src.read(ids[i], l), y = dst.read(got.ids[i], l);
              EXPECT_EQ(x.positions, y.positions);
              EXPECT_EQ(x.k, y.k);
              EXPECT_EQ(x.v, y.v);
            }
            if (f != KvFormat::Dsv4Row) {  // paged attention reads every other format
              EXPECT_EQ(attention_over(src, ids[i], 4, 100 + i), attention_over(dst, got.ids[i], 4, 100 + i));
            }
          }
          // Sharing survives (the fork's full blocks), the resident sequence is untouched.
          EXPECT_EQ(dst.stats().blocks_shared, src.stats().blocks_shared);
          EXPECT_EQ(paged_export(dst, before_other).payload, other_before.payload);
          // Received sequences are ordinary: they grow and shift like the sender's.
          append_random(dst, got.ids[1], 4, rng);
          dst.shift(got.ids[2], 1, 2);
        }
}

TEST(TransferPaged, RefusalsThrowOnBothEndsKeepTheReceiverAndTheLink) {
  std::mt19937_64 rng(9);
  PagedCache src(small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 8, 40), Device::cpu());
  const std::vector<SeqId> ids = fill(src, rng);
  const int32_t needed = src.stats().blocks_used;
  auto [a, b] = LoopbackTransport::pair(Device::cpu());

  // No room: the receiver has fewer free blocks than the sequences hold.
  PagedCache small(small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 8, needed + 2), Device::cpu());
  const SeqId resident = small.create();
  append_random(small, resident, 24, rng);  // 3 blocks: needed - 1 free
  const UsedState before = used_state(small);
  BothEnds r = run_both([&] { transfer_send(src, ids, *a, options(TransferPacking::Packed)); },
                        [&] { transfer_receive(small, *b, options(TransferPacking::Packed)); });
  EXPECT_EQ(code_of(r.receive_error), ErrorCode::OutOfMemory) << message_of(r.receive_error);
  EXPECT_EQ(code_of(r.send_error), ErrorCode::OutOfMemory) << message_of(r.send_error);
  EXPECT_NE(message_of(r.send_error).find("refused"), std::string::npos) << message_of(r.send_error);
  EXPECT_TRUE(used_state(small) == before);

  // The link still works: with room made, the same transfer goes through.
  small.erase(resident);
  PagedReceived got;
  r = run_both([&] { transfer_send(src, ids, *a, options(TransferPacking::InPlace)); },
               [&] { got = transfer_receive(small, *b, options(TransferPacking::Packed)); });
  ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
  ASSERT_FALSE(r.send_error) << message_of(r.send_error);
  EXPECT_TRUE(same_sequence_bytes(src, ids[2], small, got.ids[2]));

  // Another layout (block size, format, RoPE mode) or another model id: InvalidArgument.
  for (int which = 0; which < 4; ++which) {
    SCOPED_TRACE(which);
    PagedCacheConfig cfg = small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 8, 64);
    if (which == 0) cfg = small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 16, 64);
    if (which == 1) cfg = small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 64);
    if (which == 2) cfg = small_config(KvFormat::Fp8, RopeMode::RopeStored, 8, 64);
    PagedCache other(cfg, Device::cpu());
    const UsedState other_before = used_state(other);
    TransferOptions ro = options(TransferPacking::Packed);
    if (which == 3) ro.model_id = "another-model";
    r = run_both([&] { transfer_send(src, ids, *a, options(TransferPacking::Packed)); },
                 [&] { transfer_receive(other, *b, ro); });
    EXPECT_EQ(code_of(r.receive_error), ErrorCode::InvalidArgument) << message_of(r.receive_error);
    EXPECT_EQ(code_of(r.send_error), ErrorCode::InvalidArgument) << message_of(r.send_error);
    EXPECT_TRUE(used_state(other) == other_before);
  }
}

TEST(TransferPaged, FaultsMidTransferLeaveTheReceiverAsItWas) {
  std::mt19937_64 rng(13);
  PagedCache src(small_config(KvFormat::F16, RopeMode::RopeStored, 8, 40), Device::cpu());
  const std::vector<SeqId> ids = fill(src, rng);
  struct Case {
    const char* name;
    LoopbackFault fault;
    TransferPacking packing;
    ErrorCode receiver;  // what the receiver throws
  };
  // Sender's sends: 0 header, 1 manifest, then the payload (packed chunks or one per block and array).
  const Case cases[] = {
      {"dies after the manifest", {LoopbackFault::DieAtSend, 2, 0}, TransferPacking::Packed, ErrorCode::DeviceError},
      {"dies mid payload, packed", {LoopbackFault::DieAtSend, 4, 0}, TransferPacking::Packed, ErrorCode::DeviceError},
      {"dies mid payload, in place", {LoopbackFault::DieAtSend, 30, 0}, TransferPacking::InPlace, ErrorCode::DeviceError},
      {"truncated payload chunk", {LoopbackFault::TruncateSend, 3, 0}, TransferPacking::Packed, ErrorCode::DeviceError},
      {"truncated block", {LoopbackFault::TruncateSend, 11, 0}, TransferPacking::InPlace, ErrorCode::DeviceError},
      {"corrupted header", {LoopbackFault::FlipByte, 0, 20}, TransferPacking::Packed, ErrorCode::Corrupt},
      {"corrupted manifest", {LoopbackFault::FlipByte, 1, 100}, TransferPacking::Packed, ErrorCode::Corrupt},
      {"truncated header", {LoopbackFault::TruncateSend, 0, 0}, TransferPacking::Packed, ErrorCode::DeviceError},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PagedCache dst(small_config(KvFormat::F16, RopeMode::RopeStored, 8, 48), Device::cpu());
    const SeqId resident = dst.create();
    append_random(dst, resident, 17, rng);
    const UsedState before = used_state(dst);
    auto [a, b] = LoopbackTransport::pair(Device::cpu(), 2000);
    a->inject(c.fault);
    const BothEnds r = run_both([&] { transfer_send(src, ids, *a, options(c.packing, 600)); },
                                [&] { transfer_receive(dst, *b, options(c.packing)); });
    EXPECT_TRUE(r.send_error) << "the sender must fail too";
    ASSERT_TRUE(r.receive_error) << "the receiver must fail";
    EXPECT_EQ(code_of(r.receive_error), c.receiver) << message_of(r.receive_error);
    EXPECT_TRUE(used_state(dst) == before) << "the receiver's cache changed";
    // The receiver works on: a fresh link delivers the sequences.
    auto [a2, b2] = LoopbackTransport::pair(Device::cpu());
    PagedReceived got;
    const BothEnds ok = run_both([&] { transfer_send(src, ids, *a2, options(c.packing)); },
                                 [&] { got = transfer_receive(dst, *b2, options(c.packing)); });
    ASSERT_FALSE(ok.receive_error) << message_of(ok.receive_error);
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(same_sequence_bytes(src, ids[i], dst, got.ids[i]));
  }
}

TEST(TransferPaged, BadArgumentsAreRefusedBeforeAnythingMoves) {
  std::mt19937_64 rng(1);
  PagedCache src(small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 40), Device::cpu());
  const std::vector<SeqId> ids = fill(src, rng);
  auto [a, b] = LoopbackTransport::pair(Device::cpu(), 200);
  auto expect_arg = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << what << ": " << e.what();
    }
  };
  expect_arg([&] { transfer_send(src, {}, *a, options(TransferPacking::Packed)); }, "no sequence");
  const SeqId twice[2] = {ids[0], ids[0]};
  expect_arg([&] { transfer_send(src, twice, *a, options(TransferPacking::Packed)); }, "listed twice");
  const SeqId unknown[1] = {12345};
  expect_arg([&] { transfer_send(src, unknown, *a, options(TransferPacking::Packed)); }, "unknown id");
  TransferOptions o = options(TransferPacking::Packed);
  o.chunk_bytes = 0;
  expect_arg([&] { transfer_send(src, ids, *a, o); }, "chunk_bytes 0");
  o = options(TransferPacking::Packed);
  o.ops_per_group = 0;
  expect_arg([&] { transfer_receive(src, *b, o); }, "ops_per_group 0");
  o.packing = static_cast<TransferPacking>(7);
  expect_arg([&] { transfer_send(src, ids, *a, o); }, "packing 7");
  EXPECT_EQ(a->posted(), 0u) << "nothing was sent";
  expect_arg([] { LoopbackTransport::pair(Device::cpu(), 0); }, "timeout 0");
  // Without NCCL in the build, its factories say so.
  if (!nccl_compiled()) {
    try {
      nccl_unique_id();
      ADD_FAILURE() << "nccl_unique_id without NCCL";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::NotSupported);
    }
  }
}

namespace {

Dsv4CacheConfig dsv4_config(Dsv4Quant q) {
  Dsv4CacheConfig cfg;
  cfg.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
  cfg.hca_ratio = 16;
  cfg.index_topk = 8;
  cfg.max_context = 96;
  cfg.max_seqs = 2;
  cfg.window = 32;
  cfg.quant = q;
  return cfg;
}

}  // namespace

TEST(TransferDsv4, SequenceArrivesCompleteAndFaultsLeaveTheTargetEmpty) {
  using namespace kvcore::testing;
  for (Dsv4Quant q : {Dsv4Quant::On, Dsv4Quant::Off})
    for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace}) {
      SCOPED_TRACE(std::string(q == Dsv4Quant::On ? "quant " : "f32 ") + (p == TransferPacking::Packed ? "packed" : "in place"));
      Dsv4Cache src(dsv4_config(q), Device::cpu()), dst(dsv4_config(q), Device::cpu());
      dsv4_set_test_weights(src);
      dsv4_set_test_weights(dst);
      const SeqId s0 = src.create(), d0 = dst.create(), d1 = dst.create();
      dsv4_append_tokens(src, s0, 0, 45);
      dsv4_append_tokens(dst, d0, 0, 6);
      const std::string dst_before = dst.debug_state();
      const std::vector<float> d0_window = dst.read_window(d0, 0);

      // A peer that dies mid-payload: the target stays empty, the rest of the cache as it was.
      {
        auto [a, b] = LoopbackTransport::pair(Device::cpu(), 2000);
        a->inject({LoopbackFault::DieAtSend, 3, 0});
        TransferOptions o = options(p, 4096);
        o.ops_per_group = 2;
        const BothEnds r = run_both([&] { transfer_send(src, s0, *a, o); }, [&] { transfer_receive(dst, d1, *b, o); });
        EXPECT_EQ(code_of(r.receive_error), ErrorCode::DeviceError) << message_of(r.receive_error);
        EXPECT_TRUE(r.send_error);
        EXPECT_EQ(dst.debug_state(), dst_before);
      }
      // Refusals: a busy target, another model.
      {
        auto [a, b] = LoopbackTransport::pair(Device::cpu(), 2000);
        BothEnds r = run_both([&] { transfer_send(src, s0, *a, options(p)); }, [&] { transfer_receive(dst, d0, *b, options(p)); });
        EXPECT_EQ(code_of(r.receive_error), ErrorCode::InvalidArgument) << message_of(r.receive_error);
        EXPECT_EQ(code_of(r.send_error), ErrorCode::InvalidArgument) << message_of(r.send_error);
        TransferOptions other = options(p);
        other.model_id = "x";
        r = run_both([&] { transfer_send(src, s0, *a, options(p)); }, [&] { transfer_receive(dst, d1, *b, other); });
        EXPECT_EQ(code_of(r.receive_error), ErrorCode::InvalidArgument) << message_of(r.receive_error);
        EXPECT_EQ(dst.debug_state(), dst_before);
        // The same link then carries the sequence.
        TransferStats got;
        r = run_both([&] { transfer_send(src, s0, *a, options(p, 4096)); }, [&] { got = transfer_receive(dst, d1, *b, options(p)); });
        ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
        ASSERT_FALSE(r.send_error) << message_of(r.send_error);
        EXPECT_GT(got.payload_bytes, 0u);
      }
      EXPECT_TRUE(dsv4_same_sequence(src, s0, dst, d1));
      EXPECT_EQ(dst.read_window(d0, 0), d0_window);
      // Complete states: both go on to the same rows.
      dsv4_append_tokens(src, s0, 45, 30);
      dsv4_append_tokens(dst, d1, 45, 30);
      EXPECT_TRUE(dsv4_same_sequence(src, s0, dst, d1));
    }
}

TEST(TransferPaged, KeptBuffersServeLaterTransfersOfOtherSizes) {
  std::mt19937_64 rng(17);
  PagedCache src(small_config(KvFormat::Fp8, RopeMode::RopeStored, 8, 60), Device::cpu());
  const std::vector<SeqId> ids = fill(src, rng);
  PagedCache dst(small_config(KvFormat::Fp8, RopeMode::RopeStored, 8, 120), Device::cpu());
  TransferBuffers send_buf, recv_buf;
  auto [a, b] = LoopbackTransport::pair(Device::cpu());
  // One sequence, then all of them (larger lists and staging), then one again (reused as is).
  for (size_t n : {size_t{1}, ids.size(), size_t{1}}) {
    SCOPED_TRACE(n);
    const std::vector<SeqId> some(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
    TransferOptions so = options(TransferPacking::Packed, 700), ro = options(TransferPacking::Packed);
    so.maybe_buffers = &send_buf;
    ro.maybe_buffers = &recv_buf;
    PagedReceived got;
    const BothEnds r = run_both([&] { transfer_send(src, some, *a, so); }, [&] { got = transfer_receive(dst, *b, ro); });
    ASSERT_FALSE(r.send_error) << message_of(r.send_error);
    ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(same_sequence_bytes(src, ids[i], dst, got.ids[i]));
    EXPECT_FALSE(recv_buf.staging[0].empty());
  }
}

TEST(TransferPaged, EveryFlippedHeaderOrManifestByteIsRefusedAndChangesNothing) {
  std::mt19937_64 rng(23);
  PagedCache src(small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 8, 40), Device::cpu());
  const std::vector<SeqId> ids = fill(src, rng);
  PagedCache dst(small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 8, 48), Device::cpu());
  const SeqId resident = dst.create();
  append_random(dst, resident, 12, rng);
  const UsedState before = used_state(dst);
  // Send 0 is the header, send 1 the manifest; every 5th byte of each, and the last ones.
  for (int64_t send : {int64_t{0}, int64_t{1}}) {
    const size_t n = send == 0 ? xfer::kHeaderBytes : 1400;  // the manifest is longer; bytes past it are not flipped
    for (size_t byte = 0; byte < n; byte += (byte + 5 < n ? 5 : 1)) {
      auto [a, b] = LoopbackTransport::pair(Device::cpu(), 2000);
      a->inject({LoopbackFault::FlipByte, send, byte});
      const BothEnds r = run_both([&] { transfer_send(src, ids, *a, options(TransferPacking::Packed)); },
                                  [&] { transfer_receive(dst, *b, options(TransferPacking::Packed)); });
      ASSERT_TRUE(r.receive_error) << "send " << send << " byte " << byte << ": accepted";
      EXPECT_EQ(code_of(r.receive_error), ErrorCode::Corrupt) << "send " << send << " byte " << byte << ": "
                                                               << message_of(r.receive_error);
      EXPECT_TRUE(r.send_error) << "send " << send << " byte " << byte;
      ASSERT_TRUE(used_state(dst) == before) << "send " << send << " byte " << byte;
    }
  }
}

TEST(TransferPaged, AnEmptySequenceTravelsInBothPackings) {
  PagedCache src(small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 8), Device::cpu());
  const SeqId empty = src.create();
  PagedCache dst(small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 8), Device::cpu());
  auto [a, b] = LoopbackTransport::pair(Device::cpu());
  for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace}) {
    PagedReceived got;
    const BothEnds r = run_both([&] { transfer_send(src, {&empty, 1}, *a, options(p)); },
                                [&] { got = transfer_receive(dst, *b, options(p)); });
    ASSERT_FALSE(r.send_error) << message_of(r.send_error);
    ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
    ASSERT_EQ(got.ids.size(), 1u);
    EXPECT_EQ(dst.info(got.ids[0]).n_live, 0);
    EXPECT_EQ(got.stats.payload_bytes, 0u);
  }
}
