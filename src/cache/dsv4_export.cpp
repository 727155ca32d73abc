#include "cache/dsv4_export.hpp"

#include "kvcore/error.hpp"

namespace kvcore {

struct Dsv4CacheAccess {
  static std::vector<int64_t>& lengths(Dsv4Cache& c) { return c.length_; }
};

void dsv4_set_lengths(Dsv4Cache& cache, int32_t seq, std::span<const int64_t> lengths) {
  const int32_t n = cache.n_layers();
  require_arg(seq >= 0 && seq < cache.config().max_seqs && static_cast<int32_t>(lengths.size()) == n,
              "dsv4_set_lengths: sequence ", seq, " with ", lengths.size(), " lengths for ", n, " layers");
  std::vector<int64_t>& len = Dsv4CacheAccess::lengths(cache);
  for (int32_t l = 0; l < n; ++l) len[static_cast<size_t>(seq) * n + l] = lengths[l];
}

}  // namespace kvcore
