// Tensor-core paged attention (decode, and prefill calls too small for the prefill kernel of
// attention_prefill.cuh, rows packed per CTA): head_dim 64 / 128; f16, bf16 and FP8 pages; K
// stored rotated, or rotated while read.
// The SIMT kernel (attention_decode.cuh) spends ~80 instructions per cached row on dot
// products and shuffles and tops out at ~35% of the read bandwidth; here a warp handles a
// 16-token tile of K and V with ~40 mma.sync, so the kernel is bound by memory again.
//
// Transposed products: the 16 tokens of a tile are the M rows and the query columns (head,
// or (row, head) in prefill) are N = 8 or 16, so GQA groups of 4-8 waste little:
//   S^T = K Q^T      (A: K rows by ldmatrix; FP8 codes converted in registers; B: q in registers)
//   O^T += V^T P^T   (A: V rows by ldmatrix.trans; B: P moved across lanes by 8 shuffles)
// CTA = 4 warps (16 for fat FP8 CTAs) for one (block of query rows, split, kv head, chunk of
// <= 16 columns). Each warp takes tiles of the split (its first ones fixed, then the CTA's next
// free one) into a private cp.async ring of kStages tiles (K, V and the tile's metadata
// words), so the main loop needs only __syncwarp and a shared counter. Online softmax per
// column; the warps' states are merged in shared memory into one normalized partial
// (o, lse) per split, combined by attention_merge like the SIMT kernel's (a merge inside this
// kernel, by the last CTA of a head group, is slower: that CTA serializes the merge behind
// its own tiles).
// Start-up: the kernel is a programmatic dependent of the stream's previous kernel (its launch
// overlaps that kernel's drain), and fat CTAs of batch row 0 load their first block ids
// together with indptr (see `guess` in DecodeCta::locate).
//
// Precision: q and P are split into hi + lo halves of the mma type (two mma each), so
// scores and outputs keep ~f32 accuracy and match the CPU op at the f32 tolerances.
// Rope on read (attention_mma_rope.cuh): the warp rotates its K rows at their cached
// positions (cos/sin of the same f32 angle as the CPU) into 16-bit hi + lo tiles; FP8 rows
// are decoded into them, and their score takes the row's largest block scale.
// FP8 scales: K's per-64 (or per-row) scale multiplies the partial score of its dims; V's
// is folded into P relative to a running per-block reference R (the largest scale seen),
// so |P| stays <= 1 and O is rescaled only when R grows (with the softmax rescale).
#pragma once
#include "cuda/attention/attention_mma.hpp"
#include "cuda/attention/attention_mma_rope.cuh"
#include "cuda/common/check.cuh"
#include "cuda/attention/decode_trace_marks.cuh"
#include "cuda/attention/mma_primitives.cuh"
#include "cuda/common/pdl.cuh"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/softmax.hpp"
#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::mma_attn {

constexpr int kTile = 16;      // tokens per warp step: the M of S^T, the K of O^T
constexpr int kMetaWords = 5;  // per token of a stage: cell, position, valid word, K scale word, V scale word

// What the kernel decides at compile time. General: every runtime feature (positions,
// causal / window masks, valid flags, either FP8 scale layout). Lean, for pages read the
// common decode way (no positions, masks or valid flags; FP8: per-64 UE8M0 scales): those
// per-token branches are compiled out, because FP8 decode is bound by instruction issue (about
// 1000 instructions a warp step for 4 KB); short 16-bit calls are bound by the loop's latency
// and take the lean loop too. Rounding P to f16 (one PV mma instead of hi + lo) gains nothing
// once the loop is lean, so P stays exact.
// LeanTrace: the lean path plus trace stamps (bench/decode_trace.cu only; see trace_mark).
enum class Path { General, Lean, LeanTrace };

// Warps a CTA. FP8 decode may run one fat CTA an SM (kFatWarps = 16, as many warps as the
// 4-warp CTAs that used to share an SM; attention_mma.hpp says when): the warp schedulers
// favour the oldest CTA of an SM, so 4-warp CTAs sharing an SM finish apart and the SM drains
// with few warps (bench decode_trace shows it), while the warps of one CTA share their tiles
// through a counter (see DecodeCta::locate) and finish together.
constexpr int kWarpsDefault = 4;

template <int HD, math::KvElem KV, bool ROPE, int NT, int W = kWarpsDefault>
struct Shape {
  static constexpr int kWarps = W;
  static constexpr int kThreads = 32 * W;
  static constexpr bool kFp8 = KV == math::KvElem::E4M3;
  static constexpr int kN = 8 * NT;               // query columns per CTA
  static constexpr int kRowBytes = HD * (kFp8 ? 1 : 2);
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per cached row
  static constexpr int kTileBytes = kTile * kRowBytes;
  static constexpr int kKSteps = HD / 16;         // k-steps of S^T; also the 16-dim m-tiles of O^T
  static constexpr int kScaleBlocks = kFp8 ? HD / 64 : 1;
  // Ring depth per warp: rope on read needs room for the lo tiles, and 2 CTAs per SM matter
  // more than a third stage. FP8 decode is bound by instruction latency, not bytes in
  // flight: 3 stages let 16 warps share an SM (see kMinBlocks).
  static constexpr int kStages = ROPE ? 2 : 3;
  // CTAs per SM the registers are budgeted for (__launch_bounds__); a fat CTA fills the SM.
  static constexpr int kMinBlocks = W > 4 ? 1 : NT == 1 ? (kFp8 && !ROPE ? 4 : 3) : 2;
  static constexpr int kStageBytes = 2 * kTileBytes + kTile * kMetaWords * 4;
  static constexpr int kPipeBytes = kWarps * kStages * kStageBytes;
  // The warps' merge: o [kWarps][kN][kRedStride], (m, l) [kWarps][kN][2], factors [kWarps][kN], l [kN].
  // 4 floats of padding a column: the o stores of a warp's 4 column pairs (t) land in different
  // banks instead of one (a 4-way conflict on every store: ~1 us of a 16-warp epilogue).
  static constexpr int kRedStride = HD + 4;
  static constexpr int kMergeBytes = (kWarps * kN * (kRedStride + 2) + (kWarps + 1) * kN) * 4;
  static constexpr int kQBytes = kN * HD * 4;
  static constexpr int kBaseBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
  // Rope on read: after the base area, each warp's rotated K tiles (lo; FP8 also hi: 16-bit
  // rows the stage cannot hold) and the pair frequencies.
  static constexpr int kRopeTileBytes = kTile * HD * 2;
  static constexpr int kRopeTiles = ROPE ? (kFp8 ? 2 : 1) : 0;
  static constexpr int kFreqOffset = kBaseBytes + kWarps * kRopeTiles * kRopeTileBytes;
  static constexpr int kRopeBytes = ROPE ? kWarps * kRopeTiles * kRopeTileBytes + HD / 2 * 4 : 0;
  __device__ static unsigned char* rope_lo(unsigned char* smem, int warp) { return smem + kBaseBytes + warp * kRopeTileBytes; }
  __device__ static unsigned char* rope_hi(unsigned char* smem, int warp) {
    return smem + kBaseBytes + (kWarps + warp) * kRopeTileBytes;
  }
  // The queries get their own area (after the stages), so the first tiles' copies are in
  // flight while q is stored: the CTA's start-up latencies overlap (short CTAs feel them).
  static constexpr int kQOffset = kBaseBytes + kRopeBytes;
  static constexpr int kCounterOffset = kQOffset + kQBytes;  // the CTA's next free tile (int)
  static constexpr int kSmemBytes = kCounterOffset + 16;
  static_assert(kChunks == 4 || kChunks == 8 || kChunks == 16, "swizzle and copy lanes need 4, 8 or 16 chunks per row");
  static_assert(!kFp8 || kQBytes >= kWarps * kTile * 2 * kScaleBlocks * 4, "FP8 scale scratch lives in the q area");
  static_assert(kBaseBytes % 16 == 0 && kFreqOffset % 16 == 0, "16-byte aligned tiles and frequencies");
};

// Dim held by O^T accumulator element x of m-tile mt in a thread of fragment row g. FP8 V
// fragments put dim 2g of the 16-dim chunk in row g and dim 2g + 1 in row g + 8.
template <bool FP8>
__device__ __forceinline__ int out_dim(int mt, int x, int g) {
  if constexpr (FP8) return mt * 16 + 2 * g + (x >> 1);
  else return mt * 16 + 8 * (x >> 1) + g;
}

// n / c without a division, for the small column counts of a CTA: exact for 0 <= n < 1024 and
// 1 <= c <= 64 with inv = ceil(65536 / c). The generic division is ~20 instructions, and the
// query and output loops took one per element.
__device__ __forceinline__ int small_div(int n, int inv) { return (n * inv) >> 16; }
__device__ __forceinline__ int small_div_inverse(int c) { return (65536 + c - 1) / c; }

// This thread's elements u of the CTA's [kN][HD] query block (element threadIdx.x + u * kThreads:
// column n = that / HD, dim that % HD; column n = query row row + n / chunk_heads, head h0 +
// n % chunk_heads; columns past the rows or heads are zero). Every load is issued before any
// value is used.
template <int kN, int HD, int kThreads, class Load>
__device__ __forceinline__ void load_q_columns(const PagedAttentionParams& p, int row, int h0, int chunk_heads, int n_r,
                                               int n_h, float (&qv)[kN * HD / kThreads], const Load& load) {
  const int inv = small_div_inverse(chunk_heads);
#pragma unroll
  for (int u = 0; u < kN * HD / kThreads; ++u) {
    const int i = static_cast<int>(threadIdx.x) + u * kThreads, n = i / HD, d = i % HD;
    const int rr = small_div(n, inv), gg = n - rr * chunk_heads;
    qv[u] = rr < n_r && gg < n_h ? load(int64_t{row + rr} * p.q_row_stride + int64_t{h0 + gg} * p.q_head_stride + d) : 0.0f;
  }
}

// One CTA's decode work as named stages, in the order run() calls them:
//   locate()          the sequence, its split range, the CTA's query columns (false: nothing to do)
//   load_queries()    every query load of the thread issued, before the pipeline
//   start_pipeline()  the first kStages - 1 tiles' copies issued
//   stage_queries()   queries to shared f32, rotated (rope on read), to hi/lo B fragments
//   per tile step():  tile_scales(), tile_tokens(), rotate_keys(), scores(), softmax(),
//                     hide_dead_values(), p_fragments(), accumulate_pv()
//   merge_and_write() the warps' states merged in shared memory, the partial (or output) written
// The members are the state the stages share; a tile's own values are locals of step(), handed
// to its stages as arguments (inputs const). Arrays are indexed with compile-time indices only
// (but ratio, which rope_rotate_tile indexes at run time), so once the stages are inlined they
// live in registers, as the locals of one function did.
template <int HD, math::KvElem KV, bool ROPE, int NT, Path PATH, int W>
struct DecodeCta {
  using S = Shape<HD, KV, ROPE, NT, W>;
  static constexpr bool kTrace = PATH == Path::LeanTrace;
  static constexpr int kWarps = S::kWarps, kThreads = S::kThreads;
  static constexpr bool kFp8 = S::kFp8;
  static constexpr bool kBf16 = KV == math::KvElem::BF16;
  static constexpr int kN = S::kN;
  static constexpr int SB = S::kScaleBlocks;
  // Scores from FP8 codes (per scale block), or from 16-bit rows (pages, or rotated FP8 rows)
  static constexpr bool kFp8K = kFp8 && !ROPE;
  static constexpr int KB = kFp8K ? SB : 1;  // K scale blocks of a score
  static constexpr bool kLean = PATH != Path::General;
  static constexpr int kElemsPerThread = kN * HD / kThreads;  // of the [kN][HD] query and output blocks
  static_assert(kN * HD % kThreads == 0, "whole query blocks per thread");
  static_assert(!kLean || !ROPE, "the lean path reads no positions");

  // ---- the call and the thread
  const PagedAttentionParams& p;
  unsigned char* const smem;
  const int row, split, kvh, chunk, chunk_heads;
  unsigned long long* const trace;
  const int tid, warp, lane;
  const int g, t;  // mma fragment coordinates

  // ---- locate(): the sequence, its split range, the CTA's columns, the pages
  int b, bs;
  bool pow2_bs;
  int bs_shift;
  bool guess;
  int guessed_blk[S::kStages];
  int n_cells;
  CellRange range;
  int h0, n_h, pos_off;
  int n_r;
  int qpos[NT][2];  // this thread's columns 8j + 2t + e
  int seq_first_block;
  const int32_t* blocks;
  int n_kv;
  const char* kbase;
  const char* vbase;
  bool need_pos, per64;
  const uint8_t* valid;
  unsigned char* wbase;
  int n_tiles;
  int* free_tile;

  // ---- the warp's pipeline: steps counted as tiles are taken, the next tile and its block id
  int n_steps, next_tile, next_blk;

  // ---- stage_queries(): the queries as hi/lo B fragments
  uint32_t qh[NT][S::kKSteps][2], ql[NT][S::kKSteps][2];

  // ---- the running state of the tiles
  float o[S::kKSteps][NT][4];  // O^T: m-tile (16 dims) x column tile
  float mcol[NT][2], lcol[NT][2];  // softmax state of columns 8j + 2t + e
  float vref[SB];  // FP8: V's running reference scale per block (0: nothing seen)
  float vinv[SB];  // 1 / vref (0 while vref is 0)
  float sl2;
  int mi, mr;  // ldmatrix: which matrix this lane addresses, and its row

  __device__ __forceinline__ DecodeCta(const PagedAttentionParams& p_, unsigned char* smem_, int row_, int split_, int kvh_,
                                       int chunk_, int chunk_heads_, unsigned long long* trace_)
      : p(p_), smem(smem_), row(row_), split(split_), kvh(kvh_), chunk(chunk_), chunk_heads(chunk_heads_), trace(trace_),
        tid(threadIdx.x), warp(tid / 32), lane(tid % 32), g(lane / 4), t(lane % 4) {}

  __device__ __forceinline__ void run() {
    trace_mark<kTrace, W>(trace, kTraceEntry);
    if (!locate()) return;
    float qv[kElemsPerThread];
    load_queries(qv);
    trace_mark<kTrace, W>(trace, kTraceSeqKnown, n_cells);  // (after the q loads: a mark orders memory)
    start_pipeline();
    trace_mark<kTrace, W>(trace, kTracePrologueIssued);
    stage_queries(qv);
    trace_mark<kTrace, W>(trace, kTraceQReady);
    init_state();
    // rd: the stage step i reads; wr: the stage its copies go to (the one step i - 1 read)
    for (int i = 0, rd = 0, wr = S::kStages - 1; i < n_steps; ++i, wr = rd, rd = rd + 1 == S::kStages ? 0 : rd + 1)
      step(i, rd, wr);
    cp_async_wait<0>();
    trace_mark<kTrace, W>(trace, kTraceLoopDone);
    merge_and_write();
  }

  // Column n = rr * chunk_heads + gg: query row row + rr, head h0 + gg.
  __device__ __forceinline__ bool n_real(int n) const { return n / chunk_heads < n_r && n % chunk_heads < n_h; }
  __device__ __forceinline__ int n_qpos(int n) const {
    return p.maybe_q_positions && n / chunk_heads < n_r ? p.maybe_q_positions[row + n / chunk_heads] : 0;
  }

  // ---- locate: the sequence of this CTA's row, the split's cell range, the CTA's columns, the
  // pages. False when the CTA has nothing to do (a prefill row that starts no block of rows).
  __device__ __forceinline__ bool locate() {
    b = attention_row_seq(p, row);
    bs = p.layout.block_size;
    pow2_bs = (bs & (bs - 1)) == 0;
    bs_shift = __ffs(bs) - 1;
    // Batch row 0 of a decode call in fat CTAs: indptr[0] is 0 (a table invariant), so its block
    // ids start at indices[0]; with the planning hint max_seq_cells as the guess of its cell count,
    // the first tiles' block ids load in the same round trip as indptr / last_page_len instead of
    // after them, and serve when the guess was right (checked). Only entries below n_indices are
    // read. It pays where one fat CTA an SM waits on that round trip (FP8 at batch 1); 4-warp
    // CTAs hide it behind other CTAs of their SM, and the extra loads only cost them.
    guess = W > kWarpsDefault && !p.maybe_qo_indptr && b == 0 && p.max_seq_cells > 0 &&
            p.max_seq_cells <= min(p.n_indices * bs, int64_t{0x7fffffff});
#pragma unroll
    for (int i = 0; i < S::kStages; ++i) guessed_blk[i] = -1;
    if (guess) {
      const CellRange gr = attention_split_range(static_cast<int>(p.max_seq_cells), split, p.num_splits);
      const int g_tiles = (gr.end - gr.begin + kTile - 1) / kTile;
#pragma unroll
      for (int i = 0; i < S::kStages; ++i) {
        const int tile = warp + kWarps * i, j = gr.begin + tile * kTile + (lane & 15);
        guessed_blk[i] = tile < g_tiles && j < gr.end ? __ldg(p.indices + (pow2_bs ? j >> bs_shift : j / bs)) : -1;
      }
    }
    n_cells = PagedLayout::seq_cells(p.indptr, p.last_page_len, b, bs);
    range = attention_split_range(n_cells, split, p.num_splits);
    h0 = kvh * p.group + chunk * chunk_heads;
    n_h = min(chunk_heads, p.group - chunk * chunk_heads);
    pos_off = p.maybe_seq_pos_offset ? p.maybe_seq_pos_offset[b] : 0;  // key pos = stored - pos_off
    // Prefill: this CTA serves rows row .. row + n_r - 1 of sequence b when row starts a
    // block of kN / chunk_heads rows of b; the CTAs of the other rows have nothing to do.
    n_r = 1;
    if (p.maybe_qo_indptr) {
      const int per = kN / chunk_heads, first = p.maybe_qo_indptr[b];
      if ((row - first) % per != 0) return false;
      n_r = min(per, p.maybe_qo_indptr[b + 1] - row);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) qpos[j][0] = n_qpos(8 * j + 2 * t), qpos[j][1] = n_qpos(8 * j + 2 * t + 1);

    seq_first_block = p.indptr[b];  // (read once: the guess below checks it too)
    blocks = p.indices + seq_first_block;
    n_kv = p.layout.n_kv_heads;
    kbase = static_cast<const char*>(p.k);
    vbase = static_cast<const char*>(p.v);
    need_pos = !kLean && (ROPE || p.causal || p.window > 0);
    per64 = kFp8 && (kLean || p.scale_mode == math::KvScaleMode::Ue8m0Per64);
    valid = kLean ? nullptr : p.maybe_valid;  // (folds the lean path's checks away)

    wbase = smem + warp * S::kStages * S::kStageBytes;
    // The range's tiles of kTile cells. A warp's first kStages steps take tiles warp, warp + W,
    // ...; each later step takes the CTA's next free tile from a shared counter (starting past
    // those), so the warps the schedulers favour take more tiles and all finish together. A
    // warp's tiles only grow, so its steps inside the range are a prefix (n_steps, counted as
    // tiles are taken).
    n_tiles = (range.end - range.begin + kTile - 1) / kTile;
    free_tile = reinterpret_cast<int*>(smem + S::kCounterOffset);
    if (tid == 0) *free_tile = kWarps * S::kStages;  // first read after the barrier of the q block
    return true;
  }

  __device__ __forceinline__ int take_tile() {
    int x = 0;
    if (lane == 0) x = atomicAdd(free_tile, 1);
    return __shfl_sync(0xffffffffu, x, 0);
  }
  __device__ __forceinline__ int token_of(int tile) const { return range.begin + tile * kTile + (lane & 15); }
  // The block id of this lane's token in `tile` (-1 past the range). The main loop loads it
  // one step ahead, so the load's latency hides behind a step of math instead of stalling
  // the copies that need it.
  __device__ __forceinline__ int block_of(int tile) const {
    const int j = token_of(tile);
    return tile < n_tiles && j < range.end ? __ldg(blocks + (pow2_bs ? j >> bs_shift : j / bs)) : -1;
  }
  // Copy `tile` (K rows, V rows, metadata words) into stage `slot` (the step's index modulo
  // kStages, tracked by the caller: a modulo by 3 costs several instructions a step).
  __device__ __forceinline__ void issue(int tile, int slot, int blk) {
    if (tile < n_tiles) {
      unsigned char* st = wbase + slot * S::kStageBytes;
      int* meta = reinterpret_cast<int*>(st + 2 * S::kTileBytes);
      const int j = token_of(tile);
      int cell = -1;
      if (j < range.end) cell = blk * bs + (pow2_bs ? (j & (bs - 1)) : j % bs);
      // 32-bit indices: serves() keeps each pool under 2^32 16-byte chunks.
      const uint32_t row_id = static_cast<uint32_t>(cell) * n_kv + kvh;
      if (lane < 16) {
        meta[lane] = cell;
        if (cell >= 0 && need_pos) cp_async4(smem_addr(meta + kTile + lane), p.maybe_positions + cell);
        if (cell >= 0 && valid) cp_async4(smem_addr(meta + 2 * kTile + lane), valid + (cell & ~3));
      } else if constexpr (kFp8) {
        if (cell >= 0) {
          if (per64) {
            const uint32_t si = (row_id * (HD / 64)) & ~3u;
            cp_async4(smem_addr(meta + 3 * kTile + (lane - 16)), p.maybe_k_scale_u8 + si);
            cp_async4(smem_addr(meta + 4 * kTile + (lane - 16)), p.maybe_v_scale_u8 + si);
          } else {
            cp_async4(smem_addr(meta + 3 * kTile + (lane - 16)), p.maybe_k_scale_f32 + row_id);
            cp_async4(smem_addr(meta + 4 * kTile + (lane - 16)), p.maybe_v_scale_f32 + row_id);
          }
        }
      }
      // Lane copies chunk c = lane % kChunks of rows lane / kChunks + it * kRowsPerIt. Each
      // row's first chunk index comes from the lane holding its token (~0: past the range,
      // zero fill, nothing read): one shuffle and one 32-bit add per copy, no 64-bit math.
      constexpr int kRowsPerIt = 32 / S::kChunks;
      const uint32_t my_chunk = cell >= 0 ? row_id * S::kChunks : ~0u;
      const int c = lane % S::kChunks;
      const unsigned ks_ = smem_addr(st), vs_ = smem_addr(st + S::kTileBytes);
#pragma unroll
      for (int it = 0; it < kTile / kRowsPerIt; ++it) {
        const int r = lane / S::kChunks + it * kRowsPerIt;
        const uint32_t rc = __shfl_sync(0xffffffffu, my_chunk, r);
        const bool in = rc != ~0u;
        const size_t off = size_t{in ? rc + c : 0u} * 16;
        cp_async16(ks_ + swz<S::kChunks>(r, c), kbase + off, in);
        cp_async16(vs_ + swz<S::kChunks>(r, c), vbase + off, in);
      }
    }
    cp_async_commit();  // one group per step, empty or not, so the wait counts stay exact
  }

  // ---- load_queries: every load of a thread is issued first, before the block-table chain and
  // the first tiles' copies, and stored once those are issued. Issued after the copies, they
  // queued behind every CTA's first tiles (bench decode_trace shows the wait); a loop that
  // stored after each load waits one memory round trip per element.
  __device__ __forceinline__ void load_queries(float (&qv)[kElemsPerThread]) const {
    switch (p.q_elem) {  // uniform: one unrolled loop of loads per q type
      case QElem::F32:
        load_q_columns<kN, HD, kThreads>(p, row, h0, chunk_heads, n_r, n_h, qv, [&](int64_t i) { return static_cast<const float*>(p.q)[i]; });
        break;
      case QElem::F16:
        load_q_columns<kN, HD, kThreads>(p, row, h0, chunk_heads, n_r, n_h, qv,
                               [&](int64_t i) { return math::f16_bits_to_f32(static_cast<const uint16_t*>(p.q)[i]); });
        break;
      case QElem::BF16:
        load_q_columns<kN, HD, kThreads>(p, row, h0, chunk_heads, n_r, n_h, qv,
                               [&](int64_t i) { return math::bf16_bits_to_f32(static_cast<const uint16_t*>(p.q)[i]); });
        break;
    }
  }

  // ---- start_pipeline: the first kStages - 1 tiles' copies, the next tile and its block id.
  __device__ __forceinline__ void start_pipeline() {
    n_steps = 0;
#pragma unroll
    for (int i = 0; i < S::kStages; ++i) n_steps += warp + kWarps * i < n_tiles;
    const bool guessed = guess && n_cells == p.max_seq_cells && seq_first_block == 0;  // (uniform in the CTA)
#pragma unroll
    for (int i = 0; i < S::kStages - 1; ++i) issue(warp + kWarps * i, i, guessed ? guessed_blk[i] : block_of(warp + kWarps * i));
    next_tile = warp + kWarps * (S::kStages - 1);
    next_blk = guessed ? guessed_blk[S::kStages - 1] : block_of(next_tile);
  }

  // ---- stage_queries: queries -> shared f32 [kN][HD] (padding columns zero) -> hi/lo B fragments.
  __device__ __forceinline__ void stage_queries(const float (&qv)[kElemsPerThread]) {
    float* qs = reinterpret_cast<float*>(smem + S::kQOffset);
#pragma unroll
    for (int u = 0; u < kElemsPerThread; ++u) qs[tid + u * kThreads] = qv[u];
    if constexpr (ROPE) {
      float* freq = reinterpret_cast<float*>(smem + S::kFreqOffset);
      for (int i = tid; i < p.rope.layout.n_pairs(); i += kThreads) freq[i] = p.rope.freq[i];
      // Rotated tiles start at zero: 16-bit pages' unrotated dims keep a zero lo part.
      for (int i = tid; i < kWarps * S::kRopeTiles * S::kRopeTileBytes / 16; i += kThreads)
        reinterpret_cast<uint4*>(smem + S::kBaseBytes)[i] = make_uint4(0, 0, 0, 0);
      __syncthreads();
      if (p.rotate_query) {  // q at its own position, exactly as the CPU does it
        const int n_pairs = p.rope.layout.n_pairs();
        for (int i = tid; i < kN * n_pairs; i += kThreads) {
          const int n = i / n_pairs, pi = i % n_pairs;
          if (!n_real(n)) continue;
          float sn, cs;
          math::sincos_f32(math::rope_angle(static_cast<float>(n_qpos(n)), freq[pi]), &sn, &cs);
          math::rotate_pair(qs[n * HD + p.rope.layout.dim0(pi)], qs[n * HD + p.rope.layout.dim1(pi)],
                            cs * p.rope.attention_factor, sn * p.rope.attention_factor);
        }
        __syncthreads();
      }
      // The keys' rotation magnitude, applied to the q dims they meet (once per CTA instead of
      // twice per rotated pair of every key).
      if (p.rope.attention_factor != 1.0f)
        for (int i = tid; i < kN * HD; i += kThreads)
          if (p.rope.layout.rotates(i % HD)) qs[i] *= p.rope.attention_factor;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
        // B rows k = (2t, 2t+1) and (2t+8, 2t+9) of this k-step; FP8 K fragments hold dims
        // 4t..4t+3 of the 16-dim chunk in their place (a permutation of k, shared by q).
        const float* qn = qs + (8 * j + g) * HD;
        const int d0 = kFp8K ? ks * 16 + 4 * t : ks * 16 + 2 * t;
        const int d1 = kFp8K ? d0 + 2 : d0 + 8;
        split2<kBf16>(qn[d0], qn[d0 + 1], qh[j][ks][0], ql[j][ks][0]);
        split2<kBf16>(qn[d1], qn[d1 + 1], qh[j][ks][1], ql[j][ks][1]);
      }
    if constexpr (kFp8) __syncthreads();  // the q area becomes the warps' scale scratch
  }

  // ---- init_state: empty outputs and softmax states, no V reference scale yet.
  __device__ __forceinline__ void init_state() {
#pragma unroll
    for (int mt = 0; mt < S::kKSteps; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j) mcol[j][0] = mcol[j][1] = math::neg_inf_f32(), lcol[j][0] = lcol[j][1] = 0.0f;
#pragma unroll
    for (int c = 0; c < SB; ++c) vref[c] = 0.0f, vinv[c] = 0.0f;
    sl2 = p.softmax_scale * math::kLog2e;
    mi = lane / 8, mr = lane % 8;
  }

  // ---- step i of the warp: reads stage rd, issues the copies of step i + kStages - 1 into wr.
  __device__ __forceinline__ void step(int i, int rd, int wr) {
    __syncwarp();  // every lane is done reading the stage the next issue overwrites
    issue(next_tile, wr, next_blk);  // step i + kStages - 1
    next_tile = take_tile();         // step i + kStages
    n_steps += next_tile < n_tiles;
    next_blk = block_of(next_tile);
    cp_async_wait<S::kStages - 1>();
    __syncwarp();  // step i's copies of every lane are visible
    if (i == 0) trace_mark<kTrace, W>(trace, kTraceFirstTile);
    unsigned char* st = wbase + rd * S::kStageBytes;
    const int* meta = reinterpret_cast<const int*>(st + 2 * S::kTileBytes);
    const unsigned k_s = smem_addr(st), v_s = smem_addr(st + S::kTileBytes);
    float ksc[KB][2], vsc[SB][2];
    float ratio[SB];  // rope on read, FP8: this lane's row's K block scales over their largest
    tile_scales(meta, ksc, vsc, ratio);
    bool vis[2];
    int kpos[2];
    tile_tokens(meta, vis, kpos);
    const unsigned k_tile = rotate_keys(meta, st, k_s, ratio);
    float s[NT][4];  // x: token g + 8 * (x >> 1), column 8j + 2t + (x & 1)
    scores(k_s, k_tile, ksc, vis, kpos, s);
    float pw[NT][4];
    softmax(s, vsc, pw);
    hide_dead_values(st, vis);
    uint32_t ph[SB][NT][2], pl[SB][NT][2];
    p_fragments(pw, vsc, ph, pl);
    accumulate_pv(v_s, ph, pl);
  }

  // ---- tile_scales: FP8 scales, decoded once per (token, K or V) by lanes (token lane & 15, K for
  // lanes 0-15, V for 16-31) into the warp's scratch [token][K blocks, V blocks]: the 4 lanes of a
  // fragment row would otherwise each decode the same 2 x 2 x SB scales. V of a dead cell
  // is 0 (weight 0; its bytes were zeroed or never read). 16-bit pages: all ones.
  __device__ __forceinline__ void tile_scales(const int* meta, float (&ksc)[KB][2], float (&vsc)[SB][2], float (&ratio)[SB]) const {
#pragma unroll
    for (int c = 0; c < SB; ++c) vsc[c][0] = vsc[c][1] = 1.0f;
#pragma unroll
    for (int c = 0; c < KB; ++c) ksc[c][0] = ksc[c][1] = 1.0f;
#pragma unroll
    for (int c = 0; c < SB; ++c) ratio[c] = 1.0f;
    if constexpr (kFp8) {
      float* scr = reinterpret_cast<float*>(smem + S::kQOffset) + warp * (kTile * 2 * SB);
      {
        const int r = lane & 15, kind = lane >> 4;
        const int cell = meta[r];
        bool live = cell >= 0;
        if (live && valid) live = ((static_cast<uint32_t>(meta[2 * kTile + r]) >> (8 * (cell & 3))) & 0xffu) != 0;
        const uint32_t w = static_cast<uint32_t>(meta[(3 + kind) * kTile + r]);
        const int sh = per64 ? static_cast<int>(((static_cast<uint32_t>(cell) * n_kv + kvh) * (HD / 64)) & 3u) : 0;
#pragma unroll
        for (int c = 0; c < SB; ++c) {
          // per-64: one UE8M0 byte per block; per-row f32: the same scale for every block
          const float x = per64 ? math::ue8m0_decode(static_cast<uint8_t>(w >> (8 * (sh + c)))) : __uint_as_float(w);
          scr[r * 2 * SB + kind * SB + c] = kind == 1 && !live ? 0.0f : x;
        }
      }
      __syncwarp();
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int c = 0; c < SB; ++c) {
          vsc[c][e] = scr[(g + 8 * e) * 2 * SB + SB + c];
          if constexpr (ROPE) ksc[0][e] = c == 0 ? scr[(g + 8 * e) * 2 * SB] : fmaxf(ksc[0][e], scr[(g + 8 * e) * 2 * SB + c]);
          else ksc[c][e] = scr[(g + 8 * e) * 2 * SB + c];
        }
      if constexpr (ROPE) {
        const float* ks = scr + (lane & 15) * 2 * SB;
        float ref = ks[0];
#pragma unroll
        for (int c = 1; c < SB; ++c) ref = fmaxf(ref, ks[c]);
#pragma unroll
        for (int c = 0; c < SB; ++c) ratio[c] = ref > 0.0f ? ks[c] / ref : 0.0f;
      }
    }
  }

  // ---- tile_tokens: this thread's 2 tokens (fragment rows g, g + 8): live, position
  __device__ __forceinline__ void tile_tokens(const int* meta, bool (&vis)[2], int (&kpos)[2]) const {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = g + 8 * e;
      const int cell = meta[r];
      bool v = cell >= 0;
      if (v && valid) v = ((static_cast<uint32_t>(meta[2 * kTile + r]) >> (8 * (cell & 3))) & 0xffu) != 0;
      vis[e] = v;
      kpos[e] = need_pos ? meta[kTile + r] - pos_off : 0;
    }
  }

  // ---- rotate_keys: rope on read rotates the tile's K rows at their positions into 16-bit hi + lo
  // tiles; FP8 with rope on read: scores read the rotated f16 tile instead of the stage's codes.
  // Returns the tile the scores read.
  __device__ __forceinline__ unsigned rotate_keys(const int* meta, unsigned char* st, unsigned k_s, const float (&ratio)[SB]) const {
    const unsigned k_tile = ROPE && kFp8 ? smem_addr(S::rope_hi(smem, warp)) : k_s;
    if constexpr (ROPE) {
      const int r = lane & 15;
      rope_rotate_tile<HD, KV>(p.rope.layout, reinterpret_cast<const float*>(smem + S::kFreqOffset),
                               static_cast<float>(meta[kTile + r] - pos_off), meta[r] >= 0, lane, st,
                               kFp8 ? S::rope_hi(smem, warp) : st, S::rope_lo(smem, warp), ratio);
      __syncwarp();
    }
    return k_tile;
  }

  // ---- scores: S^T = K Q^T per scale block; hi and lo products in separate accumulators
  __device__ __forceinline__ void scores(unsigned k_s, unsigned k_tile, const float (&ksc)[KB][2], const bool (&vis)[2],
                                        const int (&kpos)[2], float (&s)[NT][4]) const {
    float sh[KB][NT][4], sl[KB][NT][4];
#pragma unroll
    for (int c = 0; c < KB; ++c)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) sh[c][j][x] = sl[c][j][x] = 0.0f;
    if constexpr (kFp8K) {
      // matrices: (tokens 0-7, chunk ks), (tokens 8-15, ks), (tokens 0-7, ks+1), (tokens 8-15, ks+1)
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ks += 2) {
        uint32_t r[4];
        ldsm_x4(r, k_s + swz<S::kChunks>((mi & 1) * 8 + mr, ks + mi / 2));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t a[4] = {e4m3x2_to_f16x2(r[2 * h]), e4m3x2_to_f16x2(r[2 * h + 1]),
                                 e4m3x2_hi_to_f16x2(r[2 * h]), e4m3x2_hi_to_f16x2(r[2 * h + 1])};
          const int c = (ks + h) / 4;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma16816<false>(sh[c][j], a, qh[j][ks + h][0], qh[j][ks + h][1]);
            mma16816<false>(sl[c][j], a, ql[j][ks + h][0], ql[j][ks + h][1]);
          }
        }
      }
    } else {
      // matrices: (tokens 0-7, chunk 2ks), (tokens 8-15, 2ks), (tokens 0-7, 2ks+1), (tokens 8-15, 2ks+1)
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
        uint32_t a[4];
        const int off = swz<HD / 8>((mi & 1) * 8 + mr, 2 * ks + mi / 2);
        ldsm_x4(a, k_tile + off);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          mma16816<kBf16>(sh[0][j], a, qh[j][ks][0], qh[j][ks][1]);
          mma16816<kBf16>(sl[0][j], a, ql[j][ks][0], ql[j][ks][1]);
        }
        if constexpr (ROPE) {  // + K_lo q_hi: the rotated keys' rounding remainder
          uint32_t al[4];
          ldsm_x4(al, smem_addr(S::rope_lo(smem, warp)) + off);
#pragma unroll
          for (int j = 0; j < NT; ++j) mma16816<kBf16>(sl[0][j], al, qh[j][ks][0], qh[j][ks][1]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int e = x >> 1;  // which of the thread's tokens
        float v = 0.0f;
#pragma unroll
        for (int c = 0; c < KB; ++c) v = fmaf(sh[c][j][x] + sl[c][j][x], ksc[c][e], v);
        bool seen = vis[e];
        if (seen && need_pos) {
          const int qp = qpos[j][x & 1];
          if (p.causal && kpos[e] > qp) seen = false;
          if (p.window > 0 && static_cast<int64_t>(qp) - kpos[e] >= p.window) seen = false;
        }
        s[j][x] = seen ? v * sl2 : math::neg_inf_f32();
      }
  }

  // ---- softmax: online softmax per column (max over the 16 tokens: 2 here, 8 lanes of equal
  // t), FP8 V reference scales, O rescaled when a column's max or a V reference moved.
  __device__ __forceinline__ void softmax(const float (&s)[NT][4], const float (&vsc)[SB][2], float (&pw)[NT][4]) {
    float rs[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // fmaxf (one FMNMX) and the SFU's exp2 (denormal results flushed: a weight below
        // 2^-126 of the column max changes no f32 sum) instead of the portable forms: ~30
        // fewer instructions a step in a kernel bound by issue.
        float mx = fmaxf(s[j][e], s[j][2 + e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float mn = fmaxf(mcol[j][e], mx);
        rs[j][e] = math::softmax_rescale(mcol[j][e], mn, Exp2Ftz{});
        mcol[j][e] = mn;
        pw[j][e] = math::softmax_weight(s[j][e], mn, Exp2Ftz{});
        pw[j][2 + e] = math::softmax_weight(s[j][2 + e], mn, Exp2Ftz{});
        lcol[j][e] = lcol[j][e] * rs[j][e] + pw[j][e] + pw[j][2 + e];
      }
    // FP8: V's reference scale per block grows to the tile's largest live scale.
    // rn is the same in every lane (a warp max), so the divisions run only on the warp-uniform
    // path where the reference grows: a few early tiles, not every step.
    float vfac[SB];
#pragma unroll
    for (int c = 0; c < SB; ++c) {
      vfac[c] = 1.0f;
      if constexpr (kFp8) {
        float mx = fmaxf(fabsf(vsc[c][0]), fabsf(vsc[c][1]));  // |P'| <= 1 for any sign
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float rn = fmaxf(vref[c], mx);
        if (rn != vref[c]) {
          vfac[c] = vref[c] > 0.0f ? vref[c] / rn : 1.0f;
          vinv[c] = rn > 0.0f ? 1.0f / rn : 0.0f;
          vref[c] = rn;
        }
      }
    }
    // Rescale O only when some column's max or some V reference moved (early tiles, mostly):
    // factors of exactly 1 would leave it unchanged anyway.
    bool moved = false;
#pragma unroll
    for (int j = 0; j < NT; ++j) moved = moved || rs[j][0] != 1.0f || rs[j][1] != 1.0f;
#pragma unroll
    for (int c = 0; c < SB; ++c) moved = moved || vfac[c] != 1.0f;
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < S::kKSteps; ++mt) {
        const float f = vfac[kFp8 ? mt / 4 : 0];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float f0 = rs[j][0] * f, f1 = rs[j][1] * f;
          o[mt][j][0] *= f0, o[mt][j][1] *= f1, o[mt][j][2] *= f0, o[mt][j][3] *= f1;
        }
      }
    }
  }

  // ---- hide_dead_values: hidden keys weigh 0, but 0 * NaN is NaN: a dead cell's V bytes (never
  // written) must not reach the mma. Rare (dead cells, the tail tile), so zero those rows in place.
  __device__ __forceinline__ void hide_dead_values(unsigned char* st, const bool (&vis)[2]) const {
    if (__any_sync(0xffffffffu, !(vis[0] && vis[1]))) {
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (!vis[e])
          for (int c = t; c < S::kChunks; c += 4)
            *reinterpret_cast<uint4*>(st + S::kTileBytes + swz<S::kChunks>(g + 8 * e, c)) = make_uint4(0, 0, 0, 0);
      __syncwarp();
    }
  }

  // ---- p_fragments: P^T as B fragments: lane (g, t) needs tokens 2t, 2t+1, 2t+8, 2t+9 of column
  // 8j + g, held by lanes 8t + g/2 (tokens 2t, 2t+8) and 8t + 4 + g/2 (tokens 2t+1, 2t+9).
  __device__ __forceinline__ void p_fragments(const float (&pw)[NT][4], const float (&vsc)[SB][2], uint32_t (&ph)[SB][NT][2],
                                             uint32_t (&pl)[SB][NT][2]) const {
    const int src_a = 8 * t + g / 2, src_b = src_a + 4;
    const uint32_t sel = (g & 1) ? 0x7632u : 0x5410u;  // the high or low halves of both words
#pragma unroll
    for (int c = 0; c < SB; ++c)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float w[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) w[x] = kFp8 ? pw[j][x] * (vsc[c][x >> 1] * vinv[c]) : pw[j][x];
        uint32_t h01, l01, h23, l23;
        split2<kBf16>(w[0], w[1], h01, l01);  // token g, columns 2t, 2t+1
        split2<kBf16>(w[2], w[3], h23, l23);  // token g + 8
        ph[c][j][0] = __byte_perm(__shfl_sync(0xffffffffu, h01, src_a), __shfl_sync(0xffffffffu, h01, src_b), sel);
        ph[c][j][1] = __byte_perm(__shfl_sync(0xffffffffu, h23, src_a), __shfl_sync(0xffffffffu, h23, src_b), sel);
        pl[c][j][0] = __byte_perm(__shfl_sync(0xffffffffu, l01, src_a), __shfl_sync(0xffffffffu, l01, src_b), sel);
        pl[c][j][1] = __byte_perm(__shfl_sync(0xffffffffu, l23, src_a), __shfl_sync(0xffffffffu, l23, src_b), sel);
      }
  }

  // ---- accumulate_pv: O^T += V^T P^T
  __device__ __forceinline__ void accumulate_pv(unsigned v_s, const uint32_t (&ph)[SB][NT][2], const uint32_t (&pl)[SB][NT][2]) {
    if constexpr (kFp8) {
      // matrices: (tokens 0-7, chunk cc), (tokens 8-15, cc), (tokens 0-7, cc+1), (tokens 8-15, cc+1);
      // chunk = 16 dims = one m-tile. After the byte permute: low pair = dim 2g, high = 2g + 1.
#pragma unroll
      for (int cc = 0; cc < S::kChunks; cc += 2) {
        uint32_t r[4];
        ldsm_x4_t(r, v_s + swz<S::kChunks>((mi & 1) * 8 + mr, cc + mi / 2));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t lo_tok = __byte_perm(r[2 * h], 0, 0x3120), hi_tok = __byte_perm(r[2 * h + 1], 0, 0x3120);
          const uint32_t a[4] = {e4m3x2_to_f16x2(lo_tok), e4m3x2_hi_to_f16x2(lo_tok), e4m3x2_to_f16x2(hi_tok),
                                 e4m3x2_hi_to_f16x2(hi_tok)};
          const int mt = cc + h, c = mt / 4;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma16816<false>(o[mt][j], a, ph[c][j][0], ph[c][j][1]);
            mma16816<false>(o[mt][j], a, pl[c][j][0], pl[c][j][1]);
          }
        }
      }
    } else {
      // matrices: (tokens 0-7, chunk 2mt), (tokens 0-7, 2mt+1), (tokens 8-15, 2mt), (tokens 8-15, 2mt+1)
#pragma unroll
      for (int mt = 0; mt < S::kKSteps; ++mt) {
        uint32_t a[4];
        ldsm_x4_t(a, v_s + swz<S::kChunks>((mi / 2) * 8 + mr, 2 * mt + (mi & 1)));
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          mma16816<kBf16>(o[mt][j], a, ph[0][j][0], ph[0][j][1]);
          mma16816<kBf16>(o[mt][j], a, pl[0][j][0], pl[0][j][1]);
        }
      }
    }
  }

  // ---- merge_and_write: merge the warps in shared memory and write the normalized partial (or,
  // with one split and no sinks, the output itself).
  __device__ __forceinline__ void merge_and_write() {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        lcol[j][e] += __shfl_xor_sync(0xffffffffu, lcol[j][e], 4);
        lcol[j][e] += __shfl_xor_sync(0xffffffffu, lcol[j][e], 8);
        lcol[j][e] += __shfl_xor_sync(0xffffffffu, lcol[j][e], 16);
      }
    __syncthreads();  // every warp is done with its pipeline stages
    constexpr int kRS = S::kRedStride;
    float* red = reinterpret_cast<float*>(smem);  // [kWarps][kN][kRS]
    float* ml = red + kWarps * kN * kRS;          // [kWarps][kN][2]: m, l
#pragma unroll
    for (int mt = 0; mt < S::kKSteps; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float* col = red + (warp * kN + 8 * j + 2 * t) * kRS;  // column 8j + 2t; + kRS: 8j + 2t + 1
        if constexpr (kFp8) {  // elements e, e + 2 hold adjacent dims (out_dim<true>): one 8-byte store
          const float f = vref[mt / 4 % SB];
#pragma unroll
          for (int e = 0; e < 2; ++e)
            *reinterpret_cast<float2*>(col + e * kRS + out_dim<true>(mt, e, g)) = make_float2(o[mt][j][e] * f, o[mt][j][e + 2] * f);
        } else {
#pragma unroll
          for (int x = 0; x < 4; ++x) col[(x & 1) * kRS + out_dim<false>(mt, x, g)] = o[mt][j][x];
        }
      }
    if (g == 0)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          ml[(warp * kN + 8 * j + 2 * t + e) * 2] = mcol[j][e];
          ml[(warp * kN + 8 * j + 2 * t + e) * 2 + 1] = lcol[j][e];
        }
    __syncthreads();
    const bool direct = writes_output_directly(p);
    const int inv = small_div_inverse(chunk_heads);
    // Per column, once: the warps' rescale factors and the summed l (and the partial's lse), by
    // kWarps lanes a column (thread n * kWarps + w: warp w's state), reduced by shuffles. One
    // thread a column looping over the warps took ~0.5 us of a 16-warp CTA's epilogue, and every
    // thread per element ~2 us before that (decode_trace).
    static_assert(kN * kWarps % 32 == 0 && 32 % kWarps == 0, "whole warps of whole column groups");
    float* fw = ml + kWarps * kN * 2;  // [kWarps][kN] factors, then [kN] l
    if (tid < kN * kWarps) {
      const int n = tid / kWarps, w = tid % kWarps;
      const float m_w = ml[(w * kN + n) * 2];
      float mx = m_w;
#pragma unroll
      for (int x = kWarps / 2; x > 0; x >>= 1) mx = math::max_f32(mx, __shfl_xor_sync(0xffffffffu, mx, x));
      const float f = math::softmax_rescale(m_w, mx);
      fw[w * kN + n] = f;
      float l = ml[(w * kN + n) * 2 + 1] * f;
#pragma unroll
      for (int x = kWarps / 2; x > 0; x >>= 1) l += __shfl_xor_sync(0xffffffffu, l, x);
      if (w == 0) {
        fw[kWarps * kN + n] = l;
        const int rr = small_div(n, inv), gg = n - rr * chunk_heads;  // query row row + rr, head h0 + gg
        if (!direct && rr < n_r && gg < n_h)
          p.lse_part[(int64_t{row + rr} * p.n_q_heads + h0 + gg) * p.num_splits + split] =
              l > 0.0f ? mx + math::log2_f32(l) : math::neg_inf_f32();
      }
    }
    __syncthreads();
    trace_mark<kTrace, W>(trace, kTraceWarpsMerged);
#pragma unroll
    for (int u = 0; u < kElemsPerThread; ++u) {
      const int i = tid + u * kThreads, n = i / HD, d = i % HD;
      const int rr = small_div(n, inv), gg = n - rr * chunk_heads;  // query row row + rr, head h0 + gg
      if (!(rr < n_r && gg < n_h)) continue;
      float acc = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) acc += red[(w * kN + n) * kRS + d] * fw[w * kN + n];
      const float l = fw[kWarps * kN + n];
      const float val = l > 0.0f ? acc / l : 0.0f;
      if (direct) {  // one split, no sinks: the merge would copy val unchanged (weight exactly 1)
        store_q_elem(p.out, int64_t{row + rr} * p.out_row_stride + int64_t{h0 + gg} * p.out_head_stride + d, p.out_elem, val);
        continue;
      }
      p.o_part[((int64_t{row + rr} * p.n_q_heads + h0 + gg) * p.num_splits + split) * HD + d] = val;
    }
    trace_mark<kTrace, W>(trace, kTraceWritten);
  }
};

template <int HD, math::KvElem KV, bool ROPE, int NT, Path PATH, int W>
__device__ __forceinline__ void decode_body(const PagedAttentionParams& p, unsigned char* smem, int row, int split, int kvh,
                                            int chunk, int chunk_heads, unsigned long long* trace) {
  DecodeCta<HD, KV, ROPE, NT, PATH, W> cta(p, smem, row, split, kvh, chunk, chunk_heads, trace);
  cta.run();
}

// CTA numbering. Head-major: the kv heads (and chunks) of one (row, split) get consecutive
// CTA ids, so they run at the same time and read the same pages (a page holds every head
// of its tokens) and the same scale sectors, instead of one head's rows 2 KB apart.
struct CtaOrder {
  int gx = 1;  // rows x splits
  int gy = 1;  // kv heads x chunks
  bool head_major = true;
  bool fat = false;                     // launch ops::kFatWarps-warp CTAs where built (decode_fat_ctas.hpp)
  unsigned long long* trace = nullptr;  // Path::LeanTrace only
};

// The CTAs launch() runs for this call, `chunks` head chunks a kv head (attention_mma.cu);
// fat_ctas as AttentionTuning::fat_ctas.
CtaOrder cta_order_for(const PagedAttentionParams& p, int chunks, bool fat_ctas);

template <int HD, math::KvElem KV, bool ROPE, int NT, Path PATH, int W = kWarpsDefault>
__global__ void __launch_bounds__(32 * W, (Shape<HD, KV, ROPE, NT, W>::kMinBlocks))
    mma_decode_kernel(const PagedAttentionParams p, int chunks, int chunk_heads, CtaOrder order) {
  extern __shared__ __align__(16) unsigned char smem[];
  // Launched as a programmatic dependent (launch_nt): CTAs may start while the stream's previous
  // kernel drains; nothing global is read before that kernel is complete and visible.
  kvcore::ops::cuda::pdl_wait();
  // One flat grid of (row x split) x (kv head x chunk) CTAs; see CtaOrder for the order.
  const int64_t idx = blockIdx.x;
  const int x = static_cast<int>(order.head_major ? idx / order.gy : idx % order.gx);
  const int y = static_cast<int>(order.head_major ? idx % order.gy : idx / order.gx);
  const int row = x / p.num_splits, split = x % p.num_splits;
  const int kvh = y / chunks, chunk = y % chunks;
  decode_body<HD, KV, ROPE, NT, PATH, W>(p, smem, row, split, kvh, chunk, chunk_heads, order.trace);
  // This CTA's partials are written: the merge kernel (a programmatic dependent) may launch.
  kvcore::ops::cuda::pdl_allow_dependents();
}

}  // namespace kvcore::ops::cuda::mma_attn
