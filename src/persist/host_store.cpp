// HostStore: sealed values in host memory, least recently used first out.
#include <list>
#include <mutex>
#include <unordered_map>

#include "kvcore/error.hpp"
#include "kvcore/persist/kv_store.hpp"

namespace kvcore {

namespace {
struct KeyHash {
  size_t operator()(const StoreKey& k) const { return static_cast<size_t>(k.content_lo ^ (k.content_hi * 31) ^ k.layout); }
};
}  // namespace

struct HostStore::State {
  int64_t max_bytes = 0;
  mutable std::mutex mu;
  std::list<std::pair<StoreKey, std::vector<uint8_t>>> lru;  // front: most recently used
  std::unordered_map<StoreKey, decltype(lru)::iterator, KeyHash> index;
  StoreStats st;
  std::function<void(const StoreKey&, std::vector<uint8_t>&&)> on_evict;
};

HostStore::HostStore(int64_t max_bytes) : s_(std::make_unique<State>()) {
  require_arg(max_bytes > 0, "HostStore: max_bytes must be > 0, got ", max_bytes);
  s_->max_bytes = max_bytes;
}
HostStore::~HostStore() = default;

void HostStore::set_on_evict(std::function<void(const StoreKey&, std::vector<uint8_t>&&)> f) {
  std::lock_guard<std::mutex> g(s_->mu);
  s_->on_evict = std::move(f);
}

bool HostStore::put(const StoreKey& key, std::span<const uint8_t> payload) {
  return put_sealed(key, store_seal(key, payload));
}

bool HostStore::put_sealed(const StoreKey& key, std::vector<uint8_t> sealed) {
  std::vector<std::pair<StoreKey, std::vector<uint8_t>>> out;
  std::function<void(const StoreKey&, std::vector<uint8_t>&&)> evict;
  {
    std::lock_guard<std::mutex> g(s_->mu);
    State& s = *s_;
    const int64_t n = static_cast<int64_t>(sealed.size());
    if (n > s.max_bytes) {
      ++s.st.put_failures;
      return false;
    }
    if (auto it = s.index.find(key); it != s.index.end()) {
      s.st.bytes -= static_cast<int64_t>(it->second->second.size());
      s.lru.erase(it->second);
      s.index.erase(it);
      --s.st.items;
    }
    while (s.st.bytes + n > s.max_bytes && !s.lru.empty()) {
      auto& victim = s.lru.back();
      s.st.bytes -= static_cast<int64_t>(victim.second.size());
      --s.st.items;
      ++s.st.evictions;
      s.index.erase(victim.first);
      out.push_back(std::move(victim));
      s.lru.pop_back();
    }
    s.lru.emplace_front(key, std::move(sealed));
    s.index[key] = s.lru.begin();
    s.st.bytes += n;
    ++s.st.items;
    ++s.st.puts;
    evict = s.on_evict;
  }
  if (evict)  // outside the lock: the callback may be slow or call back into this store
    for (auto& [k, v] : out) evict(k, std::move(v));
  return true;
}

std::optional<std::vector<uint8_t>> HostStore::get(const StoreKey& key) {
  std::lock_guard<std::mutex> g(s_->mu);
  State& s = *s_;
  auto it = s.index.find(key);
  if (it == s.index.end()) {
    ++s.st.misses;
    return std::nullopt;
  }
  s.lru.splice(s.lru.begin(), s.lru, it->second);
  const std::optional<std::span<const uint8_t>> p = store_open(key, it->second->second);
  if (!p) {  // host memory went bad: drop the value
    ++s.st.rejected;
    ++s.st.misses;
    s.st.bytes -= static_cast<int64_t>(it->second->second.size());
    --s.st.items;
    s.lru.erase(it->second);
    s.index.erase(it);
    return std::nullopt;
  }
  ++s.st.hits;
  return std::vector<uint8_t>(p->begin(), p->end());
}

bool HostStore::contains(const StoreKey& key) {
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->index.count(key) != 0;
}

bool HostStore::remove(const StoreKey& key) {
  std::lock_guard<std::mutex> g(s_->mu);
  State& s = *s_;
  auto it = s.index.find(key);
  if (it == s.index.end()) return false;
  s.st.bytes -= static_cast<int64_t>(it->second->second.size());
  --s.st.items;
  s.lru.erase(it->second);
  s.index.erase(it);
  return true;
}

StoreStats HostStore::stats() const {
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->st;
}

}  // namespace kvcore
