// The Redis tier against a real redis-server the test starts itself (a test that cannot start
// one fails). Faults: the server killed in the middle of writes and of reads, restarted, slowed
// past the client's timeout, values corrupted inside the server, a wrong password, two processes
// writing one prefix at once, and a tiered chain whose server goes away. In every case: no crash,
// never wrong bytes, what the server acknowledged stays loadable, and the caller keeps going.
#if KVCORE_HAVE_REDIS
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "kvcore/persist/redis_store.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "paged_configs.hpp"
#include "paged_model.hpp"
#include "persist_test_data.hpp"
#include "redis_server.hpp"

using namespace kvcore;
using namespace persist_test;
using Clock = std::chrono::steady_clock;

namespace {

RedisStoreOptions options_for(const RedisServer& s) {
  RedisStoreOptions o;
  o.port = s.port();
  o.password = s.password();
  o.io_timeout_ms = 300;
  o.connect_timeout_ms = 300;
  o.backoff_initial_ms = 20;
  o.backoff_max_ms = 200;
  return o;
}

// Polls until the store answers (the backoff lets it retry); false after `limit`.
bool wait_up(RedisStore& r, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (r.ping()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::string key_name(const StoreKey& k) { return "kvc:1:" + k.hex(); }

}  // namespace

TEST(PersistRedis, RoundTripWithAuthAndAWrongPasswordIsOnlyAMiss) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "could not start redis-server on port " << server.port();
  RedisStore r(options_for(server));
  EXPECT_FALSE(r.contains(key_n(1)));
  EXPECT_FALSE(r.get(key_n(1)).has_value());
  ASSERT_TRUE(r.put(key_n(1), payload_n(1, 70000)));
  EXPECT_TRUE(r.contains(key_n(1)));
  EXPECT_EQ(*r.get(key_n(1)), payload_n(1, 70000));
  EXPECT_TRUE(r.remove(key_n(1)));
  EXPECT_FALSE(r.get(key_n(1)).has_value());
  EXPECT_EQ(r.stats().hits, 1);
  EXPECT_FALSE(r.stats().down);

  RedisStoreOptions bad = options_for(server);
  bad.password = "not-the-password";
  RedisStore wrong(bad);
  EXPECT_FALSE(wrong.put(key_n(2), payload_n(2, 100)));
  EXPECT_FALSE(wrong.get(key_n(2)).has_value());
  EXPECT_TRUE(wrong.stats().down);
  EXPECT_EQ(server.admin({"EXISTS", key_name(key_n(2))}), "0");
  // Values larger than the store's limit are neither sent nor accepted.
  RedisStoreOptions small = options_for(server);
  small.max_value_bytes = 1000;
  RedisStore limited(small);
  EXPECT_FALSE(limited.put(key_n(3), payload_n(3, 5000)));
  ASSERT_TRUE(r.put(key_n(3), payload_n(3, 5000)));
  EXPECT_FALSE(limited.get(key_n(3)).has_value());
  EXPECT_EQ(limited.stats().rejected, 1);
}

TEST(PersistRedis, ServerKilledMidWriteKeepsEveryAcknowledgedValue) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "could not start redis-server on port " << server.port();
  RedisStore r(options_for(server));
  std::atomic<bool> stop{false};
  std::vector<int> acked;  // read only after the join
  std::atomic<int> n_acked{0}, attempts{0};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      ++attempts;
      if (r.put(key_n(i), payload_n(i, 200000))) {
        acked.push_back(i);
        ++n_acked;
      }
    }
  });
  while (n_acked < 20 && attempts < 100000) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server.kill9();  // in the middle of a write (the writer never pauses)
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  writer.join();
  EXPECT_TRUE(r.stats().down);
  EXPECT_GT(r.stats().put_failures, 0);
  ASSERT_TRUE(server.start()) << "restart";  // replays its append-only file
  ASSERT_TRUE(wait_up(r));
  EXPECT_GE(r.stats().reconnects, 1);
  ASSERT_GE(acked.size(), 20u);
  for (int i : acked) {
    const auto v = r.get(key_n(i));
    ASSERT_TRUE(v.has_value()) << "acknowledged value " << i << " lost";
    EXPECT_EQ(*v, payload_n(i, 200000)) << i;
  }
  // And writing goes on.
  EXPECT_TRUE(r.put(key_n(100000), payload_n(5, 10)));
  std::printf("[fault] killed mid-write: %zu puts acknowledged (all read back after the restart), %lld failed\n",
              acked.size(), static_cast<long long>(r.stats().put_failures));
}

TEST(PersistRedis, ServerKilledMidReadGivesMissesNeverWrongBytes) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "could not start redis-server on port " << server.port();
  RedisStore r(options_for(server));
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(r.put(key_n(i), payload_n(i, 100000)));
  std::atomic<bool> stop{false};
  std::atomic<int> hits{0}, misses{0}, wrong{0};
  std::thread reader([&] {
    for (int i = 0; !stop; ++i) {
      const auto v = r.get(key_n(i % 16));
      if (!v) ++misses;
      else if (*v != payload_n(i % 16, 100000)) ++wrong;
      else ++hits;
    }
  });
  while (hits < 50) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server.kill9();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const int misses_while_down = misses;
  ASSERT_TRUE(server.start()) << "restart";
  const int hits_before = hits;
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (hits < hits_before + 50 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  reader.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(misses_while_down, 0);
  EXPECT_GE(hits, hits_before + 50) << "reads did not come back after the restart";
  std::printf("[fault] killed mid-read: %d hits, %d misses (%d while down), %d wrong\n", hits.load(), misses.load(),
              misses_while_down, wrong.load());
}

TEST(PersistRedis, SlowServerTimesOutMarksTheTierDownAndItComesBack) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "could not start redis-server on port " << server.port();
  RedisStore r(options_for(server));  // 300 ms timeouts
  ASSERT_TRUE(r.put(key_n(1), payload_n(1, 1000)));
  std::thread sleeper([&] { server.admin({"DEBUG", "SLEEP", "1.5"}, 5000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server is now asleep
  auto t0 = Clock::now();
  EXPECT_FALSE(r.get(key_n(1)).has_value());
  const auto first = Clock::now() - t0;
  EXPECT_LT(first, std::chrono::milliseconds(1000)) << "the timeout did not cut the call short";
  EXPECT_TRUE(r.stats().down);
  // While down, calls return at once (no network) until the backoff allows a retry.
  t0 = Clock::now();
  for (int i = 0; i < 100; ++i) r.contains(key_n(1));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
  sleeper.join();
  ASSERT_TRUE(wait_up(r));
  EXPECT_EQ(*r.get(key_n(1)), payload_n(1, 1000));  // no reply of the timed-out call leaks into this one
  EXPECT_FALSE(r.stats().down);
  std::printf("[fault] slowed (DEBUG SLEEP 1.5 s, 300 ms timeout): first call gave up after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(first).count()));
}

TEST(PersistRedis, ValuesCorruptedInsideTheServerAreMisses) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "could not start redis-server on port " << server.port();
  RedisStore r(options_for(server));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(r.put(key_n(i), payload_n(i, 4096)));
  // One flipped byte in the payload, one in the seal's header, a shortened value, another key's
  // value, a value of another type, an empty string.
  ASSERT_EQ(server.admin({"SETRANGE", key_name(key_n(0)), "3000", "X"}), std::to_string(64 + 4096));
  ASSERT_EQ(server.admin({"SETRANGE", key_name(key_n(1)), "20", "Y"}), std::to_string(64 + 4096));
  const std::string v2 = server.admin({"GET", key_name(key_n(2))});
  ASSERT_EQ(server.admin({"SET", key_name(key_n(2)), v2.substr(0, 1000)}), "OK");
  ASSERT_EQ(server.admin({"SET", key_name(key_n(3)), server.admin({"GET", key_name(key_n(4))})}), "OK");
  ASSERT_EQ(server.admin({"DEL", key_name(key_n(5))}), "1");
  ASSERT_EQ(server.admin({"LPUSH", key_name(key_n(5)), "x"}), "1");
  ASSERT_EQ(server.admin({"SET", key_name(key_n(6)), ""}), "OK");
  for (int i : {0, 1, 2, 3, 5, 6}) EXPECT_FALSE(r.get(key_n(i)).has_value()) << i;
  EXPECT_EQ(*r.get(key_n(4)), payload_n(4, 4096));
  EXPECT_EQ(r.stats().rejected, 5);  // the empty string is a plain miss
  // A sequence stored in the server and corrupted there: a miss, and the cache is untouched.
  std::mt19937_64 rng(3);
  const PagedCacheConfig cfg = paged_test::small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 16);
  PagedCache c(cfg, Device::cpu());
  const SeqId s = c.create();
  paged_test::Source k = paged_test::make_source(rng, 2, 12, 2, 64, DType::F32, Device::cpu(), false);
  paged_test::Source v = paged_test::make_source(rng, 2, 12, 2, 64, DType::F32, Device::cpu(), false);
  std::vector<int32_t> pos(12);
  for (int j = 0; j < 12; ++j) pos[j] = j;
  c.append(s, pos, k.tensor, v.tensor);
  const StoreKey sk = store_key_for_tokens(pos, "t", cfg);
  ASSERT_TRUE(store_sequence(r, sk, c, s, "m"));
  PagedCache dst(cfg, Device::cpu());
  ASSERT_TRUE(load_sequence(r, sk, dst, "m").has_value());
  server.admin({"SETRANGE", key_name(sk), "2000", "Z"});
  const std::string before = dst.debug_state();
  EXPECT_FALSE(load_sequence(r, sk, dst, "m").has_value());
  EXPECT_EQ(dst.debug_state(), before);
}

TEST(PersistRedis, TwoProcessesWritingTheSamePrefixAtOnce) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "could not start redis-server on port " << server.port();
  const std::string disk_dir = server.dir() + "/disk";
  const std::string port = std::to_string(server.port());
  pid_t kids[2];
  for (pid_t& pid : kids) {
    pid = ::fork();
    if (pid == 0) {
      ::execl(KVCORE_STORE_WRITER, KVCORE_STORE_WRITER, port.c_str(), server.password().c_str(), disk_dir.c_str(), "42",
              "300000", "60", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ASSERT_GT(pid, 0);
  }
  // Read both tiers while they write: only misses or the right bytes.
  RedisStore r(options_for(server));
  DiskStore d(disk_dir, int64_t{1} << 30, false);
  int wrong = 0, reads = 0;
  int status[2] = {-1, -1};
  const std::vector<uint8_t> want = payload_n(42, 300000);
  while (status[0] < 0 || status[1] < 0) {
    for (KvStore* s : {static_cast<KvStore*>(&r), static_cast<KvStore*>(&d)}) {
      const auto v = s->get(key_n(42));
      wrong += v && *v != want ? 1 : 0;
      ++reads;
    }
    for (int i = 0; i < 2; ++i) {
      int st = 0;
      if (status[i] < 0 && ::waitpid(kids[i], &st, WNOHANG) == kids[i]) status[i] = st;
    }
  }
  for (int st : status) EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "writer status " << st;
  EXPECT_GT(reads, 0);
  std::printf("[fault] two writers of one key: %d concurrent reads, %d wrong\n", reads, wrong);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(*r.get(key_n(42)), want);
  EXPECT_EQ(*d.get(key_n(42)), want);
  for (const auto& e : std::filesystem::recursive_directory_iterator(disk_dir))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
}

TEST(PersistRedis, TieredChainKeepsGoingWhileTheServerIsGone) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "could not start redis-server on port " << server.port();
  const std::string disk_dir = server.dir() + "/tier-disk";
  const int64_t one = static_cast<int64_t>(kSealHeaderBytes + 20000);
  HostStore host(2 * one);
  DiskStore disk(disk_dir, 4 * one, false);
  RedisStore redis(options_for(server));
  TieredStore t({&host, &disk, &redis});
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(t.put(key_n(i), payload_n(i, 20000)));
  t.flush();
  EXPECT_EQ(server.admin({"EXISTS", key_name(key_n(0))}), "1");  // evictions reached the shared tier
  server.kill9();
  // The caller goes on: puts land in host memory, evictions reach the disk, the dead tier is skipped.
  const auto t0 = Clock::now();
  for (int i = 6; i < 12; ++i) EXPECT_TRUE(t.put(key_n(i), payload_n(i, 20000)));
  for (int i = 0; i < 12; ++i) {
    const auto v = t.get(key_n(i));
    if (v) {
      EXPECT_EQ(*v, payload_n(i, 20000)) << i;
    }
  }
  t.flush();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(redis.stats().down);
  ASSERT_TRUE(server.start()) << "restart";
  ASSERT_TRUE(wait_up(redis));
  // What the server had acknowledged is there again, found through the chain.
  disk.remove(key_n(0));
  host.remove(key_n(0));
  const auto v0 = t.get(key_n(0));
  ASSERT_TRUE(v0.has_value());
  EXPECT_EQ(*v0, payload_n(0, 20000));
  EXPECT_GE(t.tier_hits(2), 1);
}

#endif  // KVCORE_HAVE_REDIS
