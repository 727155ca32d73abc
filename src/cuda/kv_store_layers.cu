// The one-launch store of a step's K and V rows of every layer (ops/kv_store_layers.hpp).
// Grid: x = token, y = chunks of 256 units of that token, where a token's units are, per layer,
// its K rows then its V rows, each row split into 16-dim units (one thread each: two 16-byte
// loads of an f16 source, two 16-byte stores of an f16 row or one of an FP8 row). A CTA serves
// one token, so its RoPE angles are computed once into shared memory (not once per head and
// layer) and its slot is read once; the source loads are issued before either. Per-element math is kv_store's (ops/kv_store_row.hpp,
// ops/kv_store_vec.hpp): identical bytes.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/kv_store_chunk.cuh"
#include "ops/kv_store_layers_params.hpp"
#include "ops/kv_store_row.hpp"
#include "ops/kv_store_vec.hpp"

namespace kvcore::ops::cuda {

namespace {

static_assert(sizeof(KvStoreLayersParams) <= 4096, "kernel parameters are limited to 4 KB");

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ void load16(const void* src, DType t, int64_t i0, int64_t i1, float* x) {
  if (t == DType::F32) {
    kvvec::load8<float>(src, t, i0, x);
    kvvec::load8<float>(src, t, i1, x + 8);
  } else {
    kvvec::load8<uint16_t>(src, t, i0, x);
    kvvec::load8<uint16_t>(src, t, i1, x + 8);
  }
}

__global__ void __launch_bounds__(kThreads) kv_store_layers_kernel(const __grid_constant__ KvStoreLayersParams p) {
  __shared__ float2 angles[math::RopeTable::kMaxPairs];  // (cos, sin) of this token's pairs, unscaled
  const int32_t t = static_cast<int32_t>(blockIdx.x);
  const KvLayersUnit w = locate_unit(p, static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x);
  const bool active = w.active, is_k = w.is_k;
  const int32_t layer = w.layer, h = w.head, u = w.u, dim = w.dim, d0 = w.d0, d1 = w.d1;
  const bool neox = is_k && p.rot == KvLayersRot::Neox;
  // The source loads go out first: their latency hides behind the slot read and the angles.
  float x[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) x[k] = 0.0f;
  if (active) {
    const void* src = is_k ? p.k_src : p.v_src;
    const int64_t base = layer * (is_k ? p.k_layer_stride : p.v_layer_stride) +
                         t * (is_k ? p.k_token_stride : p.v_token_stride) + h * (is_k ? p.k_head_stride : p.v_head_stride);
    load16(src, is_k ? p.k_dtype : p.v_dtype, base + d0, base + d1, x);
  }
  const int32_t cell = p.slots[t];
  const bool rotates = p.maybe_positions != nullptr;
  if (rotates) {  // once per CTA (one token), for every head and layer of it
    const float pos = static_cast<float>(p.maybe_positions[t]);
    for (int32_t i = threadIdx.x; i < p.rope.layout.n_pairs(); i += kThreads) {
      float s, c;
      math::sincos_f32(math::rope_angle(pos, p.rope.freq[i]), &s, &c);
      angles[i] = make_float2(c, s);
    }
    __syncthreads();
    if (active && is_k) {
      float cs[8], sn[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float2 a = angles[8 * u + k];
        cs[k] = a.x;
        sn[k] = a.y;
      }
      kvvec::rotate8(x, p.rot == KvLayersRot::Interleaved, cs, sn, p.rope.attention_factor);
    }
  }
  const KvFormat f = is_k ? p.k_format : p.v_format;
  // FP8 group amax: every lane shuffles (rows of any format may share a warp; p.any_fp8 is
  // uniform over the grid). Rows start at multiples of their unit count (4, 8, 16 or 32), so
  // the lanes xor 1, 2 are one 64-dim group of a contiguous row (both chunks), and xor 1, 2, 4
  // one group per chunk of a NeoX row.
  float a_lo = chunk_amax(x), a_hi = chunk_amax(x + 8), a_row = 0.0f;
  if (p.any_fp8) {
    a_lo = fmaxf(a_lo, __shfl_xor_sync(kFull, a_lo, 1));
    a_hi = fmaxf(a_hi, __shfl_xor_sync(kFull, a_hi, 1));
    a_lo = fmaxf(a_lo, __shfl_xor_sync(kFull, a_lo, 2));
    a_hi = fmaxf(a_hi, __shfl_xor_sync(kFull, a_hi, 2));
    a_row = fmaxf(a_lo, a_hi);
    a_lo = fmaxf(a_lo, __shfl_xor_sync(kFull, a_lo, 4));
    a_hi = fmaxf(a_hi, __shfl_xor_sync(kFull, a_hi, 4));
  }
  if (!active || cell < 0 || cell >= p.num_cells) return;  // a skipped token: the whole CTA
  const int64_t row = static_cast<int64_t>(cell) * p.n_heads + h;
  void* pool = is_k ? p.k_pool[layer] : p.v_pool[layer];
  switch (f) {
    case KvFormat::F16:
      kvvec::store8<KvFormat::F16>(pool, row * dim + d0, x);
      kvvec::store8<KvFormat::F16>(pool, row * dim + d1, x + 8);
      break;
    case KvFormat::BF16:
      kvvec::store8<KvFormat::BF16>(pool, row * dim + d0, x);
      kvvec::store8<KvFormat::BF16>(pool, row * dim + d1, x + 8);
      break;
    case KvFormat::F32:
      kvvec::store8<KvFormat::F32>(pool, row * dim + d0, x);
      kvvec::store8<KvFormat::F32>(pool, row * dim + d1, x + 8);
      break;
    case KvFormat::Fp8: {
      uint8_t* dst = static_cast<uint8_t*>(pool) + row * dim;
      uint8_t* scales = (is_k ? p.k_scales[layer] : p.v_scales[layer]) + row * (dim / 64);
      if (!neox) {
        const int k = math::e4m3_scale_exponent(a_row);
        const uint2 c0 = fp8_codes8(x, k), c1 = fp8_codes8(x + 8, k);
        *reinterpret_cast<uint4*>(dst + d0) = make_uint4(c0.x, c0.y, c1.x, c1.y);
        if (u % 4 == 0) scales[d0 / 64] = math::ue8m0_encode(k);
      } else {
        const int k0 = math::e4m3_scale_exponent(a_lo), k1 = math::e4m3_scale_exponent(a_hi);
        *reinterpret_cast<uint2*>(dst + d0) = fp8_codes8(x, k0);
        *reinterpret_cast<uint2*>(dst + d1) = fp8_codes8(x + 8, k1);
        if (u % 8 == 0) {
          scales[d0 / 64] = math::ue8m0_encode(k0);
          scales[d1 / 64] = math::ue8m0_encode(k1);
        }
      }
      break;
    }
    case KvFormat::Dsv4Row: break;  // never planned (one_launch_params refuses it)
  }
}

}  // namespace

void kv_store_layers(const KvStoreLayersParams& p, Stream stream) {
  if (p.n_tokens == 0 || p.n_layers == 0) return;
  const int64_t units = token_units(p);
  const dim3 grid(static_cast<unsigned>(p.n_tokens), static_cast<unsigned>((units + kThreads - 1) / kThreads));
  kv_store_layers_kernel<<<grid, kThreads, 0, native(stream)>>>(p);
  KVCORE_CUDA_CHECK_LAUNCH("kv_store_layers_kernel");
}

}  // namespace kvcore::ops::cuda
