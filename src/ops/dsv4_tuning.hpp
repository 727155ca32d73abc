// Launch choices of the DeepSeek-V4 indexer's CUDA kernels that benches and tests may set
// (internal: not installed, not part of the API). The defaults are what the library runs;
// every choice computes the same scores and the same picks, only which kernel runs changes.
#pragma once
#include <cstdint>

#include "kvcore/ops/dsv4.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore::ops {

// Which kernel takes the top-k of the scores. Where the asked-for kernel does not serve the
// shape, the automatic choice does.
enum class IndexerTopk : int32_t {
  Auto = 0,     // Cluster where it serves and pays (long contexts, few queries), else Compact where it serves, else Ordered
  Ordered = 1,  // one 1024-thread CTA a query, ties placed by ordered sweeps: any k <= 2048, any rows
  Compact = 2,  // one 512-thread CTA a query, keys in shared memory: k <= 1024, visible rows <= 32768
  Cluster = 3,  // Compact's selection, each query's rows spread over a cluster of 8 CTAs (compute capability 9.0+)
};

// Which kernel computes the scores. Where the asked-for kernel does not serve the shape, the
// automatic choice does.
enum class IndexerScorer : int32_t {
  Auto = 0,        // TensorCore where it serves, else Simt
  Simt = 1,        // f32 FMA: the tiled kernel (dim % 4 == 0) or the general warp-per-row one
  TensorCore = 2,  // mma.sync bf16 (FP4 values are exact in bf16): quantized query, packed rows of dim 128
};

struct IndexerTuning {
  IndexerScorer scorer = IndexerScorer::Auto;
  // The tensor-core scorer's warps a CTA (4, 8 or 16); 0: the automatic choice.
  int scorer_warps = 0;
  // 8: the tensor-core scorer in clusters of 8 CTAs sharing the query transform; 0: clusters only
  // where both this and scorer_warps are 0 (automatic) and the rows fill a cluster.
  int scorer_cluster = 0;
  IndexerTopk topk = IndexerTopk::Auto;
  // The tensor-core scorer launches as a programmatic dependent of the stream's previous kernel
  // (in a decode step, the layer's cache append), the compact and cluster top-k as dependents of
  // the scores: each one's launch and set-up overlap the previous kernel's drain.
  bool pdl = true;
  // The compact and cluster top-k sort 128-1024 picks four a thread (sort_four_a_thread) instead
  // of one a thread.
  bool sort_four = false;
  // Scores and top-k in one kernel (the cluster top-k scoring its own rows on tensor cores) where
  // it serves; the scorer and top-k choices above then do not apply.
  bool fused = false;
};

// kvcore::dsv4_indexer_topk with its CUDA kernels chosen by the caller (the defaults: what the
// public op does). Validation and errors are the public op's; the CPU ignores the tuning.
void dsv4_indexer_topk(const TensorRef& q, const TensorRef& weights, const TensorRef& index_rows, int64_t n_rows,
                       int64_t first_query_pos, int32_t ratio, Dsv4Quant quant, const TensorRef& scores,
                       const TensorRef& out, const IndexerTuning& tuning, Stream stream = {});

}  // namespace kvcore::ops
