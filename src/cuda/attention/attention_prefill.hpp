// Host interface of the tensor-core prefill kernel (attention_prefill.cu).
#pragma once
#include <cuda_runtime.h>

#include "ops/attention_params.hpp"

namespace kvcore::ops::cuda::prefill_attn {

// Causal prefill (qo_indptr set) over f16 / bf16 pages with head_dim 64 or 128, no rope on
// read, and rows enough to fill the GPU without split-K (kernel_variant 4: any size).
bool serves(const PagedAttentionParams& p, int sm_count);
int heads_per_cta(int group);
void launch(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace kvcore::ops::cuda::prefill_attn
