// RedisStore over hiredis (only the API common to hiredis 0.14 and 1.x).
#include "kvcore/persist/redis_store.hpp"

#include <hiredis/hiredis.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>

#include "kvcore/error.hpp"

namespace kvcore {

namespace {
using Clock = std::chrono::steady_clock;

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval to_timeval(int ms) { return {ms / 1000, static_cast<suseconds_t>((ms % 1000) * 1000)}; }
}  // namespace

struct RedisStore::State {
  RedisStoreOptions o;
  mutable std::mutex mu;
  redisContext* ctx = nullptr;
  Clock::time_point next_try{};
  int backoff_ms = 0;
  bool ever_connected = false;
  StoreStats st;
  std::string error;  // why the last connection attempt or command failed; "" while connected

  std::string where() const { return o.host + ":" + std::to_string(o.port); }
  std::string context_error() const { return ctx && ctx->err ? std::string(ctx->errstr) : std::string("no reply"); }

  ~State() { drop(false); }

  // Closes the connection; a failure (`why`) marks the store down until a retry after the backoff.
  void drop(bool failed, std::string why = {}) {
    if (failed) error = std::move(why);
    if (ctx) redisFree(ctx);
    ctx = nullptr;
    if (!failed) return;
    st.down = true;
    backoff_ms = backoff_ms == 0 ? o.backoff_initial_ms : std::min(o.backoff_max_ms, backoff_ms * 2);
    next_try = Clock::now() + std::chrono::milliseconds(backoff_ms);
  }

  // A usable connection, or false at once while the backoff runs.
  bool ensure() {
    if (ctx) return true;
    if (Clock::now() < next_try) return false;
    ctx = redisConnectWithTimeout(o.host.c_str(), o.port, to_timeval(o.connect_timeout_ms));
    if (!ctx || ctx->err) {
      drop(true, "cannot connect to " + where() + ": " + (ctx ? context_error() : std::string("out of memory")));
      return false;
    }
    if (redisSetTimeout(ctx, to_timeval(o.io_timeout_ms)) != REDIS_OK) {
      drop(true, "cannot set the timeouts of " + where() + ": " + context_error());
      return false;
    }
    // Large socket buffers: hiredis moves the unsent rest of its output buffer after every
    // partial write, so a 1 MiB value through a small buffer costs many copies of itself.
    const int buf = 8 << 20;
    ::setsockopt(ctx->fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    ::setsockopt(ctx->fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (!o.password.empty()) {
      const char* argv[2] = {"AUTH", o.password.c_str()};
      const size_t lens[2] = {4, o.password.size()};
      Reply r(static_cast<redisReply*>(redisCommandArgv(ctx, 2, argv, lens)));
      if (!r || r->type != REDIS_REPLY_STATUS || std::string_view(r->str, r->len) != "OK") {
        const std::string reply = !r ? context_error()
                                  : r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS
                                      ? std::string(r->str, r->len)
                                      : "a reply of type " + std::to_string(r->type);
        drop(true, where() + " refused AUTH (the password): " + reply);
        return false;
      }
    }
    if (ever_connected && st.down) ++st.reconnects;
    ever_connected = true;
    st.down = false;
    error.clear();
    backoff_ms = 0;
    return true;
  }

  // One command; nullptr after any transport failure (the connection is then dropped).
  Reply command(int argc, const char** argv, const size_t* lens) {
    if (!ensure()) return nullptr;
    Reply r(static_cast<redisReply*>(redisCommandArgv(ctx, argc, argv, lens)));
    if (!r || ctx->err) {
      drop(true, "connection to " + where() + " lost: " + context_error());
      return nullptr;
    }
    return r;
  }

  std::string key_of(const StoreKey& k) const { return o.key_prefix + k.hex(); }
};

RedisStore::RedisStore(RedisStoreOptions options) : s_(std::make_unique<State>()) {
  require_arg(options.port > 0 && options.port < 65536, "RedisStore: port ", options.port, " outside [1, 65535]");
  require_arg(options.connect_timeout_ms > 0 && options.io_timeout_ms > 0, "RedisStore: timeouts must be > 0, got ",
              options.connect_timeout_ms, " / ", options.io_timeout_ms, " ms");
  require_arg(options.max_value_bytes > 0, "RedisStore: max_value_bytes must be > 0, got ", options.max_value_bytes);
  require_arg(options.backoff_initial_ms > 0 && options.backoff_max_ms >= options.backoff_initial_ms,
              "RedisStore: backoff must satisfy 0 < initial <= max, got ", options.backoff_initial_ms, " / ",
              options.backoff_max_ms);
  require_arg(options.ttl_seconds >= 0, "RedisStore: ttl_seconds must be >= 0 (0: no expiry), got ",
              options.ttl_seconds);
  s_->o = std::move(options);
}

RedisStore::~RedisStore() = default;

bool RedisStore::ping() {
  std::lock_guard<std::mutex> g(s_->mu);
  const char* argv[1] = {"PING"};
  const size_t lens[1] = {4};
  Reply r = s_->command(1, argv, lens);
  if (r && r->type == REDIS_REPLY_ERROR) s_->error = s_->where() + " answered PING with: " + std::string(r->str, r->len);
  return r && r->type == REDIS_REPLY_STATUS;
}

bool RedisStore::put(const StoreKey& key, std::span<const uint8_t> payload) {
  State& s = *s_;
  std::lock_guard<std::mutex> g(s.mu);
  if (static_cast<int64_t>(payload.size()) > s.o.max_value_bytes) {
    ++s.st.put_failures;
    return false;
  }
  const std::vector<uint8_t> sealed = store_seal(key, payload);
  const std::string k = s.key_of(key), ttl = std::to_string(s.o.ttl_seconds);
  const char* argv[5] = {"SET", k.c_str(), reinterpret_cast<const char*>(sealed.data()), "EX", ttl.c_str()};
  const size_t lens[5] = {3, k.size(), sealed.size(), 2, ttl.size()};
  Reply r = s.command(s.o.ttl_seconds > 0 ? 5 : 3, argv, lens);
  const bool ok = r && r->type == REDIS_REPLY_STATUS && std::string_view(r->str, r->len) == "OK";
  ++(ok ? s.st.puts : s.st.put_failures);
  return ok;
}

std::optional<std::vector<uint8_t>> RedisStore::get(const StoreKey& key) {
  State& s = *s_;
  std::lock_guard<std::mutex> g(s.mu);
  const std::string k = s.key_of(key);
  // Never ask for more than the largest value this store accepts (plus one byte to see "more").
  const int64_t limit = s.o.max_value_bytes + static_cast<int64_t>(kSealHeaderBytes);
  const std::string last = std::to_string(limit);
  const char* argv[4] = {"GETRANGE", k.c_str(), "0", last.c_str()};
  const size_t lens[4] = {8, k.size(), 1, last.size()};
  Reply r = s.command(4, argv, lens);
  if (!r || r->type != REDIS_REPLY_STRING || r->len == 0) {
    ++s.st.misses;
    if (r && r->type != REDIS_REPLY_STRING) ++s.st.rejected;  // an error or another type under our key
    return std::nullopt;
  }
  if (static_cast<int64_t>(r->len) > limit) {
    ++s.st.misses;
    ++s.st.rejected;
    return std::nullopt;
  }
  const std::optional<std::span<const uint8_t>> p =
      store_open(key, {reinterpret_cast<const uint8_t*>(r->str), static_cast<size_t>(r->len)});
  if (!p) {
    ++s.st.misses;
    ++s.st.rejected;
    return std::nullopt;
  }
  ++s.st.hits;
  return std::vector<uint8_t>(p->begin(), p->end());
}

bool RedisStore::contains(const StoreKey& key) {
  State& s = *s_;
  std::lock_guard<std::mutex> g(s.mu);
  const std::string k = s.key_of(key);
  const char* argv[2] = {"EXISTS", k.c_str()};
  const size_t lens[2] = {6, k.size()};
  Reply r = s.command(2, argv, lens);
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

bool RedisStore::remove(const StoreKey& key) {
  State& s = *s_;
  std::lock_guard<std::mutex> g(s.mu);
  const std::string k = s.key_of(key);
  const char* argv[2] = {"DEL", k.c_str()};
  const size_t lens[2] = {3, k.size()};
  Reply r = s.command(2, argv, lens);
  return r && r->type == REDIS_REPLY_INTEGER && r->integer >= 1;
}

std::string RedisStore::last_error() const {
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->error;
}

StoreStats RedisStore::stats() const {
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->st;
}

}  // namespace kvcore
