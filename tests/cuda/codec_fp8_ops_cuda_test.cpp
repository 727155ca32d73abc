// fp8 ops: CUDA against CPU, bit for bit, on fresh random inputs of awkward sizes
// (odd row counts, padded and strided rows, partial blocks, values spanning many
// exponents, a few inf/NaN), through both the vectorized and the element paths.
// NaN outputs compare as "both NaN": the GPU's multiply returns the canonical NaN
// 0x7fffffff where the CPU propagates the input payload.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvcore/kvcore.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/fp8.hpp"

using namespace kvcore;

namespace {

const Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);

uint32_t fresh_seed() {
  const auto s = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("[codec cuda] random seed %u\n", s);
  return s;
}

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  float mag = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 29 == 0) mag = std::ldexp(1.0f, static_cast<int>(rng() % 61) - 30);
    v[i] = g(rng) * mag * (rng() % 13 == 0 ? 400.0f : 1.0f);
    if (rng() % 4999 == 0) v[i] = std::numeric_limits<float>::infinity() * (rng() % 2 ? 1.0f : -1.0f);
    if (rng() % 4999 == 0) v[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return v;
}

template <class T>
Buffer upload(const std::vector<T>& v) {
  return Buffer::from_host(v, kGpu);
}

template <class T>
std::vector<T> download(const Buffer& b) {
  return b.to_host<T>();
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || math::float_bits(a) == math::float_bits(b); }

template <class T>
size_t count_float_mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += !same_float(to_f32(a[i]), to_f32(b[i]));
  return bad;
}

template <class T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, f16>) return DType::F16;
  else return DType::BF16;
}

// A row-strided 2-D view [rows, cols] with row stride `ld` (and column stride `cs`) on `dev`.
TensorRef view(void* p, DType t, Device dev, int64_t rows, int64_t cols, int64_t ld, int64_t cs = 1) {
  return TensorRef(p, t, dev, {rows, cols}, {ld, cs});
}

// Round trip on CPU and GPU with the given layout; returns mismatching elements.
size_t round_trip_case(std::mt19937& rng, int64_t rows, int64_t cols, int n_rot, int64_t ld, int64_t cs, bool in_place) {
  const size_t n = static_cast<size_t>((rows - 1) * ld + (cols - 1) * cs + 1);
  auto src = random_values(n, rng);
  std::vector<float> cpu_out = src;  // the untouched gaps must match too
  Buffer g_src = upload(src);
  Buffer g_dst = upload(src);
  if (in_place) {
    fp8_round_trip_rows(view(cpu_out.data(), DType::F32, kCpu, rows, cols, ld, cs), view(cpu_out.data(), DType::F32, kCpu, rows, cols, ld, cs), n_rot);
    auto v = view(g_dst.data(), DType::F32, kGpu, rows, cols, ld, cs);
    fp8_round_trip_rows(v, v, n_rot);
  } else {
    fp8_round_trip_rows(view(src.data(), DType::F32, kCpu, rows, cols, ld, cs), view(cpu_out.data(), DType::F32, kCpu, rows, cols, ld, cs), n_rot);
    fp8_round_trip_rows(view(g_src.data(), DType::F32, kGpu, rows, cols, ld, cs), view(g_dst.data(), DType::F32, kGpu, rows, cols, ld, cs), n_rot);
  }
  synchronize(kGpu);
  return count_float_mismatches(download<float>(g_dst), cpu_out);
}

}  // namespace

TEST(CodecCuda, RoundTripRowsMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  auto rng = std::mt19937(fresh_seed());
  struct Case { int64_t rows, cols; int n_rot; int64_t ld, cs; bool in_place; };
  const Case cases[] = {
      {1001, 512, 64, 512, 1, false},   // DeepSeek-V4 rows, vector path
      {1001, 512, 64, 512, 1, true},    // in place
      {333, 200, 10, 203, 1, false},    // partial block, odd row stride: element path
      {77, 132, 4, 132, 1, false},      // n_nope 128, vector path
      {45, 1000, 0, 1004, 1, false},    // two chunk groups per row
      {31, 130, 2, 300, 2, false},      // strided last dim
      {7, 66, 66, 66, 1, false},        // all tail
      {1, 63, 0, 63, 1, true},          // one partial block
      {2049, 584, 136, 584, 1, false},  // n_nope 448
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " n_rot " + std::to_string(c.n_rot) +
                 " ld " + std::to_string(c.ld) + " cs " + std::to_string(c.cs) + (c.in_place ? " in place" : ""));
    EXPECT_EQ(round_trip_case(rng, c.rows, c.cols, c.n_rot, c.ld, c.cs, c.in_place), 0u);
  }
  // a 4-D view with padded middle dims
  std::vector<float> src = random_values(3 * 5 * 7 * 80, rng);
  std::vector<float> cpu(3 * 5 * 7 * 72, 0.0f);
  Buffer gs = upload(src), gd = upload(cpu);
  const std::initializer_list<int64_t> shape{3, 5, 7, 72}, sstr{5 * 7 * 80, 7 * 80, 80, 1};
  fp8_round_trip_rows(TensorRef(src.data(), DType::F32, kCpu, shape, sstr), TensorRef(cpu.data(), DType::F32, kCpu, shape), 8);
  fp8_round_trip_rows(TensorRef(gs.data(), DType::F32, kGpu, shape, sstr), TensorRef(gd.data(), DType::F32, kGpu, shape), 8);
  synchronize(kGpu);
  EXPECT_EQ(count_float_mismatches(download<float>(gd), cpu), 0u);
}

namespace {

template <class T, class Tail, class U>
void pack_unpack_case(std::mt19937& rng, int64_t rows, int64_t cols, int n_rot, int64_t ld) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols) + " n_rot " + std::to_string(n_rot) + " ld " +
               std::to_string(ld) + " " + std::string(dtype_name(dtype_of<T>())) + "/" + std::string(dtype_name(dtype_of<Tail>())) +
               "/" + std::string(dtype_name(dtype_of<U>())));
  const int64_t n_nope = cols - n_rot, nb = (n_nope + 63) / 64;
  const auto f = random_values(static_cast<size_t>(rows * ld), rng);
  std::vector<T> src(f.size());
  for (size_t i = 0; i < f.size(); ++i) src[i] = from_f32<T>(f[i]);
  std::vector<uint8_t> codes(rows * n_nope, 0), scales(rows * nb, 0);
  std::vector<Tail> tail(rows * n_rot, Tail{0});
  Buffer gsrc = upload(src), gcodes = upload(codes), gscales = upload(scales), gtail = upload(tail.empty() ? std::vector<Tail>(1) : tail);
  auto tail_ref = [&](void* p, Device d) { return n_rot ? view(p, dtype_of<Tail>(), d, rows, n_rot, n_rot) : TensorRef(); };
  fp8_pack_rows(view(src.data(), dtype_of<T>(), kCpu, rows, cols, ld), view(codes.data(), DType::E4M3, kCpu, rows, n_nope, n_nope),
                view(scales.data(), DType::UE8M0, kCpu, rows, nb, nb), tail_ref(tail.data(), kCpu));
  fp8_pack_rows(view(gsrc.data(), dtype_of<T>(), kGpu, rows, cols, ld), view(gcodes.data(), DType::E4M3, kGpu, rows, n_nope, n_nope),
                view(gscales.data(), DType::UE8M0, kGpu, rows, nb, nb), tail_ref(gtail.data(), kGpu));
  synchronize(kGpu);
  EXPECT_EQ(download<uint8_t>(gcodes), codes);
  EXPECT_EQ(download<uint8_t>(gscales), scales);
  if (n_rot) {
    const auto gt = download<Tail>(gtail);
    size_t bad = 0;
    for (size_t i = 0; i < tail.size(); ++i) bad += gt[i].bits != tail[i].bits;
    EXPECT_EQ(bad, 0u) << "tail bits";
  }
  std::vector<U> out(rows * cols), gout_init(rows * cols);
  Buffer gout = upload(gout_init);
  fp8_unpack_rows(view(codes.data(), DType::E4M3, kCpu, rows, n_nope, n_nope), view(scales.data(), DType::UE8M0, kCpu, rows, nb, nb),
                  tail_ref(tail.data(), kCpu), view(out.data(), dtype_of<U>(), kCpu, rows, cols, cols));
  fp8_unpack_rows(view(gcodes.data(), DType::E4M3, kGpu, rows, n_nope, n_nope), view(gscales.data(), DType::UE8M0, kGpu, rows, nb, nb),
                  tail_ref(gtail.data(), kGpu), view(gout.data(), dtype_of<U>(), kGpu, rows, cols, cols));
  synchronize(kGpu);
  EXPECT_EQ(count_float_mismatches(download<U>(gout), out), 0u);
}

}  // namespace

TEST(CodecCuda, PackUnpackRowsMatchCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  auto rng = std::mt19937(fresh_seed());
  pack_unpack_case<float, bf16, float>(rng, 1001, 512, 64, 512);   // vector
  pack_unpack_case<float, bf16, float>(rng, 999, 512, 64, 515);    // misaligned rows: element path
  pack_unpack_case<float, f16, f16>(rng, 257, 200, 10, 200);       // partial block
  pack_unpack_case<f16, bf16, bf16>(rng, 130, 132, 4, 132);        // f16 in, vector
  pack_unpack_case<bf16, f16, float>(rng, 65, 64, 0, 64);          // no tail
  pack_unpack_case<bf16, bf16, f16>(rng, 9, 77, 12, 81);           // odd everything
  pack_unpack_case<f16, f16, bf16>(rng, 3, 1030, 6, 1030);         // long rows
  pack_unpack_case<float, bf16, bf16>(rng, 5, 70, 70, 70);         // all tail
}

TEST(CodecCuda, Dsv4RowsMatchCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  auto rng = std::mt19937(fresh_seed());
  for (int64_t offset : {0, 2}) {  // offset 2: rows only 2-byte aligned -> element path
    SCOPED_TRACE("packed byte offset " + std::to_string(offset));
    const int64_t rows = 4097;
    const auto f = random_values(rows * 512, rng);
    std::vector<uint8_t> packed(rows * 584 + 8, 0xab);
    Buffer gsrc = upload(f), gpacked = upload(packed);
    dsv4_pack_rows(view(const_cast<float*>(f.data()), DType::F32, kCpu, rows, 512, 512), view(packed.data() + offset, DType::U8, kCpu, rows, 584, 584));
    dsv4_pack_rows(view(gsrc.data(), DType::F32, kGpu, rows, 512, 512),
                   view(gpacked.as<uint8_t>() + offset, DType::U8, kGpu, rows, 584, 584));
    synchronize(kGpu);
    EXPECT_EQ(download<uint8_t>(gpacked), packed);
    std::vector<float> out(rows * 512), init(rows * 512);
    Buffer gout = upload(init);
    dsv4_unpack_rows(view(packed.data() + offset, DType::U8, kCpu, rows, 584, 584), view(out.data(), DType::F32, kCpu, rows, 512, 512));
    dsv4_unpack_rows(view(gpacked.as<uint8_t>() + offset, DType::U8, kGpu, rows, 584, 584), view(gout.data(), DType::F32, kGpu, rows, 512, 512));
    synchronize(kGpu);
    EXPECT_EQ(count_float_mismatches(download<float>(gout), out), 0u);
    // unpack(pack(x)) == round trip on the GPU too
    Buffer grt = upload(init);
    fp8_round_trip_rows(view(gsrc.data(), DType::F32, kGpu, rows, 512, 512), view(grt.data(), DType::F32, kGpu, rows, 512, 512), 64);
    synchronize(kGpu);
    const auto rt = download<float>(grt), un = download<float>(gout);
    size_t bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int i = 0; i < 448; ++i) bad += !same_float(rt[r * 512 + i], un[r * 512 + i]);
    EXPECT_EQ(bad, 0u);
  }
}

TEST(CodecCuda, BadDeviceMixIsRejected) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  std::vector<float> h(64);
  Buffer g = upload(h);
  try {
    fp8_round_trip_rows(TensorRef(h.data(), DType::F32, kCpu, {1, 64}), TensorRef(g.data(), DType::F32, kGpu, {1, 64}), 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
}
