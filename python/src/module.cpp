// kvcore._ext: the compiled part of the Python package (nanobind over the C++ API).
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "errors.hpp"

NB_MODULE(_ext, m) {
  m.doc() = "kvcore's compiled bindings; import kvcore instead.";
  kvcore::py::bind_errors(m);
  kvcore::py::bind_rope_spec(m);
  kvcore::py::bind_ops(m);
  kvcore::py::bind_attention_ops(m);
  kvcore::py::bind_paged_cache(m);
  kvcore::py::bind_dsv4(m);
  kvcore::py::bind_persist(m);
  kvcore::py::bind_stores(m);
  kvcore::py::bind_offload(m);
}
