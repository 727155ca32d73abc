// Launchers of the tensor-core decode kernel (attention_mma.cuh): which calls it
// serves, its occupancy for the split-K choice, and the launch.
#include "cuda/attention/attention_mma.cuh"
#include "cuda/attention/attention_mma.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/pdl.cuh"
#include "ops/attention_tuning.hpp"

namespace kvcore::ops::cuda::mma_attn {

namespace {

template <int HD, math::KvElem KV, bool ROPE, int NT, Path PATH = Path::General, int W = kWarpsDefault>
void launch_nt(const PagedAttentionParams& p, CtaOrder grid, int chunks, int chunk_heads, cudaStream_t stream,
               int* blocks_per_sm, bool pdl) {
  using K = Shape<HD, KV, ROPE, NT, W>;
  constexpr auto kernel = mma_decode_kernel<HD, KV, ROPE, NT, PATH, W>;
  smem_opt_in(kernel, K::kSmemBytes, p.device);
  if (blocks_per_sm) {
    KVCORE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, K::kThreads, K::kSmemBytes));
    return;
  }
  const unsigned n_ctas = static_cast<unsigned>(int64_t{grid.gx} * grid.gy);
  // A programmatic dependent of the stream's previous kernel (the kernel waits for it before any
  // global read): its launch and CTA set-up overlap that kernel's drain (AttentionTuning::pdl).
  if (pdl) {
    kvcore::ops::cuda::launch_dependent(kernel, dim3(n_ctas), dim3(K::kThreads), K::kSmemBytes, stream, p, chunks, chunk_heads, grid);
  } else {
    kernel<<<n_ctas, K::kThreads, K::kSmemBytes, stream>>>(p, chunks, chunk_heads, grid);
    KVCORE_CUDA_CHECK_LAUNCH("mma_decode_kernel");
  }
}

// 8 query columns per CTA for decode with up to 8 heads per kv head; else 16 (prefill packs
// 16 / heads rows). FP8 decode without rope on read runs fat CTAs when the launch asks
// (grid.fat: fat_decode_allowed and ops::fat_decode_grid).
template <int HD, math::KvElem KV, bool ROPE, Path PATH = Path::General>
void launch_one(const PagedAttentionParams& p, CtaOrder grid, int chunks, int chunk_heads, cudaStream_t stream,
                int* blocks_per_sm, bool pdl) {
  if (chunk_heads <= 8 && !p.maybe_qo_indptr) {
    if constexpr (KV == math::KvElem::E4M3 && !ROPE)
      if (grid.fat)
        return launch_nt<HD, KV, ROPE, 1, PATH, ops::kFatWarps>(p, grid, chunks, chunk_heads, stream, blocks_per_sm, pdl);
    return launch_nt<HD, KV, ROPE, 1, PATH>(p, grid, chunks, chunk_heads, stream, blocks_per_sm, pdl);
  }
  launch_nt<HD, KV, ROPE, 2, PATH>(p, grid, chunks, chunk_heads, stream, blocks_per_sm, pdl);
}

// The lean kernel serves calls that use none of the general features (see Path).
bool lean_call(const PagedAttentionParams& p) {
  return !p.causal && p.window <= 0 && p.maybe_valid == nullptr && !p.rope_on_read &&
         (p.kv_elem != math::KvElem::E4M3 || p.scale_mode == math::KvScaleMode::Ue8m0Per64);
}

template <int HD, math::KvElem KV>
void launch_rope(const PagedAttentionParams& p, CtaOrder grid, int chunks, int chunk_heads, cudaStream_t stream, int* bps,
                 bool pdl) {
  if (p.rope_on_read) return launch_one<HD, KV, true>(p, grid, chunks, chunk_heads, stream, bps, pdl);
  if (lean_call(p)) return launch_one<HD, KV, false, Path::Lean>(p, grid, chunks, chunk_heads, stream, bps, pdl);
  launch_one<HD, KV, false>(p, grid, chunks, chunk_heads, stream, bps, pdl);
}

template <int HD>
void launch_hd(const PagedAttentionParams& p, CtaOrder grid, int chunks, int chunk_heads, cudaStream_t stream, int* bps,
               bool pdl) {
  switch (p.kv_elem) {
    case math::KvElem::F16: return launch_rope<HD, math::KvElem::F16>(p, grid, chunks, chunk_heads, stream, bps, pdl);
    case math::KvElem::BF16: return launch_rope<HD, math::KvElem::BF16>(p, grid, chunks, chunk_heads, stream, bps, pdl);
    case math::KvElem::E4M3: return launch_rope<HD, math::KvElem::E4M3>(p, grid, chunks, chunk_heads, stream, bps, pdl);
    case math::KvElem::F32: break;
  }
  throw Error(ErrorCode::NotSupported, "mma attention: f32 pages are not served");
}

void dispatch(const PagedAttentionParams& p, CtaOrder grid, int chunks, int chunk_heads, cudaStream_t stream, int* bps,
              bool pdl) {
  if (p.layout.head_dim == 64) return launch_hd<64>(p, grid, chunks, chunk_heads, stream, bps, pdl);
  return launch_hd<128>(p, grid, chunks, chunk_heads, stream, bps, pdl);
}

bool aligned4(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 == 0; }

}  // namespace

bool serves_shape(int head_dim, math::KvElem kv, int kernel_variant) {
  return (kernel_variant == 0 || kernel_variant == 3) && (head_dim == 64 || head_dim == 128) && kv != math::KvElem::F32;
}

bool serves(const PagedAttentionParams& p) {
  if (!serves_shape(p.layout.head_dim, p.kv_elem, p.kernel_variant) || p.v_head_dim != p.layout.head_dim) return false;
  // V rows indexed as K's: a V pool of its own, not rows of a wider one (MLA's latent).
  if (p.v_row_stride != p.v_head_dim || p.v_scale_row_stride != p.v_head_dim / 64) return false;
  if (p.rope_on_read && !rope_chunk_aligned(p.rope.layout)) return false;  // rotated in 8-dim chunks
  // Byte metadata (valid flags, UE8M0 scales) is copied as the aligned 4-byte word holding
  // it: the arrays must start word-aligned and span whole words (no read past their end).
  const int64_t cells = int64_t{p.num_blocks} * p.layout.block_size;
  // The kernel indexes pools in 32-bit 16-byte chunks (~0 marks "no row").
  const int64_t row_bytes = int64_t{p.layout.head_dim} * (p.kv_elem == math::KvElem::E4M3 ? 1 : 2);
  if (cells * p.layout.n_kv_heads * (row_bytes / 16) >= (int64_t{1} << 32) - 1) return false;
  if (p.maybe_valid && !(aligned4(p.maybe_valid) && cells % 4 == 0)) return false;
  if (p.kv_elem == math::KvElem::E4M3 && p.scale_mode == math::KvScaleMode::Ue8m0Per64 &&
      !(aligned4(p.maybe_k_scale_u8) && aligned4(p.maybe_v_scale_u8) &&
        cells * p.layout.n_kv_heads * (p.layout.head_dim / 64) % 4 == 0))
    return false;
  return true;
}

int heads_per_cta(int group) { return group < 16 ? group : 16; }

bool fat_decode_allowed(math::KvElem kv, bool rope_on_read, int group) {
  return ops::fat_decode_shape(kv == math::KvElem::E4M3, rope_on_read, heads_per_cta(group));
}

int blocks_per_sm(int head_dim, math::KvElem kv, bool rope_on_read, int group) {
  PagedAttentionParams q{};
  q.layout.head_dim = head_dim;
  q.kv_elem = kv;
  q.rope_on_read = rope_on_read;
  int n = 0;
  dispatch(q, CtaOrder{}, 1, heads_per_cta(group), nullptr, &n, false);  // (4-warp CTAs: CtaOrder::fat is off)
  return n;
}

CtaOrder cta_order_for(const PagedAttentionParams& p, int chunks, bool fat_ctas) {
  const int64_t gx = int64_t{p.n_rows} * p.num_splits;
  const int64_t gy = int64_t{p.layout.n_kv_heads} * chunks;
  require_arg(gx * gy < (int64_t{1} << 31), "attention: grid too large (rows x splits ", gx, ", kv heads x chunks ",
              gy, ")");
  CtaOrder order{static_cast<int>(gx), static_cast<int>(gy), true};
  order.fat = fat_ctas && !p.maybe_qo_indptr && fat_decode_allowed(p.kv_elem, p.rope_on_read != 0, p.group) &&
              fat_decode_grid(gx * gy, sm_count(p.device), p.max_seq_cells, p.num_splits);
  return order;
}

void launch(const PagedAttentionParams& p, const AttentionTuning& tuning, cudaStream_t stream) {
  const int chunk_heads = heads_per_cta(p.group);
  const int chunks = (p.group + chunk_heads - 1) / chunk_heads;
  dispatch(p, cta_order_for(p, chunks, tuning.fat_ctas), chunks, chunk_heads, stream, nullptr, tuning.pdl);
}

}  // namespace kvcore::ops::cuda::mma_attn
