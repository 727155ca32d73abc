// Hooks of `kvcore bench paged` for shift baselines measured in the same run (the seed's
// algorithm ported, shift_dense): a baseline registers a function that times one shift of
// a dense cache of the case's geometry and returns its timing; bench/paged_bench.cpp
// reports every paged shift case against every registered baseline.
//
//   KVCORE_PAGED_SHIFT_BASELINE(seed_port) {   // in bench/baselines/<something>.cu or .cpp
//     ... allocate dense K/V [context, n_kv_heads, head_dim] f16 per layer, fill, check ...
//     return opt.time([&](int rep) { ... one shift(c.n_keep, c.n_discard) over c.n_layers ... });
//   }
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "bench/harness.hpp"

namespace kvcore::cli {

struct PagedShiftCase {
  int64_t context = 0;  // tokens in the cache before the shift
  int32_t n_keep = 0, n_discard = 0;
  int32_t n_layers = 0, n_kv_heads = 0, head_dim = 0;  // f16 K and V, Llama-3 RoPE (RopeSpec::llama3_8b)
};

struct PagedShiftBaseline {
  std::string name;
  std::function<Timing(BenchOptions&, const PagedShiftCase&)> time;
};

std::vector<PagedShiftBaseline>& paged_shift_baselines();
inline bool register_paged_shift_baseline(PagedShiftBaseline b) {
  paged_shift_baselines().push_back(std::move(b));
  return true;
}

}  // namespace kvcore::cli

#define KVCORE_PAGED_SHIFT_BASELINE(id)                                                                   \
  static ::kvcore::cli::Timing kvcore_paged_baseline_##id(::kvcore::cli::BenchOptions&,                 \
                                                          const ::kvcore::cli::PagedShiftCase&);        \
  [[maybe_unused]] static const bool kvcore_paged_baseline_reg_##id =                                    \
      ::kvcore::cli::register_paged_shift_baseline({#id, &kvcore_paged_baseline_##id});                 \
  static ::kvcore::cli::Timing kvcore_paged_baseline_##id([[maybe_unused]] ::kvcore::cli::BenchOptions& opt, \
                                                          [[maybe_unused]] const ::kvcore::cli::PagedShiftCase& c)
