// DeepSeek-V4 per-element and per-row math, shared by the CPU and CUDA kernels:
// the per-channel softmax pool of the compressor, RMSNorm, the packed row formats,
// and thin row-level wrappers over the shared codecs (FP8 blocks: fp8_block.hpp;
// FP4 E2M1: fp4.hpp, NaN -> +6 as CUDA's __nv_cvt_float_to_fp4; Hadamard:
// hadamard.hpp) for the runtime sizes the ops take.
#pragma once
#include <cmath>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp4.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/fp8_block.hpp"
#include "kvcore/math/hadamard.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

// ---- FP8 / FP4 / Hadamard: the shared codecs (fp8_block.hpp, fp4.hpp, hadamard.hpp) ----
// FP8 round trip, in place, of dims [0, n_nope) in blocks of 64 (the last block
// may be partial, as in the seed). Rope dims are untouched.
KVCORE_HD void dsv4_fp8_round_trip_nope(float* row, int n_nope) {
  for (int off = 0; off < n_nope; off += kFp8Block) {
    const int n = (n_nope - off) < kFp8Block ? (n_nope - off) : kFp8Block;
    fp8_block_round_trip(row + off, 1, row + off, 1, n);
  }
}

// n^-0.5 rounded to f32 for a runtime power of two n in [32, 1024] (the indexer's
// head_dim; the op entry points check the range).
KVCORE_HD float dsv4_hadamard_scale(int n) {
  switch (n) {
    case 32: return hadamard_scale<32>();
    case 64: return hadamard_scale<64>();
    case 128: return hadamard_scale<128>();
    case 256: return hadamard_scale<256>();
    case 512: return hadamard_scale<512>();
    default: return hadamard_scale<1024>();
  }
}

// The shared orthonormal Hadamard transform (hadamard.hpp) for a runtime size n.
KVCORE_HD void dsv4_hadamard(float* x, int n) {
  switch (n) {
    case 32: hadamard_transform<32>(x); break;
    case 64: hadamard_transform<64>(x); break;
    case 128: hadamard_transform<128>(x); break;
    case 256: hadamard_transform<256>(x); break;
    case 512: hadamard_transform<512>(x); break;
    default: hadamard_transform<1024>(x); break;
  }
}

// FP4 round trip in blocks of 32 over the whole row (n a multiple of 32).
KVCORE_HD void dsv4_fp4_round_trip(float* x, int n) {
  for (int off = 0; off < n; off += kFp4Block) fp4_block_round_trip(x + off, x + off, kFp4Block);
}

// ---- Compressor pooling ---------------------------------------------------------
#if defined(__CUDA_ARCH__)
// CUDA's div.rn.f32 computes a / b as: r0 = rcp.approx(b); r = fma(r0, fma(-b, r0, 1), r0);
// q0 = fma(a, r, 0); q = fma(r, fma(-b, q0, a), q0), and takes a slow path only where its
// range check fails (denormal or extreme exponents, where the residual could lose bits).
// For a in [2^-64, 1] and b in [1, 256] nothing is near those ranges and q is a / b
// correctly rounded (Markstein's theorem: r within an ulp of 1/b, the residual exact), so
// several quotients by one b can share r and still equal a / b bit for bit.
__device__ __forceinline__ float div_rn_reciprocal(float b) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(b));
  return __fmaf_rn(r0, __fmaf_rn(-b, r0, 1.0f), r0);
}
__device__ __forceinline__ float div_rn_steps(float a, float b, float r) {
  const float q0 = __fmaf_rn(a, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(-b, q0, a), q0);
}
#endif

// Softmax over candidate logits z_j (-inf: no candidate, weight 0) and the
// weighted sum of values c_j, in HF's order: p_j = exp(z_j - max) / sum, then
// sum_j c_j * p_j. `At(j, &z, &c)` fetches candidate j.
template <class At>
KVCORE_HD float dsv4_pool(int n, const At& at) {
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    float z, c;
    at(j, z, c);
    mx = z > mx ? z : mx;
  }
  if (mx == -INFINITY) return 0.0f;
  float den = 0.0f;
  for (int j = 0; j < n; ++j) {
    float z, c;
    at(j, z, c);
    if (z != -INFINITY) den += expf(z - mx);
  }
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    float z, c;
    at(j, z, c);
    if (z != -INFINITY) acc += c * (expf(z - mx) / den);
  }
  return acc;
}

// The same pool with N candidates fetched once into registers (CSA and the
// indexer: N = 8), each exp computed once and reused (exp is a function: the same
// bits as computing it twice). Same operations in the same order: identical results.
// Branch-free (a GPU runs the candidates' exp, division and sum straight through and
// shares one reciprocal of den between the divisions): a -inf logit's exp(-inf - mx) is
// +0, which leaves den unchanged, and its weighted term is computed but not taken.
template <int N, class At>
KVCORE_HD float dsv4_pool_fixed(const At& at) {
  float zs[N], cs[N], es[N];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < N; ++j) at(j, zs[j], cs[j]);
  float mx = -INFINITY;
#if defined(__CUDA_ARCH__)
  // One max instruction a candidate. fmaxf skips NaN like the compare below and may differ
  // only in the sign of a zero maximum, which no later step sees (z - (+-0) and exp(+-0)).
#pragma unroll
  for (int j = 0; j < N; ++j) mx = fmaxf(mx, zs[j]);
#else
  for (int j = 0; j < N; ++j) mx = zs[j] > mx ? zs[j] : mx;
#endif
  if (mx == -INFINITY) return 0.0f;
  float den = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < N; ++j) {
    es[j] = expf(zs[j] - mx);
    den += es[j];
  }
  float acc = 0.0f;
#if defined(__CUDA_ARCH__)
  // The N quotients es[j] / den share den: when every one is in div.rn's plain range, its
  // steps with den's reciprocal refined once (the same bits, see div_rn_steps); else div.rn.
  // (A -inf logit has es 0 and a NaN makes den NaN: both take div.rn.)
  float emin = es[0];
#pragma unroll
  for (int j = 1; j < N; ++j) emin = fminf(emin, es[j]);
  if (emin >= 0x1p-64f && den >= 1.0f && den <= 256.0f) {
    const float r = div_rn_reciprocal(den);
#pragma unroll
    for (int j = 0; j < N; ++j) acc = __fmaf_rn(cs[j], div_rn_steps(es[j], den, r), acc);
    return acc;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float t = __fmaf_rn(cs[j], es[j] / den, acc);
    acc = zs[j] != -INFINITY ? t : acc;
  }
#else
  for (int j = 0; j < N; ++j) {
    const float t = acc + cs[j] * (es[j] / den);
    acc = zs[j] != -INFINITY ? t : acc;
  }
#endif
  return acc;
}

// The same pool in one pass (online softmax: the running max rescales the sums),
// so each candidate is read once: HCA pools 128 candidates per channel and a
// three-pass pool would stream them from memory three times. Agrees with the
// three-pass form to a few ulps (a different rounding order). Candidates are
// fetched kBatch at a time into registers (on a GPU, kBatch loads in flight instead
// of one), then folded in order: the arithmetic does not depend on the batching.
// One candidate at a time folded into the running (max, denominator, weighted sum):
// the arithmetic of dsv4_pool_online, shared with kernels that fetch candidates
// their own way (same operations in the same order: identical bits).
struct Dsv4OnlineFold {
  float mx = -INFINITY, den = 0.0f, acc = 0.0f;
  // Branch-free: both updates are computed from one exp and the right one is taken (a GPU
  // warp whose lanes disagree on z > mx would otherwise run both sides, each with its exp).
  KVCORE_HD void add(float z, float c) {
    const bool up = z > mx;
    // up: the rescale factor exp(mx - z) (0 on the first candidate), else exp(z - mx); both are
    // exp(-|z - mx|) (a - b = -(b - a) exactly; exp(+-0) = 1): one subtraction, no select.
    const float e = expf(-fabsf(z - mx));
    const float den_up = den * e + 1.0f, acc_up = acc * e + c;
    const float den_in = den + e, acc_in = acc + c * e;
    const bool skip = z == -INFINITY;
    den = skip ? den : (up ? den_up : den_in);
    acc = skip ? acc : (up ? acc_up : acc_in);
    mx = up ? z : mx;  // a -inf logit is never > mx
  }
  KVCORE_HD float result() const { return mx == -INFINITY ? 0.0f : acc / den; }
};

template <class At>
KVCORE_HD float dsv4_pool_online(int n, const At& at) {
  constexpr int kBatch = 8;
  Dsv4OnlineFold fold;
  for (int j0 = 0; j0 < n; j0 += kBatch) {
    float zs[kBatch], cs[kBatch];
    if (j0 + kBatch <= n) {  // a full batch: straight-line fetches, all loads issued before any use
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int b = 0; b < kBatch; ++b) at(j0 + b, zs[b], cs[b]);
    } else {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int b = 0; b < kBatch; ++b) {
        if (j0 + b < n) {
          at(j0 + b, zs[b], cs[b]);
        } else {  // no candidate: skipped below like a -inf logit
          zs[b] = -INFINITY;
          cs[b] = 0.0f;
        }
      }
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int b = 0; b < kBatch; ++b) fold.add(zs[b], cs[b]);
  }
  return fold.result();
}

// Pool over n candidates: CSA and the indexer (8) through registers in HF's
// order, HCA (and any other count) in one pass.
template <class At>
KVCORE_HD float dsv4_pool_any(int n, const At& at) {
  return n == 8 ? dsv4_pool_fixed<8>(at) : dsv4_pool_online(n, at);
}

// Candidate j of channel k for emission from a state laid out [rows, width]:
// overlap (CSA, indexer): rows 0..m-1 read lane A (first half of the width),
// rows m..2m-1 lane B (second half); otherwise (HCA) row j, channel k.
KVCORE_HD int dsv4_candidate_col(int j, int k, int ratio, int head_dim, bool overlap) {
  return overlap ? (j < ratio ? k : head_dim + k) : k;
}

// RMSNorm scale of a row: 1 / sqrt(mean(x^2) + eps), sum in index order.
KVCORE_HD float dsv4_rms_scale(const float* x, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  return 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
}

// ---- Packed rows ------------------------------------------------------------------
// Attention row (Dsv4RowLayout, 584 B): packed by the shared dsv4_row_pack
// (fp8_block.hpp); one value read back here for the kernels that need a single dim.
KVCORE_HD float dsv4_unpack_attention_value(const uint8_t* in, int d) {
  using L = Dsv4RowLayout;
  if (d < L::kNope) return fp8_decode_scaled(in[L::kNopeOffset + d], in[L::kScaleOffset + d / kFp8Block]);
  const int i = d - L::kNope;
  const uint16_t h = static_cast<uint16_t>(in[L::kRopeOffset + 2 * i] | (in[L::kRopeOffset + 2 * i + 1] << 8));
  return bf16_bits_to_f32(h);
}

// Indexer row, packed FP4 (DeepSeek-specific packing on the shared fp4.hpp codec):
// n/2 bytes of nibbles (low nibble = even element), then n/32 UE8M0 scale bytes.
// 128 dims: 64 + 4 = 68 bytes. The shared codec keeps one code per byte.
constexpr KVCORE_HD int dsv4_fp4_row_bytes(int n) { return n / 2 + n / kFp4Block; }

// Packs a row that has already been Hadamard-transformed (not yet quantized).
KVCORE_HD void dsv4_pack_fp4_row(const float* x, int n, uint8_t* out) {
  for (int b = 0; b < n / kFp4Block; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < kFp4Block; ++i) amax = finite_abs_max(amax, x[b * kFp4Block + i]);
    const int k = e2m1_scale_exponent(amax);
    for (int i = 0; i < kFp4Block; i += 2) {
      const int d = b * kFp4Block + i;
      out[d / 2] = static_cast<uint8_t>(e2m1_encode_scaled(x[d], k) | (e2m1_encode_scaled(x[d + 1], k) << 4));
    }
    out[n / 2 + b] = ue8m0_encode(k);
  }
}

KVCORE_HD float dsv4_unpack_fp4_value(const uint8_t* in, int n, int d) {
  const uint8_t byte = in[d / 2];
  const uint8_t code = (d & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xfu);
  return e2m1_decode(code) * ue8m0_decode(in[n / 2 + d / kFp4Block]);
}

}  // namespace kvcore::math
