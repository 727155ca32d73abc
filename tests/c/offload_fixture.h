/* What the C programs over the offloader share (capi_offload.c, capi_redis.c): a small f32-fed cache
 * geometry, deterministic K/V data, whole-sequence read-backs to compare bit for bit, value keys and
 * stats getters. C99, header-only; include after check.h. */
#ifndef KVCORE_TESTS_C_OFFLOAD_FIXTURE_H
#define KVCORE_TESTS_C_OFFLOAD_FIXTURE_H
#include <kvcore/kvcore.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

enum { LAYERS = 2, HEADS = 2, DIM = 64, BLOCK = 8, NBLOCKS = 48, MAXTOK = 64, NSEQ = 3 };

static const kvc_device cpu = {KVC_DEVICE_CPU, 0};
static kvc_rope_spec rope;

static inline float unit(unsigned i) { return (float)sin(0.37 * i + 0.1) * (float)(1 + i % 3); }

static inline kvc_paged_cache* make_cache(int32_t format, int32_t rope_mode, int32_t num_blocks) {
  kvc_paged_config cfg;
  kvc_paged_cache* c = NULL;
  kvc_rope_spec_init(&rope, DIM, 10000.0);
  kvc_paged_config_init(&cfg);
  cfg.n_layers = LAYERS;
  cfg.n_kv_heads = HEADS;
  cfg.head_dim = DIM;
  cfg.v_head_dim = DIM;
  cfg.block_size = BLOCK;
  cfg.num_blocks = num_blocks;
  cfg.k_format = format;
  cfg.v_format = format;
  cfg.rope_mode = rope_mode;
  cfg.rope = &rope;
  cfg.n_rope = 1;
  CHECK(kvc_paged_create(&cfg, cpu, &c) == KVC_OK, "create: %s", kvc_last_error());
  return c;
}

/* Appends n tokens at positions first.. with data from `seed` to every layer (K and V). */
static inline void append(kvc_paged_cache* c, int64_t seq, int32_t first, int32_t n, unsigned seed) {
  static float k[LAYERS * MAXTOK * HEADS * DIM];
  int64_t shape[4] = {LAYERS, 0, HEADS, DIM};
  int32_t pos[MAXTOK];
  DLTensor t;
  int i;
  shape[1] = n;
  for (i = 0; i < LAYERS * n * HEADS * DIM; ++i) k[i] = unit(seed + (unsigned)i);
  for (i = 0; i < n; ++i) pos[i] = first + i;
  t = host_tensor(k, kDLFloat, 32, 4, shape);
  CHECK(kvc_paged_append(c, seq, pos, n, &t, &t) == KVC_OK, "append: %s", kvc_last_error());
}

/* Everything a sequence reads back: per layer positions, K and V (f32). */
typedef struct {
  int32_t n;
  int32_t pos[LAYERS][MAXTOK];
  float k[LAYERS][MAXTOK * HEADS * DIM], v[LAYERS][MAXTOK * HEADS * DIM];
} seq_read;

static inline void read_seq(kvc_paged_cache* c, int64_t seq, seq_read* r) {
  int l;
  memset(r, 0, sizeof *r);
  for (l = 0; l < LAYERS; ++l)
    CHECK(kvc_paged_read(c, seq, l, r->pos[l], r->k[l], r->v[l], MAXTOK, &r->n) == KVC_OK, "read: %s",
          kvc_last_error());
}

static inline int same_read(const seq_read* a, const seq_read* b) { return memcmp(a, b, sizeof *a) == 0; }

/* Bytes of one block in every pool array (K and V of every layer, FP8 scale bytes included). */
static inline int64_t block_bytes(int32_t format) {
  const int64_t row = format == KVC_FORMAT_FP8 ? DIM + DIM / 64 : format == KVC_FORMAT_F32 ? 4 * DIM : 2 * DIM;
  return (int64_t)LAYERS * 2 * BLOCK * HEADS * row;
}

static inline kvc_store_key key_of(kvc_paged_cache* c, int i) {
  int32_t tokens[4] = {100, 200, 300, 0};
  kvc_store_key k;
  memset(&k, 0, sizeof k);
  tokens[3] = i;
  CHECK(kvc_store_key_for_tokens(c, tokens, 4, "tenant", 6, &k) == KVC_OK, "key: %s", kvc_last_error());
  return k;
}

static inline void offload_stats(kvc_offloader* off, kvc_offload_stats* st) {
  memset(st, 0, sizeof *st);
  st->struct_size = sizeof *st;
  CHECK(kvc_offloader_stats_get(off, st) == KVC_OK, "stats: %s", kvc_last_error());
}

#endif
