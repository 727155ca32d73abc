// Host side of CUDA attention: kernel choice and grid, the split-K merge kernel.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda/attention/attention_decode.cuh"
#include "cuda/attention/attention_merge.cuh"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/attention/attention_mma.hpp"
#include "cuda/attention/attention_prefill.hpp"
#include "cuda/attention/prefill_wgmma.hpp"
#include "cuda/common/device.hpp"
#include "ops/attention_tuning.hpp"

namespace kvcore::ops::cuda {

namespace attn {

namespace {

constexpr int kMergeThreads = 256;
constexpr int kMaxSplits = 1024;

// Partials are staged in shared memory by cp.async, kStageFloats at a time (64 splits of 128
// dims): every copy of a stage is in flight at once and needs no registers, and the lse loads
// and weights overlap them. Held in registers instead, the partials' loads are consumed one
// by one as the compiler issues them: a memory round trip per few splits.
constexpr int kStageFloats = 8192;

// DS: dims a CTA merges (HD, or 32 (16 where 32 does not divide HD) when few (row, head) pairs
// would leave most SMs idle: at batch 1, 32 CTAs of 66 splits each waited on two stages of
// copies in turn).
template <int HD, int DS>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const MergeArgs a) {
  static_assert(HD % DS == 0 && DS % 4 == 0, "whole 16-byte chunks of a split's slice");
  static_assert(DS < kMergeThreads || DS % kMergeThreads == 0, "wide slices: whole dims a thread");
  constexpr int kSlices = HD / DS;
  constexpr int kStageSplits = kStageFloats / DS;
  constexpr int kParts = DS >= kMergeThreads ? 1 : kMergeThreads / DS;  // threads sharing a dim (split subsets)
  constexpr int kDims = DS >= kMergeThreads ? DS / kMergeThreads : 1;   // dims a thread sums
  // Threads that sum (where DS does not divide kMergeThreads, the last few only copy).
  constexpr int kSummers = DS >= kMergeThreads ? kMergeThreads : kParts * DS;
  __shared__ __align__(16) float stage[kStageFloats];
  __shared__ float w[kMaxSplits];
  __shared__ float part[kParts][DS];
  __shared__ float inv_s;
  // Launched as a programmatic dependent of the decode kernel: its partials complete and visible.
  kvcore::ops::cuda::pdl_wait();
  const int rh = blockIdx.x / kSlices, d_off = blockIdx.x % kSlices * DS;
  const int r = rh / a.n_heads, h = rh % a.n_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const float* lse = a.lse_part + int64_t{rh} * a.splits;
  const float* o = a.o_part + int64_t{rh} * a.splits * HD + d_off;
  auto copy_stage = [&](int s0) {
    const int n = min(kStageSplits, a.splits - s0);
    for (int e = tid; e < n * DS / 4; e += kMergeThreads) {
      const int i = e / (DS / 4), c = e % (DS / 4);  // split s0 + i, chunk c of its slice
      kvcore::ops::cuda::cp_async<16>(stage + i * DS + 4 * c, o + int64_t{s0 + i} * HD + 4 * c);
    }
    kvcore::ops::cuda::cp_async_commit();
  };
  copy_stage(0);
  // Every split's lse at once (a thread each), while the first stage's copies are in flight.
  for (int i = tid; i < a.splits; i += kMergeThreads) w[i] = lse[i];
  __syncthreads();
  if (warp == 0) {  // max, weights and their sum by 32 lanes (thread 0 alone: ~0.7 us at 66 splits)
    const float sink = a.maybe_sinks ? a.maybe_sinks[h] * math::kLog2e : math::neg_inf_f32();
    float m = sink;
    for (int i = lane; i < a.splits; i += 32) m = math::max_f32(m, w[i]);
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) m = math::max_f32(m, __shfl_xor_sync(0xffffffffu, m, x));
    float sum = 0.0f;
    for (int i = lane; i < a.splits; i += 32) {
      w[i] = math::partials_weight(w[i], m);
      sum += w[i];
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
    if (lane == 0) inv_s = math::partials_inv_denominator(sum, sink, m);
  }
  // Thread (q, d0): dims d0 + kMergeThreads * k of the splits q, q + kParts, ... of each stage,
  // in split order; the kParts sums are added in order at the end.
  const int q = DS >= kMergeThreads ? 0 : tid / DS, d0 = DS >= kMergeThreads ? tid : tid % DS;
  float acc[kDims];
#pragma unroll
  for (int k = 0; k < kDims; ++k) acc[k] = 0.0f;
  const int q_end = tid < kSummers ? min(kStageSplits, a.splits) : 0;  // idle threads sum no split
  for (int s0 = 0; s0 < a.splits; s0 += kStageSplits) {
    kvcore::ops::cuda::cp_async_wait<0>();
    __syncthreads();  // the stage (and, the first time, the weights) visible to every thread
    const float inv = inv_s;
    const int n = min(q_end, a.splits - s0);
    for (int i = q; i < n; i += kParts) {
      const float wi = w[s0 + i] * inv;
      if (wi != 0.0f)  // an empty split's partial is never read (0 * inf)
#pragma unroll
        for (int k = 0; k < kDims; ++k) acc[k] += wi * stage[i * DS + d0 + kMergeThreads * k];
    }
    if (s0 + kStageSplits < a.splits) {
      __syncthreads();  // every thread is done with the stage before it is overwritten
      copy_stage(s0 + kStageSplits);
    }
  }
  if (tid < kSummers)
#pragma unroll
    for (int k = 0; k < kDims; ++k) part[q][d0 + kMergeThreads * k] = acc[k];
  __syncthreads();
  float* row = stage;  // the stage is free now
  for (int d = tid; d < DS; d += kMergeThreads) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kParts; ++k) s += part[k][d];
    row[d] = s;
  }
  __syncthreads();
  if (kSlices == 1 && a.maybe_inverse_rope_pos) {  // (the launcher slices no rotated output)
    const float pos = -static_cast<float>(a.maybe_inverse_rope_pos[r]);
    for (int i = threadIdx.x; i < a.rope.layout.n_pairs(); i += kMergeThreads) {
      float sn, cs;
      math::sincos_f32(math::rope_angle(pos, a.rope.freq[i]), &sn, &cs);
      math::rotate_pair(row[a.rope.layout.dim0(i)], row[a.rope.layout.dim1(i)], cs, sn);
    }
    __syncthreads();
  }
  const int64_t off = int64_t{r} * a.out_row_stride + int64_t{h} * a.out_head_stride + d_off;
  for (int d = threadIdx.x; d < DS; d += kMergeThreads) store_q_elem(a.out, off + d, a.out_elem, row[d]);
  // The next decode call's kernel (a programmatic dependent) may launch once every merge CTA is
  // here; it waits for this grid's completion before reading anything.
  kvcore::ops::cuda::pdl_allow_dependents();
}

}  // namespace

void launch_merge(const MergeArgs& a, cudaStream_t stream) {
  const int hd = a.head_dim;
  const bool served = hd == 64 || hd == 80 || hd == 96 || hd == 112 || hd == 128 || hd == 192 || hd == 256 || hd == 512;
  if (a.splits > kMaxSplits || !served)
    throw Error(ErrorCode::InvalidArgument,
                detail::concat("attention merge: splits ", a.splits, " / head_dim ", hd,
                               " beyond the kernel's limits (1024 / 64, 80, 96, 112, 128, 192, 256 or 512)"));
  const int64_t blocks = int64_t{a.n_rows} * a.n_heads;
  if (blocks == 0) return;
  // Fewer (row, head) pairs than SMs: a CTA per 32 dims, so more SMs share the copies
  // (a.sm_count 0 turns that off: AttentionTuning::merge_slices).
  const bool sliced = a.sm_count > 0 && !a.maybe_inverse_rope_pos && blocks < a.sm_count;
  // Programmatic dependent launch (Hopper): the merge grid is set up while the decode
  // kernel drains, instead of after it (the launch latency leaves the critical path).
  const int slice = hd % 32 == 0 ? 32 : 16;
  const dim3 grid(static_cast<unsigned>(sliced ? blocks * (hd / slice) : blocks)), block(kMergeThreads);
  auto go = [&](auto kernel) { kvcore::ops::cuda::launch_dependent(kernel, grid, block, 0, stream, a); };
  switch (hd) {
    case 64: return sliced ? go(merge_kernel<64, 32>) : go(merge_kernel<64, 64>);
    case 80: return sliced ? go(merge_kernel<80, 16>) : go(merge_kernel<80, 80>);
    case 96: return sliced ? go(merge_kernel<96, 32>) : go(merge_kernel<96, 96>);
    case 112: return sliced ? go(merge_kernel<112, 16>) : go(merge_kernel<112, 112>);
    case 128: return sliced ? go(merge_kernel<128, 32>) : go(merge_kernel<128, 128>);
    case 192: return sliced ? go(merge_kernel<192, 32>) : go(merge_kernel<192, 192>);
    case 256: return sliced ? go(merge_kernel<256, 32>) : go(merge_kernel<256, 256>);
    default: return sliced ? go(merge_kernel<512, 32>) : go(merge_kernel<512, 512>);
  }
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

// The SIMT kernel of the pages' (K, V) head dims: the pairs ops::attention_cannot_read accepts.
void dispatch_hd(const PagedAttentionParams& p, int G, int chunks, dim3 grid, cudaStream_t stream, int* blocks_per_sm) {
  const int hd = p.layout.head_dim, hdv = p.v_head_dim;
  if (hd == 576 && hdv == 512) return attn::launch_paged_hd<576, 512>(p, G, chunks, grid, stream, blocks_per_sm);
  if (hd == hdv) {
    switch (hd) {
      case 64: return attn::launch_paged_hd<64, 64>(p, G, chunks, grid, stream, blocks_per_sm);
      case 80: return attn::launch_paged_hd<80, 80>(p, G, chunks, grid, stream, blocks_per_sm);
      case 96: return attn::launch_paged_hd<96, 96>(p, G, chunks, grid, stream, blocks_per_sm);
      case 112: return attn::launch_paged_hd<112, 112>(p, G, chunks, grid, stream, blocks_per_sm);
      case 128: return attn::launch_paged_hd<128, 128>(p, G, chunks, grid, stream, blocks_per_sm);
      case 192: return attn::launch_paged_hd<192, 192>(p, G, chunks, grid, stream, blocks_per_sm);
      case 256: return attn::launch_paged_hd<256, 256>(p, G, chunks, grid, stream, blocks_per_sm);
      case 512: return attn::launch_paged_hd<512, 512>(p, G, chunks, grid, stream, blocks_per_sm);
      default: break;
    }
  }
  throw Error(ErrorCode::NotSupported, detail::concat("attention: head_dim ", hd, " with v_head_dim ", hdv));
}

}  // namespace

int32_t attention_choose_splits(int device, int64_t n_rows, int n_kv_heads, int group, int head_dim, int v_head_dim,
                                math::KvElem kv, int kernel_variant, int64_t max_seq_cells, bool rope_on_read,
                                bool fat_ctas) {
  KVCORE_CUDA_CHECK(cudaSetDevice(device));
  if (kernel_variant >= 4) kernel_variant = 0;  // the prefill kernels have no splits; others plan as automatic
  const bool mma = v_head_dim == head_dim && mma_attn::serves_shape(head_dim, kv, kernel_variant);
  const int G = mma ? mma_attn::heads_per_cta(group) : heads_per_cta(head_dim, kv, group);
  const int chunks = (group + G - 1) / G;
  // Occupancy queries cost host time on every call: remember them per kernel choice. The
  // tensor-core kernel that rotates on read holds more registers (fewer CTAs an SM) than the
  // one that does not, so rope on read is part of the choice.
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int, int, int, bool>, int> known;
  const auto key =
      std::make_tuple(device, head_dim, v_head_dim, static_cast<int>(kv), mma ? 3 : kernel_variant, G, mma && rope_on_read);
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = known.find(key);
    if (it != known.end()) per_sm = it->second;
  }
  if (per_sm == 0) {
    if (mma) {
      per_sm = mma_attn::blocks_per_sm(head_dim, kv, rope_on_read, group);
    } else {
      PagedAttentionParams q{};
      q.layout.head_dim = head_dim;
      q.v_head_dim = v_head_dim;
      q.kv_elem = kv;
      q.kernel_variant = kernel_variant;
      dispatch_hd(q, G, chunks, dim3(), nullptr, &per_sm);
    }
    std::lock_guard<std::mutex> lock(mu);
    known[key] = per_sm;
  }
  const int sms = sm_count(device);
  const int64_t slots = int64_t{std::max(per_sm, 1)} * sms;
  const int64_t base = std::max<int64_t>(1, n_rows * n_kv_heads * chunks);
  const int64_t s_max = attention_split_limit(max_seq_cells);
  // FP8: one fat CTA an SM where that is a single wave of long enough CTAs (decode_fat_ctas.hpp).
  if (mma && fat_ctas && mma_attn::fat_decode_allowed(kv, rope_on_read, group))
    if (const int64_t s = fat_decode_splits(base, sms, max_seq_cells, s_max)) return static_cast<int32_t>(s);
  // One CTA an SM already covers >= 90% of the SMs in one wave and the contexts are long: no
  // split, so no partials and no merge (16-bit pages, tensor-core kernel; FP8 and rope on read
  // are bound by instruction issue and want the extra CTAs; short contexts by start-up latency).
  if (mma && !rope_on_read && kv != math::KvElem::E4M3 && base <= sms && base * 10 >= int64_t{sms} * 9 &&
      max_seq_cells >= 16384)
    return 1;
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

void attention_paged(const PagedAttentionParams& p, const AttentionTuning& tuning) {
  KVCORE_CUDA_CHECK(cudaSetDevice(p.device));
  require_arg(reinterpret_cast<uintptr_t>(p.k) % 16 == 0 && reinterpret_cast<uintptr_t>(p.v) % 16 == 0,
              "attention: CUDA pools must be 16-byte aligned (kv.k at ", p.k, ", kv.v at ", p.v, ")");
  const int64_t v_row_bytes = p.v_row_stride * (p.kv_elem == math::KvElem::F32 ? 4 : p.kv_elem == math::KvElem::E4M3 ? 1 : 2);
  require_arg(v_row_bytes % 16 == 0, "attention: CUDA V rows must start 16-byte aligned (V row stride ", p.v_row_stride,
              " elements)");
  const int hd = p.layout.head_dim;
  cudaStream_t stream = kvcore::ops::cuda::native(p.stream);
  if (prefill_wgmma::serves(p, sm_count(p.device))) {  // Hopper wgmma prefill; writes the output itself
    prefill_wgmma::launch(p, stream);
    return;
  }
  PagedAttentionParams pv = p;
  if (pv.kernel_variant >= 5) pv.kernel_variant = 0;  // asked for a wgmma prefill kernel where it does not serve
  if (prefill_attn::serves(pv, sm_count(p.device))) {  // writes the output itself
    prefill_attn::launch(pv, stream);
    return;
  }
  if (pv.kernel_variant == 4) pv.kernel_variant = 0;  // asked for the prefill kernel where it does not serve
  // No guessed first block ids at batch row 0 (the kernel guesses only below n_indices).
  if (!tuning.guess_blocks) pv.n_indices = 0;
  if (mma_attn::serves(pv)) {
    mma_attn::launch(pv, tuning, stream);
    if (mma_attn::writes_output_directly(pv)) return;
  } else {
    const int G = heads_per_cta(hd, p.kv_elem, p.group);
    const int chunks = (p.group + G - 1) / G;
    const int64_t gx = int64_t{p.n_rows} * p.num_splits;
    const int64_t gy = int64_t{p.layout.n_kv_heads} * chunks;
    require_arg(gx < (int64_t{1} << 31) && gy < 65536, "attention: grid too large (rows x splits ", gx,
                ", kv heads x chunks ", gy, ")");
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
    PagedAttentionParams simt = pv;
    if (simt.kernel_variant == 3) simt.kernel_variant = 0;  // asked for mma where it is not built
    dispatch_hd(simt, G, chunks, grid, stream, nullptr);
  }
  attn::MergeArgs m{};
  m.o_part = p.o_part;
  m.lse_part = p.lse_part;
  m.n_rows = p.n_rows;
  m.n_heads = p.n_q_heads;
  m.splits = p.num_splits;
  m.head_dim = p.v_head_dim;  // the partials are V rows
  m.maybe_sinks = p.maybe_sinks;
  m.out = p.out;
  m.out_elem = p.out_elem;
  m.out_row_stride = p.out_row_stride;
  m.out_head_stride = p.out_head_stride;
  m.maybe_inverse_rope_pos = nullptr;
  m.sm_count = tuning.merge_slices ? sm_count(p.device) : 0;
  attn::launch_merge(m, stream);
}

}  // namespace kvcore::ops::cuda
