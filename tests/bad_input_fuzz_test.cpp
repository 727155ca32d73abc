// Randomized bad-input test of both caches (PagedCache also in MLA's shared-latent layout).
// Random operation sequences mix valid calls with invalid ones: out-of-range enums in configs, forged, foreign, stale and empty tickets,
// counts and positions that overflow, unknown ids and layers, moved-from caches, tensors
// of the wrong shape or with overflowing extents, duplicate block ids, non-finite RoPE
// parameters. Every invalid call must throw kvcore::Error and leave the cache unchanged:
//   PagedCache: the metadata text (debug_state()), every pool byte, positions and validity;
//     its valid calls (the driver of tests/paged_model.hpp) are read back against the
//     dense f64 model.
//   Dsv4Cache: one cache gets every call, a twin only the valid ones; after each invalid
//     call the metadata text and the reads of the touched sequence are unchanged, and the
//     two caches agree bit for bit on every read throughout.
// Sized to run in a few seconds, also under ASan/UBSan.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4_test_util.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "paged_configs.hpp"
#include "paged_model.hpp"
#include "paged_ticket_access.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();

// ---- PagedCache ------------------------------------------------------------------------------

struct PagedFuzz {
  PagedCache cache;
  PagedCache other;  // a second cache: its tickets are foreign to `cache`
  Driver drv;
  std::mt19937_64 rng;
  int64_t refused = 0;

  PagedFuzz(const PagedCacheConfig& cfg, uint64_t seed)
      : cache(cfg, Device::cpu()), other(cfg, Device::cpu()), drv({&cache}, seed), rng(seed ^ 0x5bd1e995u) {
    drv.read_prob = 0.1;
    drv.offsets_prob = 0.05;
    other.create();
  }

  int32_t rand(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  const PagedCacheConfig& cfg() const { return cache.config(); }

  // `call` must throw kvcore::Error (with `code`) and leave every byte of the cache as it was.
  template <class F>
  void refused_call(const std::string& what, F&& call, ErrorCode code = ErrorCode::InvalidArgument) {
    const Snapshot before = snapshot(cache);
    try {
      call();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << what << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": threw something other than kvcore::Error: " << e.what();
    }
    if (!(snapshot(cache) == before)) ADD_FAILURE() << "a refused call changed the cache: " << what;
    ++refused;
  }

  SeqId live_seq() { return drv.model.empty() ? SeqId{-1} : drv.pick(); }
  SeqId bad_id() { return coin(0.5) ? SeqId{1000000} + rand(0, 99) : SeqId{-1} - rand(0, 99); }

  // A valid reserve of 1-4 tokens for `s`, every layer stored, the model told. Returns false
  // (nothing done) when the pool lacks the blocks.
  bool reserve_and_store(SeqId s, AppendTicket& t) {
    const int32_t n = rand(1, 4);
    if (!cache.can_fit(s, n)) return false;
    const std::vector<int32_t> pos = drv.next_positions(drv.model[s], n);
    t = cache.reserve(s, pos);
    const int32_t L = cfg().n_layers, H = cfg().n_kv_heads, D = cfg().head_dim, DV = stored_v_width(cfg());
    std::vector<std::vector<double>> kv(L), vv(L);
    for (int32_t l = 0; l < L; ++l) {
      Source k = make_source(rng, 1, n, H, D, DType::F32, Device::cpu(), true);
      Source v = DV ? make_source(rng, 1, n, H, DV, DType::F32, Device::cpu(), true) : Source{};
      cache.store(t, l, k.tensor, v.tensor);
      kv[l] = k.values[0];
      if (DV) vv[l] = v.values[0];
    }
    for (int32_t j = 0; j < n; ++j) {
      RefToken tok;
      tok.pos = pos[j];
      tok.angle = std::abs(static_cast<double>(tok.pos));
      for (int32_t l = 0; l < L; ++l) {
        tok.k.emplace_back(kv[l].begin() + static_cast<int64_t>(j) * H * D, kv[l].begin() + static_cast<int64_t>(j + 1) * H * D);
        if (DV) tok.v.emplace_back(vv[l].begin() + static_cast<int64_t>(j) * H * DV, vv[l].begin() + static_cast<int64_t>(j + 1) * H * DV);
      }
      v_from_latent(cfg(), tok);
      drv.model[s].push_back(std::move(tok));
    }
    return true;
  }

  // Rows of the right shape for a ticket of n tokens (the ticket check must be what refuses).
  std::pair<Source, Source> rows_for(int32_t n) {
    Source k = make_source(rng, 1, std::max(n, 0), cfg().n_kv_heads, cfg().head_dim, DType::F32, Device::cpu(), true);
    const int32_t DV = stored_v_width(cfg());
    Source v = DV ? make_source(rng, 1, std::max(n, 0), cfg().n_kv_heads, DV, DType::F32, Device::cpu(), true) : Source{};
    return {std::move(k), std::move(v)};
  }

  void bad_tickets() {
    const SeqId s = live_seq();
    if (s < 0) return;
    AppendTicket t;
    if (!reserve_and_store(s, t)) return;
    const int32_t n = t.n_tokens(), layer = rand(0, cfg().n_layers - 1);
    auto [k, v] = rows_for(n);
    // Forged: one field edited, then put back (the ticket stays valid).
    switch (rand(0, 6)) {
      case 0: {
        const int32_t keep = AppendTicketAccess::n_tokens(t);
        AppendTicketAccess::n_tokens(t) = coin(0.5) ? keep + rand(1, 1000) : -rand(1, 5);
        auto [k2, v2] = rows_for(AppendTicketAccess::n_tokens(t));
        refused_call("forged n_tokens", [&] { cache.store(t, layer, k2.tensor, v2.tensor); });
        AppendTicketAccess::n_tokens(t) = keep;
        break;
      }
      case 1: {
        const SeqId keep = AppendTicketAccess::seqs(t)[0];
        AppendTicketAccess::seqs(t)[0] = live_seq();  // maybe another sequence's cells
        if (AppendTicketAccess::seqs(t)[0] == keep) AppendTicketAccess::seqs(t)[0] = bad_id();
        refused_call("forged sequence id", [&] { cache.store(t, layer, k.tensor, v.tensor); });
        AppendTicketAccess::seqs(t)[0] = keep;
        break;
      }
      case 2: {
        AppendTicketAccess::versions(t)[0] += 1 + static_cast<uint64_t>(rand(0, 5));
        refused_call("forged version", [&] { cache.store(t, layer, k.tensor, v.tensor); });
        break;
      }
      case 3: {
        AppendTicketAccess::counts(t)[0] += rand(1, 3);
        refused_call("forged count", [&] { cache.store(t, layer, k.tensor, v.tensor); });
        break;
      }
      case 4: {
        AppendTicketAccess::slots(t) = Buffer(static_cast<size_t>(n) * 4, Device::cpu());
        refused_call("forged slot buffer", [&] { cache.store(t, layer, k.tensor, v.tensor); });
        break;
      }
      case 5: {
        AppendTicketAccess::stamp(t) ^= 1;
        refused_call("forged stamp", [&] { cache.store(t, layer, k.tensor, v.tensor); });
        break;
      }
      default: {
        AppendTicket moved = std::move(t);
        refused_call("moved-from ticket", [&] { cache.store(t, layer, k.tensor, v.tensor); });  // NOLINT(bugprone-use-after-move)
        t = std::move(moved);
        break;
      }
    }
    // Foreign: issued by the other cache.
    {
      const std::vector<int32_t> pos{other.info(0).last_position + 1};
      AppendTicket f = other.reserve(SeqId{0}, pos);
      auto [k1, v1] = rows_for(1);
      refused_call("foreign ticket", [&] { cache.store(f, layer, k1.tensor, v1.tensor); });
      if (other.info(0).n_live > 40) other.truncate(0, 0);
    }
    // Stale: the sequence changes (a fork: the model copies it), then the ticket is refused.
    if (drv.model.size() < 8) {
      const SeqId f = cache.fork(s);
      drv.model[f] = drv.model[s];
      refused_call("stale ticket", [&] { cache.store(t, layer, k.tensor, v.tensor); });
    }
    refused_call("empty ticket", [&] { cache.store(AppendTicket{}, layer, k.tensor, v.tensor); });
  }

  void bad_ids_and_layers() {
    const SeqId bad = bad_id();
    const std::vector<int32_t> one{0};
    switch (rand(0, 11)) {
      case 0: refused_call("shift of an unknown id", [&] { cache.shift(bad, 0, 1); }); break;
      case 1: refused_call("truncate of an unknown id", [&] { cache.truncate(bad, 0); }); break;
      case 2: refused_call("erase of an unknown id", [&] { cache.erase(bad); }); break;
      case 3: refused_call("fork of an unknown id", [&] { cache.fork(bad); }); break;
      case 4: refused_call("info of an unknown id", [&] { cache.info(bad); }); break;
      case 5: refused_call("reserve for an unknown id", [&] { cache.reserve(bad, one); }); break;
      case 6: refused_call("remove_positions of an unknown id", [&] { cache.remove_positions(bad, 0, 1); }); break;
      case 7: refused_call("add_positions of an unknown id", [&] { cache.add_positions(bad, 0, 1, 1); }); break;
      case 8: refused_call("can_fit of an unknown id", [&] { cache.can_fit(bad, 1); }); break;
      case 9: {
        const SeqId s = live_seq();
        if (s < 0) return;
        const int32_t layer = coin(0.5) ? -rand(1, 3) : cfg().n_layers + rand(0, 3);
        refused_call("read of a bad layer", [&] { cache.read(s, layer); });
        break;
      }
      case 10: {
        const int32_t layer = coin(0.5) ? -1 : cfg().n_layers;
        refused_call("k_pool of a bad layer", [&] { cache.k_pool(layer); });
        refused_call("v_pool of a bad layer", [&] { cache.v_pool(layer); });
        refused_call("rope_table of a bad layer", [&] { cache.rope_table(layer); });
        break;
      }
      default: {
        const SeqId s = live_seq();
        if (s < 0) return;
        AppendTicket t;
        if (!reserve_and_store(s, t)) return;
        auto [k, v] = rows_for(t.n_tokens());
        const int32_t layer = coin(0.5) ? -1 : cfg().n_layers + rand(0, 2);
        refused_call("store into a bad layer", [&] { cache.store(t, layer, k.tensor, v.tensor); });
      }
    }
  }

  void bad_counts() {
    const SeqId s = live_seq();
    if (s < 0) return;
    const int32_t n = cache.info(s).n_live;
    switch (rand(0, 12)) {
      case 0: refused_call("shift n_keep + n_discard overflows", [&] { cache.shift(s, kI32Max, kI32Max); }); break;
      case 1: refused_call("shift past the end", [&] { cache.shift(s, n, rand(1, 5)); }); break;
      case 2: refused_call("negative shift", [&] { cache.shift(s, -rand(1, 5), 1); }); break;
      case 3: refused_call("truncate past the end", [&] { cache.truncate(s, n + rand(1, 5)); }); break;
      case 4: refused_call("negative truncate", [&] { cache.truncate(s, -rand(1, 5)); }); break;
      case 5: {
        const SeqId ids[2] = {s, s};
        const int32_t counts[2] = {1, 1};
        const int32_t pos[2] = {kI32Max - 2, kI32Max - 1};
        refused_call("reserve with a repeated id", [&] { cache.reserve(ids, counts, pos); });
        refused_call("blocks_needed with a repeated id", [&] { cache.blocks_needed(ids, counts); });
        break;
      }
      case 6: {
        const SeqId ids[1] = {s};
        const int32_t counts[1] = {kI32Max};
        const int32_t pos[1] = {0};
        refused_call("reserve whose counts disagree with the positions", [&] { cache.reserve(ids, counts, pos); });
        const int32_t neg[1] = {-rand(1, 9)};
        refused_call("reserve with a negative count", [&] { cache.reserve(ids, neg, pos); });
        refused_call("can_fit with a negative count", [&] { cache.can_fit(s, neg[0]); });
        break;
      }
      case 7: {
        const std::vector<int32_t> pos{kI32Max};
        refused_call("reserve at position kPosEnd", [&] { cache.reserve(s, pos); });
        const std::vector<int32_t> neg{-rand(1, 9)};
        refused_call("reserve at a negative position", [&] { cache.reserve(s, neg); });
        break;
      }
      case 8: {
        if (n == 0) return;
        const int32_t last = cache.info(s).last_position;
        const std::vector<int32_t> pos{last - rand(0, 3)};
        refused_call("reserve at a position that does not increase", [&] { cache.reserve(s, pos); });
        break;
      }
      case 9: {
        if (n == 0) return;
        refused_call("add_positions overflowing", [&] { cache.add_positions(s, 0, PagedCache::kPosEnd, kI32Max); });
        refused_call("add_positions below zero", [&] { cache.add_positions(s, 0, PagedCache::kPosEnd, kI32Min); });
        break;
      }
      case 10: {
        if (n < 2) return;
        // Moving the last token to before the first breaks the order.
        const int32_t last = cache.info(s).last_position, first = drv.model[s].front().pos;
        refused_call("add_positions that reorders", [&] { cache.add_positions(s, last, PagedCache::kPosEnd, first - last - 1); });
        break;
      }
      case 11: {
        const int32_t p0 = rand(1, 50);
        refused_call("remove_positions with p1 < p0", [&] { cache.remove_positions(s, p0, p0 - rand(1, 5)); });
        refused_call("remove_positions with p0 < 0", [&] { cache.remove_positions(s, -rand(1, 5), 3); });
        break;
      }
      default: {
        refused_call("add_positions with p1 < p0", [&] { cache.add_positions(s, 10, 2, 1); });
      }
    }
  }

  void bad_tensors() {
    const SeqId s = live_seq();
    if (s < 0) return;
    const int32_t L = cfg().n_layers, H = cfg().n_kv_heads, D = cfg().head_dim, DV = stored_v_width(cfg());
    const int32_t n = rand(1, 3);
    const std::vector<int32_t> pos = drv.next_positions(drv.model[s], n);
    Source k = make_source(rng, L, n, H, D, DType::F32, Device::cpu(), false);
    Source v = DV ? make_source(rng, L, n, H, DV, DType::F32, Device::cpu(), false) : Source{};
    switch (rand(0, 4)) {
      case 0: {  // one token too many in k
        Source k2 = make_source(rng, L, n + 1, H, D, DType::F32, Device::cpu(), false);
        refused_call("append with k of the wrong token count", [&] { cache.append(s, pos, k2.tensor, v.tensor); });
        break;
      }
      case 1: {
        const TensorRef wrong(k.tensor.data(), DType::I32, Device::cpu(), {L, n, H, D});
        refused_call("append with an i32 k", [&] { cache.append(s, pos, wrong, v.tensor); });
        break;
      }
      case 2: {
        const TensorRef strided(k.tensor.data(), DType::F32, Device::cpu(), {L, n, H, D}, {static_cast<int64_t>(n) * H * D, H * D, D, 2});
        refused_call("append with a k whose last stride is not 1", [&] { cache.append(s, pos, strided, v.tensor); });
        break;
      }
      case 3: {  // extents whose element count or span overflows int64
        static float x = 0;
        refused_call("TensorRef with an overflowing element count", [&] {
          TensorRef t(&x, DType::F32, Device::cpu(), {int64_t{1} << 40, int64_t{1} << 40});
          cache.append(s, pos, t, v.tensor);
        });
        refused_call("TensorRef with an overflowing span", [&] {
          TensorRef t(&x, DType::F32, Device::cpu(), {4, 4}, {std::numeric_limits<int64_t>::max() / 2, 1});
          cache.append(s, pos, t, v.tensor);
        });
        break;
      }
      default: {
        if (cfg().v_from_k_latent) {  // V is K's latent: a V given beside K is refused
          Source v2 = make_source(rng, L, n, H, cfg().v_head_dim, DType::F32, Device::cpu(), false);
          refused_call("append with v into a shared-latent cache", [&] { cache.append(s, pos, k.tensor, v2.tensor); });
          return;
        }
        if (DV == 0) return;
        const TensorRef null_v(nullptr, DType::F32, Device::cpu(), {L, n, H, DV});
        refused_call("append with v without data", [&] { cache.append(s, pos, k.tensor, null_v); });
      }
    }
  }

  void bad_configs() {
    PagedCacheConfig c = cfg();
    switch (rand(0, 10)) {
      case 0: c.k_format = static_cast<KvFormat>(rand(5, 255)); break;
      case 1: c.v_format = static_cast<KvFormat>(rand(5, 255)); break;
      case 2: c.rope_mode = static_cast<RopeMode>(rand(2, 255)); break;
      case 3: c.rope[0].scaling = static_cast<RopeScaling>(rand(4, 255)); break;
      case 4: c.rope[0].slice = static_cast<RopeSlice>(rand(2, 255)); break;
      case 5: c.rope[0].pairing = static_cast<RopePairing>(rand(2, 255)); break;
      case 6: c.rope[0].theta = coin(0.5) ? std::nan("") : -1.0; break;
      case 7: c.rope[0].n_rot += 1; break;  // odd: pairs cannot form
      case 8: {
        c.rope[0].scaling = RopeScaling::Yarn;
        const int which = rand(0, 2);
        (which == 0 ? c.rope[0].beta_fast : which == 1 ? c.rope[0].beta_slow : c.rope[0].factor) =
            coin(0.5) ? std::numeric_limits<double>::infinity() : 0.0;
        break;
      }
      case 9:
        if (c.v_from_k_latent) {  // V must fit in the K row, and be a whole number of FP8 scale groups
          c.v_head_dim = coin(0.5) ? c.head_dim + rand(1, 64) : (c.k_format == KvFormat::Fp8 ? 64 * rand(1, 7) + rand(1, 63) : 0);
          break;
        }
        [[fallthrough]];
      default: c.num_blocks = -rand(0, 5); break;
    }
    refused_call("a bad config", [&] { PagedCache x(c, Device::cpu()); });
  }

  void moved_from() {
    PagedCache keep = std::move(cache);
    const SeqId s = drv.model.empty() ? SeqId{0} : drv.pick();
    auto expect_throw = [&](const char* what, auto&& call) {
      try {
        call();
        ADD_FAILURE() << "a moved-from cache accepted " << what;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      }
    };
    // NOLINTBEGIN(bugprone-use-after-move)
    switch (rand(0, 5)) {
      case 0: expect_throw("create", [&] { cache.create(); }); break;
      case 1: expect_throw("info", [&] { cache.info(s); }); break;
      case 2: expect_throw("shift", [&] { cache.shift(s, 0, 1); }); break;
      case 3: expect_throw("debug_state", [&] { cache.debug_state(); }); break;
      case 4: expect_throw("k_pool", [&] { cache.k_pool(0); }); break;
      default: expect_throw("prepare", [&] { cache.prepare(); }); break;
    }
    // NOLINTEND(bugprone-use-after-move)
    cache = std::move(keep);
    ++refused;
  }

  void bad_ops_on_pools() {
    const PagedStats st = cache.stats();
    if (st.blocks_used == 0) return;
    const SeqId s = live_seq();
    if (s < 0 || cache.info(s).n_blocks == 0) return;
    // Rotating a block twice would double-rotate it: duplicate block ids are refused.
    const SeqId ids[1] = {s};
    const std::vector<uint8_t> ind = download(cache.block_tables(ids, PagedPositions::Offsets).indices);
    int32_t b = 0;
    std::memcpy(&b, ind.data(), 4);
    std::vector<int32_t> blocks{b, b};
    std::vector<int32_t> delta(static_cast<size_t>(cfg().num_blocks) * cfg().block_size, 0);
    delta[static_cast<size_t>(b) * cfg().block_size] = 3;
    const TensorRef bl(blocks.data(), DType::I32, Device::cpu(), {2});
    const TensorRef dl(delta.data(), DType::I32, Device::cpu(), {cfg().num_blocks, cfg().block_size});
    const int32_t layer = rand(0, cfg().n_layers - 1);
    refused_call("kv_rotate_blocks with a repeated block",
                 [&] { kv_rotate_blocks(cache.k_pool(layer), bl, dl, cache.rope_table(layer)); });
    KvPool bad = cache.k_pool(layer);
    bad.format = static_cast<KvFormat>(rand(5, 200));
    const std::vector<int32_t> one{b};
    const TensorRef bl1(const_cast<int32_t*>(one.data()), DType::I32, Device::cpu(), {1});
    refused_call("kv_rotate_blocks on a pool with a bad format", [&] { kv_rotate_blocks(bad, bl1, dl, cache.rope_table(layer)); });
    math::RopeTable nan_table = cache.rope_table(layer);
    nan_table.freq[0] = std::nanf("");
    refused_call("kv_rotate_blocks with a non-finite frequency",
                 [&] { kv_rotate_blocks(cache.k_pool(layer), bl1, dl, nan_table); });
  }

  void bad_call() {
    switch (rand(0, 7)) {
      case 0: bad_tickets(); break;
      case 1: bad_ids_and_layers(); break;
      case 2: bad_counts(); break;
      case 3: bad_tensors(); break;
      case 4: bad_configs(); break;
      case 5: moved_from(); break;
      case 6: bad_ops_on_pools(); break;
      default: bad_counts(); break;
    }
  }
};

struct FuzzCase {
  KvFormat format;
  RopeMode mode;
  bool mla_shared = false;  // MLA's shared layout (mla_shared_config: V is K's latent, stores take K only)
};

class BadInputFuzzPaged : public ::testing::TestWithParam<FuzzCase> {};

TEST_P(BadInputFuzzPaged, InvalidCallsThrowAndChangeNothingValidOnesMatchTheModel) {
  const FuzzCase fc = GetParam();
  const int32_t block_size = fc.format == KvFormat::Dsv4Row ? 4 : 8;
  PagedFuzz fz(fc.mla_shared ? mla_shared_config(fc.format, fc.mode, block_size, 32)
                             : small_config(fc.format, fc.mode, block_size, fc.format == KvFormat::Dsv4Row ? 24 : 32),
               7000 + static_cast<int>(fc.format) * 10 + static_cast<int>(fc.mode) + (fc.mla_shared ? 500 : 0));
  constexpr int kSteps = 700;
  for (int i = 0; i < kSteps && !::testing::Test::HasFailure(); ++i) {
    if (fz.coin(0.4)) fz.bad_call();
    else fz.drv.step();
  }
  fz.drv.check_all();
  fz.drv.check_counts();
  EXPECT_GT(fz.refused, kSteps / 5);
  std::printf("[bad input fuzz] paged %s%s %s: %lld invalid calls refused, %lld driver ops\n", fc.mla_shared ? "mla shared " : "",
              std::string(kv_format_name(fc.format)).c_str(), fc.mode == RopeMode::RopeStored ? "rope-stored" : "rope-on-read",
              static_cast<long long>(fz.refused), static_cast<long long>(fz.drv.ops));
}

INSTANTIATE_TEST_SUITE_P(Formats, BadInputFuzzPaged,
                         ::testing::Values(FuzzCase{KvFormat::F16, RopeMode::RopeStored}, FuzzCase{KvFormat::Fp8, RopeMode::RopeOnRead},
                                           FuzzCase{KvFormat::BF16, RopeMode::RopeOnRead},
                                           FuzzCase{KvFormat::Dsv4Row, RopeMode::RopeStored},
                                           FuzzCase{KvFormat::Fp8, RopeMode::RopeStored, true},
                                           FuzzCase{KvFormat::BF16, RopeMode::RopeOnRead, true}),
                         [](const ::testing::TestParamInfo<FuzzCase>& i) {
                           return std::string(i.param.mla_shared ? "MlaShared_" : "") + std::string(kv_format_name(i.param.format)) +
                                  (i.param.mode == RopeMode::RopeStored ? "_RopeStored" : "_RopeOnRead");
                         });

// ---- Dsv4Cache ----------------------------------------------------------------------------------

using kvcore::testing::randn;

struct Dsv4Fuzz {
  Dsv4CacheConfig cfg;
  Dsv4Cache a, b;  // a: every call; b: the valid ones only
  std::vector<SeqId> live;
  std::mt19937_64 rng;
  int64_t refused = 0, appended = 0;

  static Dsv4CacheConfig make_config(Dsv4Quant q) {
    Dsv4CacheConfig c;
    c.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
    c.head_dim = 128;
    c.n_rot = 64;
    c.window = 8;
    c.csa_ratio = 4;
    c.hca_ratio = 8;
    c.index_heads = 4;
    c.index_dim = 64;
    c.index_topk = 4;
    c.max_context = 48;
    c.max_seqs = 3;
    c.quant = q;
    return c;
  }

  Dsv4Fuzz(Dsv4Quant q, uint64_t seed) : cfg(make_config(q)), a(cfg, Device::cpu()), b(cfg, Device::cpu()), rng(seed) {
    for (int32_t l = 1; l < 3; ++l) {
      const Dsv4Compressor c = cfg.compressor(cfg.layers[l]), ix = cfg.indexer();
      std::vector<float> ca = randn(static_cast<size_t>(c.ratio) * c.width(), 80 + l), cn = randn(c.head_dim, 90 + l, 0.2f);
      std::vector<float> ia = randn(static_cast<size_t>(ix.ratio) * ix.width(), 100 + l), in = randn(ix.head_dim, 110 + l, 0.2f);
      for (float& v : cn) v += 1;
      for (float& v : in) v += 1;
      using kvcore::testing::view;
      const Dsv4LayerWeights w{view(ca, {c.ratio, c.width()}), view(cn, {c.head_dim}), view(ia, {ix.ratio, ix.width()}),
                               view(in, {ix.head_dim})};
      a.set_weights(l, w);
      b.set_weights(l, w);
    }
  }

  int32_t rand(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  // Token data of (sequence, position, layer), whatever the chunking.
  struct Tokens {
    std::vector<float> kv, cc, cz, ic, iz;
    Dsv4TokenInputs in;
  };
  Tokens tokens(SeqId s, int32_t layer, int32_t p, int32_t n) const {
    Tokens t;
    const Dsv4LayerKind k = cfg.layers[layer];
    const int32_t wc = k == Dsv4LayerKind::Window ? 0 : cfg.compressor(k).width(), wi = 2 * cfg.index_dim;
    for (int32_t q = p; q < p + n; ++q) {
      const uint64_t seed = 9000 + 131 * static_cast<uint64_t>(s) + 31 * static_cast<uint64_t>(q) + static_cast<uint64_t>(layer);
      for (auto [vec, w, sd, sc] : {std::tuple{&t.kv, cfg.head_dim, seed, 2.0f}, std::tuple{&t.cc, wc, seed + 1, 1.0f},
                                    std::tuple{&t.cz, wc, seed + 2, 2.0f}, std::tuple{&t.ic, wi, seed + 3, 1.0f},
                                    std::tuple{&t.iz, wi, seed + 4, 2.0f}}) {
        const std::vector<float> r = randn(static_cast<size_t>(w), sd, sc);
        vec->insert(vec->end(), r.begin(), r.end());
      }
    }
    using kvcore::testing::view;
    t.in.kv = view(t.kv, {n, cfg.head_dim});
    if (wc) {
      t.in.comp_c = view(t.cc, {n, wc});
      t.in.comp_z = view(t.cz, {n, wc});
    }
    if (k == Dsv4LayerKind::CSA) {
      t.in.idx_c = view(t.ic, {n, wi});
      t.in.idx_z = view(t.iz, {n, wi});
    }
    return t;
  }

  // Everything a call could change for sequence s (bytes, as f32 reads), plus the metadata.
  std::vector<std::vector<float>> reads(Dsv4Cache& c, SeqId s) const {
    std::vector<std::vector<float>> r;
    for (int32_t l = 0; l < 3; ++l) {
      r.push_back(c.read_window(s, l));
      if (l == 0) continue;
      r.push_back(c.read_compressed(s, l));
      r.push_back(c.read_state(s, l, Dsv4State::CompressorKv));
      r.push_back(c.read_state(s, l, Dsv4State::CompressorScore));
      if (l == 1) {
        r.push_back(c.read_indexer(s, l));
        r.push_back(c.read_state(s, l, Dsv4State::IndexerKv));
        r.push_back(c.read_state(s, l, Dsv4State::IndexerScore));
      }
    }
    return r;
  }

  template <class F>
  void refused_call(const std::string& what, F&& call, ErrorCode code = ErrorCode::InvalidArgument) {
    const std::string meta = a.debug_state();
    const SeqId s = live.empty() ? SeqId{-1} : live[static_cast<size_t>(rand(0, static_cast<int32_t>(live.size()) - 1))];
    std::vector<std::vector<float>> before;
    if (s >= 0) before = reads(a, s);
    try {
      call();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << what << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": threw something other than kvcore::Error: " << e.what();
    }
    EXPECT_EQ(a.debug_state(), meta) << "a refused call changed the metadata: " << what;
    if (s >= 0 && reads(a, s) != before) ADD_FAILURE() << "a refused call changed sequence " << s << ": " << what;
    ++refused;
  }

  // ---- valid calls, on both caches ----
  void valid_call() {
    const int32_t r = rand(0, 99);
    if (live.empty() || (r < 10 && static_cast<int32_t>(live.size()) < cfg.max_seqs)) {
      const SeqId x = a.create(), y = b.create();
      EXPECT_EQ(x, y);
      live.push_back(x);
    } else if (r < 16) {
      const size_t i = static_cast<size_t>(rand(0, static_cast<int32_t>(live.size()) - 1));
      a.erase(live[i]);
      b.erase(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (r < 20) {
      const SeqId s = live[static_cast<size_t>(rand(0, static_cast<int32_t>(live.size()) - 1))];
      a.truncate(s, 0);
      b.truncate(s, 0);
    } else {
      const SeqId s = live[static_cast<size_t>(rand(0, static_cast<int32_t>(live.size()) - 1))];
      const int32_t len = a.length(s, 0), room = cfg.max_context - len;
      if (room <= 0) {
        a.truncate(s, 0);
        b.truncate(s, 0);
        return;
      }
      const int32_t n = std::min(room, coin(0.6) ? 1 : rand(2, 9));
      for (int32_t l = 0; l < 3; ++l) {
        const Tokens t = tokens(s, l, len, n);
        a.append(s, l, len, t.in);
        b.append(s, l, len, t.in);
      }
      appended += n;
    }
  }

  // ---- invalid calls, on `a` only ----
  void bad_call() {
    const SeqId s = live.empty() ? SeqId{0} : live[static_cast<size_t>(rand(0, static_cast<int32_t>(live.size()) - 1))];
    const bool has = !live.empty();
    const int32_t len = has ? a.length(s, 0) : 0;
    const int32_t layer = rand(0, 2);
    switch (rand(0, 13)) {
      case 0: {
        const SeqId bad = coin(0.5) ? SeqId{1000} + rand(0, 9) : SeqId{-1} - rand(0, 9);
        const Tokens t = tokens(0, layer, 0, 1);
        refused_call("append to an unknown id", [&] { a.append(bad, layer, 0, t.in); });
        refused_call("length of an unknown id", [&] { a.length(bad, 0); });
        refused_call("erase of an unknown id", [&] { a.erase(bad); });
        refused_call("truncate of an unknown id", [&] { a.truncate(bad, 0); });
        break;
      }
      case 1: {
        if (!has) return;
        const int32_t bad_layer = coin(0.5) ? -rand(1, 4) : 3 + rand(0, 4);
        refused_call("read of a bad layer", [&] { a.read_window(s, bad_layer); });
        const Tokens t = tokens(s, 0, len, 1);
        refused_call("append to a bad layer", [&] { a.append(s, bad_layer, len, t.in); });
        break;
      }
      case 2: {
        if (!has) return;
        const int32_t pos = coin(0.5) ? a.length(s, layer) + rand(1, 5) : a.length(s, layer) - rand(1, 5);
        const Tokens t = tokens(s, layer, std::max(pos, 0), 1);
        refused_call("append at a position that skips or repeats", [&] { a.append(s, layer, pos, t.in); });
        break;
      }
      case 3: {
        if (!has || layer == 0) return;
        Tokens t = tokens(s, layer, a.length(s, layer), 1);
        if (coin(0.5)) t.in.comp_c = TensorRef();
        else t.in.comp_z = kvcore::testing::view(t.kv, {1, cfg.head_dim / 2});
        refused_call("append with a missing or misshapen compressor input", [&] { a.append(s, layer, a.length(s, layer), t.in); });
        break;
      }
      case 4: {
        if (!has) return;
        const int32_t at = a.length(s, layer);
        const int32_t n = cfg.max_context - at + rand(1, 4);
        const Tokens t = tokens(s, layer, at, n);
        refused_call("append past max_context", [&] { a.append(s, layer, at, t.in); });
        break;
      }
      case 5: {
        if (!has) return;
        refused_call("shift n_keep + n_discard overflows", [&] { a.shift(s, kI32Max, kI32Max); });
        refused_call("shift with a negative count", [&] { a.shift(s, -1, 1); });
        if (len >= 2) refused_call("shift off the granule", [&] { a.shift(s, 1, 1); });  // granule 8: a cut inside a window
        break;
      }
      case 6: {
        if (!has) return;
        refused_call("truncate past the end", [&] { a.truncate(s, len + rand(1, 5)); });
        refused_call("negative truncate", [&] { a.truncate(s, -rand(1, 5)); });
        if (len >= 2) refused_call("truncate into the sequence", [&] { a.truncate(s, rand(1, len - 1)); }, ErrorCode::NotSupported);
        break;
      }
      case 7: {
        if (static_cast<int32_t>(live.size()) < cfg.max_seqs) return;
        refused_call("create with max_seqs live", [&] { a.create(); }, ErrorCode::OutOfMemory);
        break;
      }
      case 8: {
        if (!has) return;
        refused_call("state with a bad enum", [&] { a.state(s, 1, static_cast<Dsv4State>(rand(4, 255))); });
        refused_call("indexer state of a window layer", [&] { a.state(s, 0, Dsv4State::IndexerKv); });
        refused_call("indexer state of an HCA layer", [&] { a.state(s, 2, Dsv4State::IndexerScore); });
        break;
      }
      case 9: {
        if (!has) return;
        std::vector<float> q(static_cast<size_t>(cfg.index_heads) * cfg.index_dim), w(cfg.index_heads), sc(64);
        std::vector<int32_t> out(static_cast<size_t>(cfg.index_topk));
        using kvcore::testing::host_view;
        using kvcore::testing::view;
        const int32_t qpos = coin(0.5) ? a.length(s, 1) + rand(0, 3) : -rand(1, 3);
        refused_call("indexer_topk of a query not appended", [&] {
          a.indexer_topk(s, 1, view(q, {1, cfg.index_heads, cfg.index_dim}), view(w, {1, cfg.index_heads}), qpos,
                         view(sc, {1, 12}), host_view(out, DType::I32, {1, cfg.index_topk}));
        });
        refused_call("indexer_topk of a non-CSA layer", [&] {
          a.indexer_topk(s, 2, view(q, {1, cfg.index_heads, cfg.index_dim}), view(w, {1, cfg.index_heads}), 0,
                         view(sc, {1, 12}), host_view(out, DType::I32, {1, cfg.index_topk}));
        });
        break;
      }
      case 10: {
        std::vector<float> ape(7 * 3), norm(5);
        using kvcore::testing::view;
        refused_call("set_weights of the wrong shape", [&] { a.set_weights(1, {view(ape, {7, 3}), view(norm, {5}), {}, {}}); });
        refused_call("set_weights of a window layer", [&] { a.set_weights(0, {view(ape, {7, 3}), view(norm, {5}), {}, {}}); });
        break;
      }
      case 11: {
        Dsv4CacheConfig c = cfg;
        switch (rand(0, 6)) {
          case 0: c.layers[static_cast<size_t>(rand(0, 2))] = static_cast<Dsv4LayerKind>(rand(3, 255)); break;
          case 1: c.quant = static_cast<Dsv4Quant>(rand(2, 255)); break;
          case 2: c.n_rot = 63; break;
          case 3: c.eps = std::nanf(""); break;
          case 4: c.compressed_rope.theta = coin(0.5) ? std::nan("") : 0.5; break;
          case 5: c.max_context = coin(0.5) ? 0 : (1 << 24) + 1; break;
          default: c.compressed_rope.beta_slow = -1; break;
        }
        refused_call("a bad config", [&] { Dsv4Cache x(c, Device::cpu()); });
        break;
      }
      case 12: {  // a moved-from cache throws; the moved-to one holds everything
        Dsv4Cache keep = std::move(a);
        // NOLINTBEGIN(bugprone-use-after-move)
        for (auto& call : std::vector<std::function<void()>>{[&] { a.create(); }, [&] { a.length(s, 0); },
                                                             [&] { a.debug_state(); }, [&] { a.truncate(s, 0); }}) {
          try {
            call();
            ADD_FAILURE() << "a moved-from Dsv4Cache accepted a call";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
          }
        }
        // NOLINTEND(bugprone-use-after-move)
        a = std::move(keep);
        ++refused;
        break;
      }
      default: {
        if (!has) return;
        const Tokens t = tokens(s, layer, a.length(s, layer), 2);
        Dsv4TokenInputs in = t.in;
        in.kv = TensorRef(in.kv.data(), DType::F32, Device::cpu(), {2, cfg.head_dim}, {cfg.head_dim, 2});
        refused_call("append with a kv whose last stride is not 1", [&] { a.append(s, layer, a.length(s, layer), in); });
      }
    }
  }

  // The two caches agree on everything.
  void compare() {
    ASSERT_EQ(a.debug_state(), b.debug_state());
    for (SeqId s : live) EXPECT_TRUE(reads(a, s) == reads(b, s)) << "sequence " << s << " differs from its twin";
  }
};

class BadInputFuzzDsv4 : public ::testing::TestWithParam<Dsv4Quant> {};

TEST_P(BadInputFuzzDsv4, InvalidCallsThrowAndChangeNothing) {
  Dsv4Fuzz fz(GetParam(), GetParam() == Dsv4Quant::On ? 31 : 32);
  constexpr int kSteps = 500;
  for (int i = 0; i < kSteps && !::testing::Test::HasFailure(); ++i) {
    if (fz.coin(0.45)) fz.bad_call();
    else fz.valid_call();
    if (i % 25 == 0) fz.compare();
  }
  fz.compare();
  EXPECT_GT(fz.refused, kSteps / 5);
  EXPECT_GT(fz.appended, 100);
  std::printf("[bad input fuzz] dsv4 quant %s: %lld invalid calls refused, %lld tokens appended\n",
              GetParam() == Dsv4Quant::On ? "on" : "off", static_cast<long long>(fz.refused),
              static_cast<long long>(fz.appended));
}

INSTANTIATE_TEST_SUITE_P(Quant, BadInputFuzzDsv4, ::testing::Values(Dsv4Quant::On, Dsv4Quant::Off),
                         [](const ::testing::TestParamInfo<Dsv4Quant>& i) {
                           return std::string(i.param == Dsv4Quant::On ? "On" : "Off");
                         });

}  // namespace
