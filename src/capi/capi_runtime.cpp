// The C API's error state, version queries and RoPE specs.
#include <string>

#include "capi/capi_guard.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore::capi {

namespace {
thread_local std::string t_last_error;
}

void set_last_error(const char* message) {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // no memory for the message: the status still tells what failed
  }
}

void clear_last_error() { t_last_error.clear(); }

RopeSpec rope_spec(const kvc_rope_spec* spec, const char* fn) {
  kvc_rope_spec defaults;
  kvc_rope_spec_init(&defaults, 0, 10000.0);
  const kvc_rope_spec c = read_versioned(spec, defaults, fn, "rope");
  RopeSpec s;
  s.n_rot = c.n_rot;
  require_arg(c.slice == KVC_ROPE_SLICE_HEAD || c.slice == KVC_ROPE_SLICE_TAIL, fn, ": rope.slice ", c.slice,
              " is not a KVC_ROPE_SLICE_*");
  require_arg(c.pairing == KVC_ROPE_PAIRING_NEOX || c.pairing == KVC_ROPE_PAIRING_INTERLEAVED, fn, ": rope.pairing ",
              c.pairing, " is not a KVC_ROPE_PAIRING_*");
  require_arg(c.scaling >= KVC_ROPE_SCALING_NONE && c.scaling <= KVC_ROPE_SCALING_YARN, fn, ": rope.scaling ",
              c.scaling, " is not a KVC_ROPE_SCALING_*");
  s.slice = c.slice == KVC_ROPE_SLICE_HEAD ? RopeSlice::Head : RopeSlice::Tail;
  s.pairing = c.pairing == KVC_ROPE_PAIRING_NEOX ? RopePairing::NeoX : RopePairing::Interleaved;
  s.scaling = static_cast<RopeScaling>(c.scaling);
  s.theta = c.theta;
  s.factor = c.factor;
  s.low_freq_factor = c.low_freq_factor;
  s.high_freq_factor = c.high_freq_factor;
  s.original_max_position = c.original_max_position;
  s.beta_fast = c.beta_fast;
  s.beta_slow = c.beta_slow;
  s.yarn_truncate = c.yarn_truncate != 0;
  require_arg(c.n_freq_factors >= 0 && (c.n_freq_factors == 0 || c.freq_factors), fn, ": rope.n_freq_factors ",
              c.n_freq_factors, " with freq_factors ", c.freq_factors ? "set" : "NULL");
  s.freq_factors.assign(c.freq_factors, c.freq_factors + c.n_freq_factors);
  s.attention_factor = c.attention_factor;
  return s;
}

}  // namespace kvcore::capi

using namespace kvcore;

extern "C" {

const char* kvc_last_error(void) { return capi::t_last_error.c_str(); }
uint32_t kvc_api_version(void) { return KVC_API_VERSION; }
const char* kvc_version(void) { return kvcore::version(); }

int32_t kvc_cuda_device_count(void) {
  try {
    return cuda_device_count();
  } catch (...) {
    return 0;
  }
}

void kvc_rope_spec_init(kvc_rope_spec* spec, int32_t n_rot, double theta) {
  if (!spec) return;
  const RopeSpec d = RopeSpec::plain(n_rot, theta);
  *spec = kvc_rope_spec{};
  spec->struct_size = sizeof(kvc_rope_spec);
  spec->n_rot = d.n_rot;
  spec->slice = KVC_ROPE_SLICE_HEAD;
  spec->pairing = KVC_ROPE_PAIRING_NEOX;
  spec->scaling = KVC_ROPE_SCALING_NONE;
  spec->theta = d.theta;
  spec->factor = d.factor;
  spec->low_freq_factor = d.low_freq_factor;
  spec->high_freq_factor = d.high_freq_factor;
  spec->original_max_position = d.original_max_position;
  spec->yarn_truncate = d.yarn_truncate ? 1 : 0;
  spec->beta_fast = d.beta_fast;
  spec->beta_slow = d.beta_slow;
  spec->freq_factors = nullptr;
  spec->n_freq_factors = 0;
  spec->attention_factor = d.attention_factor;
}

void kvc_rope_spec_llama3_8b(kvc_rope_spec* spec) {
  if (!spec) return;
  const RopeSpec d = RopeSpec::llama3_8b();
  kvc_rope_spec_init(spec, d.n_rot, d.theta);
  spec->scaling = KVC_ROPE_SCALING_LLAMA3;
  spec->factor = d.factor;
  spec->low_freq_factor = d.low_freq_factor;
  spec->high_freq_factor = d.high_freq_factor;
  spec->original_max_position = d.original_max_position;
}

}  // extern "C"
