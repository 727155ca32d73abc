// Launcher of the tensor-core prefill kernel (attention_prefill.cuh): which calls it serves.
#include "cuda/attention/attention_prefill.cuh"
#include "cuda/attention/attention_prefill.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"

namespace kvcore::ops::cuda::prefill_attn {

namespace {

// One key pass a tile (two passes measured slower on every prefill case: bench/results).
template <int HD, bool BF16, bool QSPLIT, bool PSPLIT>
void launch_kernel(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr int PASSES = 1;
  constexpr int RB = 2;  // 32 rows a CTA: with 16, each K/V tile serves half the rows per load
  using S = Shape<HD, QSPLIT, RB>;
  smem_opt_in(prefill_kernel<HD, BF16, QSPLIT, PSPLIT, RB, PASSES>, S::kSmemBytes, p.device);
  const int chunk_heads = heads_per_cta(p.group);
  const int chunks = (p.group + chunk_heads - 1) / chunk_heads;
  // Row blocks, then one CTA a sequence for rows before its first block boundary.
  const int64_t ctas = prefill_row_block_ctas(p.n_rows, p.batch, S::kRows);
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(p.layout.n_kv_heads * chunks));
  prefill_kernel<HD, BF16, QSPLIT, PSPLIT, RB, PASSES><<<grid, S::kThreads, S::kSmemBytes, stream>>>(p, chunk_heads);
  KVCORE_CUDA_CHECK_LAUNCH("prefill_kernel");
}

// q exact in the page type: f16 q with f16 pages, bf16 q with bf16 pages.
template <int HD, bool BF16>
void launch_q(const PagedAttentionParams& p, cudaStream_t stream) {
  const bool q_exact = p.q_elem == (BF16 ? QElem::BF16 : QElem::F16);
  const bool p_split = p.out_elem == QElem::F32;
  if (q_exact) return p_split ? launch_kernel<HD, BF16, false, true>(p, stream) : launch_kernel<HD, BF16, false, false>(p, stream);
  return p_split ? launch_kernel<HD, BF16, true, true>(p, stream) : launch_kernel<HD, BF16, true, false>(p, stream);
}

bool aligned4(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 == 0; }

}  // namespace

int heads_per_cta(int group) { return group < kHeads ? group : kHeads; }

bool call_fits(const PagedAttentionParams& p) {
  if (!p.maybe_qo_indptr || !p.causal || p.rope_on_read || !p.maybe_positions || !p.maybe_q_positions) return false;
  if (!(p.kv_elem == math::KvElem::F16 || p.kv_elem == math::KvElem::BF16)) return false;
  if (!(p.layout.head_dim == 64 || p.layout.head_dim == 128) || p.v_head_dim != p.layout.head_dim) return false;
  if (p.v_row_stride != p.v_head_dim) return false;  // V rows indexed as K's (not rows of a wider pool)
  // Valid bytes are copied as the aligned 4-byte word holding them.
  const int64_t cells = int64_t{p.num_blocks} * p.layout.block_size;
  return !p.maybe_valid || (aligned4(p.maybe_valid) && cells % 4 == 0);
}

bool fills_gpu(const PagedAttentionParams& p, int sm_count) {
  const int chunk_heads = heads_per_cta(p.group);
  const int64_t blocks16 = int64_t{p.n_rows} / 16 * p.layout.n_kv_heads * ((p.group + chunk_heads - 1) / chunk_heads);
  return blocks16 >= sm_count;
}

bool serves(const PagedAttentionParams& p, int sm_count) {
  if (!(p.kernel_variant == 0 || p.kernel_variant == 4) || !call_fits(p)) return false;
  return p.kernel_variant == 4 || fills_gpu(p, sm_count);  // 4: asked for (tests), whatever the size
}

void launch(const PagedAttentionParams& p, cudaStream_t stream) {
  require_arg(int64_t{p.n_rows} + p.batch < 2147483647 && p.layout.n_kv_heads * p.group < 65536, "attention prefill: grid too large");
  const bool bf16 = p.kv_elem == math::KvElem::BF16;
  if (p.layout.head_dim == 64) return bf16 ? launch_q<64, true>(p, stream) : launch_q<64, false>(p, stream);
  return bf16 ? launch_q<128, true>(p, stream) : launch_q<128, false>(p, stream);
}

}  // namespace kvcore::ops::cuda::prefill_attn
