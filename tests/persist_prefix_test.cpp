// Prefix caching: published full blocks are reused (shared, copy on write) by later prompts with
// the same tokens and salt, stay cached after their sequences are erased, and go least recently
// used first. A shift or an edit stops exactly the blocks it touches from being published (even
// where the cache's positions would look untouched), and a tenant's salt keeps tenants apart.
// A randomized test checks every reused row against a model in which a row is a function of the
// tokens it was computed from.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "kvcore/error.hpp"
#include "kvcore/persist/prefix_cache.hpp"
#include "paged_configs.hpp"

using namespace kvcore;

namespace {

// The row an engine computes for the last token of `context` (values exact in f16).
uint64_t row_id(const std::vector<int32_t>& context) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  return h;
}
float row_value(uint64_t id, int32_t d) {
  const uint64_t x = (id ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(d + 1))) * 0xbf58476d1ce4e5b9ull;
  return static_cast<float>((x >> 58) & 63) / 8.0f - 4.0f;
}

struct Engine {
  PagedCache& cache;
  PrefixCache& prefix;
  struct Seq {
    std::vector<int32_t> tokens;   // current context
    std::vector<uint64_t> rows;    // the row each cached token holds
  };
  std::map<SeqId, Seq> seqs;

  // Append tokens computed from the current context (what a forward pass would do).
  void append(SeqId id, const std::vector<int32_t>& more) {
    Seq& s = seqs[id];
    const PagedCacheConfig& c = cache.config();
    const int32_t n = static_cast<int32_t>(more.size()), L = c.n_layers, H = c.n_kv_heads, D = c.head_dim;
    std::vector<float> k(static_cast<size_t>(L) * n * H * D);
    std::vector<int32_t> pos(n);
    for (int32_t i = 0; i < n; ++i) {
      s.tokens.push_back(more[i]);
      s.rows.push_back(row_id(s.tokens));
      pos[i] = static_cast<int32_t>(s.tokens.size()) - 1;
      for (int32_t l = 0; l < L; ++l)
        for (int32_t h = 0; h < H; ++h)
          for (int32_t d = 0; d < D; ++d)
            k[((static_cast<size_t>(l) * n + i) * H + h) * D + d] = row_value(s.rows.back() + h, d);
    }
    const TensorRef t(k.data(), DType::F32, Device::cpu(), {L, n, H, D});
    cache.append(id, pos, t, t);
  }
  // The cache's V rows and positions equal the model's.
  ::testing::AssertionResult check(SeqId id) {
    const Seq& s = seqs.at(id);
    const PagedReadBack r = cache.read(id, cache.config().n_layers - 1);
    const int32_t H = cache.config().n_kv_heads, D = cache.config().v_head_dim;
    if (r.positions.size() != s.rows.size())
      return ::testing::AssertionFailure() << "seq " << id << ": " << r.positions.size() << " tokens, model " << s.rows.size();
    for (size_t i = 0; i < s.rows.size(); ++i) {
      if (r.positions[i] != static_cast<int32_t>(i)) return ::testing::AssertionFailure() << "position " << i;
      for (int32_t h = 0; h < H; ++h)
        for (int32_t d = 0; d < D; ++d)
          if (r.v[(i * H + h) * D + d] != row_value(s.rows[i] + h, d))
            return ::testing::AssertionFailure() << "seq " << id << " token " << i << " holds another row";
    }
    return ::testing::AssertionSuccess();
  }
  // A request: reuse what is cached, compute the rest.
  SeqId request(const std::vector<int32_t>& prompt, std::string_view salt, int32_t* reused = nullptr) {
    int32_t n = 0;
    const SeqId id = prefix.create(prompt, salt, &n);
    Seq& s = seqs[id];
    s.tokens.assign(prompt.begin(), prompt.begin() + n);
    for (int32_t i = 1; i <= n; ++i) s.rows.push_back(row_id(std::vector<int32_t>(prompt.begin(), prompt.begin() + i)));
    append(id, std::vector<int32_t>(prompt.begin() + n, prompt.end()));
    if (reused) *reused = n;
    return id;
  }
  void shift(SeqId id, int32_t keep, int32_t discard) {
    prefix.shift(id, keep, discard);
    Seq& s = seqs[id];
    s.tokens.erase(s.tokens.begin() + keep, s.tokens.begin() + keep + discard);
    s.rows.erase(s.rows.begin() + keep, s.rows.begin() + keep + discard);
  }
  void truncate(SeqId id, int32_t n) {
    prefix.truncate(id, n);
    seqs[id].tokens.resize(n);
    seqs[id].rows.resize(n);
  }
  void erase(SeqId id) {
    prefix.erase(id);
    seqs.erase(id);
  }
  int32_t publish(SeqId id, std::string_view salt) { return prefix.publish(id, seqs[id].tokens, salt); }
};

std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

PagedCacheConfig config(RopeMode mode, int32_t blocks = 64) {
  return paged_test::small_config(KvFormat::F16, mode, 4, blocks);
}

}  // namespace

TEST(PersistPrefix, PublishedBlocksAreReusedSharedAndOutliveTheirSequence) {
  PagedCache cache(config(RopeMode::RopeOnRead), Device::cpu());
  PrefixCache prefix(cache, 1);
  Engine e{cache, prefix, {}};
  const std::vector<int32_t> system = iota_tokens(100, 10);
  int32_t reused = -1;
  const SeqId a = e.request(system, "m", &reused);
  EXPECT_EQ(reused, 0);
  EXPECT_EQ(e.publish(a, "m"), 8);  // two full blocks of 4
  std::vector<int32_t> longer = system;
  longer.insert(longer.end(), {7, 8, 9});
  const SeqId b = e.request(longer, "m", &reused);
  EXPECT_EQ(reused, 8);
  EXPECT_TRUE(e.check(b));
  EXPECT_GE(cache.stats().blocks_shared, 2);
  const std::vector<int32_t> holder_before = cache.read(b, 0).positions;
  e.append(b, {1, 2, 3, 4, 5});  // b writes its own blocks; the cached ones stay as they were
  e.erase(a);
  e.erase(b);
  EXPECT_EQ(cache.stats().blocks_used, 2) << "the published blocks stay cached";
  const SeqId c = e.request(system, "m", &reused);
  EXPECT_EQ(reused, 8);
  EXPECT_TRUE(e.check(c));
  // A prompt of exactly the cached blocks leaves its last block to compute (the engine needs logits).
  const SeqId d = e.request(std::vector<int32_t>(system.begin(), system.begin() + 8), "m", &reused);
  EXPECT_EQ(reused, 4);
  EXPECT_TRUE(e.check(d));
  const PrefixStats st = prefix.stats();
  EXPECT_EQ(st.queries, 4);
  EXPECT_EQ(st.hit_queries, 3);
  EXPECT_EQ(st.blocks_hit, 2 + 2 + 1);
  EXPECT_EQ(st.blocks_missed, 2 + 1);  // the first request's two, the 13-token one's third
}

TEST(PersistPrefix, AShiftStopsExactlyTheBlocksItTouchesFromBeingPublished) {
  for (RopeMode mode : {RopeMode::RopeOnRead, RopeMode::RopeStored}) {
    PagedCache cache(config(mode), Device::cpu());
    PrefixCache prefix(cache, 2);
    Engine e{cache, prefix, {}};
    // Cut inside block 2: blocks 0 and 1 stay publishable, nothing after.
    const SeqId a = e.request(iota_tokens(0, 20), "m");
    e.shift(a, 9, 3);
    EXPECT_EQ(e.publish(a, "m"), 8);
    EXPECT_TRUE(e.check(a));
    // Cut on a block boundary, discarding a whole block: after the shift the cache's cells look
    // untouched (live, positions 0, 1, 2, ...) but the later rows attended to discarded tokens.
    const SeqId b = e.request(iota_tokens(1000, 24), "m");
    e.shift(b, 8, 4);
    EXPECT_EQ(e.publish(b, "m"), 8);
    int32_t reused = -1;
    const SeqId c = e.request(e.seqs[b].tokens, "m", &reused);
    EXPECT_EQ(reused, 8) << "blocks after the cut must not be reused";
    EXPECT_TRUE(e.check(c));
    // A truncate back to the pristine part makes what follows publishable again.
    e.truncate(b, 8);
    e.append(b, iota_tokens(5000, 9));
    EXPECT_EQ(e.publish(b, "m"), 16);
    const SeqId d = e.request(e.seqs[b].tokens, "m", &reused);
    EXPECT_EQ(reused, 16);
    EXPECT_TRUE(e.check(d));
    // An edit reported from token 5: only block 0 stays publishable.
    const SeqId f = e.request(iota_tokens(9000, 17), "m");
    prefix.note_edit(f, 5);
    EXPECT_EQ(e.publish(f, "m"), 4);
  }
}

TEST(PersistPrefix, TenantsWithDifferentSaltsNeverShareBlocks) {
  PagedCache cache(config(RopeMode::RopeOnRead), Device::cpu());
  PrefixCache prefix(cache, 3);
  Engine e{cache, prefix, {}};
  const std::vector<int32_t> p = iota_tokens(40, 13);
  const SeqId a = e.request(p, "tenant-a");
  EXPECT_EQ(e.publish(a, "tenant-a"), 12);
  int32_t reused = -1;
  e.request(p, "tenant-b", &reused);
  EXPECT_EQ(reused, 0) << "tenant b must not hit (nor time-probe) tenant a's prefix";
  e.request(p, "tenant-a", &reused);
  EXPECT_EQ(reused, 12);
  // Another PrefixCache (another seed) over the same cache knows nothing of these keys.
  PrefixCache other(cache, 4);
  other.create(p, "tenant-a", &reused);
  EXPECT_EQ(reused, 0);
  // Sequences this PrefixCache did not create cannot be published (their edits are unknown).
  const SeqId stranger = cache.create();
  EXPECT_THROW(prefix.publish(stranger, {}, "tenant-a"), Error);
}

TEST(PersistPrefix, EvictionDropsTheLeastRecentlyUsedPrefixes) {
  PagedCache cache(config(RopeMode::RopeOnRead, 12), Device::cpu());
  PrefixCache prefix(cache, 5);
  Engine e{cache, prefix, {}};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(iota_tokens(100 * (i + 1), 9));
    const SeqId s = e.request(prompts.back(), "m");
    e.publish(s, "m");
    e.erase(s);
  }
  EXPECT_EQ(cache.stats().blocks_used, 6);
  int32_t reused = -1;
  const SeqId hit = e.request(prompts[0], "m", &reused);  // prompt 0 is now the most recent
  EXPECT_EQ(reused, 8);
  e.erase(hit);
  EXPECT_TRUE(prefix.evict(cache.config().num_blocks - 2));  // room for all but two blocks
  EXPECT_EQ(prefix.stats().holders, 1);
  e.request(prompts[0], "m", &reused);
  EXPECT_EQ(reused, 8) << "the most recently used prefix survives";
  e.request(prompts[1], "m", &reused);
  EXPECT_EQ(reused, 0);
  EXPECT_EQ(prefix.stats().evictions, 2);
}

TEST(PersistPrefix, RandomOperationsNeverReuseAWrongRow) {
  for (RopeMode mode : {RopeMode::RopeOnRead, RopeMode::RopeStored}) {
    PagedCache cache(config(mode, 48), Device::cpu());
    PrefixCache prefix(cache, 6);
    Engine e{cache, prefix, {}};
    std::mt19937 rng(mode == RopeMode::RopeOnRead ? 11 : 12);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<std::vector<int32_t>> systems;
    for (int i = 0; i < 4; ++i) systems.push_back(iota_tokens(1000 * i, uni(3, 14)));
    const char* salts[2] = {"a", "b"};
    int reused_total = 0;
    auto any_seq = [&]() -> SeqId {
      auto it = e.seqs.begin();
      std::advance(it, uni(0, static_cast<int>(e.seqs.size()) - 1));
      return it->first;
    };
    for (int op = 0; op < 1500; ++op) {
      const int kind = uni(0, 9);
      if (e.seqs.size() > 6) e.erase(any_seq());
      if (kind <= 2 || e.seqs.empty()) {
        // A new request on a system prompt, or the next turn of a live conversation (whose tokens
        // may have been shifted: its cached blocks after the cut must not be reused).
        std::vector<int32_t> p = e.seqs.empty() || uni(0, 1) ? systems[uni(0, 3)] : e.seqs[any_seq()].tokens;
        for (int i = uni(0, 5); i > 0; --i) p.push_back(uni(0, 3));
        if (!prefix.evict(static_cast<int32_t>(p.size()) / 4 + 3)) continue;
        int32_t reused = 0;
        const SeqId s = e.request(p, salts[uni(0, 1)], &reused);
        reused_total += reused;
        ASSERT_TRUE(e.check(s)) << "op " << op;
      } else if (kind == 3) {
        const SeqId s = any_seq();
        const int32_t n = uni(1, 6);
        if (!prefix.evict(n / 4 + 3)) continue;
        e.append(s, iota_tokens(uni(0, 3), n));
        ASSERT_TRUE(e.check(s)) << "op " << op;
      } else if (kind == 4) {
        const SeqId s = any_seq();
        const int32_t len = static_cast<int32_t>(e.seqs[s].tokens.size());
        if (len < 2 || !prefix.evict(3)) continue;
        int32_t keep = uni(0, len - 1), discard = uni(1, len - keep);
        if (uni(0, 1) && len >= 8) {  // whole blocks cut: the cells after the cut then look untouched
          keep = 4 * uni(0, (len - 4) / 4);
          discard = 4 * uni(1, (len - keep) / 4);
        }
        e.shift(s, keep, discard);
        ASSERT_TRUE(e.check(s)) << "op " << op;
      } else if (kind == 5) {
        const SeqId s = any_seq();
        e.truncate(s, uni(0, static_cast<int32_t>(e.seqs[s].tokens.size())));
        ASSERT_TRUE(e.check(s)) << "op " << op;
      } else if (kind <= 8) {
        const SeqId s = any_seq();
        if (!prefix.evict(1)) continue;
        e.publish(s, salts[uni(0, 1)]);
      } else {
        e.erase(any_seq());
      }
    }
    for (const auto& [id, s] : e.seqs) ASSERT_TRUE(e.check(id));
    EXPECT_GT(reused_total, 100) << "the workload must actually reuse blocks";
    EXPECT_GT(prefix.stats().hit_queries, 10);
  }
}
