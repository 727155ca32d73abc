// fp8 ops on the CPU (kvcore/ops/fp8.hpp) against an independent reference: seed 002's
// binary search with the exact scale rule, row by row; and every bad argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bench/baselines/seed_fp8_replica.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/fp8.hpp"

using namespace kvcore;

namespace {

const Device kCpu = Device::cpu();

int exact_k(float amax) {
  const long double a = std::fmax(amax, 1.0e-4f);
  int k = -200;
  while (448.0L * std::ldexp(1.0L, k) < a) ++k;
  return k;
}

// Reference round trip of one contiguous row: seed's dequant with the exact scale; NaN/inf as documented.
std::vector<float> ref_row(const float* x, int cols, int n_rot) {
  std::vector<float> out(x, x + cols);
  const int n_nope = cols - n_rot;
  for (int off = 0; off < n_nope; off += 64) {
    const int n = std::min(64, n_nope - off);
    float amax = 0;
    for (int i = 0; i < n; ++i)
      if (std::isfinite(x[off + i])) amax = std::fmax(amax, std::fabs(x[off + i]));
    const float scale = std::ldexp(1.0f, exact_k(amax));
    for (int i = 0; i < n; ++i) {
      const float v = x[off + i];
      if (std::isnan(v)) out[off + i] = v;
      else if (std::isinf(v)) out[off + i] = std::copysign(448.0f, v) * scale;
      else out[off + i] = codec_seed::round_trip(v, scale);
      if (v == 0.0f || (out[off + i] == 0.0f && v < 0)) out[off + i] = std::copysign(0.0f, v);  // kvcore keeps -0
    }
  }
  return out;
}

// Values spanning many exponents per block, with a few non-finite ones.
std::vector<float> random_values(size_t n, uint32_t seed, bool non_finite = true) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  float mag = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 37 == 0) mag = std::ldexp(1.0f, static_cast<int>(rng() % 41) - 20);
    v[i] = g(rng) * mag * (rng() % 11 == 0 ? 300.0f : 1.0f);
    if (non_finite && rng() % 997 == 0) v[i] = std::numeric_limits<float>::infinity() * (rng() % 2 ? 1 : -1);
    if (non_finite && rng() % 991 == 0) v[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return v;
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || math::float_bits(a) == math::float_bits(b);
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Expect `fn` to throw InvalidArgument whose message contains `needle`.
template <class Fn>
void expect_invalid(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace

TEST(CodecFp8Ops, RoundTripContiguousWithPartialBlock) {
  const int rows = 7, cols = 200, n_rot = 10;  // n_nope 190 = 64 + 64 + 62
  auto src = random_values(rows * cols, 1);
  std::vector<float> dst(rows * cols, -1.0f);
  fp8_round_trip_rows(TensorRef(src.data(), DType::F32, kCpu, {rows, cols}),
                      TensorRef(dst.data(), DType::F32, kCpu, {rows, cols}), n_rot);
  for (int r = 0; r < rows; ++r) {
    const auto want = ref_row(src.data() + r * cols, cols, n_rot);
    for (int i = 0; i < cols; ++i) ASSERT_TRUE(same_float(dst[r * cols + i], want[i])) << r << "," << i;
  }
}

TEST(CodecFp8Ops, RoundTripStridedFourDimsAndInPlace) {
  // src [2, 3, 5, 130] with padded rows (stride 136) and a strided last dim on dst (stride 2)
  const int a = 2, b = 3, c = 5, cols = 130, n_rot = 2, pad = 136;
  auto src = random_values(size_t(a) * b * c * pad, 2);
  std::vector<float> dst(size_t(a) * b * c * cols * 2, 0.0f);
  TensorRef s(src.data(), DType::F32, kCpu, {a, b, c, cols}, {b * c * pad, c * pad, pad, 1});
  TensorRef d(dst.data(), DType::F32, kCpu, {a, b, c, cols}, {b * c * cols * 2, c * cols * 2, cols * 2, 2});
  fp8_round_trip_rows(s, d, n_rot);
  for (int r = 0; r < a * b * c; ++r) {
    const auto want = ref_row(src.data() + r * pad, cols, n_rot);
    for (int i = 0; i < cols; ++i) ASSERT_TRUE(same_float(dst[size_t(r) * cols * 2 + 2 * i], want[i])) << r << "," << i;
  }
  // in place on the padded view: equals the out-of-place result, padding untouched
  auto inplace = src;
  TensorRef ip(inplace.data(), DType::F32, kCpu, {a, b, c, cols}, {b * c * pad, c * pad, pad, 1});
  fp8_round_trip_rows(ip, ip, n_rot);
  for (int r = 0; r < a * b * c; ++r) {
    for (int i = 0; i < cols; ++i)
      ASSERT_TRUE(same_float(inplace[size_t(r) * pad + i], dst[size_t(r) * cols * 2 + 2 * i]));
    for (int i = cols; i < pad; ++i) ASSERT_TRUE(same_float(inplace[size_t(r) * pad + i], src[size_t(r) * pad + i]));
  }
}

TEST(CodecFp8Ops, RoundTripAllTailAndNoTail) {
  auto src = random_values(3 * 128, 3, false);
  std::vector<float> dst(3 * 128);
  fp8_round_trip_rows(TensorRef(src.data(), DType::F32, kCpu, {3, 128}), TensorRef(dst.data(), DType::F32, kCpu, {3, 128}), 128);
  EXPECT_EQ(bytes_of(dst), bytes_of(src)) << "n_rot == cols copies";
  fp8_round_trip_rows(TensorRef(src.data(), DType::F32, kCpu, {128}), TensorRef(dst.data(), DType::F32, kCpu, {128}), 0);
  const auto want = ref_row(src.data(), 128, 0);
  for (int i = 0; i < 128; ++i) ASSERT_TRUE(same_float(dst[i], want[i]));
}

namespace {

template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  std::vector<T> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = from_f32<T>(v[i]);
  return o;
}

template <class T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, f16>) return DType::F16;
  else return DType::BF16;
}

// pack src (T) with a Tail tail, unpack into U, compare with the reference.
template <class T, class Tail, class U>
void pack_unpack_case(int rows, int cols, int n_rot, uint32_t seed) {
  SCOPED_TRACE(std::string("rows ") + std::to_string(rows) + " cols " + std::to_string(cols) + " n_rot " +
               std::to_string(n_rot) + " src " + std::string(dtype_name(dtype_of<T>())) + " tail " +
               std::string(dtype_name(dtype_of<Tail>())) + " out " + std::string(dtype_name(dtype_of<U>())));
  const int n_nope = cols - n_rot, nb = (n_nope + 63) / 64;
  const auto f = random_values(size_t(rows) * cols, seed);
  const auto src = convert<T>(f);
  std::vector<uint8_t> codes(size_t(rows) * n_nope, 0xee), scales(size_t(rows) * nb, 0xee);
  std::vector<Tail> tail(size_t(rows) * n_rot);
  TensorRef tail_ref = n_rot ? TensorRef(tail.data(), dtype_of<Tail>(), kCpu, {rows, n_rot}) : TensorRef();
  fp8_pack_rows(TensorRef(const_cast<T*>(src.data()), dtype_of<T>(), kCpu, {rows, cols}),
                TensorRef(codes.data(), DType::E4M3, kCpu, {rows, n_nope}),
                TensorRef(scales.data(), DType::UE8M0, kCpu, {rows, nb}), tail_ref);
  std::vector<U> out(size_t(rows) * cols);
  fp8_unpack_rows(TensorRef(codes.data(), DType::E4M3, kCpu, {rows, n_nope}),
                  TensorRef(scales.data(), DType::UE8M0, kCpu, {rows, nb}), tail_ref,
                  TensorRef(out.data(), dtype_of<U>(), kCpu, {rows, cols}));
  for (int r = 0; r < rows; ++r) {
    std::vector<float> row(cols);
    for (int i = 0; i < cols; ++i) row[i] = to_f32(src[size_t(r) * cols + i]);
    const auto want = ref_row(row.data(), cols, n_rot);
    for (int i = 0; i < cols; ++i) {
      const float w = i < n_nope ? want[i] : to_f32(from_f32<Tail>(row[i]));
      ASSERT_TRUE(same_float(to_f32(out[size_t(r) * cols + i]), to_f32(from_f32<U>(w)))) << r << "," << i;
    }
    for (int b = 0; b < nb; ++b) {
      float amax = 0;
      for (int i = 64 * b; i < std::min(n_nope, 64 * b + 64); ++i)
        if (std::isfinite(row[i])) amax = std::fmax(amax, std::fabs(row[i]));
      ASSERT_EQ(scales[size_t(r) * nb + b], exact_k(amax) + 127);
    }
  }
}

}  // namespace

TEST(CodecFp8Ops, PackUnpackEveryDtype) {
  pack_unpack_case<float, bf16, float>(5, 512, 64, 10);
  pack_unpack_case<float, f16, f16>(3, 200, 10, 11);
  pack_unpack_case<f16, bf16, bf16>(4, 130, 2, 12);
  pack_unpack_case<bf16, f16, float>(2, 64, 0, 13);
  pack_unpack_case<bf16, bf16, f16>(9, 77, 12, 14);
  pack_unpack_case<float, bf16, bf16>(1, 70, 70, 15);  // all tail, zero codes
}

TEST(CodecFp8Ops, PackStridedViews) {
  // src rows padded, codes/scales/tail interleaved in one byte row of stride 96 (64 codes | 1 scale | pad | 8 x f16)
  const int rows = 6, cols = 68, n_rot = 4, n_nope = 64;
  const auto f = random_values(size_t(rows) * 80, 21);
  std::vector<uint8_t> store(size_t(rows) * 96, 0xaa);
  TensorRef src(const_cast<float*>(f.data()), DType::F32, kCpu, {rows, cols}, {80, 1});
  fp8_pack_rows(src, TensorRef(store.data(), DType::E4M3, kCpu, {rows, n_nope}, {96, 1}),
                TensorRef(store.data() + 64, DType::UE8M0, kCpu, {rows, 1}, {96, 1}),
                TensorRef(store.data() + 80, DType::F16, kCpu, {rows, n_rot}, {48, 2}));
  std::vector<float> out(size_t(rows) * cols);
  fp8_unpack_rows(TensorRef(store.data(), DType::E4M3, kCpu, {rows, n_nope}, {96, 1}),
                  TensorRef(store.data() + 64, DType::UE8M0, kCpu, {rows, 1}, {96, 1}),
                  TensorRef(store.data() + 80, DType::F16, kCpu, {rows, n_rot}, {48, 2}),
                  TensorRef(out.data(), DType::F32, kCpu, {rows, cols}));
  for (int r = 0; r < rows; ++r) {
    const auto want = ref_row(f.data() + r * 80, cols, n_rot);
    for (int i = 0; i < cols; ++i) {
      const float w = i < n_nope ? want[i] : to_f32(from_f32<f16>(f[r * 80 + i]));
      ASSERT_TRUE(same_float(out[size_t(r) * cols + i], w)) << r << "," << i;
    }
    EXPECT_EQ(store[size_t(r) * 96 + 65], 0xaa) << "bytes between the views stay untouched";
    EXPECT_EQ(store[size_t(r) * 96 + 82], 0xaa);
  }
}

TEST(CodecFp8Ops, Dsv4RowsEqualRoundTripAndBf16Tail) {
  const int rows = 5;
  const auto f = random_values(size_t(rows) * 512, 31);
  std::vector<uint8_t> packed(size_t(rows) * 584, 0x5a);
  dsv4_pack_rows(TensorRef(const_cast<float*>(f.data()), DType::F32, kCpu, {rows, 512}),
                 TensorRef(packed.data(), DType::U8, kCpu, {rows, 584}));
  std::vector<float> out(size_t(rows) * 512), rt(size_t(rows) * 512);
  dsv4_unpack_rows(TensorRef(packed.data(), DType::U8, kCpu, {rows, 584}), TensorRef(out.data(), DType::F32, kCpu, {rows, 512}));
  fp8_round_trip_rows(TensorRef(const_cast<float*>(f.data()), DType::F32, kCpu, {rows, 512}),
                      TensorRef(rt.data(), DType::F32, kCpu, {rows, 512}), 64);
  for (int r = 0; r < rows; ++r) {
    const auto want = ref_row(f.data() + r * 512, 512, 64);
    for (int i = 0; i < 448; ++i) {
      ASSERT_TRUE(same_float(out[r * 512 + i], want[i])) << r << "," << i;
      ASSERT_TRUE(same_float(out[r * 512 + i], rt[r * 512 + i]));
    }
    for (int i = 448; i < 512; ++i) {
      ASSERT_TRUE(same_float(out[r * 512 + i], to_f32(from_f32<bf16>(f[r * 512 + i]))));
      const uint16_t h = uint16_t(packed[r * 584 + 448 + 2 * (i - 448)] | (packed[r * 584 + 449 + 2 * (i - 448)] << 8));
      ASSERT_EQ(h, from_f32<bf16>(f[r * 512 + i]).bits) << "little-endian bf16 at byte 448 + 2i";
    }
    for (int b = 0; b < 7; ++b) ASSERT_EQ(packed[r * 584 + 576 + b] - 127, [&] {
      float amax = 0;
      for (int i = 64 * b; i < 64 * b + 64; ++i)
        if (std::isfinite(f[r * 512 + i])) amax = std::fmax(amax, std::fabs(f[r * 512 + i]));
      return exact_k(amax);
    }());
    EXPECT_EQ(packed[r * 584 + 583], 0) << "pad byte";
    for (int i = 0; i < 448; ++i) ASSERT_EQ(packed[r * 584 + i], math::e4m3_encode(want[i] / std::ldexp(1.0f, packed[r * 584 + 576 + i / 64] - 127)));
  }
  // f16 output
  std::vector<f16> h(size_t(rows) * 512);
  dsv4_unpack_rows(TensorRef(packed.data(), DType::U8, kCpu, {rows, 512 + 72}), TensorRef(h.data(), DType::F16, kCpu, {rows, 512}));
  for (size_t i = 0; i < h.size(); ++i) ASSERT_TRUE(same_float(to_f32(h[i]), to_f32(from_f32<f16>(out[i]))));
}

TEST(CodecFp8Ops, BadArgumentsThrowAndWriteNothing) {
  std::vector<float> src = random_values(4 * 128, 41, false), dst(4 * 128, 7.0f);
  const auto before = bytes_of(dst);
  TensorRef s(src.data(), DType::F32, kCpu, {4, 128}), d(dst.data(), DType::F32, kCpu, {4, 128});
  expect_invalid([&] { fp8_round_trip_rows(s, d, 130); }, "n_rot must be in [0, 128]");
  expect_invalid([&] { fp8_round_trip_rows(s, d, -2); }, "got -2");
  expect_invalid([&] { fp8_round_trip_rows(s, d, 3); }, "n_rot must be even");
  expect_invalid([&] { fp8_round_trip_rows(TensorRef(src.data(), DType::F16, kCpu, {4, 128}), d, 0); }, "src must be f32");
  expect_invalid([&] { fp8_round_trip_rows(s, TensorRef(dst.data(), DType::F32, kCpu, {4, 127}), 0); }, "shape of src");
  expect_invalid([&] { fp8_round_trip_rows(s, TensorRef(nullptr, DType::F32, kCpu, {4, 128}), 0); }, "dst has no data");
  expect_invalid([&] { fp8_round_trip_rows(s, TensorRef(dst.data(), DType::F32, kCpu, {4, 128}, {0, 1}), 0); }, "cannot broadcast");
  expect_invalid([&] { fp8_round_trip_rows(s, TensorRef(src.data() + 1, DType::F32, kCpu, {4, 128}), 0); }, "overlaps src");
  expect_invalid([&] { fp8_round_trip_rows(TensorRef(src.data(), DType::F32, kCpu, {1, 1, 1, 4, 128}),
                                           TensorRef(dst.data(), DType::F32, kCpu, {1, 1, 1, 4, 128}), 0); }, "1 to 4 dims");
  expect_invalid([&] { fp8_round_trip_rows(TensorRef(reinterpret_cast<char*>(src.data()) + 2, DType::F32, kCpu, {4, 64}), d, 0); },
                 "not aligned");
  EXPECT_EQ(bytes_of(dst), before);
  // a CUDA tensor against a CPU one
  expect_invalid([&] { fp8_round_trip_rows(s, TensorRef(dst.data(), DType::F32, Device::cuda(0), {4, 128}), 0); }, "is on cpu but dst is on cuda:0");
  EXPECT_EQ(bytes_of(dst), before);

  std::vector<uint8_t> codes(4 * 120, 1), scales(4 * 2, 2);
  std::vector<bf16> tail(4 * 8, bf16{3});
  const auto cb = codes, sb = scales;
  TensorRef c(codes.data(), DType::E4M3, kCpu, {4, 120}), sc(scales.data(), DType::UE8M0, kCpu, {4, 2}),
      t(tail.data(), DType::BF16, kCpu, {4, 8});
  EXPECT_NO_THROW(fp8_pack_rows(s, c, sc, t));
  codes = cb;
  scales = sb;
  expect_invalid([&] { fp8_pack_rows(s, TensorRef(codes.data(), DType::U8, kCpu, {4, 120}), sc, t); }, "codes must be e4m3");
  expect_invalid([&] { fp8_pack_rows(s, c, TensorRef(scales.data(), DType::U8, kCpu, {4, 2}), t); }, "scales must be ue8m0");
  expect_invalid([&] { fp8_pack_rows(s, c, TensorRef(scales.data(), DType::UE8M0, kCpu, {4, 1}), t); }, "must have 2 columns");
  expect_invalid([&] { fp8_pack_rows(s, TensorRef(codes.data(), DType::E4M3, kCpu, {4, 119}), sc, t); }, "must have 120 columns");
  expect_invalid([&] { fp8_pack_rows(s, c, sc, TensorRef(tail.data(), DType::F32, kCpu, {4, 4})); }, "tail must be f16 or bf16");
  expect_invalid([&] { fp8_pack_rows(s, c, sc, TensorRef(tail.data(), DType::BF16, kCpu, {4, 7})); }, "n_rot must be even");
  expect_invalid([&] { fp8_pack_rows(s, c, sc, TensorRef(tail.data(), DType::BF16, kCpu, {2, 8})); }, "row dims of src");
  expect_invalid([&] { fp8_pack_rows(TensorRef(src.data(), DType::I32, kCpu, {4, 128}), c, sc, t); }, "src must be f32, f16 or bf16");
  expect_invalid([&] { fp8_pack_rows(s, c, sc, TensorRef()); }, "must have 128 columns");
  EXPECT_EQ(codes, cb);
  EXPECT_EQ(scales, sb);
  expect_invalid([&] { fp8_unpack_rows(c, sc, t, TensorRef(dst.data(), DType::E4M3, kCpu, {4, 128})); }, "dst must be f32, f16 or bf16");
  expect_invalid([&] { fp8_unpack_rows(c, sc, t, TensorRef(dst.data(), DType::F32, kCpu, {4, 126})); }, "n_rot");
  expect_invalid([&] { fp8_unpack_rows(c, sc, t, TensorRef(codes.data(), DType::F32, kCpu, {4, 128}, {0, 0})); }, "cannot broadcast");
  EXPECT_EQ(bytes_of(dst), before);

  std::vector<uint8_t> packed(4 * 584 + 2, 9);
  const auto pb = packed;
  expect_invalid([&] { dsv4_pack_rows(s, TensorRef(packed.data(), DType::U8, kCpu, {4, 584})); }, "src must have 512 columns");
  std::vector<float> big = random_values(4 * 512, 42, false);
  TensorRef bs(big.data(), DType::F32, kCpu, {4, 512});
  expect_invalid([&] { dsv4_pack_rows(bs, TensorRef(packed.data(), DType::U8, kCpu, {4, 580})); }, "packed must have 584 columns");
  expect_invalid([&] { dsv4_pack_rows(bs, TensorRef(packed.data(), DType::E4M3, kCpu, {4, 584})); }, "packed must be u8");
  expect_invalid([&] { dsv4_pack_rows(bs, TensorRef(packed.data() + 1, DType::U8, kCpu, {4, 584})); }, "2-byte aligned");
  expect_invalid([&] { dsv4_pack_rows(bs, TensorRef(packed.data(), DType::U8, kCpu, {2, 584}, {585, 1})); }, "must be even");
  expect_invalid([&] { dsv4_pack_rows(bs, TensorRef(packed.data(), DType::U8, kCpu, {4, 584}, {1168, 2})); }, "stride 1 in its last dim");
  expect_invalid([&] { dsv4_pack_rows(bs, TensorRef(packed.data(), DType::U8, kCpu, {3, 584})); }, "row dims of src");
  EXPECT_EQ(packed, pb);
  expect_invalid([&] { dsv4_unpack_rows(TensorRef(packed.data(), DType::U8, kCpu, {4, 584}), TensorRef(big.data(), DType::F32, kCpu, {4, 448})); },
                 "dst must have 512 columns");
  expect_invalid([&] { dsv4_unpack_rows(TensorRef(packed.data(), DType::U8, kCpu, {4, 584}), TensorRef(big.data(), DType::U8, kCpu, {4, 512})); },
                 "dst must be f32, f16 or bf16");
}

TEST(CodecFp8Ops, CudaTensorsWithoutCudaBackendAreNotSupported) {
  if (cuda_compiled()) GTEST_SKIP() << "CUDA backend present";
  std::vector<float> v(64);
  TensorRef g(v.data(), DType::F32, Device::cuda(0), {1, 64});
  try {
    fp8_round_trip_rows(g, g, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NotSupported) << e.what();
  }
}

TEST(CodecFp8Ops, EmptyRowsAreANoOp) {
  std::vector<float> v(1);
  EXPECT_NO_THROW(fp8_round_trip_rows(TensorRef(v.data(), DType::F32, kCpu, {0, 64}), TensorRef(v.data(), DType::F32, kCpu, {0, 64}), 0));
}

// A row with no nope dims (everything in the 16-bit tail): the empty code and
// scale tensors have zero strides, which is not a broadcast (nothing is written).
TEST(CodecFp8Ops, AllTailRowsPackAndUnpack) {
  const int rows = 5, cols = 70;
  std::vector<float> src(rows * cols), back(rows * cols, -1.0f);
  for (int i = 0; i < rows * cols; ++i) src[i] = 0.25f * static_cast<float>(i % 37) - 3.0f;  // exact in bf16
  std::vector<uint16_t> tail(rows * cols);
  const kvcore::Device cpu = kvcore::Device::cpu();
  const kvcore::TensorRef codes(nullptr, kvcore::DType::E4M3, cpu, {rows, 0});
  const kvcore::TensorRef scales(nullptr, kvcore::DType::UE8M0, cpu, {rows, 0});
  const kvcore::TensorRef t(tail.data(), kvcore::DType::BF16, cpu, {rows, cols});
  kvcore::fp8_pack_rows(kvcore::TensorRef(src.data(), kvcore::DType::F32, cpu, {rows, cols}), codes, scales, t);
  kvcore::fp8_unpack_rows(codes, scales, t, kvcore::TensorRef(back.data(), kvcore::DType::F32, cpu, {rows, cols}));
  EXPECT_EQ(back, src);
}
