// PagedCache::store_layers on the CPU: the same pool bytes as store() layer by layer for every
// format, both RoPE modes, per-layer RoPE tables and caches without V; K read back against a
// float64 rotation; bad inputs and stale tickets refused with nothing changed.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "paged_store_layers_util.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

PagedCacheConfig one_table(KvFormat f, RopeMode mode) {
  PagedCacheConfig c = small_config(f, mode, 8, 40);
  RopeSpec full = RopeSpec::plain(64, 10000.0);
  full.attention_factor = 1.25;
  c.rope = {full};
  c.n_layers = 3;
  return c;
}

TEST(PagedStoreLayers, SameBytesAsStorePerLayer) {
  std::vector<PagedCacheConfig> configs;
  for (KvFormat f : {KvFormat::F32, KvFormat::F16, KvFormat::BF16, KvFormat::Fp8})
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
      configs.push_back(one_table(f, m));
      configs.push_back(small_config(f, m, 8, 40));  // per-layer tables (a partial interleaved tail on layer 1)
    }
  configs.push_back(small_config(KvFormat::Dsv4Row, RopeMode::RopeStored, 8, 40));  // no V
  for (const PagedCacheConfig& cfg : configs) {
    const std::string what = std::string(kv_format_name(cfg.k_format)) +
                             (cfg.rope_mode == RopeMode::RopeStored ? " stored" : " on-read") + " (" +
                             std::to_string(cfg.rope.size()) + " tables)";
    PagedCache each(cfg, Device::cpu()), fused(cfg, Device::cpu());
    const std::vector<int32_t> decode = {1, 1, 1}, mixed = {3, 0, 9};
    drive_steps(each, false, 5, decode, 17);
    drive_steps(fused, true, 5, decode, 17);
    EXPECT_TRUE(snapshot(each) == snapshot(fused)) << what << ": decode steps";
    PagedCache each2(cfg, Device::cpu()), fused2(cfg, Device::cpu());
    drive_steps(each2, false, 3, mixed, 23);
    drive_steps(fused2, true, 3, mixed, 23);
    EXPECT_TRUE(snapshot(each2) == snapshot(fused2)) << what << ": mixed counts";
  }
}

TEST(PagedStoreLayers, KeysMatchF64Rotation) {
  for (KvFormat f : {KvFormat::F16, KvFormat::Fp8}) {
    const PagedCacheConfig cfg = one_table(f, RopeMode::RopeStored);
    PagedCache c(cfg, Device::cpu());
    const SeqId s = c.create();
    std::mt19937_64 rng(5);
    std::vector<int32_t> pos = {7, 4000, 4001, 65000};
    const int32_t n = static_cast<int32_t>(pos.size()), H = cfg.n_kv_heads, D = cfg.head_dim;
    AppendTicket t = c.reserve(s, pos);
    Source k = make_source(rng, cfg.n_layers, n, H, D, DType::F16, Device::cpu(), false);
    Source v = make_source(rng, cfg.n_layers, n, H, cfg.v_head_dim, DType::F16, Device::cpu(), false);
    c.store_layers(t, k.tensor, v.tensor);
    const double eps = f == KvFormat::Fp8 ? 1.0 / 16 : format_eps(f);
    for (int32_t l = 0; l < cfg.n_layers; ++l) {
      const PagedReadBack rb = c.read(s, l);
      std::vector<double> want(D);
      for (int32_t j = 0; j < n; ++j)
        for (int32_t h = 0; h < H; ++h) {
          expected_k(k.values[l].data() + (j * H + h) * D, D, c.rope_table(l), pos[j], want.data());
          double rowmax = 0;
          for (double x : want) rowmax = std::max(rowmax, std::abs(x));
          for (int32_t d = 0; d < D; ++d)
            ASSERT_LE(std::abs(rb.k[(j * H + h) * D + d] - want[d]), rowmax * (1.5 * eps + 2.4e-7 * 65000 + 1e-6))
                << kv_format_name(f) << " layer " << l << " token " << j << " head " << h << " dim " << d;
          const double* vrow = v.values[l].data() + (j * H + h) * cfg.v_head_dim;
          double vmax = 0;
          for (int32_t d = 0; d < cfg.v_head_dim; ++d) vmax = std::max(vmax, std::abs(vrow[d]));
          for (int32_t d = 0; d < cfg.v_head_dim; ++d)
            ASSERT_LE(std::abs(rb.v[(j * H + h) * cfg.v_head_dim + d] - vrow[d]), vmax * 1.5 * eps)
                << kv_format_name(f) << " V layer " << l << " token " << j << " head " << h << " dim " << d;
        }
    }
  }
}

TEST(PagedStoreLayers, BadInputsAndStaleTicketsChangeNothing) {
  const PagedCacheConfig cfg = one_table(KvFormat::Fp8, RopeMode::RopeStored);
  PagedCache c(cfg, Device::cpu());
  const SeqId s = c.create();
  std::mt19937_64 rng(3);
  const std::vector<int32_t> pos = {1, 2};
  AppendTicket t = c.reserve(s, pos);
  const int32_t H = cfg.n_kv_heads, D = cfg.head_dim;
  Source k = make_source(rng, cfg.n_layers, 2, H, D, DType::F16, Device::cpu(), false);
  Source v = make_source(rng, cfg.n_layers, 2, H, D, DType::F16, Device::cpu(), false);
  Source k_short = make_source(rng, cfg.n_layers - 1, 2, H, D, DType::F16, Device::cpu(), false);
  const Snapshot before = snapshot(c);
  auto expect_refused = [&](const std::function<void()>& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "accepted; wanted an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(snapshot(c) == before) << "a refused store_layers changed the cache (" << needle << ")";
  };
  expect_refused([&] { c.store_layers(t, k_short.tensor, v.tensor); }, "k");
  expect_refused([&] { c.store_layers(t, k.tensor, k_short.tensor); }, "v");
  expect_refused([&] { c.store_layers(t, k.tensor, TensorRef()); }, "v");
  expect_refused([&] { c.store_layers(AppendTicket(), k.tensor, v.tensor); }, "ticket");
  // A ticket made stale by a later reservation of its sequence.
  const std::vector<int32_t> pos2 = {3};
  AppendTicket later = c.reserve(s, pos2);
  const Snapshot after_reserve = snapshot(c);
  try {
    c.store_layers(t, k.tensor, v.tensor);
    ADD_FAILURE() << "a stale ticket was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
  EXPECT_TRUE(snapshot(c) == after_reserve);
}

}  // namespace
