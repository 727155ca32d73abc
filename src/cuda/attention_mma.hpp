// Host interface of the tensor-core decode kernel (attention_mma.cu).
#pragma once
#include <cuda_runtime.h>

#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::mma_attn {

// Head dims 64 / 128 with 16-bit or FP8 pages, kernel_variant 0 (automatic) or 3.
bool serves_shape(int head_dim, math::KvElem kv, int kernel_variant);
// serves_shape, rope on read in whole 8-dim chunks (rope_chunk_aligned), metadata arrays
// word-aligned.
bool serves(const PagedAttentionParams& p);
int heads_per_cta(int group);
// Fat CTAs (kFatWarps warps, one an SM; see kWarpsDefault in attention_mma.cuh) for FP8 decode
// without rope on read, up to 8 heads a kv head, when each CTA gets >= kFatMinCells cells
// (max_seq_cells / splits) and the grid is one wave of them (ctas <= sms) or the CTAs are
// so long (>= kFatWaveCells) that a wave's start-up is noise: a fat CTA's start-up is not
// hidden behind other CTAs of its SM (GPU A/B runs X, Y of 2026-12-04: batch 16 / 8k -7.5%,
// batch 64 / 128k -3 to -8%; batch 64 / 8k +3%, batch 1 / 8k +4%). The split choice
// (attention_choose_splits) plans for it.
constexpr int kFatWarps = 16;
constexpr int64_t kFatMinCells = 2048;
constexpr int64_t kFatWaveCells = 65536;
bool fat_decode(math::KvElem kv, bool rope_on_read, int group, int64_t ctas, int sms, int64_t max_seq_cells,
                int splits);
int blocks_per_sm(int head_dim, math::KvElem kv, bool rope_on_read, int group);
void launch(const PagedAttentionParams& p, cudaStream_t stream);
// With one split and no sink logits the kernel writes the output itself (the merge would
// copy it unchanged: its weight is exactly 1) and no merge kernel runs.
KVCORE_HD bool writes_output_directly(const PagedAttentionParams& p) {
  return p.num_splits == 1 && p.maybe_sinks == nullptr;
}

}  // namespace kvcore::ops::cuda::mma_attn
