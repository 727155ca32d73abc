// `kvcore bench persist`: snapshots against the disk's own speed, and the Redis tier against
// redis-benchmark, each baseline measured in the same run on the same bytes.
//
// Snapshot cases (a Llama-3-8B-shaped FP8 cache: 32 layers, 8 kv heads, 128 dims, blocks of 16):
//   save       snapshot_save of one sequence (temporary file, write, fsync, rename, fsync of
//              the directory) vs `dd oflag=direct conv=fsync` of as many bytes;
//   load_cold  snapshot_load after the file's pages were dropped from the page cache
//              (posix_fadvise DONTNEED) vs `dd iflag=direct` reading the same file;
//   load_warm  snapshot_load from the page cache (checks and import: the CPU side's cost).
// Redis cases (a server of the bench's own on loopback, no persistence): put and get of sealed
// values of 64 KiB and 1 MiB (about one 16-token block of Llama-3-8B in FP8) by one client, vs
// `redis-benchmark -c 1 -P 1 -t set,get -d SIZE`'s requests per second on the same server.
// --device cuda: the snapshot cases on a CUDA cache (names end in _cuda: the copies between the
// device and host memory included), then the device tiers (bench/persist_device_cases.cpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "bench/persist_device_cases.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "tools/registry.hpp"
#if KVCORE_HAVE_REDIS
#include "kvcore/persist/redis_store.hpp"
#include "tests/redis_server.hpp"
#endif

namespace {

using namespace kvcore;
using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

cli::Timing timing_of(std::vector<double> secs) {
  std::sort(secs.begin(), secs.end());
  cli::Timing t;
  t.reps = static_cast<int>(secs.size());
  t.median_us = secs[secs.size() / 2] * 1e6;
  t.min_us = secs[0] * 1e6;
  return t;
}

void drop_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Runs a shell command; its exit status must be 0.
std::string run(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen((cmd + " 2>&1").c_str(), "r"), ::pclose);
  require(p != nullptr, ErrorCode::DeviceError, "bench persist: cannot run ", cmd);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p.get())) out.append(buf, n);
  const int rc = ::pclose(p.release());
  require(rc == 0, ErrorCode::DeviceError, "bench persist: '", cmd, "' failed: ", out);
  return out;
}

void snapshot_cases(cli::BenchOptions& opt, const std::string& dir) {
  PagedCacheConfig cfg;
  cfg.n_layers = 32;
  cfg.n_kv_heads = 8;
  cfg.head_dim = 128;
  cfg.v_head_dim = 128;
  cfg.block_size = 16;
  cfg.k_format = cfg.v_format = KvFormat::Fp8;
  cfg.rope = {RopeSpec::llama3_8b()};
  cfg.rope_mode = RopeMode::RopeOnRead;
  const int32_t tokens = opt.quick ? 256 : 4096;
  cfg.num_blocks = tokens / cfg.block_size + 2;
  const Device dev = opt.device;  // the cache's device: a CUDA cache copies through host memory
  PagedCache src(cfg, dev);
  const SeqId s = src.create();
  {  // random rows, appended in chunks of 256 tokens
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    const int32_t chunk = 256;
    std::vector<float> k(static_cast<size_t>(cfg.n_layers) * chunk * cfg.n_kv_heads * cfg.head_dim);
    std::vector<int32_t> pos(chunk);
    Buffer kb(k.size() * sizeof(float), dev);
    for (int32_t at = 0; at < tokens; at += chunk) {
      for (float& x : k) x = u(rng);
      for (int32_t i = 0; i < chunk; ++i) pos[i] = at + i;
      kb.copy_from_host(k.data(), k.size() * sizeof(float));
      const TensorRef kt(kb.data(), DType::F32, dev, {cfg.n_layers, chunk, cfg.n_kv_heads, cfg.head_dim});
      src.append(s, pos, kt, kt);
    }
  }
  const std::string path = dir + "/llama8b.kvcs", dd_path = dir + "/dd.bin";
  const int reps = std::max(1, std::min(opt.reps, opt.quick ? 2 : 5));
  std::vector<double> save_s, cold_s, warm_s, dd_w, dd_r;
  double bytes = 0;
  for (int r = 0; r < reps; ++r) {
    save_s.push_back(seconds_of([&] { snapshot_save(src, path, "llama-3-8b"); }));
    bytes = static_cast<double>(std::filesystem::file_size(path));
    const long mib = static_cast<long>(bytes / (1 << 20)) + 1;
    dd_w.push_back(seconds_of([&] {
      run("dd if=/dev/zero of=" + dd_path + " bs=1M count=" + std::to_string(mib) + " oflag=direct conv=fsync status=none");
    }));
    dd_r.push_back(seconds_of([&] { run("dd if=" + path + " of=/dev/null bs=1M iflag=direct status=none"); }));
    drop_page_cache(path);
    PagedCache dst(cfg, dev);
    cold_s.push_back(seconds_of([&] { snapshot_load(dst, path, {"llama-3-8b", 0}); }));
    PagedCache dst2(cfg, dev);
    warm_s.push_back(seconds_of([&] { snapshot_load(dst2, path, {"llama-3-8b", 0}); }));
  }
  std::filesystem::remove(path);
  std::filesystem::remove(dd_path);
  const std::string size = "llama8b_fp8_" + std::to_string(tokens) + "tok" + (dev.is_cuda() ? "_cuda" : "");
  auto rec = [&](const std::string& name, const std::vector<double>& t, const std::string& base,
                 const std::vector<double>* base_t) {
    cli::BenchRecord r;
    r.bench = "persist";
    r.case_name = name + "/" + size;
    r.bytes = bytes;
    r.t = timing_of(t);
    r.traffic = cli::Traffic::Copy;
    r.baseline = base;
    if (base_t) r.baseline_t = timing_of(*base_t);
    if (opt.wants(r.case_name)) opt.report(r);
  };
  rec("snapshot_save", save_s, "dd_direct_write", &dd_w);
  rec("snapshot_load_cold", cold_s, "dd_direct_read", &dd_r);
  rec("snapshot_load_warm", warm_s, "dd_direct_read", &dd_r);
}

#if KVCORE_HAVE_REDIS
void redis_cases(cli::BenchOptions& opt) {
  persist_test::RedisServer server("bench-pw", false);
  require(server.start(), ErrorCode::DeviceError, "bench persist: could not start redis-server");
  RedisStoreOptions o;
  o.port = server.port();
  o.password = server.password();
  o.io_timeout_ms = 10000;
  RedisStore store(o);
  for (const size_t value : {size_t{64} << 10, size_t{1} << 20}) {
    const int n = opt.quick ? 50 : (value > (size_t{256} << 10) ? 400 : 4000);
    std::vector<uint8_t> payload(value);
    std::mt19937 rng(2);
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    std::vector<StoreKey> keys;
    for (int i = 0; i < n; ++i) keys.push_back({static_cast<uint64_t>(i), value, 7});
    std::vector<double> put_s, get_s;
    for (int rep = 0; rep < 3; ++rep) {
      put_s.push_back(seconds_of([&] {
        for (const StoreKey& k : keys) require(store.put(k, payload), ErrorCode::DeviceError, "bench persist: put failed");
      }));
      get_s.push_back(seconds_of([&] {
        for (const StoreKey& k : keys) require(store.get(k).has_value(), ErrorCode::DeviceError, "bench persist: miss");
      }));
    }
    server.admin({"FLUSHALL"});
    // redis-benchmark on the same server, one client, no pipelining, the sealed value's size.
    const std::string out =
        run("redis-benchmark -h 127.0.0.1 -p " + std::to_string(server.port()) + " -a " + server.password() +
            " -c 1 -P 1 -t set,get -q -n " + std::to_string(n) + " -d " + std::to_string(value + kSealHeaderBytes));
    // The summary line "<OP>: <number> requests per second" (progress lines say "rps=" instead).
    auto rps = [&](const char* op) {
      const std::string key = std::string(op) + ": ", tail = " requests per second";
      for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + 1)) {
        const char* begin = out.c_str() + at + key.size();
        char* end = nullptr;
        const double v = std::strtod(begin, &end);
        if (end != begin && out.compare(static_cast<size_t>(end - out.c_str()), tail.size(), tail) == 0) return v;
      }
      require(false, ErrorCode::DeviceError, "bench persist: no ", op, " figure in: ", out);
      return 0.0;
    };
    const double set_rps = rps("SET"), get_rps = rps("GET");
    server.admin({"FLUSHALL"});
    const std::string vs = value >= (size_t{1} << 20) ? std::to_string(value >> 20) + "MiB" : std::to_string(value >> 10) + "KiB";
    auto rec = [&](const char* name, const std::vector<double>& t, double base_rps) {
      cli::BenchRecord r;
      r.bench = "persist";
      r.case_name = std::string(name) + "/" + vs + "x" + std::to_string(n);
      r.bytes = static_cast<double>(value) * n;
      r.t = timing_of(t);
      r.baseline = "redis-benchmark";
      cli::Timing b;
      b.reps = 1;
      b.median_us = b.min_us = n / base_rps * 1e6;
      r.baseline_t = b;
      if (opt.wants(r.case_name)) opt.report(r);
      opt.note(r.case_name + ": " + std::to_string(n / (r.t.median_us * 1e-6)) + " ops/s, redis-benchmark " +
               std::to_string(base_rps) + " ops/s");
    };
    rec("redis_put", put_s, set_rps);
    rec("redis_get", get_s, get_rps);
  }
}
#endif

}  // namespace

KVCORE_BENCH(persist, "snapshot save/load vs dd direct I/O; Redis tier put/get vs redis-benchmark (CPU); "
                      "--device cuda: offload to pinned memory and back vs cudaMemcpyAsync, prefix reuse vs recompute") {
  const std::string dir = std::getenv("KVCORE_BENCH_DIR") ? std::getenv("KVCORE_BENCH_DIR") : "build/bench-persist";
  std::filesystem::create_directories(dir);
  opt.note("persist: files in " + dir + " (KVCORE_BENCH_DIR); GB/s = file or value bytes / median time; ratio = baseline time / kvcore time");
  snapshot_cases(opt, dir);
  if (opt.device.is_cuda()) {  // the device tiers; the Redis tier is a CPU case
    cli::persist_device_cases(opt);
    return;
  }
#if KVCORE_HAVE_REDIS
  redis_cases(opt);
#else
  opt.note("persist: built without hiredis: no Redis cases");
#endif
}
