// Demo section "codec": FP8 on a realistic DeepSeek-V4 attention layer: the seed's
// round trip of the 448 nope dims (blocks of 64, power-of-two scales), the real
// 584-byte packed rows, and what they cost and save.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kvcore/kvcore.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/fp8.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

// Rows like a DeepSeek-V4 kv projection after RMSNorm * w_norm: unit-scale values with a few
// channels carrying much larger weights (per-channel log-normal gains), rope dims as rotated pairs.
std::vector<float> layer_rows(int tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> gain(512);
  for (auto& w : gain) w = std::exp(0.6f * g(rng)) * (rng() % 50 == 0 ? 8.0f : 1.0f);
  std::vector<float> rows(static_cast<size_t>(tokens) * 512);
  for (int t = 0; t < tokens; ++t)
    for (int i = 0; i < 512; ++i) rows[size_t(t) * 512 + i] = g(rng) * gain[i];
  return rows;
}

bool check(bool ok, const char* what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what);
  return ok;
}

}  // namespace

KVCORE_DEMO_SECTION(10, "codec", "FP8 E4M3 + UE8M0 block scales on a DeepSeek-V4 layer (seed 002), 584-byte packed rows") {
  using L = math::Dsv4RowLayout;
  const int tokens = opt.quick ? 512 : 2048;
  const Device dev = opt.device;
  std::printf("  layer: %d tokens x %d dims (448 nope FP8 in 7 blocks of 64 + 64 rope), on %s\n", tokens, L::kHeadDim,
              dev.str().c_str());
  const auto rows = layer_rows(tokens, opt.seed);
  const size_t n = rows.size();
  Buffer src = Buffer::from_host(rows, dev);
  Buffer rt(n * 4, dev), packed(size_t(tokens) * L::kBytes, dev), unpacked(n * 4, dev);
  const TensorRef src_t = TensorRef::of(src, DType::F32, {tokens, L::kHeadDim});
  const TensorRef rt_t = TensorRef::of(rt, DType::F32, {tokens, L::kHeadDim});
  const TensorRef packed_t = TensorRef::of(packed, DType::U8, {tokens, L::kBytes});
  const TensorRef un_t = TensorRef::of(unpacked, DType::F32, {tokens, L::kHeadDim});

  fp8_round_trip_rows(src_t, rt_t, L::kRope);
  dsv4_pack_rows(src_t, packed_t);
  dsv4_unpack_rows(packed_t, un_t);
  synchronize(dev);
  const auto q = rt.to_host<float>(), u = unpacked.to_host<float>();
  const auto bytes = packed.to_host<uint8_t>();

  // error of the nope dims, relative to their RMS; the worst block-relative error
  double err2 = 0, ref2 = 0, worst_rel = 0;
  bool tail_copied = true, pack_equal = true, tail_bf16 = true, pads_zero = true;
  for (int t = 0; t < tokens; ++t) {
    for (int b = 0; b < L::kBlocks; ++b) {
      double amax = 0;
      for (int i = 0; i < 64; ++i) amax = std::fmax(amax, std::fabs(rows[size_t(t) * 512 + 64 * b + i]));
      for (int i = 0; i < 64; ++i) {
        const size_t k = size_t(t) * 512 + 64 * b + i;
        const double e = double(q[k]) - rows[k];
        err2 += e * e;
        ref2 += double(rows[k]) * rows[k];
        worst_rel = std::fmax(worst_rel, std::fabs(e) / amax);
        pack_equal &= math::float_bits(u[k]) == math::float_bits(q[k]);
      }
    }
    for (int i = L::kNope; i < L::kHeadDim; ++i) {
      const size_t k = size_t(t) * 512 + i;
      tail_copied &= math::float_bits(q[k]) == math::float_bits(rows[k]);
      tail_bf16 &= math::float_bits(u[k]) == math::float_bits(to_f32(from_f32<bf16>(rows[k])));
    }
    pads_zero &= bytes[size_t(t) * L::kBytes + L::kPadOffset] == 0;
  }
  const double rel_rms = std::sqrt(err2 / ref2);
  std::printf("  round trip of the nope dims: relative RMS error %.4f%% (E4M3 has 3 mantissa bits: ~2-3%% expected),\n"
              "  worst error %.4f of its block's amax (bound: half a top-binade step, 16 * 2^k, over amax > 224 * 2^k = %.4f)\n",
              100.0 * rel_rms, worst_rel, 1.0 / 14);
  int ok = 1;
  ok &= check(rel_rms > 0.005 && rel_rms < 0.05, "relative RMS error in (0.5%, 5%)");
  ok &= check(worst_rel < 1.0 / 14, "every value within half a top-binade code step of its block");
  ok &= check(tail_copied, "rope dims 448..511 copied unchanged by the round trip");
  ok &= check(pack_equal, "dsv4_unpack(dsv4_pack(x)) == fp8_round_trip(x) bit for bit on all nope dims");
  ok &= check(tail_bf16, "packed rope dims == bf16 rounding of the input");
  ok &= check(pads_zero, "pad byte of every packed row is 0");
  if (dev.is_cuda()) {
    std::vector<float> cpu_rt(n);
    fp8_round_trip_rows(TensorRef(const_cast<float*>(rows.data()), DType::F32, Device::cpu(), {tokens, 512}),
                        TensorRef(cpu_rt.data(), DType::F32, Device::cpu(), {tokens, 512}), L::kRope);
    std::vector<uint8_t> cpu_packed(size_t(tokens) * L::kBytes);
    dsv4_pack_rows(TensorRef(const_cast<float*>(rows.data()), DType::F32, Device::cpu(), {tokens, 512}),
                   TensorRef(cpu_packed.data(), DType::U8, Device::cpu(), {tokens, L::kBytes}));
    bool same = cpu_packed == bytes;
    for (size_t i = 0; i < n; ++i) same &= math::float_bits(cpu_rt[i]) == math::float_bits(q[i]);
    ok &= check(same, "CUDA results == CPU results, bit for bit (round trip and packed bytes)");
  }
  const double mb = 1.0 / (1 << 20);
  std::printf("  bytes per row: %d packed (448 e4m3 + 128 rope bf16 + 7 scales + 1 pad) vs 2048 f32 vs 1024 f16\n", L::kBytes);
  std::printf("  this layer: %.2f MiB packed vs %.2f MiB f32 (%.2fx smaller) vs %.2f MiB f16 (%.2fx smaller)\n",
              tokens * 584.0 * mb, tokens * 2048.0 * mb, 2048.0 / 584, tokens * 1024.0 * mb, 1024.0 / 584);
  std::printf("  43 layers x 1M tokens of raw rows: %.1f GiB packed vs %.1f GiB f16\n", 43.0 * 584 * (1 << 20) / (1 << 30),
              43.0 * 1024 * (1 << 20) / (1 << 30));
  return ok ? 0 : 1;
}
