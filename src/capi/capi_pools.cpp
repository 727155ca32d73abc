// C API: PagedCache over engine-allocated pool memory, and the cache's stream.
#include <memory>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "kvcore/cache/paged_cache.hpp"

using namespace kvcore;
using capi::guard;
using capi::need;

namespace {

int32_t part_code(PoolPart p) {
  switch (p) {
    case PoolPart::KData: return KVC_POOL_K;
    case PoolPart::KScales: return KVC_POOL_K_SCALES;
    case PoolPart::VData: return KVC_POOL_V;
    case PoolPart::VScales: return KVC_POOL_V_SCALES;
  }
  return -1;
}

}  // namespace

extern "C" {

void kvc_pool_spec_init(kvc_pool_spec* spec) {
  if (!spec) return;
  *spec = kvc_pool_spec{};
  spec->struct_size = sizeof(kvc_pool_spec);
}

kvc_status kvc_paged_pool_specs(const kvc_paged_config* cfg, kvc_pool_spec* out, size_t cap, size_t* n) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_pool_specs";
    need(n, fn, "n");
    const std::vector<PagedPoolSpec> specs = paged_pool_specs(capi::paged_config(cfg, fn));
    *n = specs.size();
    require_arg(specs.size() <= cap, fn, ": the config needs ", specs.size(), " pool arrays, cap is ", cap);
    need(out, fn, "out");
    require_arg(out->struct_size >= sizeof(uint32_t), fn, ": out->struct_size is ", out->struct_size,
                " (fill the structs with kvc_pool_spec_init first)");
    const uint32_t stride = out->struct_size, size = std::min<uint32_t>(stride, sizeof(kvc_pool_spec));
    for (size_t i = 0; i < specs.size(); ++i) {
      const PagedPoolSpec& s = specs[i];
      kvc_pool_spec r{};
      r.struct_size = size;
      r.layer = s.layer;
      r.part = part_code(s.part);
      r.dtype = to_dl_dtype(s.dtype);
      for (int d = 0; d < 4; ++d) r.shape[d] = s.shape[d];
      r.bytes = s.bytes;
      std::memcpy(reinterpret_cast<char*>(out) + i * stride, &r, size);
    }
  });
}

kvc_status kvc_paged_create_with_pools(const kvc_paged_config* cfg, kvc_device device, const DLTensor* pools,
                                       size_t n_pools, kvc_paged_cache** out) {
  return guard([&] {
    constexpr const char* fn = "kvc_paged_create_with_pools";
    need(out, fn, "out");
    require_arg(n_pools == 0 || pools, fn, ": pools is NULL for n_pools = ", n_pools);
    PagedCacheConfig c = capi::paged_config(cfg, fn);
    std::vector<TensorRef> refs;
    for (size_t i = 0; i < n_pools; ++i) refs.push_back(capi::tensor(&pools[i]));
    auto h = std::unique_ptr<kvc_paged_cache>(
        new kvc_paged_cache{PagedCache(std::move(c), capi::device(device), refs), 0});
    *out = h.release();
  });
}

kvc_status kvc_paged_set_stream(kvc_paged_cache* cache, void* stream) {
  return guard([&] { need(cache, "kvc_paged_set_stream", "cache")->cache.set_stream(capi::stream(stream)); });
}

}  // extern "C"
