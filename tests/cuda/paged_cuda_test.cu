// CUDA PagedCache and kv_store family against the CPU ones (needs a GPU; label gpu).
//  * kv_store / kv_rotate_blocks on awkward sizes (37 tokens, 3 heads, 192-dim and MLA's 576-dim
//    rows, strided f16/bf16/f32 sources, skipped slots): without rotation the pool bytes are identical for every format;
//    with rotation (sincosf on the device, libm on the host) values agree within one unit of
//    the format's last place, FP8 codes differ by at most one step, and rarely (measured, printed).
//  * The same random operation sequence (tests/paged_model.hpp, 10,000 operations per format
//    and mode, 100,000 in all) on a CPU cache and a CUDA cache: identical ids, metadata, failures and error
//    codes after every operation; identical positions/validity arrays on the device; identical
//    V pool bytes and (rope-on-read) K pool bytes; both read back against the f64 model. The
//    same at MLA's shape (K 576 with a 64-dim RoPE tail, V 512; f16, bf16, fp8), 2,500 operations each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "kvcore/runtime.hpp"
#include "ops/kv_store_row.hpp"
#include "paged_configs.hpp"
#include "paged_model.hpp"

using namespace kvcore;
using namespace paged_test;

namespace {

bool have_gpu() { return cuda_device_count() > 0; }

struct TwinPool {
  KvPool cpu, gpu;
  std::vector<uint8_t> host_data, host_scales;
  Buffer dev_data, dev_scales;
  TwinPool(KvFormat f, int32_t blocks, int32_t bs, int32_t H, int32_t D) {
    const int64_t rows = static_cast<int64_t>(blocks) * bs * H;
    const size_t bytes = static_cast<size_t>(rows * kv_row_width(f, D) * dtype_size(kv_format_dtype(f)));
    host_data.assign(bytes, 0x5a);
    dev_data = Buffer(bytes, Device::cuda(0));
    dev_data.copy_from_host(host_data.data(), bytes);
    for (KvPool* p : {&cpu, &gpu}) {
      p->format = f;
      p->head_dim = D;
    }
    cpu.data = TensorRef(host_data.data(), kv_format_dtype(f), Device::cpu(), {blocks, bs, H, kv_row_width(f, D)});
    gpu.data = TensorRef(dev_data.data(), kv_format_dtype(f), Device::cuda(0), {blocks, bs, H, kv_row_width(f, D)});
    if (kv_format_has_scales(f)) {
      host_scales.assign(static_cast<size_t>(rows * D / 64), 0x33);
      dev_scales = Buffer(host_scales.size(), Device::cuda(0));
      dev_scales.copy_from_host(host_scales.data(), host_scales.size());
      cpu.scales = TensorRef(host_scales.data(), DType::UE8M0, Device::cpu(), {blocks, bs, H, D / 64});
      gpu.scales = TensorRef(dev_scales.data(), DType::UE8M0, Device::cuda(0), {blocks, bs, H, D / 64});
    }
  }
  // Compare the pools: returns (differing data bytes, worst |value difference| / rowmax).
  std::pair<int64_t, double> compare(int32_t H, int32_t D) const {
    const std::vector<uint8_t> g = download(gpu.data);
    const std::vector<uint8_t> gs = gpu.scales.empty() ? std::vector<uint8_t>() : download(gpu.scales);
    int64_t diff = 0;
    for (size_t i = 0; i < g.size(); ++i) diff += g[i] != host_data[i];
    for (size_t i = 0; i < gs.size(); ++i) diff += gs[i] != host_scales[i];
    double worst = 0;
    const KvFormat f = cpu.format;
    const int64_t rb = kv_row_width(f, D) * static_cast<int64_t>(dtype_size(kv_format_dtype(f)));
    const int64_t rows = static_cast<int64_t>(g.size()) / rb;
    const int32_t groups = kvrow::n_fp8_groups(f, D);
    for (int64_t r = 0; r < rows; ++r) {
      double rowmax = 0, w = 0;
      for (int32_t d = 0; d < D; ++d) {
        const float a = kvrow::decode(f, host_data.data() + r * rb, host_scales.empty() ? nullptr : host_scales.data() + r * groups, d);
        const float b = kvrow::decode(f, g.data() + r * rb, gs.empty() ? nullptr : gs.data() + r * groups, d);
        if (std::isnan(a) && std::isnan(b)) continue;
        rowmax = std::max(rowmax, std::abs(static_cast<double>(a)));
        w = std::max(w, std::abs(static_cast<double>(a) - b));
      }
      (void)H;
      if (rowmax > 0) worst = std::max(worst, w / rowmax);
    }
    return {diff, worst};
  }
};

class PagedCudaFormats : public ::testing::TestWithParam<KvFormat> {};

TEST_P(PagedCudaFormats, KvStoreAndRotateMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const KvFormat f = GetParam();
  const int32_t D = f == KvFormat::Dsv4Row ? 512 : 192, H = 3, bs = 7, blocks = 11, n = 37;
  std::mt19937_64 rng(21);
  // Variant 0: Llama-3 (NeoX, 64 pairs: the vectorized rotation path for 16-bit and f32 rows);
  // variant 1: an odd partial tail slice, interleaved, 18 pairs (the per-warp path).
  RopeSpec odd = RopeSpec::plain(36, 20000.0, RopePairing::Interleaved);
  odd.slice = RopeSlice::Tail;
  // variant 2: MLA's 576-dim K rows, 64-dim interleaved tail (the vectorized 16-bit path for
  // contiguous rows, the per-warp path for padded and FP8 rows).
  const RopeSpec mla = mla_config(f, RopeMode::RopeStored).rope[0];
  for (int variant = 0; variant < (f == KvFormat::Dsv4Row ? 2 : 3); ++variant)
  for (bool rotate : {false, true}) {
    const int32_t Dv = variant == 2 ? 576 : D;
    const math::RopeTable rope = make_rope_table(
        f == KvFormat::Dsv4Row ? (variant ? RopeSpec::deepseek_v4_window() : RopeSpec::deepseek_v4_compressed())
                               : (variant == 2 ? mla : variant ? odd : RopeSpec::llama3_8b()),
        Dv);
    for (int pad : {0, 5})  // contiguous rows (the vectorized CUDA path for plain pools), padded rows (per warp)
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      TwinPool pool(f, blocks, bs, H, Dv);
      Source src = make_source(rng, 1, n, H, Dv + 0, dt, Device::cpu(), true);
      std::vector<uint8_t> padded(static_cast<size_t>(n) * (H * Dv + pad) * dtype_size(dt));
      for (int32_t t = 0; t < n; ++t)
        std::memcpy(padded.data() + t * (H * Dv + pad) * dtype_size(dt),
                    static_cast<const uint8_t*>(src.tensor.data()) + t * H * Dv * dtype_size(dt), H * Dv * dtype_size(dt));
      Buffer dpad = Buffer::from_host(padded, Device::cuda(0));
      const TensorRef hs(padded.data(), dt, Device::cpu(), {n, H, Dv}, {H * Dv + pad, Dv, 1});
      const TensorRef ds(dpad.data(), dt, Device::cuda(0), {n, H, Dv}, {H * Dv + pad, Dv, 1});
      std::vector<int32_t> cells(blocks * bs);
      std::iota(cells.begin(), cells.end(), 0);
      std::shuffle(cells.begin(), cells.end(), rng);
      std::vector<int32_t> slots(cells.begin(), cells.begin() + n), pos(n);
      slots[3] = slots[30] = -1;
      for (int32_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(rng() % 131072);
      Buffer dslots = Buffer::from_host(slots, Device::cuda(0)), dpos = Buffer::from_host(pos, Device::cuda(0));
      const TensorRef hsl(slots.data(), DType::I32, Device::cpu(), {n}), hp(pos.data(), DType::I32, Device::cpu(), {n});
      const TensorRef dsl(dslots.data(), DType::I32, Device::cuda(0), {n}), dp(dpos.data(), DType::I32, Device::cuda(0), {n});
      kv_store(hs, hsl, pool.cpu, rotate ? hp : TensorRef(), rotate ? &rope : nullptr);
      kv_store(ds, dsl, pool.gpu, rotate ? dp : TensorRef(), rotate ? &rope : nullptr);
      synchronize(Device::cuda(0));
      auto [diff, worst] = pool.compare(H, Dv);
      if (!rotate) {
        EXPECT_EQ(diff, 0) << kv_format_name(f) << " " << dtype_name(dt) << " pad " << pad
                           << ": stored bytes differ without rotation";
      } else {
        std::printf("[paged cuda] kv_store %s from %s (pad %d), rope variant %d, positions < 131072: %lld of %zu bytes differ, worst |diff|/rowmax %.3g\n",
                    std::string(kv_format_name(f)).c_str(), std::string(dtype_name(dt)).c_str(), pad, variant, static_cast<long long>(diff),
                    pool.host_data.size(), worst);
        EXPECT_LE(worst, 2.0 * format_eps(f) + 2e-5) << kv_format_name(f);
      }
      // Rotate a few blocks by per-cell deltas, on both.
      std::vector<int32_t> delta(blocks * bs);
      for (auto& x : delta) x = rng() % 4 == 0 ? 0 : -static_cast<int32_t>(rng() % 100000);
      std::vector<int32_t> list = {9, 2, 5, 0};
      Buffer ddelta = Buffer::from_host(delta, Device::cuda(0)), dlist = Buffer::from_host(list, Device::cuda(0));
      kv_rotate_blocks(pool.cpu, TensorRef(list.data(), DType::I32, Device::cpu(), {4}),
                       TensorRef(delta.data(), DType::I32, Device::cpu(), {blocks, bs}), rope);
      kv_rotate_blocks(pool.gpu, TensorRef(dlist.data(), DType::I32, Device::cuda(0), {4}),
                       TensorRef(ddelta.data(), DType::I32, Device::cuda(0), {blocks, bs}), rope);
      synchronize(Device::cuda(0));
      auto [diff2, worst2] = pool.compare(H, Dv);
      EXPECT_LE(worst2, 3.0 * format_eps(f) + 4e-5) << kv_format_name(f) << " after rotation";
      if (rotate && dt == DType::F32)
        std::printf("[paged cuda] kv_rotate_blocks %s, rope variant %d: %lld bytes differ, worst |diff|/rowmax %.3g\n",
                    std::string(kv_format_name(f)).c_str(), variant, static_cast<long long>(diff2), worst2);
    }
  }
}

// The vectorized store paths: 16-bit / f32 rows (one thread per token, head and 8-pair unit)
// and FP8 rows (head_dim / 16 lanes per row, group amax by shuffles), for head_dim 64, 128 and
// 256, without rotation, NeoX over the whole row (Llama-3) and interleaved over the whole row;
// 37 tokens x 3 heads (rows that end mid-warp), skipped slots. Bytes identical without
// rotation; with rotation within the stated tolerance (differences printed).
TEST(PagedCudaStore, VectorizedPathsMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const int32_t H = 3, bs = 7, blocks = 11, n = 37;
  std::mt19937_64 rng(33);
  for (KvFormat f : {KvFormat::Fp8, KvFormat::F16, KvFormat::BF16, KvFormat::F32})
  for (int32_t D : {64, 128, 256})
  for (int variant = 0; variant < 3; ++variant) {
    RopeSpec spec = variant == 2 ? RopeSpec::plain(D, 10000.0, RopePairing::Interleaved)
                                 : (D == 128 ? RopeSpec::llama3_8b() : RopeSpec::plain(D, 500000.0));
    const math::RopeTable rope = make_rope_table(spec, D);
    const bool rotate = variant != 0;
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      TwinPool pool(f, blocks, bs, H, D);
      Source src = make_source(rng, 1, n, H, D, dt, Device::cpu(), true);
      Buffer dsrc = Buffer(static_cast<size_t>(n) * H * D * dtype_size(dt), Device::cuda(0));
      copy_bytes(dsrc.data(), Device::cuda(0), src.tensor.data(), Device::cpu(), dsrc.size());
      const TensorRef ds(dsrc.data(), dt, Device::cuda(0), {n, H, D});
      std::vector<int32_t> cells(blocks * bs);
      std::iota(cells.begin(), cells.end(), 0);
      std::shuffle(cells.begin(), cells.end(), rng);
      std::vector<int32_t> slots(cells.begin(), cells.begin() + n), pos(n);
      slots[0] = slots[17] = -1;
      for (int32_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(rng() % 131072);
      Buffer dslots = Buffer::from_host(slots, Device::cuda(0)), dpos = Buffer::from_host(pos, Device::cuda(0));
      const TensorRef hsl(slots.data(), DType::I32, Device::cpu(), {n}), hp(pos.data(), DType::I32, Device::cpu(), {n});
      const TensorRef dsl(dslots.data(), DType::I32, Device::cuda(0), {n}), dp(dpos.data(), DType::I32, Device::cuda(0), {n});
      kv_store(src.tensor, hsl, pool.cpu, rotate ? hp : TensorRef(), rotate ? &rope : nullptr);
      kv_store(ds, dsl, pool.gpu, rotate ? dp : TensorRef(), rotate ? &rope : nullptr);
      synchronize(Device::cuda(0));
      auto [diff, worst] = pool.compare(H, D);
      const std::string what = std::string(kv_format_name(f)) + " D " + std::to_string(D) + " variant " +
                               std::to_string(variant) + " from " + std::string(dtype_name(dt));
      if (!rotate) {
        EXPECT_EQ(diff, 0) << what << ": stored bytes differ without rotation";
      } else {
        if (diff) std::printf("[paged cuda] vectorized kv_store %s: %lld bytes differ, worst |diff|/rowmax %.3g\n", what.c_str(),
                              static_cast<long long>(diff), worst);
        EXPECT_LE(worst, 2.0 * format_eps(f) + 2e-5) << what;
        // From a device kv_rope_angles table (PagedCache::append's path): the same bytes as the
        // device computing its own angles; the table itself matches the CPU's.
        const int32_t np = rope.layout.n_pairs();
        Buffer dang(static_cast<size_t>(n) * np * 2 * sizeof(float), Device::cuda(0));
        const TensorRef dangt(dang.data(), DType::F32, Device::cuda(0), {n, np, 2});
        kv_rope_angles(dp, rope, dangt);
        std::vector<float> hang(static_cast<size_t>(n) * np * 2);
        kv_rope_angles(hp, rope, TensorRef(hang.data(), DType::F32, Device::cpu(), {n, np, 2}));
        const std::vector<float> gang = dang.to_host<float>();
        double worst_angle = 0;
        for (size_t i = 0; i < hang.size(); ++i) worst_angle = std::max(worst_angle, std::abs(double(hang[i]) - gang[i]));
        EXPECT_LE(worst_angle, 1.2e-7) << what << ": kv_rope_angles CUDA vs CPU";
        TwinPool pool2(f, blocks, bs, H, D);
        kv_store(ds, dsl, pool2.gpu, dp, &rope, {}, dangt);
        synchronize(Device::cuda(0));
        EXPECT_EQ(download(pool2.gpu.data), download(pool.gpu.data)) << what << ": store from the angle table";
        if (kv_format_has_scales(f)) {
          EXPECT_EQ(download(pool2.gpu.scales), download(pool.gpu.scales)) << what;
        }
      }
    }
  }
}

struct CudaCase {
  KvFormat format;
  RopeMode mode;
  bool mla = false;     // mla_config: K 576 with a 64-dim RoPE tail, V 512 (2,500 operations)
  bool shared = false;  // with mla: the shared layout (mla_shared_config: V is K's latent, no V pools)
};
class PagedCudaModel : public ::testing::TestWithParam<CudaCase> {};

TEST_P(PagedCudaModel, SameOperationsSameCacheAsTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const CudaCase cc = GetParam();
  const int32_t bs = cc.format == KvFormat::Dsv4Row ? 4 : 8, nb = cc.format == KvFormat::Dsv4Row ? 24 : 40;
  const PagedCacheConfig cfg = cc.shared ? mla_shared_config(cc.format, cc.mode, bs, nb)
                               : cc.mla  ? mla_config(cc.format, cc.mode, bs, nb)
                                         : small_config(cc.format, cc.mode, bs, nb);
  PagedCache cpu(cfg, Device::cpu());
  PagedCache gpu(cfg, Device::cuda(0));
  Driver drv({&cpu, &gpu}, 77 + static_cast<int>(cc.format) + (cc.mla ? 100 : 0) + (cc.shared ? 50 : 0));
  int64_t k_byte_diffs = 0, k_bytes_compared = 0;
  drv.on_step = [&](int64_t op) {
    ASSERT_EQ(cpu.debug_state(), gpu.debug_state()) << "metadata diverged at op " << op;
    if (op % 50 != 0) return;
    gpu.prepare();
    cpu.prepare();
    const Snapshot a = snapshot(cpu), b = snapshot(gpu);
    ASSERT_EQ(a.arrays.size(), b.arrays.size());
    // positions and validity (last two arrays) must be identical on the device
    ASSERT_EQ(a.arrays[a.arrays.size() - 1], b.arrays[b.arrays.size() - 1]) << "valid mirror, op " << op;
    ASSERT_EQ(a.arrays[a.arrays.size() - 2], b.arrays[b.arrays.size() - 2]) << "positions mirror, op " << op;
    // Per layer: K data [, K scales], V data [, V scales].
    const bool k_scales = kv_format_has_scales(cc.format), has_v = cpu.config().v_head_dim > 0 && !cpu.config().v_from_k_latent;
    const size_t per_layer = 1 + k_scales + (has_v ? 1 + k_scales : 0);
    for (int32_t l = 0; l < cpu.config().n_layers; ++l) {
      const size_t base = l * per_layer;
      const size_t k_arrays = 1 + k_scales;
      for (size_t i = 0; i < k_arrays; ++i) {
        const auto& x = a.arrays[base + i];
        const auto& y = b.arrays[base + i];
        if (cc.mode == RopeMode::RopeOnRead) ASSERT_EQ(x, y) << "K bytes, layer " << l << ", op " << op;
        for (size_t j = 0; j < x.size(); ++j) k_byte_diffs += x[j] != y[j];
        k_bytes_compared += static_cast<int64_t>(x.size());
      }
      for (size_t i = k_arrays; i < per_layer; ++i) ASSERT_EQ(a.arrays[base + i], b.arrays[base + i]) << "V bytes, op " << op;
    }
  };
  const int64_t n_ops = cc.mla ? 2500 : 10000;
  for (int64_t i = 0; i < n_ops && !::testing::Test::HasFailure(); ++i) drv.step();
  drv.check_all();
  std::printf("[paged cuda] model %s%s %s: %lld ops, %lld failed cleanly on both; K bytes differing CPU vs CUDA: %lld of %lld; "
              "worst |err|/tol K %.3f V %.3f\n",
              cc.shared ? "mla shared " : cc.mla ? "mla " : "", std::string(kv_format_name(cc.format)).c_str(),
              cc.mode == RopeMode::RopeStored ? "rope-stored" : "rope-on-read",
              static_cast<long long>(drv.ops), static_cast<long long>(drv.failed_ops), static_cast<long long>(k_byte_diffs),
              static_cast<long long>(k_bytes_compared), drv.st.worst_ratio_k, drv.st.worst_ratio_v);
}

std::vector<CudaCase> cuda_cases() {
  std::vector<CudaCase> v;
  for (KvFormat f : kAllFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m});
  for (KvFormat f : kMlaFormats)
    for (RopeMode m : {RopeMode::RopeStored, RopeMode::RopeOnRead}) v.push_back({f, m, true});
  v.push_back({KvFormat::Fp8, RopeMode::RopeStored, true, true});
  v.push_back({KvFormat::BF16, RopeMode::RopeOnRead, true, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedCudaFormats, ::testing::ValuesIn(kAllFormats),
                         [](const ::testing::TestParamInfo<KvFormat>& i) { return std::string(kv_format_name(i.param)); });
INSTANTIATE_TEST_SUITE_P(AllFormats, PagedCudaModel, ::testing::ValuesIn(cuda_cases()),
                         [](const ::testing::TestParamInfo<CudaCase>& i) {
                           return std::string(i.param.shared ? "MlaShared_" : i.param.mla ? "Mla_" : "") +
                                  std::string(kv_format_name(i.param.format)) +
                                  (i.param.mode == RopeMode::RopeStored ? "_RopeStored" : "_RopeOnRead");
                         });

}  // namespace
