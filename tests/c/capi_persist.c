/* C99 checks of the C API's engine-owned pools, snapshots and prefix caching:
 *   - a cache over pools the program allocated (kvc_paged_pool_specs, kvc_paged_create_with_pools)
 *     writes into them and reads back exactly what a cache with its own pools does; bad pool
 *     lists are refused;
 *   - snapshots: save a forked pair, inspect, load into another cache (same K/V read back), and
 *     refusals (other model id, a flipped byte, cap too small) that leave the target cache as it was;
 *   - a DeepSeek-V4 sequence saved and loaded into another cache;
 *   - prefix caching: publish, a hit under the same salt with the same K/V, a miss under another.
 * Exit status 0 = pass. */
#include <kvcore/kvcore.h>

#include "check.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


enum { LAYERS = 2, HEADS = 2, DIM = 64, BLOCK = 4, NBLOCKS = 16, TOKENS = 10, MAXTOK = 32 };

static const kvc_device cpu = {KVC_DEVICE_CPU, 0};
static kvc_rope_spec rope;

static float unit(unsigned i) { return (float)sin(0.37 * i + 0.1) * (float)(1 + i % 3); }

static void config(kvc_paged_config* cfg, int32_t rope_mode) {
  kvc_rope_spec_init(&rope, DIM, 10000.0);
  kvc_paged_config_init(cfg);
  cfg->n_layers = LAYERS;
  cfg->n_kv_heads = HEADS;
  cfg->head_dim = DIM;
  cfg->v_head_dim = DIM;
  cfg->block_size = BLOCK;
  cfg->num_blocks = NBLOCKS;
  cfg->k_format = KVC_FORMAT_F32;
  cfg->v_format = KVC_FORMAT_F32;
  cfg->rope_mode = rope_mode;
  cfg->rope = &rope;
  cfg->n_rope = 1;
}

/* Appends n tokens (positions 0..n-1) with data from `seed` to every layer of seq. */
static void append(kvc_paged_cache* c, int64_t seq, int32_t first, int32_t n, unsigned seed) {
  static float k[LAYERS][MAXTOK][HEADS][DIM];
  int64_t shape[4] = {LAYERS, 0, HEADS, DIM};
  int32_t pos[MAXTOK];
  DLTensor t;
  int i, l, h, d;
  shape[1] = n;
  for (l = 0; l < LAYERS; ++l)
    for (i = 0; i < n; ++i)
      for (h = 0; h < HEADS; ++h)
        for (d = 0; d < DIM; ++d) k[l][i][h][d] = unit(seed + (unsigned)(((l * n + i) * HEADS + h) * DIM + d));
  for (i = 0; i < n; ++i) pos[i] = first + i;
  t = host_tensor(k, kDLFloat, 32, 4, shape);
  CHECK(kvc_paged_append(c, seq, pos, n, &t, &t) == KVC_OK, "append: %s", kvc_last_error());
}

/* Layer 1 of seq read back: returns its length; k receives [n, HEADS, DIM]. */
static int32_t read_k(kvc_paged_cache* c, int64_t seq, float* k) {
  int32_t n = -1;
  CHECK(kvc_paged_read(c, seq, 1, NULL, k, NULL, MAXTOK, &n) == KVC_OK, "read: %s", kvc_last_error());
  return n;
}

static int all_blocks_free(kvc_paged_cache* c) {
  int64_t seq = -1;
  int32_t count = NBLOCKS * BLOCK, fits = 0;
  CHECK(kvc_paged_seq_create(c, &seq) == KVC_OK, "seq create: %s", kvc_last_error());
  CHECK(kvc_paged_can_fit(c, &seq, &count, 1, &fits) == KVC_OK, "can_fit: %s", kvc_last_error());
  kvc_paged_seq_erase(c, seq);
  return fits;
}

static void pools(void) {
  kvc_paged_config cfg;
  kvc_pool_spec specs[8];
  DLTensor arrays[8];
  unsigned char* raw[8];
  size_t n = 0, i;
  kvc_paged_cache *given = NULL, *own = NULL;
  int64_t sg = -1, so = -1;
  static float kg[MAXTOK * HEADS * DIM], ko[MAXTOK * HEADS * DIM];
  int nonzero = 0;
  config(&cfg, KVC_ROPE_STORED);
  for (i = 0; i < 8; ++i) kvc_pool_spec_init(&specs[i]);
  CHECK(kvc_paged_pool_specs(&cfg, specs, 2, &n) == KVC_E_INVALID_ARGUMENT && n == 4,
        "cap 2 for 4 specs: n = %d (%s)", (int)n, kvc_last_error());
  CHECK(kvc_paged_pool_specs(&cfg, specs, 8, &n) == KVC_OK && n == 4, "specs: %s", kvc_last_error());
  for (i = 0; i < n; ++i) {
    uintptr_t p;
    CHECK(specs[i].layer == (int32_t)(i / 2) && specs[i].part == (i % 2 ? KVC_POOL_V : KVC_POOL_K), "spec %d", (int)i);
    CHECK(specs[i].shape[0] == NBLOCKS + 1 && specs[i].shape[3] == DIM && specs[i].dtype.code == kDLFloat &&
              specs[i].bytes == (int64_t)(NBLOCKS + 1) * BLOCK * HEADS * DIM * 4,
          "spec %d shape or size", (int)i);
    raw[i] = malloc((size_t)specs[i].bytes + KVC_POOL_ALIGNMENT);
    p = ((uintptr_t)raw[i] + KVC_POOL_ALIGNMENT - 1) / KVC_POOL_ALIGNMENT * KVC_POOL_ALIGNMENT;
    memset((void*)p, 0x7f, (size_t)specs[i].bytes);
    memset(&arrays[i], 0, sizeof arrays[i]);
    arrays[i].data = (void*)p;
    arrays[i].device.device_type = kDLCPU;
    arrays[i].ndim = 4;
    arrays[i].dtype = specs[i].dtype;
    arrays[i].shape = specs[i].shape;
  }
  CHECK(kvc_paged_create_with_pools(&cfg, cpu, arrays, 3, &given) == KVC_E_INVALID_ARGUMENT && given == NULL,
        "3 of 4 arrays accepted");
  CHECK(strstr(kvc_last_error(), "pools holds 3 arrays") != NULL, "message: %s", kvc_last_error());
  CHECK(((unsigned char*)arrays[0].data)[0] == 0x7f, "a refused call wrote the pools");
  arrays[1].shape = specs[0].shape; /* same shape: still fine */
  arrays[2].dtype.bits = 16;
  CHECK(kvc_paged_create_with_pools(&cfg, cpu, arrays, 4, &given) == KVC_E_INVALID_ARGUMENT,
        "an f16 array for an f32 pool was accepted");
  CHECK(strstr(kvc_last_error(), "pools[2] (layer 1 k)") != NULL, "message: %s", kvc_last_error());
  arrays[2].dtype.bits = 32;
  CHECK(kvc_paged_create_with_pools(&cfg, cpu, arrays, 4, &given) == KVC_OK, "create with pools: %s", kvc_last_error());
  CHECK(kvc_paged_create(&cfg, cpu, &own) == KVC_OK, "create: %s", kvc_last_error());
  if (!given || !own) return;
  CHECK(kvc_paged_set_stream(given, NULL) == KVC_OK, "set_stream: %s", kvc_last_error());
  CHECK(kvc_paged_set_stream(NULL, NULL) == KVC_E_INVALID_ARGUMENT, "set_stream on NULL accepted");
  kvc_paged_seq_create(given, &sg);
  kvc_paged_seq_create(own, &so);
  append(given, sg, 0, TOKENS, 11);
  append(own, so, 0, TOKENS, 11);
  CHECK(read_k(given, sg, kg) == TOKENS && read_k(own, so, ko) == TOKENS, "lengths");
  CHECK(memcmp(kg, ko, sizeof(float) * TOKENS * HEADS * DIM) == 0, "a cache over caller pools reads other K");
  for (i = 0; i < (size_t)BLOCK * HEADS * DIM * 4; ++i) nonzero |= ((unsigned char*)arrays[2].data)[i] != 0;
  CHECK(nonzero, "layer 1's K was not written into the caller's array");
  CHECK(((unsigned char*)arrays[0].data)[specs[0].bytes - 1] == 0, "the zero block is not zero");
  kvc_paged_free(given);
  kvc_paged_free(own);
  for (i = 0; i < n; ++i) free(raw[i]); /* the caller's memory: freed by the caller, after the cache */
}

static void snapshots(void) {
  const char* path = "capi_persist_test.kvcsnap";
  kvc_paged_config cfg;
  kvc_paged_cache *src = NULL, *dst = NULL;
  int64_t a = -1, b = -1, ids[4] = {-1, -1, -1, -1}, two[2];
  size_t loaded = 0, text_len = 0;
  kvc_snapshot_info info;
  char text[256];
  static float k_src[MAXTOK * HEADS * DIM], k_dst[MAXTOK * HEADS * DIM];
  FILE* f;
  long size;
  unsigned char byte;
  config(&cfg, KVC_ROPE_ON_READ);
  CHECK(kvc_paged_create(&cfg, cpu, &src) == KVC_OK && kvc_paged_create(&cfg, cpu, &dst) == KVC_OK, "create: %s",
        kvc_last_error());
  if (!src || !dst) return;
  kvc_paged_seq_create(src, &a);
  append(src, a, 0, TOKENS, 5);
  kvc_paged_seq_fork(src, a, &b);
  append(src, b, TOKENS, 3, 99);
  CHECK(kvc_paged_seq_shift(src, a, 2, 3) == KVC_OK, "shift: %s", kvc_last_error());
  two[0] = a;
  two[1] = b;
  CHECK(kvc_snapshot_save(src, path, "model-x", two, 2) == KVC_OK, "save: %s", kvc_last_error());
  kvc_snapshot_info_init(&info);
  CHECK(kvc_snapshot_inspect(path, &info, text, sizeof text, &text_len) == KVC_OK, "inspect: %s", kvc_last_error());
  CHECK(info.kind == 1 && info.n_seqs == 2 && info.block_size == BLOCK && info.major == 1, "info: kind %u, %d seqs",
        info.kind, (int)info.n_seqs);
  CHECK(text_len > 0 && strlen(text) == (text_len < sizeof text ? text_len : sizeof text - 1), "describe text");
  /* refusals: nothing loaded */
  CHECK(kvc_snapshot_load(dst, path, "model-y", 0, ids, 4, &loaded) == KVC_E_INVALID_ARGUMENT, "another model id loaded");
  CHECK(kvc_snapshot_load(dst, path, "model-x", 0, ids, 1, &loaded) == KVC_E_INVALID_ARGUMENT && loaded == 2,
        "cap 1 for 2 sequences: loaded = %d", (int)loaded);
  CHECK(all_blocks_free(dst), "a refused load took blocks");
  CHECK(kvc_snapshot_load(dst, path, "model-x", 0, ids, 4, &loaded) == KVC_OK && loaded == 2, "load: %s",
        kvc_last_error());
  CHECK(read_k(src, a, k_src) == TOKENS - 3 && read_k(dst, ids[0], k_dst) == TOKENS - 3, "loaded length");
  CHECK(memcmp(k_src, k_dst, sizeof(float) * (TOKENS - 3) * HEADS * DIM) == 0, "loaded K differs (shifted sequence)");
  CHECK(read_k(src, b, k_src) == TOKENS + 3 && read_k(dst, ids[1], k_dst) == TOKENS + 3, "loaded fork length");
  CHECK(memcmp(k_src, k_dst, sizeof(float) * (TOKENS + 3) * HEADS * DIM) == 0, "loaded K differs (fork)");
  /* a flipped byte in the middle of the file: Corrupt, nothing loaded */
  f = fopen(path, "r+b");
  CHECK(f != NULL, "reopen %s", path);
  if (f) {
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, size / 2, SEEK_SET);
    byte = (unsigned char)fgetc(f);
    fseek(f, size / 2, SEEK_SET);
    fputc(byte ^ 0x10, f);
    fclose(f);
  }
  kvc_paged_seq_erase(dst, ids[0]);
  kvc_paged_seq_erase(dst, ids[1]);
  CHECK(kvc_snapshot_load(dst, path, "model-x", 0, ids, 4, &loaded) == KVC_E_CORRUPT, "a corrupted file loaded (%s)",
        kvc_last_error());
  CHECK(all_blocks_free(dst), "a corrupted load took blocks");
  CHECK(kvc_snapshot_inspect(path, &info, NULL, 0, NULL) == KVC_E_CORRUPT, "inspect passed a corrupted file");
  CHECK(kvc_snapshot_load(dst, "no/such/file", "model-x", 0, ids, 4, &loaded) != KVC_OK, "a missing file loaded");
  remove(path);
  kvc_paged_free(src);
  kvc_paged_free(dst);
}

static void dsv4_snapshot(void) {
  const char* path = "capi_persist_test_dsv4.kvcsnap";
  kvc_dsv4_config cfg;
  kvc_dsv4_cache *src = NULL, *dst = NULL;
  int32_t kinds[2] = {KVC_DSV4_WINDOW, KVC_DSV4_WINDOW}, len = -1;
  int64_t s = -1, d = -1;
  static float kv[512], rows_src[128 * 512], rows_dst[128 * 512];
  int64_t shape[2] = {1, 512};
  DLTensor t;
  size_t n_src = 0, n_dst = 0;
  int i, p;
  kvc_dsv4_config_v4_flash(&cfg, 256, 1);
  cfg.layer_kinds = kinds;
  cfg.n_layers = 2;
  CHECK(kvc_dsv4_create(&cfg, cpu, &src) == KVC_OK && kvc_dsv4_create(&cfg, cpu, &dst) == KVC_OK, "dsv4 create: %s",
        kvc_last_error());
  if (!src || !dst) return;
  kvc_dsv4_seq_create(src, &s);
  kvc_dsv4_seq_create(dst, &d);
  t = host_tensor(kv, kDLFloat, 32, 2, shape);
  for (p = 0; p < 3; ++p) {
    for (i = 0; i < 512; ++i) kv[i] = unit((unsigned)(i + 512 * p)) * 0.1f;
    CHECK(kvc_dsv4_append(src, s, 0, p, &t, NULL, NULL, NULL, NULL) == KVC_OK, "append: %s", kvc_last_error());
    CHECK(kvc_dsv4_append(src, s, 1, p, &t, NULL, NULL, NULL, NULL) == KVC_OK, "append: %s", kvc_last_error());
  }
  CHECK(kvc_dsv4_snapshot_save(src, s, path, "v4") == KVC_OK, "dsv4 save: %s", kvc_last_error());
  CHECK(kvc_dsv4_snapshot_load(dst, d, path, "v3") == KVC_E_INVALID_ARGUMENT, "another model id loaded");
  CHECK(kvc_dsv4_length(dst, d, 1, &len) == KVC_OK && len == 0, "a refused load changed the length");
  CHECK(kvc_dsv4_snapshot_load(dst, d, path, "v4") == KVC_OK, "dsv4 load: %s", kvc_last_error());
  CHECK(kvc_dsv4_length(dst, d, 1, &len) == KVC_OK && len == 3, "loaded length %d", (int)len);
  CHECK(kvc_dsv4_read(src, s, 1, 0, rows_src, sizeof rows_src / sizeof rows_src[0], &n_src) == KVC_OK &&
            kvc_dsv4_read(dst, d, 1, 0, rows_dst, sizeof rows_dst / sizeof rows_dst[0], &n_dst) == KVC_OK,
        "dsv4 read: %s", kvc_last_error());
  CHECK(n_src == 3 * 512 && n_dst == n_src && memcmp(rows_src, rows_dst, n_src * sizeof(float)) == 0,
        "loaded window rows differ");
  remove(path);
  kvc_dsv4_free(src);
  kvc_dsv4_free(dst);
}

static void prefixes(void) {
  kvc_paged_config cfg;
  kvc_paged_cache* cache = NULL;
  kvc_prefix_cache* prefix = NULL;
  int32_t prompt[TOKENS], reused = -1, published = -1, ok = 0;
  int64_t first = -1, hit = -1, other = -1;
  kvc_prefix_stats st;
  static float k_first[MAXTOK * HEADS * DIM], k_hit[MAXTOK * HEADS * DIM];
  int i;
  config(&cfg, KVC_ROPE_STORED);
  CHECK(kvc_paged_create(&cfg, cpu, &cache) == KVC_OK, "create: %s", kvc_last_error());
  if (!cache) return;
  CHECK(kvc_prefix_create(cache, 42, &prefix) == KVC_OK, "prefix create: %s", kvc_last_error());
  if (!prefix) return;
  for (i = 0; i < TOKENS; ++i) prompt[i] = 1000 + 7 * i;
  CHECK(kvc_prefix_seq_create(prefix, prompt, TOKENS, "tenant-a", 8, &first, &reused) == KVC_OK && reused == 0,
        "first query: reused %d (%s)", (int)reused, kvc_last_error());
  append(cache, first, 0, TOKENS, 3);
  CHECK(kvc_prefix_publish(prefix, first, prompt, TOKENS, "tenant-a", 8, &published) == KVC_OK && published == 8,
        "publish: %d (%s)", (int)published, kvc_last_error());
  CHECK(kvc_prefix_seq_create(prefix, prompt, TOKENS, "tenant-a", 8, &hit, &reused) == KVC_OK && reused == 8,
        "same salt: reused %d", (int)reused);
  CHECK(kvc_prefix_seq_create(prefix, prompt, TOKENS, "tenant-b", 8, &other, &reused) == KVC_OK && reused == 0,
        "another salt reused %d tokens", (int)reused);
  CHECK(read_k(cache, first, k_first) == TOKENS && read_k(cache, hit, k_hit) == 8, "lengths");
  CHECK(memcmp(k_first, k_hit, sizeof(float) * 8 * HEADS * DIM) == 0, "the hit's K differs from the publisher's");
  CHECK(kvc_prefix_publish(prefix, first, prompt, TOKENS, NULL, 3, &published) == KVC_E_INVALID_ARGUMENT,
        "a NULL salt with salt_len 3 accepted");
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(kvc_prefix_stats_get(prefix, &st) == KVC_OK && st.queries == 3 && st.hit_queries == 1 && st.blocks_hit == 2 &&
            st.holders == 1,
        "stats: %d queries, %d hits, %d blocks hit, %d holders", (int)st.queries, (int)st.hit_queries,
        (int)st.blocks_hit, (int)st.holders);
  CHECK(kvc_prefix_truncate(prefix, first, 4) == KVC_OK, "truncate: %s", kvc_last_error());
  kvc_prefix_erase(prefix, first);
  kvc_prefix_erase(prefix, hit);
  kvc_prefix_erase(prefix, other);
  CHECK(kvc_prefix_evict(prefix, NBLOCKS, &ok) == KVC_OK && ok == 1, "evict: %s", kvc_last_error());
  CHECK(all_blocks_free(cache), "blocks left after erasing and evicting everything");
  kvc_prefix_free(prefix);
  kvc_paged_free(cache);
}

int main(void) {
  pools();
  snapshots();
  dsv4_snapshot();
  prefixes();
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("capi_persist: all checks passed\n");
  return failures ? 1 : 0;
}
