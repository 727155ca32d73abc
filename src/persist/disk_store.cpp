// DiskStore: one sealed value per file under a directory, bounded by total bytes (LRU).
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <list>
#include <mutex>
#include <unordered_map>

#include "kvcore/error.hpp"
#include "kvcore/persist/kv_store.hpp"
#include "persist/file_io.hpp"

namespace kvcore {

namespace fs = std::filesystem;

struct DiskStore::State {
  std::string dir;
  int64_t max_bytes = 0;
  bool durable = true;
  mutable std::mutex mu;
  // Recency of the files this process knows (front: most recent) and their sizes.
  std::list<std::string> lru;
  std::unordered_map<std::string, std::pair<std::list<std::string>::iterator, int64_t>> files;
  StoreStats st;

  void forget(const std::string& name) {
    auto it = files.find(name);
    if (it == files.end()) return;
    st.bytes -= it->second.second;
    --st.items;
    lru.erase(it->second.first);
    files.erase(it);
  }
  void note(const std::string& name, int64_t size) {
    forget(name);
    lru.push_front(name);
    files[name] = {lru.begin(), size};
    st.bytes += size;
    ++st.items;
  }
};

DiskStore::DiskStore(std::string dir, int64_t max_bytes, bool fsync_each_put) : s_(std::make_unique<State>()) {
  require_arg(!dir.empty(), "DiskStore: dir is empty");
  require_arg(max_bytes > 0, "DiskStore: max_bytes must be > 0, got ", max_bytes);
  std::error_code ec;
  fs::create_directories(dir, ec);
  require_arg(!ec && fs::is_directory(dir), "DiskStore: cannot use directory '", dir, "': ", ec.message());
  State& s = *s_;
  s.dir = dir;
  s.max_bytes = max_bytes;
  s.durable = fsync_each_put;
  // Files left by earlier runs (or other processes), oldest first into the LRU.
  std::vector<std::pair<fs::file_time_type, std::pair<std::string, int64_t>>> found;
  for (const auto& sub : fs::directory_iterator(dir, ec)) {
    if (!sub.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(sub.path(), ec)) {
      const std::string name = f.path().filename().string();
      if (name.size() != 52 || name.substr(48) != ".kvo") continue;  // temporaries and strangers stay untouched
      found.push_back({f.last_write_time(ec), {name.substr(0, 48), static_cast<int64_t>(f.file_size(ec))}});
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& [t, f] : found) s.note(f.first, f.second);
}

DiskStore::~DiskStore() = default;

std::string DiskStore::path_of(const StoreKey& key) const {
  const std::string h = key.hex();
  return s_->dir + "/" + h.substr(46, 2) + "/" + h + ".kvo";
}

bool DiskStore::put(const StoreKey& key, std::span<const uint8_t> payload) {
  const std::vector<uint8_t> sealed = store_seal(key, payload);
  return put_sealed(key, sealed);
}

bool DiskStore::put_sealed(const StoreKey& key, std::span<const uint8_t> sealed) {
  State& s = *s_;
  const int64_t n = static_cast<int64_t>(sealed.size());
  const std::string path = path_of(key), name = key.hex();
  std::vector<std::string> victims;
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (n > s.max_bytes) {
      ++s.st.put_failures;
      return false;
    }
    s.forget(name);
    while (s.st.bytes + n > s.max_bytes && !s.lru.empty()) {
      victims.push_back(s.lru.back());
      s.forget(s.lru.back());
      ++s.st.evictions;
    }
  }
  for (const std::string& v : victims) {
    std::error_code ec;
    fs::remove(s.dir + "/" + v.substr(46, 2) + "/" + v + ".kvo", ec);
  }
  try {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    const std::span<const uint8_t> pieces[1] = {sealed};
    persist::write_file_atomic(path, pieces, s.durable);
  } catch (const Error&) {  // full disk, I/O error: the old file (if any) is still whole
    std::lock_guard<std::mutex> g(s.mu);
    ++s.st.put_failures;
    std::error_code ec;
    if (fs::exists(path, ec)) s.note(name, static_cast<int64_t>(fs::file_size(path, ec)));
    return false;
  }
  std::lock_guard<std::mutex> g(s.mu);
  s.note(name, n);
  ++s.st.puts;
  return true;
}

std::optional<std::vector<uint8_t>> DiskStore::get(const StoreKey& key) {
  State& s = *s_;
  const std::string path = path_of(key), name = key.hex();
  std::vector<uint8_t> bytes;
  try {
    bytes = persist::read_file(path);
  } catch (const Error&) {
    std::lock_guard<std::mutex> g(s.mu);
    s.forget(name);
    ++s.st.misses;
    return std::nullopt;
  }
  const std::optional<std::span<const uint8_t>> p = store_open(key, bytes);
  std::lock_guard<std::mutex> g(s.mu);
  if (!p) {
    ++s.st.rejected;
    ++s.st.misses;
    return std::nullopt;  // left in place: another process may be about to replace it; LRU drops it in time
  }
  ++s.st.hits;
  s.note(name, static_cast<int64_t>(bytes.size()));
  return std::vector<uint8_t>(p->begin(), p->end());
}

bool DiskStore::contains(const StoreKey& key) {
  std::error_code ec;
  return fs::exists(path_of(key), ec);
}

bool DiskStore::remove(const StoreKey& key) {
  std::error_code ec;
  const bool removed = fs::remove(path_of(key), ec);
  std::lock_guard<std::mutex> g(s_->mu);
  s_->forget(key.hex());
  return removed;
}

StoreStats DiskStore::stats() const {
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->st;
}

}  // namespace kvcore
