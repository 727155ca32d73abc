// Test-only access to an AppendTicket's private fields (the ticket befriends this struct):
// tests edit them the way a caller holding a writable struct could, to check that
// PagedCache::store() notices.
#pragma once
#include <vector>

#include "kvcore/cache/paged_cache.hpp"

namespace kvcore {

struct AppendTicketAccess {
  static int32_t& n_tokens(AppendTicket& t) { return t.n_tokens_; }
  static std::vector<int32_t>& counts(AppendTicket& t) { return t.counts_; }
  static std::vector<SeqId>& seqs(AppendTicket& t) { return t.seqs_; }
  static std::vector<uint64_t>& versions(AppendTicket& t) { return t.versions_; }
  static Buffer& slots(AppendTicket& t) { return t.slots_; }
  static uint64_t& owner(AppendTicket& t) { return t.owner_; }
  static uint64_t& stamp(AppendTicket& t) { return t.stamp_; }
};

}  // namespace kvcore
