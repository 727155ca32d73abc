// PrefixCache: hash chains of full blocks, holder sequences that keep published prefixes alive,
// LRU eviction of holders, and the pristine-prefix bookkeeping that decides what may be published.
#include "kvcore/persist/prefix_cache.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <list>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "cache/paged_export.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/snapshot.hpp"
#include "persist/bytes.hpp"
#include "persist/checksum.hpp"

namespace kvcore {

namespace {

struct Key {
  uint64_t hi = 0, lo = 0;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull)); }
};

constexpr int32_t kUnbounded = INT32_MAX;

}  // namespace

struct PrefixCache::State {
  PagedCache* cache = nullptr;
  uint64_t seed = 0;
  uint64_t layout = 0;
  struct Holder {
    SeqId seq = 0;
    std::vector<Key> keys;  // keys of its blocks 0 .. n-1
  };
  std::list<Holder> lru;  // front: most recently used
  std::unordered_map<Key, std::vector<std::list<Holder>::iterator>, KeyHash> index;
  std::map<SeqId, int32_t> pristine;  // user sequences created here -> pristine prefix length
  PrefixStats st;

  int32_t bs() const { return cache->config().block_size; }

  Key root(std::string_view salt) const {
    persist::ByteWriter w;
    w.bytes("kvcore/prefix/1", 15);
    w.put(layout);
    w.put(static_cast<uint32_t>(salt.size()));
    w.bytes(salt.data(), salt.size());
    const persist::Hash128 h = persist::xxh3_128(w.out.data(), w.out.size(), seed);
    return {h.hi, h.lo};
  }
  // Keys of the first n_blocks full blocks of `tokens`.
  std::vector<Key> chain(std::span<const int32_t> tokens, std::string_view salt, int32_t n_blocks) const {
    std::vector<Key> keys;
    Key parent = root(salt);
    std::vector<uint8_t> buf(16 + static_cast<size_t>(bs()) * 4);
    for (int32_t i = 0; i < n_blocks; ++i) {
      std::memcpy(buf.data(), &parent.hi, 8);
      std::memcpy(buf.data() + 8, &parent.lo, 8);
      std::memcpy(buf.data() + 16, tokens.data() + static_cast<size_t>(i) * bs(), static_cast<size_t>(bs()) * 4);
      const persist::Hash128 h = persist::xxh3_128(buf.data(), buf.size(), seed);
      parent = {h.hi, h.lo};
      keys.push_back(parent);
    }
    return keys;
  }

  std::list<Holder>::iterator find(const Key& k) {
    auto it = index.find(k);
    return it == index.end() || it->second.empty() ? lru.end() : it->second.back();
  }

  void drop(std::list<Holder>::iterator h) {
    for (const Key& k : h->keys) {
      auto it = index.find(k);
      if (it == index.end()) continue;
      auto& v = it->second;
      v.erase(std::remove(v.begin(), v.end(), h), v.end());
      if (v.empty()) index.erase(it);
    }
    cache->erase(h->seq);
    lru.erase(h);
  }

  int32_t& pristine_of(const char* what, SeqId seq) {
    auto it = pristine.find(seq);
    require_arg(it != pristine.end(), "PrefixCache::", what, ": sequence ", seq,
                " was not created by this PrefixCache (its edits are unknown)");
    return it->second;
  }
};

PrefixCache::PrefixCache(PagedCache& cache, uint64_t seed) : s_(std::make_unique<State>()) {
  s_->cache = &cache;
  s_->seed = seed ? seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  s_->layout = layout_fingerprint_hash(cache.config());
}

PrefixCache::~PrefixCache() {
  try {
    clear();
  } catch (...) {  // the cache may already be unusable; holders then go with it
  }
}

SeqId PrefixCache::create(std::span<const int32_t> prompt, std::string_view salt, int32_t* reused_tokens) {
  State& s = *s_;
  // At least one prompt token is left to compute: the engine needs its logits.
  const int32_t full = prompt.empty() ? 0 : static_cast<int32_t>((prompt.size() - 1) / s.bs());
  const std::vector<Key> keys = s.chain(prompt, salt, full);
  int32_t m = 0;
  auto holder = s.lru.end();
  while (m < full) {
    auto h = s.find(keys[m]);
    if (h == s.lru.end()) break;
    holder = h;
    ++m;
  }
  ++s.st.queries;
  s.st.blocks_hit += m;
  s.st.blocks_missed += full - m;
  SeqId id;
  if (m == 0) {
    id = s.cache->create();
  } else {
    id = s.cache->fork(holder->seq);
    try {
      s.cache->truncate(id, m * s.bs());
    } catch (...) {
      s.cache->erase(id);
      throw;
    }
    s.lru.splice(s.lru.begin(), s.lru, holder);
    ++s.st.hit_queries;
  }
  s.pristine[id] = kUnbounded;
  if (reused_tokens) *reused_tokens = m * s.bs();
  return id;
}

int32_t PrefixCache::publish(SeqId seq, std::span<const int32_t> tokens, std::string_view salt) {
  State& s = *s_;
  const int32_t pristine = s.pristine_of("publish", seq);
  const SeqInfo info = s.cache->info(seq);
  require_arg(static_cast<int64_t>(tokens.size()) <= info.n_live, "PrefixCache::publish: ", tokens.size(),
              " token ids for a sequence of ", info.n_live, " tokens");
  int32_t n = std::min<int32_t>(static_cast<int32_t>(tokens.size()), pristine);
  n = paged_prefix_in_place(*s.cache, seq, n);
  const int32_t m = n / s.bs();
  if (m == 0) return 0;
  const std::vector<Key> keys = s.chain(tokens, salt, m);
  if (auto h = s.find(keys[m - 1]); h != s.lru.end()) {  // already cached as a whole
    s.lru.splice(s.lru.begin(), s.lru, h);
    return m * s.bs();
  }
  for (const Key& k : keys) s.st.blocks_published += s.find(k) == s.lru.end() ? 1 : 0;
  const SeqId holder = s.cache->fork(seq);
  try {
    s.cache->truncate(holder, m * s.bs());
  } catch (...) {
    s.cache->erase(holder);
    throw;
  }
  // Holders whose whole chain is a prefix of this one are now redundant.
  std::vector<std::list<State::Holder>::iterator> redundant;
  for (int32_t i = 0; i < m; ++i) {
    auto it = s.index.find(keys[i]);
    if (it == s.index.end()) continue;
    for (auto h : it->second)
      if (static_cast<int32_t>(h->keys.size()) == i + 1 && std::find(redundant.begin(), redundant.end(), h) == redundant.end())
        redundant.push_back(h);
  }
  s.lru.push_front({holder, keys});
  for (const Key& k : keys) s.index[k].push_back(s.lru.begin());
  for (auto h : redundant) s.drop(h);
  return m * s.bs();
}

void PrefixCache::shift(SeqId seq, int32_t n_keep, int32_t n_discard) {
  int32_t& p = s_->pristine_of("shift", seq);
  s_->cache->shift(seq, n_keep, n_discard);
  if (n_discard > 0) p = std::min(p, n_keep);  // later tokens attended to what was discarded; discarding nothing changes nothing
}

void PrefixCache::truncate(SeqId seq, int32_t n) {
  int32_t& p = s_->pristine_of("truncate", seq);
  s_->cache->truncate(seq, n);
  if (n <= p) p = kUnbounded;  // what remains is pristine, and so is what is appended after it
}

void PrefixCache::note_edit(SeqId seq, int32_t first_token) {
  int32_t& p = s_->pristine_of("note_edit", seq);
  require_arg(first_token >= 0, "PrefixCache::note_edit: first_token must be >= 0, got ", first_token);
  p = std::min(p, first_token);
}

void PrefixCache::erase(SeqId seq) {
  s_->pristine_of("erase", seq);
  s_->cache->erase(seq);
  s_->pristine.erase(seq);
}

bool PrefixCache::evict(int32_t free_blocks) {
  State& s = *s_;
  while (s.cache->stats().blocks_free < free_blocks && !s.lru.empty()) {
    s.drop(std::prev(s.lru.end()));
    ++s.st.evictions;
  }
  return s.cache->stats().blocks_free >= free_blocks;
}

void PrefixCache::clear() {
  while (!s_->lru.empty()) s_->drop(s_->lru.begin());
}

PrefixStats PrefixCache::stats() const {
  PrefixStats st = s_->st;
  st.holders = static_cast<int64_t>(s_->lru.size());
  return st;
}

bool PrefixCache::holds(SeqId seq) const {
  for (const auto& h : s_->lru)
    if (h.seq == seq) return true;
  return false;
}

}  // namespace kvcore
