// PagedCache behaviours, one at a time: shift frees whole blocks, kills cut cells and
// never moves V; rope-on-read shifts move no pool byte at all; pending deltas rotate once;
// fork shares and copies the tail on the first write; block tables in CSR form; the strong
// guarantee for exhausted pools and bad arguments; stale tickets; position-range edits
// spell a context shift.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

std::vector<int32_t> iota_positions(int32_t first, int32_t n) {
  std::vector<int32_t> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

// Append n tokens (positions continuing the sequence) with random f32 data; returns the data.
Source append_random(PagedCache& c, SeqId id, int32_t n, std::mt19937_64& rng) {
  const PagedCacheConfig& cfg = c.config();
  const SeqInfo in = c.info(id);
  Source k = make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), false);
  Source v = cfg.v_head_dim ? make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.v_head_dim, DType::F32, c.device(), false)
                            : Source{};
  c.append(id, iota_positions(in.last_position + 1, n), k.tensor, v.tensor);
  return k;
}

std::vector<uint8_t> valid_of(const PagedCache& c) { return download(c.valid()); }

TEST(PagedCache, ShiftFreesWholeBlocksKillsCutCellsAndNeverMovesV) {
  for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
    PagedCache c(small_config(KvFormat::F16, mode, 4, 16), Device::cpu());
    std::mt19937_64 rng(1);
    const SeqId s = c.create();
    append_random(c, s, 22, rng);  // cells 0..21 in blocks 0..5 (the last holds 2)
    const Snapshot before = snapshot(c);
    c.shift(s, 2, 11);  // cut tokens 2..12: block 1 and 2 are wholly cut, 0 and 3 partly
    const PagedStats st = c.stats();
    EXPECT_EQ(st.blocks_used, 4);
    EXPECT_EQ(st.tokens_live, 11);
    EXPECT_EQ(st.tokens_dead, 3);  // cells 2, 3 of block 0 and cell 0 of block 3
    const SeqInfo in = c.info(s);
    EXPECT_EQ(in.n_live, 11);
    EXPECT_EQ(in.n_cells, 14);
    EXPECT_EQ(in.last_position, 21 - 11);
    const std::vector<uint8_t> valid = valid_of(c);
    const std::vector<uint8_t> want_block0 = {1, 1, 0, 0}, want_block3 = {0, 1, 1, 1};
    EXPECT_EQ(std::vector<uint8_t>(valid.begin(), valid.begin() + 4), want_block0);
    EXPECT_EQ(std::vector<uint8_t>(valid.begin() + 12, valid.begin() + 16), want_block3);
    // Blocks 1 and 2 went back to the free list (their cells are left as they were: no table lists them).
    const SeqId ids[1] = {s};
    const BlockTable csr = c.block_tables(ids);
    const std::vector<int32_t> table(csr.indices.data_as<const int32_t>(), csr.indices.data_as<const int32_t>() + 4);
    EXPECT_EQ(table, (std::vector<int32_t>{0, 3, 4, 5}));
    c.prepare();
    const Snapshot after = snapshot(c);
    // Pool arrays per layer: K data, V data (f16 has no scales).
    for (int32_t l = 0; l < 2; ++l) {
      EXPECT_EQ(after.arrays[2 * l + 1], before.arrays[2 * l + 1]) << "V moved (layer " << l << ")";
      if (mode == RopeMode::RopeOnRead) EXPECT_EQ(after.arrays[2 * l], before.arrays[2 * l]) << "K moved (layer " << l << ")";
      else EXPECT_NE(after.arrays[2 * l], before.arrays[2 * l]) << "K was not re-rotated (layer " << l << ")";
    }
    // Kept prefix: K bytes identical in both modes (tokens 0, 1 in block 0 cells 0, 1).
    const int64_t row_bytes = 2 * 64 * 2;  // 2 heads x 64 dims x f16
    EXPECT_EQ(0, std::memcmp(after.arrays[0].data(), before.arrays[0].data(), 2 * row_bytes));
  }
}

TEST(PagedCache, PendingDeltasRotateOnceNotOncePerShift) {
  // 64 shifts of 1 token each on an f16 rope-stored cache, read once at the end: the error must
  // stay that of about one extra rotation (context-shift.md: many small shifts, one rounding).
  PagedCacheConfig cfg = small_config(KvFormat::F16, RopeMode::RopeStored, 16, 32);
  cfg.n_layers = 1;
  cfg.rope = {RopeSpec::plain(64, 10000.0)};
  PagedCache c(cfg, Device::cpu());
  std::mt19937_64 rng(5);
  const SeqId s = c.create();
  Source k = append_random(c, s, 200, rng);
  for (int i = 0; i < 64; ++i) c.shift(s, 4, 1);
  EXPECT_GT(c.stats().cells_pending, 0);
  EXPECT_TRUE(c.needs_prepare());
  const PagedReadBack rb = c.read(s, 0);
  EXPECT_FALSE(c.needs_prepare());
  double worst = 0;
  std::vector<double> want(64);
  for (int32_t j = 4; j < 200 - 64; ++j) {
    const int32_t src = j + 64;  // token j now is the token written at index j + 64
    EXPECT_EQ(rb.positions[j], src - 64);
    for (int32_t h = 0; h < 2; ++h) {
      expected_k(k.values[0].data() + (src * 2 + h) * 64, 64, c.rope_table(0), rb.positions[j], want.data());
      double rowmax = 0;
      for (double x : want) rowmax = std::max(rowmax, std::abs(x));
      for (int32_t d = 0; d < 64; ++d) worst = std::max(worst, std::abs(rb.k[(j * 2 + h) * 64 + d] - want[d]) / rowmax);
    }
  }
  RecordProperty("f16_64_shifts_worst_rel", std::to_string(worst));
  EXPECT_LT(worst, 2.5 / 2048) << "64 pending shifts must cost about one rounding";
}

TEST(PagedCache, ForkSharesEveryBlockAndCopiesTheTailOnFirstWrite) {
  PagedCache c(small_config(KvFormat::Fp8, RopeMode::RopeStored, 4, 16), Device::cpu());
  std::mt19937_64 rng(2);
  const SeqId a = c.create();
  append_random(c, a, 10, rng);  // 3 blocks, tail holds 2
  const PagedReadBack a0 = c.read(a, 1);
  const SeqId b = c.fork(a);
  PagedStats st = c.stats();
  EXPECT_EQ(st.blocks_used, 3);
  EXPECT_EQ(st.blocks_shared, 3);
  append_random(c, b, 1, rng);  // first write into the shared tail: exactly one copy
  st = c.stats();
  EXPECT_EQ(st.blocks_used, 4);
  EXPECT_EQ(st.blocks_shared, 2);
  const PagedReadBack a1 = c.read(a, 1);
  EXPECT_EQ(a1.k, a0.k) << "the parent must not see the child's write";
  EXPECT_EQ(c.read(b, 1).k.size(), a0.k.size() + 2 * 64);
  append_random(c, a, 3, rng);  // the parent's tail is its own again: no copy, 1 new block
  EXPECT_EQ(c.stats().blocks_used, 5);
  c.erase(a);
  EXPECT_EQ(c.stats().blocks_used, 3);
  EXPECT_EQ(c.stats().blocks_shared, 0);
}

TEST(PagedCache, ShiftOfASharedSequenceCopiesOnlyTheBlocksItEdits) {
  PagedCache c(small_config(KvFormat::BF16, RopeMode::RopeOnRead, 4, 32), Device::cpu());
  std::mt19937_64 rng(4);
  const SeqId a = c.create();
  append_random(c, a, 24, rng);  // 6 full blocks
  const SeqId b = c.fork(a);
  const PagedReadBack before = c.read(a, 0);
  c.shift(b, 8, 8);  // blocks 0, 1 untouched (shared), 2, 3 dropped, 4, 5 edited: 2 copies
  const PagedStats st = c.stats();
  EXPECT_EQ(st.blocks_used, 8);
  EXPECT_EQ(st.blocks_shared, 2);  // blocks 0, 1; a alone holds 2..5 now, b its copies of 4, 5
  const PagedReadBack after = c.read(a, 0);
  EXPECT_EQ(after.k, before.k);
  EXPECT_EQ(after.positions, before.positions);
  const PagedReadBack rb = c.read(b, 0);
  ASSERT_EQ(rb.positions.size(), 16u);
  for (int32_t j = 0; j < 16; ++j) EXPECT_EQ(rb.positions[j], j);
}

TEST(PagedCache, TruncateRollsBackAndReusesCells) {
  PagedCache c(small_config(KvFormat::F32, RopeMode::RopeStored, 4, 16), Device::cpu());
  std::mt19937_64 rng(6);
  const SeqId s = c.create();
  append_random(c, s, 9, rng);
  const PagedReadBack r9 = c.read(s, 0);
  append_random(c, s, 5, rng);  // speculative tokens
  c.truncate(s, 9);             // rejected
  EXPECT_EQ(c.stats().blocks_used, 3);
  const PagedReadBack again = c.read(s, 0);
  EXPECT_EQ(again.k, r9.k);
  EXPECT_EQ(c.info(s).last_position, 8);
  c.truncate(s, 0);
  EXPECT_EQ(c.stats().blocks_used, 0);
  EXPECT_EQ(c.info(s).last_position, -1);
}

TEST(PagedCache, BlockTablesInCsrForm) {
  PagedCache c(small_config(KvFormat::F16, RopeMode::RopeOnRead, 4, 16), Device::cpu());
  std::mt19937_64 rng(3);
  const SeqId a = c.create(), e = c.create(), b = c.create();
  append_random(c, a, 6, rng);
  append_random(c, b, 8, rng);
  const SeqId ids[3] = {b, e, a};
  const BlockTable csr = c.block_tables(ids);
  const int32_t* indptr = csr.indptr.data_as<const int32_t>();
  const int32_t* last = csr.last_page_len.data_as<const int32_t>();
  const int32_t* idx = csr.indices.data_as<const int32_t>();
  EXPECT_EQ(std::vector<int32_t>(indptr, indptr + 4), (std::vector<int32_t>{0, 2, 2, 4}));
  EXPECT_EQ(last[0], 4);
  EXPECT_EQ(last[2], 2);
  // The contract's cell arithmetic finds every token's position.
  for (int32_t bi = 0; bi < 3; ++bi) {
    const int32_t cells = PagedLayout::seq_cells(indptr, last, bi, 4);
    for (int32_t j = 0; j < cells; ++j) {
      const int32_t block = idx[indptr[bi] + j / 4];
      EXPECT_EQ(c.positions().data_as<const int32_t>()[block * 4 + j % 4], j);
      EXPECT_EQ(c.valid().data_as<const uint8_t>()[block * 4 + j % 4], 1);
    }
  }
  const SeqId bad[1] = {99};
  EXPECT_THROW(c.block_tables(bad), Error);
}

TEST(PagedCache, FailingCallsLeaveEverythingByteIdentical) {
  PagedCache c(small_config(KvFormat::Fp8, RopeMode::RopeStored, 4, 8), Device::cpu());
  std::mt19937_64 rng(8);
  const SeqId a = c.create(), b = c.create(), d = c.create();
  append_random(c, a, 6, rng);
  append_random(c, b, 5, rng);
  const SeqId f = c.fork(a);
  c.shift(a, 1, 1);  // leave a pending delta around
  auto expect_unchanged = [&](ErrorCode code, auto&& call, const char* what) {
    const Snapshot before = snapshot(c);
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    }
    EXPECT_TRUE(snapshot(c) == before) << what;
  };
  // 8 blocks: a 2, b 2, f shares a's old blocks... Three sequences at once, the last one cannot fit.
  const SeqId ids[3] = {b, f, d};
  const int32_t counts[3] = {3, 1, 12};
  std::vector<int32_t> pos;
  for (int32_t i = 0; i < 3; ++i) pos.push_back(5 + i);
  pos.push_back(6);
  for (int32_t i = 0; i < 12; ++i) pos.push_back(i);
  expect_unchanged(ErrorCode::OutOfMemory, [&] { c.reserve(ids, counts, pos); }, "exhausted in the middle of a batch");
  Source k = make_source(rng, 2, 40, 2, 64, DType::F16, Device::cpu(), false);
  Source v = make_source(rng, 2, 40, 2, 64, DType::F16, Device::cpu(), false);
  expect_unchanged(ErrorCode::OutOfMemory, [&] { c.append(d, iota_positions(0, 40), k.tensor, v.tensor); }, "append too long");
  Source k1 = make_source(rng, 2, 2, 2, 64, DType::F16, Device::cpu(), false);
  Source v1 = make_source(rng, 2, 2, 2, 64, DType::F16, Device::cpu(), false);
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.append(b, std::vector<int32_t>{3, 4}, k1.tensor, v1.tensor); },
                   "positions going backwards");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.append(b, std::vector<int32_t>{7, 7}, k1.tensor, v1.tensor); },
                   "repeated position");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.append(b, std::vector<int32_t>{7}, k1.tensor, v1.tensor); },
                   "k of the wrong token count");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.append(b, std::vector<int32_t>{7, 8}, k1.tensor, TensorRef()); },
                   "missing v");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.append(42, std::vector<int32_t>{7, 8}, k1.tensor, v1.tensor); },
                   "unknown id");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.shift(a, 3, 3); }, "shift beyond the length");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.shift(a, -1, 1); }, "negative n_keep");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.truncate(b, 6); }, "truncate beyond the length");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.fork(77); }, "fork of an unknown id");
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.erase(77); }, "erase of an unknown id");
  const SeqId dup[2] = {b, b};
  const int32_t c2[2] = {1, 1};
  expect_unchanged(ErrorCode::InvalidArgument, [&] { c.reserve(dup, c2, std::vector<int32_t>{5, 6}); }, "duplicate ids");
  // A full pool: a shift of a shared sequence that needs copies runs out cleanly.
  const SeqId g = c.fork(b);
  while (c.stats().blocks_free > 0) append_random(c, d, 1, rng);
  expect_unchanged(ErrorCode::OutOfMemory, [&] { c.shift(g, 0, 1); }, "shift needing copies, pool full");
}

TEST(PagedCache, StaleTicketsAreRejected) {
  PagedCache c(small_config(KvFormat::F16, RopeMode::RopeStored, 4, 16), Device::cpu());
  std::mt19937_64 rng(9);
  const SeqId s = c.create();
  AppendTicket t = c.reserve(s, iota_positions(0, 3));
  Source k = make_source(rng, 1, 3, 2, 64, DType::F16, Device::cpu(), true);
  Source v = make_source(rng, 1, 3, 2, 64, DType::F16, Device::cpu(), true);
  c.store(t, 0, k.tensor, v.tensor);
  c.store(t, 1, k.tensor, v.tensor);
  EXPECT_THROW(c.store(t, 2, k.tensor, v.tensor), Error);  // no layer 2
  c.truncate(s, 2);
  EXPECT_THROW(c.store(t, 0, k.tensor, v.tensor), Error);
}

TEST(PagedCache, ConfigValidationNamesTheField) {
  PagedCacheConfig cfg = small_config(KvFormat::F16, RopeMode::RopeStored);
  cfg.num_blocks = 0;
  EXPECT_THROW(PagedCache(cfg, Device::cpu()), Error);
  cfg = small_config(KvFormat::Dsv4Row, RopeMode::RopeStored);
  cfg.v_head_dim = 64;
  EXPECT_THROW(PagedCache(cfg, Device::cpu()), Error);
  cfg = small_config(KvFormat::Dsv4Row, RopeMode::RopeStored);
  cfg.rope = {RopeSpec::plain(64, 1e4)};  // head slice: would rotate FP8 dims
  EXPECT_THROW(PagedCache(cfg, Device::cpu()), Error);
  cfg = small_config(KvFormat::F16, RopeMode::RopeStored);
  cfg.rope = {RopeSpec::plain(64, 1e4), RopeSpec::plain(64, 1e4), RopeSpec::plain(64, 1e4)};
  try {
    PagedCache c(cfg, Device::cpu());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PagedCacheConfig.rope"), std::string::npos) << e.what();
  }
}

}  // namespace

// llama.cpp's context shift spelled with position-range edits -- remove [n_keep, n_keep +
// n_discard), then move the later positions down by n_discard -- reads back the same as
// shift(n_keep, n_discard), on both RoPE modes (RopeStored: the same single rotation).
TEST(PagedCache, PositionRangeEditsSpellAShift) {
  for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
    PagedCache a(small_config(KvFormat::F16, mode, 4, 16), Device::cpu()), b(small_config(KvFormat::F16, mode, 4, 16), Device::cpu());
    std::mt19937_64 ra(5), rb(5);
    const SeqId sa = a.create(), sb = b.create();
    append_random(a, sa, 30, ra);
    append_random(b, sb, 30, rb);
    a.shift(sa, 4, 9);
    b.remove_positions(sb, 4, 13);
    b.add_positions(sb, 13, PagedCache::kPosEnd, -9);
    EXPECT_EQ(b.info(sb).n_live, 21);
    EXPECT_EQ(b.info(sb).last_position, 20);
    for (int32_t l = 0; l < 2; ++l) {
      const PagedReadBack x = a.read(sa, l), y = b.read(sb, l);
      EXPECT_EQ(x.positions, y.positions);
      EXPECT_EQ(x.k, y.k) << "layer " << l;
      EXPECT_EQ(x.v, y.v) << "layer " << l;
    }
    // A positive delta opens a gap; new tokens then continue after it.
    b.add_positions(sb, 10, PagedCache::kPosEnd, 100);
    EXPECT_EQ(b.info(sb).last_position, 120);
    EXPECT_THROW(b.reserve(sb, std::vector<int32_t>{50}), Error);  // positions must still increase
    append_random(b, sb, 2, rb);
    EXPECT_EQ(b.info(sb).last_position, 122);
    EXPECT_EQ(b.read(sb, 0).positions[10], 110);
  }
}
