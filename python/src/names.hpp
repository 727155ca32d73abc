// The strings the Python API uses for kvcore's enums ("fp8", "on_read", ...), both ways.
// Unknown names throw kvcore::Error(InvalidArgument) naming the argument and the choices.
#pragma once
#include <string>

#include "kvcore/cache/dsv4_cache.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "kvcore/ops/rope.hpp"

namespace kvcore::py {

KvFormat parse_kv_format(const std::string& s, const char* arg);
const char* kv_format_str(KvFormat f);
RopeMode parse_rope_mode(const std::string& s);
const char* rope_mode_str(RopeMode m);
RopeSlice parse_rope_slice(const std::string& s);
RopePairing parse_rope_pairing(const std::string& s);
RopeScaling parse_rope_scaling(const std::string& s);
const char* rope_slice_str(RopeSlice s);
const char* rope_pairing_str(RopePairing p);
const char* rope_scaling_str(RopeScaling s);
RopeAttentionFactor parse_attention_factor(bool apply);
Dsv4Quant parse_quant(bool on);
Dsv4LayerKind parse_dsv4_layer_kind(const std::string& s);
const char* dsv4_layer_kind_str(Dsv4LayerKind k);

}  // namespace kvcore::py
