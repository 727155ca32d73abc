// Bad inputs to shift_dense and rope_shift_rows: kvcore::Error naming the
// values, and every cache byte unchanged.
#include <gtest/gtest.h>

#include <functional>

#include "ops/tuning.hpp"
#include "shift_test_util.hpp"

using namespace kvcore;
using namespace shift_test;

namespace {

// Runs `call`, expects Error(code) whose message contains every `needle`, and the layer's bytes unchanged.
void expect_rejected(Layer& L, const std::function<void()>& call, const std::vector<std::string>& needles,
                     ErrorCode code = ErrorCode::InvalidArgument) {
  const auto k = L.k, s = L.s, v = L.v;
  try {
    call();
    ADD_FAILURE() << "no error for a bad input (expected " << needles[0] << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks '" << n << "'";
  }
  EXPECT_EQ(k, L.k);
  EXPECT_EQ(s, L.s);
  EXPECT_EQ(v, L.v);
}

}  // namespace

TEST(ShiftErrors, CountsOutOfRange) {
  Layer L = make_layer(LayerSpec{}, 20, 1);
  std::vector<ShiftDenseLayer> v{L.host_view()};
  expect_rejected(L, [&] { shift_dense(v, 20, 15, 6); }, {"n_keep + n_discard", "15", "6", "21", "20"});
  expect_rejected(L, [&] { shift_dense(v, 20, -1, 2); }, {"n_keep", "-1"});
  expect_rejected(L, [&] { shift_dense(v, 20, 1, -2); }, {"n_discard", "-2"});
  expect_rejected(L, [&] { shift_dense(v, -3, 0, 0); }, {"length", "-3"});
  expect_rejected(L, [&] { shift_dense(v, 21, 1, 2); }, {"length 21", "capacity 20"});
  expect_rejected(L, [&] { shift_dense({}, 20, 1, 2); }, {"no layers"});
}

TEST(ShiftErrors, ShapesStridesDevicesAndRope) {
  Layer L = make_layer(LayerSpec{}, 20, 2);
  Layer M = make_layer(LayerSpec{}, 20, 3);
  {  // a second, valid layer with a bad V capacity: nothing may change in either layer
    ShiftDenseLayer a = L.host_view(), b = M.host_view();
    b.maybe_v = TensorRef(M.v.data(), DType::F16, Device::cpu(), {19, 2, 128});
    std::vector<ShiftDenseLayer> v{a, b};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"layers[1].maybe_v capacity 19", "capacity 20"});
    EXPECT_EQ(M.k, make_layer(LayerSpec{}, 20, 3).k);
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.maybe_v = TensorRef(L.v.data(), DType::F16, Device::cpu(), {20, 3, 64});
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"3 kv heads", "has 2"});
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.k = TensorRef(L.k.data(), DType::F16, Device::cpu(), {10, 2, 128}, {128, 128, 1});  // tokens overlap
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"stride[0] = 128", "256"});
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.k = TensorRef(L.k.data(), DType::F16, Device::cpu(), {10, 2, 128}, {512, 256, 1});  // heads not packed
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"stride[1] must be 128", "256"});
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.rope = RopeSpec::plain(130, 10000.0);
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"layers[0].rope", "130", "head_dim 128"});
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.maybe_v = TensorRef(L.v.data(), DType::F16, Device::cuda(0), {20, 2, 128});
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"cpu", "cuda:0"});
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.maybe_v = TensorRef(L.v.data(), DType::I32, Device::cpu(), {20, 2, 64});
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"maybe_v must be f32, f16 or bf16", "i32"});
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.maybe_v = a.k;  // K and V the same memory
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"share the data pointer"});
  }
}

TEST(ShiftErrors, Fp8AndRowsArguments) {
  LayerSpec sp;
  sp.form = KForm::Fp8;
  Layer L = make_layer(sp, 12, 4);
  {
    ShiftDenseLayer a = L.host_view();
    a.maybe_k_scales = TensorRef();
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"maybe_k_scales is missing"});
  }
  {
    ShiftDenseLayer a = L.host_view();
    a.maybe_k_scales = TensorRef(L.s.data(), DType::UE8M0, Device::cpu(), {12, 2, 1});
    std::vector<ShiftDenseLayer> v{a};
    expect_rejected(L, [&] { shift_dense(v, 10, 1, 2); }, {"maybe_k_scales must be [12, 2, 2]", "[12, 2, 1]"});
  }
  {
    LayerSpec wide = sp;  // wider than any pool head (kMaxKvHeadDim 576)
    wide.head_dim = 640;
    wide.rope = RopeSpec::plain(64, 10000.0);
    Layer W = make_layer(wide, 12, 5);
    std::vector<ShiftDenseLayer> v{W.host_view()};
    expect_rejected(W, [&] { shift_dense(v, 10, 1, 2); }, {"head_dim must be a multiple of 64 and <= 576", "640"});
  }
  const ShiftDenseLayer a = L.host_view();
  std::vector<int32_t> d(12, -3);
  expect_rejected(L, [&] { rope_shift_rows(a.k, a.maybe_k_scales, a.rope, TensorRef(d.data(), DType::I32, Device::cpu(), {11})); },
                  {"delta.shape[0] must be 12", "[11]"});
  expect_rejected(L, [&] { rope_shift_rows(a.k, a.maybe_k_scales, a.rope, TensorRef(d.data(), DType::I64, Device::cpu(), {6})); },
                  {"delta must be i32", "i64"});
  d[7] = 1 << 25;
  expect_rejected(L, [&] { rope_shift_rows(a.k, a.maybe_k_scales, a.rope, TensorRef(d.data(), DType::I32, Device::cpu(), {12})); },
                  {"delta[7] = 33554432"});
}

TEST(ShiftErrors, DeepSeekV4RowsMustBe16BitAligned) {
  LayerSpec sp;
  sp.form = KForm::Dsv4;
  sp.heads = 1;
  sp.v_dtype = std::nullopt;
  sp.rope = RopeSpec::deepseek_v4_window();
  Layer L = make_layer(sp, 6, 5);
  ShiftDenseLayer a = L.host_view();
  a.k = TensorRef(L.k.data() + 1, DType::U8, Device::cpu(), {5, 1, 584});
  std::vector<ShiftDenseLayer> v{a};
  expect_rejected(L, [&] { shift_dense(v, 5, 1, 2); }, {"even address"});
}

TEST(ShiftErrors, KernelChoiceOutOfRange) {
  Layer L = make_layer(LayerSpec{}, 20, 1);
  std::vector<ShiftDenseLayer> v{L.host_view()};
  expect_rejected(L, [&] { ops::shift_dense(v, 20, 1, 2, static_cast<ops::ShiftKernel>(7)); }, {"kernel", "7"});
  expect_rejected(L, [&] { ops::shift_dense(v, 20, 1, 2, static_cast<ops::ShiftKernel>(-1)); }, {"kernel", "-1"});
}
