// Programmatic dependent launch (Hopper): a kernel launched as a dependent of the previous one in
// its stream starts while that one drains; it waits (pdl_wait) before reading what that one wrote,
// and a primary lets its dependents launch early (pdl_allow_dependents). Both are no-ops below
// sm_90 or when the kernel was launched plainly. Used by the split-K merge and the indexer top-k.
// launch_with is the one launcher of kernels that take launch attributes (PDL, clusters).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/check.cuh"

namespace kvcore::ops::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx: in thread-block
// clusters of cluster_x CTAs along x where cluster_x > 1, and as a programmatic dependent of the
// stream's previous kernel where pdl (a plain launch with neither).
template <class... KArgs, class... Args>
void launch_with(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, int cluster_x, bool pdl,
                 Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  KVCORE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent.
template <class... KArgs, class... Args>
void launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  launch_with(kernel, grid, block, smem, stream, 1, true, std::forward<Args>(args)...);
}

}  // namespace kvcore::ops::cuda
