// Tensor maps (the Tensor Memory Accelerator's descriptors of a tensor in global memory) built on
// the host, for kernels that copy boxes of them with tma.cuh. The driver's encoder is reached
// through the runtime's entry-point query: nothing links libcuda.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace kvcore::ops::cuda {

// A 3-D map over a paged pool of 16-bit rows, [cells][heads][row_elems] with element strides
// head_stride and cell_stride: boxes of 64 elements x 1 head x box_cells cells, each 64-element
// line 128 bytes, 128-byte swizzled (the wgmma tile layout of wgmma_primitives.cuh, 8 lines an
// atom). Returns false where the encoder refuses the shape (alignment, strides, box); the caller
// then takes another kernel.
bool encode_pool_map(CUtensorMap* map, const void* base, int64_t cells, int heads, int row_elems, int64_t head_stride,
                     int64_t cell_stride, int box_cells);

}  // namespace kvcore::ops::cuda
