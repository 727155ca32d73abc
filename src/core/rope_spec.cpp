#include "kvcore/math/rope_spec.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "kvcore/error.hpp"

namespace kvcore {

// Every field is checked, whatever `scaling` selects: a field that is not used now is used
// as soon as someone switches the scaling, and a NaN there is a bug either way.
void RopeSpec::validate(int head_dim) const {
  require_arg(head_dim > 0, "RopeSpec: head_dim must be > 0, got ", head_dim);
  require_arg(slice == RopeSlice::Head || slice == RopeSlice::Tail, "RopeSpec.slice must be Head or Tail, got ",
              static_cast<int>(slice));
  require_arg(pairing == RopePairing::NeoX || pairing == RopePairing::Interleaved,
              "RopeSpec.pairing must be NeoX or Interleaved, got ", static_cast<int>(pairing));
  require_arg(static_cast<uint8_t>(scaling) <= static_cast<uint8_t>(RopeScaling::Yarn),
              "RopeSpec.scaling must be None, Linear, Llama3 or Yarn, got ", static_cast<int>(scaling));
  require_arg(n_rot > 0 && n_rot % 2 == 0, "RopeSpec.n_rot must be even and > 0, got ", n_rot);
  require_arg(n_rot <= head_dim, "RopeSpec.n_rot = ", n_rot, " does not fit head_dim = ", head_dim);
  require_arg(std::isfinite(theta) && theta > 1.0, "RopeSpec.theta must be finite and > 1, got ", theta);
  require_arg(std::isfinite(attention_factor) && attention_factor > 0, "RopeSpec.attention_factor must be finite and > 0, got ",
              attention_factor);
  require_arg(std::isfinite(factor) && factor > 0, "RopeSpec.factor must be finite and > 0, got ", factor);
  require_arg(std::isfinite(low_freq_factor) && low_freq_factor > 0, "RopeSpec.low_freq_factor must be finite and > 0, got ",
              low_freq_factor);
  require_arg(std::isfinite(high_freq_factor) && high_freq_factor > 0,
              "RopeSpec.high_freq_factor must be finite and > 0, got ", high_freq_factor);
  if (scaling == RopeScaling::Llama3)
    require_arg(high_freq_factor > low_freq_factor, "RopeSpec: Llama-3 high_freq_factor (", high_freq_factor,
                ") must exceed low_freq_factor (", low_freq_factor, ")");
  require_arg(original_max_position > 0, "RopeSpec.original_max_position must be > 0, got ", original_max_position);
  require_arg(std::isfinite(beta_fast) && beta_fast > 0, "RopeSpec.beta_fast must be finite and > 0, got ", beta_fast);
  require_arg(std::isfinite(beta_slow) && beta_slow > 0, "RopeSpec.beta_slow must be finite and > 0, got ", beta_slow);
  require_arg(freq_factors.empty() || freq_factors.size() == static_cast<size_t>(n_rot / 2),
              "RopeSpec.freq_factors must have n_rot/2 = ", n_rot / 2, " entries, got ", freq_factors.size());
  for (size_t i = 0; i < freq_factors.size(); ++i)
    require_arg(freq_factors[i] > 0 && std::isfinite(freq_factors[i]), "RopeSpec.freq_factors[", i, "] must be finite and > 0, got ",
                freq_factors[i]);
}

math::RopeLayout RopeSpec::layout(int head_dim) const {
  validate(head_dim);
  math::RopeLayout l;
  l.n_rot = n_rot;
  l.first_dim = slice == RopeSlice::Head ? 0 : head_dim - n_rot;
  l.interleaved = pairing == RopePairing::Interleaved ? 1 : 0;
  return l;
}

std::string RopeSpec::describe() const {
  std::ostringstream os;
  static const char* kScaling[] = {"none", "linear", "llama3", "yarn"};
  os << "rope(n_rot " << n_rot << ", " << (slice == RopeSlice::Head ? "head" : "tail") << ", "
     << (pairing == RopePairing::NeoX ? "neox" : "interleaved") << ", theta " << theta << ", scaling "
     << (static_cast<int>(scaling) < 4 ? kScaling[static_cast<int>(scaling)] : "?");
  if (scaling != RopeScaling::None) os << " x" << factor;
  if (!freq_factors.empty()) os << ", freq_factors";
  if (attention_factor != 1.0) os << ", attention_factor " << attention_factor;
  os << ")";
  return os.str();
}

RopeSpec RopeSpec::plain(int n, double th, RopePairing p) {
  RopeSpec s;
  s.n_rot = n;
  s.theta = th;
  s.pairing = p;
  return s;
}

RopeSpec RopeSpec::llama3_8b() {
  RopeSpec s = plain(128, 500000.0);
  s.scaling = RopeScaling::Llama3;
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position = 8192;
  return s;
}

RopeSpec RopeSpec::deepseek_v4_window() {
  RopeSpec s = plain(64, 10000.0, RopePairing::Interleaved);
  s.slice = RopeSlice::Tail;
  return s;
}

RopeSpec RopeSpec::deepseek_v4_compressed() {
  RopeSpec s = plain(64, 160000.0, RopePairing::Interleaved);
  s.slice = RopeSlice::Tail;
  s.scaling = RopeScaling::Yarn;
  s.factor = 16.0;
  s.original_max_position = 65536;
  s.beta_fast = 32.0;
  s.beta_slow = 1.0;
  return s;
}

std::vector<double> rope_frequencies_f64(const RopeSpec& spec) {
  spec.validate(spec.n_rot > 0 ? spec.n_rot : 1);  // every field (the head_dim check cannot fail here)
  const int h = spec.n_rot / 2;
  const double d = spec.n_rot;
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  std::vector<double> w(h);
  for (int i = 0; i < h; ++i) w[i] = std::pow(spec.theta, -2.0 * i / d);

  switch (spec.scaling) {
    case RopeScaling::None: break;
    case RopeScaling::Linear:
      for (double& x : w) x /= spec.factor;
      break;
    case RopeScaling::Llama3: {
      // Wavelengths longer than the original context / low_freq_factor are divided by
      // `factor`; shorter than / high_freq_factor are kept; a smooth blend in between.
      const double old_ctx = spec.original_max_position;
      const double low_wavelen = old_ctx / spec.low_freq_factor;
      const double high_wavelen = old_ctx / spec.high_freq_factor;
      for (double& x : w) {
        const double wavelen = kTwoPi / x;
        if (wavelen > low_wavelen) {
          x = x / spec.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (old_ctx / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor);
          x = (1.0 - smooth) * x / spec.factor + smooth * x;
        }
      }
      break;
    }
    case RopeScaling::Yarn: {
      auto correction_dim = [&](double rotations) {
        return d * std::log(spec.original_max_position / (rotations * kTwoPi)) / (2.0 * std::log(spec.theta));
      };
      double low = correction_dim(spec.beta_fast);
      double high = correction_dim(spec.beta_slow);
      if (spec.yarn_truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, d - 1.0);
      if (low == high) high += 0.001;  // avoid a zero-width ramp, as HF does
      for (int i = 0; i < h; ++i) {
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        w[i] = w[i] * (1.0 - ramp) + (w[i] / spec.factor) * ramp;
      }
      break;
    }
  }
  if (!spec.freq_factors.empty()) {
    require_arg(spec.freq_factors.size() == static_cast<size_t>(h), "RopeSpec.freq_factors must have n_rot/2 = ", h,
                " entries, got ", spec.freq_factors.size());
    for (int i = 0; i < h; ++i) w[i] /= spec.freq_factors[i];
  }
  return w;
}

double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  require_arg(std::isfinite(factor) && factor > 0, "yarn_attention_factor: factor must be finite and > 0, got ", factor);
  require_arg(std::isfinite(mscale) && std::isfinite(mscale_all_dim), "yarn_attention_factor: mscale (", mscale,
              ") and mscale_all_dim (", mscale_all_dim, ") must be finite");
  auto m = [&](double k) { return factor <= 1.0 ? 1.0 : 0.1 * k * std::log(factor) + 1.0; };
  if (mscale != 0.0 && mscale_all_dim != 0.0) return m(mscale) / m(mscale_all_dim);
  return m(1.0);
}

std::vector<float> rope_frequencies(const RopeSpec& spec) {
  const std::vector<double> w = rope_frequencies_f64(spec);
  return std::vector<float>(w.begin(), w.end());
}

}  // namespace kvcore

namespace kvcore {

math::RopeTable make_rope_table(const RopeSpec& spec, int head_dim) {
  math::RopeTable t{};
  t.layout = spec.layout(head_dim);  // validates
  require_arg(t.layout.n_pairs() <= math::RopeTable::kMaxPairs, "RopeSpec.n_rot = ", spec.n_rot, " exceeds ",
              2 * math::RopeTable::kMaxPairs, " rotated dims");
  const std::vector<float> w = rope_frequencies(spec);
  for (int i = 0; i < t.layout.n_pairs(); ++i) t.freq[i] = w[i];
  t.attention_factor = static_cast<float>(spec.attention_factor);
  return t;
}

}  // namespace kvcore
