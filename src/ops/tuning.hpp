// Internal, for benchmarks and tests only (not installed, not part of the API): the
// choices the public ops make by rule, as arguments. Every choice computes the same
// function; only which kernel runs changes. Nothing here reads the process environment.
#pragma once
#include <cstdint>
#include <span>

#include "kvcore/ops/shift.hpp"
#include "kvcore/stream.hpp"
#include "ops/shift_params.hpp"

namespace kvcore::ops {

// kvcore::shift_dense with its CUDA kernel chosen by the caller (ShiftKernel::Auto: what the
// public op does). Validation and errors are the public op's.
void shift_dense(std::span<const ShiftDenseLayer> layers, int64_t length, int64_t n_keep, int64_t n_discard,
                 ShiftKernel kernel, Stream stream = {});

}  // namespace kvcore::ops
