// BlockOffloader on a CUDA PagedCache: the same values as the CPU path (bit for bit), round trips
// through pinned memory and a lower store, loads on another stream, the holder keeping blocks
// whose copy is still queued, loads ordered after a copy still in flight, and the offload copy
// overlapping a kernel on the compute stream instead of waiting in line behind it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <random>

#include "kvcore/buffer.hpp"
#include "kvcore/persist/block_offload.hpp"
#include "kvcore/runtime.hpp"
#include "paged_configs.hpp"
#include "persist_offload_util.hpp"

void test_spin(long long cycles, cudaStream_t stream);

using namespace kvcore;
using namespace offload_test;

namespace {

StoreKey key_of(int i, const PagedCacheConfig& c) {
  const int32_t t[2] = {i, 99};
  return store_key_for_tokens(t, "gpu", c);
}

bool have_gpu() { return cuda_device_count() > 0; }

bool all_zero(const std::vector<uint8_t>& v) {
  for (uint8_t b : v)
    if (b) return false;
  return true;
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cudaEventSynchronize(b);
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

// Spin cycles that take about `ms` on this GPU (measured: the clock runs at whatever it boosts to).
long long cycles_for_ms(double ms, cudaStream_t s) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  constexpr long long kProbe = 20'000'000;
  test_spin(kProbe, s);  // warm
  cudaEventRecord(a, s);
  test_spin(kProbe, s);
  cudaEventRecord(b, s);
  const double per_ms = kProbe / static_cast<double>(elapsed_ms(a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<long long>(ms * per_ms);
}

// n tokens of random finite f16 K/V (bits straight from a generator) at the next positions.
void append_bits(PagedCache& c, SeqId seq, int32_t n, uint64_t seed) {
  const PagedCacheConfig& cfg = c.config();
  const size_t count = static_cast<size_t>(cfg.n_layers) * n * cfg.n_kv_heads * cfg.head_dim;
  std::vector<uint16_t> h(count);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : h) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint16_t>(x) & 0xBBFF;  // exponent below 0x1F: finite
  }
  Buffer k(count * 2, c.device()), v(count * 2, c.device());
  k.copy_from_host(h.data(), count * 2);
  std::reverse(h.begin(), h.end());
  v.copy_from_host(h.data(), count * 2);
  std::vector<int32_t> pos(n);
  const int32_t first = c.info(seq).last_position + 1;
  for (int32_t i = 0; i < n; ++i) pos[i] = first + i;
  const int64_t L = cfg.n_layers, H = cfg.n_kv_heads, D = cfg.head_dim;
  c.append(seq, pos, TensorRef(k.data(), DType::F16, c.device(), {L, n, H, D}),
           TensorRef(v.data(), DType::F16, c.device(), {L, n, H, D}));
  synchronize(c.device(), cfg.stream);  // the host buffers go away
}

TEST(PersistOffloadCuda, RoundTripsMatchTheCpuPathBitForBit) {
  ASSERT_TRUE(have_gpu());
  for (KvFormat f : paged_test::kAllFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) {
      SCOPED_TRACE(std::string(kv_format_name(f)) + (m == RopeMode::RopeStored ? " rope-stored" : " rope-on-read"));
      PagedCache cpu(paged_test::small_config(f, m, 8, 48), Device::cpu());
      PagedCache gpu(paged_test::small_config(f, m, 8, 48), Device::cuda(0));
      std::vector<SeqBytes> want_cpu, want_gpu;
      for (PagedCache* c : {&cpu, &gpu}) {
        std::mt19937_64 rng(11);
        const SeqId a = c->create();
        append_random(*c, a, 37, rng, 0);
        c->truncate(a, 30);
        const SeqId b = c->create();
        append_random(*c, b, 26, rng, 0);
        c->shift(b, 4, 9);
        HostStore lower(int64_t{64} << 20);
        BlockOffloader off(*c, {c->stats().bytes_per_block * 5, &lower, "m"});  // one value: the other goes down
        const SeqId seqs[2] = {a, b};
        std::vector<SeqBytes>& want = c == &cpu ? want_cpu : want_gpu;
        for (int i = 0; i < 2; ++i) {
          want.push_back(seq_bytes(*c, seqs[i]));
          ASSERT_TRUE(off.offload(seqs[i], key_of(i, c->config())));
        }
        c->erase(a);
        c->erase(b);
        off.poll();
        for (int i = 0; i < 2; ++i) {
          const std::optional<SeqId> got = off.load(key_of(i, c->config()), c->config().stream);
          ASSERT_TRUE(got.has_value());
          EXPECT_TRUE(seq_bytes(*c, *got) == want[i]) << "value " << i;
          EXPECT_TRUE(all_zero(bytes_past_span(*c, *got))) << "stale bytes past the span of value " << i;
          c->erase(*got);
        }
        off.flush();
        EXPECT_EQ(off.stats().holders, 0);
      }
      // Stored K is rotated on each device by its own math (last-bit differences allowed elsewhere);
      // unrotated K and every V are the same bytes.
      if (m == RopeMode::RopeOnRead) {
        EXPECT_TRUE(want_cpu == want_gpu) << "the CUDA cache holds other bytes than the CPU cache";
      }
    }
}

// A large sequence (Llama-like rows, 256 MiB) on a cache whose stream the test controls.
struct Big {
  cudaStream_t compute = nullptr;
  std::unique_ptr<PagedCache> cache;
  SeqId seq = 0;
  Big() {
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    PagedCacheConfig c;
    c.n_layers = 8;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.v_head_dim = 128;
    c.block_size = 16;
    c.num_blocks = 1100;
    c.rope = {RopeSpec::plain(128, 500000.0)};
    c.stream = Stream::from_native(compute);
    cache = std::make_unique<PagedCache>(c, Device::cuda(0));
    seq = cache->create();
    for (int i = 0; i < 16; ++i) append_bits(*cache, seq, 512, i + 1);
  }
  ~Big() {
    cache.reset();
    cudaStreamDestroy(compute);
  }
};

TEST(PersistOffloadCuda, TheOffloadCopyOverlapsAKernelOnTheComputeStream) {
  ASSERT_TRUE(have_gpu());
  Big big;
  const SeqBytes want = seq_bytes(*big.cache, big.seq);
  BlockOffloader off(*big.cache, {int64_t{2} << 30, nullptr, "m"});
  cudaEvent_t e0, e1, e2;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventCreate(&e2);
  // The copy alone.
  cudaEventRecord(e0, big.compute);
  ASSERT_TRUE(off.offload(big.seq, key_of(0, big.cache->config())));
  cudaEventRecord(e1, static_cast<cudaStream_t>(off.copy_stream().handle));
  const float copy_ms = elapsed_ms(e0, e1);
  // The kernel alone, as long as the copy.
  const long long cycles = cycles_for_ms(copy_ms, big.compute);
  cudaEventRecord(e0, big.compute);
  test_spin(cycles, big.compute);
  cudaEventRecord(e1, big.compute);
  const float spin_ms = elapsed_ms(e0, e1);
  // Both: the offload queued first, the kernel after it on the compute stream.
  cudaEventRecord(e0, big.compute);
  ASSERT_TRUE(off.offload(big.seq, key_of(1, big.cache->config())));
  test_spin(cycles, big.compute);
  cudaEventRecord(e1, big.compute);
  cudaEventRecord(e2, static_cast<cudaStream_t>(off.copy_stream().handle));
  const float kernel_done = elapsed_ms(e0, e1), copy_done = elapsed_ms(e0, e2);
  std::printf("[offload overlap] %.1f MiB: copy alone %.3f ms, kernel alone %.3f ms; together: kernel done at %.3f ms, copy at %.3f ms\n",
              static_cast<double>(want.payload.size()) / (1 << 20), copy_ms, spin_ms, kernel_done, copy_done);
  // Waiting in line on the compute stream would end the kernel at copy + kernel; overlapped, both
  // end near the longer of the two.
  EXPECT_LT(kernel_done, spin_ms + 0.5f * copy_ms) << "the kernel waited for the offload copy";
  EXPECT_LT(std::max(kernel_done, copy_done), 0.75f * (spin_ms + copy_ms)) << "the copy and the kernel did not overlap";
  off.flush();
  for (int i = 0; i < 2; ++i) {
    const std::optional<SeqId> got = off.load(key_of(i, big.cache->config()), Stream::from_native(big.compute));
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(seq_bytes(*big.cache, *got) == want);
    big.cache->erase(*got);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
}

TEST(PersistOffloadCuda, BlocksStayWholeUntilTheCopyAndLoadsWaitForIt) {
  ASSERT_TRUE(have_gpu());
  Big big;
  const SeqBytes want = seq_bytes(*big.cache, big.seq);
  BlockOffloader off(*big.cache, {int64_t{1} << 30, nullptr, "m"});
  // The copy waits behind a 50 ms kernel; meanwhile the sequence is erased, the value is loaded
  // on another stream, and every free block is overwritten on the compute stream.
  test_spin(cycles_for_ms(50, big.compute), big.compute);
  ASSERT_TRUE(off.offload(big.seq, key_of(0, big.cache->config())));
  EXPECT_EQ(off.stats().holders, 1) << "the copy cannot have run yet: a holder must keep the blocks";
  big.cache->erase(big.seq);
  cudaStream_t other;
  cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
  const std::optional<SeqId> got = off.load(key_of(0, big.cache->config()), Stream::from_native(other));
  ASSERT_TRUE(got.has_value());
  const SeqId junk = big.cache->create();
  for (int i = 0; big.cache->stats().blocks_free > 0; ++i)
    append_bits(*big.cache, junk, std::min(512, big.cache->stats().blocks_free * 16), 1000 + i);
  EXPECT_TRUE(seq_bytes(*big.cache, *got) == want) << "a block was served before its copy completed, or overwritten while copied";
  off.flush();
  EXPECT_EQ(off.stats().holders, 0);
  cudaStreamDestroy(other);
}

}  // namespace
