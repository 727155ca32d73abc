// A reservation as the bindings hold it: the cache's AppendTicket plus what was reserved
// (sequences, counts, positions), which a step's attention plan is made from.
#pragma once
#include <span>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"

namespace kvcore::capi {

struct Ticket {
  AppendTicket t;
  std::vector<SeqId> seqs;
  std::vector<int32_t> counts, positions;

  // cache.reserve() into this ticket (its buffers reused); on failure the ticket holds nothing
  // valid and the cache is unchanged.
  void reserve(PagedCache& cache, std::span<const SeqId> s, std::span<const int32_t> c, std::span<const int32_t> p) {
    seqs.clear();
    counts.clear();
    positions.clear();
    cache.reserve(t, s, c, p);
    seqs.assign(s.begin(), s.end());
    counts.assign(c.begin(), c.end());
    positions.assign(p.begin(), p.end());
  }
};

}  // namespace kvcore::capi
