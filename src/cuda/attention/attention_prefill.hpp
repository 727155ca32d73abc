// Host interface of the tensor-core prefill kernel (attention_prefill.cu).
#pragma once
#include <cuda_runtime.h>

#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::prefill_attn {

// Causal prefill (qo_indptr set) over f16 / bf16 pages with head_dim 64 or 128, no rope on
// read, and rows enough to fill the GPU without split-K (kernel_variant 4: any size).
bool serves(const PagedAttentionParams& p, int sm_count);
int heads_per_cta(int group);
// The calls a prefill kernel of this family takes (this one and the wgmma ones,
// prefill_wgmma.hpp): causal with qo_indptr and positions, stored RoPE, f16 / bf16 pages,
// head_dim 64 or 128 = v_head_dim with V rows of their own, valid bytes readable as 4-byte words.
bool call_fits(const PagedAttentionParams& p);
// Rows enough to fill the GPU without split-K: a warp per 16 rows and head of a CTA's chunk.
bool fills_gpu(const PagedAttentionParams& p, int sm_count);
void launch(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace kvcore::ops::cuda::prefill_attn
