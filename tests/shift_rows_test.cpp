// rope_shift_rows on the CPU: per-row deltas in every K format, and the error
// growth of many small shifts against one accumulated rotation (f16, bf16).
#include <gtest/gtest.h>

#include <cstdio>

#include "shift_test_util.hpp"

using namespace kvcore;
using namespace shift_test;

namespace {

// rms relative error of the rotated dims of `L.k` against keys at positions pos[t].
double rms_error_at(const Layer& L, const std::vector<uint8_t>& k, const std::vector<uint8_t>& s,
                    const std::vector<int64_t>& pos) {
  const int hd = L.head_dim();
  const math::RopeLayout& l = L.table.layout;
  double e = 0, n = 0;
  std::vector<double> ref(hd);
  for (int64_t t = 0; t < L.cap; ++t)
    for (int h = 0; h < L.spec.heads; ++h) {
      const double* x = &L.x[(t * L.spec.heads + h) * hd];
      for (int d = 0; d < hd; ++d) ref[d] = x[d];
      rotate_ref(ref.data(), l, L.w, double(pos[t]), L.spec.magnitude);
      const uint8_t* head = k.data() + t * L.k_tok + h * L.k_head_bytes;
      for (int i = 0; i < l.n_pairs(); ++i)
        for (int d : {l.dim0(i), l.dim1(i)}) {
          double g;
          if (L.spec.form == KForm::Plain) g = load_value(L.spec.k_dtype, head + d * dtype_size(L.spec.k_dtype));
          else if (L.spec.form == KForm::Dsv4) g = load_value(DType::BF16, head + math::Dsv4RowLayout::kRopeOffset + 2 * (d - 448));
          else g = dequant_fp8(head, s.data() + t * L.s_tok + h * L.n_blocks, d);
          e += (g - ref[d]) * (g - ref[d]);
          n += ref[d] * ref[d];
        }
    }
  return std::sqrt(e / n);
}

void shift_rows(Layer& w, const std::vector<int32_t>& delta) {
  const ShiftDenseLayer v = w.host_view();
  rope_shift_rows(v.k, v.maybe_k_scales, w.spec.rope, TensorRef(const_cast<int32_t*>(delta.data()), DType::I32, Device::cpu(), {int64_t(delta.size())}));
}

}  // namespace

TEST(ShiftRows, PerRowDeltasInEveryFormat) {
  const std::vector<LayerSpec> specs = every_k_form(3);
  for (const LayerSpec& sp : specs) {
    const int64_t rows = 37;
    const Layer L = make_layer(sp, rows, 5);
    Layer w = L;
    std::vector<int32_t> delta(rows);
    std::vector<int64_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) {
      delta[r] = r % 5 == 0 ? 0 : static_cast<int32_t>((r * 7919) % 20011) - 10000;
      pos[r] = r + delta[r];
    }
    shift_rows(w, delta);
    for (int64_t r = 0; r < rows; r += 5)  // delta 0: untouched
      EXPECT_EQ(0, std::memcmp(w.k.data() + r * L.k_tok, L.k.data() + r * L.k_tok, L.k_tok)) << "row " << r;
    const double err = rms_error_at(L, w.k, w.s, pos);
    const double tol = sp.form == KForm::Fp8 ? 0.06 : sp.form == KForm::Plain && sp.k_dtype == DType::F16 ? 1e-3 : 6e-3;
    EXPECT_LT(err, tol) << "format " << int(sp.form);
    // non-rotated bytes of DeepSeek-V4 rows stay
    if (sp.form == KForm::Dsv4)
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(0, std::memcmp(w.k.data() + r * L.k_tok, L.k.data() + r * L.k_tok, 448));
        EXPECT_EQ(0, std::memcmp(w.k.data() + r * L.k_tok + 576, L.k.data() + r * L.k_tok + 576, 8));
      }
  }
}

// Many small shifts round the cache once each; k pending shifts applied as
// one rotation round once. Measured for f16 and bf16 after 1, 16, 64 and
// 1000 shifts of delta -1 (head_dim 128, NeoX, theta 10000, 16 rows x 4 heads).
TEST(ShiftRows, ErrorGrowthOfManyShiftsAndOneAccumulatedRotation) {
  for (DType dt : {DType::F16, DType::BF16}) {
    LayerSpec sp;
    sp.k_dtype = dt;
    sp.heads = 4;
    sp.rope = RopeSpec::plain(128, 10000.0);
    const int64_t rows = 16;
    const Layer L = make_layer(sp, rows, 11);
    std::vector<int64_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = r;
    const double written = rms_error_at(L, L.k, L.s, pos);
    Layer stepped = L;
    int done = 0;
    std::printf("[shift] %s keys, rms relative error vs float64 (written: %.2e)\n", dt == DType::F16 ? "f16" : "bf16", written);
    std::printf("[shift]   shifts   one at a time   accumulated once\n");
    for (int n : {1, 16, 64, 1000}) {
      for (; done < n; ++done) shift_rows(stepped, std::vector<int32_t>(rows, -1));
      for (int64_t r = 0; r < rows; ++r) pos[r] = r - n;
      const double many = rms_error_at(L, stepped.k, stepped.s, pos);
      Layer once = L;
      shift_rows(once, std::vector<int32_t>(rows, -n));
      const double one = rms_error_at(L, once.k, once.s, pos);
      std::printf("[shift]   %6d   %13.3e   %16.3e\n", n, many, one);
      const double unit = dt == DType::F16 ? 4.9e-4 : 3.9e-3;  // half an ulp, relative
      EXPECT_LT(one, 1.2 * unit) << n << " shifts accumulated: one rounding more than the write";
      if (n >= 64) {
        EXPECT_GT(many, 2.0 * one) << "many shifts should drift";
      }
    }
  }
}
