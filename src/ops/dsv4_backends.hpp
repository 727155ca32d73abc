// Backend kernels of the DeepSeek-V4 ops (CPU always, CUDA when built). The
// entry points in src/ops/dsv4*.cpp validate, fill the Params and call these.
#pragma once
#include "kvcore/stream.hpp"
#include "ops/dsv4_params.hpp"
#include "ops/dsv4_tuning.hpp"

namespace kvcore::dsv4 {

namespace cpu {
void finalize(const FinalizeParams& p);
void store_one(const CompressorParams& p);
void shift(const CompressorParams& p);
void reset(const CompressorParams& p);
void emit(const CompressorParams& p);
void prefill(const CompressorParams& p);
void indexer_topk(const IndexerParams& p);
void decode_layer(const DecodeParams& p);
}  // namespace cpu

}  // namespace kvcore::dsv4

#if KVCORE_WITH_CUDA
// The CUDA backend (src/cuda/dsv4/), in the CUDA code's DeepSeek-V4 family namespace.
namespace kvcore::ops::cuda::dsv4 {
using namespace ::kvcore::dsv4;  // the ops layer's Params
void finalize(const FinalizeParams& p, Stream s);
void store_one(const CompressorParams& p, Stream s);
void shift(const CompressorParams& p, Stream s);
void reset(const CompressorParams& p, Stream s);
void emit(const CompressorParams& p, Stream s);
void prefill(const CompressorParams& p, Stream s);
void indexer_topk(const IndexerParams& p, Stream s, const IndexerTuning& tuning = {});
// The two halves of indexer_topk (for benchmarks' breakdown): scores, then the top-k of them.
void indexer_scores(const IndexerParams& p, Stream s, const IndexerTuning& tuning = {});
void indexer_select(const IndexerParams& p, Stream s, const IndexerTuning& tuning = {});
void decode_layer(const DecodeParams& p, Stream s);
}  // namespace kvcore::ops::cuda::dsv4
#endif
