// KV transfer over NCCL between two GPUs (label gpu2; skipped, saying why, with fewer than two
// GPUs or without NCCL in the build): within one process (connect_local, two threads) and between
// two processes (this binary starts itself again as rank 1, passing the NCCL id in the
// environment). Received sequences are bit-identical to the sender's and attend the same; a
// sender that dies after the manifest leaves the receiver as it was (its wait times out, the
// communicator is aborted).
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "kvcore/runtime.hpp"
#include "kvcore/transfer/nccl_transport.hpp"
#include "paged_configs.hpp"
#include "transfer_test_util.hpp"

extern char** environ;

using namespace kvcore;
using namespace transfer_test;

namespace {

bool skip_reason(std::string& why) {
  if (!nccl_compiled()) {
    why = "this build has no NCCL (KVCORE_NCCL)";
    return true;
  }
  if (cuda_device_count() < 2) {
    why = "needs 2 GPUs, found " + std::to_string(cuda_device_count());
    return true;
  }
  return false;
}

PagedCacheConfig config() { return paged_test::small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 16, 64); }

TransferOptions opts(TransferPacking p) {
  TransferOptions o;
  o.model_id = "m";
  o.packing = p;
  o.chunk_bytes = 6000;
  o.ops_per_group = 16;
  return o;
}

// Forwards to another transport until `posts` groups were posted, then aborts it and throws:
// a process dying in the middle of a transfer.
class Dying final : public Transport {
 public:
  Dying(Transport& t, int posts) : t_(t), left_(posts) {}
  Device device() const override { return t_.device(); }
  uint64_t post(std::span<const TransferOp> ops) override {
    if (left_-- <= 0) {
      t_.abort();
      throw Error(ErrorCode::DeviceError, "test: the sender died");
    }
    return t_.post(ops);
  }
  void wait(uint64_t g) override { t_.wait(g); }
  uint64_t posted() const override { return t_.posted(); }
  void abort() noexcept override { t_.abort(); }

 private:
  Transport& t_;
  int left_;
};

std::string hex(const NcclId& id) {
  std::string s;
  char b[3];
  for (uint8_t x : id.bytes) {
    std::snprintf(b, sizeof b, "%02x", x);
    s += b;
  }
  return s;
}
NcclId unhex(const std::string& s) {
  NcclId id;
  for (size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return id;
}

}  // namespace

TEST(TransferNccl, WithinOneProcessBitIdenticalAndADeadSenderChangesNothing) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  NcclTransportOptions to;
  to.timeout_s = 10;
  auto [a, b] = NcclTransport::connect_local(Device::cuda(0), Device::cuda(1), to);
  std::mt19937_64 rng(21);
  PagedCache src(config(), Device::cuda(0));
  const std::vector<SeqId> ids = fill(src, rng);
  PagedCache dst(config(), Device::cuda(1));
  for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace}) {
    SCOPED_TRACE(p == TransferPacking::Packed ? "packed" : "in place");
    PagedReceived got;
    const BothEnds r = run_both([&] { transfer_send(src, ids, *a, opts(p)); }, [&] { got = transfer_receive(dst, *b, opts(p)); });
    ASSERT_FALSE(r.send_error) << message_of(r.send_error);
    ASSERT_FALSE(r.receive_error) << message_of(r.receive_error);
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_TRUE(same_sequence_bytes(src, ids[i], dst, got.ids[i])) << i;
      EXPECT_EQ(attention_over(src, ids[i], 4, 9 + i), attention_over(dst, got.ids[i], 4, 9 + i)) << i;
    }
  }
  // The sender dies mid-payload: its posts are header and manifest, the reply, the first chunk.
  const UsedState before = used_state(dst);
  Dying dying(*a, 3);
  const BothEnds r = run_both([&] { transfer_send(src, ids, dying, opts(TransferPacking::Packed)); },
                              [&] { transfer_receive(dst, *b, opts(TransferPacking::Packed)); });
  EXPECT_TRUE(r.send_error);
  EXPECT_EQ(code_of(r.receive_error), ErrorCode::DeviceError) << message_of(r.receive_error);
  EXPECT_TRUE(used_state(dst) == before) << "the receiver changed";
}

// Rank 1 of the two-process test: started by the test below with KVCORE_TRANSFER_NCCL_ID set.
TEST(TransferNcclChild, ReceiveAsRankOne) {
  const char* id = std::getenv("KVCORE_TRANSFER_NCCL_ID");
  if (!id) GTEST_SKIP() << "run by TransferNccl.BetweenTwoProcesses only";
  NcclTransportOptions to;
  to.timeout_s = 60;
  auto t = NcclTransport::connect(unhex(id), 1, Device::cuda(1), to);
  PagedCache dst(config(), Device::cuda(1));
  const PagedReceived got = transfer_receive(dst, *t, opts(TransferPacking::Packed));
  // The sender's sequences, rebuilt here from the same seed on this GPU.
  std::mt19937_64 rng(33);
  PagedCache ref(config(), Device::cuda(1));
  const std::vector<SeqId> ids = fill(ref, rng);
  ASSERT_EQ(got.ids.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(same_sequence_bytes(ref, ids[i], dst, got.ids[i])) << i;
    EXPECT_EQ(attention_over(ref, ids[i], 4, 9 + i), attention_over(dst, got.ids[i], 4, 9 + i)) << i;
  }
}

TEST(TransferNccl, BetweenTwoProcesses) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  if (std::getenv("KVCORE_TRANSFER_NCCL_ID")) GTEST_SKIP() << "this is the child";
  const NcclId id = nccl_unique_id();
  const std::string env = "KVCORE_TRANSFER_NCCL_ID=" + hex(id);
  std::vector<std::string> envs = {env};
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=TransferNcclChild.*";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  std::mt19937_64 rng(33);
  PagedCache src(config(), Device::cuda(0));
  const std::vector<SeqId> ids = fill(src, rng);
  NcclTransportOptions to;
  to.timeout_s = 60;
  auto t = NcclTransport::connect(id, 0, Device::cuda(0), to);
  const TransferStats st = transfer_send(src, ids, *t, opts(TransferPacking::Packed));
  EXPECT_GT(st.payload_bytes, 0u);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1 failed (its output is above)";
}
