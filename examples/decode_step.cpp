// Decode steps over a paged FP8 cache: reserve the new tokens' cells, plan attention once per
// step, then per layer store K/V and run attention. Random numbers stand in for the model.
#include <kvcore/kvcore.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  using namespace kvcore;
  const Device dev = cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
  constexpr int32_t kLayers = 4, kQHeads = 32, kKvHeads = 8, kDim = 128;

  PagedCacheConfig cfg;
  cfg.n_layers = kLayers;
  cfg.n_kv_heads = kKvHeads;
  cfg.head_dim = cfg.v_head_dim = kDim;
  cfg.block_size = 16;
  cfg.num_blocks = 64;
  cfg.k_format = cfg.v_format = KvFormat::Fp8;  // e4m3 + one UE8M0 scale per 64 dims, K and V
  cfg.rope = {RopeSpec::llama3_8b()};
  cfg.rope_mode = RopeMode::RopeOnRead;  // K stored unrotated: a shift moves no K or V byte
  PagedCache cache(cfg, dev);            // refuses formats and head dims attention cannot read

  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto rows = [&](int64_t n, int64_t heads) {  // f32 [n, heads, kDim] on the device
    std::vector<float> h(static_cast<size_t>(n * heads * kDim));
    for (float& x : h) x = nd(rng);
    return Buffer::from_host(h, dev);
  };
  auto view = [&](const Buffer& b, int64_t n, int64_t heads) {
    return TensorRef(b.data(), DType::F32, dev, {n, heads, kDim});
  };

  // The prompt: 100 tokens at positions 0..99, every layer stored.
  const SeqId seq = cache.create();
  std::vector<int32_t> prompt(100);
  for (int32_t i = 0; i < 100; ++i) prompt[i] = i;
  const AppendTicket pt = cache.reserve(seq, prompt);
  for (int32_t l = 0; l < kLayers; ++l) {
    const Buffer k = rows(100, kKvHeads), v = rows(100, kKvHeads);
    cache.store(pt, l, view(k, 100, kKvHeads), view(v, 100, kKvHeads));  // quantize + place
  }

  Buffer tables;  // this batch's block tables, owned here (a second batch in flight keeps its own)
  Buffer out(size_t{kQHeads} * kDim * 4, dev);
  AttentionLayer layer;  // what the model fixes per layer:
  layer.softmax_scale = 0.0f;  // 0: head_dim^-0.5
  layer.window = 0;            // no sliding window; maybe_sinks empty: no sink logits
  for (int step = 0; step < 3; ++step) {
    const int32_t pos = cache.info(seq).last_position + 1;
    const AppendTicket t = cache.reserve(seq, {&pos, 1});  // the new token's cell in every layer
    AttentionStep st;  // what every layer of the step shares
    st.table = cache.block_tables({&seq, 1}, tables, PagedPositions::Offsets);
    st.q_positions = t.position_view();  // rope on read: attention rotates the query there
    AttentionSchedule sched;  // automatic split-K, tables checked once, a workspace of its own
    const AttentionPlan plan = AttentionPlan::decode(cache.paged_kv(0), kQHeads, st, sched);
    for (int32_t l = 0; l < kLayers; ++l) {
      const Buffer k = rows(1, kKvHeads), v = rows(1, kKvHeads), q = rows(1, kQHeads);  // q unrotated, like K
      cache.store(t, l, view(k, 1, kKvHeads), view(v, 1, kKvHeads));
      plan.run(view(q, 1, kQHeads), cache.paged_kv(l), view(out, 1, kQHeads), layer);
    }
  }
  const SeqId draft = cache.fork(seq);  // shares every block; copy on write
  cache.truncate(draft, 101);           // speculative rollback
  cache.shift(seq, /*n_keep=*/4, /*n_discard=*/50);  // context shift: metadata only in rope-on-read

  const std::vector<float> o = out.to_host<float>();
  double sum = 0;
  for (float x : o) sum += std::isfinite(x) ? std::abs(x) : INFINITY;
  std::printf("decode_step on %s: %d tokens live after the shift, last output's mean |x| %.4f\n", dev.str().c_str(),
              cache.info(seq).n_live, sum / o.size());
  return std::isfinite(sum) && sum > 0 ? 0 : 1;
}
