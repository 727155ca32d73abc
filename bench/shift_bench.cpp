// `kvcore bench shift`: shift_dense on a dense cache, all layers in one call,
// against the seed port (bench/baselines/seed_shift.cu) on the same data in
// the same run. Required bytes: every retained (moved) K and V byte read once
// and written once; kept and dropped tokens cost nothing. Each call touches
// hundreds of MB (far beyond the 60 MB L2), so successive reps do not hit in
// L2; each rep shifts the already shifted cache again, which is the same work.
// Before timing, the CUDA result of the first and last layer is checked
// against the CPU op (V bytes identical, K within one ulp) and the seed port
// against the CPU op (within two f16 ulps).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/shift.hpp"
#include "kvcore/runtime.hpp"
#include "ops/tuning.hpp"
#include "tools/registry.hpp"
#if KVCORE_WITH_CUDA
#include "bench/baselines/seed_shift.hpp"
#endif

namespace {

using namespace kvcore;
using cli::BenchOptions;

struct Case {
  std::string name;
  int layers;
  int64_t length, n_keep, n_discard;
  enum Format { F16, Dsv4, Fp8 } fmt;  // Llama-3-8B f16 K and V (8 heads x 128); DeepSeek-V4 packed rows
                                        // (K only, 1 head); Llama geometry with e4m3 + ue8m0 keys and f16 V
  bool dsv4() const { return fmt == Dsv4; }
};

int64_t k_row_bytes(const Case& c) { return c.fmt == Case::Dsv4 ? math::Dsv4RowLayout::kBytes : c.fmt == Case::Fp8 ? 1024 : 2048; }
int64_t s_row_bytes(const Case& c) { return c.fmt == Case::Fp8 ? 16 : 0; }
int64_t v_row_bytes(const Case& c) { return c.fmt == Case::Dsv4 ? 0 : 2048; }

// One layer's initial bytes: random f16 values (or DSV4 rows with a valid bf16 tail).
void fill_layer(const Case& c, std::vector<uint8_t>& k, std::vector<uint8_t>& s, std::vector<uint8_t>& v, uint64_t seed) {
  k.resize(c.length * k_row_bytes(c));
  s.resize(c.length * s_row_bytes(c));
  v.resize(c.length * v_row_bytes(c));
#pragma omp parallel
  {
    std::mt19937_64 rng(seed * 7919 + 17);
    std::normal_distribution<float> normal(0.f, 1.f);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < c.length; ++t) {
      rng.seed(seed * 1000003 + t);
      uint8_t* kr = k.data() + t * k_row_bytes(c);
      if (c.fmt == Case::Fp8) {
        for (int b = 0; b < 16; ++b) {  // 8 heads x 2 blocks of 64, quantized as a writer would
          float vals[64], amax = 0;
          for (float& x : vals) amax = math::finite_abs_max(amax, x = normal(rng));
          const int e = math::e4m3_scale_exponent(amax);
          for (int i = 0; i < 64; ++i) kr[b * 64 + i] = math::e4m3_encode(math::e4m3_scaled(vals[i], math::pow2f(-e)));
          s[t * 16 + b] = math::ue8m0_encode(e);
        }
      }
      if (c.dsv4()) {
        for (int i = 0; i < math::Dsv4RowLayout::kBytes; ++i) kr[i] = static_cast<uint8_t>(rng());
        for (int i = 0; i < math::Dsv4RowLayout::kRope; ++i) {
          const uint16_t b = math::f32_to_bf16_bits(normal(rng));
          std::memcpy(kr + math::Dsv4RowLayout::kRopeOffset + 2 * i, &b, 2);
        }
      } else {
        for (int i = 0; c.fmt == Case::F16 && i < 1024; ++i) {
          const uint16_t h = math::f32_to_f16_bits(normal(rng));
          std::memcpy(kr + 2 * i, &h, 2);
        }
        uint8_t* vr = v.data() + t * v_row_bytes(c);
        for (int i = 0; i < 1024; ++i) {
          const uint16_t h = math::f32_to_f16_bits(normal(rng));
          std::memcpy(vr + 2 * i, &h, 2);
        }
      }
    }
  }
}

RopeSpec rope_of(const Case& c) { return c.dsv4() ? RopeSpec::deepseek_v4_compressed() : RopeSpec::llama3_8b(); }

ShiftDenseLayer view(const Case& c, Device d, void* k, void* s, void* v) {
  ShiftDenseLayer L;
  if (c.dsv4()) {
    L.k = TensorRef(k, DType::U8, d, {c.length, 1, math::Dsv4RowLayout::kBytes});
  } else if (c.fmt == Case::Fp8) {
    L.k = TensorRef(k, DType::E4M3, d, {c.length, 8, 128});
    L.maybe_k_scales = TensorRef(s, DType::UE8M0, d, {c.length, 8, 2});
    L.maybe_v = TensorRef(v, DType::F16, d, {c.length, 8, 128});
  } else {
    L.k = TensorRef(k, DType::F16, d, {c.length, 8, 128});
    L.maybe_v = TensorRef(v, DType::F16, d, {c.length, 8, 128});
  }
  L.rope = rope_of(c);
  return L;
}

// Differences between two arrays of 16-bit values (f16, or bf16 for DeepSeek-V4 rows).
struct Cmp {
  int64_t beyond = 0;       // more than one ulp AND more than 1e-6 apart
  double sq_err = 0, sq_ref = 0;
  double rms_rel() const { return sq_ref > 0 ? std::sqrt(sq_err / sq_ref) : 0.0; }
};

Cmp compare16(const std::vector<uint8_t>& a, const std::vector<uint8_t>& ref, int64_t n_bytes, bool bf) {
  int64_t beyond = 0;
  double se = 0, sr = 0;
#pragma omp parallel for reduction(+ : beyond, se, sr)
  for (int64_t i = 0; i < n_bytes / 2; ++i) {
    uint16_t x, y;
    std::memcpy(&x, &a[2 * i], 2);
    std::memcpy(&y, &ref[2 * i], 2);
    const double fx = bf ? math::bf16_bits_to_f32(x) : math::f16_bits_to_f32(x);
    const double fy = bf ? math::bf16_bits_to_f32(y) : math::f16_bits_to_f32(y);
    if (!std::isfinite(fy)) {  // DeepSeek-V4 FP8 bytes read as 16-bit: compared for identity only
      beyond += x != y;
      continue;
    }
    if (x != y) {
      const int64_t u = std::llabs(int64_t{int16_t(x)} - int16_t(y));
      if (u > 1 && std::fabs(fx - fy) > 1e-6) ++beyond;
    }
    se += (fx - fy) * (fx - fy);
    sr += fy * fy;
  }
  return {beyond, se, sr};
}

// Cases (and kernel variants) whose results failed their check.
void run_case(BenchOptions& opt, const Case& c, std::vector<std::string>& failed) {
  if (!opt.wants(c.name)) return;
  const Device dev = opt.device;
  const int64_t n_moved = c.length - c.n_keep - c.n_discard;
  const double bytes = 2.0 * n_moved * (k_row_bytes(c) + s_row_bytes(c) + v_row_bytes(c)) * c.layers;
  opt.note(c.name + ": " + std::to_string(c.layers) + " layers, L " + std::to_string(c.length) + ", keep " +
           std::to_string(c.n_keep) + ", discard " + std::to_string(c.n_discard) + ", " +
           std::to_string(int64_t(bytes / 1e6)) + " MB required");

  std::vector<uint8_t> k0, s0, v0;
  fill_layer(c, k0, s0, v0, 1);
  std::vector<Buffer> kb, sb, vb;
  std::vector<ShiftDenseLayer> layers;
  for (int l = 0; l < c.layers; ++l) {
    kb.emplace_back(k0.size(), dev);
    sb.emplace_back(s0.size(), dev);
    vb.emplace_back(v0.size(), dev);
  }
  auto upload = [&] {
    for (int l = 0; l < c.layers; ++l) {
      copy_bytes(kb[l].data(), dev, k0.data(), Device::cpu(), k0.size());
      if (!s0.empty()) copy_bytes(sb[l].data(), dev, s0.data(), Device::cpu(), s0.size());
      if (!v0.empty()) copy_bytes(vb[l].data(), dev, v0.data(), Device::cpu(), v0.size());
    }
  };
  for (int l = 0; l < c.layers; ++l) layers.push_back(view(c, dev, kb[l].data(), sb[l].data(), vb[l].data()));

  // CPU reference for one layer (every layer holds the same bytes).
  std::vector<uint8_t> kr = k0, sr = s0, vr = v0;
  {
    const ShiftDenseLayer ref = view(c, Device::cpu(), kr.data(), sr.data(), vr.data());
    shift_dense(std::span<const ShiftDenseLayer>(&ref, 1), c.length, c.n_keep, c.n_discard);
  }
  const int64_t end_k = (c.n_keep + n_moved) * k_row_bytes(c), end_v = (c.n_keep + n_moved) * v_row_bytes(c);
  // kvcore: within one ulp of the CPU op. The seed port: rms within f16 rounding plus its
  // f32 angle error (powf frequencies, unreduced angle: grows with n_discard).
  auto verify = [&](const char* who, bool is_seed) {
    for (int l : {0, c.layers - 1}) {
      const auto k = kb[l].to_host<uint8_t>();
      if (c.fmt == Case::Fp8) {  // codes and scales: one code off where float rounding differs, rarely
        const auto s = sb[l].to_host<uint8_t>();
        int64_t codes = 0, scales = 0;
        for (int64_t i = 0; i < end_k; ++i) codes += k[i] != kr[i];
        for (int64_t i = 0; i < end_k / 64; ++i) scales += s[i] != sr[i];
        require(codes <= end_k / 100 && scales <= end_k / 6400, ErrorCode::Corrupt, "bench shift ", c.name, ": ", who,
                " FP8 keys of layer ", l, ": ", codes, " codes and ", scales, " scales differ from the CPU op");
      } else {
      const Cmp d = compare16(k, kr, end_k, c.dsv4());
      const double rms_tol = 1e-3 + 5e-7 * double(c.n_discard);
      const bool ok = is_seed ? d.rms_rel() <= rms_tol : d.beyond == 0;
      require(ok, ErrorCode::Corrupt, "bench shift ", c.name, ": ", who, " K of layer ", l, " differs from the CPU op: ",
              d.beyond, " values beyond one ulp, rms relative ", d.rms_rel());
      if (is_seed) opt.note(c.name + ": seed port K rms difference from kvcore's CPU op " + std::to_string(d.rms_rel()));
      }
      if (!v0.empty()) {
        const auto v = vb[l].to_host<uint8_t>();
        require(std::memcmp(v.data(), vr.data(), end_v) == 0, ErrorCode::Corrupt, "bench shift ", c.name, ": ", who,
                " V of layer ", l, " differs from the CPU op");
      }
    }
  };

  std::optional<cli::Timing> seed_t;
#if KVCORE_WITH_CUDA
  const bool seed_applies = dev.is_cuda() && c.fmt == Case::F16;  // the seed handles f16 K and V only
  Buffer scratch;
  std::vector<baselines::SeedShiftLayer> seed_layers;
  auto seed_run = [&] {
    baselines::seed_shift_f16(seed_layers.data(), c.layers, scratch.data(), static_cast<uint32_t>(c.n_keep),
                              static_cast<uint32_t>(c.n_discard), static_cast<uint32_t>(c.length - c.n_discard), 8, 128,
                              500000.0f, nullptr);
  };
  if (seed_applies) {
    scratch = Buffer(static_cast<size_t>(c.length) * k_row_bytes(c), dev);
    for (int l = 0; l < c.layers; ++l) seed_layers.push_back({kb[l].data(), vb[l].data()});
    // The seed rotates with plain theta 500000 (no Llama-3 factors): verify it against a plain-theta CPU shift.
    std::vector<uint8_t> ks = k0, vs = v0;
    ShiftDenseLayer ref = view(c, Device::cpu(), ks.data(), nullptr, vs.data());
    ref.rope = RopeSpec::plain(128, 500000.0);
    shift_dense(std::span<const ShiftDenseLayer>(&ref, 1), c.length, c.n_keep, c.n_discard);
    upload();
    seed_run();
    synchronize(dev);
    std::swap(kr, ks);
    std::swap(vr, vs);
    verify("seed port", true);
    std::swap(kr, ks);
    std::swap(vr, vs);
  }
#endif
  // One CUDA kernel (ops::ShiftKernel::Auto: the library's rule; else forced through
  // src/ops/tuning.hpp): checked on fresh data, then timed. A kernel that fails its check is
  // named on stderr and not timed; the case goes on with the other kernel and the bench fails
  // at the end.
  auto run_variant = [&](ops::ShiftKernel kernel, const std::string& name) -> std::optional<cli::Timing> {
    const std::string who = kernel != ops::ShiftKernel::Auto ? "the " + name + " kernel" : std::string("kvcore");
    auto call = [&] { ops::shift_dense(layers, c.length, c.n_keep, c.n_discard, kernel); };
    std::optional<cli::Timing> out;
    try {
      upload();
      call();
      synchronize(dev);
      verify(who.c_str(), false);
      opt.note(c.name + ": " + who + " results verified against the CPU op");
      out = opt.time([&](int) { call(); });
#if KVCORE_WITH_CUDA
      // Host time of one call (validation, plan, enqueue): it is inside the timing above.
      if (dev.is_cuda()) {
        const double host_us = cli::host_time_us(dev.index, call);
        opt.note(c.name + ": " + who + ": host time of one call (validate, plan, enqueue) " + std::to_string(host_us) + " us");
      }
#endif
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Corrupt) throw;
      std::fprintf(stderr, "[bench] %s: %s FAILED: %s\n", c.name.c_str(), who.c_str(), e.what());
      failed.push_back(c.name + " (" + who + ")");
    }
    return out;
  };
  const std::optional<cli::Timing> t = run_variant(ops::ShiftKernel::Auto, "kvcore");
#if KVCORE_WITH_CUDA
  if (seed_applies) seed_t = opt.time([&](int) { seed_run(); });
  // The runner-up kernel on the same data in the same run, forced; it gets its own record,
  // <case>_<kernel>_kernel. The default is the rule of src/cuda/shift/shift_kernel_choice.hpp;
  // the record next to it keeps that rule checked.
  std::vector<std::pair<std::string, cli::Timing>> others;
  // FP8 keys (chain by default) and 16-bit rows without overlap (sweep): the tile kernel;
  // DeepSeek-V4 rows without overlap (tile kernel): the sweep; with overlap (tile kernel,
  // the sweep does not apply): the chain kernel.
  std::pair<ops::ShiftKernel, std::string> other{ops::ShiftKernel::Single, "single"};
  if (c.fmt != Case::Fp8 && c.n_discard < n_moved) other = {ops::ShiftKernel::Chain, "chain"};
  else if (c.fmt == Case::Dsv4) other = {ops::ShiftKernel::Sweep, "sweep"};
  if (dev.is_cuda())
    if (const auto ot = run_variant(other.first, other.second)) others.emplace_back(other.second, *ot);
#endif
  cli::BenchRecord r;
  r.bench = "shift";
  r.case_name = c.name;
  r.bytes = bytes;
  r.traffic = cli::Traffic::Copy;
  if (seed_t) {
    r.baseline = "seed_port";
    r.baseline_t = seed_t;
  }
  if (t) {
    r.t = *t;
    opt.report(r);
  }
#if KVCORE_WITH_CUDA
  for (const auto& [other, ot] : others) {
    r.case_name = c.name + "_" + other + "_kernel";
    r.t = ot;
    opt.report(r);
  }
#endif
}

}  // namespace

KVCORE_BENCH(shift, "context shift on a dense cache (shift_dense, all layers in one call) vs the seed port") {
  std::vector<Case> cases;
  if (opt.quick) {
    cases.push_back({"llama8b_f16_L4k_keep4_half_x2layers", 2, 4096, 4, 2046, Case::F16});
    cases.push_back({"llama8b_f16_L4k_keep4_d256_x2layers", 2, 4096, 4, 256, Case::F16});
    cases.push_back({"dsv4_rows_L4k_keep4_half_x2layers", 2, 4096, 4, 2046, Case::Dsv4});
    cases.push_back({"llama8b_fp8k_L4k_keep4_half_x2layers", 2, 4096, 4, 2046, Case::Fp8});
  } else {
    for (int64_t L : {4096, 32768, 131072})
      cases.push_back({"llama8b_f16_L" + std::to_string(L / 1024) + "k_keep4_half_x32layers", 32, L, 4, (L - 4) / 2, Case::F16});
    for (int64_t L : {32768, 131072})
      cases.push_back({"llama8b_f16_L" + std::to_string(L / 1024) + "k_keep4_d256_x32layers", 32, L, 4, 256, Case::F16});
    for (int64_t L : {32768, 131072}) {
      cases.push_back({"dsv4_rows_L" + std::to_string(L / 1024) + "k_keep4_half_x43layers", 43, L, 4, (L - 4) / 2, Case::Dsv4});
      cases.push_back({"dsv4_rows_L" + std::to_string(L / 1024) + "k_keep4_d256_x43layers", 43, L, 4, 256, Case::Dsv4});
    }
    cases.push_back({"llama8b_fp8k_L32k_keep4_half_x32layers", 32, 32768, 4, (32768 - 4) / 2, Case::Fp8});
  }
  if (opt.device.is_cpu() && !opt.quick) {
    opt.note("shift on the CPU: only the 4k and 32k Llama cases (the 128k ones need 16 GB)");
    cases.erase(std::remove_if(cases.begin(), cases.end(), [](const Case& c) { return c.length > 32768 || c.fmt != Case::F16; }), cases.end());
  }
  std::vector<std::string> failed;
  for (const Case& c : cases) run_case(opt, c, failed);
  std::string list;
  for (const std::string& f : failed) list += (list.empty() ? "" : ", ") + f;
  require(failed.empty(), ErrorCode::Corrupt, "bench shift: results differ from the CPU op in ", list);
}
