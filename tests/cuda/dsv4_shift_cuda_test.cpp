// Dsv4Cache::shift on CUDA against the CPU, bit for bit. Both caches are built from the same
// random token inputs; the GPU's stored bytes are then copied into the CPU cache (the
// compressors' float math may differ by a code between the backends, the shift must not),
// both shift, and every byte of every store (stale rows included) and state must agree.
// The CPU side is checked against the float64 rule in tests/dsv4_shift_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../dsv4_shift_util.hpp"
#include "kvcore/runtime.hpp"

using namespace kvcore;
using namespace kvcore::testing;

namespace {

// KVCORE_DSV4_TEST_CPU_AS_GPU=1: CPU against CPU, a dry run of the test logic without a GPU.
bool cpu_as_gpu() { return std::getenv("KVCORE_DSV4_TEST_CPU_AS_GPU") != nullptr; }
const Device kGpu = cpu_as_gpu() ? Device::cpu() : Device::cuda(0);
bool have_gpu() { return cpu_as_gpu() || cuda_device_count() > 0; }

// Every view of one sequence's storage, layer by layer.
std::vector<TensorRef> views(const Dsv4Cache& c, SeqId seq) {
  std::vector<TensorRef> v;
  for (int l = 0; l < c.n_layers(); ++l) {
    v.push_back(c.raw_ring(seq, l));
    if (c.kind(l) == Dsv4LayerKind::Window) continue;
    v.push_back(c.compressed_store(seq, l));
    v.push_back(c.state(seq, l, Dsv4State::CompressorKv));
    v.push_back(c.state(seq, l, Dsv4State::CompressorScore));
    if (c.kind(l) != Dsv4LayerKind::CSA) continue;
    v.push_back(c.indexer_store(seq, l));
    v.push_back(c.state(seq, l, Dsv4State::IndexerKv));
    v.push_back(c.state(seq, l, Dsv4State::IndexerScore));
  }
  return v;
}

void check(const ShiftStack& st, int L, int K, int D, uint64_t seed) {
  const std::string what = std::string(st.cfg.quant == Dsv4Quant::On ? (st.cfg.packed ? "quant on packed" : "quant on f32") : "quant off") +
                           " layers " + std::to_string(st.n_layers()) + " L " + std::to_string(L) + " keep " + std::to_string(K) +
                           " discard " + std::to_string(D);
  SCOPED_TRACE(what);
  Dsv4Cache gpu(st.cfg, kGpu), cpu(st.cfg, Device::cpu());
  for (Dsv4Cache* c : {&gpu, &cpu}) {
    ASSERT_EQ(c->create(), 0);
    ASSERT_EQ(c->create(), 1);
    st.set_weights(*c);
    st.append(*c, 0, 0, ShiftStack::ids(900, 23), seed + 1);
    st.append(*c, 1, 0, ShiftStack::ids(0, L), seed);
  }
  const std::vector<TensorRef> g = views(gpu, 1), h = views(cpu, 1);
  ASSERT_EQ(g.size(), h.size());
  synchronize(kGpu);
  for (size_t i = 0; i < g.size(); ++i) copy_bytes(h[i].data(), Device::cpu(), g[i].data(), kGpu, static_cast<size_t>(g[i].span_bytes()));
  gpu.shift(1, K, D);
  cpu.shift(1, K, D);
  synchronize(kGpu);
  for (int l = 0; l < st.n_layers(); ++l) ASSERT_EQ(gpu.length(1, l), cpu.length(1, l));
  int64_t bytes = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const std::vector<uint8_t> a = bytes_of(g[i]), b = bytes_of(h[i]);
    ASSERT_EQ(a.size(), b.size());
    size_t first = a.size();
    for (size_t k = 0; k < a.size() && first == a.size(); ++k)
      if (a[k] != b[k]) first = k;
    ASSERT_EQ(first, a.size()) << "view " << i << " differs first at byte " << first << " of " << a.size();
    bytes += static_cast<int64_t>(a.size());
  }
  std::printf("[dsv4 shift cuda] %s: %lld bytes bit-identical\n", what.c_str(), static_cast<long long>(bytes));
  EXPECT_EQ(gpu.debug_state(), cpu.debug_state());
}

TEST(Dsv4ShiftCuda, BitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  struct Mode {
    Dsv4Quant q;
    bool packed;
  };
  uint64_t seed = 31000;
  for (Mode m : {Mode{Dsv4Quant::On, true}, Mode{Dsv4Quant::On, false}, Mode{Dsv4Quant::Off, false}}) {
    const ShiftStack st(m.q, m.packed);
    // In-place and permuted rings, overlapping and disjoint row moves, a sequence inside the
    // window, n_keep = 0.
    for (auto [L, K, D] : {std::tuple{150, 16, 64}, std::tuple{150, 0, 48}, std::tuple{150, 16, 96}, std::tuple{32, 16, 16},
                           std::tuple{131, 48, 48}, std::tuple{191, 32, 16}})
      check(st, L, K, D, seed += 10);
    // 24 layers: more row jobs than one launch carries.
    std::vector<Dsv4LayerKind> many;
    for (int i = 0; i < 12; ++i) {
      many.push_back(Dsv4LayerKind::Window);
      many.push_back(i % 2 ? Dsv4LayerKind::HCA : Dsv4LayerKind::CSA);
    }
    const ShiftStack big(m.q, m.packed, many);
    check(big, 150, 16, 48, seed += 10);
    check(big, 30, 0, 16, seed += 10);
  }
}

}  // namespace
