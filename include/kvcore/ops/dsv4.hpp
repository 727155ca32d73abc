// DeepSeek-V4 KV-cache operations (specs/dsv4-kv.md, seed 002): the decode KV
// finalizer, the token compressor (store one token, shift the overlap state,
// emit a compressed row, compress a whole prefill chunk), and the lightning
// indexer's scoring and causal top-k.
//
// The engine computes every projection; these ops own everything after them.
// Every entry point checks all arguments before writing anything and throws
// kvcore::Error(InvalidArgument) naming the argument; tensors must all live on
// one device (CPU or CUDA), which picks the backend.
//
// Thread safety: calls may come from several threads at once (what they cache per device is
// guarded) as long as no call writes memory that another one reads or writes.
#pragma once
#include <cstdint>

#include "kvcore/math/rope.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

// Quantization switch. On: FP8 (E4M3 + UE8M0 per 64) on the nope dims of
// attention rows, Hadamard + FP4 (E2M1 + UE8M0 per 32) on indexer rows and
// queries, f16 raw ring rows: what DeepSeek-V4's engine stores. Off: plain f32
// math, which is how HF transformers computes (the oracle).
enum class Dsv4Quant : uint8_t { Off, On };

// What an emitted row is: an attention row (FP8 nope dims) or an indexer row
// (Hadamard + FP4 over the whole row).
enum class Dsv4RowKind : uint8_t { Attention, Indexer };

// Geometry of one compressor. CSA and the indexer overlap two windows: each
// token projects 2 * head_dim features, lane A (first half) feeds the next
// window's row and lane B (second half) its own; the state holds 2 * ratio rows
// (rows 0..m-1 the previous window, m..2m-1 the current one). HCA does not
// overlap: head_dim features, ratio rows.
struct Dsv4Compressor {
  int32_t head_dim = 512;  // emitted row width
  int32_t n_rot = 64;      // RoPE on the last n_rot dims of an emitted row
  int32_t ratio = 4;       // m: tokens per compressed row
  bool overlap = true;
  Dsv4RowKind kind = Dsv4RowKind::Attention;
  float eps = 1.0e-6f;     // RMSNorm epsilon

  int32_t width() const { return overlap ? 2 * head_dim : head_dim; }
  int32_t state_rows() const { return overlap ? 2 * ratio : ratio; }
  // Bytes of one packed row: 584 for a 448 + 64 attention row, head_dim/2 +
  // head_dim/32 for an FP4 indexer row; 0 where no packed format exists.
  int32_t packed_row_bytes() const;

  static Dsv4Compressor csa(int32_t head_dim = 512, int32_t n_rot = 64, int32_t ratio = 4);
  static Dsv4Compressor hca(int32_t head_dim = 512, int32_t n_rot = 64, int32_t ratio = 128);
  static Dsv4Compressor indexer(int32_t head_dim = 128, int32_t n_rot = 64, int32_t ratio = 4);
};

// The model weights one compressor needs.
struct Dsv4CompressorWeights {
  TensorRef ape;          // [ratio, width] f32 or f16: position bias added to the score of token p at p % ratio
  TensorRef norm_weight;  // [head_dim] f32: RMSNorm weight
  math::RopeTable rope;   // RoPE of the emitted rows (layout: the tail n_rot dims of head_dim)
};

// ---- Decode KV finalizer (seed kernel_dsv4_kv_fp8_store_f32) -----------------------
// kv: [n, head_dim] f32, RoPE already applied, modified in place: with quant On
// the nope dims [0, head_dim - n_rot) take their FP8 round trip (blocks of 64,
// the last may be partial). raw_ring: [R, head_dim] f32 or f16: row i is stored
// at ring row (first_raw_row + i) % R, f16-rounded when quant is On or the ring
// is f16 (only the last R rows of kv are stored when n > R).
void dsv4_kv_finalize(const TensorRef& kv, const TensorRef& raw_ring, int64_t first_raw_row, int32_t n_rot,
                      Dsv4Quant quant, Stream stream = {});

// ---- Compressor state (seed kernel_dsv4_compressor_store_one / ratio4_shift) ------
// state_kv, state_score: [state_rows, width] f32. store_one writes token `pos`:
// row = (overlap ? ratio : 0) + pos % ratio; state_kv[row] = c,
// state_score[row] = z + ape[pos % ratio] (f32 add). c, z: [width] f32.
void dsv4_compressor_store_one(const TensorRef& c, const TensorRef& z, const TensorRef& ape, const TensorRef& state_kv,
                               const TensorRef& state_score, int64_t pos, const Dsv4Compressor& comp,
                               Stream stream = {});

// Overlapping compressors only: rows m..2m-1 become rows 0..m-1 (kv and score).
void dsv4_compressor_shift(const TensorRef& state_kv, const TensorRef& state_score, const Dsv4Compressor& comp,
                           Stream stream = {});

// Reset a state: kv 0, scores -inf (no candidate).
void dsv4_compressor_reset(const TensorRef& state_kv, const TensorRef& state_score, const Dsv4Compressor& comp,
                           Stream stream = {});

// ---- Emission -----------------------------------------------------------------------
// Emits compressed row `window` (call after storing token window*ratio + ratio - 1)
// from the state: per channel a softmax pool over the state_rows candidates,
// RMSNorm with weight, RoPE on the tail at position window * ratio, then with
// quant On the FP8 round trip of the nope dims (attention) or Hadamard + FP4
// (indexer). rows: the row store, [cap, head_dim] f32, or [cap,
// packed_row_bytes()] u8 (quant On only); row `window` (< cap) is written.
void dsv4_compressor_emit(const TensorRef& state_kv, const TensorRef& state_score, const Dsv4Compressor& comp,
                          const Dsv4CompressorWeights& w, int64_t window, Dsv4Quant quant, const TensorRef& rows,
                          Stream stream = {});

// ---- Prefill compression ------------------------------------------------------------
// Tokens start_pos .. start_pos + n - 1 (c, z: [n, width] f32): emits every
// window that completes among them into `rows` and leaves the state exactly as
// storing the tokens one by one (with emission and shift when due) would, for
// any start_pos and n (chunks need not align with the ratio). The state must
// hold what the tokens before start_pos left.
void dsv4_compress_prefill(const TensorRef& c, const TensorRef& z, const TensorRef& state_kv,
                           const TensorRef& state_score, int64_t start_pos, const Dsv4Compressor& comp,
                           const Dsv4CompressorWeights& w, Dsv4Quant quant, const TensorRef& rows, Stream stream = {});

// ---- Fused decode step --------------------------------------------------------------------
// One compressor's part of a decode step.
struct Dsv4DecodeCompressor {
  Dsv4Compressor comp;
  TensorRef c, z;                    // [width] f32: this token's projections
  TensorRef state_kv, state_score;   // [state_rows, width] f32
  Dsv4CompressorWeights w;
  TensorRef rows;                    // row store, as for dsv4_compressor_emit
};

// One token at `pos` of one layer in one call (one kernel on CUDA): finalize kv
// ([1, head_dim]) into raw_ring at row pos % R, then for each compressor given
// (attention, indexer): store the token and, when it completes a window, emit the
// row and shift an overlapping state. Identical to calling the separate ops.
void dsv4_decode_layer(const TensorRef& kv, const TensorRef& raw_ring, int32_t n_rot, int64_t pos, Dsv4Quant quant,
                       const Dsv4DecodeCompressor* maybe_comp, const Dsv4DecodeCompressor* maybe_idx,
                       Stream stream = {});

// ---- Indexer ---------------------------------------------------------------------------
// Queries at positions first_query_pos + i, i < n_q. q: [n_q, H, D] f32 (RoPE
// applied; with quant On each head is Hadamard + FP4 transformed first, as the
// stored rows are); weights: [n_q, H] f32 (already scaled by D^-0.5 H^-0.5);
// index_rows: the indexer row store, [cap, D] f32 or [cap, packed] u8, of which
// the first n_rows are valid. scores: [n_q, cap] f32, written:
// I(t, s) = sum_h w_h relu(q_h . k_s) for visible rows s < (t + 1) / ratio,
// -inf otherwise. out: [n_q, k] i32 with k <= cap: the k best visible rows by
// score (ties: lower row first; a NaN score counts as one value above +inf, so
// NaN scores, from NaN or infinite weights, are picked first), best first; picks
// past the visible rows are -1.
void dsv4_indexer_topk(const TensorRef& q, const TensorRef& weights, const TensorRef& index_rows, int64_t n_rows,
                       int64_t first_query_pos, int32_t ratio, Dsv4Quant quant, const TensorRef& scores,
                       const TensorRef& out, Stream stream = {});

}  // namespace kvcore
