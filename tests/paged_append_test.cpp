// PagedCache::append with one RoPE table for every layer: the angles of the call's positions
// are computed once (kv_rope_angles) and every layer's K store reads them. The same random
// operations as the model test on such a cache, read back against the f64 model; and layer 0
// of a cache whose layers cannot share (another magnitude on layer 1) holds the same bytes.
#include <gtest/gtest.h>

#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

TEST(PagedAppend, SharedAnglesGiveTheSameBytes) {
  for (KvFormat f : {KvFormat::F16, KvFormat::Fp8, KvFormat::BF16}) {
    PagedCacheConfig shared = small_config(f, RopeMode::RopeStored, 8, 40);
    RopeSpec full = RopeSpec::plain(64, 10000.0);
    full.attention_factor = 1.25;
    shared.rope = {full};
    PagedCacheConfig separate = shared;  // the same frequencies, a different magnitude per layer: no sharing
    RopeSpec other = full;
    other.attention_factor = 1.0;
    separate.rope = {full, other};
    PagedCache a(shared, Device::cpu());
    Driver drv({&a}, 4242 + static_cast<int>(f));
    for (int i = 0; i < 600 && !::testing::Test::HasFailure(); ++i) drv.step();
    drv.check_all();
    // Layer 0 of a cache that cannot share (layer 1 has another magnitude) equals layer 0 of the
    // sharing one, byte for byte, for the same appends.
    PagedCache c(separate, Device::cpu()), d(shared, Device::cpu());
    std::mt19937_64 rng(9);
    const SeqId sc = c.create(), sd = d.create();
    std::vector<int32_t> pos(29);
    for (int32_t i = 0; i < 29; ++i) pos[i] = 1000 + 3 * i;
    Source k = make_source(rng, 2, 29, 2, 64, DType::F16, Device::cpu(), false);
    Source v = make_source(rng, 2, 29, 2, 64, DType::F16, Device::cpu(), false);
    c.append(sc, pos, k.tensor, v.tensor);
    d.append(sd, pos, k.tensor, v.tensor);
    EXPECT_EQ(download(c.k_pool(0).data), download(d.k_pool(0).data)) << kv_format_name(f);
    if (kv_format_has_scales(f)) {
      EXPECT_EQ(download(c.k_pool(0).scales), download(d.k_pool(0).scales));
    }
  }
}

}  // namespace
