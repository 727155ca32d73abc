// CUDA kernels of the fp8 op family. Memory-bound: one warp per row, each lane
// holding kVec consecutive columns of kGroup chunks at once (loads issued
// before any math), so a 64-value block is 64/kVec lanes and its amax a few
// xor shuffles. kVec = 4 with 16/8/4-byte accesses when the entry point found
// every tensor aligned; kVec = 2 with element accesses (any strides) otherwise.
// Per-value math is the shared math/ code, so results equal the CPU backend's.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/fp8_hw.cuh"
#include "kvcore/math/fp8_block.hpp"
#include "kvcore/math/half.hpp"
#include "ops/fp8_params.hpp"

namespace kvcore::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int kGroup = 4;  // chunks of 32 * kVec columns in flight per warp

// ---- 16-bit storage types on the device ---------------------------------------------
template <class T>
__device__ __forceinline__ uint16_t bits_of(T x) { return x.bits; }
template <class T>
__device__ __forceinline__ T from_bits(uint16_t b) { return T{b}; }

// ---- loads and stores of kVec consecutive columns starting at column idx ---------------
// Vector path: idx % 4 == 0, cols % 4 == 0, pointer aligned: all four columns exist or none.
template <class T, int kVec, bool kVector>
__device__ __forceinline__ void load_cols(const T* row, int64_t cs, int32_t idx, int32_t cols, float (&v)[kVec]) {
  if constexpr (kVector) {
    static_assert(kVec == 4, "vector path moves 4 columns per lane");
    if (idx >= cols) {
      v[0] = v[1] = v[2] = v[3] = 0.0f;
    } else if constexpr (sizeof(T) == 4) {
      const float4 q = *reinterpret_cast<const float4*>(row + idx);
      v[0] = q.x;
      v[1] = q.y;
      v[2] = q.z;
      v[3] = q.w;
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(row + idx);
      v[0] = to_f32(from_bits<T>(static_cast<uint16_t>(q.x & 0xffffu)));
      v[1] = to_f32(from_bits<T>(static_cast<uint16_t>(q.x >> 16)));
      v[2] = to_f32(from_bits<T>(static_cast<uint16_t>(q.y & 0xffffu)));
      v[3] = to_f32(from_bits<T>(static_cast<uint16_t>(q.y >> 16)));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = idx + j < cols ? to_f32(row[int64_t(idx + j) * cs]) : 0.0f;
  }
}

template <class T, int kVec, bool kVector>
__device__ __forceinline__ void store_cols(T* row, int64_t cs, int32_t idx, int32_t cols, const float (&v)[kVec]) {
  if constexpr (kVector) {
    if (idx >= cols) return;
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(row + idx) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      uint2 q;
      q.x = uint32_t(bits_of(from_f32<T>(v[0]))) | (uint32_t(bits_of(from_f32<T>(v[1]))) << 16);
      q.y = uint32_t(bits_of(from_f32<T>(v[2]))) | (uint32_t(bits_of(from_f32<T>(v[3]))) << 16);
      *reinterpret_cast<uint2*>(row + idx) = q;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (idx + j < cols) row[int64_t(idx + j) * cs] = from_f32<T>(v[j]);
  }
}

// The scale exponent of the 64-block holding column idx: amax over the block's valid nope
// values, gathered from its 64 / kVec lanes (aligned groups, so xor shuffles stay inside).
template <int kVec>
__device__ __forceinline__ int block_scale_exponent(const float (&v)[kVec], int32_t idx, int32_t n_nope) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j)
    if (idx + j < n_nope) amax = math::finite_abs_max(amax, v[j]);
#pragma unroll
  for (int m = 32 / kVec; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  return math::e4m3_scale_exponent(amax);
}

// ---- round trip ---------------------------------------------------------------------
template <int kVec, bool kVector>
__device__ __forceinline__ void round_trip_row(const Fp8RoundTripParams& p, int64_t row, int lane) {
  const float* src = p.src + p.src_rows.offset(row);
  float* dst = p.dst + p.dst_rows.offset(row);
  constexpr int kChunk = 32 * kVec;
  for (int32_t base = 0; base < p.cols; base += kChunk * kGroup) {
    float v[kGroup][kVec];
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
      load_cols<float, kVec, kVector>(src, p.src_rows.col_stride, base + g * kChunk + lane * kVec, p.cols, v[g]);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int32_t idx = base + g * kChunk + lane * kVec;
      const int k = block_scale_exponent<kVec>(v[g], idx, p.n_nope);
      const float inv_scale = math::pow2f(-k), scale = math::pow2f(k);
#pragma unroll
      for (int j = 0; j < kVec; j += 2) {
        const float2 q = fp8_hw::decode2(fp8_hw::encode2_scaled(v[g][j], v[g][j + 1], inv_scale));
        if (idx + j < p.n_nope) v[g][j] = q.x * scale;
        if (idx + j + 1 < p.n_nope) v[g][j + 1] = q.y * scale;
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
      store_cols<float, kVec, kVector>(dst, p.dst_rows.col_stride, base + g * kChunk + lane * kVec, p.cols, v[g]);
  }
}

template <int kVec, bool kVector>
__global__ void __launch_bounds__(kThreads) round_trip_kernel(const Fp8RoundTripParams p) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;  // whole warps leave together
  round_trip_row<kVec, kVector>(p, row, int(threadIdx.x & 31));
}

// ---- pack ---------------------------------------------------------------------------
template <class T, class Tail, int kVec, bool kVector>
__device__ __forceinline__ void pack_row(const Fp8PackParams& p, int64_t row, int lane) {
  const T* src = static_cast<const T*>(p.src) + p.src_rows.offset(row);
  uint8_t* codes = p.codes + p.code_rows.offset(row);
  uint8_t* scales = p.scales + p.scale_rows.offset(row);
  Tail* tail = p.maybe_tail ? static_cast<Tail*>(p.maybe_tail) + p.tail_rows.offset(row) : nullptr;
  const int64_t cs = p.code_rows.col_stride, ts = p.tail_rows.col_stride;
  constexpr int kChunk = 32 * kVec;
  constexpr int kLanesPerBlock = 64 / kVec;
  for (int32_t base = 0; base < p.cols; base += kChunk * kGroup) {
    float v[kGroup][kVec];
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
      load_cols<T, kVec, kVector>(src, p.src_rows.col_stride, base + g * kChunk + lane * kVec, p.cols, v[g]);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int32_t idx = base + g * kChunk + lane * kVec;
      const int k = block_scale_exponent<kVec>(v[g], idx, p.n_nope);
      if (lane % kLanesPerBlock == 0 && idx < p.n_nope)
        scales[int64_t(idx / math::kFp8Block) * p.scale_rows.col_stride] = math::ue8m0_encode(k);
      if constexpr (kVector) {
        if (idx < p.n_nope) {
          const float inv_scale = math::pow2f(-k);
          const uint32_t w = fp8_hw::encode2_scaled(v[g][0], v[g][1], inv_scale) |
                             (fp8_hw::encode2_scaled(v[g][2], v[g][3], inv_scale) << 16);
          *reinterpret_cast<uint32_t*>(codes + idx) = w;
        } else if (tail != nullptr && idx < p.cols) {
          uint2 q;
          q.x = uint32_t(bits_of(from_f32<Tail>(v[g][0]))) | (uint32_t(bits_of(from_f32<Tail>(v[g][1]))) << 16);
          q.y = uint32_t(bits_of(from_f32<Tail>(v[g][2]))) | (uint32_t(bits_of(from_f32<Tail>(v[g][3]))) << 16);
          *reinterpret_cast<uint2*>(tail + (idx - p.n_nope)) = q;
        }
      } else {
        const float inv_scale = math::pow2f(-k);
#pragma unroll
        for (int j = 0; j < kVec; j += 2) {
          const uint32_t w = fp8_hw::encode2_scaled(v[g][j], v[g][j + 1], inv_scale);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int32_t c = idx + j + h;
            if (c < p.n_nope) codes[int64_t(c) * cs] = uint8_t(w >> (8 * h));
            else if (tail != nullptr && c < p.cols) tail[int64_t(c - p.n_nope) * ts] = from_f32<Tail>(v[g][j + h]);
          }
        }
      }
    }
  }
  if (p.maybe_pad != nullptr && lane == 0) p.maybe_pad[p.pad_rows.offset(row)] = 0;
}

template <class T, class Tail, int kVec, bool kVector>
__global__ void __launch_bounds__(kThreads) pack_kernel(const Fp8PackParams p) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  pack_row<T, Tail, kVec, kVector>(p, row, int(threadIdx.x & 31));
}

// ---- unpack -------------------------------------------------------------------------
template <class T, class Tail, int kVec, bool kVector>
__device__ __forceinline__ void unpack_row(const Fp8UnpackParams& p, int64_t row, int lane) {
  const uint8_t* codes = p.codes + p.code_rows.offset(row);
  const uint8_t* scales = p.scales + p.scale_rows.offset(row);
  const Tail* tail = p.maybe_tail ? static_cast<const Tail*>(p.maybe_tail) + p.tail_rows.offset(row) : nullptr;
  T* dst = static_cast<T*>(p.dst) + p.dst_rows.offset(row);
  const int64_t cs = p.code_rows.col_stride, ts = p.tail_rows.col_stride;
  constexpr int kChunk = 32 * kVec;
  for (int32_t base = 0; base < p.cols; base += kChunk * kGroup) {
    float v[kGroup][kVec];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int32_t idx = base + g * kChunk + lane * kVec;
      if constexpr (kVector) {
        if (idx < p.n_nope) {
          const uint32_t w = *reinterpret_cast<const uint32_t*>(codes + idx);
          const float scale = math::ue8m0_decode(scales[int64_t(idx / math::kFp8Block) * p.scale_rows.col_stride]);
          const float2 lo = fp8_hw::decode2(w), hi = fp8_hw::decode2(w >> 16);
          v[g][0] = lo.x * scale;
          v[g][1] = lo.y * scale;
          v[g][2] = hi.x * scale;
          v[g][3] = hi.y * scale;
        } else if (tail != nullptr && idx < p.cols) {
          const uint2 q = *reinterpret_cast<const uint2*>(tail + (idx - p.n_nope));
          v[g][0] = to_f32(from_bits<Tail>(uint16_t(q.x & 0xffffu)));
          v[g][1] = to_f32(from_bits<Tail>(uint16_t(q.x >> 16)));
          v[g][2] = to_f32(from_bits<Tail>(uint16_t(q.y & 0xffffu)));
          v[g][3] = to_f32(from_bits<Tail>(uint16_t(q.y >> 16)));
        } else {
          v[g][0] = v[g][1] = v[g][2] = v[g][3] = 0.0f;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int32_t c = idx + j;
          if (c < p.n_nope)
            v[g][j] = math::fp8_decode_scaled(codes[int64_t(c) * cs],
                                              scales[int64_t(c / math::kFp8Block) * p.scale_rows.col_stride]);
          else if (tail != nullptr && c < p.cols) v[g][j] = to_f32(tail[int64_t(c - p.n_nope) * ts]);
          else v[g][j] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
      store_cols<T, kVec, kVector>(dst, p.dst_rows.col_stride, base + g * kChunk + lane * kVec, p.cols, v[g]);
  }
}

template <class T, class Tail, int kVec, bool kVector>
__global__ void __launch_bounds__(kThreads) unpack_kernel(const Fp8UnpackParams p) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  unpack_row<T, Tail, kVec, kVector>(p, row, int(threadIdx.x & 31));
}

// ---- launchers ------------------------------------------------------------------------
// Makes `device` current for the launch and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KVCORE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KVCORE_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

dim3 grid_for(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  require_arg(blocks <= INT32_MAX, "fp8 ops: ", rows, " rows exceed one launch");
  return dim3(static_cast<unsigned>(blocks));
}

template <class T, class Tail>
void launch_pack(const Fp8PackParams& p, bool vector, cudaStream_t s) {
  if (vector) pack_kernel<T, Tail, 4, true><<<grid_for(p.rows), kThreads, 0, s>>>(p);
  else pack_kernel<T, Tail, 2, false><<<grid_for(p.rows), kThreads, 0, s>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("fp8 pack_kernel");
}

template <class T, class Tail>
void launch_unpack(const Fp8UnpackParams& p, bool vector, cudaStream_t s) {
  if (vector) unpack_kernel<T, Tail, 4, true><<<grid_for(p.rows), kThreads, 0, s>>>(p);
  else unpack_kernel<T, Tail, 2, false><<<grid_for(p.rows), kThreads, 0, s>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("fp8 unpack_kernel");
}

}  // namespace

void fp8_round_trip_rows(const Fp8RoundTripParams& p, bool vector, int device, void* stream) {
  DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream);
  if (vector) round_trip_kernel<4, true><<<grid_for(p.rows), kThreads, 0, s>>>(p);
  else round_trip_kernel<2, false><<<grid_for(p.rows), kThreads, 0, s>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("fp8 round_trip_kernel");
}

void fp8_pack_rows(const Fp8PackParams& p, bool vector, int device, void* stream) {
  DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool b = p.tail_dtype == DType::BF16;
  switch (p.src_dtype) {
    case DType::F32: return b ? launch_pack<float, bf16>(p, vector, s) : launch_pack<float, f16>(p, vector, s);
    case DType::F16: return b ? launch_pack<f16, bf16>(p, vector, s) : launch_pack<f16, f16>(p, vector, s);
    default: return b ? launch_pack<bf16, bf16>(p, vector, s) : launch_pack<bf16, f16>(p, vector, s);
  }
}

void fp8_unpack_rows(const Fp8UnpackParams& p, bool vector, int device, void* stream) {
  DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool b = p.tail_dtype == DType::BF16;
  switch (p.dst_dtype) {
    case DType::F32: return b ? launch_unpack<float, bf16>(p, vector, s) : launch_unpack<float, f16>(p, vector, s);
    case DType::F16: return b ? launch_unpack<f16, bf16>(p, vector, s) : launch_unpack<f16, f16>(p, vector, s);
    default: return b ? launch_unpack<bf16, bf16>(p, vector, s) : launch_unpack<bf16, f16>(p, vector, s);
  }
}

}  // namespace kvcore::ops::cuda
