// DeepSeek-V4 ops and Dsv4Cache: CUDA against the CPU on fresh random inputs of
// awkward sizes, quantization on and off.
//   - codecs, copies and state updates: bit-identical;
//   - float math (pool, RMSNorm, RoPE): |cuda - cpu| <= 2e-5 (1 + |cpu|); indexer scores: the
//     worst-case summation bound 2 (D + H + 1) u M per score (see check_indexer);
//   - FP8 / FP4 after float math: values may differ by one code where the float
//     inputs differ in the last bit; the share of such codes is measured, printed
//     and bounded (FP8 <= 0.5 %, FP4 <= 1 %), and every difference must be one code;
//   - CUDA prefill against CUDA token-by-token: bit-identical;
//   - top-k: CUDA's picks are exactly the CPU's ordering of CUDA's own scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "../dsv4_test_util.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "kvcore/runtime.hpp"
#include "ops/dsv4_tuning.hpp"

using namespace kvcore;
using namespace kvcore::testing;

namespace {

// KVCORE_DSV4_TEST_CPU_AS_GPU=1 runs these tests CPU against CPU: a dry run of the
// test logic itself on machines without a GPU.
bool cpu_as_gpu() { return std::getenv("KVCORE_DSV4_TEST_CPU_AS_GPU") != nullptr; }
const Device kGpu = cpu_as_gpu() ? Device::cpu() : Device::cuda(0);

bool have_gpu() { return cpu_as_gpu() || cuda_device_count() > 0; }
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no GPU"

// A host vector and its device twin.
template <class T>
struct Twin {
  std::vector<T> h;
  Buffer d;
  explicit Twin(std::vector<T> v) : h(std::move(v)), d(Buffer::from_host(h, kGpu)) {}
  TensorRef host(DType dt, std::initializer_list<int64_t> s) { return TensorRef(h.data(), dt, Device::cpu(), s); }
  TensorRef dev(DType dt, std::initializer_list<int64_t> s) { return TensorRef(d.data(), dt, kGpu, s); }
  std::vector<T> down() const {
    synchronize(kGpu);
    return d.to_host<T>();
  }
};

struct Diff {
  int64_t n = 0, float_bad = 0, one_code = 0, worse = 0;
  double max_err = 0;
};

// Compares float outputs with the float tolerance.
void cmp_float(const std::vector<float>& gpu, const std::vector<float>& cpu, Diff& d, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double e = std::fabs(double(gpu[i]) - cpu[i]);
    d.max_err = std::max(d.max_err, e / (1 + std::fabs(cpu[i])));
    ++d.n;
    if (!(e <= 2e-5 * (1 + std::fabs(cpu[i])))) {
      if (++d.float_bad < 5) ADD_FAILURE() << what << "[" << i << "] gpu " << gpu[i] << " cpu " << cpu[i];
    }
  }
}

// Quantized values: equal, or one grid step apart (same scale).
bool one_code_apart(float a, float b, const std::vector<double>& grid, double scale) {
  const double x = std::fabs(a / scale), y = std::fabs(b / scale);
  if ((a < 0) != (b < 0) && x != 0 && y != 0) return false;
  auto idx = [&](double v) { return std::lower_bound(grid.begin(), grid.end(), v) - grid.begin(); };
  const auto ix = idx(x), iy = idx(y);
  if (ix >= static_cast<long>(grid.size()) || iy >= static_cast<long>(grid.size())) return false;
  return grid[ix] == x && grid[iy] == y && std::labs(ix - iy) <= 1;
}

// ---- finalizer and state ops: bit-identical ------------------------------------------

TEST(Dsv4Cuda, FinalizerIsBitIdentical) {
  REQUIRE_GPU();
  for (int hd : {512, 200}) {
    for (Dsv4Quant q : {Dsv4Quant::On, Dsv4Quant::Off}) {
      for (bool f16 : {true, false}) {
        const int n = 37, R = 16, n_rot = hd == 512 ? 64 : 8;
        Twin<float> kv(randn(n * hd, 1000 + hd, 3.0f));
        std::vector<float> kv_cpu = kv.h;
        Twin<uint16_t> r16(std::vector<uint16_t>(R * hd, 0));
        Twin<float> r32(std::vector<float>(R * hd, 0.0f));
        std::vector<uint16_t> c16 = r16.h;
        std::vector<float> c32 = r32.h;
        dsv4_kv_finalize(kv.dev(DType::F32, {n, hd}), f16 ? r16.dev(DType::F16, {R, hd}) : r32.dev(DType::F32, {R, hd}), 5, n_rot, q);
        dsv4_kv_finalize(TensorRef(kv_cpu.data(), DType::F32, Device::cpu(), {n, hd}),
                         f16 ? TensorRef(c16.data(), DType::F16, Device::cpu(), {R, hd})
                             : TensorRef(c32.data(), DType::F32, Device::cpu(), {R, hd}),
                         5, n_rot, q);
        ASSERT_EQ(std::memcmp(kv.down().data(), kv_cpu.data(), kv_cpu.size() * 4), 0) << hd;
        if (f16) {
          ASSERT_EQ(r16.down(), c16);
        } else {
          ASSERT_EQ(std::memcmp(r32.down().data(), c32.data(), c32.size() * 4), 0);
        }
      }
    }
  }
}

TEST(Dsv4Cuda, StateOpsAreBitIdentical) {
  REQUIRE_GPU();
  const Dsv4Compressor cc = Dsv4Compressor::csa(96, 16, 4);
  const int W = cc.width(), R = cc.state_rows();
  Twin<float> kv(std::vector<float>(R * W)), sc(std::vector<float>(R * W));
  std::vector<float> hk(R * W), hs(R * W);
  dsv4_compressor_reset(kv.dev(DType::F32, {R, W}), sc.dev(DType::F32, {R, W}), cc);
  dsv4_compressor_reset(view(hk, {R, W}), view(hs, {R, W}), cc);
  Twin<uint16_t> ape([&] {
    std::vector<uint16_t> a;
    for (float v : randn(4 * W, 7)) a.push_back(math::f32_to_f16_bits(v));
    return a;
  }());
  for (int p = 0; p < 11; ++p) {
    Twin<float> c(randn(W, 10 + p)), z(randn(W, 40 + p));
    dsv4_compressor_store_one(c.dev(DType::F32, {W}), z.dev(DType::F32, {W}), ape.dev(DType::F16, {4, W}),
                              kv.dev(DType::F32, {R, W}), sc.dev(DType::F32, {R, W}), p, cc);
    dsv4_compressor_store_one(c.host(DType::F32, {W}), z.host(DType::F32, {W}), ape.host(DType::F16, {4, W}), view(hk, {R, W}),
                              view(hs, {R, W}), p, cc);
    if ((p + 1) % 4 == 0) {
      dsv4_compressor_shift(kv.dev(DType::F32, {R, W}), sc.dev(DType::F32, {R, W}), cc);
      dsv4_compressor_shift(view(hk, {R, W}), view(hs, {R, W}), cc);
    }
  }
  ASSERT_EQ(std::memcmp(kv.down().data(), hk.data(), hk.size() * 4), 0);
  ASSERT_EQ(std::memcmp(sc.down().data(), hs.data(), hs.size() * 4), 0);
}

// ---- compression: CUDA vs CPU, and CUDA prefill vs CUDA token-by-token -------------------

struct Case {
  Dsv4Compressor cc;
  Dsv4Quant quant;
  bool packed;
  bool ape_f16 = false;  // ape stored as f16 (rounded from the f32 values)
  bool shifted = false;  // c and z start one float past a 16-byte boundary (no 16-byte loads: the general kernel)
};

// Runs n tokens through one compressor on `dev`, token by token (chunk 1) or in the
// given chunking; returns the row store bytes and the final state.
struct RunOut {
  std::vector<uint8_t> rows;
  std::vector<float> kv, score;
};

RunOut run_compressor(const Case& cs, Device dev, const std::vector<float>& c, const std::vector<float>& z,
                      const std::vector<float>& ape, const std::vector<float>& norm, int n, const std::vector<int>& chunks) {
  const Dsv4Compressor& cc = cs.cc;
  const int W = cc.width(), R = cc.state_rows(), hd = cc.head_dim, cap = n / cc.ratio + 1;
  const int rb = cs.packed ? cc.packed_row_bytes() : hd * 4;
  Buffer skv(R * W * 4, dev), ssc(R * W * 4, dev), rows(static_cast<size_t>(cap) * rb, dev);
  fill_bytes(rows.data(), dev, 0, rows.size());
  std::vector<uint16_t> ape16(ape.size());
  for (size_t i = 0; i < ape.size(); ++i) ape16[i] = math::f32_to_f16_bits(ape[i]);
  const size_t off = cs.shifted ? 1 : 0;
  std::vector<float> c_in(off), z_in(off);
  c_in.insert(c_in.end(), c.begin(), c.end());
  z_in.insert(z_in.end(), z.begin(), z.end());
  Buffer bape = cs.ape_f16 ? Buffer::from_host(ape16, dev) : Buffer::from_host(ape, dev), bnorm = Buffer::from_host(norm, dev),
         bc = Buffer::from_host(c_in, dev), bz = Buffer::from_host(z_in, dev);
  const TensorRef tkv(skv.data(), DType::F32, dev, {R, W}), tsc(ssc.data(), DType::F32, dev, {R, W});
  const TensorRef trows = cs.packed ? TensorRef(rows.data(), DType::U8, dev, {cap, rb}) : TensorRef(rows.data(), DType::F32, dev, {cap, hd});
  dsv4_compressor_reset(tkv, tsc, cc);
  Dsv4CompressorWeights w{TensorRef(bape.data(), cs.ape_f16 ? DType::F16 : DType::F32, dev, {cc.ratio, W}), TensorRef(bnorm.data(), DType::F32, dev, {hd}),
                          compressed_table(hd, cc.n_rot)};
  int p = 0;
  for (int len : chunks) {
    auto* cp = static_cast<float*>(bc.data()) + off + static_cast<size_t>(p) * W;
    auto* zp = static_cast<float*>(bz.data()) + off + static_cast<size_t>(p) * W;
    if (len == 1 && chunks.size() == static_cast<size_t>(n)) {  // the decode path
      dsv4_compressor_store_one(TensorRef(cp, DType::F32, dev, {W}), TensorRef(zp, DType::F32, dev, {W}), w.ape, tkv, tsc, p, cc);
      if ((p + 1) % cc.ratio == 0) {
        dsv4_compressor_emit(tkv, tsc, cc, w, p / cc.ratio, cs.quant, trows);
        if (cc.overlap) dsv4_compressor_shift(tkv, tsc, cc);
      }
    } else {
      dsv4_compress_prefill(TensorRef(cp, DType::F32, dev, {len, W}), TensorRef(zp, DType::F32, dev, {len, W}), tkv, tsc, p, cc,
                            w, cs.quant, trows);
    }
    p += len;
  }
  synchronize(dev);
  return {rows.to_host<uint8_t>(), skv.to_host<float>(), ssc.to_host<float>()};
}

std::vector<float> decode_rows(const Case& cs, const std::vector<uint8_t>& raw) {
  const int hd = cs.cc.head_dim;
  if (!cs.packed) {
    std::vector<float> v(raw.size() / 4);
    std::memcpy(v.data(), raw.data(), raw.size());
    return v;
  }
  const int rb = cs.cc.packed_row_bytes();
  const size_t n = raw.size() / rb;
  std::vector<float> v(n * hd);
  for (size_t r = 0; r < n; ++r)
    for (int d = 0; d < hd; ++d)
      v[r * hd + d] = cs.cc.kind == Dsv4RowKind::Attention ? math::dsv4_unpack_attention_value(raw.data() + r * rb, d)
                                                           : math::dsv4_unpack_fp4_value(raw.data() + r * rb, hd, d);
  return v;
}

void check_case(const Case& cs, uint64_t seed) {
  const Dsv4Compressor& cc = cs.cc;
  SCOPED_TRACE(::testing::Message() << "hd " << cc.head_dim << " ratio " << cc.ratio << " overlap " << cc.overlap << " kind "
                                    << int(cc.kind) << " quant " << int(cs.quant) << " packed " << cs.packed);
  const int n = cc.ratio * 9 + 3, W = cc.width(), hd = cc.head_dim;
  const std::vector<float> c = randn(static_cast<size_t>(n) * W, seed, 1.5f), z = randn(c.size(), seed + 1, 2.0f),
                           ape = randn(static_cast<size_t>(cc.ratio) * W, seed + 2), norm0 = randn(hd, seed + 3, 0.25f);
  std::vector<float> norm = norm0;
  for (float& v : norm) v += 1.0f;
  std::vector<int> ones(n, 1), odd;
  for (int p = 0, i = 0; p < n; ++i) {
    const int len = std::min(n - p, 1 + (i * 7 + 3) % (2 * cc.ratio + 1));
    odd.push_back(len);
    p += len;
  }
  const RunOut cpu = run_compressor(cs, Device::cpu(), c, z, ape, norm, n, ones);
  const RunOut gpu = run_compressor(cs, kGpu, c, z, ape, norm, n, ones);
  const RunOut gpu_pf = run_compressor(cs, kGpu, c, z, ape, norm, n, odd);
  ASSERT_EQ(gpu.rows, gpu_pf.rows) << "CUDA prefill == CUDA token by token";
  ASSERT_EQ(std::memcmp(gpu.kv.data(), gpu_pf.kv.data(), gpu.kv.size() * 4), 0);
  ASSERT_EQ(std::memcmp(gpu.score.data(), gpu_pf.score.data(), gpu.score.size() * 4), 0);
  ASSERT_EQ(std::memcmp(gpu.kv.data(), cpu.kv.data(), cpu.kv.size() * 4), 0) << "state is copied data: bit-identical";
  ASSERT_EQ(std::memcmp(gpu.score.data(), cpu.score.data(), cpu.score.size() * 4), 0);
  const std::vector<float> g = decode_rows(cs, gpu.rows), h = decode_rows(cs, cpu.rows);
  Diff d;
  if (cs.quant == Dsv4Quant::Off) {
    cmp_float(g, h, d, "row value");
    std::printf("[dsv4 cuda] %s hd %d m %d quant off: max rel err %.2e over %lld values\n",
                cc.kind == Dsv4RowKind::Indexer ? "indexer" : (cc.overlap ? "csa" : "hca"), hd, cc.ratio, d.max_err,
                static_cast<long long>(d.n));
    return;
  }
  // Quantized: per element equal, or one code apart at the block's scale.
  const bool attn = cc.kind == Dsv4RowKind::Attention;
  const std::vector<double> grid = attn ? e4m3_grid() : e2m1_grid();
  const int blk = attn ? 64 : 32, n_q = attn ? hd - cc.n_rot : hd;
  for (size_t r = 0; r < g.size() / hd; ++r) {
    for (int b = 0; b * blk < n_q; ++b) {
      double amax_g = 0, amax_h = 0;
      for (int i = b * blk; i < std::min(n_q, (b + 1) * blk); ++i) {
        amax_g = std::max(amax_g, std::fabs(double(g[r * hd + i])));
        amax_h = std::max(amax_h, std::fabs(double(h[r * hd + i])));
      }
      for (int i = b * blk; i < std::min(n_q, (b + 1) * blk); ++i) {
        const float x = g[r * hd + i], y = h[r * hd + i];
        ++d.n;
        if (x == y) continue;
        const double maxv = attn ? 448.0 : 6.0;
        // Same scale: the block maxima decode to the same power-of-two scale.
        const double scale = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(std::max(amax_h, 1e-30) / maxv))));
        if (one_code_apart(x, y, grid, scale) || one_code_apart(x, y, grid, scale * 2) || one_code_apart(x, y, grid, scale / 2)) {
          ++d.one_code;
        } else {
          ++d.worse;
          if (d.worse < 5) ADD_FAILURE() << "row " << r << " dim " << i << ": gpu " << x << " cpu " << y;
        }
      }
    }
    if (attn) {  // rope dims: float math, stored as bf16 (packed) or f32
      for (int i = n_q; i < hd; ++i) {
        const double e = std::fabs(double(g[r * hd + i]) - h[r * hd + i]);
        EXPECT_LE(e, (cs.packed ? 8e-3 : 2e-5) * (1 + std::fabs(h[r * hd + i]))) << "rope dim " << i;
      }
    }
  }
  const double share = d.n ? double(d.one_code) / d.n : 0;
  std::printf("[dsv4 cuda] %s hd %d m %d quant on%s: %lld of %lld codes one code apart (%.4f %%), %lld worse\n",
              attn ? (cc.overlap ? "csa" : "hca") : "indexer", hd, cc.ratio, cs.packed ? " packed" : "",
              static_cast<long long>(d.one_code), static_cast<long long>(d.n), 100 * share, static_cast<long long>(d.worse));
  EXPECT_EQ(d.worse, 0);
  EXPECT_LE(share, attn ? 0.005 : 0.01);
}

// Long prefill chunks: more windows than the streaming prefill kernel has blocks (2 an SM), so
// blocks walk several windows and load the next one's candidates while finishing the current
// row. Prefill must stay bit-identical to token-by-token emission (rows and state).
// extremes: some logits -inf (no candidate) and some 90 (the others' weights below 2^-64), so
// pools leave the shared-reciprocal path (dsv4_pool_fixed's division, the indexer kernel's
// per-quad fallback to pool_cand8).
void check_long_prefill(const Case& cs, int n_windows, uint64_t seed, bool extremes = false) {
  const Dsv4Compressor& cc = cs.cc;
  SCOPED_TRACE(::testing::Message() << "long prefill hd " << cc.head_dim << " ratio " << cc.ratio << " overlap " << cc.overlap
                                    << " windows " << n_windows << " extremes " << extremes);
  const int n = cc.ratio * n_windows + 3, W = cc.width(), hd = cc.head_dim;
  const std::vector<float> c = randn(static_cast<size_t>(n) * W, seed, 1.5f),
                           ape = randn(static_cast<size_t>(cc.ratio) * W, seed + 2), norm0 = randn(hd, seed + 3, 0.25f);
  std::vector<float> z = randn(c.size(), seed + 1, 2.0f);
  if (extremes)
    for (size_t i = 0; i < z.size(); ++i) {
      if (i % 29 == 5) z[i] = -INFINITY;
      if (i % 31 == 7) z[i] = 90.0f;
    }
  std::vector<float> norm = norm0;
  for (float& v : norm) v += 1.0f;
  std::vector<int> ones(n, 1);
  const int first = 2 * cc.ratio + 1, second = (n - first) * 3 / 4;
  const std::vector<int> chunks{first, second, n - first - second};
  const RunOut gpu = run_compressor(cs, kGpu, c, z, ape, norm, n, ones);
  const RunOut gpu_pf = run_compressor(cs, kGpu, c, z, ape, norm, n, chunks);
  ASSERT_EQ(gpu.rows, gpu_pf.rows) << "CUDA prefill == CUDA token by token";
  ASSERT_EQ(std::memcmp(gpu.kv.data(), gpu_pf.kv.data(), gpu.kv.size() * 4), 0);
  ASSERT_EQ(std::memcmp(gpu.score.data(), gpu_pf.score.data(), gpu.score.size() * 4), 0);
  if (cs.quant == Dsv4Quant::Off && !cs.packed) {  // float rows: also against the CPU, within the float tolerance
    const RunOut cpu = run_compressor(cs, Device::cpu(), c, z, ape, norm, n, chunks);
    Diff d;
    std::vector<float> g(gpu_pf.rows.size() / 4), h(g.size());
    std::memcpy(g.data(), gpu_pf.rows.data(), g.size() * 4);
    std::memcpy(h.data(), cpu.rows.data(), h.size() * 4);
    cmp_float(g, h, d, "long prefill row value");
  }
}

TEST(Dsv4Cuda, LongPrefillMatchesTokenByToken) {
  REQUIRE_GPU();
  uint64_t seed = 900;
  check_long_prefill({Dsv4Compressor::csa(512, 64, 4), Dsv4Quant::On, true}, 1000, seed++);       // 8 candidates, 2 channels a thread
  check_long_prefill({Dsv4Compressor::indexer(128, 64, 4), Dsv4Quant::On, true}, 1000, seed++);   // 8 candidates, 1 channel a thread
  check_long_prefill({Dsv4Compressor::hca(512, 64, 128), Dsv4Quant::On, true}, 300, seed++);      // one-pass pool, 2 channels
  check_long_prefill({Dsv4Compressor::csa(96, 16, 3), Dsv4Quant::Off, false}, 1000, seed++);      // one-pass pool with overlap
  check_long_prefill({Dsv4Compressor::hca(200, 8, 5), Dsv4Quant::Off, false}, 700, seed++);       // a partial batch of 5
  check_long_prefill({Dsv4Compressor::hca(300, 8, 16), Dsv4Quant::Off, false}, 400, seed++);      // 300 channels: 2 a thread
  // The fast path's other row forms (src/cuda/dsv4/dsv4_prefill.cu): f32 rows with and without the
  // round trip, f16 ape, and inputs it cannot load 16 bytes at a time (the general kernel then).
  for (Dsv4Quant q : {Dsv4Quant::On, Dsv4Quant::Off}) {
    check_long_prefill({Dsv4Compressor::csa(512, 64, 4), q, false}, 600, seed++);
    check_long_prefill({Dsv4Compressor::indexer(128, 64, 4), q, false}, 600, seed++);
    check_long_prefill({Dsv4Compressor::hca(512, 64, 128), q, false}, 40, seed++);
  }
  check_long_prefill({Dsv4Compressor::csa(512, 64, 4), Dsv4Quant::On, true, true}, 300, seed++);
  check_long_prefill({Dsv4Compressor::indexer(128, 64, 4), Dsv4Quant::On, true, true}, 300, seed++);
  check_long_prefill({Dsv4Compressor::hca(512, 64, 128), Dsv4Quant::On, true, true}, 20, seed++);
  check_long_prefill({Dsv4Compressor::hca(512, 64, 8), Dsv4Quant::On, true}, 100, seed++);  // 8 state rows: the three-pass pool, general kernel
  check_long_prefill({Dsv4Compressor::hca(512, 64, 16), Dsv4Quant::On, true}, 200, seed++);  // the fast HCA kernel, two ring turns a window
  check_long_prefill({Dsv4Compressor::hca(512, 64, 20), Dsv4Quant::On, true}, 150, seed++);  // ratio % 8 != 0: general kernel
  check_long_prefill({Dsv4Compressor::csa(512, 64, 4), Dsv4Quant::On, true, false, true}, 200, seed++);
  check_long_prefill({Dsv4Compressor::hca(512, 64, 128), Dsv4Quant::On, true, false, true}, 10, seed++);
  check_long_prefill({Dsv4Compressor::indexer(128, 64, 4), Dsv4Quant::On, true}, 600, seed++, true);
  check_long_prefill({Dsv4Compressor::indexer(128, 64, 4), Dsv4Quant::Off, false}, 300, seed++, true);
  check_long_prefill({Dsv4Compressor::csa(512, 64, 4), Dsv4Quant::On, true}, 300, seed++, true);
}

TEST(Dsv4Cuda, CompressionMatchesCpu) {
  REQUIRE_GPU();
  uint64_t seed = 500;
  for (Dsv4Quant q : {Dsv4Quant::Off, Dsv4Quant::On}) {
    check_case({Dsv4Compressor::csa(512, 64, 4), q, false}, seed++);
    check_case({Dsv4Compressor::hca(512, 64, 128), q, false}, seed++);
    check_case({Dsv4Compressor::indexer(128, 64, 4), q, false}, seed++);
    check_case({Dsv4Compressor::csa(96, 16, 3), q, false}, seed++);   // awkward sizes
    check_case({Dsv4Compressor::hca(200, 8, 5), q, false}, seed++);
    check_case({Dsv4Compressor::indexer(64, 16, 4), q, false}, seed++);
  }
  check_case({Dsv4Compressor::csa(512, 64, 4), Dsv4Quant::On, true}, seed++);
  check_case({Dsv4Compressor::hca(512, 64, 128), Dsv4Quant::On, true}, seed++);
  check_case({Dsv4Compressor::indexer(128, 64, 4), Dsv4Quant::On, true}, seed++);
}

// ---- indexer -----------------------------------------------------------------------------

enum class RowsMode { Random, ZeroEveryThird, AllSame, ZeroAllButTenth };

struct IndexerCase {
  Dsv4Quant quant = Dsv4Quant::Off;
  bool packed = false;
  int H = 64, D = 128, nq = 3, cap = 0, n_rows = 0, k = 0;
  int64_t first = 0;
  RowsMode rows = RowsMode::Random;
  ops::IndexerTopk topk = ops::IndexerTopk::Auto;        // the CUDA top-k kernel
  ops::IndexerScorer scorer = ops::IndexerScorer::Auto;  // the CUDA scorer
  int scorer_warps = 0;                                  // the tensor-core scorer's CTA width
  int scorer_cluster = 0;                                // its clusters (8: sharing the query transform)
  bool sort_four = false;                                // the compact and cluster kernels sort four picks a thread
  bool fused = false;                                    // scores and top-k in one kernel where it serves
};

void check_indexer_once(const IndexerCase& c, std::vector<float>* scores, std::vector<int32_t>* picks) {
  const int H = c.H, D = c.D, nq = c.nq, cap = c.cap, k = c.k;
  const bool packed = c.packed;
  SCOPED_TRACE(::testing::Message() << "quant " << int(c.quant) << " packed " << packed << " H " << H << " D " << D << " nq "
                                    << nq << " cap " << cap << " n_rows " << c.n_rows << " k " << k << " first " << c.first
                                    << " rows mode " << int(c.rows) << " top-k kernel " << int(c.topk)
                                    << " scorer " << int(c.scorer) << " warps " << c.scorer_warps << " cluster " << c.scorer_cluster
                                    << " sort four " << c.sort_four << " fused " << c.fused);
  std::vector<float> rows_f = randn(static_cast<size_t>(cap) * D, 71);
  if (c.rows == RowsMode::ZeroEveryThird)  // many rows scoring exactly 0: ties the top-k must break by row
    for (int s = 0; s < cap; s += 3) std::fill(rows_f.begin() + static_cast<size_t>(s) * D, rows_f.begin() + static_cast<size_t>(s + 1) * D, 0.0f);
  if (c.rows == RowsMode::ZeroAllButTenth)  // most rows score exactly 0: a threshold bin of thousands of ties
    for (int s = 0; s < cap; ++s)
      if (s % 10 != 0) std::fill(rows_f.begin() + static_cast<size_t>(s) * D, rows_f.begin() + static_cast<size_t>(s + 1) * D, 0.0f);
  if (c.rows == RowsMode::AllSame)  // every row scores the same: the picks are rows 0, 1, 2, ...
    for (int s = 1; s < cap; ++s) std::copy(rows_f.begin(), rows_f.begin() + D, rows_f.begin() + static_cast<size_t>(s) * D);
  const int rb = math::dsv4_fp4_row_bytes(D);
  std::vector<uint8_t> rows_p;
  if (packed) {
    rows_p.resize(static_cast<size_t>(cap) * rb);
    for (int s = 0; s < cap; ++s) math::dsv4_pack_fp4_row(rows_f.data() + static_cast<size_t>(s) * D, D, rows_p.data() + static_cast<size_t>(s) * rb);
  }
  Twin<float> q(randn(static_cast<size_t>(nq) * H * D, 72)), w(randn(static_cast<size_t>(nq) * H, 73)), rf(rows_f);
  if (c.rows == RowsMode::ZeroEveryThird || c.rows == RowsMode::ZeroAllButTenth)
    for (float& v : w.h) v = std::fabs(v);
  w.d.copy_from_host(w.h.data(), w.h.size() * 4);
  Twin<uint8_t> rp(packed ? rows_p : std::vector<uint8_t>(1));
  Twin<float> sc(std::vector<float>(static_cast<size_t>(nq) * cap, 0.0f));
  Twin<int32_t> out(std::vector<int32_t>(static_cast<size_t>(nq) * k, 0));
  const TensorRef rows_d = packed ? rp.dev(DType::U8, {cap, rb}) : rf.dev(DType::F32, {cap, D});
  const TensorRef rows_h = packed ? rp.host(DType::U8, {cap, rb}) : rf.host(DType::F32, {cap, D});
  ops::IndexerTuning tuning;
  tuning.topk = c.topk;
  tuning.scorer = c.scorer;
  tuning.scorer_warps = c.scorer_warps;
  tuning.scorer_cluster = c.scorer_cluster;
  tuning.sort_four = c.sort_four;
  tuning.fused = c.fused;
  ops::dsv4_indexer_topk(q.dev(DType::F32, {nq, H, D}), w.dev(DType::F32, {nq, H}), rows_d, c.n_rows, c.first, 4, c.quant,
                         sc.dev(DType::F32, {nq, cap}), out.dev(DType::I32, {nq, k}), tuning);
  std::vector<float> sc_h(static_cast<size_t>(nq) * cap);
  std::vector<int32_t> out_h(static_cast<size_t>(nq) * k);
  dsv4_indexer_topk(q.host(DType::F32, {nq, H, D}), w.host(DType::F32, {nq, H}), rows_h, c.n_rows, c.first, 4, c.quant,
                    view(sc_h, {nq, cap}), host_view(out_h, DType::I32, {nq, k}));
  const std::vector<float> sc_g = sc.down();
  const std::vector<int32_t> out_g = out.down();
  // Error bound per score. score = sum_h w_h relu(sum_d q'_hd k_sd), q' the query as both backends
  // use it (Hadamard + FP4 when quantized: identical bits on both), k the stored row. In f32 with unit
  // roundoff u = 2^-24, any summation order of n terms errs by at most (n - 1) u sum|terms| (first order),
  // relu is 1-Lipschitz and the product w * relu adds one rounding, so each backend's score is within
  // (D + H + 1) u M of the exact value, M = sum_h |w_h| sum_d |q'_hd k_sd|; CPU (sequential) and GPU
  // (its own order) each, hence |gpu - cpu| <= 2 (D + H + 1) u M. Worst-case, order-independent; a wrong
  // term (a missed head or dim) is of order M / (H sqrt(D)) and still far above it.
  std::vector<float> qq(q.h);
  if (c.quant == Dsv4Quant::On)
    for (int r = 0; r < nq * H; ++r) {
      math::dsv4_hadamard(qq.data() + static_cast<size_t>(r) * D, D);
      math::dsv4_fp4_round_trip(qq.data() + static_cast<size_t>(r) * D, D);
    }
  std::vector<float> keys(rows_f);
  if (packed)
    for (int s = 0; s < cap; ++s)
      for (int dd = 0; dd < D; ++dd) keys[static_cast<size_t>(s) * D + dd] = math::dsv4_unpack_fp4_value(rows_p.data() + static_cast<size_t>(s) * rb, D, dd);
  const double u = std::ldexp(1.0, -24);
  Diff d;
  double worst_ratio = 0;
  for (size_t i = 0; i < sc_h.size(); ++i) {
    if (std::isinf(sc_h[i])) {
      ASSERT_EQ(sc_g[i], sc_h[i]) << i;
      continue;
    }
    const int qi = static_cast<int>(i / cap), s = static_cast<int>(i % cap);
    double m = 0;
    for (int h = 0; h < H; ++h) {
      double dot_abs = 0;
      for (int dd = 0; dd < D; ++dd)
        dot_abs += std::fabs(double(qq[(static_cast<size_t>(qi) * H + h) * D + dd]) * keys[static_cast<size_t>(s) * D + dd]);
      m += std::fabs(double(w.h[static_cast<size_t>(qi) * H + h])) * dot_abs;
    }
    const double bound = 2.0 * (D + H + 1) * u * m;
    const double e = std::fabs(double(sc_g[i]) - sc_h[i]);
    d.max_err = std::max(d.max_err, e / (1 + std::fabs(sc_h[i])));
    if (bound > 0) worst_ratio = std::max(worst_ratio, e / bound);
    ASSERT_LE(e, bound) << "score " << i << " cpu " << sc_h[i] << " gpu " << sc_g[i] << " M " << m;
  }
  std::printf("[dsv4 cuda] indexer scores: worst |gpu - cpu| / (2 (D + H + 1) u M) = %.3e\n", worst_ratio);
  int same = 0;
  for (int i = 0; i < nq; ++i) {
    const int64_t vis = std::min<int64_t>(c.n_rows, (c.first + i + 1) / 4);
    std::vector<int> order(static_cast<size_t>(vis));
    std::iota(order.begin(), order.end(), 0);
    const float* s = sc_g.data() + static_cast<size_t>(i) * cap;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });
    for (int j = 0; j < k; ++j)
      ASSERT_EQ(out_g[static_cast<size_t>(i) * k + j], j < vis ? order[j] : -1) << "query " << i << " pick " << j;
    same += std::equal(out_g.begin() + static_cast<ptrdiff_t>(i) * k, out_g.begin() + static_cast<ptrdiff_t>(i + 1) * k,
                       out_h.begin() + static_cast<ptrdiff_t>(i) * k);
  }
  if (c.rows == RowsMode::AllSame) {
    EXPECT_EQ(same, nq);  // equal scores on both: the same picks
  }
  std::printf("[dsv4 cuda] indexer H %d D %d cap %d k %d quant %d packed %d: scores max rel err %.2e, %d/%d queries with the CPU's picks\n",
              H, D, cap, k, int(c.quant), int(packed), d.max_err, same, nq);
  *scores = sc_g;
  *picks = out_g;
}

void check_indexer(const IndexerCase& c) {
  std::vector<float> scores;
  std::vector<int32_t> picks;
  check_indexer_once(c, &scores, &picks);
}

IndexerCase icase(Dsv4Quant quant, bool packed, int cap, int n_rows, int k, int64_t first, RowsMode rows = RowsMode::Random) {
  IndexerCase c;
  c.quant = quant;
  c.packed = packed;
  c.cap = cap;
  c.n_rows = n_rows;
  c.k = k;
  c.first = first;
  c.rows = rows;
  return c;
}

TEST(Dsv4Cuda, IndexerMatchesCpu) {
  REQUIRE_GPU();
  check_indexer(icase(Dsv4Quant::Off, false, 3001, 2900, 512, 4 * 2900));
  check_indexer(icase(Dsv4Quant::On, true, 3001, 2900, 512, 4 * 2900));
  check_indexer(icase(Dsv4Quant::On, false, 1201, 700, 1024, 1000));  // fewer visible rows than k: -1 picks
  check_indexer(icase(Dsv4Quant::Off, false, 2000, 2000, 700, 8000, RowsMode::ZeroEveryThird));  // ties at score 0
}

// The tiled scorer's edges and the top-k's shapes: heads not a multiple of 64 (a partial chunk),
// other dims (the shared-memory Hadamard path, the general scorer for dim % 4 != 0), queries whose
// visible rows differ, a row count that is not a multiple of the tile, k at its maximum, k > rows,
// no visible rows at all, all scores equal (every pick a tie, broken by row), and more visible
// rows than the top-k keeps in shared memory (keys read from global memory).
TEST(Dsv4Cuda, IndexerShapes) {
  REQUIRE_GPU();
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 777, 777, 100, 2 * 777 - 3);  // visible rows 388, 388, 389, 389, 389
    c.H = 72, c.D = 64, c.nq = 5;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 333, 301, 40, 4 * 301);
    c.H = 5, c.D = 30, c.nq = 2;  // the general scorer
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 500, 450, 64, 4 * 450);
    c.H = 3, c.D = 36, c.nq = 2;  // tiled, one partial head chunk
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, false, 4100, 4099, 2048, 4 * 4099);  // k at its maximum
    c.nq = 1;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 40, 40, 5, 10);  // 2 or 3 visible rows of 40, k 5: then -1
    c.nq = 4;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 64, 64, 8, 2);  // query 0 sees no row: all -1
    c.nq = 3;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 1500, 1500, 512, 4 * 1500, RowsMode::AllSame);
    c.nq = 2;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 40000, 39990, 512, 4 * 40000);  // > 32768 rows: keys in global memory
    c.H = 8, c.D = 64, c.nq = 2;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 40000, 39990, 600, 4 * 40000, RowsMode::AllSame);
    c.H = 4, c.D = 32, c.nq = 1;
    check_indexer(c);
  }
}

// The top-k's two strategies: after the first 12-bit radix pass, the keys of the threshold's bin
// become candidates when at most 4096 (the last passes and the ties over them only), else every
// pass sweeps all keys. Cases for both, with keys in shared and in global memory: the model's
// 64k-context shape (16383 rows, odd), k close to the row count, a threshold among thousands of
// zero-score ties (> 4096: all-keys path; < 4096: candidates path, ties in row order), all equal.
TEST(Dsv4Cuda, IndexerTopkPaths) {
  REQUIRE_GPU();
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 17921, 16383, 512, 4 * 16383 + 2);  // the model's shape at 64k
    c.nq = 2;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 2048, 2047, 512, 4 * 2047 + 1);  // the model's shape at 8k: 16-row tiles with scores16
    c.nq = 1;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 2101, 2099, 2048, 4 * 2099 + 3);  // k close to the row count
    c.H = 16, c.nq = 2;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 9001, 9001, 1000, 4 * 9001, RowsMode::ZeroAllButTenth);  // 8100 ties: all keys
    c.H = 8, c.D = 64, c.nq = 2;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 3333, 3333, 700, 4 * 3333, RowsMode::ZeroAllButTenth);  // 3000 ties: candidates
    c.H = 8, c.D = 64, c.nq = 2;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 9000, 8999, 2047, 4 * 8999, RowsMode::AllSame);  // all ties, > 4096
    c.H = 4, c.D = 32, c.nq = 1;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 50001, 50001, 1500, 4 * 50001, RowsMode::ZeroAllButTenth);  // global keys, ties
    c.H = 4, c.D = 32, c.nq = 1;
    check_indexer(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 45001, 45001, 999, 4 * 45001);  // global keys, candidates path
    c.H = 4, c.D = 32, c.nq = 2;
    check_indexer(c);
  }
}

// The three top-k kernels (ops::IndexerTuning), each against the oracle of check_indexer_once and
// against each other (identical scores, identical picks), on the compact kernels' paths: the
// threshold's 12-bit bin as candidates (the model's 8k and 64k shapes) or, past 4096 keys in it,
// all keys; the keys equal to the threshold all taken, or the lowest rows among them; k above the
// visible rows; k and the visible rows at the compact kernels' limits and one past them (the
// ordered kernel then serves every choice). The cluster kernel also meets rows too few to give
// each of its 8 CTAs some (below 29 visible rows, or chunks of 32 where 250 are visible). Where
// the device has no clusters (compute capability < 9.0), asking for it gets the automatic choice.
// The compact and cluster kernels run with either sort (one or four picks a thread), over sorts
// of 64 to 1024 picks. The fused scores + top-k runs on every case too (with either sort): its
// scores must be the tensor-core scorer's bits and its picks the others' (where it does not serve,
// on SIMT-scored cases, the separate kernels run instead).
void check_topk_kernels_agree(IndexerCase c) {
  std::vector<float> s_ordered, s_other;
  std::vector<int32_t> p_ordered, p_other;
  c.topk = ops::IndexerTopk::Ordered;
  check_indexer_once(c, &s_ordered, &p_ordered);
  for (const ops::IndexerTopk kind : {ops::IndexerTopk::Compact, ops::IndexerTopk::Cluster}) {
    for (const bool four : {false, true}) {
      SCOPED_TRACE("top-k kernel " + std::to_string(static_cast<int>(kind)) + (four ? " sort four" : ""));
      c.topk = kind;
      c.sort_four = four;
      check_indexer_once(c, &s_other, &p_other);
      ASSERT_EQ(s_ordered.size(), s_other.size());
      EXPECT_EQ(std::memcmp(s_ordered.data(), s_other.data(), s_ordered.size() * 4), 0) << "the same scorer runs before each";
      EXPECT_EQ(p_ordered, p_other);
    }
  }
  c.topk = ops::IndexerTopk::Auto;
  c.fused = true;
  for (const bool four : {false, true}) {
    SCOPED_TRACE(std::string("fused scores + top-k") + (four ? " sort four" : ""));
    c.sort_four = four;
    check_indexer_once(c, &s_other, &p_other);
    ASSERT_EQ(s_ordered.size(), s_other.size());
    EXPECT_EQ(std::memcmp(s_ordered.data(), s_other.data(), s_ordered.size() * 4), 0) << "the tensor-core scorer's bits";
    EXPECT_EQ(p_ordered, p_other);
  }
}

TEST(Dsv4Cuda, IndexerTopkKernelsAgree) {
  REQUIRE_GPU();
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 2048, 2047, 512, 4 * 2047 + 1);  // the model's shape at 8k
    c.nq = 2;
    check_topk_kernels_agree(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 17921, 16383, 512, 4 * 16383 + 2);  // the model's shape at 64k
    c.nq = 1;
    check_topk_kernels_agree(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 9001, 9001, 1000, 4 * 9001, RowsMode::ZeroAllButTenth);  // 8100 ties: all keys
    c.H = 8, c.D = 64, c.nq = 2;
    check_topk_kernels_agree(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 3333, 3333, 700, 4 * 3333, RowsMode::ZeroAllButTenth);  // 3000 ties: candidates
    c.H = 8, c.D = 64, c.nq = 2;
    check_topk_kernels_agree(c);
  }
  check_topk_kernels_agree(icase(Dsv4Quant::Off, false, 2000, 2000, 700, 8000, RowsMode::ZeroEveryThird));  // ties at 0
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 1500, 1500, 512, 4 * 1500, RowsMode::AllSame);  // all equal: rows 0 .. 511
    c.nq = 2;
    check_topk_kernels_agree(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 300, 300, 290, 999, RowsMode::AllSame);  // 250 visible of k 290, all equal
    c.H = 16;
    check_topk_kernels_agree(c);
  }
  check_topk_kernels_agree(icase(Dsv4Quant::On, false, 1201, 700, 1024, 1000));  // k above the visible rows: then -1
  check_topk_kernels_agree(icase(Dsv4Quant::On, false, 2000, 2000, 100, 8000));  // a sort of 128 (one warp of fours)
  check_topk_kernels_agree(icase(Dsv4Quant::On, false, 2000, 2000, 200, 8000));  // a sort of 256 (one shared stage)
  check_topk_kernels_agree(icase(Dsv4Quant::On, false, 64, 40, 16, 4 * 20 + 1));  // 21 visible rows: the cluster's last CTAs have none
  check_topk_kernels_agree(icase(Dsv4Quant::On, true, 64, 40, 16, 4 * 20 + 1));   // the same, scored on tensor cores (fused)
  check_topk_kernels_agree(icase(Dsv4Quant::On, true, 64, 40, 16, 0));  // no visible rows for 3 queries: every score -inf, picks -1
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 1100, 1100, 1024, 4 * 1100);  // k at the compact kernel's limit
    c.H = 16, c.nq = 2;
    check_topk_kernels_agree(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 3000, 3000, 1025, 4 * 3000);  // k one past it
    c.H = 4, c.D = 32, c.nq = 1;
    check_topk_kernels_agree(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 32768, 32768, 300, 4 * 32768);  // visible rows at the limit
    c.H = 4, c.D = 32, c.nq = 2;
    check_topk_kernels_agree(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::Off, false, 32769, 32769, 300, 4 * 32769);  // one past it
    c.H = 4, c.D = 32, c.nq = 1;
    check_topk_kernels_agree(c);
  }
}

// The two scorers (ops::IndexerTuning), each against the oracle of check_indexer_once (scores
// within the f32 bound, picks in the order of its own scores), on the tensor-core scorer's shapes
// (quantized query, packed rows of dim 128): the model's 8k and 64k shapes, heads past one
// accumulator pass of 64 (72) and a partial n8 tile (5), queries whose visible rows differ and
// end inside a tile, 2 or 3 visible rows of 40, all rows equal (ties through the scorer), k at
// 2048; and a shape it does not serve (dim 64), where asking for it runs the SIMT scorer. The
// tensor-core scorer at each CTA width (4, 8, 16 warps: tiles of 64, 128, 256 rows) and in
// clusters of 8 CTAs sharing the query transform (grids padded to whole clusters).
void check_scorers(IndexerCase c) {
  std::vector<float> scores;
  std::vector<int32_t> picks;
  c.scorer = ops::IndexerScorer::Simt;
  check_indexer_once(c, &scores, &picks);
  c.scorer = ops::IndexerScorer::TensorCore;
  for (const int warps : {0, 4, 8, 16}) {  // 0: the automatic width
    c.scorer_warps = warps;
    check_indexer_once(c, &scores, &picks);
  }
  c.scorer_warps = 0;
  c.scorer_cluster = 8;
  check_indexer_once(c, &scores, &picks);
}

TEST(Dsv4Cuda, IndexerScorers) {
  REQUIRE_GPU();
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 2048, 2047, 512, 4 * 2047 + 1);  // the model's shape at 8k
    c.nq = 2;
    check_scorers(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 17921, 16383, 512, 4 * 16383 + 2);  // the model's shape at 64k
    c.nq = 1;
    check_scorers(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 777, 777, 100, 2 * 777 - 3);  // visible rows 388, 388, 389, 389, 389
    c.H = 72, c.nq = 5;
    check_scorers(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 500, 450, 64, 4 * 450);
    c.H = 5, c.nq = 2;
    check_scorers(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 40, 40, 5, 10);
    c.nq = 4;
    check_scorers(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 1500, 1500, 512, 4 * 1500, RowsMode::AllSame);
    c.nq = 2;
    check_scorers(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 2101, 2099, 2048, 4 * 2099 + 3);  // k at its maximum
    c.H = 16, c.nq = 2;
    check_scorers(c);
  }
  {
    IndexerCase c = icase(Dsv4Quant::On, true, 777, 777, 100, 2 * 777 - 3);  // dim 64: the SIMT scorer serves
    c.H = 8, c.D = 64, c.nq = 2;
    check_scorers(c);
  }
}

// NaN scores on CUDA: every NaN counts as one value above +inf, ties by row, the CPU's rule, in
// both top-k kernels after both kinds of scorer (f32 rows: SIMT; packed FP4 rows: tensor core).
// Query 0 has a NaN weight (every score NaN: the picks are rows 0, 1, ...); query 1 an infinite
// one (+inf where that head's dot is > 0, NaN where it is not); query 2 is finite. The picks are
// checked against the rule applied to the device's own scores, NaN positions against the CPU's,
// and query 0's picks against the CPU's.
TEST(Dsv4Cuda, IndexerNanScores) {
  REQUIRE_GPU();
  const int H = 8, D = 128, nq = 3, cap = 3000, k = 700, rb = math::dsv4_fp4_row_bytes(D);
  const int64_t first = 4 * cap;  // every query sees every row
  std::vector<float> w_h = randn(static_cast<size_t>(nq) * H, 83), rows_f = randn(static_cast<size_t>(cap) * D, 81);
  w_h[0 * H + 5] = NAN;
  w_h[1 * H + 2] = INFINITY;
  std::vector<uint8_t> rows_p(static_cast<size_t>(cap) * rb);
  for (int s = 0; s < cap; ++s) math::dsv4_pack_fp4_row(rows_f.data() + static_cast<size_t>(s) * D, D, rows_p.data() + static_cast<size_t>(s) * rb);
  Twin<float> q(randn(static_cast<size_t>(nq) * H * D, 82)), w(w_h), rf(rows_f);
  Twin<uint8_t> rp(rows_p);
  for (const bool packed : {false, true}) {
    const Dsv4Quant quant = packed ? Dsv4Quant::On : Dsv4Quant::Off;
    const TensorRef rows_d = packed ? rp.dev(DType::U8, {cap, rb}) : rf.dev(DType::F32, {cap, D});
    const TensorRef rows_h = packed ? rp.host(DType::U8, {cap, rb}) : rf.host(DType::F32, {cap, D});
    std::vector<float> sc_h(static_cast<size_t>(nq) * cap);
    std::vector<int32_t> out_h(static_cast<size_t>(nq) * k);
    dsv4_indexer_topk(q.host(DType::F32, {nq, H, D}), w.host(DType::F32, {nq, H}), rows_h, cap, first, 4, quant,
                      view(sc_h, {nq, cap}), host_view(out_h, DType::I32, {nq, k}));
    for (const ops::IndexerTopk kind : {ops::IndexerTopk::Ordered, ops::IndexerTopk::Compact, ops::IndexerTopk::Cluster}) {
      SCOPED_TRACE(::testing::Message() << "packed " << packed << " top-k kernel " << int(kind));
      Twin<float> sc(std::vector<float>(static_cast<size_t>(nq) * cap, 0.0f));
      Twin<int32_t> out(std::vector<int32_t>(static_cast<size_t>(nq) * k, 0));
      ops::IndexerTuning tuning;
      tuning.topk = kind;
      ops::dsv4_indexer_topk(q.dev(DType::F32, {nq, H, D}), w.dev(DType::F32, {nq, H}), rows_d, cap, first, 4, quant,
                             sc.dev(DType::F32, {nq, cap}), out.dev(DType::I32, {nq, k}), tuning);
      const std::vector<float> sc_g = sc.down();
      const std::vector<int32_t> out_g = out.down();
      int n_nan1 = 0, n_inf1 = 0;
      for (int i = 0; i < nq; ++i) {
        const float* s = sc_g.data() + static_cast<size_t>(i) * cap;
        for (int r = 0; r < cap; ++r) {
          ASSERT_EQ(std::isnan(s[r]), std::isnan(sc_h[static_cast<size_t>(i) * cap + r])) << "query " << i << " row " << r;
          if (i == 1) {
            n_nan1 += std::isnan(s[r]);
            n_inf1 += s[r] == INFINITY;
          }
        }
        std::vector<int> order(cap);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
          if (std::isnan(s[a]) || std::isnan(s[b])) return std::isnan(s[a]) && !std::isnan(s[b]);
          return s[a] > s[b];
        });
        for (int j = 0; j < k; ++j) ASSERT_EQ(out_g[static_cast<size_t>(i) * k + j], order[j]) << "query " << i << " pick " << j;
      }
      EXPECT_TRUE(std::equal(out_h.begin(), out_h.begin() + k, out_g.begin())) << "query 0: all NaN, the CPU's picks";
      EXPECT_GT(n_nan1, 0);
      EXPECT_EQ(n_nan1 + n_inf1, cap);
    }
  }
}

// ---- the cache on CUDA against the cache on the CPU ----------------------------------------

void check_cache(Dsv4Quant quant) {
  SCOPED_TRACE(quant == Dsv4Quant::On ? "quant on" : "quant off");
  Dsv4CacheConfig cfg;
  cfg.quant = quant;
  cfg.layers = {Dsv4LayerKind::Window, Dsv4LayerKind::CSA, Dsv4LayerKind::HCA};
  cfg.hca_ratio = 16;
  cfg.index_topk = 8;
  cfg.max_context = 160;
  cfg.max_seqs = 2;
  Dsv4Cache gpu(cfg, kGpu), cpu(cfg, Device::cpu());
  for (Dsv4Cache* cache : {&gpu, &cpu}) {  // sequences 0 and 1 of each
    ASSERT_EQ(cache->create(), 0);
    ASSERT_EQ(cache->create(), 1);
  }
  for (int l = 1; l < 3; ++l) {
    const Dsv4Compressor c = cfg.compressor(cfg.layers[l]), ix = cfg.indexer();
    std::vector<float> ca = randn(static_cast<size_t>(c.ratio) * c.width(), 80 + l), cn = randn(c.head_dim, 90 + l, 0.2f);
    std::vector<float> ia = randn(static_cast<size_t>(ix.ratio) * ix.width(), 100 + l), in = randn(ix.head_dim, 110 + l, 0.2f);
    for (float& v : cn) v += 1;
    for (float& v : in) v += 1;
    Dsv4LayerWeights w{view(ca, {c.ratio, c.width()}), view(cn, {c.head_dim}), view(ia, {ix.ratio, ix.width()}), view(in, {ix.head_dim})};
    gpu.set_weights(l, w);
    cpu.set_weights(l, w);
  }
  const int n = 150;
  // seq 0 token by token, seq 1 in chunks: both caches.
  const std::vector<int> chunks = {7, 1, 30, 5, 64, 43};
  for (int seq = 0; seq < 2; ++seq) {
    int p = 0;
    for (size_t ci = 0; p < n; ++ci) {
      const int len = seq == 0 ? 1 : chunks[ci];
      for (int l = 0; l < 3; ++l) {
        const int wc = l == 0 ? 0 : cfg.compressor(cfg.layers[l]).width(), wi = 2 * cfg.index_dim;
        std::vector<float> kv, cc, cz, ic, iz;
        for (int t = p; t < p + len; ++t) {  // token data depends on (position, layer) only, not on chunking
          const uint64_t s = 7000 + 31 * t + l;
          auto a = randn(512, s, 2.0f), b = randn(wc, s + 1), c2 = randn(wc, s + 2, 2.0f), d2 = randn(wi, s + 3), e = randn(wi, s + 4, 2.0f);
          kv.insert(kv.end(), a.begin(), a.end());
          cc.insert(cc.end(), b.begin(), b.end());
          cz.insert(cz.end(), c2.begin(), c2.end());
          ic.insert(ic.end(), d2.begin(), d2.end());
          iz.insert(iz.end(), e.begin(), e.end());
        }
        for (Dsv4Cache* cache : {&gpu, &cpu}) {
          const Device dv = cache->device();
          Buffer bkv = Buffer::from_host(kv, dv);
          Buffer bcc = wc ? Buffer::from_host(cc, dv) : Buffer(), bcz = wc ? Buffer::from_host(cz, dv) : Buffer();
          Buffer bic = Buffer::from_host(ic, dv), biz = Buffer::from_host(iz, dv);
          Dsv4TokenInputs in;
          in.kv = TensorRef(bkv.data(), DType::F32, dv, {len, 512});
          if (wc) {
            in.comp_c = TensorRef(bcc.data(), DType::F32, dv, {len, wc});
            in.comp_z = TensorRef(bcz.data(), DType::F32, dv, {len, wc});
          }
          if (cfg.layers[l] == Dsv4LayerKind::CSA) {
            in.idx_c = TensorRef(bic.data(), DType::F32, dv, {len, wi});
            in.idx_z = TensorRef(biz.data(), DType::F32, dv, {len, wi});
          }
          cache->append(seq, l, p, in);
          synchronize(dv);
        }
      }
      p += len;
    }
  }
  const std::vector<double> e4 = e4m3_grid();
  for (int l = 0; l < 3; ++l) {
    for (int seq = 0; seq < 2; ++seq) {
      EXPECT_EQ(gpu.read_window(seq, l), cpu.read_window(seq, l)) << "window rows are codec output: bit-identical";
      if (l == 0) continue;
      const std::vector<float> g = gpu.read_compressed(seq, l), h = cpu.read_compressed(seq, l);
      ASSERT_EQ(g.size(), h.size());
      if (quant == Dsv4Quant::Off) {
        Diff d;
        cmp_float(g, h, d, "compressed value");
        std::printf("[dsv4 cuda] cache quant off layer %d seq %d: max rel err %.2e\n", l, seq, d.max_err);
        continue;
      }
      int64_t diff = 0;
      for (size_t i = 0; i < g.size(); ++i) diff += g[i] != h[i];
      std::printf("[dsv4 cuda] cache layer %d seq %d: %lld of %zu compressed values differ from the CPU\n", l, seq,
                  static_cast<long long>(diff), g.size());
      EXPECT_LE(double(diff), 0.005 * g.size());
    }
    if (l != 0) {
      EXPECT_EQ(gpu.read_compressed(0, l), gpu.read_compressed(1, l)) << "CUDA decode == CUDA prefill";
      if (l == 1) {
        EXPECT_EQ(gpu.read_indexer(0, l), gpu.read_indexer(1, l));
      }
    }
  }
}

TEST(Dsv4Cuda, CacheDecodeAndPrefillMatchCpu) {
  REQUIRE_GPU();
  check_cache(Dsv4Quant::On);
  check_cache(Dsv4Quant::Off);
}

}  // namespace
