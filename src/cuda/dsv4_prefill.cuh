// The prefill fast path (dsv4_prefill.cu): windows whose candidates all lie in the chunk,
// for the model's row shapes. prefill (dsv4.cu) runs windows [w0, wa) through its general
// kernel and [wa, w1) through this one.
#pragma once
#include <cstdint>

#include "kvcore/stream.hpp"
#include "ops/dsv4_params.hpp"

namespace kvcore::dsv4::cuda {

// wa: the first window the fast path takes (w1 = (pos + n_tokens) / ratio when it takes none:
// another shape, unaligned inputs, or KVCORE_DSV4_PREFILL=generic).
int64_t prefill_fast_first_window(const CompressorParams& p);
void prefill_fast(const CompressorParams& p, int64_t wa, int64_t wb, Stream s);

}  // namespace kvcore::dsv4::cuda
