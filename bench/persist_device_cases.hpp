// The device cases of `kvcore bench persist` (bench/persist_device_cases.cpp).
#pragma once
#include "bench/harness.hpp"

namespace kvcore::cli {

// Offload to pinned memory and back vs plain cudaMemcpyAsync, and prefix reuse from device and
// pinned memory vs recompute, on opt.device (CUDA; NotSupported without the CUDA backend).
void persist_device_cases(BenchOptions& opt);

}  // namespace kvcore::cli
