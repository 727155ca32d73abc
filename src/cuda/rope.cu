// rope_apply on CUDA. One thread owns V consecutive pairs of one token and
// rotates them in every head: cos/sin are computed once per (token, pair) and
// reused across heads, and the V pairs travel as one vector load/store when the
// layout is aligned (NeoX: two loads of V elements; interleaved: one of 2V).
// Memory-bound; the math is kvcore/math/rope.hpp, the same as the CPU kernel's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "kvcore/math/half.hpp"
#include "kvcore/math/rope.hpp"
#include "ops/rope_params.hpp"

namespace kvcore::ops::cuda {
namespace {

// The params (with the ~1 KB table) travel as a kernel argument: stay under the 4 KB limit.
static_assert(sizeof(RopeApplyParams) + 2 * sizeof(int32_t) <= 4096, "RopeApplyParams too large for a kernel argument");

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ __forceinline__ int64_t load_position(const RopeApplyParams& p, int64_t t) {
  return p.pos_dtype == DType::I32 ? static_cast<const int32_t*>(p.positions)[t * p.pos_stride]
                                   : static_cast<const int64_t*>(p.positions)[t * p.pos_stride];
}

// Pairs [g*V, g*V + V) of token t, all heads.
template <class T, int V>
__device__ __forceinline__ void rotate_group(const RopeApplyParams& p, int64_t t, int32_t g) {
  const math::RopeLayout& l = p.table.layout;
  const float fp = math::rope_position(load_position(p, t));
  float c[V], s[V];
#pragma unroll
  for (int j = 0; j < V; ++j) math::rope_cos_sin(fp, p.table.freq[g * V + j], p.magnitude, &c[j], &s[j]);
  const T* xt = static_cast<const T*>(p.x) + t * p.x_stride_token;
  T* ot = static_cast<T*>(p.out) + t * p.out_stride_token;
  if (l.interleaved) {
    const int32_t d = l.first_dim + 2 * g * V;
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* xr = xt + h * p.x_stride_head + d;
      T* orow = ot + h * p.out_stride_head + d;
      if constexpr (V == 1) {  // no alignment assumed: first_dim may be odd
        float x0 = to_f32(xr[0]), x1 = to_f32(xr[1]);
        math::rotate_pair(x0, x1, c[0], s[0]);
        orow[0] = from_f32<T>(x0);
        orow[1] = from_f32<T>(x1);
      } else {
        Pack<T, 2 * V> a = *reinterpret_cast<const Pack<T, 2 * V>*>(xr);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          float x0 = to_f32(a.v[2 * j]), x1 = to_f32(a.v[2 * j + 1]);
          math::rotate_pair(x0, x1, c[j], s[j]);
          a.v[2 * j] = from_f32<T>(x0);
          a.v[2 * j + 1] = from_f32<T>(x1);
        }
        *reinterpret_cast<Pack<T, 2 * V>*>(orow) = a;
      }
    }
  } else {
    const int32_t d0 = l.first_dim + g * V, d1 = d0 + l.n_pairs();
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* xr = xt + h * p.x_stride_head;
      T* orow = ot + h * p.out_stride_head;
      Pack<T, V> a = *reinterpret_cast<const Pack<T, V>*>(xr + d0);
      Pack<T, V> b = *reinterpret_cast<const Pack<T, V>*>(xr + d1);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float x0 = to_f32(a.v[j]), x1 = to_f32(b.v[j]);
        math::rotate_pair(x0, x1, c[j], s[j]);
        a.v[j] = from_f32<T>(x0);
        b.v[j] = from_f32<T>(x1);
      }
      *reinterpret_cast<Pack<T, V>*>(orow + d0) = a;
      *reinterpret_cast<Pack<T, V>*>(orow + d1) = b;
    }
  }
}

// Out of place only: pass-through element c (outside the rotated slice) of token t, all heads.
template <class T>
__device__ __forceinline__ void copy_passthrough(const RopeApplyParams& p, int64_t t, int32_t c) {
  const math::RopeLayout& l = p.table.layout;
  const int32_t d = c < l.first_dim ? c : c + l.n_rot;
  const T* xt = static_cast<const T*>(p.x) + t * p.x_stride_token + d;
  T* ot = static_cast<T*>(p.out) + t * p.out_stride_token + d;
  for (int64_t h = 0; h < p.heads; ++h) ot[h * p.out_stride_head] = xt[h * p.x_stride_head];
}

// Body: work item `flat` of (tokens x per_token); the first `groups` items of a token
// rotate, the rest copy pass-through dims.
template <class T, int V>
__device__ __forceinline__ void rope_apply_body(const RopeApplyParams& p, int64_t flat, int32_t per_token,
                                                int32_t groups) {
  const int64_t t = flat / per_token;
  const int32_t k = static_cast<int32_t>(flat - t * per_token);
  if (k < groups) rotate_group<T, V>(p, t, k);
  else copy_passthrough<T>(p, t, k - groups);
}

template <class T, int V>
__global__ void rope_apply_kernel(const __grid_constant__ RopeApplyParams p, int32_t per_token, int32_t groups) {
  const int64_t total = p.tokens * per_token;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    rope_apply_body<T, V>(p, i, per_token, groups);
}

// The widest V in {4, 2} whose loads (V elements for NeoX, 2V interleaved, at most
// 16 bytes) are aligned for every row of x and out; else 1.
int choose_pairs_per_thread(const RopeApplyParams& p) {
  const math::RopeLayout& l = p.table.layout;
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  for (int v : {4, 2}) {
    const int64_t elems = l.interleaved ? 2 * v : v;
    if (elems * es > 16 || l.n_pairs() % v != 0 || l.first_dim % elems != 0) continue;
    const auto aligned = [&](const void* q) { return reinterpret_cast<uintptr_t>(q) % (elems * es) == 0; };
    if (!aligned(p.x) || !aligned(p.out)) continue;
    if (p.x_stride_token % elems || p.x_stride_head % elems || p.out_stride_token % elems ||
        p.out_stride_head % elems)
      continue;
    return v;
  }
  return 1;
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KVCORE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KVCORE_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

template <class T, int V>
void launch(const RopeApplyParams& p, cudaStream_t stream) {
  const int32_t groups = p.table.layout.n_pairs() / V;
  const int32_t copies = p.in_place ? 0 : p.head_dim - p.table.layout.n_rot;
  const int32_t per_token = groups + copies;
  const int64_t total = p.tokens * per_token;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 20);
  rope_apply_kernel<T, V><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, per_token, groups);
  KVCORE_CUDA_CHECK_LAUNCH("rope_apply_kernel");
}

template <class T>
void launch_for(const RopeApplyParams& p, cudaStream_t stream) {
  switch (choose_pairs_per_thread(p)) {
    case 4: return launch<T, 4>(p, stream);
    case 2: return launch<T, 2>(p, stream);
    default: return launch<T, 1>(p, stream);
  }
}

}  // namespace

void rope_apply(const RopeApplyParams& p, int device, Stream stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = native(stream);
  switch (p.dtype) {
    case DType::F32: return launch_for<float>(p, s);
    case DType::F16: return launch_for<f16>(p, s);
    case DType::BF16: return launch_for<bf16>(p, s);
    default: break;  // validated by the entry point
  }
}

}  // namespace kvcore::ops::cuda
