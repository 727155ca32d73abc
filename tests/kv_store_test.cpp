// kv_store and kv_rotate_blocks on the CPU against float64 references; what a rotation
// must leave byte-identical; bad inputs throw and write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "ops/kv_store_row.hpp"
#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;

namespace {

struct Pool {
  KvPool view;
  std::vector<uint8_t> data, scales;
  Pool(KvFormat f, int32_t blocks, int32_t bs, int32_t H, int32_t D) {
    const int64_t rows = static_cast<int64_t>(blocks) * bs * H;
    data.assign(static_cast<size_t>(rows * kv_row_width(f, D) * dtype_size(kv_format_dtype(f))), 0);
    view.format = f;
    view.head_dim = D;
    view.data = TensorRef(data.data(), kv_format_dtype(f), Device::cpu(), {blocks, bs, H, kv_row_width(f, D)});
    if (kv_format_has_scales(f)) {
      scales.assign(static_cast<size_t>(rows * D / 64), 0);
      view.scales = TensorRef(scales.data(), DType::UE8M0, Device::cpu(), {blocks, bs, H, D / 64});
    }
  }
  std::vector<float> row(int32_t cell, int32_t h) const {
    const int32_t H = static_cast<int32_t>(view.data.size(2)), D = view.head_dim;
    const int64_t r = static_cast<int64_t>(cell) * H + h;
    const int64_t rb = kv_row_width(view.format, D) * static_cast<int64_t>(dtype_size(kv_format_dtype(view.format)));
    std::vector<float> out(D);
    for (int32_t d = 0; d < D; ++d)
      out[d] = kvrow::decode(view.format, data.data() + r * rb, scales.empty() ? nullptr : scales.data() + r * (D / 64), d);
    return out;
  }
};

RopeSpec spec_for(KvFormat f) {
  if (f == KvFormat::Dsv4Row) return RopeSpec::deepseek_v4_compressed();
  RopeSpec s = RopeSpec::llama3_8b();
  s.attention_factor = 1.1;
  return s;
}

double eps_of(KvFormat f) { return f == KvFormat::Dsv4Row || f == KvFormat::Fp8 ? 1.0 / 16 : paged_test::format_eps(f); }

class KvStoreFormats : public ::testing::TestWithParam<KvFormat> {};

TEST_P(KvStoreFormats, RotateQuantizePlaceMatchesF64) {
  const KvFormat f = GetParam();
  const int32_t D = f == KvFormat::Dsv4Row ? 512 : 128, H = f == KvFormat::Dsv4Row ? 1 : 3, bs = 5, blocks = 7, n = 13;
  Pool pool(f, blocks, bs, H, D);
  std::mt19937_64 rng(7);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    paged_test::Source src = paged_test::make_source(rng, 1, n, H, D, dt, Device::cpu(), true);
    std::vector<int32_t> cells(blocks * bs);
    std::iota(cells.begin(), cells.end(), 0);
    std::shuffle(cells.begin(), cells.end(), rng);
    std::vector<int32_t> slots(cells.begin(), cells.begin() + n), positions(n);
    slots[4] = -1;  // skipped
    for (int32_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(rng() % 5000);
    const math::RopeTable t = make_rope_table(spec_for(f), D);
    std::fill(pool.data.begin(), pool.data.end(), 0);
    kv_store(src.tensor, TensorRef(slots.data(), DType::I32, Device::cpu(), {n}), pool.view,
             TensorRef(positions.data(), DType::I32, Device::cpu(), {n}), &t);
    double worst = 0;
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t h = 0; h < H; ++h) {
        if (i == 4) {
          for (float x : pool.row(cells[4], h)) EXPECT_EQ(x, 0.0f);  // the skipped row's cell is untouched
          continue;
        }
        std::vector<double> want(D);
        paged_test::expected_k(src.values[0].data() + (i * H + h) * D, D, t, positions[i], want.data());
        const std::vector<float> got = pool.row(slots[i], h);
        double rowmax = 0;
        for (double x : want) rowmax = std::max(rowmax, std::abs(x));
        for (int32_t d = 0; d < D; ++d) {
          const double err = std::abs(got[d] - want[d]) / rowmax;
          worst = std::max(worst, err);
          ASSERT_LE(err, 1.5 * paged_test::dim_eps(f, d) + 2.4e-7 * 5000 + 1e-6)
              << kv_format_name(f) << " token " << i << " head " << h << " dim " << d;
        }
      }
    }
    RecordProperty(std::string(kv_format_name(f)) + "_" + std::string(dtype_name(dt)) + "_worst_rel", std::to_string(worst));
    EXPECT_LE(worst, eps_of(f) + 2.4e-7 * 5000);  // f32 angles at positions up to 5000 dominate for f32
    // From a kv_rope_angles table instead: the same bytes.
    const std::vector<uint8_t> first_data = pool.data;
    const std::vector<uint8_t> first_scales = pool.scales;
    std::vector<float> ang(static_cast<size_t>(n) * t.layout.n_pairs() * 2);
    const TensorRef angt(ang.data(), DType::F32, Device::cpu(), {n, t.layout.n_pairs(), 2});
    kv_rope_angles(TensorRef(positions.data(), DType::I32, Device::cpu(), {n}), t, angt);
    std::fill(pool.data.begin(), pool.data.end(), 0);
    kv_store(src.tensor, TensorRef(slots.data(), DType::I32, Device::cpu(), {n}), pool.view,
             TensorRef(positions.data(), DType::I32, Device::cpu(), {n}), &t, {}, angt);
    EXPECT_EQ(pool.data, first_data) << kv_format_name(f) << ": store from the angle table differs";
    EXPECT_EQ(pool.scales, first_scales);
    // A table of the wrong shape is refused.
    const TensorRef short_t(ang.data(), DType::F32, Device::cpu(), {n - 1, t.layout.n_pairs(), 2});
    EXPECT_THROW(kv_store(src.tensor, TensorRef(slots.data(), DType::I32, Device::cpu(), {n}), pool.view,
                          TensorRef(positions.data(), DType::I32, Device::cpu(), {n}), &t, {}, short_t),
                 Error);
  }
}

TEST_P(KvStoreFormats, RotationChangesOnlyRotatedDimsAndEqualsAFreshRotation) {
  const KvFormat f = GetParam();
  const int32_t D = f == KvFormat::Dsv4Row ? 512 : 128, H = 2, bs = 4, blocks = 6, n = blocks * bs;
  Pool pool(f, blocks, bs, H, D);
  std::mt19937_64 rng(11);
  paged_test::Source src = paged_test::make_source(rng, 1, n, H, D, DType::F32, Device::cpu(), true);
  std::vector<int32_t> slots(n), positions(n, 0), delta(n, 0);
  std::iota(slots.begin(), slots.end(), 0);
  // Partial rotary at the head (NeoX) for the plain formats; DeepSeek-V4's tail for Dsv4Row.
  RopeSpec spec = f == KvFormat::Dsv4Row ? RopeSpec::deepseek_v4_window() : RopeSpec::plain(64, 10000.0);
  const math::RopeTable t = make_rope_table(spec, D);
  kv_store(src.tensor, TensorRef(slots.data(), DType::I32, Device::cpu(), {n}), pool.view, TensorRef(), nullptr);
  const std::vector<uint8_t> data0 = pool.data, scales0 = pool.scales;
  std::vector<std::vector<float>> before(n * H);
  for (int32_t c = 0; c < n; ++c)
    for (int32_t h = 0; h < H; ++h) before[c * H + h] = pool.row(c, h);
  for (int32_t c = 0; c < n; ++c) delta[c] = c % 3 == 0 ? 0 : -static_cast<int32_t>(rng() % 3000);
  std::vector<int32_t> list = {4, 1, 3};  // blocks 0, 2, 5 are not listed
  kv_rotate_blocks(pool.view, TensorRef(list.data(), DType::I32, Device::cpu(), {3}),
                   TensorRef(delta.data(), DType::I32, Device::cpu(), {blocks, bs}), t);
  const int64_t rb = kv_row_width(f, D) * static_cast<int64_t>(dtype_size(kv_format_dtype(f)));
  for (int32_t c = 0; c < n; ++c) {
    const int32_t b = c / bs;
    const bool listed = b == 4 || b == 1 || b == 3;
    for (int32_t h = 0; h < H; ++h) {
      const int64_t r = static_cast<int64_t>(c) * H + h;
      const uint8_t* row0 = data0.data() + r * rb;
      const uint8_t* row1 = pool.data.data() + r * rb;
      if (!listed || delta[c] == 0) {
        ASSERT_EQ(0, std::memcmp(row0, row1, rb)) << "cell " << c << " must not change";
        continue;
      }
      // Bytes outside the rotated slice (and outside FP8 groups holding rotated dims) are unchanged.
      const size_t es = dtype_size(kv_format_dtype(f));
      for (int32_t d = 0; d < D; ++d) {
        if (t.layout.rotates(d)) continue;
        if (f == KvFormat::Fp8 && kvrow::group_rotates(t.layout, d / 64)) continue;
        const int64_t off = f == KvFormat::Dsv4Row ? (d < 448 ? d : 448 + 2 * (d - 448)) : d * static_cast<int64_t>(es);
        ASSERT_EQ(0, std::memcmp(row0 + off, row1 + off, f == KvFormat::Dsv4Row && d < 448 ? 1 : es))
            << kv_format_name(f) << " cell " << c << " dim " << d;
      }
      if (f == KvFormat::Dsv4Row) {
        ASSERT_EQ(0, std::memcmp(row0 + 576, row1 + 576, 8)) << "Dsv4Row scales and pad must not change";
      }
      // And the rotated values equal a fresh f64 rotation of what was stored.
      std::vector<double> stored(before[r].begin(), before[r].end()), want(D);
      math::RopeTable unit = t;
      unit.attention_factor = 1.0f;
      paged_test::expected_k(stored.data(), D, unit, delta[c], want.data());
      const std::vector<float> got = pool.row(c, h);
      double rowmax = 0;
      for (double x : want) rowmax = std::max(rowmax, std::abs(x));
      for (int32_t d = 0; d < D; ++d)
        ASSERT_LE(std::abs(got[d] - want[d]), rowmax * (1.5 * paged_test::dim_eps(f, d) + 2.4e-7 * 3000 + 1e-6))
            << kv_format_name(f) << " cell " << c << " dim " << d;
    }
  }
}

TEST_P(KvStoreFormats, BadInputsThrowAndWriteNothing) {
  const KvFormat f = GetParam();
  const int32_t D = f == KvFormat::Dsv4Row ? 512 : 64, H = 2, bs = 4, blocks = 3, n = 3;
  Pool pool(f, blocks, bs, H, D);
  std::mt19937_64 rng(3);
  paged_test::Source src = paged_test::make_source(rng, 1, n, H, D, DType::F32, Device::cpu(), true);
  std::vector<int32_t> slots = {0, 5, 7}, positions = {1, 2, 3}, bad_slots = {0, 5, blocks * bs};
  const TensorRef sl(slots.data(), DType::I32, Device::cpu(), {n});
  const TensorRef ps(positions.data(), DType::I32, Device::cpu(), {n});
  const math::RopeTable t = make_rope_table(f == KvFormat::Dsv4Row ? RopeSpec::deepseek_v4_window() : RopeSpec::plain(64, 1e4), D);
  const std::vector<uint8_t> data0 = pool.data;
  auto expect_bad = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << what;
    }
    EXPECT_EQ(pool.data, data0) << what;
  };
  expect_bad([&] { kv_store(src.tensor, TensorRef(bad_slots.data(), DType::I32, Device::cpu(), {n}), pool.view, ps, &t); },
             "slot outside the pool");
  expect_bad([&] { kv_store(src.tensor, TensorRef(slots.data(), DType::I32, Device::cpu(), {2}), pool.view, ps, &t); },
             "slots of the wrong length");
  expect_bad([&] { kv_store(src.tensor, sl, pool.view, TensorRef(), &t); }, "rope without positions");
  expect_bad([&] { kv_store(src.tensor, sl, pool.view, ps, nullptr); }, "positions without rope");
  std::vector<int32_t> wrong(static_cast<size_t>(n) * (H + 1) * D);
  expect_bad([&] { kv_store(TensorRef(wrong.data(), DType::F32, Device::cpu(), {n, H + 1, D}), sl, pool.view, ps, &t); },
             "head count");
  expect_bad([&] { kv_store(TensorRef(wrong.data(), DType::I32, Device::cpu(), {n, H, D}), sl, pool.view, ps, &t); },
             "source dtype");
  if (f == KvFormat::Dsv4Row) {
    const math::RopeTable head = make_rope_table(RopeSpec::plain(64, 1e4), D);
    expect_bad([&] { kv_store(src.tensor, sl, pool.view, ps, &head); }, "Dsv4Row rope outside the tail");
  }
  std::vector<int32_t> delta(blocks * bs, 1), list = {0, blocks};
  expect_bad([&] {
    kv_rotate_blocks(pool.view, TensorRef(list.data(), DType::I32, Device::cpu(), {2}),
                     TensorRef(delta.data(), DType::I32, Device::cpu(), {blocks, bs}), t);
  }, "rotate: block outside the pool");
}

INSTANTIATE_TEST_SUITE_P(Formats, KvStoreFormats, ::testing::ValuesIn(paged_test::kAllFormats),
                         [](const ::testing::TestParamInfo<KvFormat>& i) { return std::string(kv_format_name(i.param)); });

}  // namespace
