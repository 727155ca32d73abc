// kvcore::Error -> Python: kvcore.Error and one subclass per ErrorCode that also derives from
// the matching built-in (ValueError, MemoryError, NotImplementedError, RuntimeError), so callers
// catch either; the message is the C++ what() unchanged.
#pragma once
#include <nanobind/nanobind.h>

namespace kvcore::py {
void bind_errors(nanobind::module_& m);
}
