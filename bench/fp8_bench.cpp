// `kvcore bench fp8`: the FP8 row ops over DeepSeek-V4 rows (512 f32 = 448 nope + 64 rope),
// far beyond the L2 (1M rows = 2 GiB of input on a GPU), against the copy ceiling and a
// literal port of seed 002's binary-search kernel (bench/baselines/seed_fp8.*), timed in the
// same run. Results are checked (against the CPU op on sampled rows) before anything is timed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/baselines/seed_fp8.hpp"
#include "bench/harness.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/hd.hpp"
#include "kvcore/ops/fp8.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;
using L = math::Dsv4RowLayout;

// Cheap deterministic values: uniform in (-1, 1) times a per-64-block power of two in [2^-8, 2^7]
// (blocks at many scales, like real KV rows), never zero-filled.
std::vector<float> bench_rows(int64_t rows) {
  std::vector<float> v(static_cast<size_t>(rows) * L::kHeadDim);
  const int64_t n = static_cast<int64_t>(v.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    uint64_t b = static_cast<uint64_t>(i / 64) * 0x94d049bb133111ebull;
    b ^= b >> 31;
    const float u = static_cast<float>(static_cast<int64_t>(h >> 40) - (1 << 23)) / float(1 << 23);
    v[static_cast<size_t>(i)] = u * math::bits_float(static_cast<uint32_t>(127 - 8 + static_cast<int>(b % 16)) << 23);
  }
  return v;
}

// Rows [0, k) and [rows - k, rows) of a device tensor [rows, cols] of T, as one host vector.
template <class T>
std::vector<T> sample_rows(const Buffer& b, int64_t rows, int64_t cols, int64_t k) {
  std::vector<T> out(static_cast<size_t>(2 * k * cols));
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(T);
  copy_bytes(out.data(), Device::cpu(), b.data(), b.device(), k * row_bytes);
  copy_bytes(out.data() + k * cols, Device::cpu(), b.as<const char>() + (rows - k) * row_bytes, b.device(), k * row_bytes);
  return out;
}

baselines::SeedFp8Args seed_args(int64_t rows) {
  baselines::SeedFp8Args a{};
  a.ne00 = L::kHeadDim;
  a.ne01 = rows;
  a.ne02 = a.ne03 = 1;
  a.nb00 = a.nb0 = 4;
  a.nb01 = a.nb1 = 4 * L::kHeadDim;
  a.nb02 = a.nb2 = a.nb03 = a.nb3 = 4 * L::kHeadDim * rows;
  a.n_rot = L::kRope;
  return a;
}

void run_seed(const baselines::SeedFp8Args& a, const Buffer& src, Buffer& dst, Device d) {
  if (d.is_cuda()) {
#if KVCORE_WITH_CUDA
    baselines::seed_fp8_kv_quantize_cuda(a, src.data(), dst.data(), nullptr);
#endif
  } else {
    baselines::seed_fp8_kv_quantize_cpu(a, src.data(), dst.data());
  }
}

}  // namespace

KVCORE_BENCH(fp8, "FP8 round trip / DeepSeek-V4 584-byte pack and unpack of 512-dim rows vs the seed's binary-search kernel") {
  const Device d = opt.device;
  const int64_t rows = opt.quick ? 4096 : (d.is_cuda() ? int64_t{1} << 20 : int64_t{1} << 17);
  const int64_t k = std::min<int64_t>(1024, rows / 2);  // rows checked at each end
  opt.note("fp8: " + std::to_string(rows) + " rows x 512 f32 (" + std::to_string(rows * 2048 >> 20) + " MiB in)");

  const auto host = bench_rows(rows);
  Buffer src = Buffer::from_host(host, d);
  Buffer dst(host.size() * 4, d), seed_dst(host.size() * 4, d), packed(static_cast<size_t>(rows) * L::kBytes, d),
      unpacked(host.size() * 4, d);
  const TensorRef src_t = TensorRef::of(src, DType::F32, {rows, L::kHeadDim});
  const TensorRef dst_t = TensorRef::of(dst, DType::F32, {rows, L::kHeadDim});
  const TensorRef packed_t = TensorRef::of(packed, DType::U8, {rows, L::kBytes});
  const TensorRef un_t = TensorRef::of(unpacked, DType::F32, {rows, L::kHeadDim});
  const auto args = seed_args(rows);
  // the generic op's separate outputs: codes [rows, 448], scales [rows, 7], bf16 rope tail [rows, 64]
  Buffer codes(static_cast<size_t>(rows) * L::kNope, d), scales(static_cast<size_t>(rows) * L::kBlocks, d),
      tail(static_cast<size_t>(rows) * L::kRope * 2, d);
  const TensorRef codes_t = TensorRef::of(codes, DType::E4M3, {rows, L::kNope});
  const TensorRef scales_t = TensorRef::of(scales, DType::UE8M0, {rows, L::kBlocks});
  const TensorRef tail_t = TensorRef::of(tail, DType::BF16, {rows, L::kRope});

  // ---- check before timing: every op against the CPU op on sampled rows; the seed port against kvcore
  fp8_round_trip_rows(src_t, dst_t, L::kRope);
  dsv4_pack_rows(src_t, packed_t);
  dsv4_unpack_rows(packed_t, un_t);
  fp8_pack_rows(src_t, codes_t, scales_t, tail_t);
  run_seed(args, src, seed_dst, d);
  synchronize(d);
  std::vector<float> sample_in(static_cast<size_t>(2 * k * 512));
  std::copy(host.begin(), host.begin() + k * 512, sample_in.begin());
  std::copy(host.end() - k * 512, host.end(), sample_in.begin() + k * 512);
  std::vector<float> want_rt(sample_in.size()), want_un(sample_in.size());
  std::vector<uint8_t> want_packed(static_cast<size_t>(2 * k * L::kBytes));
  const Device cpu = Device::cpu();
  fp8_round_trip_rows(TensorRef(sample_in.data(), DType::F32, cpu, {2 * k, 512}), TensorRef(want_rt.data(), DType::F32, cpu, {2 * k, 512}), L::kRope);
  dsv4_pack_rows(TensorRef(sample_in.data(), DType::F32, cpu, {2 * k, 512}), TensorRef(want_packed.data(), DType::U8, cpu, {2 * k, L::kBytes}));
  dsv4_unpack_rows(TensorRef(want_packed.data(), DType::U8, cpu, {2 * k, L::kBytes}), TensorRef(want_un.data(), DType::F32, cpu, {2 * k, 512}));
  const auto got_rt = sample_rows<float>(dst, rows, 512, k), got_un = sample_rows<float>(unpacked, rows, 512, k);
  const auto got_packed = sample_rows<uint8_t>(packed, rows, L::kBytes, k);
  const auto got_seed = sample_rows<float>(seed_dst, rows, 512, k);
  size_t bad_rt = 0, bad_un = 0, seed_differs = 0;
  for (size_t i = 0; i < got_rt.size(); ++i) {
    bad_rt += math::float_bits(got_rt[i]) != math::float_bits(want_rt[i]);
    bad_un += math::float_bits(got_un[i]) != math::float_bits(want_un[i]);
    seed_differs += math::float_bits(got_seed[i]) != math::float_bits(want_rt[i]);
  }
  // the generic op's outputs hold exactly the bytes of the packed rows
  const auto got_codes = sample_rows<uint8_t>(codes, rows, L::kNope, k), got_scales = sample_rows<uint8_t>(scales, rows, L::kBlocks, k);
  const auto got_tail = sample_rows<uint8_t>(tail, rows, 2 * L::kRope, k);
  bool bad_generic = false;
  for (int64_t r = 0; r < 2 * k; ++r) {
    const uint8_t* row = want_packed.data() + r * L::kBytes;
    bad_generic |= !std::equal(row, row + L::kNope, got_codes.begin() + r * L::kNope);
    bad_generic |= !std::equal(row + L::kRopeOffset, row + L::kScaleOffset, got_tail.begin() + r * 2 * L::kRope);
    bad_generic |= !std::equal(row + L::kScaleOffset, row + L::kPadOffset, got_scales.begin() + r * L::kBlocks);
  }
  const bool bad_packed = got_packed != want_packed || bad_generic;
  char line[256];
  std::snprintf(line, sizeof line, "fp8 check on %lld sampled rows: round trip %zu, pack %s, unpack %zu mismatches vs CPU; seed port differs from kvcore on %zu values",
                static_cast<long long>(2 * k), bad_rt, bad_packed ? "MISMATCH" : "0", bad_un, seed_differs);
  opt.note(line);
  if (bad_rt != 0 || bad_packed || bad_un != 0) {  // a fast wrong kernel is not a result; let other benchmarks run
    opt.note("fp8: FAILED CHECK: CUDA results differ from the CPU op; nothing timed");
    return;
  }

  // ---- timing (each input is >= 584 MiB on a GPU: far beyond the 60 MB L2, so no rotation is needed)
  const std::string shape = std::to_string(rows) + "x512";
  const std::string rt_case = "round_trip f32 " + shape + " n_rot 64", pack_case = "dsv4_pack f32 " + shape + " -> 584 B",
                    unpack_case = "dsv4_unpack 584 B -> f32 " + shape, inplace_case = "round_trip in place f32 " + shape;
  // fp8_pack_rows into separate codes [rows, 448] | scales [rows, 7] | bf16 tail [rows, 64], and back
  const std::string gpack_case = "fp8_pack " + shape + " -> e4m3|ue8m0|bf16",
                    gunpack_case = "fp8_unpack e4m3|ue8m0|bf16 -> " + shape;
  std::optional<cli::Timing> seed_t;
  if (opt.wants(rt_case) || opt.wants(pack_case) || opt.wants(inplace_case) || opt.wants(gpack_case))
    seed_t = opt.time([&](int) { run_seed(args, src, seed_dst, d); });
  if (opt.wants(rt_case)) {
    const auto t = opt.time([&](int) { fp8_round_trip_rows(src_t, dst_t, L::kRope); });
    opt.report({"fp8", rt_case, 2.0 * 2048 * rows, t, cli::Traffic::Copy, "seed_port", seed_t});
  }
  if (opt.wants(pack_case)) {
    // the seed has no packed format: its FP8 step is the round trip, so that is the comparison
    const auto t = opt.time([&](int) { dsv4_pack_rows(src_t, packed_t); });
    opt.report({"fp8", pack_case, (2048.0 + 584) * rows, t, cli::Traffic::Copy, "seed_port_rt", seed_t});
  }
  const double generic_bytes = (2048.0 + L::kNope + L::kBlocks + 2 * L::kRope) * rows;
  if (opt.wants(gpack_case)) {
    const auto t = opt.time([&](int) { fp8_pack_rows(src_t, codes_t, scales_t, tail_t); });
    opt.report({"fp8", gpack_case, generic_bytes, t, cli::Traffic::Copy, "seed_port_rt", seed_t});
  }
  if (opt.wants(gunpack_case)) {
    const auto t = opt.time([&](int) { fp8_unpack_rows(codes_t, scales_t, tail_t, un_t); });
    opt.report({"fp8", gunpack_case, generic_bytes, t, cli::Traffic::Copy, "", std::nullopt});
  }
  if (opt.wants(unpack_case)) {
    const auto t = opt.time([&](int) { dsv4_unpack_rows(packed_t, un_t); });
    opt.report({"fp8", unpack_case, (584.0 + 2048) * rows, t, cli::Traffic::Copy, "", std::nullopt});
  }
  if (opt.wants(inplace_case)) {
    const auto t = opt.time([&](int) { fp8_round_trip_rows(dst_t, dst_t, L::kRope); });
    opt.report({"fp8", inplace_case, 2.0 * 2048 * rows, t, cli::Traffic::Copy, "seed_port", seed_t});
  }
}
