// kv_store_layers on the CPU: every layer's K against a float64 rotation of its source and V
// against its source; the same bytes as kv_store per layer; bad inputs throw, naming the
// argument, and write nothing; which shapes the one-launch CUDA kernel takes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "kv_store_layers_util.hpp"
#include "ops/kv_store_layers_params.hpp"
#include "ops/kv_store_row.hpp"

using namespace kvcore;
using kvsl_test::LayersCase;

namespace {

LayersCase with(KvFormat kf, KvFormat vf, DType src, bool rotate) {
  LayersCase c;
  c.kf = kf;
  c.vf = vf;
  c.src = src;
  c.rotate = rotate;
  c.spec.attention_factor = 1.1;
  return c;
}

// Worst |stored - f64 reference| / rowmax over every stored row of every layer, part by part.
double worst_error(const LayersCase& c, const kvsl_test::LayersInputs& in, const kvsl_test::LayersPools& p, bool is_k) {
  const int32_t D = is_k ? c.Dk : c.Dv;
  const KvFormat f = is_k ? c.kf : c.vf;
  double worst = 0;
  std::vector<double> want(D);
  for (int32_t l = 0; l < c.layers; ++l) {
    const KvPool& pool = is_k ? p.k[l] : p.v[l];
    const uint8_t* data = static_cast<const uint8_t*>(pool.data.data());
    const uint8_t* scales = static_cast<const uint8_t*>(pool.scales.data());
    const int64_t row_bytes = kv_row_width(f, D) * static_cast<int64_t>(dtype_size(kv_format_dtype(f)));
    const std::vector<double>& src = (is_k ? in.k : in.v).values[l];
    for (int32_t t = 0; t < c.n; ++t) {
      if (in.slots[t] < 0) continue;
      for (int32_t h = 0; h < c.H; ++h) {
        const double* raw = src.data() + (static_cast<int64_t>(t) * c.H + h) * D;
        if (is_k && c.rotate) paged_test::expected_k(raw, D, in.table, in.positions[t], want.data());
        else want.assign(raw, raw + D);
        double rowmax = 0;
        for (double x : want) rowmax = std::max(rowmax, std::abs(x));
        const int64_t r = static_cast<int64_t>(in.slots[t]) * c.H + h;
        for (int32_t d = 0; d < D; ++d) {
          const float got = kvrow::decode(f, data + r * row_bytes, scales ? scales + r * (D / 64) : nullptr, d);
          worst = std::max(worst, std::abs(got - want[d]) / rowmax);
        }
      }
    }
  }
  return worst;
}

double tolerance(KvFormat f) {
  const double eps = f == KvFormat::Fp8 ? 1.0 / 16 : paged_test::format_eps(f);
  return 1.5 * eps + 2.4e-7 * 100000 + 1e-6;  // f32 angles at positions up to 100000
}

class KvStoreLayers : public ::testing::TestWithParam<KvFormat> {};

TEST_P(KvStoreLayers, MatchesF64AndPerLayerStoresBitForBit) {
  const KvFormat f = GetParam();
  for (DType src : {DType::F32, DType::F16, DType::BF16}) {
    for (bool rotate : {true, false}) {
      for (KvFormat vf : {f, KvFormat::F16}) {
        LayersCase c = with(f, vf, src, rotate);
        c.seed = 11 + static_cast<uint64_t>(src) * 7 + rotate;
        const std::string what = std::string(kv_format_name(f)) + "/" + std::string(kv_format_name(vf)) + " from " +
                                 std::string(dtype_name(src)) + (rotate ? " rotated" : " unrotated");
        const kvsl_test::LayersInputs in = kvsl_test::make_inputs(c, Device::cpu());
        const kvsl_test::LayersPools fused = kvsl_test::make_pools(c, Device::cpu());
        const kvsl_test::LayersPools each = kvsl_test::make_pools(c, Device::cpu());
        kvsl_test::store_fused(c, in, fused);
        kvsl_test::store_per_layer(c, in, each);
        EXPECT_EQ(fused.bytes(), each.bytes()) << what;
        EXPECT_LE(worst_error(c, in, fused, true), tolerance(f)) << what;
        EXPECT_LE(worst_error(c, in, fused, false), tolerance(vf)) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, KvStoreLayers,
                         ::testing::Values(KvFormat::F32, KvFormat::F16, KvFormat::BF16, KvFormat::Fp8),
                         [](const auto& info) { return std::string(kv_format_name(info.param)); });

TEST(KvStoreLayersShapes, InterleavedPartialRotationNoVAndOddDims) {
  // Shapes the one-launch kernel refuses go through kv_store per layer: still the same bytes.
  LayersCase a;  // interleaved pairs over the whole row
  a.spec = RopeSpec::plain(128, 10000.0, RopePairing::Interleaved);
  LayersCase b;  // a rotated tail of 64 dims of 128
  b.spec = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  b.spec.slice = RopeSlice::Tail;
  LayersCase c;  // no V
  c.Dv = 0;
  LayersCase d;  // K and V of different widths, 16-bit
  d.Dk = 48;
  d.Dv = 80;
  d.spec = RopeSpec::plain(48, 10000.0);
  for (LayersCase* x : {&a, &b, &c, &d}) {
    const kvsl_test::LayersInputs in = kvsl_test::make_inputs(*x, Device::cpu());
    const kvsl_test::LayersPools fused = kvsl_test::make_pools(*x, Device::cpu());
    const kvsl_test::LayersPools each = kvsl_test::make_pools(*x, Device::cpu());
    kvsl_test::store_fused(*x, in, fused);
    kvsl_test::store_per_layer(*x, in, each);
    EXPECT_EQ(fused.bytes(), each.bytes()) << "case " << (x - &a);
    EXPECT_LE(worst_error(*x, in, fused, true), tolerance(x->kf));
  }
}

TEST(KvStoreLayersErrors, BadInputsThrowNamingTheArgumentAndWriteNothing) {
  LayersCase c = with(KvFormat::Fp8, KvFormat::F16, DType::F16, true);
  const kvsl_test::LayersInputs in = kvsl_test::make_inputs(c, Device::cpu());
  kvsl_test::LayersPools p = kvsl_test::make_pools(c, Device::cpu());
  const auto before = p.bytes();
  auto expect_refused = [&](const std::function<void()>& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "accepted; wanted an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(p.bytes(), before) << "a refused call wrote to a pool (" << needle << ")";
  };
  const TensorRef v = in.v.tensor;
  // Fewer pools than layers.
  expect_refused([&] {
    kv_store_layers(in.k.tensor, v, in.slots_t, std::span<const KvPool>(p.k).first(2), p.v, in.positions_t, in.rope());
  }, "k_pools");
  expect_refused([&] {
    kv_store_layers(in.k.tensor, v, in.slots_t, p.k, std::span<const KvPool>(p.v).first(2), in.positions_t, in.rope());
  }, "v_pools");
  // The last layer's V pool has the wrong head dim: found before the first layer is written.
  {
    std::vector<KvPool> bad_v = p.v;
    bad_v.back().head_dim = 64;
    expect_refused([&] { kv_store_layers(in.k.tensor, v, in.slots_t, p.k, bad_v, in.positions_t, in.rope()); },
                   "v_pools[2]");
    bad_v = p.v;  // layer 0's pool: kv_store's own checks
    bad_v.front().head_dim = 64;
    expect_refused([&] { kv_store_layers(in.k.tensor, v, in.slots_t, p.k, bad_v, in.positions_t, in.rope()); },
                   "pool.data");
  }
  // The last layer's K pool lacks its scales.
  {
    std::vector<KvPool> bad_k = p.k;
    bad_k.back().scales = TensorRef();
    expect_refused([&] { kv_store_layers(in.k.tensor, v, in.slots_t, bad_k, p.v, in.positions_t, in.rope()); },
                   "k_pools[2]");
  }
  // A slot outside the pool.
  {
    std::vector<int32_t> slots = in.slots;
    slots.back() = c.blocks * c.bs;
    const TensorRef st(slots.data(), DType::I32, Device::cpu(), {c.n});
    expect_refused([&] { kv_store_layers(in.k.tensor, v, st, p.k, p.v, in.positions_t, in.rope()); }, "slots[");
  }
  // V given without V pools; V of another token count.
  expect_refused([&] { kv_store_layers(in.k.tensor, v, in.slots_t, p.k, {}, in.positions_t, in.rope()); },
                 "v given without v_pools");
  {
    const TensorRef short_v(v.data(), v.dtype(), v.device(), {c.layers, c.n - 1, c.H, c.Dv});
    expect_refused([&] { kv_store_layers(in.k.tensor, short_v, in.slots_t, p.k, p.v, in.positions_t, in.rope()); },
                   "v");
  }
  // k not 4-D.
  expect_refused([&] {
    kv_store_layers(kvsl_test::layer_view(in.k.tensor, 0), v, in.slots_t, p.k, p.v, in.positions_t, in.rope());
  }, "k");
  // Positions of another length.
  {
    const TensorRef short_pos(const_cast<int32_t*>(in.positions.data()), DType::I32, Device::cpu(), {c.n - 1});
    expect_refused([&] { kv_store_layers(in.k.tensor, v, in.slots_t, p.k, p.v, short_pos, in.rope()); }, "positions");
  }
}

// Which shapes the one-launch CUDA kernel takes (planned on the host, so checked here).
TEST(KvStoreLayersPlan, TheLlamaShapesTakeOneLaunchOthersFallBack) {
  auto plan = [](const LayersCase& c) {
    const kvsl_test::LayersInputs in = kvsl_test::make_inputs(c, Device::cpu());
    const kvsl_test::LayersPools p = kvsl_test::make_pools(c, Device::cpu());
    const KvStoreParams k0 = ops::kv_store_checked("t", kvsl_test::layer_view(in.k.tensor, 0), in.slots_t, p.k[0],
                                                   c.rotate ? in.positions_t : TensorRef(), c.rotate ? in.rope() : nullptr, {});
    KvStoreParams v0;
    if (c.Dv > 0) v0 = ops::kv_store_checked("t", kvsl_test::layer_view(in.v.tensor, 0), in.slots_t, p.v[0], {}, nullptr, {});
    auto r = ops::one_launch_params(k0, c.Dv > 0 ? &v0 : nullptr, p.k, p.v, in.k.tensor.stride(0),
                                    c.Dv > 0 ? in.v.tensor.stride(0) : 0, 0, c.layers);
    if (r) {  // the pools of every layer, in order
      for (int32_t l = 0; l < c.layers; ++l) {
        EXPECT_EQ(r->k_pool[l], p.k[l].data.data());
        if (c.Dv > 0) {
          EXPECT_EQ(r->v_pool[l], p.v[l].data.data());
        }
        if (c.kf == KvFormat::Fp8) {
          EXPECT_EQ(r->k_scales[l], p.k[l].scales.data());
        }
      }
    }
    return r;
  };
  for (KvFormat f : {KvFormat::F16, KvFormat::BF16, KvFormat::F32, KvFormat::Fp8}) {
    LayersCase c = with(f, f, DType::F16, true);
    const auto r = plan(c);
    ASSERT_TRUE(r.has_value()) << kv_format_name(f);
    EXPECT_EQ(r->rot, KvLayersRot::Neox);
    EXPECT_EQ(r->any_fp8, f == KvFormat::Fp8 ? 1 : 0);
    c.rotate = false;
    ASSERT_TRUE(plan(c).has_value());
    EXPECT_EQ(plan(c)->rot, KvLayersRot::None);
  }
  LayersCase tail;  // a partial rotation: per layer
  tail.spec = RopeSpec::plain(64, 10000.0);
  tail.spec.slice = RopeSlice::Tail;
  EXPECT_FALSE(plan(tail).has_value());
  LayersCase widths = with(KvFormat::Fp8, KvFormat::Fp8, DType::F16, false);  // FP8 with K and V of other widths
  widths.Dv = 64;
  EXPECT_FALSE(plan(widths).has_value());
  widths.kf = widths.vf = KvFormat::F16;  // 16-bit: no group shuffles, any widths
  EXPECT_TRUE(plan(widths).has_value());
  LayersCase odd;  // head_dim not a multiple of 16
  odd.Dk = odd.Dv = 40;
  odd.spec = RopeSpec::plain(40, 10000.0);
  EXPECT_FALSE(plan(odd).has_value());
  LayersCase small_neox = with(KvFormat::Fp8, KvFormat::Fp8, DType::F16, true);  // NeoX FP8 rows of 64
  small_neox.Dk = small_neox.Dv = 64;
  small_neox.spec = RopeSpec::plain(64, 10000.0);
  EXPECT_FALSE(plan(small_neox).has_value());
}

}  // namespace

namespace {

// The kernel's unit map (locate_unit), run on the host over every thread of a token's grid row:
// each dim of each row of each layer is covered exactly once, and an FP8 row's units lie in one
// warp starting at a multiple of their count (the group amax shuffles xor lanes 1, 2 and 4).
TEST(KvStoreLayersPlan, UnitsCoverEveryDimOnceAndFp8RowsStayInTheirWarp) {
  struct Shape {
    int32_t layers, heads, dk, dv;
    KvLayersRot rot;
    bool fp8;
  };
  const Shape shapes[] = {{32, 8, 128, 128, KvLayersRot::Neox, true},   {3, 3, 64, 64, KvLayersRot::None, true},
                          {5, 1, 256, 256, KvLayersRot::Neox, true},    {2, 3, 512, 0, KvLayersRot::Interleaved, true},
                          {7, 3, 48, 80, KvLayersRot::Neox, false},     {64, 2, 16, 32, KvLayersRot::None, false}};
  for (const Shape& s : shapes) {
    KvStoreLayersParams p;
    p.n_layers = s.layers;
    p.n_heads = s.heads;
    p.k_dim = s.dk;
    p.v_dim = s.dv;
    p.rot = s.rot;
    const int64_t units = token_units(p);
    const int64_t threads = (units + 255) / 256 * 256;
    std::vector<int> seen_k(static_cast<size_t>(s.layers) * s.heads * s.dk, 0),
        seen_v(static_cast<size_t>(s.layers) * s.heads * s.dv, 0);
    int64_t active = 0;
    for (int64_t idx = 0; idx < threads; ++idx) {
      const KvLayersUnit w = locate_unit(p, idx);
      if (!w.active) continue;
      ++active;
      ASSERT_LT(w.layer, s.layers);
      ASSERT_LT(w.head, s.heads);
      std::vector<int>& seen = w.is_k ? seen_k : seen_v;
      for (int32_t d : {w.d0, w.d1})
        for (int32_t k = 0; k < 8; ++k) ++seen[(static_cast<size_t>(w.layer) * s.heads + w.head) * w.dim + d + k];
      if (s.fp8) {  // the row's first unit is at a lane that is a multiple of its unit count
        const int32_t R = w.dim / 16;
        const int64_t first = idx - w.u;
        EXPECT_EQ(first % R, 0) << "row of layer " << w.layer << " head " << w.head << " starts at unit " << first;
        EXPECT_EQ(first / 32, (first + R - 1) / 32) << "a row straddles a warp";
      }
    }
    EXPECT_EQ(active, units);
    for (int c : seen_k) ASSERT_EQ(c, 1);
    for (int c : seen_v) ASSERT_EQ(c, 1);
  }
}

}  // namespace
