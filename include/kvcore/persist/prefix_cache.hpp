// PrefixCache: reuse of full blocks whose K/V were computed from the same tokens, on one
// PagedCache (vLLM's automatic prefix caching, with kvcore's edits handled exactly).
//
// A full block's key is a hash chain: key(i) = XXH3-128(seed; key(i-1) or the root, the block's
// token ids), the root being XXH3-128(seed; the caller's salt, the cache's layout fingerprint).
// The salt names everything besides the tokens that changes K/V or who may see them: model,
// adapter, tenant. Two requests share blocks only under equal salts, so one tenant can neither
// hit nor time-probe another's prefixes (vLLM's cache_salt). The seed is random per PrefixCache
// unless given, so nobody outside can precompute colliding token strings.
//
// A key means "the K/V of these tokens computed from scratch at positions 0 .. end of block".
// Published prefixes are kept alive by holder sequences (a fork of the publisher, truncated to
// its published blocks): the blocks stay cached after every user sequence is erased, until
// evict() drops the least recently used holders. Holders are never edited, and a user sequence
// that edits a shared block copies it first (copy on write), so a cached block never changes.
//
// What a sequence may publish: its pristine prefix, tracked through this class's shift(),
// truncate() and note_edit(): a shift discarding tokens after n_keep leaves [0, n_keep) pristine (later
// tokens attended to discarded ones), a truncate to n leaves [0, n), an edit from token t leaves
// [0, t); appends extend it. publish() also checks in the cache's metadata that those tokens are
// live at positions 0 .. n-1. Edit sequences created here only through this class (or report
// edits with note_edit()); publish() refuses sequences it did not create. A PrefixCache must not
// outlive its PagedCache (its destructor erases the holders).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "kvcore/cache/paged_cache.hpp"

namespace kvcore {

struct PrefixStats {
  int64_t queries = 0;           // create() calls
  int64_t hit_queries = 0;       // ... that reused at least one block
  int64_t blocks_hit = 0;        // full blocks reused
  int64_t blocks_missed = 0;     // full prompt blocks not found
  int64_t blocks_published = 0;  // new keys
  int64_t holders = 0;           // cached prefixes kept alive now
  int64_t evictions = 0;         // holders dropped by evict()
};

class PrefixCache {
 public:
  // seed 0: a random one.
  explicit PrefixCache(PagedCache& cache, uint64_t seed = 0);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // A new sequence holding the longest cached prefix of `prompt` in full blocks (shared, copy on
  // write); returns its id and sets *reused_tokens (a multiple of the block size; 0 on a miss).
  // The caller appends the rest of the prompt.
  SeqId create(std::span<const int32_t> prompt, std::string_view salt, int32_t* reused_tokens = nullptr);
  // Publishes the full blocks of seq's pristine prefix: tokens[i] is the id of its token i
  // (tokens.size() <= its length). Returns the tokens now published (a multiple of the block size).
  int32_t publish(SeqId seq, std::span<const int32_t> tokens, std::string_view salt);
  // Edits, forwarded to the cache, each lowering the sequence's pristine prefix.
  void shift(SeqId seq, int32_t n_keep, int32_t n_discard);
  void truncate(SeqId seq, int32_t n);
  void note_edit(SeqId seq, int32_t first_token);
  void erase(SeqId seq);
  // Drops least recently used holders until the cache has `free_blocks` free (or none is left);
  // true when it has them.
  bool evict(int32_t free_blocks);
  void clear();  // drops every holder

  PrefixStats stats() const;
  bool holds(SeqId seq) const;  // is `seq` one of this cache's holders?

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace kvcore
