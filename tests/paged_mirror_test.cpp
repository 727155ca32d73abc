// The mirroring logic a CUDA PagedCache runs (lazy per-block position offsets owed to the
// device, packed scatters of changed blocks, pending-delta edits, prepare()'s settling), run
// on the CPU through PagedCacheConfig::debug_mirror: the same random operations on a plain CPU
// cache and a mirrored one must give the same metadata after every operation, and after
// prepare() the same contract arrays (positions, validity) and the same pool bytes; both are
// read back against the dense model. 5 formats x 2 modes x 2,000 operations.
#include <gtest/gtest.h>

#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

struct MirrorCase {
  KvFormat format;
  RopeMode mode;
};

class PagedMirror : public ::testing::TestWithParam<MirrorCase> {};

TEST_P(PagedMirror, MirroredCacheMatchesThePlainOne) {
  const MirrorCase mc = GetParam();
  const int32_t bs = mc.format == KvFormat::Dsv4Row ? 4 : 8, nb = mc.format == KvFormat::Dsv4Row ? 24 : 40;
  PagedCacheConfig mirrored_cfg = small_config(mc.format, mc.mode, bs, nb);
  mirrored_cfg.debug_mirror = true;
  PagedCache plain(small_config(mc.format, mc.mode, bs, nb), Device::cpu());
  PagedCache mirrored(mirrored_cfg, Device::cpu());
  Driver drv({&plain, &mirrored}, 500 + static_cast<int>(mc.format) * 10 + static_cast<int>(mc.mode));
  int64_t compared = 0;
  drv.on_step = [&](int64_t op) {
    ASSERT_EQ(plain.debug_state(), mirrored.debug_state()) << "metadata diverged at op " << op;
    if (op % 25 != 0) return;
    plain.prepare();
    mirrored.prepare();
    const Snapshot a = snapshot(plain), b = snapshot(mirrored);
    ASSERT_EQ(a.arrays.size(), b.arrays.size());
    for (size_t i = 0; i < a.arrays.size(); ++i) ASSERT_EQ(a.arrays[i], b.arrays[i]) << "array " << i << ", op " << op;
    ++compared;
  };
#if defined(__SANITIZE_ADDRESS__)
  constexpr int64_t kOps = 800;  // the sanitizer run repeats the suite
#else
  constexpr int64_t kOps = 2000;
#endif
  for (int64_t i = 0; i < kOps && !::testing::Test::HasFailure(); ++i) drv.step();
  drv.check_all();
  EXPECT_GT(compared, kOps / 40);
  EXPECT_GT(drv.shifts, kOps / 20);
}

std::vector<MirrorCase> mirror_cases() {
  std::vector<MirrorCase> v;
  for (KvFormat f : kAllFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, PagedMirror, ::testing::ValuesIn(mirror_cases()),
                         [](const ::testing::TestParamInfo<MirrorCase>& i) {
                           return std::string(kv_format_name(i.param.format)) +
                                  (i.param.mode == RopeMode::RopeStored ? "_RopeStored" : "_RopeOnRead");
                         });

}  // namespace
