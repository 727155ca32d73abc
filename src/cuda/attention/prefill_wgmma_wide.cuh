// The wide-tile wgmma prefill kernel (kernel variants 9, and 10 with the consumers in ping-pong):
// the TMA kernel's roles (prefill_wgmma_tma.cuh) with tiles of 128 keys instead of 64, so that each
// tile's fixed costs (the wait on S, the row max and sum shuffles, the hand-over between roles)
// buy twice the tensor work: S = Q K^T is an m64n128 wgmma, P V has 8 k-steps.
//  - Registers: S (64) and P (32) of 128 keys beside O (64) leave no room for q's A fragments
//    (32 at head dim 128), so q stays in shared memory (one 64-row tile a consumer warpgroup,
//    loaded once, laid out as a K tile) and S is the SS form of wgmma. The producer warpgroup
//    gives registers back (kWideProducerRegs) and the consumers take kWideConsumerRegs.
//  - Shared memory: a stage (K and V tiles of 128 keys) is 64 KB at head dim 128, so the ring
//    has 3 stages there (4 at head dim 64): q's tiles, the stages, per stage the keys' positions
//    and the tile's summary, and three mbarriers a stage fill 227 KB.
//  - Tile i: the producers wait for empty (tile i - kStages released), then each of the 128
//    producer threads takes key i * 128 + pt: its position by cp.async, its valid word into a
//    register, and, for the first key of a box, the K and V boxes (TMA, counted on landed).
//    In the next iteration, before waiting for the next empty, every producer thread prepares
//    its own key of tile i once landed completed (its position as rows compare it, its V row
//    zeroed where the key is dead or past the sequence), folds it into the tile's summary by
//    shared atomics and arrives on full (128 arrivals). So a tile's copies have the consumers'
//    whole previous step to land.
//  - A CTA reads the tiles through the last that holds a key its rows may see (tiles_seen), not
//    the chunk's own keys past its rows.
#pragma once
#include <cuda.h>

#include "cuda/attention/prefill_wgmma_tma.cuh"

namespace kvcore::ops::cuda::prefill_wgmma {

constexpr int kWideKeys = 128;
constexpr int kWideProducerRegs = 40, kWideConsumerRegs = 232;  // 128 * (40 + 2 * 232) <= 65536

// The wide kernel's shared memory from a 1024-byte aligned base: the stages (K tile, V tile), the
// consumer warpgroups' q tiles, per stage the keys' positions and the summary (smallest, largest
// live position, every key live, a spare word the consumers store to: pipelined_step), then the
// mbarriers full, empty and landed of each stage.
template <int HD>
struct WideSmem {
  using S = Shape<HD, kWideKeys>;
  static constexpr int kStages = HD == 128 ? 3 : 4;
  static constexpr int kQTileBytes = 64 * HD * 2;
  static constexpr int kQOffset = kStages * S::kStageBytes;
  static constexpr int kMetaInts = kWideKeys + 4;
  static constexpr int kMetaOffset = kQOffset + kGroups * kQTileBytes;
  static constexpr int kBarOffset = kMetaOffset + kStages * kMetaInts * 4;  // 8-byte aligned
  static constexpr int kBytes = kBarOffset + 3 * kStages * 8 + 1024;       // + the alignment of the base
  static_assert(kBytes <= 227 * 1024, "one CTA an SM");

  unsigned char* base;
  uint32_t bars;
  __device__ __forceinline__ explicit WideSmem(unsigned char* b) : base(b), bars(smem_addr(b + kBarOffset)) {}
  __device__ __forceinline__ unsigned char* stage(int s) const { return base + s * S::kStageBytes; }
  __device__ __forceinline__ unsigned char* q_tile(int group) const { return base + kQOffset + group * kQTileBytes; }
  __device__ __forceinline__ int* kpos(int s) const { return reinterpret_cast<int*>(base + kMetaOffset) + s * kMetaInts; }
  __device__ __forceinline__ int* summary(int s) const { return kpos(s) + kWideKeys; }
  __device__ __forceinline__ uint32_t full(int s) const { return bars + 8u * s; }
  __device__ __forceinline__ uint32_t empty(int s) const { return bars + 8u * (kStages + s); }
  __device__ __forceinline__ uint32_t landed(int s) const { return bars + 8u * (2 * kStages + s); }
};

// Both consumer warpgroups' q tiles: row m = 16 w + i of warpgroup g's tile is query row 16 g + i
// of head h0 + w (the A rows of its wgmmas), zeros past the chunk's rows or the group's heads;
// 16-byte chunks where q's rows are 16-byte aligned, else elements. Every thread of the CTA loads
// its chunks into registers (load), which stay in flight during the position scan, then stores
// them (store).
template <int HD>
struct QChunks {
  static constexpr int kChunks = HD / 8, kPerGroup = 64 * kChunks;
  static constexpr int kPer = (kGroups * kPerGroup + kWsThreads - 1) / kWsThreads;  // chunks a thread
  uint4 v[kPer];

  __device__ __forceinline__ void load(const PagedAttentionParams& p, const Cta& ct, int tid) {
    const uint16_t* q16 = static_cast<const uint16_t*>(p.q);
    const bool by_chunk = (reinterpret_cast<uintptr_t>(p.q) & 15u) == 0 && p.q_row_stride % 8 == 0 && p.q_head_stride % 8 == 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int idx = tid + k * kWsThreads;
      const int group = idx / kPerGroup, row = idx % kPerGroup / kChunks, c = idx % kChunks;
      const int r = 16 * group + row % 16, hw = row / 16;
      v[k] = make_uint4(0, 0, 0, 0);
      if (idx < kGroups * kPerGroup && r < ct.n_r && hw < ct.n_h) {
        const uint16_t* src = q16 + int64_t{ct.row + r} * p.q_row_stride + int64_t{ct.h0 + hw} * p.q_head_stride + 8 * c;
        if (by_chunk) {
          v[k] = *reinterpret_cast<const uint4*>(src);
        } else {
          uint32_t w[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) w[j] = uint32_t{src[2 * j]} | (uint32_t{src[2 * j + 1]} << 16);
          v[k] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  }
  __device__ __forceinline__ void store(unsigned char* q_tiles, int q_tile_bytes, int tid) const {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int idx = tid + k * kWsThreads;
      if (idx >= kGroups * kPerGroup) break;
      const int group = idx / kPerGroup, row = idx % kPerGroup / kChunks, c = idx % kChunks;
      *reinterpret_cast<uint4*>(q_tiles + group * q_tile_bytes + wgmma::tile_chunk_offset<64>(row, c)) = v[k];
    }
  }
};

// The tiles the CTA reads, [0, n): through the last that holds a key some row of the CTA may see
// (position <= the rows' largest). Every key past it is masked for every row (causal by
// position), so those tiles would add weights of 0: in a prefill chunk they are the chunk's own
// keys past the CTA's rows, up to a sixth of the steps at 2048 new tokens in 8k. A sequence's
// positions need not grow with its cells, so the cells are scanned, from the end, kScanPer a
// thread a round, until a round finds a key some row may see; that is one round where they do
// grow. The rows' positions and the first round's loads are in flight together. Every thread of
// the CTA calls it (barriers); slots: 2 shared ints no one else uses until the next barrier after
// the call.
__device__ __forceinline__ int tiles_seen(const PagedAttentionParams& p, const Cta& ct, int tid, int* slots) {
  constexpr int kScanPer = 8, kRound = kScanPer * kWsThreads;
  static_assert(kRows <= 32, "the rows' positions in warp 0");
  // Key positions (as rows compare them) of the round of cells [end - kRound, end); INT_MAX: none.
  auto load_round = [&](int end, int (&kp)[kScanPer]) {
    int cells[kScanPer];
#pragma unroll
    for (int k = 0; k < kScanPer; ++k) {
      const int j = end - kRound + k * kWsThreads + tid;
      cells[k] = j >= 0 ? cell_of(ct, block_of(ct, j), j) : -1;
    }
#pragma unroll
    for (int k = 0; k < kScanPer; ++k) {
      kp[k] = cells[k] >= 0 ? key_position(ct, __ldg(p.maybe_positions + cells[k])) : INT_MAX;
    }
  };
  int kp[kScanPer];
  const int q = tid < ct.n_r ? p.maybe_q_positions[ct.row + tid] : INT_MIN;
  if (ct.n_cells > 0) load_round(ct.n_cells, kp);
  if (tid < 32) {
    const int qmax = __reduce_max_sync(0xffffffffu, q);
    if (tid == 0) slots[0] = qmax, slots[1] = -1;
  }
  __syncthreads();
  const int qmax = slots[0];
  for (int end = ct.n_cells; end > 0; end -= kRound) {  // the same trip count for every thread
    if (end < ct.n_cells) load_round(end, kp);
    int last = -1;
#pragma unroll
    for (int k = 0; k < kScanPer; ++k)
      if (kp[k] <= qmax) last = end - kRound + k * kWsThreads + tid;  // kp: INT_MAX for no cell, and qmax < INT_MAX
    if (__syncthreads_or(last >= 0)) {
      if (last >= 0) atomicMax(slots + 1, last);
      __syncthreads();
      break;
    }
  }
  return (slots[1] + kWideKeys) / kWideKeys;  // -1 (no key seen): 0 tiles
}

#if KVCORE_WGMMA_ARCH
// Issues S = Q K^T over a wide tile (not committed): q's tile and the K tile both by descriptor.
template <int HD, bool BF16>
__device__ __forceinline__ void issue_s_wide(uint32_t q_s, uint32_t k_s, Scores<kWideKeys>& sc) {
#pragma unroll
  for (int j = 0; j < kWideKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks)
    wgmma::wgmma_m64n128k16_ss<BF16>(sc, wgmma::desc_k_major<64>(q_s, ks), wgmma::desc_k_major<kWideKeys>(k_s, ks),
                                     ks > 0 ? 1 : 0);
}

// The consumer warpgroups (warps 0-7): as consume_tiles (prefill_wgmma_ws.cuh) over wide tiles.
template <int HD, bool BF16, bool kPingPong>
__device__ __forceinline__ void consume_wide_tiles(const PagedAttentionParams& p, const Cta& ct, const WideSmem<HD>& m,
                                                   int warp, int lane) {
  using S = Shape<HD, kWideKeys>;
  constexpr int kStagesW = WideSmem<HD>::kStages;
  wgmma::regs_inc<kWideConsumerRegs>();
  const ConsumerWarp cw(ct, warp, lane, kPingPong);
  if (!cw.has_rows) return;  // not counted in the empty barriers
  const int g = cw.g, t = cw.t, r0 = cw.r0, group = cw.group, head = cw.head;
  const bool turns = cw.turns, active = cw.active;
  RowState<HD> w;
  init_state<HD>(p, ct, r0, g, w);
  const float sl2 = p.softmax_scale * math::kLog2e;
  const uint32_t q_s = smem_addr(m.q_tile(group));
  auto release = [&](int s) {
    __syncwarp();  // the warp's reads of the stage (positions, summary) done
    if (lane == 0) wgmma::mbar_arrive(m.empty(s));
  };
  Pipeline<HD, kWideKeys> pl;
  int prev = 0;  // stage of the tile whose P is in pl.pa
  for (int i = 0; i < ct.n_tiles; ++i) {
    const int s = i % kStagesW;
    wgmma::mbar_wait(m.full(s), (i / kStagesW) & 1);
    const uint32_t k_s = smem_addr(m.stage(s));
    pipelined_step<HD, BF16, kWideKeys>(
        p, w, pl, [&](Scores<kWideKeys>& sc) { issue_s_wide<HD, BF16>(q_s, k_s, sc); },
        smem_addr(m.stage(prev)) + S::kTileBytes, m.kpos(s), m.summary(s), sl2, t,
        [&] {
          if (i > 0) release(prev);
        },
        PingPongTurn{turns, group, group == 0 || i + 1 < ct.n_tiles});
    prev = s;
  }
  pipelined_finish<HD, BF16, kWideKeys>(w, pl, smem_addr(m.stage(prev)) + S::kTileBytes, ct.n_tiles > 0);
  if (ct.n_tiles > 0) release(prev);
  if (active) store_rows<HD>(p, ct, w, r0, head, g, t);
}
#endif

template <int HD, bool BF16, bool kPingPong>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_wgmma_wide_kernel(const PagedAttentionParams p, int chunk_heads, const __grid_constant__ CUtensorMap k_map,
                              const __grid_constant__ CUtensorMap v_map) {
#if KVCORE_WGMMA_ARCH
  using S = Shape<HD, kWideKeys>;
  using M = WideSmem<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  Cta ct;
  if (!make_cta(p, chunk_heads, ct)) return;
  const int tid = threadIdx.x, warp = tid / 32;
  const M m(smem);
  const int live_groups = (ct.n_r + 15) / 16;  // warpgroups with rows (n_r <= 32)
  if (tid == 0)  // (tiles_seen's barriers order these before any use)
    for (int s = 0; s < M::kStages; ++s) {
      wgmma::mbar_init(m.full(s), 128);
      wgmma::mbar_init(m.empty(s), 4 * live_groups);
      wgmma::mbar_init(m.landed(s), 1);
    }
  // The loads of the start in flight together: q's chunks, the producers' first block ids, the scan's first round.
  QChunks<HD> q;
  q.load(p, ct, tid);
  const int first_blk = tid >= kConsumerThreads ? block_of(ct, tid - kConsumerThreads) : -1;
  ct.n_tiles = tiles_seen(p, ct, tid, m.summary(0));  // tiles of kWideKeys; the slots: stage 0's summary, not yet in use
  q.store(m.q_tile(0), M::kQTileBytes, tid);
  wgmma::fence_proxy_async();  // this thread's q stores, before wgmma reads them
  __syncthreads();             // the barriers initialized and q's tiles stored before anyone uses them

  if (warp < 4 * kGroups) {
    consume_wide_tiles<HD, BF16, kPingPong>(p, ct, m, warp, tid % 32);
    return;
  }
  // ---- producer warpgroup: thread pt takes key pt of every tile
  wgmma::regs_dec<kWideProducerRegs>();
  const int pt = tid - kConsumerThreads;  // 0 .. 127
  const int box_cells = ct.bs < kWideKeys ? ct.bs : kWideKeys;
  int cell = -1;        // key pt's cell in the tile last issued
  uint32_t valid = 0;   // its valid word (p.maybe_valid), loaded at issue, read when it is prepared
  int blk = first_blk;  // block id of key pt of the next tile, loaded a tile ahead
  // Tile j (issued last): key pt's position as rows compare it (INT_MAX: no key or a dead
  // cell), its V row zeroed unless live (dead cells' bytes may be NaN; past the sequence, a box
  // landed a whole page's stale cells), the summary, and this thread's arrival on full.
  auto publish = [&](int j) {
    const int s = j % M::kStages;
    cp_async_wait<0>();                               // this thread's position copy
    wgmma::mbar_wait(m.landed(s), (j / M::kStages) & 1);  // and the tile's boxes
    int* kpos = m.kpos(s);
    const bool live = key_live(p, cell, valid);
    const int k = live ? key_position(ct, kpos[pt]) : INT_MAX;
    kpos[pt] = k;
    if (!live)
      for (int c = 0; c < S::kChunks; ++c)
        *reinterpret_cast<uint4*>(m.stage(s) + S::kTileBytes + wgmma::tile_chunk_offset<kWideKeys>(pt, c)) =
            make_uint4(0, 0, 0, 0);
    wgmma::fence_proxy_async();  // the zeros, before wgmma reads them
    int kmin = k, kmax = live ? k : INT_MIN;
#pragma unroll
    for (int x = 1; x < 32; x <<= 1) {
      kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, x));
      kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, x));
    }
    const bool all_live = __all_sync(0xffffffffu, live);
    if (tid % 32 == 0) {
      int* sum = m.summary(s);
      atomicMin(sum, kmin);
      atomicMax(sum + 1, kmax);
      if (!all_live) atomicAnd(sum + 2, 0);
    }
    __syncwarp();  // lane 0's atomics before the warp's arrivals
    wgmma::mbar_arrive(m.full(s));
  };
  for (int i = 0; i < ct.n_tiles; ++i) {
    const int s = i % M::kStages;
    if (i > 0) publish(i - 1);
    // Stage s is free once the consumers released tile i - kStages (whose summary and
    // positions nobody reads any more).
    if (i >= M::kStages) wgmma::mbar_wait(m.empty(s), (i / M::kStages - 1) & 1);
    cell = cell_of(ct, blk, i * kWideKeys + pt);
    valid = 0;
    if (cell >= 0) {
      cp_async4(smem_addr(m.kpos(s) + pt), p.maybe_positions + cell);
      if (p.maybe_valid) valid = __ldg(reinterpret_cast<const uint32_t*>(p.maybe_valid + (cell & ~3)));
    }
    cp_async_commit();
    if (pt == 0) {  // the summary's start, then the tile's bytes (the arrival releases the start)
      int* sum = m.summary(s);
      sum[0] = INT_MAX, sum[1] = INT_MIN, sum[2] = 1;
      tma::arrive_expect_tx(m.landed(s), tile_box_bytes<HD, kWideKeys>(ct, i, box_cells));
    }
    issue_key_boxes<HD, kWideKeys>(&k_map, &v_map, ct, smem_addr(m.stage(s)), pt, cell, box_cells, m.landed(s));
    blk = i + 1 < ct.n_tiles ? block_of(ct, (i + 1) * kWideKeys + pt) : -1;
  }
  if (ct.n_tiles > 0) publish(ct.n_tiles - 1);
#else
  (void)p;
  (void)chunk_heads;
  (void)k_map;
  (void)v_map;
  __trap();  // built for sm_90a only; the launcher checks the device
#endif
}

}  // namespace kvcore::ops::cuda::prefill_wgmma
