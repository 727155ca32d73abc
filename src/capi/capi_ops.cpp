// C API: shift_dense and the FP8 codecs.
#include <vector>

#include "capi/capi_guard.hpp"
#include "kvcore/ops/fp8.hpp"
#include "kvcore/ops/shift.hpp"

using namespace kvcore;
using capi::guard;
using capi::need;

extern "C" {

void kvc_shift_layer_init(kvc_shift_layer* layer) {
  if (!layer) return;
  *layer = kvc_shift_layer{};
  layer->struct_size = sizeof(kvc_shift_layer);
}

kvc_status kvc_shift_dense(const kvc_shift_layer* layers, size_t n_layers, int64_t length, int64_t n_keep,
                           int64_t n_discard, void* stream) {
  return guard([&] {
    constexpr const char* fn = "kvc_shift_dense";
    require_arg(n_layers == 0 || layers, fn, ": layers is NULL for n_layers = ", n_layers);
    const uint32_t stride = n_layers ? layers[0].struct_size : 0;
    require_arg(n_layers == 0 || stride >= sizeof(uint32_t), fn, ": layers[0].struct_size is ", stride,
                " (fill each with kvc_shift_layer_init)");
    kvc_shift_layer d;
    kvc_shift_layer_init(&d);
    std::vector<ShiftDenseLayer> out(n_layers);
    for (size_t i = 0; i < n_layers; ++i) {
      const auto* raw = reinterpret_cast<const kvc_shift_layer*>(reinterpret_cast<const char*>(layers) + i * stride);
      require_arg(raw->struct_size == stride, fn, ": layers[", i, "].struct_size ", raw->struct_size,
                  " differs from layers[0]'s ", stride);
      const kvc_shift_layer l = capi::read_versioned(raw, d, fn, "layers[i]");
      need(l.k, fn, "layers[i].k");
      need(l.rope, fn, "layers[i].rope");
      // uint8 keys: e4m3 codes when scales come with them, else DeepSeek-V4 rows.
      out[i].k = capi::tensor(l.k, l.k_scales ? DType::E4M3 : DType::U8);
      out[i].maybe_k_scales = capi::tensor(l.k_scales, DType::UE8M0);
      out[i].maybe_v = capi::tensor(l.v);
      out[i].rope = capi::rope_spec(l.rope, fn);
    }
    shift_dense(out, length, n_keep, n_discard, capi::stream(stream));
  });
}

kvc_status kvc_fp8_round_trip_rows(const DLTensor* src, const DLTensor* dst, int32_t n_rot, void* stream) {
  return guard([&] {
    need(src, "kvc_fp8_round_trip_rows", "src");
    need(dst, "kvc_fp8_round_trip_rows", "dst");
    fp8_round_trip_rows(capi::tensor(src), capi::tensor(dst), n_rot, capi::stream(stream));
  });
}

kvc_status kvc_fp8_pack_rows(const DLTensor* src, const DLTensor* codes, const DLTensor* scales, const DLTensor* tail,
                             void* stream) {
  return guard([&] {
    constexpr const char* fn = "kvc_fp8_pack_rows";
    need(src, fn, "src");
    need(codes, fn, "codes");
    need(scales, fn, "scales");
    fp8_pack_rows(capi::tensor(src), capi::tensor(codes, DType::E4M3), capi::tensor(scales, DType::UE8M0),
                  capi::tensor(tail), capi::stream(stream));
  });
}

kvc_status kvc_fp8_unpack_rows(const DLTensor* codes, const DLTensor* scales, const DLTensor* tail,
                               const DLTensor* dst, void* stream) {
  return guard([&] {
    constexpr const char* fn = "kvc_fp8_unpack_rows";
    need(codes, fn, "codes");
    need(scales, fn, "scales");
    need(dst, fn, "dst");
    fp8_unpack_rows(capi::tensor(codes, DType::E4M3), capi::tensor(scales, DType::UE8M0), capi::tensor(tail),
                    capi::tensor(dst), capi::stream(stream));
  });
}

kvc_status kvc_dsv4_pack_rows(const DLTensor* src, const DLTensor* packed, void* stream) {
  return guard([&] {
    need(src, "kvc_dsv4_pack_rows", "src");
    need(packed, "kvc_dsv4_pack_rows", "packed");
    dsv4_pack_rows(capi::tensor(src), capi::tensor(packed), capi::stream(stream));
  });
}

kvc_status kvc_dsv4_unpack_rows(const DLTensor* packed, const DLTensor* dst, void* stream) {
  return guard([&] {
    need(packed, "kvc_dsv4_unpack_rows", "packed");
    need(dst, "kvc_dsv4_unpack_rows", "dst");
    dsv4_unpack_rows(capi::tensor(packed), capi::tensor(dst), capi::stream(stream));
  });
}

}  // extern "C"
