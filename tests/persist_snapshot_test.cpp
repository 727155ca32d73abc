// Snapshots of PagedCache sequences: round trips are bit-identical (K, V, positions, sharing) in
// every format and both RoPE modes; a rope-on-read snapshot loads at another position base; every
// corruption class (truncation, any flipped byte, another model or layout, a newer major, too few
// blocks) throws the documented code and leaves the target cache exactly as it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "kvcore/persist/snapshot.hpp"
#include "paged_configs.hpp"
#include "paged_model.hpp"
#include "persist/checksum.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

// Bit-identical float vectors (memcmp would be handed null pointers for empty ones).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<int32_t> iota_from(int32_t first, int32_t n) {
  std::vector<int32_t> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

void append_random(PagedCache& c, SeqId id, int32_t n, std::mt19937_64& rng, int32_t first = -1) {
  const PagedCacheConfig& cfg = c.config();
  if (first < 0) first = c.info(id).last_position + 1;
  Source k = make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), false);
  Source v = cfg.v_head_dim && !cfg.v_from_k_latent ? make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.v_head_dim, DType::F32, c.device(), false)
                            : Source{};
  c.append(id, iota_from(first, n), k.tensor, v.tensor);
}

// Three sequences: one plain, one forked from it and extended (shares full blocks), one shifted.
std::vector<SeqId> fill(PagedCache& c, std::mt19937_64& rng) {
  const SeqId a = c.create();
  append_random(c, a, 21, rng);
  const SeqId f = c.fork(a);
  append_random(c, f, 5, rng);
  const SeqId s = c.create();
  append_random(c, s, 30, rng);
  c.shift(s, 3, 9);
  return {a, f, s};
}

void expect_same_sequence(PagedCache& x, SeqId sx, PagedCache& y, SeqId sy, int32_t position_delta = 0) {
  ASSERT_EQ(x.info(sx).n_live, y.info(sy).n_live);
  for (int32_t l = 0; l < x.config().n_layers; ++l) {
    const PagedReadBack a = x.read(sx, l), b = y.read(sy, l);
    std::vector<int32_t> shifted = a.positions;
    for (int32_t& p : shifted) p += position_delta;
    EXPECT_EQ(shifted, b.positions) << "layer " << l;
    ASSERT_EQ(a.k.size(), b.k.size());
    ASSERT_EQ(a.v.size(), b.v.size());
    if (position_delta == 0) {
      EXPECT_TRUE(same_bits(a.k, b.k)) << "K differs, layer " << l;
    }
    EXPECT_TRUE(same_bits(a.v, b.v)) << "V differs, layer " << l;
  }
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("kvcore_") + name + "_" + std::to_string(::getpid())))
      .string();
}

void expect_refused(PagedCache& c, ErrorCode code, std::span<const uint8_t> bytes, const SnapshotLoadOptions& o,
                    const std::string& what) {
  const Snapshot before = snapshot(c);
  try {
    snapshot_decode(c, bytes, o);
    ADD_FAILURE() << what << ": loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << what << ": " << e.what();
  }
  EXPECT_TRUE(snapshot(c) == before) << what << ": the cache changed";
}

}  // namespace

TEST(PersistSnapshot, WholeCacheRoundTripIsBitIdenticalInEveryFormatAndMode) {
  for (KvFormat f : kAllFormats)
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
      SCOPED_TRACE(std::string(kv_format_name(f)) + (mode == RopeMode::RopeOnRead ? " rope-on-read" : " rope-stored"));
      std::mt19937_64 rng(11);
      PagedCache src(small_config(f, mode, 8, 40), Device::cpu());
      const std::vector<SeqId> ids = fill(src, rng);
      const std::string path = temp_path("whole");
      snapshot_save(src, path, "model-a");
      // A target of another size that already holds a sequence.
      PagedCache dst(small_config(f, mode, 8, 64), Device::cpu());
      const SeqId other = dst.create();
      append_random(dst, other, 10, rng);
      const PagedReadBack other_before = dst.read(other, 0);
      const SnapshotLoaded got = snapshot_load(dst, path, {"model-a", 0});
      std::remove(path.c_str());
      ASSERT_EQ(got.saved_ids, ids);
      ASSERT_EQ(got.ids.size(), ids.size());
      for (size_t i = 0; i < ids.size(); ++i) expect_same_sequence(src, ids[i], dst, got.ids[i]);
      // Sharing survives: the fork's full blocks are shared again, not copied.
      EXPECT_EQ(dst.stats().blocks_shared, src.stats().blocks_shared);
      EXPECT_EQ(dst.stats().blocks_used - 2, src.stats().blocks_used);  // + the 10-token sequence's 2 blocks
      const PagedReadBack other_after = dst.read(other, 0);
      EXPECT_EQ(other_before.k, other_after.k);
      EXPECT_EQ(other_before.v, other_after.v);
      // The loaded sequences behave like any other: extend the fork, shift the loaded shifted one.
      append_random(dst, got.ids[1], 4, rng);
      dst.shift(got.ids[2], 1, 2);
      EXPECT_EQ(dst.read(got.ids[0], 0).positions, src.read(ids[0], 0).positions);
    }
}

TEST(PersistSnapshot, OneSequenceRoundTripAndReencodingIsStable) {
  std::mt19937_64 rng(3);
  PagedCache src(small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 4, 40), Device::cpu());
  const std::vector<SeqId> ids = fill(src, rng);
  const SeqId one[1] = {ids[1]};
  const std::vector<uint8_t> bytes = snapshot_encode(src, one, "m");
  PagedCache dst(src.config(), Device::cpu());
  const SnapshotLoaded got = snapshot_decode(dst, bytes, {"m", 0});
  ASSERT_EQ(got.ids.size(), 1u);
  expect_same_sequence(src, ids[1], dst, got.ids[0]);
  EXPECT_EQ(dst.stats().blocks_used, src.info(ids[1]).n_blocks);
  // Encoding what was loaded gives the same bytes, but for the saved id.
  const SeqId back[1] = {got.ids[0]};
  std::vector<uint8_t> again = snapshot_encode(dst, back, "m");
  const SnapshotSummary s1 = snapshot_inspect(bytes), s2 = snapshot_inspect(again);
  EXPECT_EQ(s1.file_bytes, s2.file_bytes);
  EXPECT_EQ(s1.fingerprint, s2.fingerprint);
  EXPECT_EQ(s1.seqs[0].n_live, s2.seqs[0].n_live);
  EXPECT_EQ(s1.seqs[0].last_position, s2.seqs[0].last_position);
}

TEST(PersistSnapshot, RopeOnReadSnapshotLoadsAtAnotherPositionBase) {
  std::mt19937_64 rng(5), rng_copy(5);
  const PagedCacheConfig cfg = small_config(KvFormat::F32, RopeMode::RopeOnRead, 8, 40);
  PagedCache src(cfg, Device::cpu());
  const SeqId a = src.create();
  append_random(src, a, 19, rng);
  // The oracle: the same rows appended at positions 100.. directly.
  PagedCache direct(cfg, Device::cpu());
  const SeqId d = direct.create();
  append_random(direct, d, 19, rng_copy, 100);
  const SeqId one[1] = {a};
  const std::vector<uint8_t> bytes = snapshot_encode(src, one, "m");
  PagedCache dst(cfg, Device::cpu());
  const SnapshotLoaded got = snapshot_decode(dst, bytes, {"m", 100});
  for (int32_t l = 0; l < cfg.n_layers; ++l) {
    const PagedReadBack x = direct.read(d, l), y = dst.read(got.ids[0], l);
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_TRUE(same_bits(x.k, y.k)) << "layer " << l;
    EXPECT_TRUE(same_bits(x.v, y.v)) << "layer " << l;
  }
  // A delta that would make a position negative, and any delta in rope-stored, are refused.
  expect_refused(dst, ErrorCode::InvalidArgument, bytes, {"m", -1}, "negative position");
  PagedCache stored(small_config(KvFormat::F32, RopeMode::RopeStored, 8, 40), Device::cpu());
  const SeqId s = stored.create();
  append_random(stored, s, 5, rng);
  const SeqId sid[1] = {s};
  const std::vector<uint8_t> sb = snapshot_encode(stored, sid, "m");
  expect_refused(stored, ErrorCode::InvalidArgument, sb, {"m", 4}, "delta in rope-stored");
}

TEST(PersistSnapshot, TruncatedOrFlippedFilesAreCorruptAndChangeNothing) {
  std::mt19937_64 rng(7);
  PagedCache src(small_config(KvFormat::Fp8, RopeMode::RopeStored, 4, 40), Device::cpu());
  fill(src, rng);
  const std::vector<uint8_t> good = snapshot_encode(src, {}, "m");
  PagedCache dst(src.config(), Device::cpu());
  const SeqId keep = dst.create();
  append_random(dst, keep, 6, rng);
  const Snapshot before = snapshot(dst);
  auto refuses = [&](const std::vector<uint8_t>& bad, const std::string& what) {
    try {
      snapshot_decode(dst, bad, {"m", 0});
      return ::testing::AssertionFailure() << what << ": loaded";
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Corrupt) return ::testing::AssertionFailure() << what << ": " << e.what();
    }
    return ::testing::AssertionSuccess();
  };
  // Every prefix length on a coarse grid, and the lengths around each boundary.
  for (size_t n = 0; n < good.size(); n += n < 128 ? 1 : 61)
    EXPECT_TRUE(refuses(std::vector<uint8_t>(good.begin(), good.begin() + n), "truncated to " + std::to_string(n)));
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_TRUE(refuses(longer, "a trailing byte"));
  // Flip one bit of every byte in the header, chunk heads, padding and footer, and a sample of the bodies.
  for (size_t i = 0; i < good.size(); i += i < 256 || i + 256 > good.size() ? 1 : 37) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= static_cast<uint8_t>(1u << (i % 8));
    EXPECT_TRUE(refuses(bad, "bit flip at byte " + std::to_string(i)));
  }
  EXPECT_TRUE(snapshot(dst) == before);
}

TEST(PersistSnapshot, OtherModelOtherLayoutNewerMajorOrTooFewBlocksAreRefused) {
  std::mt19937_64 rng(9);
  const PagedCacheConfig cfg = small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 40);
  PagedCache src(cfg, Device::cpu());
  fill(src, rng);
  const std::vector<uint8_t> good = snapshot_encode(src, {}, "llama-3-8b@abc");
  PagedCache dst(cfg, Device::cpu());
  append_random(dst, dst.create(), 7, rng);
  expect_refused(dst, ErrorCode::InvalidArgument, good, {"llama-3-8b@abd", 0}, "other model id");
  expect_refused(dst, ErrorCode::InvalidArgument, good, {"", 0}, "no model id");

  auto other = [&](auto edit, const char* what) {
    PagedCacheConfig c = cfg;
    edit(c);
    PagedCache t(c, Device::cpu());
    append_random(t, t.create(), 3, rng);
    expect_refused(t, ErrorCode::InvalidArgument, good, {"llama-3-8b@abc", 0}, what);
  };
  other([](PagedCacheConfig& c) { c.k_format = KvFormat::BF16; c.kvcore_attention = false; }, "other K format");
  other([](PagedCacheConfig& c) { c.block_size = 16; }, "other block size");
  other([](PagedCacheConfig& c) { c.rope_mode = RopeMode::RopeStored; }, "other RoPE mode");
  other([](PagedCacheConfig& c) { c.rope[1].theta = 160001.0; }, "other theta in layer 1");
  other([](PagedCacheConfig& c) { c.rope[0].attention_factor = 1.0; }, "other attention factor");
  other([](PagedCacheConfig& c) { c.n_kv_heads = 1; }, "other head count");

  // The message names the first line that differs.
  try {
    PagedCacheConfig c = cfg;
    c.v_head_dim = 128;
    c.kvcore_attention = false;  // pages an engine reads itself: attention reads V as wide as K
    PagedCache t(c, Device::cpu());
    snapshot_decode(t, good, {"llama-3-8b@abc", 0});
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v_head_dim 64"), std::string::npos) << e.what();
  }

  // A newer major (header checksum made right again): refused by name; a newer minor loads.
  auto with_version = [&](uint16_t major, uint16_t minor) {
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + 8, &major, 2);
    std::memcpy(b.data() + 10, &minor, 2);
    const uint64_t h = persist::xxh3_64(b.data(), 24);
    std::memcpy(b.data() + 24, &h, 8);
    return b;
  };
  const std::vector<uint8_t> v2 = with_version(2, 0);
  expect_refused(dst, ErrorCode::InvalidArgument, v2, {"llama-3-8b@abc", 0}, "major 2");
  const std::vector<uint8_t> v1_7 = with_version(1, 7);
  EXPECT_EQ(snapshot_decode(dst, v1_7, {"llama-3-8b@abc", 0}).ids.size(), 3u);

  // Too few free blocks: OutOfMemory, nothing taken.
  PagedCache small(small_config(KvFormat::F16, RopeMode::RopeOnRead, 8, 5), Device::cpu());
  append_random(small, small.create(), 3, rng);
  expect_refused(small, ErrorCode::OutOfMemory, good, {"llama-3-8b@abc", 0}, "too few blocks");
}

TEST(PersistSnapshot, SavesReplaceAtomicallyAndIoErrorsNameThePath) {
  std::mt19937_64 rng(4);
  PagedCache c(small_config(KvFormat::BF16, RopeMode::RopeStored, 8, 20), Device::cpu());
  const SeqId a = c.create();
  append_random(c, a, 9, rng);
  const std::string path = temp_path("atomic");
  snapshot_save(c, path, "m");
  const std::vector<uint8_t> first = read_file_bytes(path);
  append_random(c, a, 9, rng);
  snapshot_save(c, path, "m");  // replaces the file
  EXPECT_EQ(snapshot_inspect(read_file_bytes(path)).seqs.at(0).n_live, 18);
  EXPECT_NE(first, read_file_bytes(path));
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    EXPECT_EQ(e.path().string().find(path + ".tmp"), std::string::npos) << "left behind: " << e.path();
  std::remove(path.c_str());
  try {
    snapshot_save(c, "/nonexistent-dir/x.kvcs", "m");
    ADD_FAILURE() << "saved";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DeviceError);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.kvcs"), std::string::npos) << e.what();
  }
  try {
    snapshot_load(c, "/nonexistent-dir/x.kvcs", {"m", 0});
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
  }
}

TEST(PersistSnapshot, InspectDescribesTheFile) {
  std::mt19937_64 rng(2);
  PagedCache c(small_config(KvFormat::Fp8, RopeMode::RopeOnRead, 8, 40), Device::cpu());
  const std::vector<SeqId> ids = fill(c, rng);
  const std::vector<uint8_t> b = snapshot_encode(c, {}, "model-x");
  const SnapshotSummary s = snapshot_inspect(b);
  EXPECT_EQ(s.major, kSnapshotMajor);
  EXPECT_EQ(s.model_id, "model-x");
  EXPECT_EQ(s.file_bytes, b.size());
  ASSERT_EQ(s.seqs.size(), 3u);
  EXPECT_EQ(s.seqs[0].n_live, 21);
  EXPECT_EQ(s.seqs[1].n_live, 26);
  EXPECT_EQ(s.seqs[2].n_live, 21);
  EXPECT_EQ(s.seqs[2].last_position, 20);
  // The fork's first two blocks are a's, saved once.
  EXPECT_EQ(s.n_blocks, c.info(ids[0]).n_blocks + c.info(ids[1]).n_blocks - 2 + c.info(ids[2]).n_blocks);
  EXPECT_EQ(s.fingerprint, layout_fingerprint(c.config()));
  const std::string text = snapshot_describe(s);
  EXPECT_NE(text.find("model id: 'model-x'"), std::string::npos) << text;
  EXPECT_NE(text.find("k_format fp8"), std::string::npos) << text;
}

// DeepSeek-V2/V3 MLA's rows (K 576 with a 64-dim RoPE tail, V 512) round-trip bit-identically too,
// in the separate-V layout and in the shared one (v_from_k_latent: V is K's latent).
TEST(PersistSnapshot, MlaRowsRoundTripBitIdentically) {
  for (bool shared : {false, true})
    for (KvFormat f : kMlaFormats)
      for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
        SCOPED_TRACE(std::string(kv_format_name(f)) + (mode == RopeMode::RopeOnRead ? " rope-on-read" : " rope-stored") +
                     (shared ? " shared V" : ""));
        const PagedCacheConfig cfg = shared ? mla_shared_config(f, mode, 8, 40) : mla_config(f, mode, 8, 40);
        std::mt19937_64 rng(19);
        PagedCache src(cfg, Device::cpu());
        const std::vector<SeqId> ids = fill(src, rng);
        const std::vector<uint8_t> bytes = snapshot_encode(src, ids, "mla");
        PagedCache dst(cfg, Device::cpu());
        const SnapshotLoaded got = snapshot_decode(dst, bytes, {"mla", 0});
        ASSERT_EQ(got.ids.size(), ids.size());
        for (size_t i = 0; i < ids.size(); ++i) expect_same_sequence(src, ids[i], dst, got.ids[i]);
        EXPECT_EQ(dst.stats().blocks_shared, src.stats().blocks_shared);
        if (shared) {
          EXPECT_EQ(src.read(ids[0], 1).v.size(), src.read(ids[0], 1).positions.size() * 512);
        }
      }
}

// The shared-V layout and the separate-V one of the same dims are different layouts: a snapshot of
// either is refused by a cache of the other, naming the line that differs, and changes nothing.
TEST(PersistSnapshot, MlaSharedAndSeparateVLayoutsNeverLoadIntoEachOther) {
  for (bool from_shared : {false, true}) {
    std::mt19937_64 rng(23);
    const PagedCacheConfig a = mla_config(KvFormat::Fp8, RopeMode::RopeStored, 8, 40);
    const PagedCacheConfig b = mla_shared_config(KvFormat::Fp8, RopeMode::RopeStored, 8, 40);
    PagedCache src(from_shared ? b : a, Device::cpu());
    const std::vector<uint8_t> bytes = snapshot_encode(src, fill(src, rng), "mla");
    PagedCache dst(from_shared ? a : b, Device::cpu());
    append_random(dst, dst.create(), 5, rng);
    expect_refused(dst, ErrorCode::InvalidArgument, bytes, {"mla", 0}, from_shared ? "shared into separate" : "separate into shared");
    try {
      snapshot_decode(dst, bytes, {"mla", 0});
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("v_format"), std::string::npos) << e.what();
    }
  }
}
