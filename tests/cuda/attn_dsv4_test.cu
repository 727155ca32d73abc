// CUDA DeepSeek-V4 sparse decode attention against the CPU op and float64.
// Tolerance 2e-5 relative to max(1, max |ref|) (f32 dot products of 512 dims).
#include <gtest/gtest.h>

#include <cstdio>

#include "attention_dsv4_util.hpp"
#include "attention_test_util.hpp"

using namespace dsv4_test;

TEST(AttnCuda, Dsv4SparseDecodeMatchesCpuAndFloat64) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  double worst = 0;
  struct Shape {
    int rows, heads, n_window, k, n_comp;
    bool f16;
    int comp_pad = 0;  // 4: rows 588 bytes apart, not 8-byte aligned (the element-by-element path)
  };
  for (Shape sh : {Shape{1, 64, 128, 512, 2048, true}, Shape{3, 64, 37, 100, 300, false}, Shape{2, 13, 128, 0, 1, true},
                   Shape{5, 64, 1, 1000, 1500, true}, Shape{2, 64, 37, 200, 300, false, 4}, Shape{1, 64, 128, 512, 2048, true, 8}}) {
    Case c;
    c.rows = sh.rows;
    c.heads = sh.heads;
    c.n_window = sh.n_window;
    c.k = sh.k;
    c.n_comp = sh.n_comp;
    c.f16_window = sh.f16;
    c.comp_pad = sh.comp_pad;
    c.seed = 7 + sh.rows;
    fill(c);
    const auto ref = reference(c);
    const auto cpu = run(c, Device::cpu());
    for (int splits : {0, 1, 7}) {
      const auto gpu = run(c, Device::cuda(0), splits);
      const double e_ref = attn_test::max_rel_err(gpu, ref), e_cpu = attn_test::max_rel_err(gpu, cpu);
      worst = std::max(worst, e_ref);
      EXPECT_LE(e_ref, 2e-5) << "rows " << sh.rows << " heads " << sh.heads << " k " << sh.k << " splits " << splits;
      EXPECT_LE(e_cpu, 2e-5);
    }
  }
  std::printf("[attn cuda] dsv4: worst relative error vs float64 %.3g\n", worst);
}

TEST(AttnCuda, Dsv4BadIndexThrowsAndLeavesOutput) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Case c;
  c.rows = 2;
  c.heads = 8;
  c.k = 8;
  c.n_comp = 10;
  fill(c);
  c.idx[5] = 10;
  Dev g;
  upload(c, Device::cuda(0), g);
  std::vector<float> sentinel(g.out.size() / 4, 3.0f);
  g.out.copy_from_host(sentinel.data(), g.out.size());
  EXPECT_THROW(g.run(), Error);
  EXPECT_EQ(g.out.to_host<float>(), sentinel);
}

TEST(AttnCuda, Dsv4WindowRingsFromAPool) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Case c;
  c.rows = 3;
  c.heads = 64;
  c.k = 64;
  fill(c);
  const auto ref = reference(c);
  const std::vector<int32_t> idx{4, 1, 2};
  std::vector<float> pool = window_ring_pool(c, idx, 5);
  Dev g;
  upload(c, Device::cuda(0), g);
  Buffer bp = Buffer::from_host(pool, Device::cuda(0)), bi = Buffer::from_host(idx, Device::cuda(0));
  g.layer.window_kv = TensorRef(bp.data(), DType::F32, Device::cuda(0), {5, c.n_window, kD});
  g.step.maybe_window_index = TensorRef(bi.data(), DType::I32, Device::cuda(0), {c.rows});
  g.run();
  EXPECT_LE(attn_test::max_rel_err(g.out.to_host<float>(), ref), 2e-5);
}
