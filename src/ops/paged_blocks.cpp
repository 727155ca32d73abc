// Entry points of PagedCache's block kernels (paged_blocks_params.hpp): the backend of the
// memory the arrays live in.
#include "ops/paged_blocks_params.hpp"

namespace kvcore::ops {

void paged_copy_blocks(const PagedCopyBlocksParams& p, Device device, Stream stream) {
  if (device.is_cpu()) return kvcore::cpu::paged_copy_blocks(p);
#if KVCORE_WITH_CUDA
  cuda::paged_copy_blocks(p, stream);
#endif
  (void)stream;
}

void paged_scatter_cells(const PagedScatterCellsParams& p, Device device, Stream stream) {
  if (device.is_cpu()) return kvcore::cpu::paged_scatter_cells(p);
#if KVCORE_WITH_CUDA
  cuda::paged_scatter_cells(p, stream);
#endif
  (void)stream;
}

void paged_edit_cells(const PagedEditCellsParams& p, Device device, Stream stream) {
  if (device.is_cpu()) return kvcore::cpu::paged_edit_cells(p);
#if KVCORE_WITH_CUDA
  cuda::paged_edit_cells(p, stream);
#endif
  (void)stream;
}

void paged_set_cells(const PagedSetCellsParams& p, Device device, Stream stream) {
  if (device.is_cpu()) return kvcore::cpu::paged_set_cells(p);
#if KVCORE_WITH_CUDA
  cuda::paged_set_cells(p, stream);
#endif
  (void)stream;
}

}  // namespace kvcore::ops
