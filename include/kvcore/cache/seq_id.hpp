// The integer types every kvcore cache uses: SeqId names a sequence (handed out by the
// cache's create(), never reused by that cache); positions and token counts are int32_t.
#pragma once
#include <cstdint>

namespace kvcore {

using SeqId = int64_t;

}  // namespace kvcore
