// The Python-side PagedCache: the C++ cache plus an edit counter, so an attention plan can tell
// it went stale (any metadata change after plan()) instead of reading freed blocks.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/paged_cache.hpp"
#include "capi/paged_plan.hpp"
#include "kvcore/ops/attention.hpp"
#include "tensors.hpp"

namespace kvcore::py {

struct PyPagedCache {
  // Caller pool memory (PagedCache(..., pools=)): the DLPack exports that keep it allocated, and
  // the caller's tensors as given (None when the cache allocated its pools). Declared before
  // `cache`, so they outlive it.
  std::vector<nb::ndarray<>> pool_arrays;
  nb::object pools;
  PagedCache cache;
  uint64_t epoch = 0;  // bumped by every call that changes metadata
};

// A step's attention plan (capi::PagedPlan) plus what Python needs around it: a reference to its
// cache (kept alive), the cache's edit count when planned (a later edit makes it stale) and the
// caller's sinks tensor.
struct PyAttentionPlan {
  nb::object cache_obj;
  PyPagedCache* cache = nullptr;
  uint64_t epoch = 0;
  Tensor sinks;
  std::optional<capi::PagedPlan> plan;
};

// The stream of this call: `stream`, else torch's current stream (CUDA caches; CPU ignores it).
// Sets it as the cache's stream, so the call's cache work and what it orders after run there.
void use_stream(PyPagedCache& c, nb::handle stream);

}  // namespace kvcore::py
