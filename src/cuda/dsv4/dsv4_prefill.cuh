// The prefill fast path (dsv4_prefill.cu): the model's row shapes with 16-byte aligned inputs,
// in one fused launch: the one or two windows at the chunk's start that take candidates from
// the state (the general body), the windows whose candidates all lie in the chunk (the fast
// kernels), and, for a chunk at position 0 (no window reads the state), the state update.
#pragma once
#include <cstdint>

#include "kvcore/stream.hpp"
#include "ops/dsv4_params.hpp"

namespace kvcore::ops::cuda::dsv4 {

using namespace ::kvcore::dsv4;  // the ops layer's Params

// false: the fast path does not apply (another shape, unaligned inputs, or no window that it
// would take): nothing was launched. true: every window was
// launched, and *state_done says whether the state update was too (else it is the caller's).
bool prefill_fast(const CompressorParams& p, Stream s, bool* state_done);

}  // namespace kvcore::ops::cuda::dsv4
