// Arguments the persistence bindings share: paths and byte strings (model ids, salts, values).
#pragma once
#include <nanobind/nanobind.h>

#include <string>

namespace kvcore::py {
// A str or os.PathLike path; InvalidArgument naming `name` otherwise.
std::string path_arg(nanobind::handle p, const char* name);
// The bytes of a str (UTF-8) or a bytes-like object; InvalidArgument naming `name` otherwise.
std::string bytes_arg(nanobind::handle b, const char* name);
}  // namespace kvcore::py
