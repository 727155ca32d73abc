// Dsv4Cache sequence snapshots: a saved slot loads into another slot or cache with every read
// identical and goes on identically (the states are complete); truncated or flipped files, another
// layout or model, and a slot in use are refused with the cache unchanged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "dsv4_sequence_util.hpp"
#include "dsv4_test_util.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/dsv4_snapshot.hpp"
#include "kvcore/persist/snapshot.hpp"

using namespace kvcore;
using namespace kvcore::testing;

namespace {

Dsv4CacheConfig stack_config(Dsv4Quant q, int32_t window = 32) {
  Dsv4CacheConfig cfg;
  cfg.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
  cfg.hca_ratio = 16;
  cfg.index_topk = 8;
  cfg.max_context = 96;
  cfg.max_seqs = 2;
  cfg.window = window;
  cfg.quant = q;
  return cfg;
}

}  // namespace

TEST(PersistDsv4Snapshot, RoundTripIsCompleteAndGoesOnIdentically) {
  for (Dsv4Quant q : {Dsv4Quant::On, Dsv4Quant::Off}) {
    Dsv4Cache src(stack_config(q), Device::cpu()), dst(stack_config(q), Device::cpu());
    dsv4_set_test_weights(src);
    dsv4_set_test_weights(dst);
    const SeqId s0 = src.create(), d0 = dst.create(), d1 = dst.create();
    dsv4_append_tokens(src, s0, 0, 37);
    dsv4_append_tokens(src, s0, 37, 1);
    const std::string path =
        (std::filesystem::temp_directory_path() / ("kvcore_dsv4_" + std::to_string(::getpid()))).string();
    snapshot_save(src, s0, path, "dsv4-flash");
    snapshot_load(dst, d1, path, "dsv4-flash");
    std::filesystem::remove(path);
    EXPECT_TRUE(dsv4_same_sequence(src, s0, dst, d1));
    EXPECT_EQ(dst.length(d0, 0), 0) << "other sequences untouched";
    // The states are complete: both go on to the same rows.
    dsv4_append_tokens(src, s0, 38, 40);
    dsv4_append_tokens(dst, d1, 38, 40);
    EXPECT_TRUE(dsv4_same_sequence(src, s0, dst, d1));
  }
}

TEST(PersistDsv4Snapshot, BadFilesOtherLayoutsAndBusySlotsAreRefused) {
  Dsv4Cache src(stack_config(Dsv4Quant::On), Device::cpu());
  dsv4_set_test_weights(src);
  const SeqId s0 = src.create();
  dsv4_append_tokens(src, s0, 0, 21);
  const std::vector<uint8_t> good = snapshot_encode(src, s0, "m");
  Dsv4Cache dst(stack_config(Dsv4Quant::On), Device::cpu());
  dsv4_set_test_weights(dst);
  const SeqId d0 = dst.create(), d1 = dst.create();
  dsv4_append_tokens(dst, d0, 0, 5);  // d0 busy, d1 empty
  auto refused = [&](ErrorCode code, std::span<const uint8_t> b, SeqId seq, std::string_view model) {
    const std::vector<float> w0 = dst.read_window(d0, 2), w1 = dst.read_window(d1, 2);
    try {
      snapshot_decode(dst, seq, b, model);
      return ::testing::AssertionFailure() << "loaded";
    } catch (const Error& e) {
      if (e.code() != code) return ::testing::AssertionFailure() << e.what();
    }
    if (dst.length(d0, 1) != 5 || dst.length(d1, 1) != 0 || dst.read_window(d0, 2) != w0 || dst.read_window(d1, 2) != w1)
      return ::testing::AssertionFailure() << "the cache changed";
    return ::testing::AssertionSuccess();
  };
  for (size_t n = 0; n < good.size(); n += 997) EXPECT_TRUE(refused(ErrorCode::Corrupt, {good.data(), n}, d1, "m")) << n;
  for (size_t i = 0; i < good.size(); i += i < 300 ? 1 : 4099) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x20;
    EXPECT_TRUE(refused(ErrorCode::Corrupt, bad, d1, "m")) << "flip at " << i;
  }
  EXPECT_TRUE(refused(ErrorCode::InvalidArgument, good, d0, "m")) << "busy sequence";
  EXPECT_TRUE(refused(ErrorCode::InvalidArgument, good, d1, "other")) << "model id";
  EXPECT_TRUE(refused(ErrorCode::InvalidArgument, good, d1 + 1000, "m")) << "unknown sequence";
  Dsv4Cache other(stack_config(Dsv4Quant::On, 16), Device::cpu());
  const SeqId o0 = other.create();
  EXPECT_THROW(snapshot_decode(other, o0, good, "m"), Error);
  EXPECT_EQ(other.length(o0, 0), 0);
  snapshot_decode(dst, d1, good, "m");
  EXPECT_TRUE(dsv4_same_sequence(src, s0, dst, d1));
  const SnapshotSummary s = snapshot_inspect(good);
  EXPECT_EQ(s.dsv4_lengths, (std::vector<int64_t>{21, 21, 21}));
  EXPECT_NE(snapshot_describe(s).find("Dsv4Cache"), std::string::npos);
}
