// PagedCache over pool memory the caller owns: paged_pool_specs says what to allocate; a cache
// built over those arrays writes exactly where its own pools would (same reads, same metadata,
// same pool bytes as a cache that allocated its pools, for every format), never frees them, and
// refuses every array that is not what the spec asks for (InvalidArgument naming pools[i]),
// leaving the caller's bytes untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcore/error.hpp"
#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

// Caller memory for every array of `specs`, each filled with `fill`.
struct CallerPools {
  std::vector<Buffer> buffers;
  std::vector<TensorRef> refs;
  CallerPools(const std::vector<PagedPoolSpec>& specs, uint8_t fill) {
    for (const PagedPoolSpec& s : specs) {
      buffers.emplace_back(static_cast<size_t>(s.bytes), Device::cpu());
      std::memset(buffers.back().data(), fill, buffers.back().size());
      refs.emplace_back(buffers.back().data(), s.dtype, Device::cpu(),
                        std::initializer_list<int64_t>{s.shape[0], s.shape[1], s.shape[2], s.shape[3]});
    }
  }
  bool all_bytes_are(uint8_t b) const {
    for (const Buffer& buf : buffers)
      for (size_t i = 0; i < buf.size(); ++i)
        if (buf.as<uint8_t>()[i] != b) return false;
    return true;
  }
};

// The same edits on any cache: appends, a fork written after the fork (copy on write), a shift
// and a truncate, with data from one seeded generator.
void drive(PagedCache& c) {
  std::mt19937_64 rng(7);
  const PagedCacheConfig& cfg = c.config();
  const SeqId a = c.create();
  auto append = [&](SeqId s, int32_t n) {
    const int32_t first = c.info(s).last_position + 1;
    std::vector<int32_t> pos(n);
    for (int32_t i = 0; i < n; ++i) pos[i] = first + i;
    Source k = make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), false);
    Source v = cfg.v_head_dim
                   ? make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.v_head_dim, DType::F32, c.device(), false)
                   : Source{};
    c.append(s, pos, k.tensor, v.tensor);
  };
  append(a, 13);
  const SeqId b = c.fork(a);
  append(b, 5);
  append(a, 2);
  c.shift(a, 3, 4);
  c.truncate(b, 11);
  c.prepare();
}

}  // namespace

TEST(PagedPoolMemory, SpecsDescribeEveryArrayInConstructorOrder) {
  PagedCacheConfig cfg = small_config(KvFormat::Fp8, RopeMode::RopeOnRead);
  cfg.v_format = KvFormat::BF16;
  cfg.kvcore_attention = false;  // mixed K/V formats: pages an engine reads itself
  const std::vector<PagedPoolSpec> specs = paged_pool_specs(cfg);
  ASSERT_EQ(specs.size(), 6u);  // per layer: k, k_scales, v
  const PoolPart parts[3] = {PoolPart::KData, PoolPart::KScales, PoolPart::VData};
  const DType dtypes[3] = {DType::E4M3, DType::UE8M0, DType::BF16};
  const int64_t widths[3] = {64, 1, 64};
  int64_t per_block = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].layer, static_cast<int32_t>(i / 3));
    EXPECT_EQ(specs[i].part, parts[i % 3]);
    EXPECT_EQ(specs[i].dtype, dtypes[i % 3]);
    const std::array<int64_t, 4> want{cfg.num_blocks + 1, cfg.block_size, cfg.n_kv_heads, widths[i % 3]};
    EXPECT_EQ(specs[i].shape, want);
    EXPECT_EQ(specs[i].bytes, want[0] * want[1] * want[2] * want[3] * static_cast<int64_t>(dtype_size(dtypes[i % 3])));
    per_block += specs[i].bytes / want[0];
  }
  PagedCache c(cfg, Device::cpu());
  EXPECT_EQ(c.stats().bytes_per_block, per_block);
  EXPECT_STREQ(pool_part_name(PoolPart::VScales), "v_scales");
  // The config is validated first.
  cfg.num_blocks = 0;
  EXPECT_THROW(paged_pool_specs(cfg), Error);
}

TEST(PagedPoolMemory, CallerPoolsHoldWhatOwnPoolsHoldForEveryFormat) {
  for (KvFormat f : kAllFormats) {
    for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
      SCOPED_TRACE(std::string(kv_format_name(f)) + (mode == RopeMode::RopeStored ? " stored" : " on_read"));
      PagedCacheConfig cfg = small_config(f, mode, 4, 24);
      const std::vector<PagedPoolSpec> specs = paged_pool_specs(cfg);
      CallerPools mem(specs, 0xA5);  // garbage: the cache must zero it
      PagedCache own(cfg, Device::cpu());
      PagedCache given(cfg, Device::cpu(), mem.refs);
      EXPECT_TRUE(own.owns_pools());
      EXPECT_FALSE(given.owns_pools());
      // The views are the caller's memory.
      size_t i = 0;
      for (int32_t l = 0; l < cfg.n_layers; ++l) {
        const KvPool k = given.k_pool(l), v = given.v_pool(l);
        EXPECT_EQ(k.data.data(), mem.buffers[i++].data());
        if (!k.scales.empty()) {
          EXPECT_EQ(k.scales.data(), mem.buffers[i++].data());
        }
        if (!v.data.empty()) {
          EXPECT_EQ(v.data.data(), mem.buffers[i++].data());
        }
        if (!v.scales.empty()) {
          EXPECT_EQ(v.scales.data(), mem.buffers[i++].data());
        }
      }
      EXPECT_EQ(i, mem.buffers.size());
      drive(own);
      drive(given);
      EXPECT_EQ(given.debug_state(), own.debug_state());
      const Snapshot so = snapshot(own), sg = snapshot(given);
      ASSERT_EQ(sg.arrays.size(), so.arrays.size());
      for (size_t a = 0; a < so.arrays.size(); ++a) EXPECT_EQ(sg.arrays[a], so.arrays[a]) << "array " << a;
      for (SeqId s : own.sequences()) {
        const PagedReadBack ro = own.read(s, 1), rg = given.read(s, 1);
        EXPECT_EQ(rg.positions, ro.positions);
        EXPECT_EQ(rg.k, ro.k);
        EXPECT_EQ(rg.v, ro.v);
      }
      // The zero block (the last block of every array) stayed zero.
      for (size_t a = 0; a < specs.size(); ++a) {
        const int64_t block = specs[a].bytes / specs[a].shape[0];
        const uint8_t* z = mem.buffers[a].as<uint8_t>() + specs[a].bytes - block;
        for (int64_t j = 0; j < block; ++j) ASSERT_EQ(z[j], 0) << "array " << a << " zero block byte " << j;
      }
    }
  }
}

TEST(PagedPoolMemory, TheCacheNeverFreesCallerMemory) {
  const PagedCacheConfig cfg = small_config(KvFormat::F16, RopeMode::RopeStored);
  CallerPools mem(paged_pool_specs(cfg), 0);
  {
    PagedCache c(cfg, Device::cpu(), mem.refs);
    drive(c);
    PagedCache moved(std::move(c));  // the moved-to cache holds the same memory
    EXPECT_EQ(moved.k_pool(0).data.data(), mem.buffers[0].data());
  }
  // Still ours (ASan reports a use after free or a double free otherwise): write and reuse it.
  std::memset(mem.buffers[0].data(), 1, mem.buffers[0].size());
  PagedCache again(cfg, Device::cpu(), mem.refs);
  EXPECT_TRUE(mem.all_bytes_are(0));  // zeroed again by the new cache
}

TEST(PagedPoolMemory, RefusesArraysThatAreNotTheSpecAndTouchesNothing) {
  PagedCacheConfig cfg = small_config(KvFormat::Fp8, RopeMode::RopeOnRead);
  const std::vector<PagedPoolSpec> specs = paged_pool_specs(cfg);  // k, k_scales, v, v_scales per layer
  ASSERT_EQ(specs.size(), 8u);
  CallerPools mem(specs, 0x5A);
  std::vector<Buffer> extra;
  auto expect_refused = [&](std::vector<TensorRef> pools, const std::string& needle) {
    SCOPED_TRACE(needle);
    try {
      PagedCache c(cfg, Device::cpu(), pools);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(mem.all_bytes_are(0x5A)) << "a refused call wrote the caller's memory";
  };
  const std::vector<TensorRef> good = mem.refs;
  const PagedPoolSpec& s0 = specs[0];
  auto with = [&](size_t i, TensorRef t) {
    std::vector<TensorRef> p = good;
    p[i] = t;
    return p;
  };
  expect_refused(std::vector<TensorRef>(good.begin(), good.end() - 1), "pools holds 7 arrays, the config needs 8");
  expect_refused(with(2, TensorRef()), "pools[2] (layer 0 v) has no memory");
  expect_refused(with(0, TensorRef(mem.buffers[0].data(), DType::F16, Device::cpu(), {s0.shape[0], s0.shape[1], s0.shape[2], s0.shape[3] / 2})),
                 "pools[0] (layer 0 k) has dtype f16, needs e4m3 (or u8)");
  expect_refused(with(1, TensorRef(mem.buffers[1].data(), DType::UE8M0, Device::cpu(), {specs[1].shape[0] - 1, specs[1].shape[1], specs[1].shape[2], specs[1].shape[3]})),
                 "pools[1] (layer 0 k_scales) has shape");
  expect_refused(with(0, TensorRef(mem.buffers[0].data(), DType::E4M3, Device::cuda(0), {s0.shape[0], s0.shape[1], s0.shape[2], s0.shape[3]})),
                 "pools[0] (layer 0 k) is on cuda:0, the cache on cpu");
  // Non-contiguous: the right shape with the first two dims' strides swapped.
  const int64_t row = s0.shape[2] * s0.shape[3];
  expect_refused(with(0, TensorRef(mem.buffers[0].data(), DType::E4M3, Device::cpu(), {s0.shape[0], s0.shape[1], s0.shape[2], s0.shape[3]},
                                   {row, s0.shape[0] * row, s0.shape[3], 1})),
                 "pools[0] (layer 0 k) must be contiguous");
  extra.emplace_back(static_cast<size_t>(s0.bytes) + 16, Device::cpu());
  std::memset(extra.back().data(), 0x5A, extra.back().size());
  expect_refused(with(4, TensorRef(extra.back().as<uint8_t>() + 1, DType::E4M3, Device::cpu(), {s0.shape[0], s0.shape[1], s0.shape[2], s0.shape[3]})),
                 "pools[4] (layer 1 k) at ");
  expect_refused(with(6, good[2]), "pools[2] and pools[6] overlap");
  EXPECT_NO_THROW(PagedCache(cfg, Device::cpu(), good));
  // u8 stands in for e4m3 codes and ue8m0 scales.
  std::vector<TensorRef> as_u8;
  for (size_t i = 0; i < specs.size(); ++i)
    as_u8.emplace_back(mem.buffers[i].data(), DType::U8, Device::cpu(),
                       std::initializer_list<int64_t>{specs[i].shape[0], specs[i].shape[1], specs[i].shape[2], specs[i].shape[3]});
  EXPECT_NO_THROW(PagedCache(cfg, Device::cpu(), as_u8));
  // A bad config is refused before the pools are looked at (nor written).
  cfg.head_dim = 63;
  std::memset(mem.buffers[0].data(), 0x5A, mem.buffers[0].size());
  EXPECT_THROW(PagedCache(cfg, Device::cpu(), good), Error);
  EXPECT_EQ(mem.buffers[0].as<uint8_t>()[0], 0x5A);
}

TEST(PagedPoolMemory, SetStreamChangesTheStreamOfLaterCalls) {
  PagedCache c(small_config(KvFormat::F16, RopeMode::RopeStored), Device::cpu());
  int tag = 0;
  c.set_stream(Stream::from_native(&tag));
  EXPECT_EQ(c.config().stream.handle, &tag);
  c.set_stream({});
  EXPECT_EQ(c.config().stream.handle, nullptr);
}
