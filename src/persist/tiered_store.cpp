// TieredStore: the first tier takes puts; its evictions are written to every lower tier on a
// worker thread; gets try every tier in order and copy lower hits back up.
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "kvcore/error.hpp"
#include "kvcore/persist/kv_store.hpp"

namespace kvcore {

struct TieredStore::State {
  std::vector<KvStore*> tiers;
  HostStore* first = nullptr;
  int64_t max_queue_bytes = 0;
  std::mutex mu;
  std::condition_variable cv, idle;
  struct Move {
    StoreKey key;
    std::vector<uint8_t> sealed;
  };
  // Moves waiting, and the one the worker is writing (still visible to lookups until written).
  std::deque<std::shared_ptr<const Move>> queue;
  std::shared_ptr<const Move> current;
  int64_t queued_bytes = 0, dropped = 0;
  bool busy = false, stop = false;
  std::vector<int64_t> tier_hits;
  int64_t misses = 0;
  std::thread worker;

  void enqueue(const StoreKey& k, std::vector<uint8_t>&& sealed) {
    if (tiers.size() < 2) return;
    std::lock_guard<std::mutex> g(mu);
    queued_bytes += static_cast<int64_t>(sealed.size());
    queue.push_back(std::make_shared<const Move>(Move{k, std::move(sealed)}));
    while (queued_bytes > max_queue_bytes && queue.size() > 1) {  // never block the caller: drop the oldest
      queued_bytes -= static_cast<int64_t>(queue.front()->sealed.size());
      queue.pop_front();
      ++dropped;
    }
    cv.notify_one();
  }

  void run() {
    std::unique_lock<std::mutex> g(mu);
    while (true) {
      cv.wait(g, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop requested and nothing left
      current = std::move(queue.front());
      queue.pop_front();
      queued_bytes -= static_cast<int64_t>(current->sealed.size());
      busy = true;
      const std::shared_ptr<const Move> m = current;
      g.unlock();
      for (size_t i = 1; i < tiers.size(); ++i) put_sealed_into(i, m->key, m->sealed);
      g.lock();
      current.reset();
      busy = false;
      if (queue.empty()) idle.notify_all();
    }
  }

  // A value waiting in the queue (newest first), checked like any other.
  std::optional<std::vector<uint8_t>> in_flight(const StoreKey& k) {
    std::lock_guard<std::mutex> g(mu);
    auto check = [&](const Move& m) -> std::optional<std::vector<uint8_t>> {
      if (!(m.key == k)) return std::nullopt;
      const std::optional<std::span<const uint8_t>> p = store_open(k, m.sealed);
      if (!p) return std::nullopt;
      return std::vector<uint8_t>(p->begin(), p->end());
    };
    for (auto it = queue.rbegin(); it != queue.rend(); ++it)
      if (auto v = check(**it)) return v;
    if (current)
      if (auto v = check(*current)) return v;
    return std::nullopt;
  }

  // A sealed value into tier i, whatever kind it is.
  bool put_sealed_into(size_t i, const StoreKey& k, const std::vector<uint8_t>& sealed) {
    KvStore* t = tiers[i];
    if (auto* h = dynamic_cast<HostStore*>(t)) return h->put_sealed(k, sealed);
    if (auto* d = dynamic_cast<DiskStore*>(t)) return d->put_sealed(k, sealed);
    const std::optional<std::span<const uint8_t>> p = store_open(k, sealed);
    return p && t->put(k, *p);
  }
};

TieredStore::TieredStore(std::vector<KvStore*> tiers, int64_t max_queue_bytes) : s_(std::make_unique<State>()) {
  require_arg(!tiers.empty(), "TieredStore: no tiers");
  for (size_t i = 0; i < tiers.size(); ++i) require_arg(tiers[i] != nullptr, "TieredStore: tier ", i, " is null");
  require_arg(dynamic_cast<HostStore*>(tiers[0]) != nullptr, "TieredStore: the first tier must be a HostStore, got ",
              tiers[0]->name());
  require_arg(max_queue_bytes > 0, "TieredStore: max_queue_bytes must be > 0, got ", max_queue_bytes);
  State& s = *s_;
  s.tiers = std::move(tiers);
  s.first = static_cast<HostStore*>(s.tiers[0]);
  s.max_queue_bytes = max_queue_bytes;
  s.tier_hits.assign(s.tiers.size(), 0);
  // What the first tier evicts is written to every lower tier (the local disk keeps it for this
  // machine, a shared server for every machine); lower tiers evict for good.
  s.first->set_on_evict([st = &s](const StoreKey& k, std::vector<uint8_t>&& v) { st->enqueue(k, std::move(v)); });
  s.worker = std::thread([st = &s] { st->run(); });
}

TieredStore::~TieredStore() {
  {
    std::lock_guard<std::mutex> g(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  s_->worker.join();
  s_->first->set_on_evict(nullptr);
}

bool TieredStore::put(const StoreKey& key, std::span<const uint8_t> payload) { return s_->first->put(key, payload); }

std::optional<std::vector<uint8_t>> TieredStore::get(const StoreKey& key) {
  State& s = *s_;
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    std::optional<std::vector<uint8_t>> v = s.tiers[i]->get(key);
    bool from_queue = false;
    if (!v && i == 0) {
      v = s.in_flight(key);  // evicted, not yet written below
      from_queue = v.has_value();
    }
    if (!v) continue;
    if (i > 0 || from_queue) s.first->put(key, *v);  // load back up (its evictions move down again)
    std::lock_guard<std::mutex> g(s.mu);
    ++s.tier_hits[i];
    return v;
  }
  std::lock_guard<std::mutex> g(s.mu);
  ++s.misses;
  return std::nullopt;
}

// In get()'s order: the first tier, then the values evicted from it and not yet written below
// (the worker keeps a value listed until every tier below holds it), then the tiers below, so a
// value moving down is never missed.
bool TieredStore::contains(const StoreKey& key) {
  State& s = *s_;
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    if (s.tiers[i]->contains(key)) return true;
    if (i == 0 && s.in_flight(key)) return true;
  }
  return false;
}

bool TieredStore::remove(const StoreKey& key) {
  bool any = false;
  for (KvStore* t : s_->tiers) any = t->remove(key) || any;
  return any;
}

StoreStats TieredStore::stats() const {
  StoreStats st;
  for (KvStore* t : s_->tiers) {
    const StoreStats x = t->stats();
    st.rejected += x.rejected;
    st.items += x.items;
    st.bytes += x.bytes;
    st.down = st.down || x.down;
  }
  const StoreStats f = s_->first->stats();
  st.puts = f.puts;
  st.put_failures = f.put_failures;
  std::lock_guard<std::mutex> g(s_->mu);
  for (int64_t h : s_->tier_hits) st.hits += h;
  st.misses = s_->misses;
  return st;
}

void TieredStore::flush() {
  std::unique_lock<std::mutex> g(s_->mu);
  s_->idle.wait(g, [&] { return s_->queue.empty() && !s_->busy; });
}

int64_t TieredStore::dropped_moves() const {
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->dropped;
}

int64_t TieredStore::tier_hits(size_t tier) const {
  std::lock_guard<std::mutex> g(s_->mu);
  return tier < s_->tier_hits.size() ? s_->tier_hits[tier] : 0;
}

}  // namespace kvcore
