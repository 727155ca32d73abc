// A line-by-line C++ replica of seed 002's FP8 code (Metal, ds4 dsv4_kv.metal):
// the E4M3FN value table, the binary-search dequantizer and the float
// log2/exp2 block scale. Tests compare kvcore's integer codec against it.
// Metal's abs/min/clamp are written out as the C++ equivalents for finite inputs.
#pragma once
#include <cmath>

namespace codec_seed {

inline float e4m3fn_value(int i) {
  static const float exp_scale[16] = {0.0f, 0.015625f, 0.03125f, 0.0625f, 0.125f, 0.25f, 0.5f, 1.0f,
                                      2.0f, 4.0f,      8.0f,     16.0f,   32.0f,  64.0f, 128.0f, 256.0f};
  const int exp = (i >> 3) & 0x0f;
  const int mant = i & 0x07;
  return exp == 0 ? float(mant) * 0.001953125f : (1.0f + float(mant) * 0.125f) * exp_scale[exp];
}

// dsv4_e4m3fn_dequant: the nearest E4M3FN value (ties to the even code) of a finite x.
inline float e4m3fn_dequant(float x) {
  const float sign = x < 0.0f ? -1.0f : 1.0f;
  const float ax = std::fmin(std::fabs(x), 448.0f);
  int lo = 0;
  int hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (e4m3fn_value(mid) <= ax) lo = mid;
    else hi = mid - 1;
  }
  int best = lo;
  if (best < 126) {
    const float best_diff = std::fabs(ax - e4m3fn_value(best));
    const float next_diff = std::fabs(ax - e4m3fn_value(best + 1));
    if (next_diff < best_diff || (next_diff == best_diff && ((best + 1) & 1) == 0 && (best & 1) != 0)) best = best + 1;
  }
  return sign * e4m3fn_value(best);
}

inline float clamp448(float v) { return std::fmin(std::fmax(v, -448.0f), 448.0f); }

// The seed's block scale from the block's amax (before the 1e-4 floor).
inline float block_scale(float amax_raw) {
  const float amax = std::fmax(amax_raw, 1.0e-4f);
  return std::exp2(std::ceil(std::log2(amax / 448.0f)));
}

// One value through the seed's round trip with a given scale.
inline float round_trip(float v, float scale) { return e4m3fn_dequant(clamp448(v / scale)) * scale; }

// The seed's block of n values (kernel_dsv4_kv_fp8_store_f32's partial-block rule: amax of
// the valid values), in place.
inline void block_round_trip(float* v, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  const float scale = block_scale(amax);
  for (int i = 0; i < n; ++i) v[i] = round_trip(v[i], scale);
}

}  // namespace codec_seed
