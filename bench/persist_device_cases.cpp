// `kvcore bench persist --device cuda`: the device and pinned-host tiers on a Llama-3-8B-shaped
// f16 cache (32 layers, 8 kv heads, 128 dims, blocks of 16; 8192 tokens = 1 GiB of K/V),
// each against a baseline measured in the same run on the same bytes:
//   offload_d2h     BlockOffloader::offload of the sequence, until its copy into pinned memory
//                   completed, vs one plain cudaMemcpyAsync of as many bytes device -> pinned
//                   (contiguous: the PCIe ceiling);
//   load_h2d        BlockOffloader::load from pinned memory into fresh blocks, until the copy
//                   completed, vs cudaMemcpyAsync pinned -> device of as many bytes;
//   prefix_device   serving the cached 8k-token prefix from device blocks (PrefixCache::create:
//                   a fork, no copy) vs recomputing it (the prefill attention of the same 8192
//                   tokens in all 32 layers, 32 q heads: a lower bound of a recompute, which
//                   also needs the projections and MLPs);
//   prefix_pinned   serving it from pinned memory (load_h2d's time) vs the same recompute.
// Times are host wall clock from the call to the end of its device work (synchronized), the
// median of the repetitions.
#include "bench/persist_device_cases.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/persist/block_offload.hpp"
#include "kvcore/persist/prefix_cache.hpp"
#include "kvcore/runtime.hpp"
#if KVCORE_WITH_CUDA
#include "persist/async_copy.hpp"
#endif

namespace kvcore::cli {

#if KVCORE_WITH_CUDA
namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Timing timing_of(std::vector<double> secs) {
  std::sort(secs.begin(), secs.end());
  Timing t;
  t.reps = static_cast<int>(secs.size());
  t.median_us = secs[secs.size() / 2] * 1e6;
  t.min_us = secs[0] * 1e6;
  return t;
}

PagedCacheConfig llama8b_f16(int32_t tokens) {
  PagedCacheConfig c;
  c.n_layers = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.v_head_dim = 128;
  c.block_size = 16;
  c.num_blocks = 2 * (tokens / 16) + 8;  // the sequence and one loaded copy of it
  c.rope = {RopeSpec::llama3_8b()};
  c.rope_mode = RopeMode::RopeOnRead;
  return c;
}

// Appends `tokens` tokens of random finite f16 K/V to `seq`, 512 at a time.
void fill(PagedCache& c, SeqId seq, int32_t tokens) {
  const PagedCacheConfig& cfg = c.config();
  const int32_t chunk = std::min(512, tokens);
  const size_t n = static_cast<size_t>(cfg.n_layers) * chunk * cfg.n_kv_heads * cfg.head_dim;
  std::vector<uint16_t> h(n);
  Buffer k(n * 2, c.device()), v(n * 2, c.device());
  uint64_t x = 0x9e3779b97f4a7c15ull;
  std::vector<int32_t> pos(chunk);
  for (int32_t at = 0; at < tokens; at += chunk) {
    for (auto& b : h) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b = static_cast<uint16_t>(x) & 0xBBFF;  // finite
    }
    k.copy_from_host(h.data(), n * 2);
    std::reverse(h.begin(), h.end());
    v.copy_from_host(h.data(), n * 2);
    std::iota(pos.begin(), pos.end(), at);
    const int64_t shape[4] = {cfg.n_layers, chunk, cfg.n_kv_heads, cfg.head_dim};
    c.append(seq, pos, TensorRef(k.data(), DType::F16, c.device(), {shape[0], shape[1], shape[2], shape[3]}),
             TensorRef(v.data(), DType::F16, c.device(), {shape[0], shape[1], shape[2], shape[3]}));
  }
  synchronize(c.device(), cfg.stream);
}

void report(BenchOptions& opt, const std::string& name, double bytes, const std::vector<double>& t,
            const std::string& base, const std::vector<double>& base_t) {
  BenchRecord r;
  r.bench = "persist";
  r.case_name = name;
  r.bytes = bytes;
  r.t = timing_of(t);
  r.traffic = Traffic::Copy;
  r.baseline = base;
  r.baseline_t = timing_of(base_t);
  if (opt.wants(r.case_name)) opt.report(r);
}

}  // namespace

void persist_device_cases(BenchOptions& opt) {
  const Device d = opt.device;
  const int32_t tokens = opt.quick ? 1024 : 8192;
  const int reps = std::max(1, std::min(opt.reps, opt.quick ? 2 : 7));
  const PagedCacheConfig cfg = llama8b_f16(tokens);
  PagedCache cache(cfg, d);
  PrefixCache prefix(cache, 1);
  std::vector<int32_t> prompt(tokens + 1);
  std::iota(prompt.begin(), prompt.end(), 100);
  const SeqId seq = prefix.create(std::span<const int32_t>(prompt.data(), tokens), "bench");
  fill(cache, seq, tokens);
  const double bytes = static_cast<double>(cache.stats().bytes_per_block) * (tokens / cfg.block_size);
  const std::string size = "llama8b_f16_" + std::to_string(tokens) + "tok";
  opt.note("persist device: " + size + ", " + std::to_string(bytes / (1 << 20)) + " MiB of K/V");

  // The PCIe ceiling: one contiguous copy each way between device memory and pinned memory.
  std::vector<double> d2h_plain, h2d_plain;
  {
    Buffer dev(static_cast<size_t>(bytes), d);
    void* pinned = persist::gpu::pinned_alloc(static_cast<size_t>(bytes));
    for (int r = 0; r < reps + 1; ++r) {
      const double a = seconds_of([&] { copy_bytes(pinned, Device::cpu(), dev.data(), d, static_cast<size_t>(bytes)); });
      const double b = seconds_of([&] { copy_bytes(dev.data(), d, pinned, Device::cpu(), static_cast<size_t>(bytes)); });
      if (r > 0) d2h_plain.push_back(a), h2d_plain.push_back(b);  // the first is a warm-up
    }
    persist::gpu::pinned_free(pinned);
  }

  // The offload tier: every repetition offloads under a new key (the previous value is evicted).
  std::vector<double> offload_s, load_s;
  {
    OffloadConfig oc;
    oc.pinned_bytes = static_cast<int64_t>(bytes) + (int64_t{64} << 20);
    oc.model_id = "llama-3-8b";
    BlockOffloader off(cache, oc);
    StoreKey key;
    for (int r = 0; r < reps + 1; ++r) {
      key = store_key_for_tokens(std::span<const int32_t>(prompt.data(), 16), "rep" + std::to_string(r), cfg);
      const double t = seconds_of([&] {
        require(off.offload(seq, key), ErrorCode::OutOfMemory, "bench persist: offload refused");
        synchronize(d, off.copy_stream());
      });
      off.poll();
      if (r > 0) offload_s.push_back(t);
    }
    for (int r = 0; r < reps + 1; ++r) {
      SeqId got = 0;
      const double t = seconds_of([&] {
        got = off.load(key, cfg.stream).value();
        synchronize(d, cfg.stream);
      });
      cache.erase(got);
      if (r > 0) load_s.push_back(t);
    }
  }
  report(opt, "offload_d2h/" + size, bytes, offload_s, "cudaMemcpyAsync_d2h_pinned", d2h_plain);
  report(opt, "load_h2d/" + size, bytes, load_s, "cudaMemcpyAsync_h2d_pinned", h2d_plain);

  // Prefix reuse: published prefix served from device blocks; the recompute baseline.
  prefix.publish(seq, std::span<const int32_t>(prompt.data(), tokens), "bench");
  std::vector<double> device_s;
  for (int r = 0; r < reps + 1; ++r) {
    int32_t reused = 0;
    SeqId got = 0;
    const double t = seconds_of([&] {
      got = prefix.create(prompt, "bench", &reused);
      synchronize(d, cfg.stream);
    });
    require(reused == tokens, ErrorCode::InvalidArgument, "bench persist: the prefix was not reused (", reused, " tokens)");
    prefix.erase(got);
    if (r > 0) device_s.push_back(t);
  }
  std::vector<double> recompute_s;
  {
    const SeqId one[1] = {seq};
    AttentionStep step;
    step.table = cache.block_tables(one);
    std::vector<int32_t> qpos(tokens), qo{0, tokens};
    std::iota(qpos.begin(), qpos.end(), 0);
    Buffer bqpos = Buffer::from_host(qpos, d), bqo = Buffer::from_host(qo, d);
    step.q_positions = TensorRef(bqpos.data(), DType::I32, d, {tokens});
    step.qo_indptr = TensorRef(bqo.data(), DType::I32, d, {2});
    const int64_t q_bytes = int64_t{tokens} * 32 * 128 * 2;
    Buffer q(static_cast<size_t>(q_bytes), d), out(static_cast<size_t>(q_bytes), d);
    fill_bytes(q.data(), d, 0x21, static_cast<size_t>(q_bytes));
    const TensorRef qt(q.data(), DType::F16, d, {tokens, 32, 128}), ot(out.data(), DType::F16, d, {tokens, 32, 128});
    AttentionSchedule sc;
    sc.stream = cfg.stream;
    const AttentionPlan plan = AttentionPlan::prefill(cache.paged_kv(0), 32, step, sc);
    for (int r = 0; r < reps + 1; ++r) {
      const double t = seconds_of([&] {
        for (int32_t l = 0; l < cfg.n_layers; ++l) plan.run(qt, cache.paged_kv(l), ot, {}, cfg.stream);
        synchronize(d, cfg.stream);
      });
      if (r > 0) recompute_s.push_back(t);
    }
  }
  report(opt, "prefix_device/" + size, bytes, device_s, "recompute_prefill_attention_32_layers", recompute_s);
  report(opt, "prefix_pinned/" + size, bytes, load_s, "recompute_prefill_attention_32_layers", recompute_s);
}
#else
void persist_device_cases(BenchOptions&) {
  require(false, ErrorCode::NotSupported, "bench persist --device cuda: this build has no CUDA backend");
}
#endif

}  // namespace kvcore::cli
