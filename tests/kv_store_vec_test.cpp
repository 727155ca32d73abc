// The vectorized CUDA bodies of kv_store / kv_rotate_blocks (ops/kv_store_vec.hpp), run on the
// host over every thread index, give exactly the bytes of the CPU kernels: their index math
// (which dims a thread owns, NeoX vs interleaved groups, plain dims around a partial slice,
// skipped slots, cells without a delta) is checked here, without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "ops/kv_store_vec.hpp"
#include "paged_model.hpp"

using namespace kvcore;

namespace {

struct Spec {
  const char* name;
  RopeSpec rope;
  bool rotate;
};

std::vector<Spec> specs() {
  RopeSpec tail = RopeSpec::plain(32, 20000.0, RopePairing::Interleaved);
  tail.slice = RopeSlice::Tail;
  RopeSpec head = RopeSpec::plain(64, 10000.0);
  head.attention_factor = 1.3;
  return {{"none", RopeSpec::plain(128, 1e4), false},
          {"llama3_full", RopeSpec::llama3_8b(), true},
          {"neox_head_64", head, true},
          {"interleaved_tail_32", tail, true}};
}

template <KvFormat F>
void run_store(const KvStoreParams& p) {
  const int64_t threads = kvvec::kv_store_vec_threads(p);
  for (int64_t t = 0; t < threads + 5; ++t) kvvec::kv_store_vec_unit<F>(p, t);  // + 5: out-of-range threads do nothing
}

template <KvFormat F>
void run_rotate(const KvRotateParams& p) {
  const int64_t threads = static_cast<int64_t>(p.n_blocks) * p.block_size * (p.rope.layout.n_pairs() / 8);
  for (int64_t t = 0; t < threads + 5; ++t) kvvec::kv_rotate_vec_unit<F>(p, t);
}

class KvStoreVec : public ::testing::TestWithParam<KvFormat> {};

TEST_P(KvStoreVec, HostRunOfTheCudaBodiesMatchesTheCpuKernelsByteForByte) {
  const KvFormat f = GetParam();
  const int32_t D = 128, H = 3, bs = 5, blocks = 9, n = 29;
  const size_t es = dtype_size(kv_format_dtype(f));
  const size_t pool_bytes = static_cast<size_t>(blocks) * bs * H * D * es;
  std::mt19937_64 rng(17);
  for (const Spec& sp : specs()) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      SCOPED_TRACE(std::string(sp.name) + " from " + std::string(dtype_name(dt)));
      const math::RopeTable table = make_rope_table(sp.rope, D);
      // Source rows with a token stride of H * D + 8 (aligned, not contiguous).
      paged_test::Source src = paged_test::make_source(rng, 1, n, H, D, dt, Device::cpu(), true);
      const int64_t tstride = H * D + 8;
      Buffer padded(static_cast<size_t>(n) * tstride * dtype_size(dt), Device::cpu());
      for (int32_t t = 0; t < n; ++t)
        std::memcpy(padded.as<uint8_t>() + t * tstride * dtype_size(dt),
                    static_cast<const uint8_t*>(src.tensor.data()) + t * H * D * dtype_size(dt), H * D * dtype_size(dt));
      const TensorRef srct(padded.data(), dt, Device::cpu(), {n, H, D}, {tstride, D, 1});
      std::vector<int32_t> cells(blocks * bs);
      std::iota(cells.begin(), cells.end(), 0);
      std::shuffle(cells.begin(), cells.end(), rng);
      std::vector<int32_t> slots(cells.begin(), cells.begin() + n), pos(n);
      slots[2] = -1;
      for (auto& x : pos) x = static_cast<int32_t>(rng() % 100000);

      Buffer a(pool_bytes, Device::cpu()), b(pool_bytes, Device::cpu());
      std::memset(a.data(), 0x11, pool_bytes);
      std::memset(b.data(), 0x11, pool_bytes);
      KvPool pool;
      pool.format = f;
      pool.head_dim = D;
      pool.data = TensorRef(a.data(), kv_format_dtype(f), Device::cpu(), {blocks, bs, H, D});
      kv_store(srct, TensorRef(slots.data(), DType::I32, Device::cpu(), {n}), pool,
               sp.rotate ? TensorRef(pos.data(), DType::I32, Device::cpu(), {n}) : TensorRef(), sp.rotate ? &table : nullptr);

      KvStoreParams p;
      p.src = srct.data();
      p.src_token_stride = tstride;
      p.src_head_stride = D;
      p.src_dtype = dt;
      p.slots = slots.data();
      p.maybe_positions = sp.rotate ? pos.data() : nullptr;
      p.pool = b.data();
      p.format = f;
      p.n_tokens = n;
      p.n_heads = H;
      p.head_dim = D;
      p.row_width = D;
      p.num_cells = blocks * bs;
      if (sp.rotate) p.rope = table;
      ASSERT_TRUE(kvvec::vec_store_ok(p));
      if (f == KvFormat::F32) run_store<KvFormat::F32>(p);
      else if (f == KvFormat::F16) run_store<KvFormat::F16>(p);
      else run_store<KvFormat::BF16>(p);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), pool_bytes)) << "store";

      if (!sp.rotate) continue;
      // The same from a kv_rope_angles table (the path PagedCache::append takes): the same bytes,
      // through the CPU kernel and the host run of the CUDA body alike.
      {
        const int32_t np = table.layout.n_pairs();
        std::vector<float> ang(static_cast<size_t>(n) * np * 2);
        const TensorRef angt(ang.data(), DType::F32, Device::cpu(), {n, np, 2});
        kv_rope_angles(TensorRef(pos.data(), DType::I32, Device::cpu(), {n}), table, angt);
        Buffer c2(pool_bytes, Device::cpu()), d2(pool_bytes, Device::cpu());
        std::memset(c2.data(), 0x11, pool_bytes);
        std::memset(d2.data(), 0x11, pool_bytes);
        KvPool pool2 = pool;
        pool2.data = TensorRef(c2.data(), kv_format_dtype(f), Device::cpu(), {blocks, bs, H, D});
        kv_store(srct, TensorRef(slots.data(), DType::I32, Device::cpu(), {n}), pool2,
                 TensorRef(pos.data(), DType::I32, Device::cpu(), {n}), &table, {}, angt);
        ASSERT_EQ(0, std::memcmp(a.data(), c2.data(), pool_bytes)) << "CPU store with angles";
        KvStoreParams q = p;
        q.pool = d2.data();
        q.maybe_angles = ang.data();
        if (f == KvFormat::F32) run_store<KvFormat::F32>(q);
        else if (f == KvFormat::F16) run_store<KvFormat::F16>(q);
        else run_store<KvFormat::BF16>(q);
        ASSERT_EQ(0, std::memcmp(a.data(), d2.data(), pool_bytes)) << "vectorized store with angles";
      }
      // Rotate 4 of the blocks by per-cell deltas (some zero) on both.
      std::vector<int32_t> delta(blocks * bs), list = {7, 0, 4, 5};
      for (auto& x : delta) x = rng() % 3 == 0 ? 0 : -static_cast<int32_t>(rng() % 50000);
      kv_rotate_blocks(pool, TensorRef(list.data(), DType::I32, Device::cpu(), {4}),
                       TensorRef(delta.data(), DType::I32, Device::cpu(), {blocks, bs}), table);
      KvRotateParams r;
      r.pool = b.data();
      r.format = f;
      r.n_heads = H;
      r.head_dim = D;
      r.row_width = D;
      r.block_size = bs;
      r.blocks = list.data();
      r.n_blocks = 4;
      r.cell_delta = delta.data();
      r.rope = table;
      ASSERT_TRUE(kvvec::vec_rotate_ok(r));
      if (f == KvFormat::F32) run_rotate<KvFormat::F32>(r);
      else if (f == KvFormat::F16) run_rotate<KvFormat::F16>(r);
      else run_rotate<KvFormat::BF16>(r);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), pool_bytes)) << "rotate";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PlainFormats, KvStoreVec, ::testing::Values(KvFormat::F32, KvFormat::F16, KvFormat::BF16),
                         [](const ::testing::TestParamInfo<KvFormat>& i) { return std::string(kv_format_name(i.param)); });

}  // namespace
