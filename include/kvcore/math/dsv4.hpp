// DeepSeek-V4 per-element and per-row math, shared by the CPU and CUDA kernels:
// the FP8 block round trip of a row's nope dims, the per-channel softmax pool of
// the compressor, RMSNorm, the 128-point Hadamard transform and FP4 E2M1 blocks
// of the indexer rows, and the packed row formats.
//
// FP4 and the Hadamard transform live here as small private helpers (dsv4_*)
// because the shared codec headers (fp4.hpp, hadamard.hpp) are being written
// on another branch; the lead unifies them at merge.
#pragma once
#include <cmath>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/fp8.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/math/hd.hpp"

namespace kvcore::math {

// ---- FP8 block round trip (seed: kernel_dsv4_fp8_kv_quantize_f32) ---------------
// Scale exponent of the block starting at `first`, `n` values (<= 64).
KVCORE_HD int dsv4_fp8_block_exponent(const float* v, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = finite_abs_max(amax, v[i]);
  return e4m3_scale_exponent(amax);
}

// FP8 round trip, in place, of dims [0, n_nope) in blocks of 64 (the last block
// may be partial, as in the seed). Rope dims are untouched.
KVCORE_HD void dsv4_fp8_round_trip_nope(float* row, int n_nope) {
  for (int off = 0; off < n_nope; off += kFp8Block) {
    const int n = (n_nope - off) < kFp8Block ? (n_nope - off) : kFp8Block;
    const int k = dsv4_fp8_block_exponent(row + off, n);
    for (int i = 0; i < n; ++i) row[off + i] = e4m3_round_trip(row[off + i], k);
  }
}

// ---- FP4 E2M1 (indexer rows) -------------------------------------------------------
// 1 sign, 2 exponent (bias 1), 1 mantissa bit: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
// Round to nearest, ties to the even code, saturate to +-6; NaN encodes as +0
// (FP4 has no NaN; NaN never sets a block scale either).
inline constexpr float kE2M1Max = 6.0f;
inline constexpr int kFp4Block = 32;  // values per UE8M0 scale

KVCORE_HD uint8_t dsv4_e2m1_encode(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 28) & 0x8u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0;                        // NaN
  if (a >= 0x40c00000u) return static_cast<uint8_t>(sign | 0x7u);  // >= 6 (and inf): saturate
  uint32_t code = minifloat_round_code<1, 127>(a);      // smallest normal 2^0, subnormal step 0.5
  if (code > 0x7u) code = 0x7u;
  return static_cast<uint8_t>(sign | code);
}

KVCORE_HD float dsv4_e2m1_decode(uint8_t c) {
  const uint32_t m = c & 0x7u;
  // magnitudes as exact f32: code 1 -> 0.5, codes >= 2: (1 + mant/2) * 2^(exp-1)
  const float mag = m == 0 ? 0.0f
                    : m == 1 ? 0.5f
                             : bits_float((static_cast<uint32_t>((m >> 1) - 1 + 127) << 23) | ((m & 1u) << 22));
  return (c & 0x8u) ? -mag : mag;
}

// UE8M0 exponent for an FP4 block: 2^ceil(log2(max(amax, 1e-4) / 6)); 6 = 1.5 * 2^2.
KVCORE_HD int dsv4_e2m1_scale_exponent(float amax) {
  const float a = (amax >= kScaleAmaxFloor) ? amax : kScaleAmaxFloor;
  return pow2_scale_exponent<0x400000u, 2>(a);
}

KVCORE_HD float dsv4_e2m1_round_trip(float v, int k) {
  return dsv4_e2m1_decode(dsv4_e2m1_encode(v * pow2f(-k))) * pow2f(k);
}

// ---- Hadamard (indexer rows and queries) ------------------------------------------
// In-place Sylvester-ordered Walsh-Hadamard transform of n = 2^j values, scaled by
// n^-0.5 (orthonormal, so q.k is preserved when both sides are transformed).
// Only additions and subtractions, then one multiply per value: every backend
// gets identical bits for identical inputs.
KVCORE_HD float dsv4_inv_sqrt_pow2(int n) {
  // n = 2^j: n^-0.5 = 2^(-j/2), times sqrt(1/2) when j is odd.
  int j = 0;
  while ((1 << j) < n) ++j;
  const float p = pow2f(-(j / 2));
  return (j & 1) ? p * 0.70710678118654752440f : p;
}

KVCORE_HD void dsv4_hadamard(float* x, int n) {
  for (int h = 1; h < n; h <<= 1)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float s = dsv4_inv_sqrt_pow2(n);
  for (int i = 0; i < n; ++i) x[i] = x[i] * s;
}

// FP4 round trip in blocks of 32 over the whole row (n a multiple of 32).
KVCORE_HD void dsv4_fp4_round_trip(float* x, int n) {
  for (int off = 0; off < n; off += kFp4Block) {
    float amax = 0.0f;
    for (int i = 0; i < kFp4Block; ++i) amax = finite_abs_max(amax, x[off + i]);
    const int k = dsv4_e2m1_scale_exponent(amax);
    for (int i = 0; i < kFp4Block; ++i) x[off + i] = dsv4_e2m1_round_trip(x[off + i], k);
  }
}

// ---- Compressor pooling ---------------------------------------------------------
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
// indexer: N = 8). Same operations in the same order: identical results.
template <int N, class At>
KVCORE_HD float dsv4_pool_fixed(const At& at) {
  float zs[N], cs[N];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < N; ++j) at(j, zs[j], cs[j]);
  return dsv4_pool(N, [&](int j, float& z, float& c) {
    z = zs[j];
    c = cs[j];
  });
}

// The same pool in one pass (online softmax: the running max rescales the sums),
// so each candidate is read once: HCA pools 128 candidates per channel and a
// three-pass pool would stream them from memory three times. Agrees with the
// three-pass form to a few ulps (a different rounding order).
template <class At>
KVCORE_HD float dsv4_pool_online(int n, const At& at) {
  float mx = -INFINITY, den = 0.0f, acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    float z, c;
    at(j, z, c);
    if (z == -INFINITY) continue;
    if (z > mx) {
      const float r = expf(mx - z);  // 0 on the first candidate
      den = den * r + 1.0f;
      acc = acc * r + c;
      mx = z;
    } else {
      const float e = expf(z - mx);
      den += e;
      acc += c * e;
    }
  }
  return mx == -INFINITY ? 0.0f : acc / den;
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
// Attention row (Dsv4RowLayout, 584 B): 448 e4m3 codes, 64 bf16 rope values,
// 7 UE8M0 scale bytes, 1 pad byte. Packs an f32 row whose nope dims are not yet
// quantized: unpacking gives the FP8 round trip of the nope dims and bf16 rope dims.
KVCORE_HD void dsv4_pack_attention_row(const float* row, uint8_t* out) {
  using L = Dsv4RowLayout;
  for (int b = 0; b < L::kBlocks; ++b) {
    const int k = dsv4_fp8_block_exponent(row + b * 64, 64);
    const float inv = pow2f(-k);
    for (int i = 0; i < 64; ++i) out[L::kNopeOffset + b * 64 + i] = e4m3_encode(e4m3_scaled(row[b * 64 + i], inv));
    out[L::kScaleOffset + b] = ue8m0_encode(k);
  }
  for (int i = 0; i < L::kRope; ++i) {
    const uint16_t h = f32_to_bf16_bits(row[L::kNope + i]);
    out[L::kRopeOffset + 2 * i] = static_cast<uint8_t>(h & 0xffu);
    out[L::kRopeOffset + 2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  out[L::kPadOffset] = 0;
}

KVCORE_HD float dsv4_unpack_attention_value(const uint8_t* in, int d) {
  using L = Dsv4RowLayout;
  if (d < L::kNope) return e4m3_decode(in[L::kNopeOffset + d]) * ue8m0_decode(in[L::kScaleOffset + d / 64]);
  const int i = d - L::kNope;
  const uint16_t h = static_cast<uint16_t>(in[L::kRopeOffset + 2 * i] | (in[L::kRopeOffset + 2 * i + 1] << 8));
  return bf16_bits_to_f32(h);
}

// Indexer row, packed FP4 (kvcore's simulation format until the codec branch
// lands a shared one): n/2 bytes of nibbles (low nibble = even element), then
// n/32 UE8M0 scale bytes. 128 dims: 64 + 4 = 68 bytes.
constexpr KVCORE_HD int dsv4_fp4_row_bytes(int n) { return n / 2 + n / kFp4Block; }

// Packs a row that has already been Hadamard-transformed (not yet quantized).
KVCORE_HD void dsv4_pack_fp4_row(const float* x, int n, uint8_t* out) {
  for (int b = 0; b < n / kFp4Block; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < kFp4Block; ++i) amax = finite_abs_max(amax, x[b * kFp4Block + i]);
    const int k = dsv4_e2m1_scale_exponent(amax);
    const float inv = pow2f(-k);
    for (int i = 0; i < kFp4Block; i += 2) {
      const int d = b * kFp4Block + i;
      out[d / 2] = static_cast<uint8_t>(dsv4_e2m1_encode(x[d] * inv) | (dsv4_e2m1_encode(x[d + 1] * inv) << 4));
    }
    out[n / 2 + b] = ue8m0_encode(k);
  }
}

KVCORE_HD float dsv4_unpack_fp4_value(const uint8_t* in, int n, int d) {
  const uint8_t byte = in[d / 2];
  const uint8_t code = (d & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xfu);
  return dsv4_e2m1_decode(code) * ue8m0_decode(in[n / 2 + d / kFp4Block]);
}

}  // namespace kvcore::math
