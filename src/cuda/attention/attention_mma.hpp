// Host interface of the tensor-core decode kernel (attention_mma.cu).
#pragma once
#include <cuda_runtime.h>

#include "ops/attention_params.hpp"
#include "ops/decode_fat_ctas.hpp"

namespace kvcore::ops::cuda::mma_attn {

// Head dims 64 / 128 with 16-bit or FP8 pages, kernel_variant 0 (automatic) or 3.
bool serves_shape(int head_dim, math::KvElem kv, int kernel_variant);
// serves_shape, rope on read in whole 8-dim chunks (rope_chunk_aligned), metadata arrays
// word-aligned.
bool serves(const PagedAttentionParams& p);
int heads_per_cta(int group);
// Fat CTAs (ops::kFatWarps warps, one an SM; see kWarpsDefault in attention_mma.cuh) may serve
// this call's shape (ops::fat_decode_shape; AttentionTuning::fat_ctas may still say no). Which
// grids take them (ops::fat_decode_grid) and the split count planned for them:
// src/ops/decode_fat_ctas.hpp.
bool fat_decode_allowed(math::KvElem kv, bool rope_on_read, int group);
int blocks_per_sm(int head_dim, math::KvElem kv, bool rope_on_read, int group);
void launch(const PagedAttentionParams& p, const AttentionTuning& tuning, cudaStream_t stream);
// With one split and no sink logits the kernel writes the output itself (the merge would
// copy it unchanged: its weight is exactly 1) and no merge kernel runs.
KVCORE_HD bool writes_output_directly(const PagedAttentionParams& p) {
  return p.num_splits == 1 && p.maybe_sinks == nullptr;
}

}  // namespace kvcore::ops::cuda::mma_attn
