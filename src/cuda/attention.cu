// Host side of CUDA attention: kernel choice and grid, the split-K merge kernel.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda/attention_decode.cuh"
#include "cuda/attention_merge.cuh"
#include "cuda/attention_mma.hpp"

namespace kvcore::ops::cuda {

int sm_count(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) KVCORE_CUDA_CHECK(cudaDeviceGetAttribute(&cache[device], cudaDevAttrMultiProcessorCount, device));
  return cache[device];
}

namespace attn {

namespace {

constexpr int kMergeThreads = 256;
constexpr int kMergeWarps = kMergeThreads / 32;
constexpr int kMaxSplits = 1024;
constexpr int kMaxMergeDim = 512;

// ROUND: splits a warp loads per round (see below).
template <int ROUND>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const MergeArgs a) {
  __shared__ float w[kMaxSplits];
  __shared__ float part[kMergeWarps][kMaxMergeDim];
  __shared__ float row[kMaxMergeDim];
  __shared__ float inv_s;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the decode kernel: wait here until its
  // partials are complete and visible (a no-op when launched plainly).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int rh = blockIdx.x;
  const int r = rh / a.n_heads, h = rh % a.n_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int hd = a.head_dim;
  const float* lse = a.lse_part + int64_t{rh} * a.splits;
  const float* o = a.o_part + int64_t{rh} * a.splits * hd;
  // Every split's lse is fetched at once (a thread each): one thread reading them one after
  // another waited a round trip per split (12.4 us at 33 splits, batch 1 / 32k, GPU run B).
  for (int i = tid; i < a.splits; i += kMergeThreads) w[i] = lse[i];
  __syncthreads();
  if (tid == 0) {  // same order of operations as the CPU merge
    const float sink = a.maybe_sinks ? a.maybe_sinks[h] * math::kLog2e : math::neg_inf_f32();
    float m = sink;
    for (int i = 0; i < a.splits; ++i) m = math::max_f32(m, w[i]);
    float sum = 0.0f;
    for (int i = 0; i < a.splits; ++i) {
      w[i] = math::partials_weight(w[i], m);
      sum += w[i];
    }
    inv_s = math::partials_inv_denominator(sum, sink, m);
  }
  __syncthreads();
  const float inv = inv_s;
  // Warp k sums splits k, k + 8, ... over every dim (lane: dims lane, lane + 32, ...), ROUND of
  // its splits a round with every load of the round issued first: with ROUND 4 the 8 warps
  // keep 32 splits' partials in flight (run C: one split a round cost an L2 round trip each,
  // ~4 us at 64 splits). ROUND 4 needs ~120 registers (2 CTAs an SM), which slowed the many
  // CTAs of a batch with few splits (run E): those take ROUND 1.
  // Sums stay in split order within a warp; the 8 warp sums are added in warp order.
  constexpr int kSlots = kMaxMergeDim / 32;
  float acc[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) acc[k] = 0.0f;
  for (int i0 = warp; i0 < a.splits; i0 += kMergeWarps * ROUND) {
    float wr[ROUND], v[ROUND][kSlots];
#pragma unroll
    for (int u = 0; u < ROUND; ++u) {
      const int i = i0 + u * kMergeWarps;
      wr[u] = i < a.splits ? w[i] * inv : 0.0f;  // 0: past the end, or an empty split (partial maybe 0 * inf)
      const float* oi = o + int64_t{i} * hd;
#pragma unroll
      for (int k = 0; k < kSlots; ++k) v[u][k] = wr[u] != 0.0f && 32 * k < hd ? oi[lane + 32 * k] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < ROUND; ++u)
      if (wr[u] != 0.0f)
#pragma unroll
        for (int k = 0; k < kSlots; ++k) acc[k] += wr[u] * v[u][k];
  }
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
    if (32 * k < hd) part[warp][lane + 32 * k] = acc[k];
  __syncthreads();
  for (int d = tid; d < hd; d += kMergeThreads) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kMergeWarps; ++k) s += part[k][d];
    row[d] = s;
  }
  __syncthreads();
  if (a.maybe_inverse_rope_pos) {
    const float pos = -static_cast<float>(a.maybe_inverse_rope_pos[r]);
    for (int i = threadIdx.x; i < a.rope.layout.n_pairs(); i += kMergeThreads) {
      float sn, cs;
      math::sincos_f32(math::rope_angle(pos, a.rope.freq[i]), &sn, &cs);
      math::rotate_pair(row[a.rope.layout.dim0(i)], row[a.rope.layout.dim1(i)], cs, sn);
    }
    __syncthreads();
  }
  const int64_t off = int64_t{r} * a.out_row_stride + int64_t{h} * a.out_head_stride;
  for (int d = threadIdx.x; d < a.head_dim; d += kMergeThreads) store_q_elem(a.out, off + d, a.out_elem, row[d]);
}

}  // namespace

void launch_merge(const MergeArgs& a, cudaStream_t stream) {
  if (a.splits > kMaxSplits || a.head_dim > kMaxMergeDim || a.head_dim % 32 != 0)
    throw Error(ErrorCode::InvalidArgument, detail::concat("attention merge: splits ", a.splits, " / head_dim ", a.head_dim,
                                                           " beyond the kernel's limits (1024 / a multiple of 32 <= 512)"));
  const int64_t blocks = int64_t{a.n_rows} * a.n_heads;
  if (blocks == 0) return;
  // Programmatic dependent launch (Hopper): the merge grid is set up while the decode
  // kernel drains, instead of after it (the launch latency leaves the critical path).
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kMergeThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  if (a.splits > kMergeWarps) KVCORE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, merge_kernel<4>, a));
  else KVCORE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, merge_kernel<1>, a));
}

}  // namespace attn

namespace {

// Query heads per CTA for this shape (a kernel template parameter).
int heads_per_cta(int hd, math::KvElem kv, int group) {
  const int gmax = attn::max_heads_per_cta(hd, kv);
  if (group == 1) return 1;
  if (gmax == 2) return 2;
  if (group <= 4) return 4;
  return gmax;
}

void dispatch_hd(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* blocks_per_sm) {
  switch (p.layout.head_dim) {
    case 64: return attn::launch_paged_hd<64>(p, G, chunks, grid, stream, blocks_per_sm);
    case 128: return attn::launch_paged_hd<128>(p, G, chunks, grid, stream, blocks_per_sm);
    case 256: return attn::launch_paged_hd<256>(p, G, chunks, grid, stream, blocks_per_sm);
    case 512: return attn::launch_paged_hd<512>(p, G, chunks, grid, stream, blocks_per_sm);
    default: throw Error(ErrorCode::NotSupported, detail::concat("attention: head_dim ", p.layout.head_dim));
  }
}

}  // namespace

constexpr int kMaxSplitsChosen = 1024;

int32_t attention_choose_splits(int device, int64_t n_rows, int n_kv_heads, int group, int head_dim, math::KvElem kv,
                                int kernel_variant, int64_t max_seq_cells) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  const bool mma = mma_attn::serves_shape(head_dim, kv, kernel_variant);
  const int G = mma ? mma_attn::heads_per_cta(group) : heads_per_cta(head_dim, kv, group);
  const int chunks = (group + G - 1) / G;
  // Occupancy queries cost host time on every call: remember them per kernel choice.
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int, int>, int> known;
  const auto key = std::make_tuple(device, head_dim, static_cast<int>(kv), mma ? 3 : kernel_variant, G);
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = known.find(key);
    if (it != known.end()) per_sm = it->second;
  }
  if (per_sm == 0) {
    if (mma) {
      per_sm = mma_attn::blocks_per_sm(head_dim, kv, false, group);
    } else {
      PagedAttentionParams q{};
      q.layout.head_dim = head_dim;
      q.kv_elem = kv;
      q.kernel_variant = kernel_variant;
      dispatch_hd(q, G, chunks, dim3(), nullptr, &per_sm);
    }
    std::lock_guard<std::mutex> lock(mu);
    known[key] = per_sm;
  }
  // KVCORE_ATTN_SPLITS=N forces N splits (A/B benchmarks of the choice below).
  static const int forced = [] {
    const char* v = std::getenv("KVCORE_ATTN_SPLITS");
    return v ? std::atoi(v) : 0;
  }();
  if (forced > 0) return std::min(forced, kMaxSplitsChosen);
  const int64_t slots = int64_t{std::max(per_sm, 1)} * sm_count(device);
  const int64_t base = std::max<int64_t>(1, n_rows * n_kv_heads * chunks);
  // At least 128 cells per split; at most 1024 splits.
  const int64_t s_max = std::clamp<int64_t>(max_seq_cells > 0 ? (max_seq_cells + 127) / 128 : 1024, 1, 1024);
  if (base < slots) return static_cast<int32_t>(std::clamp<int64_t>(slots / base, 1, s_max));  // one full wave
  // Enough CTAs already: the fewest splits whose last wave is >= 90% full (CTAs of one
  // batch take about the same time, so they run in waves).
  int64_t best = 1;
  double best_eff = 0;
  for (int64_t s = 1; s <= std::min<int64_t>(8, s_max); ++s) {
    const int64_t ctas = base * s;
    const double eff = double(ctas) / double((ctas + slots - 1) / slots * slots);
    if (eff > best_eff + 1e-9) best = s, best_eff = eff;
    if (eff >= 0.9) return static_cast<int32_t>(s);
  }
  return static_cast<int32_t>(best);
}

void attention_paged(const PagedAttentionParams& p) {
  KVCORE_CUDA_CHECK(cudaSetDevice(p.device));
  require_arg(reinterpret_cast<uintptr_t>(p.k) % 16 == 0 && reinterpret_cast<uintptr_t>(p.v) % 16 == 0,
              "attention: CUDA pools must be 16-byte aligned (kv.k at ", p.k, ", kv.v at ", p.v, ")");
  const int hd = p.layout.head_dim;
  cudaStream_t stream = kvcore::cuda::native(p.stream);
  if (mma_attn::serves(p)) {
    mma_attn::launch(p, stream);
    if (mma_attn::writes_output_directly(p)) return;
  } else {
    const int G = heads_per_cta(hd, p.kv_elem, p.group);
    const int chunks = (p.group + G - 1) / G;
    const int64_t gx = int64_t{p.n_rows} * p.num_splits;
    const int64_t gy = int64_t{p.layout.n_kv_heads} * chunks;
    require_arg(gx < (int64_t{1} << 31) && gy < 65536, "attention: grid too large (rows x splits ", gx,
                ", kv heads x chunks ", gy, ")");
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
    PagedAttentionParams simt = p;
    if (simt.kernel_variant == 3) simt.kernel_variant = 0;  // asked for mma where it is not built
    dispatch_hd(simt, G, chunks, grid, stream, nullptr);
  }
  attn::MergeArgs m{};
  m.o_part = p.o_part;
  m.lse_part = p.lse_part;
  m.n_rows = p.n_rows;
  m.n_heads = p.n_q_heads;
  m.splits = p.num_splits;
  m.head_dim = hd;
  m.maybe_sinks = p.maybe_sinks;
  m.out = p.out;
  m.out_elem = p.out_elem;
  m.out_row_stride = p.out_row_stride;
  m.out_head_stride = p.out_head_stride;
  m.maybe_inverse_rope_pos = nullptr;
  attn::launch_merge(m, stream);
}

}  // namespace kvcore::ops::cuda
