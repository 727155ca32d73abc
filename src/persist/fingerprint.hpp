// Pieces of layout fingerprints shared by the PagedCache and Dsv4Cache snapshots.
#pragma once
#include <string>

#include "kvcore/math/rope_spec.hpp"

namespace kvcore::persist {
std::string hex_double(double v);                // exact: "%a"
std::string rope_spec_line(const RopeSpec& r);   // every field, doubles exact
}  // namespace kvcore::persist
