// RedisStore: a KvStore on a Redis server (any RESP2 server: Redis, Valkey), through hiredis.
// Linked from the kvcore_redis library (CMake target kvcore::redis, built when hiredis is found);
// libkvcore.so has it too then (the C API's kvc_redis_store_*).
//
// The server is not trusted: the client AUTHs with a password, asks for at most
// max_value_bytes + the seal header (GETRANGE), and opens every value's seal (size, header, key,
// checksum) before a byte is used; anything else is a miss. One key per value,
// <key_prefix><StoreKey::hex()>, whole sealed values (no two-key metadata split to go out of step).
//
// A lost connection, a timeout or a refused AUTH marks the store down: calls then return a miss
// (or false) at once, without touching the network, until the next retry, which comes after a
// backoff that doubles from backoff_initial_ms up to backoff_max_ms. Calls are serialized on
// one connection (a mutex); use one RedisStore per thread for parallel traffic.
#pragma once
#include <memory>
#include <string>

#include "kvcore/persist/kv_store.hpp"

namespace kvcore {

struct RedisStoreOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password;  // AUTH when not empty
  std::string key_prefix = "kvc:1:";
  int connect_timeout_ms = 500;
  int io_timeout_ms = 1000;
  int64_t max_value_bytes = int64_t{64} << 20;  // payloads larger than this are neither sent nor accepted
  int backoff_initial_ms = 50;
  int backoff_max_ms = 2000;
  int ttl_seconds = 0;  // >= 0; 0: keys do not expire (bound the server with maxmemory + allkeys-lru)
};

class RedisStore : public KvStore {
 public:
  explicit RedisStore(RedisStoreOptions options);  // connects lazily: a server that is down is not an error
  ~RedisStore() override;
  std::string name() const override { return "redis"; }
  bool put(const StoreKey& key, std::span<const uint8_t> payload) override;
  std::optional<std::vector<uint8_t>> get(const StoreKey& key) override;
  bool contains(const StoreKey& key) override;
  bool remove(const StoreKey& key) override;
  StoreStats stats() const override;
  // Is a connection up now (connecting when the backoff allows)?
  bool ping();
  // Why the last connection attempt, command or PING failed (cannot connect, AUTH refused with
  // the server's reply, connection lost or timed out, PING refused), naming host:port; "" from
  // a successful connection until the next failure.
  std::string last_error() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace kvcore
