// Dsv4Cache: the KV cache of DeepSeek-V4 attention (specs/dsv4-kv.md), per
// sequence and per layer: the raw window ring, the compressor and indexer
// states, the compressed rows (packed 584-byte FP8 rows when quantized) and the
// indexer rows (packed FP4). Everything is readable back as f32.
//
// The engine computes the projections (raw kv row after RoPE, compressor and
// indexer kv / gate rows) and hands them to append(); the cache does the rest.
//
// Conventions, the same as PagedCache's: sequences are SeqId values from create() (at most
// max_seqs live at once) until erase(); positions and counts are int32_t; every device
// operation runs on the stream of the config (Dsv4CacheConfig::stream); optional arguments
// are named maybe_*; every failing call throws kvcore::Error naming the argument and changes
// nothing; a moved-from cache throws on every call.
//
// Thread safety: none inside. Calls that change the cache (create, erase, truncate, shift,
// append, set_weights) must not overlap any other call on the same cache; const calls may run
// concurrently with each other. Distinct caches share nothing.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/cache/seq_id.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/dsv4.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

enum class Dsv4LayerKind : uint8_t { Window, CSA, HCA };
const char* dsv4_layer_kind_name(Dsv4LayerKind k);

struct Dsv4CacheConfig {
  std::vector<Dsv4LayerKind> layers;
  int32_t head_dim = 512;
  int32_t n_rot = 64;
  int32_t window = 128;     // raw rows per sequence and layer (the current token included)
  int32_t csa_ratio = 4;
  int32_t hca_ratio = 128;
  int32_t index_heads = 64;
  int32_t index_dim = 128;
  int32_t index_topk = 512;
  int32_t max_context = 65536;  // tokens per sequence, at most 2^24
  int32_t max_seqs = 1;
  Dsv4Quant quant = Dsv4Quant::On;
  // With quant On: store compressed rows packed (584 B) and indexer rows packed
  // (FP4, 68 B) where the geometry has a packed format; f32 otherwise.
  bool packed = true;
  float eps = 1.0e-6f;
  RopeSpec compressed_rope = RopeSpec::deepseek_v4_compressed();
  // Overrides the table built from compressed_rope when set (e.g. an oracle's exact f32 frequencies).
  std::optional<math::RopeTable> maybe_compressed_rope_table;
  // RoPE of the raw rows of window-only layers (the engine applies it; shift() re-rotates with it).
  // CSA/HCA layers' raw rows use the compressed RoPE (or its table).
  RopeSpec window_rope = RopeSpec::deepseek_v4_window();
  Stream stream;  // CUDA stream of every device operation of the cache

  static std::vector<Dsv4LayerKind> v4_flash_schedule();  // 43: 2 window, then CSA (even) / HCA (odd)
  static std::vector<Dsv4LayerKind> v4_pro_schedule();    // 61: 2 HCA, then CSA (even) / HCA (odd)
  static Dsv4CacheConfig v4_flash(int32_t max_context, int32_t max_seqs = 1);
  static Dsv4CacheConfig v4_pro(int32_t max_context, int32_t max_seqs = 1);

  void validate() const;  // throws InvalidArgument naming the field
  Dsv4Compressor compressor(Dsv4LayerKind kind) const;  // CSA or HCA attention compressor
  Dsv4Compressor indexer() const;
  int32_t ratio(Dsv4LayerKind kind) const;  // 0 for window-only layers
};

// Model weights of one layer's compressors (copied into the cache).
struct Dsv4LayerWeights {
  TensorRef comp_ape;   // [ratio, width] f32 or f16
  TensorRef comp_norm;  // [head_dim] f32
  TensorRef idx_ape;    // CSA only: [4, 2 * index_dim] f32 or f16
  TensorRef idx_norm;   // CSA only: [index_dim] f32
};

// What the engine projected for n tokens of one layer.
struct Dsv4TokenInputs {
  TensorRef kv;      // [n, head_dim] f32, RoPE applied; FP8-rounded in place when quant On
  TensorRef comp_c;  // CSA/HCA: [n, width] f32 (compressor kv projection)
  TensorRef comp_z;  // CSA/HCA: [n, width] f32 (compressor gate projection, without ape)
  TensorRef idx_c;   // CSA: [n, 2 * index_dim] f32
  TensorRef idx_z;   // CSA: [n, 2 * index_dim] f32
};

struct Dsv4MemoryRow {
  int32_t context = 0;
  double bytes_per_token = 0;      // this cache's format (all layers, one sequence)
  double f32_bytes_per_token = 0;  // the same rows stored as f32 (2048 B a row, 512 B an indexer row)
  double f16_bytes_per_token = 0;  // as f16 (1024 B, 256 B)
  double total_bytes = 0;          // this cache's format, whole sequence
};

// Which compressor state array read_state() / state() return.
enum class Dsv4State : uint8_t { CompressorKv, CompressorScore, IndexerKv, IndexerScore };

class Dsv4Cache {
 public:
  Dsv4Cache(Dsv4CacheConfig config, Device device);
  ~Dsv4Cache();
  Dsv4Cache(Dsv4Cache&&) noexcept;
  Dsv4Cache& operator=(Dsv4Cache&&) noexcept;
  Dsv4Cache(const Dsv4Cache&) = delete;
  Dsv4Cache& operator=(const Dsv4Cache&) = delete;

  // ---- shape ----
  const Dsv4CacheConfig& config() const;
  Device device() const;
  int32_t n_layers() const;
  Dsv4LayerKind kind(int32_t layer) const;
  int32_t raw_row_bytes() const;         // 1024 (f16) quantized, else 2048 (f32) for 512 dims
  int32_t compressed_row_bytes() const;  // 584 packed, else head_dim * 4
  int32_t indexer_row_bytes() const;     // 68 packed, else index_dim * 4
  bool compressed_packed() const;
  bool indexer_packed() const;

  // ---- weights ----
  void set_weights(int32_t layer, const Dsv4LayerWeights& w);

  // ---- sequences ----
  // A new empty sequence (OutOfMemory when max_seqs are live).
  SeqId create();
  void erase(SeqId seq);
  bool contains(SeqId seq) const;
  std::vector<SeqId> sequences() const;
  // Keep the first n tokens of every layer. Only n == 0 (empty the sequence) and n == the
  // current length of every layer are possible: the compressor states cannot be rewound
  // (NotSupported otherwise; InvalidArgument when n is outside [0, length]).
  void truncate(SeqId seq, int32_t n);
  // Context shift (docs/specs/dsv4-context-shift.md): drop tokens [n_keep, n_keep + n_discard)
  // of every layer; later tokens move down by n_discard and their RoPE tails (raw rows,
  // compressed rows, indexer rows) rotate by -n_discard; compressor states stay. Every layer
  // must hold the same length L; n_keep and n_discard must be multiples of shift_granule()
  // (InvalidArgument otherwise, or when n_keep + n_discard > L). NotSupported when L > window
  // and the kept tail L - n_keep - n_discard is shorter than the window (the new window would
  // need raw rows of kept tokens the ring already evicted; also for n_rot > 128, n_discard >= 2^24,
  // or unpacked f32 rows wider than 2048 dims). n_discard == 0 changes nothing. CPU and CUDA
  // write the same bytes; the moved rows' RoPE tails take one more rounding of their storage.
  void shift(SeqId seq, int32_t n_keep, int32_t n_discard);
  // The alignment shift() needs: the lcm of the compression ratios of the layer kinds present
  // (128 for DeepSeek-V4; 1 for window-only stacks).
  int32_t shift_granule() const;

  // ---- writing ----
  // Appends tokens pos .. pos + n - 1 of sequence `seq` to `layer`; pos must be
  // exactly length(seq, layer). n == 1 takes the decode path (finalize, store,
  // emit when due, shift), n > 1 the prefill path; both give identical results.
  void append(SeqId seq, int32_t layer, int32_t pos, const Dsv4TokenInputs& in);

  // ---- reading ----
  int32_t length(SeqId seq, int32_t layer) const;
  int32_t compressed_rows(SeqId seq, int32_t layer) const;  // emitted rows
  int32_t indexer_rows(SeqId seq, int32_t layer) const;
  // Views of the device storage (row stores have capacity rows; the first *_rows are valid).
  TensorRef raw_ring(SeqId seq, int32_t layer) const;          // [window, head_dim] f16 or f32; position p at p % window
  TensorRef compressed_store(SeqId seq, int32_t layer) const;  // [cap, 584] u8 or [cap, head_dim] f32
  TensorRef indexer_store(SeqId seq, int32_t layer) const;     // [cap, 68] u8 or [cap, index_dim] f32
  TensorRef state(SeqId seq, int32_t layer, Dsv4State which) const;  // f32 [state_rows, width]
  // Host copies as f32.
  std::vector<float> read_window(SeqId seq, int32_t layer) const;      // [min(L, window), head_dim], oldest first
  std::vector<float> read_compressed(SeqId seq, int32_t layer) const;  // [compressed_rows, head_dim]
  std::vector<float> read_indexer(SeqId seq, int32_t layer) const;     // [indexer_rows, index_dim] (Hadamard domain if quantized)
  std::vector<float> read_state(SeqId seq, int32_t layer, Dsv4State which) const;

  // Indexer of a CSA layer over this sequence's indexer rows (dsv4_indexer_topk).
  void indexer_topk(SeqId seq, int32_t layer, const TensorRef& q, const TensorRef& weights, int32_t first_query_pos,
                    const TensorRef& scores, const TensorRef& out) const;

  // ---- inspection ----
  // Canonical text of the host metadata (sequences, their slots and per-layer lengths, free
  // slots, which layers have weights): tests compare it.
  std::string debug_state() const;
  std::vector<Dsv4MemoryRow> memory_report(const std::vector<int32_t>& contexts) const;
  size_t allocated_bytes() const;

  struct Impl;

 private:
  // The implementation; throws InvalidArgument on a moved-from cache (every public call goes through it).
  Impl& impl();
  const Impl& impl() const;
  friend struct Dsv4CacheAccess;  // the persistence hook (cache/dsv4_export.hpp)
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcore
