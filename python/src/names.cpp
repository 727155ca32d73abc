#include "names.hpp"

#include "kvcore/error.hpp"

namespace kvcore::py {

namespace {
[[noreturn]] void bad(const char* arg, const std::string& got, const char* choices) {
  throw Error(ErrorCode::InvalidArgument,
              detail::concat("argument '", arg, "' must be one of ", choices, ", got '", got, "'"));
}
}  // namespace

KvFormat parse_kv_format(const std::string& s, const char* arg) {
  if (s == "f32" || s == "float32") return KvFormat::F32;
  if (s == "f16" || s == "float16") return KvFormat::F16;
  if (s == "bf16" || s == "bfloat16") return KvFormat::BF16;
  if (s == "fp8") return KvFormat::Fp8;
  if (s == "dsv4row") return KvFormat::Dsv4Row;
  bad(arg, s, "'f32', 'f16', 'bf16', 'fp8', 'dsv4row'");
}
const char* kv_format_str(KvFormat f) { return kv_format_name(f).data(); }

RopeMode parse_rope_mode(const std::string& s) {
  if (s == "stored") return RopeMode::RopeStored;
  if (s == "on_read") return RopeMode::RopeOnRead;
  bad("rope_mode", s, "'stored', 'on_read'");
}
const char* rope_mode_str(RopeMode m) { return m == RopeMode::RopeStored ? "stored" : "on_read"; }

RopeSlice parse_rope_slice(const std::string& s) {
  if (s == "head") return RopeSlice::Head;
  if (s == "tail") return RopeSlice::Tail;
  bad("slice", s, "'head', 'tail'");
}
RopePairing parse_rope_pairing(const std::string& s) {
  if (s == "neox") return RopePairing::NeoX;
  if (s == "interleaved") return RopePairing::Interleaved;
  bad("pairing", s, "'neox', 'interleaved'");
}
RopeScaling parse_rope_scaling(const std::string& s) {
  if (s == "none") return RopeScaling::None;
  if (s == "linear") return RopeScaling::Linear;
  if (s == "llama3") return RopeScaling::Llama3;
  if (s == "yarn") return RopeScaling::Yarn;
  bad("scaling", s, "'none', 'linear', 'llama3', 'yarn'");
}
const char* rope_slice_str(RopeSlice s) { return s == RopeSlice::Head ? "head" : "tail"; }
const char* rope_pairing_str(RopePairing p) { return p == RopePairing::NeoX ? "neox" : "interleaved"; }
const char* rope_scaling_str(RopeScaling s) {
  switch (s) {
    case RopeScaling::None: return "none";
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Llama3: return "llama3";
    case RopeScaling::Yarn: return "yarn";
  }
  return "?";
}
RopeAttentionFactor parse_attention_factor(bool apply) {
  return apply ? RopeAttentionFactor::Apply : RopeAttentionFactor::Skip;
}
Dsv4Quant parse_quant(bool on) { return on ? Dsv4Quant::On : Dsv4Quant::Off; }

Dsv4LayerKind parse_dsv4_layer_kind(const std::string& s) {
  if (s == "window") return Dsv4LayerKind::Window;
  if (s == "csa") return Dsv4LayerKind::CSA;
  if (s == "hca") return Dsv4LayerKind::HCA;
  bad("layers", s, "'window', 'csa', 'hca'");
}
const char* dsv4_layer_kind_str(Dsv4LayerKind k) {
  switch (k) {
    case Dsv4LayerKind::Window: return "window";
    case Dsv4LayerKind::CSA: return "csa";
    case Dsv4LayerKind::HCA: return "hca";
  }
  return "?";
}

}  // namespace kvcore::py
