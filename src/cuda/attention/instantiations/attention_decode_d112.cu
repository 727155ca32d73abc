// Paged attention kernels for head_dim 112, K and V rows of one width (one file per head-dim
// pair keeps builds parallel).
#include "cuda/attention/attention_decode.cuh"

namespace kvcore::ops::cuda::attn {

template <>
void launch_paged_hd<112, 112>(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  launch_paged_hd_all<112, 112>(p, G, chunks, grid, stream, q);
}

}  // namespace kvcore::ops::cuda::attn
