// Dsv4Cache: the KV cache of DeepSeek-V4 attention (specs/dsv4-kv.md), per
// sequence and per layer: the raw window ring, the compressor and indexer
// states, the compressed rows (packed 584-byte FP8 rows when quantized) and the
// indexer rows (packed FP4). Everything is readable back as f32.
//
// The engine computes the projections (raw kv row after RoPE, compressor and
// indexer kv / gate rows) and hands them to append(); the cache does the rest.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/dsv4.hpp"
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
  int64_t max_context = 65536;  // tokens per sequence
  int32_t max_seqs = 1;
  Dsv4Quant quant = Dsv4Quant::On;
  // With quant On: store compressed rows packed (584 B) and indexer rows packed
  // (FP4, 68 B) where the geometry has a packed format; f32 otherwise.
  bool packed = true;
  float eps = 1.0e-6f;
  RopeSpec compressed_rope = RopeSpec::deepseek_v4_compressed();
  // Overrides the table built from compressed_rope (e.g. an oracle's exact f32 frequencies).
  std::optional<math::RopeTable> compressed_rope_table;

  static std::vector<Dsv4LayerKind> v4_flash_schedule();  // 43: 2 window, then CSA (even) / HCA (odd)
  static std::vector<Dsv4LayerKind> v4_pro_schedule();    // 61: 2 HCA, then CSA (even) / HCA (odd)
  static Dsv4CacheConfig v4_flash(int64_t max_context, int32_t max_seqs = 1);
  static Dsv4CacheConfig v4_pro(int64_t max_context, int32_t max_seqs = 1);

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
  int64_t context = 0;
  double bytes_per_token = 0;      // this cache's format (all layers, one sequence)
  double f32_bytes_per_token = 0;  // the same rows stored as f32 (2048 B a row, 512 B an indexer row)
  double f16_bytes_per_token = 0;  // as f16 (1024 B, 256 B)
  double total_bytes = 0;          // this cache's format, whole sequence
};

class Dsv4Cache {
 public:
  Dsv4Cache(Dsv4CacheConfig config, Device device);

  // ---- shape ----
  const Dsv4CacheConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  int32_t n_layers() const { return static_cast<int32_t>(cfg_.layers.size()); }
  Dsv4LayerKind kind(int32_t layer) const;
  int32_t raw_row_bytes() const;         // 1024 (f16) quantized, else 2048 (f32) for 512 dims
  int32_t compressed_row_bytes() const;  // 584 packed, else head_dim * 4
  int32_t indexer_row_bytes() const;     // 68 packed, else index_dim * 4
  bool compressed_packed() const { return comp_packed_; }
  bool indexer_packed() const { return idx_packed_; }

  // ---- weights ----
  void set_weights(int32_t layer, const Dsv4LayerWeights& w);

  // ---- writing ----
  // Appends tokens pos .. pos + n - 1 of sequence `seq` to `layer`; pos must be
  // exactly length(seq, layer). n == 1 takes the decode path (finalize, store,
  // emit when due, shift), n > 1 the prefill path; both give identical results.
  void append(int32_t seq, int32_t layer, int64_t pos, const Dsv4TokenInputs& in, Stream stream = {});

  // ---- reading ----
  int64_t length(int32_t seq, int32_t layer) const;
  int64_t compressed_rows(int32_t seq, int32_t layer) const;  // emitted rows
  int64_t indexer_rows(int32_t seq, int32_t layer) const;
  // Views of the device storage (row stores have capacity rows; the first *_rows are valid).
  TensorRef raw_ring(int32_t seq, int32_t layer) const;         // [window, head_dim] f16 or f32; position p at p % window
  TensorRef compressed_store(int32_t seq, int32_t layer) const;  // [cap, 584] u8 or [cap, head_dim] f32
  TensorRef indexer_store(int32_t seq, int32_t layer) const;     // [cap, 68] u8 or [cap, index_dim] f32
  TensorRef state_kv(int32_t seq, int32_t layer, bool indexer = false) const;
  TensorRef state_score(int32_t seq, int32_t layer, bool indexer = false) const;
  // Host copies as f32.
  std::vector<float> read_window(int32_t seq, int32_t layer) const;      // [min(L, window), head_dim], oldest first
  std::vector<float> read_compressed(int32_t seq, int32_t layer) const;  // [compressed_rows, head_dim]
  std::vector<float> read_indexer(int32_t seq, int32_t layer) const;     // [indexer_rows, index_dim] (Hadamard domain if quantized)
  std::vector<float> read_state(int32_t seq, int32_t layer, bool indexer, bool score) const;

  // Indexer of a CSA layer over this sequence's indexer rows (dsv4_indexer_topk).
  void indexer_topk(int32_t seq, int32_t layer, const TensorRef& q, const TensorRef& weights, int64_t first_query_pos,
                    const TensorRef& scores, const TensorRef& out, Stream stream = {}) const;

  // ---- lifecycle ----
  void reset(int32_t seq, Stream stream = {});
  // DeepSeek-V4 caches cannot shift: compressor windows straddle any cut. Throws
  // NotSupported (InvalidArgument first when the range itself is bad).
  void shift(int32_t seq, int64_t n_keep, int64_t n_discard);

  // ---- memory ----
  std::vector<Dsv4MemoryRow> memory_report(const std::vector<int64_t>& contexts) const;
  size_t allocated_bytes() const;

 private:
  friend struct Dsv4CacheAccess;  // the persistence hook (src/cache/dsv4_export.cpp)
  struct Layer {
    Dsv4LayerKind kind = Dsv4LayerKind::Window;
    Dsv4Compressor comp, idx;
    int64_t comp_cap = 0, idx_cap = 0;
    Buffer ring, comp_kv, comp_score, comp_rows, idx_kv, idx_score, idx_rows;
    Buffer comp_ape, comp_norm, idx_ape, idx_norm;
    DType comp_ape_dtype = DType::F32, idx_ape_dtype = DType::F32;
    bool has_weights = false;
  };
  void check_seq_layer(const char* what, int32_t seq, int32_t layer) const;
  Dsv4CompressorWeights comp_weights(const Layer& l, bool indexer) const;
  TensorRef slice3(const Buffer& b, DType dt, int32_t seq, int64_t rows, int64_t cols) const;

  Dsv4CacheConfig cfg_;
  Device device_;
  math::RopeTable comp_rope_{}, idx_rope_{};
  bool comp_packed_ = false, idx_packed_ = false;
  std::vector<Layer> layers_;
  std::vector<int64_t> length_;  // [seq * n_layers + layer]
};

}  // namespace kvcore
