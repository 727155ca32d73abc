// Paged attention kernels for 576-dim K and 512-dim V rows (DeepSeek-V2/V3 MLA with absorbed
// projections: K is the 512-dim latent plus 64 rope dims, V the latent; one file per head-dim
// pair keeps builds parallel).
#include "cuda/attention/attention_decode.cuh"

namespace kvcore::ops::cuda::attn {

template <>
void launch_paged_hd<576, 512>(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  launch_paged_hd_all<576, 512>(p, G, chunks, grid, stream, q);
}

}  // namespace kvcore::ops::cuda::attn
