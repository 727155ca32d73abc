// CUDA kernels of the DeepSeek-V4 ops. Three levels per kernel: a __device__
// body taking (params, shared memory, block index), a thin __global__ wrapper,
// and a host launcher that sizes the grid and checks the launch.
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/dsv4/dsv4_common.cuh"
#include "cuda/dsv4/dsv4_prefill.cuh"
#include "cuda/dsv4/dsv4_prefill_general.cuh"
#include "ops/dsv4_backends.hpp"

namespace kvcore::ops::cuda::dsv4 {

using kvcore::ops::cuda::native;

// ---- finalizer --------------------------------------------------------------------------

// Row i of kv: its nope dims FP8-rounded in place (quant), and, where it is one of the last
// raw_rows rows, its final values into the raw ring. Every value goes to the ring from the
// thread that holds it (the rounded nope values from the rounding warp's registers), so no
// barrier and no second read of the row stand between the rounding and the ring's stores.
__device__ inline void finalize_body(const FinalizeParams& p, int64_t i) {
  float* row = p.kv + i * p.kv_stride;
  const bool to_ring = i >= static_cast<int64_t>(p.n_rows) - p.raw_rows;
  const int64_t r = to_ring ? (p.first_raw_row + i) % p.raw_rows : 0;
  auto ring_store = [&](int d, float v) {
    if (p.raw_f16) {
      static_cast<uint16_t*>(p.raw)[r * p.raw_stride + d] = math::f32_to_f16_bits(v);
    } else {
      static_cast<float*>(p.raw)[r * p.raw_stride + d] = p.quant ? math::f16_bits_to_f32(math::f32_to_f16_bits(v)) : v;
    }
  };
  const int n_nope = p.quant ? p.head_dim - p.n_rot : 0;  // the dims rounded (and stored to the ring) below
  if (p.quant) fp8_nope_blocks(row, n_nope, nullptr, [&](int d, float v) {
    if (to_ring) ring_store(d, v);
  });
  if (!to_ring) return;
  for (int d = n_nope + static_cast<int>(threadIdx.x); d < p.head_dim; d += blockDim.x) ring_store(d, row[d]);
}

__global__ void __launch_bounds__(kThreads) finalize_kernel(const FinalizeParams p) { finalize_body(p, blockIdx.x); }

void finalize(const FinalizeParams& p, Stream s) {
  finalize_kernel<<<p.n_rows, kThreads, 0, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 finalize_kernel");
}

// ---- state: store one, shift, reset -------------------------------------------------------

__global__ void store_one_kernel(const CompressorParams p) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= p.width) return;
  const int64_t r = p.pos % p.ratio;
  const int64_t row = (p.overlap ? p.ratio : 0) + r;
  p.state_kv[row * p.width + k] = p.c[k];
  p.state_score[row * p.width + k] = p.z[k] + ape_value(p, r, k);
}

void store_one(const CompressorParams& p, Stream s) {
  store_one_kernel<<<(p.width + kThreads - 1) / kThreads, kThreads, 0, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 store_one_kernel");
}

__global__ void shift_kernel(const CompressorParams p) {
  const int64_t n = static_cast<int64_t>(p.ratio) * p.width;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  p.state_kv[i] = p.state_kv[n + i];
  p.state_score[i] = p.state_score[n + i];
}

void shift(const CompressorParams& p, Stream s) {
  const int64_t n = static_cast<int64_t>(p.ratio) * p.width;
  shift_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 shift_kernel");
}

__global__ void reset_kernel(const CompressorParams p) {
  const int64_t n = static_cast<int64_t>(p.state_rows) * p.width;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  p.state_kv[i] = 0.0f;
  p.state_score[i] = -INFINITY;
}

void reset(const CompressorParams& p, Stream s) {
  const int64_t n = static_cast<int64_t>(p.state_rows) * p.width;
  reset_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 reset_kernel");
}

// ---- emission and prefill --------------------------------------------------------------------

// Shared memory of the row kernels: head_dim floats for the row, 33 for reductions (row_sumsq_smem: 32).
inline size_t row_smem(const CompressorParams& p) { return (static_cast<size_t>(p.head_dim) + 33) * sizeof(float); }

__device__ inline void emit_body(const CompressorParams& p, float* smem) {
  float* buf = smem;
  float* scratch = smem + p.head_dim;
  for (int k = threadIdx.x; k < p.head_dim; k += blockDim.x)
    buf[k] = math::dsv4_pool_any(p.state_rows, [&](int j, float& z, float& c) { state_candidate(p, j, k, z, c); });
  __syncthreads();
  finish_row(p, p.window, buf, scratch);
}

__global__ void __launch_bounds__(kThreads) emit_kernel(const CompressorParams p) {
  extern __shared__ float smem[];
  emit_body(p, smem);
}

static void set_smem(const void* kernel, size_t bytes) {
  if (bytes > 48 * 1024) smem_opt_in(kernel, bytes, current_device());
}

void emit(const CompressorParams& p, Stream s) {
  const size_t sm = row_smem(p);
  set_smem(reinterpret_cast<const void*>(emit_kernel), sm);
  emit_kernel<<<1, kThreads, sm, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 emit_kernel");
}

template <bool kEight>
__global__ void __launch_bounds__(kThreads, 4) prefill_kernel(const CompressorParams p, int64_t w0) {
  extern __shared__ float smem[];
  prefill_window_body<kEight>(p, smem, w0 + blockIdx.x);
}

__global__ void prefill_state_kernel(const CompressorParams p) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= p.width) return;
  const int32_t r = blockIdx.y;
  prefill_state_row(p, r, k);
  if (p.overlap) prefill_state_row(p, r + p.ratio, k);
}

void prefill(const CompressorParams& p, Stream s) {
  bool state_done = false;
  if (!prefill_fast(p, s, &state_done)) {  // the model's shapes: one fused launch (dsv4_prefill.cu)
    const int64_t w0 = p.pos / p.ratio, w1 = (p.pos + p.n_tokens) / p.ratio;
    const size_t sm = row_smem(p);
    const bool eight = p.state_rows == 8;
    const void* kernel = eight ? reinterpret_cast<const void*>(prefill_kernel<true>) : reinterpret_cast<const void*>(prefill_kernel<false>);
    set_smem(kernel, sm);
    for (int64_t w = w0; w < w1; w += 65535 * 1024LL) {  // grid.x limit is 2^31 - 1; stay far below
      const int64_t n = w1 - w < 65535 * 1024LL ? w1 - w : 65535 * 1024LL;
      if (eight) {
        prefill_kernel<true><<<static_cast<unsigned>(n), kThreads, sm, native(s)>>>(p, w);
      } else {
        prefill_kernel<false><<<static_cast<unsigned>(n), kThreads, sm, native(s)>>>(p, w);
      }
      KVCORE_CUDA_CHECK_LAUNCH("dsv4 prefill_kernel");
    }
  }
  if (state_done) return;
  const dim3 state_grid(static_cast<unsigned>((p.width + kThreads - 1) / kThreads),
                        static_cast<unsigned>(p.overlap ? p.ratio : p.state_rows));
  prefill_state_kernel<<<state_grid, kThreads, 0, native(s)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 prefill_state_kernel");
}

// ---- fused decode step -------------------------------------------------------------------------
// Block 0 finalizes the kv row; block 1 runs the attention compressor, block 2 (or 1
// without one) the indexer: store, then emission and shift when the token closes a
// window. The blocks touch disjoint memory, so they need no grid-wide order. Launched as a
// programmatic dependent of the stream's previous kernel (it waits for that one's writes before
// touching global memory) and letting its own dependent (the layer's indexer scores, or the next
// layer's step) launch at once: a decode step's chain of small kernels overlaps each launch with
// the previous kernel's drain.

// The step's loops load a batch of values a thread before storing any: the compiler cannot tell
// that the state's stores miss the loads' addresses, so a plain loop waits for each of its loads
// in turn, one memory latency an iteration on the decode step's critical path.
constexpr int kStepBatch = 8;

__device__ inline void compressor_step_body(const CompressorParams& p, bool due, float* smem) {
  const int64_t r = p.pos % p.ratio;
  const int64_t row = (p.overlap ? p.ratio : 0) + r;
  for (int k0 = threadIdx.x; k0 < p.width; k0 += kStepBatch * blockDim.x) {  // the token's state row
    float c[kStepBatch], z[kStepBatch];
#pragma unroll
    for (int j = 0; j < kStepBatch; ++j) {
      const int k = k0 + j * static_cast<int>(blockDim.x);
      if (k < p.width) {
        c[j] = p.c[k];
        z[j] = p.z[k] + ape_value(p, r, k);
      }
    }
#pragma unroll
    for (int j = 0; j < kStepBatch; ++j) {
      const int k = k0 + j * static_cast<int>(blockDim.x);
      if (k < p.width) {
        p.state_kv[row * p.width + k] = c[j];
        p.state_score[row * p.width + k] = z[j];
      }
    }
  }
  __syncthreads();
  if (!due) return;
  emit_body(p, smem);
  __syncthreads();
  if (!p.overlap) return;
  // The shift: rows [ratio, 2 ratio) to [0, ratio), disjoint ranges.
  const int64_t n = static_cast<int64_t>(p.ratio) * p.width;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += kStepBatch * static_cast<int64_t>(blockDim.x)) {
    float kv[kStepBatch], score[kStepBatch];
#pragma unroll
    for (int j = 0; j < kStepBatch; ++j) {
      const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
      if (i < n) {
        kv[j] = p.state_kv[n + i];
        score[j] = p.state_score[n + i];
      }
    }
#pragma unroll
    for (int j = 0; j < kStepBatch; ++j) {
      const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
      if (i < n) {
        p.state_kv[i] = kv[j];
        p.state_score[i] = score[j];
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) decode_layer_kernel(const DecodeParams p) {
  extern __shared__ float smem[];
  pdl_wait();
  pdl_allow_dependents();  // they wait for this grid before their first global access
  if (blockIdx.x == 0) {
    finalize_body(p.fin, 0);
    return;
  }
  const bool comp = blockIdx.x == 1 && p.has_comp;
  compressor_step_body(comp ? p.comp : p.idx, (comp ? p.comp_due : p.idx_due) != 0, smem);
}

void decode_layer(const DecodeParams& p, Stream s) {
  size_t sm = 0;
  if (p.has_comp) sm = row_smem(p.comp);
  if (p.has_idx && row_smem(p.idx) > sm) sm = row_smem(p.idx);
  set_smem(reinterpret_cast<const void*>(decode_layer_kernel), sm);
  launch_with(decode_layer_kernel, dim3(1 + p.has_comp + p.has_idx), dim3(kThreads), sm, native(s), 1, true, p);
  KVCORE_CUDA_CHECK_LAUNCH("dsv4 decode_layer_kernel");
}

}  // namespace kvcore::ops::cuda::dsv4
