// The tensor-core scorer of the DeepSeek-V4 indexer (dsv4_scores_mma.cu): the model's stored
// rows (packed FP4 of dim 128, quantized query) on mma.sync bf16.
#pragma once
#include "kvcore/stream.hpp"
#include "ops/dsv4_params.hpp"

namespace kvcore::ops::cuda::dsv4 {

// Whether it serves p: quantized query, packed rows of dim 128, rows 4-byte aligned, the query
// of all heads within one block's shared memory.
bool scores_mma_serves(const ::kvcore::dsv4::IndexerParams& p);
// warps: a CTA's warps, 4, 8 or 16; any other value (0: the automatic choice) takes 8.
// cluster 8: 8-warp CTAs in clusters of 8 that transform the query once a cluster; else none
// (warps and cluster 0: the automatic choice, clusters where the rows fill one). pdl: launched as
// a programmatic dependent of the stream's previous kernel.
void launch_scores_mma(const ::kvcore::dsv4::IndexerParams& p, int dev, Stream s, int warps, int cluster, bool pdl);

}  // namespace kvcore::ops::cuda::dsv4
