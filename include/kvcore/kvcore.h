/* kvcore C API (C99): the stable ABI of libkvcore.so for C, Rust, Go, Swift, ... engines.
 *
 * Conventions
 *   - Handles are opaque (kvc_paged_cache, kvc_ticket, kvc_attention_plan, kvc_dsv4_cache, ...);
 *     every *_free accepts NULL. A handle is not thread-safe; distinct handles are.
 *   - Every function that can fail returns a kvc_status: KVC_OK (0) or a negative code. The
 *     message of the last failure on this thread is kvc_last_error() (valid until the next kvc_*
 *     call on the thread). No C++ exception crosses this boundary.
 *   - A call that fails changes nothing (the C++ API's strong guarantee, checked argument first).
 *   - Config structs begin with struct_size: fill them with their *_init function (which sets
 *     struct_size = sizeof) and then set fields. A library built from a newer header reads only
 *     the fields an older caller's struct_size covers and defaults the rest, so the structs can
 *     grow without breaking callers.
 *   - Tensors are DLPack DLTensor views (dlpack/dlpack.h), used in place, never copied. FP8 codes
 *     and UE8M0 scale bytes travel as uint8 (kDLUInt, 8 bits). NULL means "none" where a tensor
 *     is optional.
 *   - Streams are void* (a cudaStream_t); NULL is CUDA's default stream; CPU work ignores them.
 */
#ifndef KVCORE_KVCORE_H
#define KVCORE_KVCORE_H

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KVC_API __attribute__((visibility("default")))
#else
#define KVC_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_API_VERSION 1

/* ---- status ------------------------------------------------------------------------------- */
typedef int32_t kvc_status;
#define KVC_OK 0
#define KVC_E_INVALID_ARGUMENT (-1) /* a bad argument; the message names it and its value */
#define KVC_E_OUT_OF_MEMORY (-2)    /* a pool or allocation ran out */
#define KVC_E_NOT_SUPPORTED (-3)    /* valid, but not supported by this build or format */
#define KVC_E_CORRUPT (-4)          /* state failed a consistency check */
#define KVC_E_DEVICE (-5)           /* a CUDA runtime failure */
#define KVC_E_UNAVAILABLE (-6)      /* a server cannot be reached or refused the credentials */
#define KVC_E_INTERNAL (-100)       /* anything else (a bug: please report it) */

KVC_API const char* kvc_last_error(void);      /* "" when the last call succeeded */
KVC_API uint32_t kvc_api_version(void);        /* KVC_API_VERSION of the library */
KVC_API const char* kvc_version(void);         /* "0.1.0" */
KVC_API int32_t kvc_cuda_device_count(void);   /* 0 without the CUDA backend or a GPU */

/* ---- devices, formats, RoPE ------------------------------------------------------------------ */
#define KVC_DEVICE_CPU 0
#define KVC_DEVICE_CUDA 1
typedef struct kvc_device {
  int32_t kind;  /* KVC_DEVICE_CPU or KVC_DEVICE_CUDA */
  int32_t index; /* CUDA device ordinal */
} kvc_device;

#define KVC_FORMAT_F32 0
#define KVC_FORMAT_F16 1
#define KVC_FORMAT_BF16 2
#define KVC_FORMAT_FP8 3     /* e4m3 codes + one UE8M0 scale byte per 64 dims */
#define KVC_FORMAT_DSV4ROW 4 /* DeepSeek-V4's 584-byte row (K only, head_dim 512) */

#define KVC_ROPE_STORED 0  /* K rotated when written */
#define KVC_ROPE_ON_READ 1 /* K stored unrotated; attention rotates; a shift moves no byte */

#define KVC_ROPE_SLICE_HEAD 0
#define KVC_ROPE_SLICE_TAIL 1
#define KVC_ROPE_PAIRING_NEOX 0
#define KVC_ROPE_PAIRING_INTERLEAVED 1
#define KVC_ROPE_SCALING_NONE 0
#define KVC_ROPE_SCALING_LINEAR 1
#define KVC_ROPE_SCALING_LLAMA3 2
#define KVC_ROPE_SCALING_YARN 3

/* A model's rotary embedding (kvcore/math/rope_spec.hpp). */
typedef struct kvc_rope_spec {
  uint32_t struct_size;
  int32_t n_rot; /* rotated dims, even, <= head_dim */
  int32_t slice, pairing, scaling;
  double theta, factor, low_freq_factor, high_freq_factor;
  int32_t original_max_position;
  int32_t yarn_truncate; /* bool */
  double beta_fast, beta_slow;
  const float* freq_factors; /* optional: n_rot / 2 divisors; NULL: none */
  int32_t n_freq_factors;
  double attention_factor; /* scales cos and sin at write time only (YaRN mscale) */
} kvc_rope_spec;

KVC_API void kvc_rope_spec_init(kvc_rope_spec* spec, int32_t n_rot, double theta); /* plain NeoX */
KVC_API void kvc_rope_spec_llama3_8b(kvc_rope_spec* spec);

/* ---- PagedCache --------------------------------------------------------------------------- */
typedef struct kvc_paged_cache kvc_paged_cache;
typedef struct kvc_ticket kvc_ticket;

typedef struct kvc_paged_config {
  uint32_t struct_size;
  int32_t n_layers, n_kv_heads, head_dim;
  int32_t v_head_dim; /* 0: no V pools */
  int32_t block_size, num_blocks;
  int32_t k_format, v_format; /* KVC_FORMAT_* */
  int32_t rope_mode;          /* KVC_ROPE_STORED or KVC_ROPE_ON_READ */
  int32_t strict_positions;   /* bool: positions must increase along a sequence */
  const kvc_rope_spec* rope;  /* one spec for every layer, or n_layers specs */
  int32_t n_rope;
  void* stream; /* CUDA stream of every cache operation */
  int32_t kvcore_attention; /* bool, default 1: refuse formats kvcore's attention cannot read */
} kvc_paged_config;

typedef struct kvc_seq_info {
  uint32_t struct_size;
  int32_t n_live, n_cells, n_blocks;
  int32_t last_position; /* -1: empty */
} kvc_seq_info;

KVC_API void kvc_paged_config_init(kvc_paged_config* cfg);
KVC_API kvc_status kvc_paged_create(const kvc_paged_config* cfg, kvc_device device, kvc_paged_cache** out);
KVC_API void kvc_paged_free(kvc_paged_cache* cache);

/* Pool memory the engine allocates (so its allocator accounts for it). kvc_paged_pool_specs lists
 * the arrays a cache of *cfg needs, in the order kvc_paged_create_with_pools takes them: per layer
 * K data, K scales (FP8 K), V data (v_head_dim > 0), V scales (FP8 V). Each has num_blocks + 1
 * blocks: the last is the cache's zero block, which the engine must not write. */
#define KVC_POOL_K 0
#define KVC_POOL_K_SCALES 1
#define KVC_POOL_V 2
#define KVC_POOL_V_SCALES 3
#define KVC_POOL_ALIGNMENT 16 /* bytes: every array's data pointer */
typedef struct kvc_pool_spec {
  uint32_t struct_size;
  int32_t layer;
  int32_t part;      /* KVC_POOL_* */
  DLDataType dtype;  /* FP8 codes and UE8M0 scales: uint8 (kDLUInt, 8 bits) */
  int64_t shape[4];  /* [num_blocks + 1, block_size, n_kv_heads, row width], contiguous */
  int64_t bytes;
} kvc_pool_spec;
KVC_API void kvc_pool_spec_init(kvc_pool_spec* spec);
/* Writes up to cap specs into out (an array of structs of out[0].struct_size bytes each, filled
 * with kvc_pool_spec_init) and the number the config needs into *n (nothing is written when it
 * exceeds cap: KVC_E_INVALID_ARGUMENT). */
KVC_API kvc_status kvc_paged_pool_specs(const kvc_paged_config* cfg, kvc_pool_spec* out, size_t cap, size_t* n);
/* A cache over the caller's pools[0 .. n_pools): exactly the arrays kvc_paged_pool_specs lists
 * (dtype, shape, contiguous, KVC_POOL_ALIGNMENT-aligned, on `device`, not overlapping). The cache
 * zeroes them and never frees them: keep them allocated until kvc_paged_free. */
KVC_API kvc_status kvc_paged_create_with_pools(const kvc_paged_config* cfg, kvc_device device, const DLTensor* pools,
                                               size_t n_pools, kvc_paged_cache** out);
/* The stream of the cache's later operations (cfg->stream until then). Work already queued stays
 * on its stream: ordering across a change is the caller's. */
KVC_API kvc_status kvc_paged_set_stream(kvc_paged_cache* cache, void* stream);

KVC_API kvc_status kvc_paged_seq_create(kvc_paged_cache* cache, int64_t* out_seq);
/* A new sequence sharing every block of seq (copy on first write). */
KVC_API kvc_status kvc_paged_seq_fork(kvc_paged_cache* cache, int64_t seq, int64_t* out_seq);
KVC_API kvc_status kvc_paged_seq_erase(kvc_paged_cache* cache, int64_t seq);
/* Keep [0, n_keep), drop [n_keep, n_keep + n_discard); later tokens move down by n_discard. */
KVC_API kvc_status kvc_paged_seq_shift(kvc_paged_cache* cache, int64_t seq, int32_t n_keep, int32_t n_discard);
/* Keep the first n tokens (speculative-decoding rollback). */
KVC_API kvc_status kvc_paged_seq_truncate(kvc_paged_cache* cache, int64_t seq, int32_t n);
KVC_API kvc_status kvc_paged_seq_info(const kvc_paged_cache* cache, int64_t seq, kvc_seq_info* out);
/* Position-range edits (llama.cpp's seq_rm / seq_add) on token positions p0 <= p < p1
 * (p1 = KVC_POS_END: to the end). */
#define KVC_POS_END 2147483647
KVC_API kvc_status kvc_paged_remove_positions(kvc_paged_cache* cache, int64_t seq, int32_t p0, int32_t p1);
KVC_API kvc_status kvc_paged_add_positions(kvc_paged_cache* cache, int64_t seq, int32_t p0, int32_t p1, int32_t delta);
/* *out = 1 when the pool has the blocks a reserve of counts[i] tokens for seqs[i] would take. */
KVC_API kvc_status kvc_paged_can_fit(const kvc_paged_cache* cache, const int64_t* seqs, const int32_t* counts,
                                     size_t n_seqs, int32_t* out);
/* Apply what shifts left pending (rotations, position offsets). */
KVC_API kvc_status kvc_paged_prepare(kvc_paged_cache* cache);

/* Append n tokens to every layer: positions [n] (host); k [n_layers, n, n_kv_heads, head_dim],
 * v likewise (NULL without V); f32, f16 or bf16 on the cache's device. */
KVC_API kvc_status kvc_paged_append(kvc_paged_cache* cache, int64_t seq, const int32_t* positions, int32_t n,
                                    const DLTensor* k, const DLTensor* v);

/* Tickets: the cells of one step's new tokens. One ticket is refilled by every reserve, so a
 * decode loop allocates nothing per step. */
KVC_API kvc_status kvc_ticket_create(kvc_ticket** out);
KVC_API void kvc_ticket_free(kvc_ticket* ticket);
KVC_API int32_t kvc_ticket_n_tokens(const kvc_ticket* ticket);
/* Reserve counts[i] cells for seqs[i] (distinct ids); positions concatenated in that order. */
KVC_API kvc_status kvc_paged_reserve(kvc_paged_cache* cache, const int64_t* seqs, const int32_t* counts,
                                     size_t n_seqs, const int32_t* positions, kvc_ticket* ticket);
/* Write one layer of the ticket's tokens: k [n_tokens, n_kv_heads, head_dim], v likewise (NULL
 * without V); f32, f16 or bf16 on the cache's device. Rotated at their positions in ROPE_STORED. */
KVC_API kvc_status kvc_paged_store(kvc_paged_cache* cache, const kvc_ticket* ticket, int32_t layer,
                                   const DLTensor* k, const DLTensor* v);
/* Every layer of the ticket's tokens at once (one launch on CUDA; the same bytes as
 * kvc_paged_store per layer): k [n_layers, n_tokens, n_kv_heads, head_dim], v likewise (NULL
 * without V). */
KVC_API kvc_status kvc_paged_store_layers(kvc_paged_cache* cache, const kvc_ticket* ticket, const DLTensor* k,
                                          const DLTensor* v);
/* Host read-back of one layer of a sequence as f32 (K rotated at current positions): up to cap
 * tokens into positions [cap], k [cap, n_kv_heads, head_dim], v [cap, n_kv_heads, v_head_dim]
 * (each may be NULL); *n_live receives the sequence's length (may exceed cap: nothing is written
 * then, and the status is KVC_E_INVALID_ARGUMENT). */
KVC_API kvc_status kvc_paged_read(kvc_paged_cache* cache, int64_t seq, int32_t layer, int32_t* positions, float* k,
                                  float* v, int32_t cap, int32_t* n_live);

/* ---- attention over a PagedCache: plan once per step, run once per layer -------------------- */
typedef struct kvc_attention_plan kvc_attention_plan;

typedef struct kvc_attention_options {
  uint32_t struct_size;
  float softmax_scale;    /* 0: head_dim^-0.5 */
  int32_t window;         /* 0: no sliding window; else keys with q_pos - k_pos < window */
  const DLTensor* sinks;  /* optional f32 [n_q_heads] sink logits (kept by reference: keep alive) */
  int32_t num_splits;     /* 0: automatic */
  int32_t check_tables;   /* bool, default 1 */
} kvc_attention_options;

KVC_API void kvc_attention_options_init(kvc_attention_options* opt);
/* The plan of the ticket's step: one query row per reserved token (decode when every count is 1,
 * causal prefill otherwise) at the tokens' positions. The plan goes stale (run fails with
 * KVC_E_INVALID_ARGUMENT) once the cache's sequences change; make one per step. */
KVC_API kvc_status kvc_paged_plan(kvc_paged_cache* cache, const kvc_ticket* ticket, const kvc_attention_options* opt,
                                  kvc_attention_plan** out);
/* Decode plan for seqs with one query each at q_positions (NULL: each sequence's last position). */
KVC_API kvc_status kvc_paged_plan_seqs(kvc_paged_cache* cache, const int64_t* seqs, size_t n_seqs,
                                       const int32_t* q_positions, const kvc_attention_options* opt,
                                       kvc_attention_plan** out);
KVC_API void kvc_attention_plan_free(kvc_attention_plan* plan);
/* out = attention(q) over layer's pages: q [n_rows, n_q_heads, head_dim], out [n_rows, n_q_heads,
 * v_head_dim], f32/f16/bf16. In ROPE_ON_READ caches kvcore rotates q at its position; in
 * ROPE_STORED q comes rotated. */
KVC_API kvc_status kvc_attention_run(kvc_attention_plan* plan, int32_t layer, const DLTensor* q, const DLTensor* out,
                                     void* stream);

/* ---- dense caches: context shift ----------------------------------------------------------- */
typedef struct kvc_shift_layer {
  uint32_t struct_size;
  const DLTensor* k;        /* [capacity, n_kv_heads, head_dim] f32/f16/bf16; uint8 e4m3 codes with
                               k_scales; uint8 [capacity, (heads,) 584] DeepSeek-V4 rows without */
  const DLTensor* k_scales; /* UE8M0 uint8 [capacity, n_kv_heads, head_dim / 64] or NULL */
  const DLTensor* v;        /* [capacity, n_kv_heads, v_head_dim] or NULL */
  const kvc_rope_spec* rope;
} kvc_shift_layer;

KVC_API void kvc_shift_layer_init(kvc_shift_layer* layer);
/* Context shift of caller-owned dense caches in place, layers[0 .. n_layers) (an array of
 * structs of layers[0].struct_size bytes each): keep [0, n_keep), drop [n_keep, n_keep +
 * n_discard), move later tokens (< length) down by n_discard, re-rotating their keys. */
KVC_API kvc_status kvc_shift_dense(const kvc_shift_layer* layers, size_t n_layers, int64_t length, int64_t n_keep,
                                   int64_t n_discard, void* stream);

/* ---- FP8 codecs (kvcore/ops/fp8.hpp) -------------------------------------------------------- */
/* dst = src with the first cols - n_rot dims FP8-rounded (f32 rows; dst == src in place). */
KVC_API kvc_status kvc_fp8_round_trip_rows(const DLTensor* src, const DLTensor* dst, int32_t n_rot, void* stream);
/* src [..., cols] -> codes uint8 [..., n_nope], scales uint8 [..., ceil(n_nope / 64)], tail f16/bf16
 * [..., n_rot] (NULL when n_rot == 0). */
KVC_API kvc_status kvc_fp8_pack_rows(const DLTensor* src, const DLTensor* codes, const DLTensor* scales,
                                     const DLTensor* tail, void* stream);
KVC_API kvc_status kvc_fp8_unpack_rows(const DLTensor* codes, const DLTensor* scales, const DLTensor* tail,
                                       const DLTensor* dst, void* stream);
/* DeepSeek-V4 rows: src f32 [..., 512] <-> packed uint8 [..., 584]. */
KVC_API kvc_status kvc_dsv4_pack_rows(const DLTensor* src, const DLTensor* packed, void* stream);
KVC_API kvc_status kvc_dsv4_unpack_rows(const DLTensor* packed, const DLTensor* dst, void* stream);

/* ---- DeepSeek-V4 cache (kvcore/cache/dsv4_cache.hpp) ----------------------------------------- */
typedef struct kvc_dsv4_cache kvc_dsv4_cache;

#define KVC_DSV4_WINDOW 0
#define KVC_DSV4_CSA 1
#define KVC_DSV4_HCA 2

typedef struct kvc_dsv4_config {
  uint32_t struct_size;
  const int32_t* layer_kinds; /* KVC_DSV4_* per layer */
  int32_t n_layers;
  int32_t head_dim, n_rot, window, csa_ratio, hca_ratio;
  int32_t index_heads, index_dim, index_topk;
  int64_t max_context;
  int32_t max_seqs;
  int32_t quant;  /* bool: FP8 / FP4 storage as DeepSeek-V4's engine; 0: f32 math */
  int32_t packed; /* bool: packed rows where the geometry has them */
  void* stream;   /* CUDA stream of every cache operation */
} kvc_dsv4_config;

/* Defaults of DeepSeek-V4-Flash (43 layers) for max_context tokens and max_seqs sequences. */
KVC_API void kvc_dsv4_config_v4_flash(kvc_dsv4_config* cfg, int64_t max_context, int32_t max_seqs);
KVC_API kvc_status kvc_dsv4_create(const kvc_dsv4_config* cfg, kvc_device device, kvc_dsv4_cache** out);
KVC_API void kvc_dsv4_free(kvc_dsv4_cache* cache);
/* Sequences: at most max_seqs live at once. truncate(seq, 0) empties one. */
KVC_API kvc_status kvc_dsv4_seq_create(kvc_dsv4_cache* cache, int64_t* out_seq);
KVC_API kvc_status kvc_dsv4_seq_erase(kvc_dsv4_cache* cache, int64_t seq);
KVC_API kvc_status kvc_dsv4_seq_truncate(kvc_dsv4_cache* cache, int64_t seq, int32_t n);
/* comp_ape [ratio, width], comp_norm [head_dim] (CSA/HCA); idx_ape, idx_norm (CSA); NULL: none. */
KVC_API kvc_status kvc_dsv4_set_weights(kvc_dsv4_cache* cache, int32_t layer, const DLTensor* comp_ape,
                                        const DLTensor* comp_norm, const DLTensor* idx_ape, const DLTensor* idx_norm);
/* Tokens pos .. pos + n - 1 (pos == length): kv [n, head_dim] f32 (modified in place when
 * quantized), comp_c / comp_z [n, width], idx_c / idx_z [n, 2 * index_dim] (NULL where unused). */
KVC_API kvc_status kvc_dsv4_append(kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t pos, const DLTensor* kv,
                                   const DLTensor* comp_c, const DLTensor* comp_z, const DLTensor* idx_c,
                                   const DLTensor* idx_z);
KVC_API kvc_status kvc_dsv4_length(const kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t* out);
KVC_API kvc_status kvc_dsv4_compressed_rows(const kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t* out);
/* Host copy as f32 of the window rows (which = 0, oldest first) or compressed rows (which = 1):
 * up to cap floats into out; *n_floats receives the size (nothing written when it exceeds cap). */
KVC_API kvc_status kvc_dsv4_read(const kvc_dsv4_cache* cache, int64_t seq, int32_t layer, int32_t which, float* out,
                                 size_t cap, size_t* n_floats);
/* Dsv4Cache::shift (docs/specs/dsv4-context-shift.md): KVC_E_INVALID_ARGUMENT for a bad range or
 * counts that are not multiples of the lcm of the compression ratios, KVC_E_NOT_SUPPORTED when the
 * kept tail is shorter than the window of a sequence longer than it. */
KVC_API kvc_status kvc_dsv4_shift(kvc_dsv4_cache* cache, int64_t seq, int32_t n_keep, int32_t n_discard);

/* ---- persistence: snapshots (kvcore/persist/snapshot.hpp) ------------------------------------ */
/* Saves seqs[0 .. n_seqs) of the cache (n_seqs 0: every sequence) to path: a temporary file in the
 * same directory, fsync'ed and renamed over path (after a crash path holds the old file or the new
 * one). model_id: the caller's name of what made the K/V (model, revision, dtype, ...). */
KVC_API kvc_status kvc_snapshot_save(kvc_paged_cache* cache, const char* path, const char* model_id,
                                     const int64_t* seqs, size_t n_seqs);
/* Loads path's sequences as new sequences of the cache: out_ids[i] receives the new id of the i-th
 * saved sequence, *n_loaded their count (nothing is loaded when it exceeds cap:
 * KVC_E_INVALID_ARGUMENT). Everything is checked before the cache is touched: a truncated or
 * corrupted file is KVC_E_CORRUPT; another layout or model id KVC_E_INVALID_ARGUMENT; too few free
 * blocks KVC_E_OUT_OF_MEMORY. position_delta (KVC_ROPE_ON_READ caches only) is added to every
 * loaded position. */
KVC_API kvc_status kvc_snapshot_load(kvc_paged_cache* cache, const char* path, const char* model_id,
                                     int32_t position_delta, int64_t* out_ids, size_t cap, size_t* n_loaded);

typedef struct kvc_snapshot_info {
  uint32_t struct_size;
  uint32_t major, minor; /* format version */
  uint32_t kind;         /* 1: PagedCache sequences, 2: a Dsv4Cache sequence */
  uint64_t file_bytes;
  int64_t n_chunks;
  int64_t n_seqs;
  int32_t block_size, n_blocks;
  int64_t bytes_per_block;
} kvc_snapshot_info;
KVC_API void kvc_snapshot_info_init(kvc_snapshot_info* info);
/* Checks the file as a load would, without a cache (KVC_E_CORRUPT / KVC_E_INVALID_ARGUMENT), and
 * fills *info; text (may be NULL) receives up to cap bytes of the readable description (NUL
 * terminated, cut to fit) and *text_len (may be NULL) its full length. */
KVC_API kvc_status kvc_snapshot_inspect(const char* path, kvc_snapshot_info* info, char* text, size_t cap,
                                        size_t* text_len);
/* One Dsv4Cache sequence (kvcore/persist/dsv4_snapshot.hpp); load needs an empty sequence. */
KVC_API kvc_status kvc_dsv4_snapshot_save(kvc_dsv4_cache* cache, int64_t seq, const char* path, const char* model_id);
KVC_API kvc_status kvc_dsv4_snapshot_load(kvc_dsv4_cache* cache, int64_t seq, const char* path, const char* model_id);

/* ---- persistence: prefix caching (kvcore/persist/prefix_cache.hpp) -------------------------- */
/* Reuse of full blocks computed from the same tokens under the same salt (model, adapter, tenant:
 * bytes, salt_len of them). Free a prefix cache before its PagedCache. */
typedef struct kvc_prefix_cache kvc_prefix_cache;
typedef struct kvc_prefix_stats {
  uint32_t struct_size;
  int64_t queries, hit_queries, blocks_hit, blocks_missed, blocks_published, holders, evictions;
} kvc_prefix_stats;
/* seed 0: a random one. */
KVC_API kvc_status kvc_prefix_create(kvc_paged_cache* cache, uint64_t seed, kvc_prefix_cache** out);
KVC_API void kvc_prefix_free(kvc_prefix_cache* prefix);
/* A new sequence holding the longest cached prefix of prompt[0 .. n) in full blocks; *reused_tokens
 * (may be NULL) receives how many tokens it holds (a multiple of block_size). Append the rest. */
KVC_API kvc_status kvc_prefix_seq_create(kvc_prefix_cache* prefix, const int32_t* prompt, size_t n, const char* salt,
                                         size_t salt_len, int64_t* out_seq, int32_t* reused_tokens);
/* Publishes the full blocks of seq's unedited prefix: tokens[i] is the id of its token i.
 * *published (may be NULL) receives the tokens now published. */
KVC_API kvc_status kvc_prefix_publish(kvc_prefix_cache* prefix, int64_t seq, const int32_t* tokens, size_t n,
                                      const char* salt, size_t salt_len, int32_t* published);
/* Edits of sequences made by kvc_prefix_seq_create go through these (or are reported). */
KVC_API kvc_status kvc_prefix_shift(kvc_prefix_cache* prefix, int64_t seq, int32_t n_keep, int32_t n_discard);
KVC_API kvc_status kvc_prefix_truncate(kvc_prefix_cache* prefix, int64_t seq, int32_t n);
KVC_API kvc_status kvc_prefix_note_edit(kvc_prefix_cache* prefix, int64_t seq, int32_t first_token);
KVC_API kvc_status kvc_prefix_erase(kvc_prefix_cache* prefix, int64_t seq);
/* Drops least recently used cached prefixes until the cache has free_blocks free; *ok = 1 when it has. */
KVC_API kvc_status kvc_prefix_evict(kvc_prefix_cache* prefix, int32_t free_blocks, int32_t* ok);
KVC_API kvc_status kvc_prefix_clear(kvc_prefix_cache* prefix);
KVC_API kvc_status kvc_prefix_stats_get(const kvc_prefix_cache* prefix, kvc_prefix_stats* out);

/* ---- persistence: stores below device memory (kvcore/persist/kv_store.hpp) ------------------- */
/* Sealed values keyed by content hash and layout: every read checks size, header, key and XXH3
 * checksum, and a damaged value is a miss. A store is a cache (it may drop anything); tier trouble
 * (a full disk, I/O errors) is a failed put or a miss, not an error status. */
typedef struct kvc_store kvc_store;
typedef struct kvc_store_key {
  uint64_t content_hi, content_lo; /* 128-bit content hash */
  uint64_t layout;                 /* the layout hash of the cache that made the bytes */
} kvc_store_key;
/* The key of tokens[0 .. n) (token ids) under salt (salt_len bytes: model, adapter, tenant) in the
 * cache's layout: XXH3-128 of the salt and the ids. */
KVC_API kvc_status kvc_store_key_for_tokens(const kvc_paged_cache* cache, const int32_t* tokens, size_t n,
                                            const char* salt, size_t salt_len, kvc_store_key* out);
/* Host memory, an LRU map of at most max_bytes sealed bytes. */
KVC_API kvc_status kvc_host_store_create(int64_t max_bytes, kvc_store** out);
/* A local directory, one file per value written by temporary file, fsync (fsync_each_put: bool)
 * and rename; at most max_bytes, least recently used files first. */
KVC_API kvc_status kvc_disk_store_create(const char* dir, int64_t max_bytes, int32_t fsync_each_put, kvc_store** out);
/* tiers[0 .. n_tiers) in order, fastest first; tiers[0] must be a host store. Puts go to the first
 * tier; what it evicts a worker writes to every lower tier (past max_queue_bytes waiting, the
 * oldest moves are dropped); gets try the tiers in order. Uses the tiers by reference: free the
 * tiered store before them. */
KVC_API kvc_status kvc_tiered_store_create(kvc_store* const* tiers, size_t n_tiers, int64_t max_queue_bytes,
                                           kvc_store** out);
KVC_API void kvc_store_free(kvc_store* store);
/* *out = 1 when a value is stored under key (not checked: a later read may still miss). */
KVC_API kvc_status kvc_store_contains(kvc_store* store, const kvc_store_key* key, int32_t* out);
/* Waits until a tiered store's worker has moved everything queued so far (other stores: nothing). */
KVC_API kvc_status kvc_store_flush(kvc_store* store);
typedef struct kvc_store_stats {
  uint32_t struct_size;
  int64_t puts, put_failures, hits, misses;
  int64_t rejected;  /* values found but refused by the seal check (counted as misses too) */
  int64_t evictions; /* values dropped for the size limit */
  int64_t items, bytes;
  int32_t down; /* bool: a lost connection waiting for a retry */
  int64_t reconnects;
} kvc_store_stats;
KVC_API kvc_status kvc_store_stats_get(const kvc_store* store, kvc_store_stats* out);

/* A Redis (or Valkey) server through hiredis (kvcore/persist/redis_store.hpp): a kvc_store like
 * the others (a tiered store's lower tier, an offloader's lower store). The server is not trusted:
 * AUTH with the password, every value read back checked before use. Connects lazily: while the
 * server is down or refuses the password, puts fail and gets miss (no error status) and the store
 * retries after a backoff that doubles; kvc_redis_store_ping says why. Where libkvcore.so was built
 * without hiredis, kvc_redis_compiled() is 0 and kvc_redis_store_* return KVC_E_NOT_SUPPORTED. */
typedef struct kvc_redis_config {
  uint32_t struct_size;
  const char* host;           /* NUL-terminated, default "127.0.0.1" */
  int32_t port;               /* default 6379 */
  const char* password;       /* NUL-terminated; AUTH unless NULL (default) or "" */
  const char* key_prefix;     /* NUL-terminated, default "kvc:1:"; a value's key: prefix + the key in hex */
  int32_t connect_timeout_ms; /* default 500 */
  int32_t io_timeout_ms;      /* default 1000 */
  int64_t max_value_bytes;    /* larger values are neither sent nor accepted; default 64 MiB */
  int32_t backoff_initial_ms; /* first retry delay, default 50 */
  int32_t backoff_max_ms;     /* longest retry delay, default 2000 */
  int32_t ttl_seconds;        /* keys expire after it; 0 (default): never */
} kvc_redis_config;
KVC_API int32_t kvc_redis_compiled(void); /* 1 when this libkvcore.so has the Redis store */
KVC_API void kvc_redis_config_init(kvc_redis_config* cfg);
KVC_API kvc_status kvc_redis_store_create(const kvc_redis_config* cfg, kvc_store** out);
/* KVC_OK when a connection is up (connecting and AUTHing now unless a backoff runs); else
 * KVC_E_UNAVAILABLE, kvc_last_error() saying why (cannot connect, AUTH refused with the server's
 * reply, connection lost or timed out). */
KVC_API kvc_status kvc_redis_store_ping(kvc_store* store);

/* ---- persistence: the pinned-host offload tier (kvcore/persist/block_offload.hpp) ------------ */
/* A PagedCache's sequences copied into a pinned host arena and back; what the arena evicts goes
 * down to a lower store through worker threads (the caller never waits for a slow tier). On CUDA
 * an offload queues its copy on a side stream after the work queued on the cache's stream and
 * returns at once; on the CPU every call is synchronous. Free an offloader before its PagedCache
 * and its lower store. */
typedef struct kvc_offloader kvc_offloader;
typedef struct kvc_offload_config {
  uint32_t struct_size;
  int64_t pinned_bytes;    /* the arena, default 1 GiB */
  kvc_store* lower;        /* where evicted values go; NULL (default): dropped */
  const char* model_id;    /* NUL-terminated, recorded in every value; another model's value is a miss */
  int64_t max_queue_bytes; /* values copied out, waiting for `lower`; past it the oldest are dropped */
} kvc_offload_config;
typedef struct kvc_offload_stats {
  uint32_t struct_size;
  int64_t offloads, refused; /* values copied in / offloads larger than the whole arena */
  int64_t pinned_hits, lower_hits, misses;
  int64_t demoted, demote_failures, dropped;
  int64_t entries, pinned_used, holders; /* now: values in the arena, its bytes in use, copies in flight */
} kvc_offload_stats;
KVC_API void kvc_offload_config_init(kvc_offload_config* cfg);
KVC_API kvc_status kvc_offloader_create(kvc_paged_cache* cache, const kvc_offload_config* cfg, kvc_offloader** out);
KVC_API void kvc_offloader_free(kvc_offloader* off); /* waits for every copy and demotion */
/* Starts copying seq into the arena under key (key->layout: the cache's layout hash); *stored (may
 * be NULL) = 1 when the value is (or already was) there, 0 when it is larger than the arena. */
KVC_API kvc_status kvc_offloader_offload(kvc_offloader* off, int64_t seq, const kvc_store_key* key, int32_t* stored);
/* On a hit (*hit = 1) *out_seq is a new sequence holding key's value, its copy queued on stream
 * after the value's own offload copy; on a miss *hit = 0 and nothing changed. KVC_E_OUT_OF_MEMORY
 * (nothing changed, the value kept) when the cache has too few free blocks. */
KVC_API kvc_status kvc_offloader_load(kvc_offloader* off, const kvc_store_key* key, void* stream, int64_t* out_seq,
                                      int32_t* hit);
KVC_API kvc_status kvc_offloader_contains(kvc_offloader* off, const kvc_store_key* key, int32_t* out);
/* Releases holders whose copies completed (every other call does too). */
KVC_API kvc_status kvc_offloader_poll(kvc_offloader* off);
/* Waits for every offload copy and demotion queued so far. */
KVC_API kvc_status kvc_offloader_flush(kvc_offloader* off);
KVC_API kvc_status kvc_offloader_stats_get(const kvc_offloader* off, kvc_offload_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* KVCORE_KVCORE_H */
