// rope_apply on CUDA against the CPU backend on fresh random inputs of awkward sizes: every
// variant and dtype, in place and out of place, aligned (vectorized kernel paths) and
// misaligned/strided (scalar path) views, i32 and i64 positions.
//
// Both backends call the same math (math/rope.hpp: sin/cos from double, non-contracted f32
// rotation), so the outputs are expected to be bit-identical. The assertions are looser,
// so a toolchain difference shows up as a measured rate rather than a hard stop:
//   f32: |cuda - cpu| <= 2^-21 * (|x0| + |x1|) * m per value (about 2 ulps of the pair's scale);
//   f16/bf16: at most one unit in the last place apart, in at most 1e-3 of the values.
// The test prints how many values differed at all (expected: 0).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/error.hpp"
#include "kvcore/ops/rope.hpp"
#include "kvcore/runtime.hpp"
#include "rope_reference.hpp"

using namespace kvcore;

namespace {

struct Layout {
  int64_t st, sh, offset;  // element strides and the view's first element inside its buffer
  int64_t elems;           // buffer size in elements
};

Layout make_layout(int tokens, int heads, int hd, int mode) {
  // mode 0: contiguous; 1: padded strides (odd); 2: contiguous but shifted by one element
  Layout l;
  l.sh = mode == 1 ? hd + 3 : hd;
  l.st = mode == 1 ? heads * l.sh + 7 : heads * l.sh;
  l.offset = mode == 2 ? 1 : 0;
  l.elems = l.offset + l.st * tokens + 4;
  return l;
}

std::vector<RopeSpec> all_variants(int head_dim, std::mt19937_64& rng) {
  std::vector<RopeSpec> v;
  const int n_rots[] = {head_dim, 64 <= head_dim ? 64 : head_dim, 2 * (head_dim / 6)};
  for (int n_rot : n_rots) {
    if (n_rot <= 0) continue;
    RopeSpec plain = RopeSpec::plain(n_rot, 10000.0);
    RopeSpec lin = plain;
    lin.scaling = RopeScaling::Linear;
    lin.factor = 8.0;
    RopeSpec l3 = RopeSpec::llama3_8b();
    l3.n_rot = n_rot;
    RopeSpec yarn = RopeSpec::deepseek_v4_compressed();
    yarn.n_rot = n_rot;
    yarn.attention_factor = 1.2;
    RopeSpec ff = RopeSpec::plain(n_rot, 1e6);
    for (int i = 0; i < n_rot / 2; ++i) ff.freq_factors.push_back(1.0f + static_cast<float>(rng() % 5));
    for (RopeSpec s : {plain, lin, l3, yarn, ff})
      for (RopeSlice sl : {RopeSlice::Head, RopeSlice::Tail})
        for (RopePairing pr : {RopePairing::NeoX, RopePairing::Interleaved}) {
          s.slice = sl;
          s.pairing = pr;
          v.push_back(s);
        }
  }
  return v;
}

struct Stats {
  int64_t values = 0, differing = 0, worse_than_1ulp = 0;
  double worst_f32_ratio = 0;
};

}  // namespace

TEST(RopeCuda, MatchesCpuOnAwkwardShapes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const uint64_t seed = std::random_device{}();
  std::printf("RopeCuda seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  const Device gpu = Device::cuda(0);
  Stats stats[3];
  const int head_dims[] = {64, 66, 80, 128, 192, 256, 512};
  const int token_counts[] = {1, 37, 1001, 2053};
  int case_id = 0;
  for (int hd : head_dims)
    for (const RopeSpec& spec : all_variants(hd, rng)) {
      const int di = case_id % 3;
      const DType dt = di == 0 ? DType::F32 : di == 1 ? DType::F16 : DType::BF16;
      const int tokens = token_counts[(case_id / 3) % 4], heads = 1 + (case_id / 2) % 5;
      const int mode = (case_id / 5) % 3;
      const bool in_place = (case_id % 2) == 0;
      const DType pdt = (case_id % 7) < 3 ? DType::I64 : DType::I32;
      const RopeAttentionFactor factor = (case_id % 4) < 2 ? RopeAttentionFactor::Apply : RopeAttentionFactor::Skip;
      ++case_id;
      const size_t es = dtype_size(dt);

      const Layout lx = make_layout(tokens, heads, hd, mode);
      const Layout lo = make_layout(tokens, heads, hd, (mode + 1) % 3);
      std::vector<uint8_t> hx = rope_ref::random_storage(dt, lx.elems, rng);
      std::vector<uint8_t> ho = rope_ref::random_storage(dt, lo.elems, rng);
      std::vector<int64_t> pos(tokens);
      std::uniform_int_distribution<int64_t> pu(-200000, 1100000);
      for (auto& p : pos) p = pu(rng);
      std::vector<uint8_t> hp(tokens * dtype_size(pdt));
      for (int t = 0; t < tokens; ++t) {
        if (pdt == DType::I32) {
          const int32_t v = static_cast<int32_t>(pos[t]);
          std::memcpy(hp.data() + 4 * t, &v, 4);
        } else {
          std::memcpy(hp.data() + 8 * t, &pos[t], 8);
        }
      }
      auto view = [&](void* base, const Layout& l, Device d) {
        return TensorRef(static_cast<uint8_t*>(base) + l.offset * es, dt, d, {tokens, heads, hd}, {l.st, l.sh, 1});
      };
      // CPU
      std::vector<uint8_t> cx = hx, co = ho;
      TensorRef cpos(hp.data(), pdt, Device::cpu(), {tokens});
      if (in_place) rope_apply(view(cx.data(), lx, Device::cpu()), cpos, spec, factor);
      else rope_apply(view(cx.data(), lx, Device::cpu()), cpos, spec, factor, view(co.data(), lo, Device::cpu()));
      // CUDA
      Buffer gx(hx.size(), gpu), go(ho.size(), gpu), gp(hp.size(), gpu);
      gx.copy_from_host(hx.data(), hx.size());
      go.copy_from_host(ho.data(), ho.size());
      gp.copy_from_host(hp.data(), hp.size());
      TensorRef gpos(gp.data(), pdt, gpu, {tokens});
      if (in_place) rope_apply(view(gx.data(), lx, gpu), gpos, spec, factor);
      else rope_apply(view(gx.data(), lx, gpu), gpos, spec, factor, view(go.data(), lo, gpu));
      synchronize(gpu);
      std::vector<uint8_t> rx(hx.size()), ro(ho.size());
      gx.copy_to_host(rx.data(), rx.size());
      go.copy_to_host(ro.data(), ro.size());

      // Compare every byte of both buffers (gaps and pass-through dims included).
      const std::vector<uint8_t>& want = in_place ? cx : co;
      const std::vector<uint8_t>& got = in_place ? rx : ro;
      ASSERT_EQ(in_place ? co : cx, in_place ? ro : rx) << "the buffer that is not written differs";
      const double m = factor == RopeAttentionFactor::Apply ? spec.attention_factor : 1.0;
      Stats& st = stats[di];
      for (size_t e = 0; e < want.size() / es; ++e) {
        ++st.values;
        if (std::memcmp(want.data() + e * es, got.data() + e * es, es) == 0) continue;
        ++st.differing;
        const double a = rope_ref::load(dt, want.data(), e), b = rope_ref::load(dt, got.data(), e);
        if (dt == DType::F32) {
          // scale of the pair: bound by the largest input magnitude (|x| < 2 here), per value
          const double tol = std::ldexp(1.0, -21) * 4.0 * m;
          st.worst_f32_ratio = std::max(st.worst_f32_ratio, std::abs(a - b) / tol);
          ASSERT_LE(std::abs(a - b), tol) << spec.describe() << " f32 element " << e;
        } else {
          uint16_t ua, ub;
          std::memcpy(&ua, want.data() + e * es, 2);
          std::memcpy(&ub, got.data() + e * es, 2);
          const bool one_ulp = (ua ^ ub) < 0x8000 && (ua > ub ? ua - ub : ub - ua) == 1;
          if (!one_ulp) ++st.worse_than_1ulp;
          ASSERT_TRUE(one_ulp) << spec.describe() << " " << dtype_name(dt) << " element " << e << ": " << a << " vs " << b;
        }
      }
    }
  const char* names[] = {"f32", "f16", "bf16"};
  for (int k = 0; k < 3; ++k) {
    std::printf("rope_apply cuda vs cpu, %s: %lld values, %lld differ (rate %.2e), worst f32 err/tol %.3f\n", names[k],
                (long long)stats[k].values, (long long)stats[k].differing,
                stats[k].values ? double(stats[k].differing) / stats[k].values : 0.0, stats[k].worst_f32_ratio);
    if (k > 0) {
      EXPECT_LE(double(stats[k].differing), 1e-3 * double(stats[k].values)) << names[k];
    }
  }
  std::printf("cases: %d\n", case_id);
}

// Errors on the device path leave device memory untouched, like on the CPU.
TEST(RopeCuda, BadArgumentsWriteNothing) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const Device gpu = Device::cuda(0);
  const int T = 5, H = 2, D = 128;
  std::mt19937_64 rng(3);
  std::vector<uint8_t> hx = rope_ref::random_storage(DType::F16, T * H * D, rng);
  Buffer gx(hx.size(), gpu), gp(T * 4, gpu);
  gx.copy_from_host(hx.data(), hx.size());
  std::vector<int32_t> hp(T, 3);
  gp.copy_from_host(hp.data(), T * 4);
  TensorRef x(gx.data(), DType::F16, gpu, {T, H, D});
  TensorRef p_host(hp.data(), DType::I32, Device::cpu(), {T});
  TensorRef p_short(gp.data(), DType::I32, gpu, {T - 1});
  EXPECT_THROW(rope_apply(x, p_host, RopeSpec::plain(128, 1e4), RopeAttentionFactor::Skip), Error);
  EXPECT_THROW(rope_apply(x, p_short, RopeSpec::plain(128, 1e4), RopeAttentionFactor::Skip), Error);
  TensorRef p(gp.data(), DType::I32, gpu, {T});
  EXPECT_THROW(rope_apply(x, p, RopeSpec::plain(256, 1e4), RopeAttentionFactor::Skip), Error);
  EXPECT_EQ(gx.to_host<uint8_t>(), hx);
}
