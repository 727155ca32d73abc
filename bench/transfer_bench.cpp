// `kvcore bench transfer`: KV transfer of one Llama-3-8B sequence (32 layers, 8 kv heads, 128
// dims, blocks of 16) of 1k and 32k tokens, f16 and FP8, from a PagedCache to another.
//   pack / unpack   the packed mode's device gather / scatter of every block of every layer
//                   (64 MiB chunks, as the transfer cuts them) vs cudaMemcpy of one flat buffer
//                   of the same size on the device (one GPU)
//   loopback_*      the whole protocol between two caches on one GPU (loopback transport;
//                   every byte also crosses a device copy), packed; in place at 1k only
//   nccl_*          the whole protocol from GPU 0 to GPU 1 over NCCL (two threads, one process),
//                   packed and in place, vs an NCCL send/recv of one flat buffer of the payload's
//                   size on the same communicator; cudaMemcpyPeer of the same size on its own row
// GPU 1 is needed for the nccl rows; with one GPU the bench says so and runs the rest.
// Latency = median wall time of a whole transfer (header, manifest, reply, payload, commit,
// acknowledgement); GB/s = payload bytes / that. Every configuration is checked bit for bit
// before it is timed.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness.hpp"
#include "cache/paged_export.hpp"
#include "kvcore/kvcore.hpp"
#include "kvcore/transfer/loopback.hpp"
#include "kvcore/transfer/nccl_transport.hpp"
#include "kvcore/transfer/transfer.hpp"
#include "tools/registry.hpp"
#include "transfer/block_copy.hpp"
#include "transfer/paged_chunks.hpp"
#if KVCORE_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using namespace kvcore;
using Clock = std::chrono::steady_clock;

PagedCacheConfig llama8b(int32_t tokens, bool fp8) {
  PagedCacheConfig c;
  c.n_layers = 32;
  c.n_kv_heads = 8;
  c.head_dim = c.v_head_dim = 128;
  c.block_size = 16;
  c.num_blocks = tokens / 16 + 4;
  c.k_format = c.v_format = fp8 ? KvFormat::Fp8 : KvFormat::F16;
  c.rope = {RopeSpec::llama3_8b()};
  c.rope_mode = RopeMode::RopeOnRead;
  return c;
}

// One sequence of `tokens` random tokens in every layer (uniform in [-2, 2): xorshift, cheap
// enough for 32k tokens x 1024 values).
SeqId fill(PagedCache& c, int32_t tokens, uint64_t seed) {
  const int64_t row = int64_t{8} * 128;
  std::vector<float> h(static_cast<size_t>(tokens * row));
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& v : h) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(x >> 40) * (4.0f / 16777216.0f) - 2.0f;
  }
  const Buffer k = Buffer::from_host(h, c.device());
  std::reverse(h.begin(), h.end());
  const Buffer v = Buffer::from_host(h, c.device());
  std::vector<int32_t> pos(static_cast<size_t>(tokens));
  for (int32_t i = 0; i < tokens; ++i) pos[i] = i;
  const SeqId s = c.create();
  const AppendTicket t = c.reserve(s, pos);
  for (int32_t l = 0; l < c.config().n_layers; ++l)
    c.store(t, l, TensorRef(k.data(), DType::F32, c.device(), {tokens, 8, 128}),
            TensorRef(v.data(), DType::F32, c.device(), {tokens, 8, 128}));
  synchronize(c.device(), c.config().stream);
  return s;
}

cli::Timing timing_of(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[0], static_cast<int>(us.size())};
}

// Wall time of `reps` calls after `warmup`, each preceded by `reset` (untimed).
cli::Timing wall(int reps, int warmup, const std::function<void()>& f, const std::function<void()>& reset = {}) {
  std::vector<double> us;
  for (int i = 0; i < warmup + reps; ++i) {
    if (reset) reset();
    const auto t0 = Clock::now();
    f();
    const double d = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i >= warmup) us.push_back(d);
  }
  return timing_of(us);
}

// Both ends of a transfer on two threads; rethrows the first failure.
void both(const std::function<void()>& send, const std::function<void()>& receive) {
  std::exception_ptr es, er;
  std::thread t([&] {
    try {
      send();
    } catch (...) {
      es = std::current_exception();
    }
  });
  try {
    receive();
  } catch (...) {
    er = std::current_exception();
  }
  t.join();
  if (er) std::rethrow_exception(er);
  if (es) std::rethrow_exception(es);
}

bool same_bytes(PagedCache& a, SeqId sa, PagedCache& b, SeqId sb) {
  const PagedExport x = paged_export(a, {&sa, 1}), y = paged_export(b, {&sb, 1});
  return x.payload == y.payload && x.positions == y.positions && x.valid == y.valid;
}

TransferOptions opts(TransferPacking p, TransferBuffers* buffers) {
  TransferOptions o;
  o.maybe_buffers = buffers;  // kept between calls: the timed transfers allocate nothing
  o.model_id = "llama-3-8b";
  o.packing = p;
  o.ops_per_group = 1024;
  return o;
}

// The whole protocol from `src` to `dst` over `a` -> `b`, checked once, then timed.
void time_transfer(cli::BenchOptions& opt, const std::string& name, PagedCache& src, SeqId seq, PagedCache& dst,
                   Transport& a, Transport& b, TransferPacking p, int reps, const std::string& baseline,
                   const std::optional<cli::Timing>& base_t) {
  if (!opt.wants(name)) return;
  std::vector<SeqId> got;
  TransferBuffers sb, rb;
  auto run = [&] {
    both([&] { transfer_send(src, {&seq, 1}, a, opts(p, &sb)); }, [&] { got = transfer_receive(dst, b, opts(p, &rb)).ids; });
  };
  auto reset = [&] {
    for (SeqId s : got) dst.erase(s);
    got.clear();
  };
  cli::Timing t;
  try {  // a failing mode is reported and the other rows still run
    run();
    require(same_bytes(src, seq, dst, got[0]), ErrorCode::DeviceError, "received bytes differ");
    reset();
    t = wall(reps, 1, run, reset);
    reset();
  } catch (const std::exception& e) {
    opt.note("transfer: " + name + " failed: " + e.what());
    return;
  }
  const double bytes = static_cast<double>(paged_export_plan(src, {&seq, 1}).manifest.payload_bytes());
  opt.report({"transfer", name, bytes, t, cli::Traffic::Copy, baseline, base_t});
}

}  // namespace
#endif

KVCORE_BENCH(transfer, "KV transfer of Llama-3-8B sequences: pack/unpack, loopback, NCCL vs cudaMemcpyPeer and flat NCCL (GPU)") {
#if !KVCORE_WITH_CUDA
  opt.note("transfer: this build has no CUDA backend; the transfer bench runs on GPUs only");
#else
  if (!opt.device.is_cuda()) {
    opt.note("transfer: needs --device cuda (the CPU path is covered by the tests)");
    return;
  }
  const int gpus = cuda_device_count();
  const bool two = gpus >= 2 && nccl_compiled();
  if (!two)
    opt.note("transfer: " + std::to_string(gpus) + " GPU(s)" + (nccl_compiled() ? "" : ", no NCCL in this build") +
             ": the 2-GPU rows (nccl_*, memcpy_peer) need 2 GPUs and NCCL; running pack/unpack and loopback only");
  const Device g0 = Device::cuda(0), g1 = Device::cuda(two ? 1 : 0);
  std::unique_ptr<NcclTransport> n0, n1;
  if (two) {
    NcclTransportOptions to;
    to.timeout_s = 120;
    auto p = NcclTransport::connect_local(g0, g1, to);
    n0 = std::move(p.first);
    n1 = std::move(p.second);
    int can = 0;
    cudaDeviceCanAccessPeer(&can, 0, 1);
    if (can) {
      cudaSetDevice(0);
      cudaDeviceEnablePeerAccess(1, 0);
      cudaSetDevice(1);
      cudaDeviceEnablePeerAccess(0, 0);
      cudaGetLastError();
    }
  }
  for (int32_t tokens : {1024, 32768}) {
    if (opt.quick && tokens > 1024) continue;
    for (bool fp8 : {false, true}) {
      const std::string tag = std::string(tokens == 1024 ? "1k" : "32k") + (fp8 ? "_fp8" : "_f16");
      const int reps = tokens > 1024 ? std::min(opt.reps, 5) : opt.reps;
      xfer::use_device(g0);
      PagedCache src(llama8b(tokens, fp8), g0);
      const SeqId seq = fill(src, tokens, 7 + tokens);
      const PagedExportPlan plan = paged_export_plan(src, {&seq, 1});
      const uint64_t payload = static_cast<uint64_t>(plan.manifest.payload_bytes());
      opt.note("transfer " + tag + ": payload " + std::to_string(payload / 1e6) + " MB, " +
               std::to_string(plan.manifest.n_blocks) + " blocks x " + std::to_string(plan.manifest.array_block_bytes.size()) +
               " arrays");

      // pack / unpack on GPU 0 against a flat device copy of the same size.
      {
        const std::vector<PagedPoolArray> arrays = paged_pool_arrays(src);
        const std::vector<xfer::PagedChunk> chunks =
            xfer::paged_chunks(plan.manifest.array_block_bytes, plan.manifest.n_blocks, size_t{64} << 20);
        const Buffer blocks = Buffer::from_host(plan.cache_blocks, g0);
        Buffer staging(payload, g0), flat(payload, g0);
        auto move_all = [&](bool gather) {
          uint64_t at = 0;
          for (const xfer::PagedChunk& c : chunks) {
            for (const xfer::PagedSegment& s : c.segments) {
              const PagedPoolArray& a = arrays[static_cast<size_t>(s.array)];
              const xfer::BlockCopy bc{a.base, a.block_bytes, blocks.as<int32_t>() + s.first, s.n,
                                           staging.as<uint8_t>() + at + s.offset};
              if (gather) xfer::gather_blocks(bc, g0, {});
              else xfer::scatter_blocks(bc, g0, {});
            }
            at += c.bytes;
          }
        };
        move_all(true);  // checked against the host export's payload
        require(staging.to_host<uint8_t>() == paged_export(src, {&seq, 1}).payload, ErrorCode::DeviceError,
                "bench transfer: packed bytes differ from the export");
        const cli::Timing base = cli::time_cuda(0, opt.reps, opt.warmup, [&](int) {
          copy_bytes(flat.data(), g0, staging.data(), g0, payload);
        });
        const double rw = 2.0 * static_cast<double>(payload);
        if (opt.wants("pack_" + tag))
          opt.report({"transfer", "pack_" + tag, rw, cli::time_cuda(0, opt.reps, opt.warmup, [&](int) { move_all(true); }),
                      cli::Traffic::Copy, "memcpy_d2d", base});
        if (opt.wants("unpack_" + tag))  // scatters the gathered bytes back where they came from
          opt.report({"transfer", "unpack_" + tag, rw,
                      cli::time_cuda(0, opt.reps, opt.warmup, [&](int) { move_all(false); }), cli::Traffic::Copy, "memcpy_d2d",
                      base});
      }
      // The whole protocol between two caches on GPU 0 (loopback).
      {
        PagedCache dst(llama8b(tokens, fp8), g0);
        auto [a, b] = LoopbackTransport::pair(g0, 120000);
        // In place over the loopback is one synchronous device copy per block and array (over
        // 100,000 at 32k): it measures the loopback, not the protocol, so only at 1k.
        for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace})
          if (p == TransferPacking::Packed || tokens == 1024)
            time_transfer(opt, std::string("loopback_") + (p == TransferPacking::Packed ? "packed_" : "inplace_") + tag, src,
                          seq, dst, *a, *b, p, reps, "", std::nullopt);
      }
      if (!two) continue;
      xfer::use_device(g1);
      PagedCache dst(llama8b(tokens, fp8), g1);
      // Baselines: one flat buffer of the payload's size, GPU 0 -> GPU 1.
      Buffer from(payload, g0), to(payload, g1);
      const cli::Timing flat = wall(reps, 1, [&] {
        both([&] { n0->wait(n0->post(std::vector<TransferOp>{TransferOp::send(from.data(), payload)})); },
             [&] { n1->wait(n1->post(std::vector<TransferOp>{TransferOp::recv(to.data(), payload)})); });
      });
      const cli::Timing peer = wall(reps, 1, [&] {
        cudaMemcpyPeer(to.data(), 1, from.data(), 0, payload);
      });
      opt.report({"transfer", "memcpy_peer_" + tag, static_cast<double>(payload), peer, cli::Traffic::Copy, "nccl_flat", flat});
      for (TransferPacking p : {TransferPacking::Packed, TransferPacking::InPlace})
        time_transfer(opt, std::string("nccl_") + (p == TransferPacking::Packed ? "packed_" : "inplace_") + tag, src, seq, dst,
                      *n0, *n1, p, reps, "nccl_flat", flat);
    }
  }
#endif
}
