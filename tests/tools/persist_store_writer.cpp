// A second process for the store tests: writes key_n(key) = payload_n(key, bytes) `rounds` times to
// a Redis server and a disk directory, reading it back between writes. Exit 0: every read was a
// miss or the right bytes; 3: wrong bytes were read; 2: bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kvcore/persist/redis_store.hpp"
#include "persist_test_data.hpp"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s PORT PASSWORD DISK_DIR KEY BYTES ROUNDS\n", argv[0]);
    return 2;
  }
  kvcore::RedisStoreOptions o;
  o.port = std::atoi(argv[1]);
  o.password = argv[2];
  kvcore::RedisStore redis(o);
  kvcore::DiskStore disk(argv[3], int64_t{1} << 30, false);
  const int key = std::atoi(argv[4]);
  const size_t bytes = static_cast<size_t>(std::atol(argv[5]));
  const int rounds = std::atoi(argv[6]);
  const kvcore::StoreKey k = persist_test::key_n(key);
  const std::vector<uint8_t> want = persist_test::payload_n(key, bytes);
  int acked = 0;
  for (int r = 0; r < rounds; ++r) {
    acked += redis.put(k, want) ? 1 : 0;
    disk.put(k, want);
    for (kvcore::KvStore* s : {static_cast<kvcore::KvStore*>(&redis), static_cast<kvcore::KvStore*>(&disk)}) {
      const auto got = s->get(k);
      if (got && *got != want) {
        std::fprintf(stderr, "%s returned wrong bytes\n", s->name().c_str());
        return 3;
      }
    }
  }
  std::printf("acked %d of %d\n", acked, rounds);
  return 0;
}
