// PagedCache reservations: tickets are opaque and store() refuses stale, foreign, forged and
// empty ones (nothing changed); reserved cells that a layer has not stored yet read as zeros,
// never as the K/V of the sequence that held the block before; can_fit / blocks_needed agree
// with what reserve() takes, and change nothing.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "paged_configs.hpp"
#include "paged_model.hpp"
#include "paged_ticket_access.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

std::vector<int32_t> iota_positions(int32_t first, int32_t n) {
  std::vector<int32_t> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

struct Rows {
  Source k, v;
};
Rows rows(const PagedCache& c, int32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const PagedCacheConfig& cfg = c.config();
  Rows r;
  r.k = make_source(rng, 1, n, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), true);
  r.v = make_source(rng, 1, n, cfg.n_kv_heads, cfg.v_head_dim, DType::F32, c.device(), true);
  return r;
}

// store() must throw InvalidArgument with `what` in the message and leave the cache as it was.
template <class F>
void expect_refused(PagedCache& c, F&& call, const char* what) {
  const Snapshot before = snapshot(c);
  try {
    call();
    ADD_FAILURE() << "accepted: " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "want \"" << what << "\", got " << e.what();
  }
  EXPECT_TRUE(snapshot(c) == before) << "a refused store changed the cache: " << what;
}

TEST(PagedTicket, StoreRefusesStaleForeignForgedAndEmptyTickets) {
  PagedCache c(small_config(KvFormat::F16, RopeMode::RopeStored, 4, 16), Device::cpu());
  PagedCache other(small_config(KvFormat::F16, RopeMode::RopeStored, 4, 16), Device::cpu());
  const SeqId a = c.create(), b = c.create();
  other.create();
  const Rows r3 = rows(c, 3, 1);
  AppendTicket t = c.reserve(a, iota_positions(0, 3));
  EXPECT_EQ(t.n_tokens(), 3);
  c.store(t, 0, r3.k.tensor, r3.v.tensor);

  expect_refused(c, [&] { c.store(AppendTicket{}, 0, r3.k.tensor, r3.v.tensor); }, "holds no reservation");
  AppendTicket foreign = other.reserve(SeqId{0}, iota_positions(0, 3));
  expect_refused(c, [&] { c.store(foreign, 0, r3.k.tensor, r3.v.tensor); }, "another cache");

  // Forged: every field edited on its own.
  auto forged = [&](auto&& edit, const char* what) {
    AppendTicket f = c.reserve(b, iota_positions(static_cast<int32_t>(c.info(b).n_live) + 100, 3));
    edit(f);
    expect_refused(c, [&] { c.store(f, 0, r3.k.tensor, r3.v.tensor); }, what);
  };
  const Rows r64 = rows(c, 64, 2);
  forged([](AppendTicket& f) { AppendTicketAccess::n_tokens(f) = 64; }, "altered");  // would read past the slots
  forged([](AppendTicket& f) { AppendTicketAccess::counts(f)[0] = 2; }, "altered");
  forged([&](AppendTicket& f) { AppendTicketAccess::seqs(f)[0] = a; }, "altered");  // would write into a's cells
  forged([](AppendTicket& f) { ++AppendTicketAccess::versions(f)[0]; }, "altered");
  forged([&](AppendTicket& f) { AppendTicketAccess::slots(f) = Buffer(12, Device::cpu()); }, "altered");
  forged([&](AppendTicket& f) { AppendTicketAccess::owner(f) = 12345; }, "another cache");
  // n_tokens = 64 on a 64-row source: the shape check alone would pass.
  {
    AppendTicket f = c.reserve(b, iota_positions(c.info(b).last_position + 1, 3));
    AppendTicketAccess::n_tokens(f) = 64;
    expect_refused(c, [&] { c.store(f, 0, r64.k.tensor, r64.v.tensor); }, "altered");
  }

  // Stale: the sequence changed (truncate, another reserve, fork, erase) since reserve().
  AppendTicket s1 = c.reserve(a, iota_positions(3, 2));
  const Rows r2 = rows(c, 2, 3);
  c.truncate(a, 4);
  expect_refused(c, [&] { c.store(s1, 0, r2.k.tensor, r2.v.tensor); }, "stale");
  AppendTicket s2 = c.reserve(a, iota_positions(10, 2));
  AppendTicket s3 = c.reserve(a, iota_positions(12, 2));
  expect_refused(c, [&] { c.store(s2, 0, r2.k.tensor, r2.v.tensor); }, "stale");
  c.store(s3, 1, r2.k.tensor, r2.v.tensor);
  c.fork(a);
  expect_refused(c, [&] { c.store(s3, 0, r2.k.tensor, r2.v.tensor); }, "stale");
  AppendTicket s4 = c.reserve(b, iota_positions(1000, 2));
  c.erase(b);
  expect_refused(c, [&] { c.store(s4, 0, r2.k.tensor, r2.v.tensor); }, "stale");

  // Moved from: the moved-to ticket works, the moved-from one holds nothing.
  AppendTicket m1 = c.reserve(a, iota_positions(20, 2));
  AppendTicket m2 = std::move(m1);
  expect_refused(c, [&] { c.store(m1, 0, r2.k.tensor, r2.v.tensor); }, "holds no reservation");  // NOLINT(bugprone-use-after-move)
  c.store(m2, 0, r2.k.tensor, r2.v.tensor);

  // A failed reserve into a reused ticket leaves it holding nothing.
  AppendTicket reuse = c.reserve(a, iota_positions(30, 1));
  const SeqId ids[1] = {a};
  const int32_t counts[1] = {1};
  const int32_t bad[1] = {-5};
  EXPECT_THROW(c.reserve(reuse, ids, counts, bad), Error);
  const Rows r1 = rows(c, 1, 4);
  expect_refused(c, [&] { c.store(reuse, 0, r1.k.tensor, r1.v.tensor); }, "holds no reservation");
}

TEST(PagedTicket, DecodeLoopReusesTheTicketsBuffers) {
  PagedCache c(small_config(KvFormat::F16, RopeMode::RopeStored, 4, 16), Device::cpu());
  const SeqId a = c.create(), b = c.create();
  const SeqId ids[2] = {a, b};
  const int32_t counts[2] = {1, 1};
  const Rows r = rows(c, 2, 5);
  AppendTicket t;
  const void* first = nullptr;
  for (int32_t step = 0; step < 10; ++step) {
    const int32_t pos[2] = {step, step};
    c.reserve(t, ids, counts, pos);
    if (step == 0) first = t.slot_mapping().data();
    EXPECT_EQ(t.slot_mapping().data(), first) << "step " << step << " reallocated the ticket's slots";
    for (int32_t l = 0; l < 2; ++l) c.store(t, l, r.k.tensor, r.v.tensor);
  }
  EXPECT_EQ(c.info(a).n_live, 10);
}

// A block freed by one sequence and reserved by another reads as zeros in every layer not yet
// stored, on both RoPE modes and every format, also when the reserve copies a shared tail.
TEST(PagedTicket, UnstoredCellsNeverShowAnotherSequencesData) {
  for (KvFormat f : kAllFormats)
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
      SCOPED_TRACE(std::string(kv_format_name(f)) + (mode == RopeMode::RopeStored ? " stored" : " on read"));
      PagedCache c(small_config(f, mode, 4, 6), Device::cpu());
      const PagedCacheConfig& cfg = c.config();
      std::mt19937_64 rng(7);
      // Sequence `old` fills every block with non-zero K/V, then goes.
      const SeqId old = c.create();
      const int32_t n_all = cfg.num_blocks * cfg.block_size;
      Source k = make_source(rng, cfg.n_layers, n_all, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), false);
      Source v = cfg.v_head_dim ? make_source(rng, cfg.n_layers, n_all, cfg.n_kv_heads, cfg.v_head_dim, DType::F32,
                                              c.device(), false)
                                : Source{};
      c.append(old, iota_positions(0, n_all), k.tensor, v.tensor);
      c.erase(old);
      // A new sequence reserves 6 tokens and stores layer 0; a fork of it then reserves 3 more
      // (its shared tail is copied) and stores nothing.
      const SeqId s = c.create();
      AppendTicket t = c.reserve(s, iota_positions(0, 6));
      const Source k0 = make_source(rng, 1, 6, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), true);
      const Source v0 = cfg.v_head_dim ? make_source(rng, 1, 6, cfg.n_kv_heads, cfg.v_head_dim, DType::F32, c.device(), true)
                                       : Source{};
      c.store(t, 0, k0.tensor, v0.tensor);
      const SeqId g = c.fork(s);
      AppendTicket tg = c.reserve(g, iota_positions(6, 3));
      EXPECT_EQ(tg.n_tokens(), 3);
      const size_t H = static_cast<size_t>(cfg.n_kv_heads), D = static_cast<size_t>(cfg.head_dim),
                   DV = static_cast<size_t>(cfg.v_head_dim);
      for (int32_t layer = 0; layer < cfg.n_layers; ++layer)
        for (SeqId id : {s, g}) {
          const PagedReadBack rb = c.read(id, layer);
          ASSERT_EQ(rb.positions.size(), id == s ? 6u : 9u);
          const size_t first = layer == 0 ? 6 : 0;  // tokens not stored in this layer
          for (size_t i = first * H * D; i < rb.k.size(); ++i)
            ASSERT_EQ(rb.k[i], 0.0f) << "seq " << id << " layer " << layer << ": K of another sequence at " << i;
          for (size_t i = first * H * DV; i < rb.v.size(); ++i)
            ASSERT_EQ(rb.v[i], 0.0f) << "seq " << id << " layer " << layer << ": V of another sequence at " << i;
        }
    }
}

TEST(PagedTicket, CanFitAgreesWithReserveAndChangesNothing) {
  for (int32_t na = 0; na <= 26; ++na)
    for (int32_t nb : {0, 1, 2, 3, 9}) {
      // a: 6 tokens in blocks 0, 1 (2 cells in the tail); b: a fork sharing both, so the first
      // new token of either copies the tail.
      PagedCache c(small_config(KvFormat::F16, RopeMode::RopeOnRead, 4, 8), Device::cpu());
      const SeqId a = c.create();
      AppendTicket t = c.reserve(a, iota_positions(0, 6));
      const SeqId b = c.fork(a);
      const SeqId ids[2] = {a, b};
      const int32_t counts[2] = {na, nb};
      const std::string before = c.debug_state();
      const int64_t need = c.blocks_needed(ids, counts);
      const bool fits = c.can_fit(ids, counts);
      EXPECT_EQ(c.debug_state(), before);
      // New blocks, plus one copy of the shared tail: the second appender holds it alone by then.
      auto blocks = [](int32_t n) { return n == 0 ? 0 : (6 + n + 3) / 4 - 2; };
      EXPECT_EQ(need, blocks(na) + blocks(nb) + (na + nb > 0 ? 1 : 0)) << na << " " << nb;
      EXPECT_EQ(fits, need <= 6) << na << " " << nb;
      std::vector<int32_t> pos = iota_positions(6, na), pb = iota_positions(6, nb);
      pos.insert(pos.end(), pb.begin(), pb.end());
      try {
        c.reserve(t, ids, counts, pos);
        EXPECT_TRUE(fits) << na << " " << nb;
        EXPECT_EQ(c.stats().blocks_free, 6 - need);
      } catch (const Error& e) {
        EXPECT_FALSE(fits) << e.what();
        EXPECT_EQ(e.code(), ErrorCode::OutOfMemory);
        EXPECT_EQ(c.debug_state(), before);
      }
    }
  PagedCache c(small_config(KvFormat::F16, RopeMode::RopeOnRead, 4, 8), Device::cpu());
  const SeqId a = c.create();
  EXPECT_TRUE(c.can_fit(a, 0));
  EXPECT_TRUE(c.can_fit(a, 32));
  EXPECT_FALSE(c.can_fit(a, 33));
  EXPECT_THROW(c.can_fit(SeqId{999}, 1), Error);
  EXPECT_THROW(c.can_fit(a, -1), Error);
  const SeqId dup[2] = {a, a};
  const int32_t ones[2] = {1, 1};
  EXPECT_THROW(c.blocks_needed(dup, ones), Error);
}

}  // namespace
