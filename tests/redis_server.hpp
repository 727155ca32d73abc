// A redis-server of the test's (or bench's) own: a free loopback port, a password (requirepass),
// an append-only file fsync'ed on every write (so what the server acknowledged survives a kill -9),
// DEBUG enabled (DEBUG SLEEP slows it down). start() returns false when no server answers
// within 10 s; the tests then fail, they do not skip.
#pragma once
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace persist_test {

inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

class RedisServer {
 public:
  // durable false: no append-only file (benchmarks measure the server, not its disk).
  explicit RedisServer(std::string password = "kvcore-test-pw", bool durable = true)
      : password_(std::move(password)), durable_(durable) {
    port_ = free_loopback_port();
    dir_ = (std::filesystem::temp_directory_path() /
            ("kvcore_redis_" + std::to_string(::getpid()) + "_" + std::to_string(port_)))
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~RedisServer() {
    kill9();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  const std::string& password() const { return password_; }
  const std::string& dir() const { return dir_; }

  // The first start retries on other ports when the chosen one was taken meanwhile (tests run
  // in parallel); a restart keeps its port (clients know it).
  bool start() {
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (start_once()) {
        started_ = true;
        return true;
      }
      if (started_) return false;
      port_ = free_loopback_port();
    }
    return false;
  }

 private:
  bool start_once() {
    if (port_ <= 0) return false;
    const std::string port = std::to_string(port_);
    const std::string log = dir_ + "/redis.log";  // built before fork: the child only execs
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--requirepass",
               password_.c_str(), "--dir", dir_.c_str(), "--appendonly", durable_ ? "yes" : "no", "--appendfsync", "always", "--save", "",
               "--enable-debug-command", "yes", "--daemonize", "no", "--logfile", log.c_str(), "--maxmemory", "512mb",
               "--maxmemory-policy", "allkeys-lru", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid_ < 0) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      if (admin({"PING"}) == "PONG") return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited (no redis-server, port taken...)
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  bool started_ = false;

 public:
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // One command on a fresh AUTHed connection: a status or string reply's text, an integer as
  // text, "(nil)", "ERR <message>", or "" when the server cannot be reached.
  std::string admin(const std::vector<std::string>& args, int timeout_ms = 2000) const {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (!c || c->err) {
      if (c) redisFree(c);
      return "";
    }
    redisSetTimeout(c, tv);
    auto run = [&](const std::vector<std::string>& a) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const auto& s : a) {
        argv.push_back(s.data());
        lens.push_back(s.size());
      }
      auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(a.size()), argv.data(), lens.data()));
      std::string out;
      if (!r) return out;
      if (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING) out.assign(r->str, r->len);
      else if (r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
      else if (r->type == REDIS_REPLY_NIL) out = "(nil)";
      else if (r->type == REDIS_REPLY_ERROR) out = "ERR " + std::string(r->str, r->len);
      freeReplyObject(r);
      return out;
    };
    std::string out = run({"AUTH", password_});
    if (out == "OK") out = run(args);
    redisFree(c);
    return out;
  }

 private:
  std::string password_;
  bool durable_ = true;
  int port_ = -1;
  pid_t pid_ = -1;
  std::string dir_;
};

}  // namespace persist_test
