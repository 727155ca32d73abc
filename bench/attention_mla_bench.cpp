// `kvcore bench attention_mla`: DeepSeek-V2/V3 MLA decode through PagedCache -- 128 query heads
// over one kv head of 576 dims (512-dim latent, 64 RoPE dims on the tail), V the 512-dim latent,
// blocks of 64 -- with V in pools of its own ("_separate") or read in place from K's latent
// ("_shared", PagedCacheConfig::v_from_k_latent), bf16 and FP8 pages. Bytes = the K (and V)
// bytes, scales included, the op must read: the shared layout reads 576 values a token, the
// separate one 576 + 512. Every sequence repeats one chunk of random rows (timing does not
// depend on the values; tests/paged_mla_test.cpp checks them).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/ops/attention.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

constexpr int32_t kDk = 576, kDv = 512, kQHeads = 128, kBlock = 64, kChunk = 2048;

PagedCacheConfig mla_config(KvFormat f, bool shared, int32_t num_blocks) {
  PagedCacheConfig c;
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.head_dim = kDk;
  c.v_head_dim = kDv;
  c.block_size = kBlock;
  c.num_blocks = num_blocks;
  c.k_format = c.v_format = f;
  c.v_from_k_latent = shared;
  RopeSpec rope = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  rope.slice = RopeSlice::Tail;
  c.rope = {rope};
  return c;
}

// Bytes a token's rows occupy (K, plus V when it has a pool of its own).
double token_bytes(KvFormat f, bool shared) {
  const double el = f == KvFormat::Fp8 ? 1 : 2, sc = f == KvFormat::Fp8 ? 1 : 0;
  return kDk * el + kDk / 64 * sc + (shared ? 0 : kDv * el + kDv / 64 * sc);
}

void bench_mla(cli::BenchOptions& opt, int64_t batch, int64_t ctx, KvFormat f, bool shared) {
  const std::string name = std::string("mla_") + std::string(kv_format_name(f)) + "_b" + std::to_string(batch) + "_ctx" +
                           std::to_string(ctx) + (shared ? "_shared" : "_separate");
  if (!opt.wants(name)) return;
  const Device d = opt.device;
  const int64_t blocks_per_seq = (ctx + kBlock - 1) / kBlock;
  PagedCache cache(mla_config(f, shared, static_cast<int32_t>(batch * blocks_per_seq)), d);

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> rows(static_cast<size_t>(kChunk) * kDk);
  for (float& x : rows) x = u(rng);
  std::vector<float> vrows(static_cast<size_t>(kChunk) * kDv);
  for (int64_t t = 0; t < kChunk; ++t)
    for (int32_t e = 0; e < kDv; ++e) vrows[t * kDv + e] = rows[t * kDk + e];  // V = the latent
  const Buffer k_dev = Buffer::from_host(rows, d), v_dev = Buffer::from_host(vrows, d);
  std::vector<SeqId> seqs;
  std::vector<int32_t> pos;
  for (int64_t b = 0; b < batch; ++b) {
    seqs.push_back(cache.create());
    for (int64_t p0 = 0; p0 < ctx; p0 += kChunk) {
      const int64_t n = std::min<int64_t>(kChunk, ctx - p0);
      pos.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(p0 + i);
      const TensorRef k(k_dev.data(), DType::F32, d, {1, n, 1, kDk});
      const TensorRef v = shared ? TensorRef() : TensorRef(v_dev.data(), DType::F32, d, {1, n, 1, kDv});
      cache.append(seqs.back(), pos, k, v);
    }
  }
  std::vector<float> qh(static_cast<size_t>(batch) * kQHeads * kDk);
  for (float& x : qh) x = u(rng);
  std::vector<int32_t> qpos(static_cast<size_t>(batch), static_cast<int32_t>(ctx));
  const Buffer q_dev = Buffer::from_host(qh, d), qpos_dev = Buffer::from_host(qpos, d);
  Buffer out_dev(static_cast<size_t>(batch) * kQHeads * kDv * sizeof(float), d);
  const TensorRef q(q_dev.data(), DType::F32, d, {batch, kQHeads, kDk});
  const TensorRef out(out_dev.data(), DType::F32, d, {batch, kQHeads, kDv});

  AttentionStep step;
  step.table = cache.block_tables(seqs);
  step.q_positions = TensorRef(qpos_dev.data(), DType::I32, d, {batch});
  const PagedKV kv = cache.paged_kv(0);
  const AttentionPlan plan = AttentionPlan::decode(kv, kQHeads, step);
  const cli::Timing tm = opt.time([&](int) { plan.run(q, kv, out); });
  cli::BenchRecord r;
  r.bench = "attention_mla";
  r.case_name = name;
  r.bytes = static_cast<double>(batch) * ctx * token_bytes(f, shared);
  r.t = tm;
  r.traffic = cli::Traffic::Read;
  opt.report(r);
  opt.note(name + ": pool bytes per block " + std::to_string(cache.stats().bytes_per_block) + ", splits " +
           std::to_string(plan.num_splits()));
}

}  // namespace

KVCORE_BENCH(attention_mla, "DeepSeek-V2/V3 MLA decode through PagedCache: V in its own pools vs read from K's latent") {
  // GPU cases read well over the L2 cache (60 MB) per call.
  std::vector<std::pair<int64_t, int64_t>> cases{{1, 131072}, {16, 32768}, {64, 8192}, {64, 32768}};
  if (opt.device.is_cpu()) cases = {{1, 4096}, {4, 4096}};
  if (opt.quick) cases = {{1, 1024}};
  for (KvFormat f : {KvFormat::BF16, KvFormat::Fp8})
    for (const auto& [b, c] : cases)
      for (bool shared : {false, true}) bench_mla(opt, b, c, f, shared);
}
