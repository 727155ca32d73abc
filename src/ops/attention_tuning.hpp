// Launch choices of the attention kernels that benches and tests may set (as FlashInfer's
// enable_pdl is an argument, not a process setting). The defaults are what the library runs;
// a plan made with other values (ops::attn::plan_paged, attention_plan_impl.hpp) runs them.
#pragma once
#include <cstdint>

namespace kvcore::ops {

// Which decode kernel serves a call (CUDA). Where the asked-for kernel does not serve the
// shape, the automatic choice does.
enum class AttentionKernel : int32_t {
  Auto = 0,               // the tensor-core kernel where it serves, else the SIMT kernel
  SimtRegisters = 1,      // the SIMT register-load kernel
  SimtAsync = 2,          // the SIMT cp.async pipeline (head_dim 128, 16-bit and FP8 pages)
  TensorCore = 3,         // the tensor-core decode kernel (head_dim 64 and 128, 16-bit and FP8 pages)
  TensorCorePrefill = 4,  // the tensor-core prefill kernel whatever the call's size (prefill, 16-bit pages)
  // The Hopper wgmma prefill kernels whatever the call's size (prefill, 16-bit pages, q in the
  // page type, 16-bit out, compute capability 9.0; prefill_wgmma.hpp), all with a tile's softmax
  // overlapping the previous tile's P V: warp-specialized (a producer warpgroup, mbarriers; 5),
  // synchronous (every thread copies, a CTA barrier a tile; 6), warp-specialized with the
  // Tensor Memory Accelerator copying a page a box (pages of a power-of-two size >= 8; 7, else 5),
  // that with the two consumer warpgroups issuing their wgmmas in turns (FlashAttention-3's
  // ping-pong; 8, else 5); tiles of 128 keys with q in shared memory and TMA copies (9, else 6),
  // that with the consumers in ping-pong (10, else 6).
  WgmmaPrefill = 5,
  WgmmaPrefillSync = 6,
  WgmmaPrefillTma = 7,
  WgmmaPrefillTmaPingPong = 8,
  WgmmaPrefillWide = 9,
  WgmmaPrefillWidePingPong = 10,
};

struct AttentionTuning {
  AttentionKernel kernel = AttentionKernel::Auto;
  // The tensor-core decode kernel launches as a programmatic dependent of the stream's previous
  // kernel (its launch and set-up overlap that kernel's drain).
  bool pdl = true;
  // FP8 decode may run one fat CTA an SM (decode_fat_ctas.hpp) where the grid allows.
  bool fat_ctas = true;
  // Batch row 0 guesses its first block ids from max_seq_cells (loads issued with indptr's).
  bool guess_blocks = true;
  // The split-K merge takes a CTA per 32 dims when (row, head) pairs are fewer than SMs.
  bool merge_slices = true;
};

}  // namespace kvcore::ops
