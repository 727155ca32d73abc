// Small integer lists from Python (an int, a sequence, or a CPU int tensor) as host vectors.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <vector>

namespace kvcore::py {
std::vector<int32_t> host_i32(nanobind::handle obj, const char* name);
std::vector<int64_t> host_i64(nanobind::handle obj, const char* name);
}  // namespace kvcore::py
