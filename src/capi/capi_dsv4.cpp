// C API: the DeepSeek-V4 cache.
#include <memory>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "kvcore/cache/dsv4_cache.hpp"

using namespace kvcore;
using capi::guard;
using capi::need;

namespace {

// The 43-layer schedule as C ints; kvc_dsv4_config_v4_flash points layer_kinds at it.
const std::vector<int32_t>& flash_kinds() {
  static const std::vector<int32_t> kinds = [] {
    std::vector<int32_t> k;
    for (Dsv4LayerKind l : Dsv4CacheConfig::v4_flash_schedule()) k.push_back(static_cast<int32_t>(l));
    return k;
  }();
  return kinds;
}

kvc_dsv4_config defaults() {
  kvc_dsv4_config c;
  kvc_dsv4_config_v4_flash(&c, 65536, 1);
  return c;
}

}  // namespace

extern "C" {

void kvc_dsv4_config_v4_flash(kvc_dsv4_config* cfg, int64_t max_context, int32_t max_seqs) {
  if (!cfg) return;
  Dsv4CacheConfig d;
  try {
    d = Dsv4CacheConfig::v4_flash(max_context, max_seqs);
  } catch (...) {
    d.max_context = max_context;  // validated when the cache is created
    d.max_seqs = max_seqs;
  }
  *cfg = kvc_dsv4_config{};
  cfg->struct_size = sizeof(kvc_dsv4_config);
  cfg->layer_kinds = flash_kinds().data();
  cfg->n_layers = static_cast<int32_t>(flash_kinds().size());
  cfg->head_dim = d.head_dim;
  cfg->n_rot = d.n_rot;
  cfg->window = d.window;
  cfg->csa_ratio = d.csa_ratio;
  cfg->hca_ratio = d.hca_ratio;
  cfg->index_heads = d.index_heads;
  cfg->index_dim = d.index_dim;
  cfg->index_topk = d.index_topk;
  cfg->max_context = max_context;
  cfg->max_seqs = max_seqs;
  cfg->quant = d.quant == Dsv4Quant::On ? 1 : 0;
  cfg->packed = d.packed ? 1 : 0;
  cfg->stream = nullptr;
}

kvc_status kvc_dsv4_create(const kvc_dsv4_config* cfg, kvc_device device, kvc_dsv4_cache** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_dsv4_create";
    need(out, fn, "out");
    const kvc_dsv4_config c = capi::read_versioned(cfg, defaults(), fn, "cfg");
    require_arg(c.n_layers >= 0 && (c.n_layers == 0 || c.layer_kinds), fn, ": layer_kinds must hold n_layers = ",
                c.n_layers, " entries");
    Dsv4CacheConfig d;
    d.layers.clear();
    for (int32_t i = 0; i < c.n_layers; ++i) {
      const int32_t k = c.layer_kinds[i];
      require_arg(k >= KVC_DSV4_WINDOW && k <= KVC_DSV4_HCA, fn, ": layer_kinds[", i, "] = ", k,
                  " is not a KVC_DSV4_*");
      d.layers.push_back(static_cast<Dsv4LayerKind>(k));
    }
    d.head_dim = c.head_dim;
    d.n_rot = c.n_rot;
    d.window = c.window;
    d.csa_ratio = c.csa_ratio;
    d.hca_ratio = c.hca_ratio;
    d.index_heads = c.index_heads;
    d.index_dim = c.index_dim;
    d.index_topk = c.index_topk;
    d.max_context = c.max_context;
    d.max_seqs = c.max_seqs;
    d.quant = c.quant ? Dsv4Quant::On : Dsv4Quant::Off;
    d.packed = c.packed != 0;
    d.stream = capi::stream(c.stream);
    auto h = std::unique_ptr<kvc_dsv4_cache>(new kvc_dsv4_cache{Dsv4Cache(std::move(d), capi::device(device))});
    *out = h.release();
  });
}

void kvc_dsv4_free(kvc_dsv4_cache* cache) { delete cache; }

kvc_status kvc_dsv4_set_weights(kvc_dsv4_cache* cache, int32_t layer, const DLTensor* comp_ape,
                                const DLTensor* comp_norm, const DLTensor* idx_ape, const DLTensor* idx_norm) {
  return guard([&] {
    need(cache, "kvc_dsv4_set_weights", "cache")
        ->cache.set_weights(layer, Dsv4LayerWeights{capi::tensor(comp_ape), capi::tensor(comp_norm),
                                                    capi::tensor(idx_ape), capi::tensor(idx_norm)});
  });
}

kvc_status kvc_dsv4_seq_create(kvc_dsv4_cache* cache, int64_t* out_seq) {
  return guard([&] {
    need(out_seq, "kvc_dsv4_seq_create", "out_seq");
    *out_seq = need(cache, "kvc_dsv4_seq_create", "cache")->cache.create();
  });
}

kvc_status kvc_dsv4_seq_erase(kvc_dsv4_cache* cache, int64_t seq) {
  return guard([&] { need(cache, "kvc_dsv4_seq_erase", "cache")->cache.erase(seq); });
}

kvc_status kvc_dsv4_seq_truncate(kvc_dsv4_cache* cache, int64_t seq, int32_t n) {
  return guard([&] { need(cache, "kvc_dsv4_seq_truncate", "cache")->cache.truncate(seq, n); });
}

kvc_status kvc_dsv4_append(kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t pos, const DLTensor* kv,
                           const DLTensor* comp_c, const DLTensor* comp_z, const DLTensor* idx_c,
                           const DLTensor* idx_z) {
  return guard([&] {
    constexpr const char* fn = "kvc_dsv4_append";
    need(cache, fn, "cache");
    need(kv, fn, "kv");
    cache->cache.append(seq, layer, pos,
                        Dsv4TokenInputs{capi::tensor(kv), capi::tensor(comp_c), capi::tensor(comp_z),
                                        capi::tensor(idx_c), capi::tensor(idx_z)});
  });
}

kvc_status kvc_dsv4_length(const kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t* out) {
  return guard([&] {
    need(out, "kvc_dsv4_length", "out");
    *out = need(cache, "kvc_dsv4_length", "cache")->cache.length(seq, layer);
  });
}

kvc_status kvc_dsv4_compressed_rows(const kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t* out) {
  return guard([&] {
    need(out, "kvc_dsv4_compressed_rows", "out");
    *out = need(cache, "kvc_dsv4_compressed_rows", "cache")->cache.compressed_rows(seq, layer);
  });
}

kvc_status kvc_dsv4_read(const kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t which, float* out,
                         size_t cap, size_t* n_floats) {
  return guard([&] {
    constexpr const char* fn = "kvc_dsv4_read";
    need(cache, fn, "cache");
    need(n_floats, fn, "n_floats");
    require_arg(which == 0 || which == 1, fn, ": which must be 0 (window) or 1 (compressed), got ", which);
    const std::vector<float> rows =
        which == 0 ? cache->cache.read_window(seq, layer) : cache->cache.read_compressed(seq, layer);
    *n_floats = rows.size();
    require_arg(rows.size() <= cap && (rows.empty() || out), fn, ": ", rows.size(), " floats, cap is ", cap);
    std::copy(rows.begin(), rows.end(), out);
  });
}

kvc_status kvc_dsv4_shift(kvc_dsv4_cache* cache, int64_t seq, int32_t n_keep, int32_t n_discard) {
  return guard([&] { need(cache, "kvc_dsv4_shift", "cache")->cache.shift(seq, n_keep, n_discard); });
}

}  // extern "C"
