// Host side of tma.hpp: cuTensorMapEncodeTiled, found once through the runtime.
#include "cuda/common/tma.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

namespace kvcore::ops::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f)
                                                                   : nullptr;
  }();
  return fn;
}

}  // namespace

bool encode_pool_map(CUtensorMap* map, const void* base, int64_t cells, int heads, int row_elems, int64_t head_stride,
                     int64_t cell_stride, int box_cells) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (encode == nullptr || cells <= 0 || heads <= 0 || row_elems < 64 || box_cells <= 0 || box_cells > 256) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(row_elems), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(cells)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_stride) * 2, static_cast<cuuint64_t>(cell_stride) * 2};  // bytes
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_cells)};
  const cuuint32_t steps[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(base), dims, strides, box, steps,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace kvcore::ops::cuda
