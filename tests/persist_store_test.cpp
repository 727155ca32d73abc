// Stores below device memory without a server: sealed values (any flipped byte or another key is a
// miss), the host tier's LRU limit, the disk tier (limit, restart, torn or foreign files, a write
// that fails for lack of space leaves the old value loadable), tiers (evictions move down on the
// worker, lookups miss downwards and load back) and whole sequences through a store.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "kvcore/persist/kv_store.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "paged_configs.hpp"
#include "paged_model.hpp"
#include "persist_test_data.hpp"

using namespace kvcore;
using namespace paged_test;
using namespace persist_test;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const char* name)
      : path(fs::temp_directory_path() / (std::string("kvcore_") + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST(PersistStore, SealRefusesAnyFlippedByteAndAnotherKey) {
  const std::vector<uint8_t> p = payload_n(1, 300);
  const std::vector<uint8_t> sealed = store_seal(key_n(1), p);
  ASSERT_TRUE(store_open(key_n(1), sealed).has_value());
  EXPECT_TRUE(std::equal(p.begin(), p.end(), store_open(key_n(1), sealed)->begin()));
  EXPECT_FALSE(store_open(key_n(2), sealed).has_value()) << "a value under another key";
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::vector<uint8_t> bad = sealed;
    bad[i] ^= 0x10;
    EXPECT_FALSE(store_open(key_n(1), bad).has_value()) << "byte " << i;
  }
  for (size_t n = 0; n < sealed.size(); n += 7)
    EXPECT_FALSE(store_open(key_n(1), std::span<const uint8_t>(sealed.data(), n)).has_value()) << "truncated to " << n;
  // Keys: tokens, salt and layout all count.
  PagedCacheConfig c;
  c.num_blocks = 1;
  c.rope = {RopeSpec::plain(128, 10000.0)};
  const int32_t t[3] = {1, 2, 3};
  EXPECT_EQ(store_key_for_tokens(t, "a", c), store_key_for_tokens(t, "a", c));
  EXPECT_NE(store_key_for_tokens(t, "a", c), store_key_for_tokens(t, "b", c));
  EXPECT_NE(store_key_for_tokens(std::span<const int32_t>(t, 2), "a", c), store_key_for_tokens(t, "a", c));
  PagedCacheConfig c2 = c;
  c2.k_format = KvFormat::BF16;
  EXPECT_NE(store_key_for_tokens(t, "a", c), store_key_for_tokens(t, "a", c2));
}

TEST(PersistStore, HostTierIsAnLruBoundedByBytes) {
  const int64_t one = static_cast<int64_t>(kSealHeaderBytes + 1000);
  HostStore h(3 * one);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.put(key_n(i), payload_n(i, 1000)));
  ASSERT_TRUE(h.get(key_n(0)).has_value());  // 0 is now the most recent: 1 goes first
  ASSERT_TRUE(h.put(key_n(3), payload_n(3, 1000)));
  EXPECT_FALSE(h.contains(key_n(1)));
  EXPECT_TRUE(h.contains(key_n(0)));
  EXPECT_EQ(h.stats().bytes, 3 * one);
  EXPECT_EQ(h.stats().evictions, 1);
  EXPECT_FALSE(h.put(key_n(9), payload_n(9, 4000))) << "larger than the whole tier";
  EXPECT_EQ(*h.get(key_n(3)), payload_n(3, 1000));
  EXPECT_FALSE(h.get(key_n(1)).has_value());
  EXPECT_TRUE(h.remove(key_n(3)));
  EXPECT_FALSE(h.remove(key_n(3)));
  try {
    HostStore bad(0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_bytes"), std::string::npos);
  }
}

TEST(PersistStore, DiskTierSurvivesARestartAndRefusesTornOrForeignFiles) {
  TempDir dir("disk");
  const int64_t one = static_cast<int64_t>(kSealHeaderBytes + 500);
  {
    DiskStore d(dir.path.string(), 4 * one);
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(d.put(key_n(i), payload_n(i, 500)));
    EXPECT_EQ(d.stats().items, 4);
    EXPECT_LE(d.stats().bytes, 4 * one);
    EXPECT_FALSE(d.contains(key_n(0)));
    EXPECT_FALSE(d.contains(key_n(1)));
  }
  DiskStore d(dir.path.string(), 4 * one);  // a new process finds the files
  EXPECT_EQ(d.stats().items, 4);
  EXPECT_EQ(*d.get(key_n(5)), payload_n(5, 500));
  // A torn file (as a crash without rename could never leave, but a broken disk could).
  {
    const std::string p = d.path_of(key_n(4));
    fs::resize_file(p, 100);
  }
  EXPECT_FALSE(d.get(key_n(4)).has_value());
  // Another key's file copied over this one's name.
  fs::copy_file(d.path_of(key_n(5)), d.path_of(key_n(3)), fs::copy_options::overwrite_existing);
  EXPECT_FALSE(d.get(key_n(3)).has_value());
  EXPECT_EQ(d.stats().rejected, 2);
  EXPECT_EQ(*d.get(key_n(2)), payload_n(2, 500));
}

TEST(PersistStore, DiskTierWriteThatRunsOutOfSpaceKeepsTheOldValue) {
  TempDir dir("diskfull");
  DiskStore d(dir.path.string(), int64_t{1} << 30);
  ASSERT_TRUE(d.put(key_n(1), payload_n(1, 1000)));
  // The file size limit makes every write past 4 KiB fail (EFBIG), as a full disk fails it (ENOSPC).
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  const bool big = d.put(key_n(1), payload_n(11, 100000));   // replacing: must fail, old value stays
  const bool other = d.put(key_n(2), payload_n(2, 100000));  // new: must fail, nothing stays
  const bool small = d.put(key_n(3), payload_n(3, 100));     // fits under the limit
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(big);
  EXPECT_FALSE(other);
  EXPECT_TRUE(small);
  EXPECT_EQ(*d.get(key_n(1)), payload_n(1, 1000));
  EXPECT_FALSE(d.get(key_n(2)).has_value());
  EXPECT_EQ(*d.get(key_n(3)), payload_n(3, 100));
  EXPECT_EQ(d.stats().put_failures, 2);
  for (const auto& e : fs::recursive_directory_iterator(dir.path))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
}

TEST(PersistStore, TiersMoveEvictionsDownOnTheWorkerAndLoadBackUp) {
  TempDir dir("tiers");
  const int64_t one = static_cast<int64_t>(kSealHeaderBytes + 2000);
  HostStore host(2 * one);
  DiskStore disk(dir.path.string(), 100 * one);
  TieredStore t({&host, &disk});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t.put(key_n(i), payload_n(i, 2000)));
  t.flush();
  EXPECT_EQ(host.stats().items, 2);
  EXPECT_EQ(disk.stats().items, 8);  // everything the host evicted
  for (int i = 0; i < 10; ++i) {
    const auto v = t.get(key_n(i));
    ASSERT_TRUE(v.has_value()) << i;
    EXPECT_EQ(*v, payload_n(i, 2000)) << i;
  }
  EXPECT_GE(t.tier_hits(1), 8);  // found on disk...
  EXPECT_TRUE(host.contains(key_n(9)));  // ...and loaded back up (the last one read stays)
  EXPECT_FALSE(t.get(key_n(99)).has_value());
  EXPECT_EQ(t.stats().misses, 1);
  try {
    TieredStore bad({&disk});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
}

TEST(PersistStore, SequencesThroughATieredStoreComeBackBitIdentical) {
  TempDir dir("seqs");
  std::mt19937_64 rng(12);
  const PagedCacheConfig cfg = small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 8, 64);
  PagedCache c(cfg, Device::cpu());
  std::vector<SeqId> ids;
  std::vector<StoreKey> keys;
  const int n_seqs = 4;
  for (int i = 0; i < n_seqs; ++i) {
    const SeqId s = c.create();
    Source k = make_source(rng, cfg.n_layers, 10 + i, cfg.n_kv_heads, cfg.head_dim, DType::F32, Device::cpu(), false);
    Source v = make_source(rng, cfg.n_layers, 10 + i, cfg.n_kv_heads, cfg.v_head_dim, DType::F32, Device::cpu(), false);
    std::vector<int32_t> pos(10 + i);
    std::vector<int32_t> tokens(10 + i);
    for (int j = 0; j < 10 + i; ++j) {
      pos[j] = j;
      tokens[j] = 1000 * i + j;
    }
    c.append(s, pos, k.tensor, v.tensor);
    ids.push_back(s);
    keys.push_back(store_key_for_tokens(tokens, "tenant", cfg));
  }
  const SeqId first[1] = {ids[0]};
  const int64_t one_seq = static_cast<int64_t>(snapshot_encode(c, first, "m").size() + kSealHeaderBytes);
  HostStore small_host(one_seq * 3 / 2);
  DiskStore disk(dir.path.string(), int64_t{1} << 30);
  TieredStore t({&small_host, &disk});
  for (int i = 0; i < n_seqs; ++i) ASSERT_TRUE(store_sequence(t, keys[i], c, ids[i], "m"));
  t.flush();
  PagedCache dst(cfg, Device::cpu());
  for (int i = 0; i < n_seqs; ++i) {
    const std::optional<SeqId> got = load_sequence(t, keys[i], dst, "m");
    ASSERT_TRUE(got.has_value()) << i;
    for (int32_t l = 0; l < cfg.n_layers; ++l) {
      const PagedReadBack a = c.read(ids[i], l), b = dst.read(*got, l);
      EXPECT_EQ(a.positions, b.positions);
      EXPECT_EQ(0, std::memcmp(a.k.data(), b.k.data(), a.k.size() * 4));
      EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4));
    }
  }
  // Another model id under the same key: a miss, the cache untouched.
  const std::string before = dst.debug_state();
  EXPECT_FALSE(load_sequence(t, keys[0], dst, "other-model").has_value());
  EXPECT_EQ(dst.debug_state(), before);
}
