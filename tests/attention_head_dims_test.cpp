// Head dims beyond the powers of two (80, 96, 112, 192: Phi, Qwen-VL, Gemma-style models)
// and K and V of different widths (DeepSeek-V2/V3 MLA: 576-dim K, 512-dim V) on the CPU,
// against the float64 reference, on the SIMD kernel and on the scalar path; and what the
// plan and the cache refuse (e4m3 pages need head dims that are multiples of 64).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "attention_test_util.hpp"
#include "cpu/simd_targets.hpp"

using namespace attn_test;

namespace {

namespace cpu = kvcore::ops::cpu;

// As tests/attention_decode_test.cpp: relative to max(1, max |ref|).
double tolerance(const CaseSpec& s) {
  if (s.out == DType::BF16) return 8e-3;
  if (s.out == DType::F16) return 1e-3;
  return s.rope_on_read ? 1e-4 : 2e-5;
}

double worst = 0;

// The case on the default path (SIMD where it serves) and on the scalar path.
void check(const CaseSpec& s, int splits = 0) {
  const HostCase c = make_case(s);
  const std::vector<double> ref = reference(c);
  for (bool scalar : {false, true}) {
    cpu::SimdPin pin(scalar ? cpu::kSimdScalar : cpu::kSimdDefault);
    const std::vector<float> got = run_op(c, Device::cpu(), splits);
    ASSERT_EQ(got.size(), ref.size());
    const double err = max_rel_err(got, ref);
    worst = std::max(worst, err);
    EXPECT_LE(err, tolerance(s)) << "kv " << dtype_name(s.kv) << " D " << s.head_dim << " DV " << s.dv() << " group "
                                 << s.n_q_heads / s.n_kv_heads << " splits " << splits << " scalar " << scalar
                                 << " prefill " << !s.q_tokens.empty() << " rope " << s.rope_on_read;
  }
}

void expect_error(const std::function<void()>& f, const char* needle) {
  try {
    f();
    ADD_FAILURE() << "no throw, expected " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(AttentionHeadDims, DecodeEveryNewHeadDimFormatAndGroup) {
  worst = 0;
  int n = 0;
  for (int D : {80, 96, 112, 192})
    for (DType kv : {DType::F32, DType::F16, DType::BF16})
      for (int group : {1, 4, 6}) {
        CaseSpec s;
        s.kv = kv;
        s.head_dim = D;
        s.n_kv_heads = group == 6 ? 1 : 2;
        s.n_q_heads = group * s.n_kv_heads;
        s.seq_cells = {37, 1, 70};
        s.dead_rate = 0.2;
        s.sinks = group == 4;
        s.seed = 4000 + n++;
        check(s, n % 3);
      }
  std::printf("[attention] head dims 80/96/112/192 decode: worst relative error %.3g\n", worst);
}

// FP8 pages at the new head dim that is a multiple of 64, both scale layouts.
TEST(AttentionHeadDims, Fp8At192) {
  for (bool f32s : {false, true}) {
    CaseSpec s;
    s.kv = DType::E4M3;
    s.f32_scales = f32s;
    s.head_dim = 192;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {45, 20};
    s.dead_rate = 0.1;
    s.seed = 4100 + f32s;
    check(s);
  }
}

TEST(AttentionHeadDims, PrefillRopeOnReadWindowAtNewHeadDims) {
  int n = 0;
  for (int D : {80, 96, 112, 192})
    for (uint64_t layout : {1, 2}) {  // NeoX head slice / interleaved tail slice (make_case)
      CaseSpec s;
      s.kv = D == 96 ? DType::BF16 : DType::F16;
      s.head_dim = D;
      s.n_q_heads = 8;
      s.n_kv_heads = 2;
      s.seq_cells = {40, 19, 33};
      s.q_tokens = {9, 19, 1};
      s.dead_rate = 0.1;
      s.rope_on_read = true;
      s.rope_dims = D == 80 ? 0 : D / 2;  // 80: every dim rotated
      s.window = n % 2 ? 11 : 0;
      s.seed = 4200 + layout + 8 * n++;
      check(s, 2);
      s.q_tokens.clear();  // the same pages, decode
      check(s);
    }
}

// DeepSeek-V2/V3 MLA with absorbed projections: one kv head of 576 dims (512 latent + 64
// rope dims at the tail), V the 512-dim latent, many query heads; softmax scale 576^-0.5.
TEST(AttentionHeadDims, Mla576KeyWith512Value) {
  worst = 0;
  int n = 0;
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::E4M3})
    for (bool prefill : {false, true}) {
      CaseSpec s;
      s.kv = kv;
      s.f32_scales = kv == DType::E4M3 && prefill;
      s.head_dim = 576;
      s.v_head_dim = 512;
      s.n_q_heads = 16;
      s.n_kv_heads = 1;
      s.seq_cells = {50, 17};
      if (prefill) s.q_tokens = {6, 3};
      s.dead_rate = 0.1;
      s.sinks = prefill;
      s.seed = 4302 + 4 * n++;  // seed & 2: the rotated dims are the tail
      if (kv == DType::BF16) {
        s.rope_on_read = true;
        s.rope_dims = 64;
      }
      check(s, prefill ? 0 : 3);
    }
  std::printf("[attention] K 576 / V 512: worst relative error %.3g\n", worst);
}

// The default softmax scale is K's head_dim^-0.5, and the output is V's width.
TEST(AttentionHeadDims, MlaDefaultScaleIsKeyWidthAndOutputIsValueWidth) {
  CaseSpec s;
  s.head_dim = 576;
  s.v_head_dim = 512;
  s.n_q_heads = 4;
  s.n_kv_heads = 1;
  s.seq_cells = {30};
  const HostCase c = make_case(s);  // c.softmax_scale = 576^-0.5
  DeviceCase g;
  make_device_case(c, Device::cpu(), g);
  g.layer.softmax_scale = 0.0f;
  std::vector<float> out(static_cast<size_t>(c.rows) * 4 * 512, 42.0f);
  g.run(TensorRef(out.data(), DType::F32, Device::cpu(), {c.rows, 4, 512}));
  EXPECT_LE(max_rel_err(out, reference(c)), 2e-5);
  // An output as wide as K is refused, naming v_head_dim, and left untouched.
  std::vector<float> wide(static_cast<size_t>(c.rows) * 4 * 576, 42.0f);
  expect_error([&] { g.run(TensorRef(wide.data(), DType::F32, Device::cpu(), {c.rows, 4, 576})); },
               "out must be f32, f16 or bf16 [n_rows = 1, n_q_heads = 4, v_head_dim = 512]");
  EXPECT_EQ(wide, std::vector<float>(wide.size(), 42.0f));
}

// V read in place from K's rows (MLA's shared layout: V is the first 512 dims of each 576-dim K
// row): a strided view of K's pool (and, e4m3, of K's scales) gives bit for bit the output of the
// same values copied into a V pool of their own. Views whose rows overlap or whose strides are
// not those of rows of a wider pool are refused naming pages.v; a plan keeps its V's stride.
TEST(AttentionHeadDims, MlaValueAsAViewOfTheKeyRows) {
  for (DType kv : {DType::F16, DType::E4M3}) {
    SCOPED_TRACE(dtype_name(kv));
    CaseSpec s;
    s.kv = kv;
    s.head_dim = 576;
    s.v_head_dim = 512;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.seq_cells = {40, 23};
    s.dead_rate = 0.1;
    s.seed = 4390;
    const HostCase c = make_case(s);
    DeviceCase g;
    make_device_case(c, Device::cpu(), g);
    const int64_t nb = c.num_blocks, bs = s.block_size, H = s.n_kv_heads, rows = nb * bs * H;
    const size_t el = dtype_size(kv);
    // The latent copied out: V rows of 512 (and 8 scale bytes) taken from each K row.
    std::vector<uint8_t> v_copy(static_cast<size_t>(rows) * 512 * el), vs_copy(static_cast<size_t>(rows) * 8);
    const auto* kd = static_cast<const uint8_t*>(g.kv.k.data());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&v_copy[r * 512 * el], kd + r * 576 * el, 512 * el);
    PagedKV copied = g.kv, in_place = g.kv;
    copied.v = TensorRef(v_copy.data(), kv, Device::cpu(), {nb, bs, H, 512});
    in_place.v = TensorRef(g.kv.k.data(), kv, Device::cpu(), {nb, bs, H, 512}, {bs * H * 576, H * 576, 576, 1});
    if (kv == DType::E4M3) {
      const auto* ks = static_cast<const uint8_t*>(g.kv.k_scale.data());
      for (int64_t r = 0; r < rows; ++r) std::memcpy(&vs_copy[r * 8], ks + r * 9, 8);
      copied.v_scale = TensorRef(vs_copy.data(), DType::UE8M0, Device::cpu(), {nb, bs, H, 8});
      in_place.v_scale =
          TensorRef(g.kv.k_scale.data(), DType::UE8M0, Device::cpu(), {nb, bs, H, 8}, {bs * H * 9, H * 9, 9, 1});
    }
    const int64_t n_out = c.rows * s.n_q_heads * 512;
    std::vector<float> a(static_cast<size_t>(n_out), 7.0f), b(static_cast<size_t>(n_out), 9.0f);
    auto run = [&](const PagedKV& pages, std::vector<float>& out) {
      const AttentionPlan plan = ops::attn::plan_paged(false, pages, s.n_q_heads, g.step, g.sched, g.tuning);
      plan.run(g.q_ref, pages, TensorRef(out.data(), DType::F32, Device::cpu(), {c.rows, s.n_q_heads, 512}), g.layer);
    };
    run(copied, a);
    run(in_place, b);
    EXPECT_EQ(a, b) << "V read in place from K's rows differs from the same V copied out";

    // Rows that overlap (stride < 512) or strides that are not rows of a wider pool: refused.
    PagedKV bad = in_place;
    bad.v = TensorRef(g.kv.k.data(), kv, Device::cpu(), {nb, bs, H, 512}, {bs * H * 500, H * 500, 500, 1});
    expect_error([&] { run(bad, b); }, "pages.v must be contiguous [num_blocks, block_size, n_kv_heads, v_head_dim] or rows");
    bad.v = TensorRef(g.kv.k.data(), kv, Device::cpu(), {nb, bs, H, 512}, {bs * H * 576, 576, 576, 1});
    expect_error([&] { run(bad, b); }, "pages.v must be contiguous");
    // A plan made for V in place refuses pages whose V is laid out otherwise (and writes nothing).
    const AttentionPlan plan = ops::attn::plan_paged(false, in_place, s.n_q_heads, g.step, g.sched, g.tuning);
    std::vector<float> untouched(static_cast<size_t>(n_out), 5.0f);
    expect_error(
        [&] {
          plan.run(g.q_ref, copied, TensorRef(untouched.data(), DType::F32, Device::cpu(), {c.rows, s.n_q_heads, 512}),
                   g.layer);
        },
        "pages.v is");
    EXPECT_EQ(untouched, std::vector<float>(untouched.size(), 5.0f));
  }
}

TEST(AttentionHeadDims, PlanRefusesWhatNoKernelServes) {
  CaseSpec s;
  s.head_dim = 64;
  s.seq_cells = {20};
  const HostCase c = make_case(s);
  DeviceCase g;
  make_device_case(c, Device::cpu(), g);
  std::vector<uint8_t> raw(static_cast<size_t>(c.num_blocks) * 16 * 2 * 576 * 2, 0);  // f16 [nb, 16, 2, 576]
  const int64_t nb = c.num_blocks;
  PagedKV kv = g.kv;
  // e4m3 pages of head_dim 80: no whole 64-value scale blocks.
  std::vector<uint8_t> sc(static_cast<size_t>(nb) * 16 * 2, 127);
  kv.k = TensorRef(raw.data(), DType::E4M3, Device::cpu(), {nb, 16, 2, 80});
  kv.v = kv.k;
  kv.k_scale = kv.v_scale = TensorRef(sc.data(), DType::UE8M0, Device::cpu(), {nb, 16, 2, 1});
  expect_error([&] { (void)AttentionPlan::decode(kv, 8, g.step); }, "e4m3 pages with head_dim 80 and v_head_dim 80");
  kv.k_scale = kv.v_scale = TensorRef();
  // 576 needs V 512; 512 needs V 512; an unlisted width.
  kv.k = TensorRef(raw.data(), DType::F16, Device::cpu(), {nb, 16, 2, 576});
  kv.v = kv.k;
  expect_error([&] { (void)AttentionPlan::decode(kv, 8, g.step); }, "head_dim 576 has no attention kernel");
  kv.k = TensorRef(raw.data(), DType::F16, Device::cpu(), {nb, 16, 2, 512});
  kv.v = TensorRef(raw.data(), DType::F16, Device::cpu(), {nb, 16, 2, 576});
  expect_error([&] { (void)AttentionPlan::decode(kv, 8, g.step); }, "v_head_dim 576 differs from head_dim 512");
  kv.k = kv.v = TensorRef(raw.data(), DType::F16, Device::cpu(), {nb, 16, 2, 72});
  expect_error([&] { (void)AttentionPlan::decode(kv, 8, g.step); }, "head_dim 72 has no attention kernel");
  // K and V pools of other blocks or heads.
  kv.k = TensorRef(raw.data(), DType::F16, Device::cpu(), {nb, 16, 2, 576});
  kv.v = TensorRef(raw.data(), DType::F16, Device::cpu(), {nb, 16, 1, 512});
  expect_error([&] { (void)AttentionPlan::decode(kv, 8, g.step); }, "must have the same blocks, block size and kv heads");
  // A q of V's width for MLA pages.
  kv.v = TensorRef(raw.data(), DType::F16, Device::cpu(), {nb, 16, 2, 512});
  const AttentionPlan plan = AttentionPlan::decode(kv, 8, g.step);
  std::vector<float> q(8 * 512), out(8 * 512);
  expect_error([&] {
    plan.run(TensorRef(q.data(), DType::F32, Device::cpu(), {1, 8, 512}), kv,
             TensorRef(out.data(), DType::F32, Device::cpu(), {1, 8, 512}));
  }, "q must be f32, f16 or bf16 [n_rows = 1, n_q_heads = 8, head_dim = 576]");
}

// The cache accepts the new head dims for its attention and refuses FP8 where a head dim is
// no multiple of 64, naming the field.
TEST(AttentionHeadDims, CacheAcceptsNewHeadDimsRefusesFp8Off64) {
  auto config = [](int d) {
    PagedCacheConfig c;
    c.n_layers = 1;
    c.n_kv_heads = 1;
    c.head_dim = c.v_head_dim = d;
    c.num_blocks = 4;
    c.rope = {RopeSpec::plain(d / 2, 10000.0)};
    return c;
  };
  for (int d : {80, 96, 112, 192}) EXPECT_NO_THROW(PagedCache(config(d), Device::cpu())) << d;
  PagedCacheConfig c = config(80);
  c.k_format = c.v_format = KvFormat::Fp8;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "fp8 K needs head_dim % 64 == 0, got 80");
  c = config(192);
  c.k_format = c.v_format = KvFormat::Fp8;
  EXPECT_NO_THROW(PagedCache(c, Device::cpu()));
  c = config(96);
  c.v_head_dim = 80;
  expect_error([&] { PagedCache cache(c, Device::cpu()); }, "v_head_dim 80 differs from head_dim 96");
}
