// BlockOffloader on the CPU (the same API the CUDA tier runs, synchronously): bit-identical round
// trips through pinned memory and through a lower store, stale bytes never leaving a block,
// a slow lower tier never blocking the caller, failing and corrupting tiers giving misses (never
// wrong K/V), and bad input refused without changes.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "kvcore/error.hpp"
#include "kvcore/persist/block_offload.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "paged_configs.hpp"
#include "persist_offload_util.hpp"

using namespace kvcore;
using namespace offload_test;

namespace {

StoreKey key_of(int i, const PagedCacheConfig& c) {
  const int32_t t[3] = {i, i * 31 + 7, 12345};
  return store_key_for_tokens(t, "tenant-a", c);
}

bool all_zero(const std::vector<uint8_t>& v) {
  for (uint8_t b : v)
    if (b) return false;
  return true;
}

// Fills every free block with random bytes (a sequence appended, then erased), so a load that
// left any cell unwritten would show it.
void dirty_free_blocks(PagedCache& c, std::mt19937_64& rng) {
  const SeqId junk = c.create();
  append_random(c, junk, c.stats().blocks_free * c.config().block_size, rng, 0);
  c.erase(junk);
}

// A lower store whose put() waits until the test opens the gate (or 20 s pass).
class GateStore : public KvStore {
 public:
  HostStore inner{int64_t{64} << 20};
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int puts_done = 0;
  std::string name() const override { return "gate"; }
  bool put(const StoreKey& key, std::span<const uint8_t> payload) override {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(20), [&] { return open; });
    }
    const bool ok = inner.put(key, payload);
    std::lock_guard<std::mutex> lock(mu);
    ++puts_done;
    return ok;
  }
  std::optional<std::vector<uint8_t>> get(const StoreKey& key) override { return inner.get(key); }
  bool contains(const StoreKey& key) override { return inner.contains(key); }
  bool remove(const StoreKey& key) override { return inner.remove(key); }
  StoreStats stats() const override { return inner.stats(); }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  int done() {
    std::lock_guard<std::mutex> lock(mu);
    return puts_done;
  }
};

// A broken lower store: keeps values unsealed and hands them back with byte `flip` changed; or
// refuses every put.
class BrokenStore : public KvStore {
 public:
  std::map<std::string, std::vector<uint8_t>> values;
  bool refuse = false;
  size_t flip = 0;
  std::string name() const override { return "broken"; }
  bool put(const StoreKey& key, std::span<const uint8_t> payload) override {
    if (refuse) return false;
    values[key.hex()].assign(payload.begin(), payload.end());
    return true;
  }
  std::optional<std::vector<uint8_t>> get(const StoreKey& key) override {
    auto it = values.find(key.hex());
    if (it == values.end()) return std::nullopt;
    std::vector<uint8_t> v = it->second;
    v[flip % v.size()] ^= 0x10;
    return v;
  }
  bool contains(const StoreKey& key) override { return values.count(key.hex()) > 0; }
  bool remove(const StoreKey& key) override { return values.erase(key.hex()) > 0; }
  StoreStats stats() const override { return {}; }
};

// mla_shared: DeepSeek MLA's geometry in the shared layout (V is K's latent, no V pools).
struct OffloadCase {
  KvFormat format;
  RopeMode mode;
  bool mla_shared = false;
};

PagedCacheConfig config_of(const OffloadCase& oc) {
  return oc.mla_shared ? paged_test::mla_shared_config(oc.format, oc.mode, 8, 48)
                       : paged_test::small_config(oc.format, oc.mode, 8, 48);
}

class OffloadRoundTrip : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(OffloadRoundTrip, PinnedAndLowerTierRoundTripsAreBitIdentical) {
  const OffloadCase oc = GetParam();
  PagedCache cache(config_of(oc), Device::cpu());
  std::mt19937_64 rng(7 + static_cast<int>(oc.format) * 2 + static_cast<int>(oc.mode));
  // a: truncated (stale cells past its span); b: a fork of a, sharing its blocks, then extended;
  // c: shifted (dead cells inside its span).
  const SeqId a = cache.create();
  append_random(cache, a, 37, rng, 0);
  cache.truncate(a, 30);
  const SeqId b = cache.fork(a);
  append_random(cache, b, 5, rng);
  const SeqId c = cache.create();
  append_random(cache, c, 26, rng, 0);
  cache.shift(c, 4, 9);
  const SeqId seqs[3] = {a, b, c};
  std::vector<SeqBytes> want;
  for (SeqId s : seqs) want.push_back(seq_bytes(cache, s));

  // Pinned memory alone, every value staying there.
  {
    BlockOffloader pinned(cache, {int64_t{16} << 20, nullptr, "model-x"});
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(pinned.offload(seqs[i], key_of(i, cache.config()))) << i;
    for (int i = 0; i < 3; ++i) {
      dirty_free_blocks(cache, rng);
      const std::optional<SeqId> got = pinned.load(key_of(i, cache.config()));
      ASSERT_TRUE(got.has_value()) << i;
      EXPECT_TRUE(seq_bytes(cache, *got) == want[i]) << "value " << i << " differs after a pinned round trip";
      EXPECT_TRUE(all_zero(bytes_past_span(cache, *got))) << "stale bytes past the span of value " << i;
      cache.erase(*got);
    }
    EXPECT_EQ(pinned.stats().pinned_hits, 3);
  }

  HostStore lower(int64_t{64} << 20);
  // Room for about one value: the others go down to `lower` as they are evicted.
  const int64_t one = cache.stats().bytes_per_block * 6;
  BlockOffloader off(cache, {one, &lower, "model-x"});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(off.offload(seqs[i], key_of(i, cache.config()))) << i;
  off.flush();
  for (SeqId s : seqs) cache.erase(s);
  EXPECT_EQ(cache.stats().sequences, 0) << "a CPU offload keeps no holder";
  dirty_free_blocks(cache, rng);

  for (int round = 0; round < 2; ++round)  // the second round finds promoted values in pinned memory
    for (int i = 0; i < 3; ++i) {
      const std::optional<SeqId> got = off.load(key_of(i, cache.config()));
      ASSERT_TRUE(got.has_value()) << i;
      EXPECT_TRUE(seq_bytes(cache, *got) == want[i]) << "value " << i << " round " << round << " differs";
      EXPECT_TRUE(all_zero(bytes_past_span(cache, *got))) << "stale bytes past the span of value " << i;
      cache.erase(*got);
      dirty_free_blocks(cache, rng);
    }
  const OffloadStats st = off.stats();
  EXPECT_EQ(st.offloads, 3);
  EXPECT_GE(st.demoted, 2);
  EXPECT_GE(st.lower_hits, 2);
  EXPECT_EQ(st.pinned_hits + st.lower_hits, 6);
  EXPECT_EQ(st.misses, 0);

  // The lower tier's values are ordinary sequence values: load_sequence reads them too.
  PagedCache other(config_of(oc), Device::cpu());
  for (int i = 0; i < 3; ++i) {
    if (!lower.contains(key_of(i, cache.config()))) continue;
    const std::optional<SeqId> got = load_sequence(lower, key_of(i, cache.config()), other, "model-x");
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(seq_bytes(other, *got) == want[i]);
  }
}

std::vector<OffloadCase> offload_cases() {
  std::vector<OffloadCase> v;
  for (KvFormat f : paged_test::kAllFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m});
  for (KvFormat f : paged_test::kMlaFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, OffloadRoundTrip, ::testing::ValuesIn(offload_cases()),
                         [](const ::testing::TestParamInfo<OffloadCase>& i) {
                           return std::string(kv_format_name(i.param.format)) +
                                  (i.param.mode == RopeMode::RopeStored ? "_RopeStored" : "_RopeOnRead") +
                                  (i.param.mla_shared ? "_MlaSharedV" : "");
                         });

// A value the first tier evicted is in the tiered store until the tier below holds it: contains()
// and get() find it while its move is held at the gate.
TEST(PersistTiered, AValueOnItsWayDownIsContainedAndServed) {
  HostStore first{3000};  // room for one 2000-byte value (and its seal)
  GateStore below;
  TieredStore tiered({&first, &below}, int64_t{1} << 20);
  const StoreKey a{1, 2, 3}, b{4, 5, 6};
  const std::vector<uint8_t> va(2000, 0xa1), vb(2000, 0xb2);
  ASSERT_TRUE(tiered.put(a, va));
  ASSERT_TRUE(tiered.put(b, vb));  // evicts a: its move waits at the gate
  EXPECT_FALSE(first.contains(a));
  EXPECT_EQ(below.done(), 0);
  EXPECT_TRUE(tiered.contains(a));
  EXPECT_TRUE(tiered.contains(b));
  EXPECT_FALSE(tiered.contains(StoreKey{7, 8, 9}));
  below.release();
  tiered.flush();
  EXPECT_TRUE(tiered.contains(a));
  const std::optional<std::vector<uint8_t>> got = tiered.get(a);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, va);
}

TEST(PersistOffload, ASlowLowerTierNeverBlocksTheCaller) {
  PagedCache cache(paged_test::small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 48), Device::cpu());
  std::mt19937_64 rng(3);
  std::vector<SeqId> seqs;
  std::vector<SeqBytes> want;
  for (int i = 0; i < 5; ++i) {
    seqs.push_back(cache.create());
    append_random(cache, seqs.back(), 20 + i, rng, 0);
    want.push_back(seq_bytes(cache, seqs.back()));
  }
  GateStore gate;
  BlockOffloader off(cache, {cache.stats().bytes_per_block * 8, &gate, "m"});  // two values fit
  int accepted = 0;
  for (int i = 0; i < 5; ++i) accepted += off.offload(seqs[i], key_of(i, cache.config())) ? 1 : 0;
  // Every offload returned while the lower tier had not finished a single put: none waited for it.
  EXPECT_EQ(gate.done(), 0);
  EXPECT_EQ(accepted, 5);
  EXPECT_EQ(off.stats().refused, 0);
  // Values in pinned memory and values on their way down are served, whole.
  for (int i = 0; i < 5; ++i) {
    const std::optional<SeqId> got = off.load(key_of(i, cache.config()));
    ASSERT_TRUE(got.has_value()) << i;
    EXPECT_TRUE(seq_bytes(cache, *got) == want[i]) << i;
    cache.erase(*got);
  }
  EXPECT_EQ(gate.done(), 0);
  gate.release();
  off.flush();
  const OffloadStats st = off.stats();
  EXPECT_GE(st.demoted, 3);
  EXPECT_EQ(st.demote_failures + st.dropped, 0);
  EXPECT_EQ(st.misses, 0);
  // What went down is whole in the lower tier.
  int below = 0;
  PagedCache other(cache.config(), Device::cpu());
  for (int i = 0; i < 5; ++i) {
    if (!gate.contains(key_of(i, cache.config()))) continue;
    ++below;
    const std::optional<SeqId> got = load_sequence(gate, key_of(i, cache.config()), other, "m");
    ASSERT_TRUE(got.has_value()) << i;
    EXPECT_TRUE(seq_bytes(other, *got) == want[i]) << i;
  }
  EXPECT_GE(below, 3);
}

TEST(PersistOffload, FailingAndCorruptingTiersGiveMissesNeverWrongKv) {
  PagedCache cache(paged_test::small_config(KvFormat::Fp8, RopeMode::RopeStored, 8, 48), Device::cpu());
  std::mt19937_64 rng(5);
  const SeqId s = cache.create();
  append_random(cache, s, 19, rng, 0);
  const int64_t room = cache.stats().bytes_per_block * 4;  // one value

  BrokenStore refusing;
  refusing.refuse = true;
  {
    BlockOffloader off(cache, {room, &refusing, "m"});
    ASSERT_TRUE(off.offload(s, key_of(0, cache.config())));
    ASSERT_TRUE(off.offload(s, key_of(1, cache.config())));  // evicts value 0 into a store that refuses it
    off.flush();
    EXPECT_EQ(off.stats().demote_failures, 1);
    const std::string before = cache.debug_state();
    EXPECT_FALSE(off.load(key_of(0, cache.config())).has_value());
    EXPECT_EQ(cache.debug_state(), before);
    EXPECT_EQ(off.stats().misses, 1);
  }

  BrokenStore corrupting;
  const SeqBytes want = seq_bytes(cache, s);
  {
    BlockOffloader off(cache, {room, &corrupting, "m"});
    ASSERT_TRUE(off.offload(s, key_of(0, cache.config())));
    ASSERT_TRUE(off.offload(s, key_of(1, cache.config())));
    off.flush();
    ASSERT_EQ(corrupting.values.size(), 1u);
    const size_t n = corrupting.values.begin()->second.size();
    const std::string before = cache.debug_state();
    int wrong = 0, served = 0;
    // Flips across the whole value (header, chunks, payload, footer): each is a miss.
    for (size_t at = 0; at < n; at += std::max<size_t>(1, n / 97)) {
      corrupting.flip = at;
      const std::optional<SeqId> got = off.load(key_of(0, cache.config()));
      if (got) {
        ++served;
        wrong += seq_bytes(cache, *got) == want ? 0 : 1;
        cache.erase(*got);
      }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(served, 0) << "every flipped byte must be caught";
    EXPECT_EQ(cache.debug_state(), before);
  }

  // A value of another model is a miss too.
  HostStore lower(int64_t{16} << 20);
  {
    BlockOffloader off(cache, {room, &lower, "model-a"});
    ASSERT_TRUE(off.offload(s, key_of(0, cache.config())));
    ASSERT_TRUE(off.offload(s, key_of(1, cache.config())));
    off.flush();
  }
  ASSERT_TRUE(lower.contains(key_of(0, cache.config())));
  BlockOffloader other(cache, {room, &lower, "model-b"});
  EXPECT_FALSE(other.load(key_of(0, cache.config())).has_value());
}

TEST(PersistOffload, BadInputIsRefusedAndChangesNothing) {
  PagedCache cache(paged_test::small_config(KvFormat::BF16, RopeMode::RopeOnRead, 8, 16), Device::cpu());
  std::mt19937_64 rng(9);
  const SeqId s = cache.create();
  append_random(cache, s, 30, rng, 0);
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(ErrorCode::DeviceError, std::string("no error"));
  };
  auto r = code_of([&] { BlockOffloader bad(cache, {0, nullptr, "m"}); });
  EXPECT_EQ(r.first, ErrorCode::InvalidArgument);
  EXPECT_NE(r.second.find("pinned_bytes"), std::string::npos) << r.second;

  BlockOffloader off(cache, {int64_t{8} << 20, nullptr, "m"});
  StoreKey wrong = key_of(0, cache.config());
  wrong.layout ^= 1;
  const std::string before = cache.debug_state();
  r = code_of([&] { off.offload(s, wrong); });
  EXPECT_EQ(r.first, ErrorCode::InvalidArgument);
  EXPECT_NE(r.second.find("layout"), std::string::npos) << r.second;
  r = code_of([&] { off.load(wrong); });
  EXPECT_EQ(r.first, ErrorCode::InvalidArgument);
  r = code_of([&] { off.offload(s + 1000, key_of(0, cache.config())); });
  EXPECT_EQ(r.first, ErrorCode::InvalidArgument);
  EXPECT_EQ(cache.debug_state(), before);
  EXPECT_EQ(off.stats().offloads, 0);
  EXPECT_EQ(off.stats().entries, 0);

  // Too few free blocks to load: OutOfMemory, the cache as it was, the value still there.
  ASSERT_TRUE(off.offload(s, key_of(0, cache.config())));
  const SeqId filler = cache.create();
  append_random(cache, filler, cache.stats().blocks_free * 8 - 3, rng, 0);
  const std::string full = cache.debug_state();
  r = code_of([&] { off.load(key_of(0, cache.config())); });
  EXPECT_EQ(r.first, ErrorCode::OutOfMemory);
  EXPECT_EQ(cache.debug_state(), full);
  cache.erase(filler);
  cache.erase(s);
  const std::optional<SeqId> got = off.load(key_of(0, cache.config()));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(cache.info(*got).n_live, 30);
  EXPECT_FALSE(off.load(key_of(5, cache.config())).has_value());
}

}  // namespace
