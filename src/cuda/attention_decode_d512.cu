// Paged attention kernels for head_dim 512 (one file per head_dim keeps builds parallel).
#include "cuda/attention_decode.cuh"

namespace kvcore::ops::cuda::attn {

template <int HD, math::KvElem KV, int G>
static void launch_v(const PagedAttentionParams& p, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  if constexpr (has_async<HD, KV>()) {
    if (p.kernel_variant != 1) return launch_paged<HD, KV, G, true>(p, chunks, grid, stream, q);
  }
  launch_paged<HD, KV, G, false>(p, chunks, grid, stream, q);
}

template <int HD, math::KvElem KV>
static void launch_g(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  if (G == 1) return launch_v<HD, KV, 1>(p, chunks, grid, stream, q);
  if constexpr (max_heads_per_cta(HD, KV) >= 4) {
    if (G == 4) return launch_v<HD, KV, 4>(p, chunks, grid, stream, q);
  }
  if constexpr (max_heads_per_cta(HD, KV) == 8) {
    if (G == 8) return launch_v<HD, KV, 8>(p, chunks, grid, stream, q);
  }
  if constexpr (max_heads_per_cta(HD, KV) == 2) {
    if (G == 2) return launch_v<HD, KV, 2>(p, chunks, grid, stream, q);
  }
  throw Error(ErrorCode::NotSupported, detail::concat("attention: no kernel for ", G, " heads per CTA at head_dim ", HD));
}

template <>
void launch_paged_hd<512>(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* q) {
  switch (p.kv_elem) {
    case math::KvElem::F32: return launch_g<512, math::KvElem::F32>(p, G, chunks, grid, stream, q);
    case math::KvElem::F16: return launch_g<512, math::KvElem::F16>(p, G, chunks, grid, stream, q);
    case math::KvElem::BF16: return launch_g<512, math::KvElem::BF16>(p, G, chunks, grid, stream, q);
    case math::KvElem::E4M3: return launch_g<512, math::KvElem::E4M3>(p, G, chunks, grid, stream, q);
  }
}

}  // namespace kvcore::ops::cuda::attn
