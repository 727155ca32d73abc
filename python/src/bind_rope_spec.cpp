// kvcore.RopeSpec: a model's rotary embedding (kvcore/math/rope_spec.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "names.hpp"

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

void bind_rope_spec(nb::module_& m) {
  nb::class_<RopeSpec>(m, "RopeSpec",
                       "A model's rotary embedding: which dims rotate (n_rot, slice), how they pair, the base\n"
                       "frequency theta and the scaling variant (none, linear, llama3, yarn).\n\n"
                       "Build one with RopeSpec(n_rot, theta, ...) or a preset: RopeSpec.llama3_8b(),\n"
                       "RopeSpec.deepseek_v4_compressed(), RopeSpec.deepseek_v4_window().")
      .def(
          "__init__",
          [](RopeSpec* self, int n_rot, double theta, const std::string& pairing, const std::string& slice,
             const std::string& scaling, double factor, double low_freq_factor, double high_freq_factor,
             int original_max_position, double beta_fast, double beta_slow, bool yarn_truncate,
             std::vector<float> freq_factors, double attention_factor) {
            RopeSpec s;
            s.n_rot = n_rot;
            s.theta = theta;
            s.pairing = parse_rope_pairing(pairing);
            s.slice = parse_rope_slice(slice);
            s.scaling = parse_rope_scaling(scaling);
            s.factor = factor;
            s.low_freq_factor = low_freq_factor;
            s.high_freq_factor = high_freq_factor;
            s.original_max_position = original_max_position;
            s.beta_fast = beta_fast;
            s.beta_slow = beta_slow;
            s.yarn_truncate = yarn_truncate;
            s.freq_factors = std::move(freq_factors);
            s.attention_factor = attention_factor;
            new (self) RopeSpec(std::move(s));
          },
          "n_rot"_a, "theta"_a = 10000.0, nb::kw_only(), "pairing"_a = "neox", "slice"_a = "head",
          "scaling"_a = "none", "factor"_a = 1.0, "low_freq_factor"_a = 1.0, "high_freq_factor"_a = 4.0,
          "original_max_position"_a = 8192, "beta_fast"_a = 32.0, "beta_slow"_a = 1.0, "yarn_truncate"_a = true,
          "freq_factors"_a = std::vector<float>{}, "attention_factor"_a = 1.0,
          "n_rot: rotated dims (even, <= head_dim); pairing 'neox' (halves) or 'interleaved' (adjacent);\n"
          "slice 'head' (first n_rot dims) or 'tail' (last n_rot); scaling 'none', 'linear', 'llama3' or\n"
          "'yarn' with its factors; freq_factors: optional n_rot/2 divisors; attention_factor scales cos\n"
          "and sin at write time only (YaRN mscale).")
      .def_static("plain", [](int n_rot, double theta) { return RopeSpec::plain(n_rot, theta); }, "n_rot"_a,
                  "theta"_a = 10000.0, "Unscaled NeoX RoPE over the first n_rot dims.")
      .def_static("llama3_8b", &RopeSpec::llama3_8b, "Llama-3-8B: 128 dims, theta 500000, Llama-3 scaling.")
      .def_static("deepseek_v4_compressed", &RopeSpec::deepseek_v4_compressed,
                  "DeepSeek-V4 compressed rows: tail 64 dims, interleaved, theta 160000, YaRN 16 / 65536.")
      .def_static("deepseek_v4_window", &RopeSpec::deepseek_v4_window,
                  "DeepSeek-V4 window rows: tail 64 dims, interleaved, theta 10000.")
      .def_ro("n_rot", &RopeSpec::n_rot)
      .def_ro("theta", &RopeSpec::theta)
      .def_prop_ro("pairing", [](const RopeSpec& s) { return rope_pairing_str(s.pairing); })
      .def_prop_ro("slice", [](const RopeSpec& s) { return rope_slice_str(s.slice); })
      .def_prop_ro("scaling", [](const RopeSpec& s) { return rope_scaling_str(s.scaling); })
      .def_ro("factor", &RopeSpec::factor)
      .def_ro("attention_factor", &RopeSpec::attention_factor)
      .def("validate", &RopeSpec::validate, "head_dim"_a,
           "Raise InvalidArgumentError naming the field when the spec does not fit head_dim.")
      .def("frequencies", &rope_frequencies, "The n_rot/2 frequencies (radians per position) as float32 values.")
      .def("frequencies_f64", &rope_frequencies_f64, "The same frequencies in float64.")
      .def("__repr__", [](const RopeSpec& s) { return "RopeSpec(" + s.describe() + ")"; });
}

}  // namespace kvcore::py
