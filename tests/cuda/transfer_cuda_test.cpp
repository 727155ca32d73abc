// KV transfer on one GPU (label gpu): the CUDA block gather / scatter against the CPU's on awkward
// block sizes (unaligned, one slice, several slices), and whole transfers over the loopback
// transport between two caches on the same GPU -- bit-identical, same attention outputs, and a
// peer dying mid-payload leaving the receiver as it was; a Dsv4Cache sequence the same way.
// (Two GPUs: tests/gpu2/.)
#include <gtest/gtest.h>

#include <random>

#include "kvcore/runtime.hpp"
#include "kvcore/transfer/loopback.hpp"
#include "paged_configs.hpp"
#include "transfer/block_copy.hpp"
#include "dsv4_sequence_util.hpp"
#include "transfer_test_util.hpp"

using namespace kvcore;
using namespace transfer_test;

namespace {
bool have_gpu() { return cuda_device_count() > 0; }
}  // namespace

TEST(TransferCuda, BlockGatherAndScatterMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const Device gpu = Device::cuda(0);
  std::mt19937_64 rng(3);
  for (int64_t bb : {int64_t{24}, int64_t{4096}, int64_t{40000}, int64_t{65536 + 48}}) {
    SCOPED_TRACE(bb);
    const int32_t n_pool = 23;
    std::vector<uint8_t> pool(static_cast<size_t>(n_pool * bb));
    for (uint8_t& x : pool) x = static_cast<uint8_t>(rng());
    const std::vector<int32_t> blocks = {17, 0, 5, 22, 6, 7, 8, 1};
    const int32_t n = static_cast<int32_t>(blocks.size());
    const Buffer pool_d = Buffer::from_host(pool, gpu), blocks_d = Buffer::from_host(blocks, gpu);
    Buffer staging_d(static_cast<size_t>(n * bb), gpu);
    xfer::gather_blocks({pool_d.as<uint8_t>(), bb, blocks_d.as<int32_t>(), n, staging_d.as<uint8_t>()}, gpu, {});
    std::vector<uint8_t> want(static_cast<size_t>(n * bb));
    xfer::gather_blocks({pool.data(), bb, blocks.data(), n, want.data()}, Device::cpu(), {});
    EXPECT_EQ(staging_d.to_host<uint8_t>(), want);
    // Scatter into a zeroed pool: the listed blocks come back, the others stay zero.
    std::vector<uint8_t> zero(pool.size(), 0), back = zero;
    const Buffer back_d = Buffer::from_host(zero, gpu);
    xfer::scatter_blocks({back_d.as<uint8_t>(), bb, blocks_d.as<int32_t>(), n, staging_d.as<uint8_t>()}, gpu, {});
    xfer::scatter_blocks({back.data(), bb, blocks.data(), n, want.data()}, Device::cpu(), {});
    EXPECT_EQ(back_d.to_host<uint8_t>(), back);
  }
}

TEST(TransferCuda, LoopbackBetweenTwoCachesOnOneGpuIsBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const Device gpu = Device::cuda(0);
  for (KvFormat f : {KvFormat::F16, KvFormat::Fp8})
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead})
      for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace}) {
        SCOPED_TRACE(std::string(kv_format_name(f)) + (mode == RopeMode::RopeOnRead ? " rope-on-read " : " rope-stored ") +
                     (p == TransferPacking::Packed ? "packed" : "in place"));
        std::mt19937_64 rng(7);
        PagedCache src(paged_test::small_config(f, mode, 16, 40), gpu);
        const std::vector<SeqId> ids = fill(src, rng);
        PagedCache dst(paged_test::small_config(f, mode, 16, 48), gpu);
        const SeqId resident = dst.create();
        append_random(dst, resident, 20, rng);
        TransferOptions o;
        o.model_id = "m";
        o.packing = p;
        o.chunk_bytes = 5000;  // several chunks, two in flight
        o.ops_per_group = 9;
        {  // a sender that dies mid-payload: the receiver is unchanged
          auto [a, b] = LoopbackTransport::pair(gpu, 3000);
          a->inject({LoopbackFault::DieAtSend, 4, 0});
          const UsedState before = used_state(dst);
          const BothEnds r = run_both([&] { transfer_send(src, ids, *a, o); }, [&] { transfer_receive(dst, *b, o); });
          EXPECT_EQ(code_of(r.receive_error), ErrorCode::DeviceError) << message_of(r.receive_error);
          EXPECT_TRUE(used_state(dst) == before);
        }
        auto [a, b] = LoopbackTransport::pair(gpu);
        PagedReceived got;
        const BothEnds r = run_both([&] { transfer_send(src, ids, *a, o); }, [&] { got = transfer_receive(dst, *b, o); });
        ASSERT_FALSE(r.send_error) << message_of(r.send_error);
        ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
        for (size_t i = 0; i < ids.size(); ++i) {
          EXPECT_TRUE(same_sequence_bytes(src, ids[i], dst, got.ids[i])) << i;
          EXPECT_EQ(attention_over(src, ids[i], 4, 50 + i), attention_over(dst, got.ids[i], 4, 50 + i)) << i;
        }
      }
}

TEST(TransferCuda, Dsv4SequenceOverLoopbackOnOneGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  using namespace kvcore::testing;
  const Device gpu = Device::cuda(0);
  Dsv4CacheConfig cfg;
  cfg.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
  cfg.hca_ratio = 16;
  cfg.index_topk = 8;
  cfg.max_context = 96;
  cfg.max_seqs = 2;
  cfg.window = 32;
  for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace}) {
    SCOPED_TRACE(p == TransferPacking::Packed ? "packed" : "in place");
    Dsv4Cache src(cfg, gpu), dst(cfg, gpu);
    dsv4_set_test_weights(src);
    dsv4_set_test_weights(dst);
    const SeqId s0 = src.create(), d0 = dst.create();
    dsv4_append_tokens(src, s0, 0, 45);
    TransferOptions o;
    o.model_id = "dsv4";
    o.packing = p;
    o.chunk_bytes = 10000;
    auto [a, b] = LoopbackTransport::pair(gpu);
    const BothEnds r = run_both([&] { transfer_send(src, s0, *a, o); }, [&] { transfer_receive(dst, d0, *b, o); });
    ASSERT_FALSE(r.send_error) << message_of(r.send_error);
    ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
    EXPECT_TRUE(dsv4_same_sequence(src, s0, dst, d0));
    dsv4_append_tokens(src, s0, 45, 20);
    dsv4_append_tokens(dst, d0, 45, 20);
    EXPECT_TRUE(dsv4_same_sequence(src, s0, dst, d0));
  }
}
