// Launcher of the wgmma prefill kernel (prefill_wgmma.cuh): which calls it serves. This file
// is compiled for sm_90a only (CMakeLists.txt: kvcore_sm90a); the kernel runs on devices of
// compute capability 9.0 exactly, which serves() checks.
#include <atomic>

#include "cuda/attention/attention_prefill.hpp"
#include "cuda/attention/prefill_wgmma.cuh"
#include "cuda/attention/prefill_wgmma_tma.cuh"
#include "cuda/attention/prefill_wgmma_wide.cuh"
#include "cuda/attention/prefill_wgmma_ws.cuh"
#include "cuda/attention/prefill_wgmma.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/tma.hpp"
#include "kvcore/error.hpp"

namespace kvcore::ops::cuda::prefill_wgmma {

namespace {

// The grid of every variant: row blocks, then one CTA a sequence for rows before its first block
// boundary; kv heads x head chunks (the same heads per CTA as the mma.sync prefill kernel).
dim3 grid_of(const PagedAttentionParams& p, int* chunk_heads) {
  *chunk_heads = prefill_attn::heads_per_cta(p.group);
  const int chunks = (p.group + *chunk_heads - 1) / *chunk_heads;
  const int64_t ctas = prefill_row_block_ctas(p.n_rows, p.batch, kRows);
  return dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(p.layout.n_kv_heads * chunks));
}

// KIND: 5 warp-specialized (a producer warpgroup), 6 every thread copies (one CTA barrier a tile).
template <int HD, bool BF16, int KIND>
void launch_kernel(const PagedAttentionParams& p, cudaStream_t stream) {
  using S = Shape<HD>;
  const auto kernel = KIND == 6 ? prefill_wgmma_kernel<HD, BF16> : prefill_wgmma_ws_kernel<HD, BF16>;
  smem_opt_in(kernel, S::kSmemBytes, p.device);
  int chunk_heads = 0;
  const dim3 grid = grid_of(p, &chunk_heads);
  kernel<<<grid, KIND == 6 ? kConsumerThreads : kWsThreads, S::kSmemBytes, stream>>>(p, chunk_heads);
  KVCORE_CUDA_CHECK_LAUNCH("prefill_wgmma_kernel");
}

// The TMA maps of the K and V pools, boxes of a page or of max_box cells, where they can be made:
// pages of a power-of-two size of at least 8 cells, pools the encoder accepts.
template <int HD>
bool encode_kv_maps(const PagedAttentionParams& p, int max_box, CUtensorMap* k_map, CUtensorMap* v_map) {
  const int bs = p.layout.block_size;
  if (bs < 8 || (bs & (bs - 1)) != 0 || p.num_blocks <= 0) return false;
  const int64_t cells = int64_t{p.num_blocks} * bs;
  const int n_kv = p.layout.n_kv_heads, box = bs < max_box ? bs : max_box;
  return encode_pool_map(k_map, p.k, cells, n_kv, HD, HD, int64_t{n_kv} * HD, box) &&
         encode_pool_map(v_map, p.v, cells, n_kv, HD, p.v_row_stride, int64_t{n_kv} * p.v_row_stride, box);
}

// Variant 7 (prefill_wgmma_tma.cuh; 8 with kPingPong) where its maps can be made. False (nothing
// launched) elsewhere.
template <int HD, bool BF16, bool kPingPong>
bool launch_tma(const PagedAttentionParams& p, cudaStream_t stream) {
  CUtensorMap k_map{}, v_map{};
  if (!encode_kv_maps<HD>(p, kKeys, &k_map, &v_map)) return false;
  const auto kernel = prefill_wgmma_tma_kernel<HD, BF16, kPingPong>;
  smem_opt_in(kernel, tma_smem_bytes<HD>(), p.device);
  int chunk_heads = 0;
  const dim3 grid = grid_of(p, &chunk_heads);
  kernel<<<grid, kWsThreads, tma_smem_bytes<HD>(), stream>>>(p, chunk_heads, k_map, v_map);
  KVCORE_CUDA_CHECK_LAUNCH("prefill_wgmma_tma_kernel");
  return true;
}

// Variant 9 (prefill_wgmma_wide.cuh; 10 with kPingPong) where its maps can be made (boxes of a
// page or of 128 cells). False (nothing launched) elsewhere.
template <int HD, bool BF16, bool kPingPong>
bool launch_wide(const PagedAttentionParams& p, cudaStream_t stream) {
  CUtensorMap k_map{}, v_map{};
  if (!encode_kv_maps<HD>(p, kWideKeys, &k_map, &v_map)) return false;
  const auto kernel = prefill_wgmma_wide_kernel<HD, BF16, kPingPong>;
  smem_opt_in(kernel, WideSmem<HD>::kBytes, p.device);
  int chunk_heads = 0;
  const dim3 grid = grid_of(p, &chunk_heads);
  kernel<<<grid, kWsThreads, WideSmem<HD>::kBytes, stream>>>(p, chunk_heads, k_map, v_map);
  KVCORE_CUDA_CHECK_LAUNCH("prefill_wgmma_wide_kernel");
  return true;
}

template <int HD, bool BF16>
void launch_hd(const PagedAttentionParams& p, cudaStream_t stream) {
  const int variant = p.kernel_variant == 0 ? kAutomaticVariant : p.kernel_variant;
  if (variant == 6) return launch_kernel<HD, BF16, 6>(p, stream);
  if (variant == 7 && launch_tma<HD, BF16, false>(p, stream)) return;
  if (variant == 8 && launch_tma<HD, BF16, true>(p, stream)) return;
  if (variant == 9 && launch_wide<HD, BF16, false>(p, stream)) return;
  if (variant == 10 && launch_wide<HD, BF16, true>(p, stream)) return;
  if (variant >= 9) return launch_kernel<HD, BF16, 6>(p, stream);
  return launch_kernel<HD, BF16, 5>(p, stream);
}

std::atomic<int64_t> g_launches{0};

}  // namespace

bool device_is_sm90(int device) { return compute_capability(device) == 90; }

bool serves(const PagedAttentionParams& p, int sm_count) {
  const bool forced = p.kernel_variant >= 5 && p.kernel_variant <= 10;
  if (!(forced || (kAutomaticVariant != 0 && p.kernel_variant == 0))) return false;
  if (!prefill_attn::call_fits(p)) return false;
  const QElem page = p.kv_elem == math::KvElem::BF16 ? QElem::BF16 : QElem::F16;
  if (p.q_elem != page || p.out_elem == QElem::F32) return false;
  if (!device_is_sm90(p.device)) return false;
  return forced || prefill_attn::fills_gpu(p, sm_count);  // forced (tests, benches): whatever the size
}

int64_t launch_count() { return g_launches.load(); }

void launch(const PagedAttentionParams& p, cudaStream_t stream) {
  g_launches.fetch_add(1);
  require_arg(int64_t{p.n_rows} + p.batch < 2147483647 && p.layout.n_kv_heads * p.group < 65536,
              "attention prefill (wgmma): grid too large");
  const bool bf16 = p.kv_elem == math::KvElem::BF16;
  if (p.layout.head_dim == 64) return bf16 ? launch_hd<64, true>(p, stream) : launch_hd<64, false>(p, stream);
  return bf16 ? launch_hd<128, true>(p, stream) : launch_hd<128, false>(p, stream);
}

}  // namespace kvcore::ops::cuda::prefill_wgmma
