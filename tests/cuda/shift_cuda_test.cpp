// shift_dense and rope_shift_rows on CUDA against the CPU op and the float64
// reference, on fresh random inputs of awkward sizes. Moves must give the
// same bytes as the CPU; rotated dims must meet the CPU tests' tolerances and
// differ from the CPU result by at most one unit in the last place (one FP8
// code for FP8 keys, where the rate is reported).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "kvcore/buffer.hpp"
#include "kvcore/runtime.hpp"
#include "ops/tuning.hpp"
#include "shift_test_util.hpp"

using namespace kvcore;
using namespace shift_test;

namespace {

// The CUDA kernel the tests below force (src/ops/tuning.hpp); Auto: the library's rule.
ops::ShiftKernel forced_kernel = ops::ShiftKernel::Auto;

struct DevLayer {
  Buffer k, s, v;
  explicit DevLayer(const Layer& L)
      : k(Buffer::from_host(L.k, Device::cuda(0))),
        s(L.s.empty() ? Buffer() : Buffer::from_host(L.s, Device::cuda(0))),
        v(L.v.empty() ? Buffer() : Buffer::from_host(L.v, Device::cuda(0))) {}
  ShiftDenseLayer view(const Layer& L) const { return L.view(Device::cuda(0), k.data(), s.data(), v.data()); }
};

// Units in the last place between two 16-bit (or 32-bit) storage values of the same sign.
int64_t ulp_distance(DType t, const uint8_t* a, const uint8_t* b) {
  if (t == DType::F32) {
    int32_t x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, b, 4);
    return std::llabs(int64_t{x} - y);
  }
  int16_t x, y;
  std::memcpy(&x, a, 2);
  std::memcpy(&y, b, 2);
  return std::llabs(int64_t{x} - y);
}

struct Diff {
  int64_t max_ulps = 0, differing = 0, total = 0;
  int64_t beyond = 0;  // more than one ulp AND more than 4e-6 apart (values are O(1): near zero, f32 differences
                       // of a few 1e-7 span several f16 ulps, e.g. FMA contraction or sincosf vs sinf)
};

// Compare the K bytes of two results element by element (FP8: codes).
Diff compare_k(const Layer& L, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  Diff d;
  const DType t = L.spec.form == KForm::Plain ? L.spec.k_dtype : L.spec.form == KForm::Dsv4 ? DType::BF16 : DType::E4M3;
  const int es = static_cast<int>(dtype_size(t));
  for (size_t i = 0; i + es <= a.size(); i += es) {
    ++d.total;
    if (std::memcmp(&a[i], &b[i], es) == 0) continue;
    ++d.differing;
    const int64_t u = t == DType::E4M3 ? std::abs(int(a[i] & 0x7f) - int(b[i] & 0x7f)) : ulp_distance(t, &a[i], &b[i]);
    d.max_ulps = std::max(d.max_ulps, u);
    if (t != DType::E4M3 && u > 1 && std::fabs(load_value(t, &a[i]) - load_value(t, &b[i])) > 4e-6) ++d.beyond;
  }
  return d;
}

void run_both(const std::vector<LayerSpec>& specs, int64_t cap, int64_t length, int64_t n_keep, int64_t n_discard, uint64_t seed) {
  std::vector<Layer> layers, cpu;
  std::vector<std::unique_ptr<DevLayer>> dev;
  std::vector<ShiftDenseLayer> cpu_views, dev_views;
  for (size_t i = 0; i < specs.size(); ++i) layers.push_back(make_layer(specs[i], cap, seed * 1000 + i));
  cpu = layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    cpu_views.push_back(cpu[i].host_view());
    dev.push_back(std::make_unique<DevLayer>(layers[i]));
    dev_views.push_back(dev.back()->view(layers[i]));
  }
  shift_dense(cpu_views, length, n_keep, n_discard);
  ops::shift_dense(dev_views, length, n_keep, n_discard, forced_kernel);
  synchronize(Device::cuda(0));
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto k = dev[i]->k.to_host<uint8_t>();
    const auto s = layers[i].s.empty() ? std::vector<uint8_t>() : dev[i]->s.to_host<uint8_t>();
    const auto v = layers[i].v.empty() ? std::vector<uint8_t>() : dev[i]->v.to_host<uint8_t>();
    const CheckResult r = check_shift(layers[i], k, s, v, length, n_keep, n_discard);
    EXPECT_TRUE(r.ok) << "CUDA, layer " << i << " (cap " << cap << ", L " << length << ", keep " << n_keep << ", discard "
                      << n_discard << "): " << r.problem;
    EXPECT_EQ(v, cpu[i].v) << "V bytes differ between CUDA and CPU, layer " << i;
    const Diff d = compare_k(layers[i], k, cpu[i].k);
    if (layers[i].spec.form == KForm::Fp8) {
      EXPECT_LE(d.differing, d.total / 100 + 2) << "FP8 codes differing between CUDA and CPU";
      if (d.differing) std::printf("[shift] FP8 keys: %lld of %lld codes differ CUDA vs CPU (max %lld codes)\n", (long long)d.differing, (long long)d.total, (long long)d.max_ulps);
    } else {
      EXPECT_EQ(d.beyond, 0) << "K differs by more than one ulp (max " << d.max_ulps << ") between CUDA and CPU, layer " << i;
    }
  }
}

LayerSpec plain(DType k, std::optional<DType> v, int heads, int hd, RopeSpec rope) {
  LayerSpec s;
  s.k_dtype = k;
  s.v_dtype = v;
  s.heads = heads;
  s.head_dim = hd;
  s.v_head_dim = hd;
  s.rope = rope;
  return s;
}

bool have_gpu() { return cuda_device_count() > 0; }

}  // namespace

TEST(ShiftCuda, RangesAndBandOrdering) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const LayerSpec llama = plain(DType::F16, DType::F16, 8, 128, RopeSpec::llama3_8b());
  run_both({llama}, 3001, 2999, 4, 1000, 1);    // overlap, two bands
  run_both({llama}, 3001, 3001, 4, 1498, 2);    // full capacity, half discarded
  run_both({llama}, 2000, 1999, 0, 1, 3);       // n_keep 0, a band per token
  run_both({llama, llama}, 2500, 2500, 4, 7, 4);  // 356 bands of 7 tokens across two layers
  run_both({llama}, 500, 480, 4, 300, 5);       // no overlap
  run_both({llama}, 500, 480, 30, 450, 6);      // nothing retained
  run_both({llama}, 500, 480, 30, 0, 7);        // no-op
}

TEST(ShiftCuda, BandOrderingUnderLoad) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  // ~20k tokens x 2 KB, bands of 16 tokens: thousands of tiles in flight waiting on each other.
  const LayerSpec s = plain(DType::BF16, DType::F16, 8, 128, RopeSpec::plain(128, 500000.0));
  run_both({s, s}, 20011, 20011, 3, 16, 8);
  run_both({s}, 20011, 19999, 3, 255, 9);
}

// The default (src/cuda/shift/shift_kernel_choice.hpp) is the chain kernel for FP8 keys, the
// dynamic sweep kernel for 16-bit rows without overlap and the single tile kernel otherwise.
// Every kernel can be forced (ops::ShiftKernel) and must agree on every format.
struct KernelScope {
  explicit KernelScope(ops::ShiftKernel k) { forced_kernel = k; }
  ~KernelScope() { forced_kernel = ops::ShiftKernel::Auto; }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
};

void tile_kernel_cases(uint64_t seed) {
  const LayerSpec llama = plain(DType::F16, DType::F16, 8, 128, RopeSpec::llama3_8b());
  run_both({llama}, 3001, 2999, 4, 1000, seed + 1);
  run_both({llama, llama}, 2500, 2500, 4, 7, seed + 2);
  run_both({llama}, 500, 480, 4, 300, seed + 3);
  LayerSpec f;
  f.form = KForm::Fp8;
  f.heads = 3;
  f.head_dim = 128;
  f.rope = RopeSpec::plain(128, 10000.0);
  run_both({f, f}, 400, 399, 4, 33, seed + 4);   // many bands
  run_both({f}, 400, 400, 4, 198, seed + 5);     // one band
  f.head_dim = 512;
  f.heads = 1;
  f.rope = RopeSpec::deepseek_v4_compressed();
  run_both({f}, 200, 200, 0, 150, seed + 6);
  LayerSpec d;
  d.form = KForm::Dsv4;
  d.v_dtype = std::nullopt;
  d.heads = 1;
  d.rope = RopeSpec::deepseek_v4_compressed();
  run_both({d, d}, 1025, 1023, 4, 128, seed + 7);
  run_both({d}, 1025, 1025, 4, 600, seed + 8);
}

TEST(ShiftCuda, SingleTileKernelAgrees) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const KernelScope k(ops::ShiftKernel::Single);
  tile_kernel_cases(100);
}

// The sweep kernel (src/cuda/shift/shift_sweep.hpp), forced: shifts without overlap, NeoX and
// interleaved, partial rotary, f32 / f16 / bf16 K, strided rows, per-layer tables, several
// launches, DeepSeek-V4 rows as byte ranges (even n_discard); what it does not take (overlap,
// odd n_discard with 584-byte rows, FP8 keys, 1 KB heads) falls back to the tile kernel.
void sweep_kernel_cases(uint64_t seed) {
  const LayerSpec llama = plain(DType::F16, DType::F16, 8, 128, RopeSpec::llama3_8b());
  run_both({llama, llama, llama}, 4097, 4096, 4, 2046, seed + 1);  // the benchmark's shape, 3 layers
  run_both({llama, llama}, 4097, 4096, 4, 256, seed + 2);          // its small discard: 15 bands
  run_both({llama}, 3001, 2999, 4, 1000, seed + 3);                // two bands, the last partial
  run_both({llama, llama}, 2500, 2500, 4, 7, seed + 4);            // 356 bands of 7 tokens
  run_both({llama}, 2000, 1999, 0, 1, seed + 5);                   // a band per token
  run_both({llama}, 500, 480, 30, 450, seed + 6);                  // nothing retained
  const LayerSpec s = plain(DType::BF16, DType::F16, 8, 128, RopeSpec::plain(128, 500000.0));
  run_both({s, s}, 20011, 20011, 3, 16, seed + 7);                 // thousands of bands under load
  RopeSpec tail = RopeSpec::plain(32, 20000.0, RopePairing::Interleaved);
  tail.slice = RopeSlice::Tail;
  RopeSpec part = RopeSpec::plain(32, 10000.0);
  const LayerSpec mix[] = {plain(DType::BF16, DType::F16, 3, 64, RopeSpec::plain(64, 1e4)),
                           plain(DType::F32, DType::BF16, 2, 64, tail),
                           plain(DType::F16, std::nullopt, 5, 256, part),
                           plain(DType::F32, DType::F32, 1, 128, RopeSpec::plain(128, 1e4, RopePairing::Interleaved))};
  run_both({mix[0], mix[1], mix[2], mix[3]}, 777, 777, 3, 390, seed + 8);
  run_both({mix[0], mix[1], mix[2], mix[3]}, 777, 770, 5, 91, seed + 9);
  std::vector<LayerSpec> many;  // 45 layers, per-layer theta: two launches
  for (int i = 0; i < 45; ++i)
    many.push_back(plain(i % 2 ? DType::F16 : DType::BF16, DType::F16, 2, 64, RopeSpec::plain(64, 10000.0 * (1 + i))));
  run_both(many, 97, 96, 3, 10, seed + 10);
  run_both(many, 97, 96, 3, 60, seed + 11);
  LayerSpec d;
  d.form = KForm::Dsv4;
  d.v_dtype = std::nullopt;
  d.heads = 1;
  d.rope = RopeSpec::deepseek_v4_compressed();
  run_both({llama, d}, 1025, 1023, 4, 128, seed + 12);  // ranges, 8 bands
  run_both({d, d, d}, 4097, 4096, 4, 2046, seed + 14);   // the benchmark's shape, 3 layers
  run_both({d, d}, 4097, 4096, 3, 256, seed + 15);       // its small discard
  run_both({d}, 1025, 1025, 4, 601, seed + 16);          // odd n_discard: falls back
  run_both({plain(DType::F16, DType::F16, 2, 512, RopeSpec::plain(512, 1e4))}, 301, 299, 5, 137, seed + 13);
}

TEST(ShiftCuda, SweepKernelAgrees) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const KernelScope scope(ops::ShiftKernel::Sweep);
  sweep_kernel_cases(440);
}

// The chain kernel: more columns than resident threads (several rounds per thread), a few
// columns with very long chains, 1- and 2-byte units, mixed formats in one launch.
TEST(ShiftCuda, ChainKernelRoundsAndChains) {
  // 16-bit keys take the sweep or the single tile kernel by default: force the chain kernel here.
  const KernelScope scope(ops::ShiftKernel::Chain);
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const LayerSpec s = plain(DType::BF16, DType::F16, 8, 128, RopeSpec::plain(128, 500000.0));
  run_both({s, s}, 20011, 20011, 3, 9000, 120);  // no overlap, millions of units
  run_both({s}, 20011, 20011, 3, 3, 121);        // 3 residues: chains of 6668 steps
  LayerSpec odd = plain(DType::F16, DType::BF16, 3, 64, RopeSpec::plain(64, 10000.0));  // 2-byte units
  odd.v_head_dim = 41;
  odd.k_pad = 1;
  odd.v_pad = 1;
  LayerSpec d;
  d.form = KForm::Dsv4;
  d.v_dtype = std::nullopt;
  d.heads = 2;
  d.rope = RopeSpec::deepseek_v4_window();
  const LayerSpec f32 = plain(DType::F32, DType::F32, 2, 96, RopeSpec::plain(32, 10000.0, RopePairing::Interleaved));
  run_both({odd, d, f32, s}, 777, 770, 5, 91, 122);
  run_both({odd, d, f32, s}, 777, 777, 0, 500, 123);
  // FP8 keys with f16 layers: two chain launches (the FP8 one a head per thread); FP8 keys with
  // partial rotary: the whole call takes the single tile kernel
  LayerSpec f;
  f.form = KForm::Fp8;
  f.heads = 2;
  f.head_dim = 128;
  f.rope = RopeSpec::plain(128, 10000.0);
  run_both({s, f}, 300, 300, 4, 37, 124);
  f.rope = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  f.rope.slice = RopeSlice::Tail;
  run_both({s, f}, 300, 300, 4, 37, 125);
  f.head_dim = 64;  // a 64-dim FP8 head, interleaved pairs: the chain FP8 kernel's other forms
  f.heads = 5;
  f.rope = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  run_both({f, f}, 333, 333, 4, 100, 126);
  run_both({f}, 333, 330, 4, 7, 127);
  f.rope = RopeSpec::plain(64, 10000.0);
  run_both({f, f}, 333, 333, 4, 100, 128);
}

TEST(ShiftCuda, HeadDimsDtypesAndStrides) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 20;
  for (int hd : {64, 128, 256, 512})
    for (int heads : {1, 3}) run_both({plain(DType::F16, DType::BF16, heads, hd, RopeSpec::plain(hd, 10000.0))}, 301, 299, 5, 37, ++seed);
  for (DType k : {DType::F32, DType::F16, DType::BF16})
    for (DType v : {DType::F32, DType::F16, DType::BF16}) run_both({plain(k, v, 2, 64, RopeSpec::plain(64, 10000.0))}, 257, 257, 1, 100, ++seed);
  LayerSpec odd = plain(DType::F16, DType::BF16, 3, 64, RopeSpec::plain(64, 10000.0));
  odd.v_head_dim = 40;
  odd.k_pad = 1;  // 2-byte aligned rows only
  odd.v_pad = 3;
  run_both({odd}, 333, 333, 2, 55, ++seed);
  odd.k_dtype = DType::F32;
  odd.k_pad = 2;  // 8-byte aligned rows
  run_both({odd}, 333, 333, 2, 55, ++seed);
  LayerSpec big = plain(DType::F32, DType::F32, 16, 512, RopeSpec::plain(512, 10000.0));  // 32 KB rows: head chunks
  run_both({big}, 90, 90, 2, 20, ++seed);
}

TEST(ShiftCuda, RopeVariantsAndManyLayers) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 40;
  for (RopePairing pr : {RopePairing::NeoX, RopePairing::Interleaved})
    for (RopeSlice sl : {RopeSlice::Head, RopeSlice::Tail}) {
      RopeSpec r = RopeSpec::plain(32, 10000.0, pr);
      r.slice = sl;
      run_both({plain(DType::BF16, DType::F16, 2, 128, r)}, 211, 209, 4, 61, ++seed);
    }
  RopeSpec y = RopeSpec::deepseek_v4_compressed();
  y.slice = RopeSlice::Head;
  y.attention_factor = 1.3;
  LayerSpec ys = plain(DType::F32, DType::F16, 2, 64, y);
  ys.magnitude = 1.3;
  run_both({ys}, 150, 150, 4, 70, ++seed);
  // 45 layers (90 tensors) with per-layer theta: more than one launch's worth of streams
  std::vector<LayerSpec> many;
  for (int i = 0; i < 45; ++i)
    many.push_back(plain(i % 2 ? DType::F16 : DType::BF16, DType::F16, 2, 64, RopeSpec::plain(64, 10000.0 * (1 + i))));
  run_both(many, 97, 96, 3, 10, ++seed);
  // 9 layers of 256 pairs each, each with its own theta: more pairs than one launch holds
  // (layers with one spec share one table)
  std::vector<LayerSpec> wide;
  for (int i = 0; i < 9; ++i) wide.push_back(plain(DType::F16, std::nullopt, 1, 512, RopeSpec::plain(512, 10000.0 + 100.0 * i)));
  run_both(wide, 64, 64, 2, 9, ++seed);
  std::vector<LayerSpec> same(9, plain(DType::F16, std::nullopt, 1, 512, RopeSpec::plain(512, 10000.0)));
  run_both(same, 64, 64, 2, 9, ++seed);
}

TEST(ShiftCuda, DeepSeekV4RowsAndFp8Keys) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  LayerSpec d;
  d.form = KForm::Dsv4;
  d.v_dtype = std::nullopt;
  d.heads = 1;
  d.rope = RopeSpec::deepseek_v4_compressed();
  run_both({d, d, d}, 1025, 1023, 4, 128, 60);
  run_both({d}, 1025, 1025, 0, 3, 61);
  d.heads = 2;
  d.rope = RopeSpec::deepseek_v4_window();
  run_both({d}, 300, 300, 4, 100, 62);
  LayerSpec f;
  f.form = KForm::Fp8;
  f.heads = 3;
  f.head_dim = 128;
  f.rope = RopeSpec::plain(128, 10000.0);
  run_both({f}, 400, 399, 4, 33, 63);
  f.head_dim = 512;
  f.heads = 1;
  f.rope = RopeSpec::deepseek_v4_compressed();
  run_both({f}, 200, 200, 0, 150, 64);
  // MLA's latent K as FP8: 576 dims, RoPE on the 64-dim tail (the tile kernel), then 512 rotated at the head
  f.head_dim = 576;
  f.rope = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  f.rope.slice = RopeSlice::Tail;
  run_both({f, f}, 300, 299, 4, 100, 65);
  f.heads = 2;
  f.rope = RopeSpec::plain(512, 10000.0);
  run_both({f}, 200, 200, 4, 37, 66);
}

TEST(ShiftCuda, RopeShiftRowsMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::vector<LayerSpec> specs = every_k_form(8);
  for (const LayerSpec& sp : specs) {
    const int64_t rows = 1237;
    Layer L = make_layer(sp, rows, 77);
    std::vector<int32_t> delta(rows);
    for (int64_t r = 0; r < rows; ++r) delta[r] = r % 9 == 0 ? 0 : static_cast<int32_t>((r * 104729) % 200003) - 100000;
    Layer c = L;
    const ShiftDenseLayer hv = c.host_view();
    rope_shift_rows(hv.k, hv.maybe_k_scales, sp.rope, TensorRef(delta.data(), DType::I32, Device::cpu(), {rows}));
    DevLayer dl(L);
    Buffer dd = Buffer::from_host(delta, Device::cuda(0));
    const ShiftDenseLayer dv = dl.view(L);
    rope_shift_rows(dv.k, dv.maybe_k_scales, sp.rope, TensorRef(dd.data(), DType::I32, Device::cuda(0), {rows}));
    synchronize(Device::cuda(0));
    const auto k = dl.k.to_host<uint8_t>();
    const Diff d = compare_k(L, k, c.k);
    if (sp.form == KForm::Fp8) {
      EXPECT_LE(d.differing, d.total / 100 + 2);
      const auto s = dl.s.to_host<uint8_t>();
      int64_t scale_diff = 0;
      for (size_t i = 0; i < s.size(); ++i) scale_diff += s[i] != c.s[i];
      EXPECT_LE(scale_diff, int64_t(s.size()) / 100 + 2);
    } else {
      EXPECT_EQ(d.beyond, 0) << "format " << int(sp.form) << ", max ulps " << d.max_ulps;
    }
    for (int64_t r = 0; r < rows; r += 9) EXPECT_EQ(0, std::memcmp(k.data() + r * L.k_tok, L.k.data() + r * L.k_tok, L.k_tok));
  }
}

TEST(ShiftCuda, OrderedOnTheCallersStream) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const LayerSpec s = plain(DType::F16, DType::F16, 8, 128, RopeSpec::llama3_8b());
  const Layer L = make_layer(s, 4001, 90);
  Layer c = L;
  std::vector<ShiftDenseLayer> cv{c.host_view()};
  for (int i = 0; i < 3; ++i) shift_dense(cv, 4001 - 100 * i, 4, 100);
  DevLayer d(L);
  std::vector<ShiftDenseLayer> dv{d.view(L)};
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  for (int i = 0; i < 3; ++i) shift_dense(dv, 4001 - 100 * i, 4, 100, Stream::from_native(st));  // three shifts queued back to back
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
  EXPECT_EQ(d.v.to_host<uint8_t>(), c.v);
  // three roundings on either side: compare values (an ordering bug gives O(1) differences)
  const auto k = d.k.to_host<uint8_t>();
  double se = 0, sr = 0;
  for (size_t i = 0; i + 2 <= k.size(); i += 2) {
    const double a = load_value(DType::F16, &k[i]), b = load_value(DType::F16, &c.k[i]);
    se += (a - b) * (a - b);
    sr += b * b;
  }
  EXPECT_LT(std::sqrt(se / sr), 1e-3);
}
