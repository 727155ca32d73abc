// RopeSpec: the full description of a model's rotary embedding, and the
// per-pair frequency table derived from it (host only, computed in double and
// rounded once to f32). Variants: plain, linear, Llama-3, YaRN; optional
// per-pair frequency factors; head or tail slice; NeoX or interleaved pairs.
//
// Thread safety: plain values and pure functions; safe to call concurrently.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvcore/math/rope.hpp"

namespace kvcore {

enum class RopeSlice : uint8_t { Head, Tail };
enum class RopePairing : uint8_t { NeoX, Interleaved };
enum class RopeScaling : uint8_t { None, Linear, Llama3, Yarn };

struct RopeSpec {
  int n_rot = 0;  // rotated dims, even, <= head_dim
  RopeSlice slice = RopeSlice::Head;
  RopePairing pairing = RopePairing::NeoX;
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::None;
  double factor = 1.0;  // linear / Llama-3 / YaRN factor
  // Llama-3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;  // Llama-3 and YaRN
  // YaRN
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool yarn_truncate = true;  // floor/ceil the correction range (DeepSeek-V4, HF default)
  // Optional per-pair divisors (llama.cpp's rope_freqs), n_rot/2 entries: w_i / f_i.
  std::vector<float> freq_factors;
  // Magnitude applied to cos and sin at write time only (YaRN mscale). A shift
  // never applies it again.
  double attention_factor = 1.0;

  // Throws kvcore::Error(InvalidArgument) naming the field when the spec does not fit head_dim.
  void validate(int head_dim) const;
  math::RopeLayout layout(int head_dim) const;
  std::string describe() const;

  static RopeSpec plain(int n_rot, double theta, RopePairing pairing = RopePairing::NeoX);
  static RopeSpec llama3_8b();              // 128 dims, theta 500000, Llama-3 factors
  static RopeSpec deepseek_v4_compressed();  // tail 64, interleaved, theta 160000, YaRN 16 / 65536
  static RopeSpec deepseek_v4_window();      // tail 64, interleaved, theta 10000
};

// n_rot/2 frequencies w_i (radians per position), computed in double and rounded to f32.
std::vector<float> rope_frequencies(const RopeSpec& spec);
// The table kernels take: layout for this head_dim, f32 frequencies, attention factor.
math::RopeTable make_rope_table(const RopeSpec& spec, int head_dim);
// The same in double, for float64 references.
std::vector<double> rope_frequencies_f64(const RopeSpec& spec);

// YaRN's attention factor as HF transformers derives it when a config gives none
// (modeling_rope_utils._compute_yarn_parameters): with m(s, k) = 1 for s <= 1, else
// 0.1 * k * ln(s) + 1, it is m(factor, mscale) / m(factor, mscale_all_dim) when both
// mscales are given (non-zero), else m(factor, 1). DeepSeek-V4 sets it to 1 explicitly.
double yarn_attention_factor(double factor, double mscale = 0.0, double mscale_all_dim = 0.0);

}  // namespace kvcore
