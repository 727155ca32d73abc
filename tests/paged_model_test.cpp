// Randomized model-based test of PagedCache: 10 configurations (5 formats x 2 RoPE
// modes) x 10,000 random operations = 100,000 operations, and MLA's 576/512 rows (f16, bf16,
// fp8 x 2 modes) x 2,500 operations each (append all layers or
// reserve + per-layer store over 1-3 sequences, shift, truncate, position-range
// removes and adds, fork, erase, prepare, and bad calls) against the dense f64 model of tests/paged_model.hpp,
// with prefix reuse through a PrefixCache mixed in (prompts sharing system prompts under two
// tenant salts, publishes, clears): reused blocks read back as the prompt's K/V, and every hit,
// miss and publish is the reference's prediction.
// Read-backs after ~30% of the operations and of every sequence and layer at the end;
// tolerances as stated in paged_model.hpp. Failing calls (exhausted pool, bad
// arguments) must leave a byte-identical snapshot.
#include <gtest/gtest.h>

#include <cstdio>

#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

struct ModelCase {
  KvFormat format;
  RopeMode mode;
  bool mla = false;     // mla_config: K 576 with a 64-dim RoPE tail, V 512
  bool shared = false;  // with mla: the shared layout (mla_shared_config: V is K's latent)
};

class PagedModel : public ::testing::TestWithParam<ModelCase> {};

TEST_P(PagedModel, RandomOperationsMatchTheDenseModel) {
  const ModelCase mc = GetParam();
  const int32_t block_size = mc.format == KvFormat::Dsv4Row ? 4 : (mc.mode == RopeMode::RopeStored ? 8 : 16);
  PagedCache cache(mc.shared ? mla_shared_config(mc.format, mc.mode, block_size)
                   : mc.mla  ? mla_config(mc.format, mc.mode, block_size)
                             : small_config(mc.format, mc.mode, block_size, mc.format == KvFormat::Dsv4Row ? 24 : 40),
                   Device::cpu());
  PrefixCache prefix(cache, 4242);
  Driver drv({&cache}, 1000 + static_cast<int>(mc.format) * 10 + static_cast<int>(mc.mode) + (mc.mla ? 500 : 0) + (mc.shared ? 250 : 0));
  drv.prefixes = {&prefix};
#if defined(__SANITIZE_ADDRESS__)
  const int64_t kOps = mc.mla ? 625 : 2500;  // the sanitizer run repeats the suite: a quarter keeps it within CI's budget
#else
  const int64_t kOps = mc.mla ? 2500 : 10000;  // MLA rows are 4x wider than small_config's two heads of 64
#endif
  for (int64_t i = 0; i < kOps && !::testing::Test::HasFailure(); ++i) {
    drv.step();
    if (i % 500 == 0) drv.check_counts();
  }
  drv.check_all();
  drv.check_counts();
  std::printf("[paged model] %s%s %s: %lld ops (%lld failed cleanly, %lld out of blocks), %lld shifts, %lld position edits, %lld forks, "
              "%lld rows checked; worst |err|/tol K %.3f V %.3f; worst |err|/rowmax K %.3g V %.3g\n",
              mc.shared ? "mla shared " : mc.mla ? "mla " : "", std::string(kv_format_name(mc.format)).c_str(), mc.mode == RopeMode::RopeStored ? "rope-stored" : "rope-on-read",
              static_cast<long long>(drv.ops), static_cast<long long>(drv.failed_ops), static_cast<long long>(drv.oom),
              static_cast<long long>(drv.shifts), static_cast<long long>(drv.edits), static_cast<long long>(drv.forks),
              static_cast<long long>(drv.st.rows_checked), drv.st.worst_ratio_k, drv.st.worst_ratio_v, drv.st.worst_rel_k,
              drv.st.worst_rel_v);
  std::printf("[paged model] prefix reuse: %lld prompts (%lld reusing blocks; %lld blocks hit, %lld missed), %lld publishes, "
              "%lld clears, %lld holders at the end\n",
              static_cast<long long>(drv.prompts), static_cast<long long>(drv.hit_prompts),
              static_cast<long long>(drv.ref_blocks_hit), static_cast<long long>(drv.ref_blocks_missed),
              static_cast<long long>(drv.publishes), static_cast<long long>(drv.clears),
              static_cast<long long>(prefix.stats().holders));
  EXPECT_GT(drv.oom, 0) << "the pool never ran out: the exhaustion path went untested";
  // DeepSeek-V4 rows (a 24-block pool of 4-token blocks: holders are cleared often) and MLA rows (a
  // quarter of the operations) see few hits; the others dozens.
  const int64_t min_hits = mc.format == KvFormat::Dsv4Row || mc.mla ? 1 : kOps / 200;
  EXPECT_GE(drv.hit_prompts, min_hits) << "prefix reuse went untested";
  EXPECT_GT(drv.ref_blocks_missed, kOps / 500);
  EXPECT_GT(drv.shifts, kOps / 100);
  EXPECT_GT(drv.edits, kOps / 100);
}

std::vector<ModelCase> all_cases() {
  std::vector<ModelCase> v;
  for (KvFormat f : kAllFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m});
  for (KvFormat f : kMlaFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m, true});
  // The shared layout: one format per RoPE mode keeps the suite's time (FP8 stored re-encodes the latent's row).
  v.push_back({KvFormat::Fp8, RopeMode::RopeStored, true, true});
  v.push_back({KvFormat::BF16, RopeMode::RopeOnRead, true, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, PagedModel, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<ModelCase>& i) {
                           return std::string(i.param.shared ? "MlaShared_" : i.param.mla ? "Mla_" : "") + std::string(kv_format_name(i.param.format)) +
                                  (i.param.mode == RopeMode::RopeStored ? "_RopeStored" : "_RopeOnRead");
                         });

}  // namespace
