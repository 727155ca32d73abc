// Llama-3-8B paged K/V for the attention benches (bench/attention_bench.cpp, bench/decode_trace.cu):
// 32 q heads, 8 kv heads, head_dim 128, blocks of 16; f16 or FP8 (per-64 UE8M0) pools of random
// finite values tiled from a host pattern (block b holds the pattern at b * block bytes mod its
// size, so a check can rebuild any sequence on the host), `copies` shuffled block tables over
// disjoint blocks (a fragmented pool; calls rotate among them so no call finds the last one's
// bytes in L2), rope-on-read positions, table and query positions when asked, and q / out.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kvcore/kvcore.hpp"
#include "kvcore/ops/attention.hpp"

namespace kvcore::cli::llama8b {

constexpr int64_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;

// Bytes of K and V (and scales) a decode call reads for `batch` sequences of `ctx` tokens.
double kv_bytes(int64_t batch, int64_t ctx, bool fp8);

// A random host pattern tiled over a device buffer.
struct Tiled {
  std::vector<uint8_t> pattern;
  Buffer dev;
};

struct Pages {
  int64_t batch = 0, ctx = 0, copies = 0, blocks_per_seq = 0, num_blocks = 0;
  bool fp8 = false, rope = false;
  Tiled k, v, ks, vs;
  Buffer pos, valid;                          // rope-on-read: positions = index in the sequence, every cell live
  Buffer qpos;                                // rope-on-read: each query at position ctx
  std::unique_ptr<math::RopeTable> rope_table;  // rope-on-read: Llama-3-8B's (kv.maybe_rope points here)
  std::vector<std::vector<int32_t>> indices;  // per copy: [batch * blocks_per_seq]
  std::vector<Buffer> indices_dev;
  Buffer indptr, lpl, q, out;
  PagedKV kv;                     // views of the buffers above
  std::vector<BlockTable> tables; // one per copy
  std::vector<AttentionStep> steps;  // one per copy: its table (and query positions with rope on read)
  TensorRef q_ref, out_ref;       // f32 [batch, kQHeads, kHeadDim]
};

Pages make_pages(Device d, int64_t batch, int64_t ctx, bool fp8, bool rope, int64_t copies);

}  // namespace kvcore::cli::llama8b
