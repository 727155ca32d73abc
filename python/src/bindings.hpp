// The parts of the kvcore._ext module, one per concept.
#pragma once
#include <nanobind/nanobind.h>

namespace kvcore::py {
void bind_rope_spec(nanobind::module_& m);
void bind_ops(nanobind::module_& m);
void bind_attention_ops(nanobind::module_& m);
void bind_paged_cache(nanobind::module_& m);
void bind_dsv4(nanobind::module_& m);
void bind_persist(nanobind::module_& m);  // after bind_paged_cache and bind_dsv4: adds methods to their classes
void bind_stores(nanobind::module_& m);   // StoreKey, KvStore and its stores
void bind_offload(nanobind::module_& m);  // after bind_paged_cache and bind_stores
}  // namespace kvcore::py
