// The warp-specialized wgmma prefill kernel (FlashAttention-3's producer / consumer split, with
// cp.async instead of TMA since a tile gathers 64 keys from 16-token pages): warps 0-7 are the
// two consumer warpgroups of prefill_wgmma.cuh (same rows, heads, tiles and math), warps 8-11
// the producers (they share the copies, one sub-partition each; warp 8 also prepares and
// publishes). The register file is split per SM sub-partition, so a CTA of 9 warps would cap
// every thread at 168 registers like one of 12 anyway: the producer warpgroup gives registers
// back (setmaxnreg: 72 a thread, what its copies and address math take without spills) and the
// consumers take 216. Per stage two mbarriers:
//   full[s]  (32 arrivals: warp 8's lanes) - tile landed and prepared (positions, summary,
//            dead V rows zeroed, fence.proxy.async done by every producer thread, then a
//            producer-only named barrier);
//   empty[s] (one arrival per consumer warp of a warpgroup that has rows) - every wgmma reading
//            the stage completed (released once the tile's P V, issued in the next step, was
//            waited for).
// The producer copies tile i into stage i % 4 once empty released tile i - 4, then publishes
// tile i - 2 (its copies waited for: three tiles in flight). The warpgroups never wait for each
// other, so one's softmax runs while the other's wgmma does; within a warpgroup the softmax of
// tile i overlaps the P V of tile i - 1 (pipelined_tile, prefill_wgmma.cuh).
#pragma once
#include "cuda/attention/prefill_wgmma.cuh"

namespace kvcore::ops::cuda::prefill_wgmma {

constexpr int kWsThreads = kConsumerThreads + 128;  // + the producer warpgroup
constexpr int kProducerRegs = 72, kConsumerRegs = 216;  // 128 * (72 + 2 * 216) <= 65536; no spills either side
constexpr int kPublishLag = 2;                     // tiles issued before the oldest is published

// The warp-specialized kernels' shared memory (1024-byte aligned base): the stages (K tile, V
// tile), their metadata, and two mbarriers a stage, full and empty (this file's header).
template <int HD>
struct WsSmem {
  unsigned char* base;
  uint32_t bars;  // shared-memory address of the mbarriers
  __device__ __forceinline__ explicit WsSmem(unsigned char* b) : base(b), bars(smem_addr(b + Shape<HD>::kBarOffset)) {}
  __device__ __forceinline__ unsigned char* stage(int s) const { return base + s * Shape<HD>::kStageBytes; }
  __device__ __forceinline__ int* meta(int s) const {
    return reinterpret_cast<int*>(base + Shape<HD>::kMetaOffset) + s * Shape<HD>::kMetaInts;
  }
  __device__ __forceinline__ uint32_t full(int s) const { return bars + 8u * s; }
  __device__ __forceinline__ uint32_t empty(int s) const { return bars + 8u * (kStages + s); }
};

#if KVCORE_WGMMA_ARCH
// Named barriers of the consumers' turns (PingPongTurn, below): 2, 3 (0: __syncthreads, 1: the
// producer warpgroup's).
constexpr int kTurnBarrier = 2;

// A consumer warp of the warp-specialized kernels (warps 0-7): its lane's fragment coordinates
// (g, t), its head (hw of the CTA's heads) and rows (r0 .. r0 + 15 of the CTA's), its warpgroup,
// whether the warpgroups take turns (PingPongTurn, below: both have rows and there are tiles; the
// first turn opened by warpgroup 1 here). A warpgroup without rows (has_rows false) returns.
struct ConsumerWarp {
  int g, t, hw, r0, group, head;
  bool has_rows, active, turns;
  __device__ __forceinline__ ConsumerWarp(const Cta& ct, int warp, int lane, bool ping_pong)
      : g(lane / 4), t(lane % 4), hw(warp % kHeads), r0(16 * (warp / kHeads)), group(warp / kHeads) {
    has_rows = r0 < ct.n_r;
    active = hw < ct.n_h;  // warp-uniform: its head exists
    head = ct.h0 + (active ? hw : 0);
    turns = ping_pong && ct.n_r > 16 && ct.n_tiles > 0;
    if (has_rows && turns && group == 1) asm volatile("bar.arrive %0, 256;\n" ::"r"(kTurnBarrier) : "memory");
  }
};

// FlashAttention-3's ping-pong between the two consumer warpgroups: each issues a step's wgmmas
// only in its turn, and the turns alternate (0, 1, 0, 1, ...), so the tensor cores run one
// warpgroup's S and P V while the other runs its softmax. Named barrier kTurnBarrier + g is
// warpgroup g's turn: it syncs there (128 threads) before issuing and the other warpgroup's
// arrival after its own issue (128 more) opens it. Warpgroup 1 arrives once before its first
// step (warpgroup 0 goes first) and not after its last (each barrier gets as many arrivals as
// syncs, none left over at exit). On only where both warpgroups have rows and tiles (CTA-uniform).
struct PingPongTurn {
  bool on;    // both warpgroups take turns
  int group;  // this warpgroup
  bool pass;  // opens the other warpgroup's next turn (all but warpgroup 1's last step)
  __device__ __forceinline__ void begin() const {
    if (on) asm volatile("bar.sync %0, 256;\n" ::"r"(kTurnBarrier + group) : "memory");
  }
  __device__ __forceinline__ void end() const {
    if (on && pass) asm volatile("bar.arrive %0, 256;\n" ::"r"(kTurnBarrier + (group ^ 1)) : "memory");
  }
};

// The consumer warpgroups of the warp-specialized kernels (warps 0-7): each stage waited for on
// full, read, and released on empty once its P V completed; then the rows normalized and stored.
// kPingPong: the warpgroups issue their wgmmas in turns (PingPongTurn).
template <int HD, bool BF16, bool kPingPong = false>
__device__ __forceinline__ void consume_tiles(const PagedAttentionParams& p, const Cta& ct, const WsSmem<HD>& m, int warp,
                                              int lane) {
  using S = Shape<HD>;
  wgmma::regs_inc<kConsumerRegs>();
  const ConsumerWarp cw(ct, warp, lane, kPingPong);
  if (!cw.has_rows) return;  // not counted in the empty barriers
  const int g = cw.g, t = cw.t, r0 = cw.r0, group = cw.group, head = cw.head;
  const bool turns = cw.turns, active = cw.active;
  Rows<HD> w;
  init_rows<HD>(p, ct, r0, active, head, g, t, w);
  const float sl2 = p.softmax_scale * math::kLog2e;
  auto release = [&](int s) {
    __syncwarp();  // the warp's reads of the stage (metadata) done
    if (lane == 0) wgmma::mbar_arrive(m.empty(s));
  };
  Pipeline<HD> pl;
  int prev = 0;  // stage of the tile whose P is in pl.pa
  for (int i = 0; i < ct.n_tiles; ++i) {
    const int s = i % kStages;
    wgmma::mbar_wait(m.full(s), (i / kStages) & 1);
    pipelined_tile<HD, BF16>(
        p, w, pl, smem_addr(m.stage(s)), smem_addr(m.stage(prev)) + S::kTileBytes, m.meta(s), sl2, t,
        [&] {
          if (i > 0) release(prev);
        },
        PingPongTurn{turns, group, group == 0 || i + 1 < ct.n_tiles});
    prev = s;
  }
  pipelined_finish<HD, BF16>(w, pl, smem_addr(m.stage(prev)) + S::kTileBytes, ct.n_tiles > 0);
  if (ct.n_tiles > 0) release(prev);
  if (active) store_rows<HD>(p, ct, w, r0, head, g, t);
}
#endif

template <int HD, bool BF16>
__global__ void __launch_bounds__(kWsThreads, 1) prefill_wgmma_ws_kernel(const PagedAttentionParams p, int chunk_heads) {
#if KVCORE_WGMMA_ARCH
  using S = Shape<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  Cta ct;
  if (!make_cta(p, chunk_heads, ct)) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const WsSmem<HD> m(smem);
  auto stage_of = [&](int s) { return smem + s * S::kStageBytes; };
  auto meta_of = [&](int s) { return reinterpret_cast<int*>(smem + S::kMetaOffset) + s * S::kMetaInts; };
  const uint32_t bars = smem_addr(smem + S::kBarOffset);
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (kStages + s); };
  const int live_groups = (ct.n_r + 15) / 16;  // warpgroups with rows (n_r <= 32)
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) {
      wgmma::mbar_init(full_bar(s), 32);
      wgmma::mbar_init(empty_bar(s), 4 * live_groups);
    }
  __syncthreads();  // the barriers initialized before anyone uses them

  if (warp >= 4 * kGroups) {
    // ---- producer warpgroup: its 4 warps copy (a quarter of the chunks each, so no SM
    // sub-partition issues all the copies), warp 8 prepares and publishes
    wgmma::regs_dec<kProducerRegs>();
    const int pt = tid - kConsumerThreads;              // 0 .. 127
    constexpr int kItems = kKeys * S::kChunks / 128;    // 16-byte chunks of K (and of V) per thread per tile
    int blk = -1;  // block id of key pt (pt < 64) of the next tile to copy, loaded a tile ahead
    auto load_block = [&](int i) { blk = pt < kKeys && i < ct.n_tiles ? block_of(ct, i * kKeys + pt) : -1; };
    auto producers_sync = [] { asm volatile("bar.sync 1, 128;\n" ::: "memory"); };  // the producer warpgroup only
    auto publish = [&](int j) {
      wgmma::fence_proxy_async();  // this thread's landed copies, before wgmma reads them
      producers_sync();            // every producer thread's copies of tile j landed
      if (warp == 4 * kGroups) {
        prepare_tile<HD>(p, ct, stage_of(j % kStages), meta_of(j % kStages), lane);
        wgmma::mbar_arrive(full_bar(j % kStages));
      }
    };
    load_block(0);
    for (int i = 0; i < ct.n_tiles; ++i) {
      const int s = i % kStages;
      // Stage s is free once the consumers released tile i - 4 (which also means warp 8 has
      // prepared and published it: nobody reads its metadata any more).
      if (i >= kStages) wgmma::mbar_wait(empty_bar(s), (i / kStages - 1) & 1);
      unsigned char* st = stage_of(s);
      int* meta = meta_of(s);
      if (pt < kKeys) copy_key_meta(p, meta, pt, cell_of(ct, blk, i * kKeys + pt));
      producers_sync();  // cells stored before the threads read them
#pragma unroll
      for (int it = 0; it < kItems; ++it) {
        const int r = pt / S::kChunks + it * (128 / S::kChunks), c = pt % S::kChunks;
        copy_key_chunk<HD>(p, ct, st, r, c, meta[r]);
      }
      cp_async_commit();
      load_block(i + 1);
      if (i >= kPublishLag) {
        cp_async_wait<kPublishLag>();  // this thread's copies of tile i - 2
        publish(i - kPublishLag);
      }
    }
    cp_async_wait<0>();
    for (int j = ct.n_tiles - kPublishLag < 0 ? 0 : ct.n_tiles - kPublishLag; j < ct.n_tiles; ++j) publish(j);
    return;
  }

  consume_tiles<HD, BF16>(p, ct, m, warp, lane);  // ---- consumer warpgroups
#else
  (void)p;
  (void)chunk_heads;
  __trap();  // built for sm_90a only; the launcher checks the device
#endif
}

}  // namespace kvcore::ops::cuda::prefill_wgmma
