// PagedCache position offsets (rope-on-read shifts edit the smaller side of the cut; the
// sequence's pos_offset says what to subtract from stored positions): several shifts with
// different n_keep, fork after a shift, truncate after a shift, read-back positions, the
// Offsets export against the materialized one, and a host timing of shift at 32k vs 128k
// tokens (the cost must not follow the context length).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

std::vector<int32_t> i32_of(const TensorRef& t) {
  const std::vector<uint8_t> b = download(t);
  std::vector<int32_t> v(b.size() / 4);
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

void append_n(PagedCache& c, SeqId id, int32_t n, std::mt19937_64& rng) {
  const PagedCacheConfig& cfg = c.config();
  const int32_t first = c.info(id).last_position + 1;
  std::vector<int32_t> pos(n);
  for (int32_t i = 0; i < n; ++i) pos[i] = first + i;
  Source k = make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), false);
  Source v = make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.v_head_dim, DType::F32, c.device(), false);
  c.append(id, pos, k.tensor, v.tensor);
}

// Token positions of `id` through the Offsets export (stored - pos_offset over live cells), and its offset.
std::vector<int32_t> exported_positions(PagedCache& c, SeqId id, int32_t* offset, PagedPositions how) {
  const SeqId ids[1] = {id};
  const BlockTable csr = c.block_tables(ids, how);
  const std::vector<int32_t> indptr = i32_of(csr.indptr), indices = i32_of(csr.indices), last = i32_of(csr.last_page_len),
                             off = i32_of(csr.pos_offset), pos = i32_of(c.positions());
  const std::vector<uint8_t> valid = download(c.valid());
  const int32_t bs = c.config().block_size;
  std::vector<int32_t> out;
  for (int32_t j = 0; j < PagedLayout::seq_cells(indptr.data(), last.data(), 0, bs); ++j) {
    const int64_t cell = static_cast<int64_t>(indices[j / bs]) * bs + j % bs;
    if (valid[cell]) out.push_back(pos[cell] - off[0]);
  }
  *offset = off[0];
  return out;
}

// A model sequence of positions: shift and check everything that exposes them.
struct Expect {
  std::vector<int32_t> pos;
  void append(int32_t n) {
    const int32_t first = pos.empty() ? 0 : pos.back() + 1;
    for (int32_t i = 0; i < n; ++i) pos.push_back(first + i);
  }
  void shift(int32_t keep, int32_t discard) {
    pos.erase(pos.begin() + keep, pos.begin() + keep + discard);
    for (size_t j = keep; j < pos.size(); ++j) pos[j] -= discard;
  }
};

void check_positions(PagedCache& c, SeqId id, const Expect& e, const char* what) {
  SCOPED_TRACE(what);
  int32_t off = -1;
  EXPECT_EQ(exported_positions(c, id, &off, PagedPositions::Offsets), e.pos);
  EXPECT_EQ(c.read(id, 0).positions, e.pos);
  EXPECT_EQ(c.info(id).last_position, e.pos.empty() ? -1 : e.pos.back());
}

PagedCacheConfig on_read_config(int32_t bs = 8, int32_t nb = 64) {
  PagedCacheConfig c = small_config(KvFormat::F16, RopeMode::RopeOnRead, bs, nb);
  return c;
}

TEST(PagedOffsets, SeveralShiftsWithDifferentNKeepMoveNoPoolByteAndKeepPositions) {
  PagedCache c(on_read_config(), Device::cpu());
  std::mt19937_64 rng(3);
  const SeqId s = c.create();
  Expect e;
  append_n(c, s, 300, rng);
  e.append(300);
  const Snapshot before = snapshot(c);
  // Small n_keep: the cells before the cut are raised and the offset grows.
  const int32_t plan[][2] = {{4, 30}, {4, 17}, {100, 20}, {200, 9}, {0, 5}, {37, 1}};
  int32_t expect_offset = 0;
  for (const auto& kd : plan) {
    const int32_t n_keep = kd[0], n_discard = kd[1];
    // Which side moves: the smaller one (counted in cells; here nothing else is dead near the cut).
    const bool raise = n_keep < static_cast<int32_t>(e.pos.size()) - n_keep - n_discard;
    c.shift(s, n_keep, n_discard);
    e.shift(n_keep, n_discard);
    if (raise) expect_offset += n_discard;
    check_positions(c, s, e, "after a shift");
    int32_t off = -1;
    exported_positions(c, s, &off, PagedPositions::Offsets);
    EXPECT_GE(off, 0);
    EXPECT_TRUE(c.needs_prepare() == (off != 0));
  }
  int32_t off = -1;
  exported_positions(c, s, &off, PagedPositions::Offsets);
  EXPECT_GT(off, 0) << "no shift raised the cells before its cut";
  // K and V pool bytes never moved (rope-on-read).
  const Snapshot after = snapshot(c);
  for (size_t i = 0; i + 2 < after.arrays.size(); ++i) EXPECT_EQ(after.arrays[i], before.arrays[i]) << "pool array " << i;
  // Materialized: the offset folds into the cells, the positions stay.
  EXPECT_EQ(exported_positions(c, s, &off, PagedPositions::Materialized), e.pos);
  EXPECT_EQ(off, 0);
  EXPECT_FALSE(c.needs_prepare());
  check_positions(c, s, e, "after the fold");
  // Appends continue from the token positions, and must increase.
  append_n(c, s, 13, rng);
  e.append(13);
  check_positions(c, s, e, "after an append");
  EXPECT_GE(expect_offset, 0);
}

TEST(PagedOffsets, AppendsAfterARaisingShiftUseTokenPositions) {
  PagedCache c(on_read_config(), Device::cpu());
  std::mt19937_64 rng(4);
  const SeqId s = c.create();
  Expect e;
  append_n(c, s, 100, rng);
  e.append(100);
  c.shift(s, 2, 40);
  e.shift(2, 40);
  int32_t off = -1;
  exported_positions(c, s, &off, PagedPositions::Offsets);
  EXPECT_EQ(off, 40);
  // A position that does not follow the last token fails cleanly (strict positions).
  const Snapshot before = snapshot(c);
  const int32_t bad[1] = {e.pos.back()};
  Source k = make_source(rng, 2, 1, 2, 64, DType::F32, Device::cpu(), false);
  Source v = make_source(rng, 2, 1, 2, 64, DType::F32, Device::cpu(), false);
  EXPECT_THROW(c.append(s, bad, k.tensor, v.tensor), Error);
  EXPECT_EQ(snapshot(c), before);
  append_n(c, s, 7, rng);
  e.append(7);
  check_positions(c, s, e, "appended after the shift");
}

TEST(PagedOffsets, ForkAfterShiftSharesTheOffsetAndLaterShiftsStayCorrect) {
  PagedCache c(on_read_config(8, 96), Device::cpu());
  std::mt19937_64 rng(5);
  const SeqId a = c.create();
  Expect ea;
  append_n(c, a, 150, rng);
  ea.append(150);
  c.shift(a, 3, 50);  // raises the 3 cells before the cut
  ea.shift(3, 50);
  const SeqId b = c.fork(a);
  Expect eb = ea;
  check_positions(c, b, eb, "fork");
  int32_t off_a = -1, off_b = -1;
  exported_positions(c, a, &off_a, PagedPositions::Offsets);
  exported_positions(c, b, &off_b, PagedPositions::Offsets);
  EXPECT_EQ(off_a, 50);
  EXPECT_EQ(off_b, 50);
  append_n(c, a, 5, rng);
  ea.append(5);
  append_n(c, b, 9, rng);
  eb.append(9);
  // a shares blocks with b: its shift lowers the cells after the cut, copying the shared ones.
  const int32_t used_before = c.stats().blocks_used;
  c.shift(a, 3, 10);
  ea.shift(3, 10);
  EXPECT_GE(c.stats().blocks_used, used_before - 2);
  check_positions(c, a, ea, "a after its second shift");
  check_positions(c, b, eb, "b untouched");
  c.shift(b, 60, 20);
  eb.shift(60, 20);
  check_positions(c, a, ea, "a after b's shift");
  check_positions(c, b, eb, "b after its shift");
  c.erase(a);
  c.shift(b, 1, 3);  // b alone now: may raise again
  eb.shift(1, 3);
  check_positions(c, b, eb, "b alone");
  c.prepare();
  check_positions(c, b, eb, "b after the fold");
}

TEST(PagedOffsets, TruncateAfterShiftKeepsPositions) {
  PagedCache c(on_read_config(), Device::cpu());
  std::mt19937_64 rng(6);
  const SeqId s = c.create();
  Expect e;
  append_n(c, s, 120, rng);
  e.append(120);
  c.shift(s, 5, 33);
  e.shift(5, 33);
  c.truncate(s, 60);
  e.pos.resize(60);
  check_positions(c, s, e, "truncated");
  c.truncate(s, 3);  // back into the raised cells before the cut
  e.pos.resize(3);
  check_positions(c, s, e, "truncated into the kept prefix");
  append_n(c, s, 20, rng);
  e.append(20);
  check_positions(c, s, e, "appended after the truncation");
  c.shift(s, 1, 2);
  e.shift(1, 2);
  check_positions(c, s, e, "shifted again");
}

// Host cost of shift (rope-on-read) at 32k vs 128k tokens, median of several calls. The
// work must follow n_keep, n_discard / block_size and block_size, not the context length.
TEST(PagedOffsets, ShiftCostDoesNotFollowTheContextLength) {
  auto time_shift = [](int32_t ctx, int32_t discard) {
    PagedCacheConfig cfg;
    cfg.n_layers = 1;
    cfg.n_kv_heads = 1;
    cfg.head_dim = 16;
    cfg.v_head_dim = 16;
    cfg.block_size = 16;
    cfg.num_blocks = ctx / 16 + 8;
    cfg.k_format = cfg.v_format = KvFormat::F16;
    cfg.rope = {RopeSpec::plain(16, 10000.0)};
    cfg.rope_mode = RopeMode::RopeOnRead;
    cfg.kvcore_attention = false;  // head_dim 16: no attention reads these pages
    PagedCache c(cfg, Device::cpu());
    std::mt19937_64 rng(7);
    const SeqId s = c.create();
    Source k = make_source(rng, 1, ctx, 1, 16, DType::F16, Device::cpu(), false);
    std::vector<int32_t> pos(ctx);
    for (int32_t i = 0; i < ctx; ++i) pos[i] = i;
    c.append(s, pos, k.tensor, k.tensor);
    std::vector<double> us;
    for (int rep = 0; rep < 9; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      c.shift(s, 4, discard);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      const int32_t first = c.info(s).last_position + 1;
      std::vector<int32_t> p(discard);
      for (int32_t i = 0; i < discard; ++i) p[i] = first + i;
      const TensorRef kk(k.buffer.data(), DType::F16, Device::cpu(), {1, discard, 1, 16});
      c.append(s, p, kk, kk);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  const double t32 = time_shift(32768, 256), t128 = time_shift(131072, 256);
  std::printf("[paged offsets] CPU host shift(4, 256), rope-on-read: 32k tokens %.1f us, 128k tokens %.1f us\n", t32, t128);
  const double h32 = time_shift(32768, 16384), h128 = time_shift(131072, 65536);
  std::printf("[paged offsets] CPU host shift(4, half), rope-on-read: 32k tokens %.1f us, 128k tokens %.1f us "
              "(O(n_discard / block_size): blocks freed)\n", h32, h128);
#if !defined(__SANITIZE_ADDRESS__)
  // O(context) would be 4x; allow noise on a shared CI machine.
  EXPECT_LT(t128, 2.0 * t32 + 30.0);
#endif
}

}  // namespace
