// The warp-specialized wgmma prefill kernel with the Tensor Memory Accelerator as its copier
// (kernel variant 7): the consumers are prefill_wgmma_ws.cuh's (consume_tiles); the producer
// warpgroup copies a tile's K and V a page at a time with one TMA box each (64 dims x the page's
// cells, landed 128-byte swizzled in the wgmma tile layout) instead of one cp.async a 16-byte
// chunk, so the producer's instructions, which share the SM's issue slots with the consumers,
// no longer grow with the tile's bytes. Serves pages of a power-of-two size >= 8 cells (a box
// is min(page, 64) cells, whole swizzle atoms of 8 lines at a line offset that is a multiple of
// 8); the launcher takes variant 5 elsewhere.
// Per stage, besides full and empty (prefill_wgmma_ws.cuh), a third mbarrier, landed: one
// arrival (thread 0 of the producers, expecting the bytes of every box the tile issues) plus the
// boxes' bytes. Tile i: the producers wait for empty (tile i - 4 released), then
//  - threads 0-63 copy key pt's metadata (cell, position, valid word) by cp.async, as variant 5;
//  - the thread of each box's first key (pt a multiple of the box's cells) issues its K and V
//    boxes, HD / 64 of each, where that key lies inside the sequence;
// and two tiles later warp 8 publishes it: landed waited for, then prepare_tile zeroes the V rows
// of dead cells and of keys past the sequence (a box lands whole pages, stale cells included)
// before full's arrival.
#pragma once
#include <cuda.h>

#include "cuda/attention/prefill_wgmma_ws.cuh"
#include "cuda/common/tma.cuh"

namespace kvcore::ops::cuda::prefill_wgmma {

// The TMA copies of a tile of KEYS keys (here and in prefill_wgmma_wide.cuh): a box is box_cells
// cells (a page, or the tile when pages are larger) x 64 dims, HD / 64 boxes a row, K's and V's.
// tile_box_bytes: the bytes tile i's boxes land (every box whose first key lies inside the
// sequence), to expect on its mbarrier. issue_key_boxes: key `key` (cell `cell`) of the tile
// issues its K and V boxes into the stage at `stage` (V a K tile further) where it is the first key
// of a box inside the sequence.
template <int HD, int KEYS>
__device__ __forceinline__ uint32_t tile_box_bytes(const Cta& ct, int i, int box_cells) {
  uint32_t boxes = 0;
  for (int k0 = i * KEYS; k0 < (i + 1) * KEYS && k0 < ct.n_cells; k0 += box_cells) ++boxes;
  return boxes * static_cast<uint32_t>(box_cells) * 128u * 2u * (HD / 64);
}
template <int HD, int KEYS>
__device__ __forceinline__ void issue_key_boxes(const CUtensorMap* k_map, const CUtensorMap* v_map, const Cta& ct,
                                                uint32_t stage, int key, int cell, int box_cells, uint32_t bar) {
  if (key % box_cells != 0 || cell < 0) return;
  const uint32_t line = stage + static_cast<uint32_t>(key) * 128u;  // tile_chunk_offset(key, 0)
#pragma unroll
  for (int cb = 0; cb < HD / 64; ++cb) {
    const uint32_t dst = line + static_cast<uint32_t>(cb * KEYS * 128);
    tma::load_3d(dst, k_map, 64 * cb, ct.kvh, cell, bar);
    tma::load_3d(dst + static_cast<uint32_t>(Shape<HD, KEYS>::kTileBytes), v_map, 64 * cb, ct.kvh, cell, bar);
  }
}

// Dynamic shared memory of the TMA kernel: the warp-specialized kernel's and the landed mbarriers.
template <int HD>
constexpr int tma_smem_bytes() {
  return Shape<HD>::kSmemBytes + 8 * kStages;
}

// kPingPong: the consumers issue their wgmmas in turns (PingPongTurn, prefill_wgmma_ws.cuh; variant 8).
template <int HD, bool BF16, bool kPingPong>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_wgmma_tma_kernel(const PagedAttentionParams p, int chunk_heads, const __grid_constant__ CUtensorMap k_map,
                             const __grid_constant__ CUtensorMap v_map) {
#if KVCORE_WGMMA_ARCH
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  Cta ct;
  if (!make_cta(p, chunk_heads, ct)) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const WsSmem<HD> m(smem);
  const uint32_t landed0 = m.empty(kStages);  // the landed mbarriers follow the empty ones
  auto landed = [&](int s) { return landed0 + 8u * s; };
  const int live_groups = (ct.n_r + 15) / 16;  // warpgroups with rows (n_r <= 32)
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) {
      wgmma::mbar_init(m.full(s), 32);
      wgmma::mbar_init(m.empty(s), 4 * live_groups);
      wgmma::mbar_init(landed(s), 1);
    }
  __syncthreads();  // the barriers initialized before anyone uses them

  if (warp < 4 * kGroups) {
    consume_tiles<HD, BF16, kPingPong>(p, ct, m, warp, lane);
    return;
  }
  // ---- producer warpgroup
  wgmma::regs_dec<kProducerRegs>();
  const int pt = tid - kConsumerThreads;  // 0 .. 127
  const int box_cells = ct.bs < kKeys ? ct.bs : kKeys;
  int blk = -1;  // block id of key pt (pt < 64) of the next tile to copy, loaded a tile ahead
  auto load_block = [&](int i) { blk = pt < kKeys && i < ct.n_tiles ? block_of(ct, i * kKeys + pt) : -1; };
  auto producers_sync = [] { asm volatile("bar.sync 1, 128;\n" ::: "memory"); };  // the producer warpgroup only
  auto publish = [&](int j) {
    producers_sync();  // every producer thread's metadata copies of tile j landed
    if (warp == 4 * kGroups) {
      wgmma::mbar_wait(landed(j % kStages), (j / kStages) & 1);  // and its boxes
      prepare_tile<HD, true>(p, ct, m.stage(j % kStages), m.meta(j % kStages), lane);
      wgmma::mbar_arrive(m.full(j % kStages));
    }
  };
  load_block(0);
  for (int i = 0; i < ct.n_tiles; ++i) {
    const int s = i % kStages;
    // Stage s is free once the consumers released tile i - 4 (which also means warp 8 has
    // prepared and published it: nobody reads its metadata any more).
    if (i >= kStages) wgmma::mbar_wait(m.empty(s), (i / kStages - 1) & 1);
    const int cell = pt < kKeys ? cell_of(ct, blk, i * kKeys + pt) : -1;
    if (pt < kKeys) copy_key_meta(p, m.meta(s), pt, cell);
    if (pt == 0) tma::arrive_expect_tx(landed(s), tile_box_bytes<HD, kKeys>(ct, i, box_cells));
    if (pt < kKeys) issue_key_boxes<HD, kKeys>(&k_map, &v_map, ct, smem_addr(m.stage(s)), pt, cell, box_cells, landed(s));
    cp_async_commit();
    load_block(i + 1);
    if (i >= kPublishLag) {
      cp_async_wait<kPublishLag>();  // this thread's metadata copies of tile i - 2
      publish(i - kPublishLag);
    }
  }
  cp_async_wait<0>();
  for (int j = ct.n_tiles - kPublishLag < 0 ? 0 : ct.n_tiles - kPublishLag; j < ct.n_tiles; ++j) publish(j);
#else
  (void)p;
  (void)chunk_heads;
  (void)k_map;
  (void)v_map;
  __trap();  // built for sm_90a only; the launcher checks the device
#endif
}

}  // namespace kvcore::ops::cuda::prefill_wgmma
