// Per-device facts and settings of the CUDA backend, in one place: the SM count, the compute
// capability and the opt-in above 48 KB of dynamic shared memory. All are per device: an SM count cached for
// the first GPU is wrong on a GPU of another kind, and cudaFuncSetAttribute changes the
// kernel on the current device only, so an opt-in made once per process leaves a second
// GPU at the default limit (its launches then fail). Plain host code, safe from any thread.
#pragma once
#include <cstddef>

namespace kvcore::ops::cuda {

// Streaming multiprocessors of `device` (queried once per device).
int sm_count(int device);

// Compute capability of `device` as 10 * major + minor (90: Hopper; queried once per device).
// Arch-specific code (sm_90a) runs only on the capability it was built for.
int compute_capability(int device);

// The calling thread's current device.
int current_device();

// Raises `kernel`'s dynamic shared-memory limit on `device`, which must be the current
// device, to at least `bytes` (the kernel's static shared memory counts against the same
// limit, so pass the most it will ever take). The driver is called only when the limit
// recorded for (kernel, device) is lower, so calling this before every launch costs a
// lookup, not a driver call.
void smem_opt_in(const void* kernel, size_t bytes, int device);

template <class Kernel>
void smem_opt_in(Kernel* kernel, size_t bytes, int device) {
  smem_opt_in(reinterpret_cast<const void*>(kernel), bytes, device);
}

}  // namespace kvcore::ops::cuda
