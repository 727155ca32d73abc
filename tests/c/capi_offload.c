/* C99 checks of the C API's stores and offload tier (kvc_store_*, kvc_offloader_*), on the CPU where
 * every copy is synchronous:
 *   - round trips of a truncated sequence, a fork of it and a shifted sequence (f16 and FP8, rope
 *     stored and on read) through pinned memory alone, then with a host store below an arena of
 *     about one value (values demoted and loaded back from it): every layer's positions, K and V
 *     read back bit for bit as before;
 *   - a tiered store (host, then a disk directory) as the lower store;
 *   - another model id is a miss; bad input (NULL handles, a key of another layout, bad configs and
 *     tiers, an old struct_size) is refused with the argument named and nothing changed; a load
 *     with too few free blocks is KVC_E_OUT_OF_MEMORY and leaves the cache and the value as they were.
 * Exit status 0 = pass. */
#include <kvcore/kvcore.h>

#include "check.h"
#include "offload_fixture.h"
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Takes every free block with other data (one block per sequence), then frees them: a load must
 * overwrite all it uses. */
static void dirty_free_blocks(kvc_paged_cache* c, unsigned seed) {
  int64_t ids[NBLOCKS + 1];
  int32_t fits = 1, count = BLOCK;
  int n = 0, i;
  while (fits && n <= NBLOCKS) {
    kvc_paged_seq_create(c, &ids[n]);
    CHECK(kvc_paged_can_fit(c, &ids[n], &count, 1, &fits) == KVC_OK, "can_fit: %s", kvc_last_error());
    if (fits) append(c, ids[n], 0, BLOCK, seed + 1000u * (unsigned)n);
    ++n;
  }
  for (i = 0; i < n; ++i) kvc_paged_seq_erase(c, ids[i]);
}

/* append() in pieces of at most MAXTOK tokens. */
static void append_long(kvc_paged_cache* c, int64_t seq, int32_t n, unsigned seed) {
  int32_t done = 0;
  while (done < n) {
    const int32_t m = n - done < MAXTOK ? n - done : MAXTOK;
    append(c, seq, done, m, seed + (unsigned)done);
    done += m;
  }
}

static int32_t blocks_free(kvc_paged_cache* c) {
  int64_t seq = -1;
  int32_t lo = 0, hi = NBLOCKS;
  kvc_paged_seq_create(c, &seq);
  while (lo < hi) { /* the largest b with room for b blocks */
    int32_t mid = (lo + hi + 1) / 2, count = mid * BLOCK, fits = 0;
    kvc_paged_can_fit(c, &seq, &count, 1, &fits);
    if (fits) lo = mid;
    else hi = mid - 1;
  }
  kvc_paged_seq_erase(c, seq);
  return lo;
}

static seq_read want[NSEQ], got_read;

static void round_trips(int32_t format, int32_t rope_mode, kvc_store* tier_below) {
  kvc_paged_cache* c = make_cache(format, rope_mode, NBLOCKS);
  kvc_offloader *pinned = NULL, *off = NULL;
  kvc_offload_config cfg;
  kvc_offload_stats st;
  kvc_store* lower = NULL;
  int64_t seqs[NSEQ], got = -1;
  int32_t ok = 0, hit = 0;
  int i, round;
  if (!c) return;
  /* a: truncated; b: a fork of a, extended; c: shifted (dead cells inside its span) */
  kvc_paged_seq_create(c, &seqs[0]);
  append(c, seqs[0], 0, 37, 1);
  kvc_paged_seq_truncate(c, seqs[0], 30);
  kvc_paged_seq_fork(c, seqs[0], &seqs[1]);
  append(c, seqs[1], 30, 5, 2);
  kvc_paged_seq_create(c, &seqs[2]);
  append(c, seqs[2], 0, 26, 3);
  kvc_paged_seq_shift(c, seqs[2], 4, 9);
  for (i = 0; i < NSEQ; ++i) read_seq(c, seqs[i], &want[i]);

  kvc_offload_config_init(&cfg);
  cfg.pinned_bytes = 16 << 20;
  cfg.model_id = "model-x";
  CHECK(kvc_offloader_create(c, &cfg, &pinned) == KVC_OK, "create: %s", kvc_last_error());
  if (!pinned) return;
  for (i = 0; i < NSEQ; ++i) {
    kvc_store_key k = key_of(c, i);
    CHECK(kvc_offloader_offload(pinned, seqs[i], &k, &ok) == KVC_OK && ok == 1, "offload %d: %s", i, kvc_last_error());
  }
  for (i = 0; i < NSEQ; ++i) {
    kvc_store_key k = key_of(c, i);
    dirty_free_blocks(c, 50u + (unsigned)i);
    CHECK(kvc_offloader_load(pinned, &k, NULL, &got, &hit) == KVC_OK && hit == 1, "load %d: %s", i, kvc_last_error());
    read_seq(c, got, &got_read);
    CHECK(same_read(&got_read, &want[i]), "format %d mode %d: value %d differs after a pinned round trip", format,
          rope_mode, i);
    kvc_paged_seq_erase(c, got);
  }
  offload_stats(pinned, &st);
  CHECK(st.offloads == 3 && st.pinned_hits == 3 && st.misses == 0, "pinned stats: %d offloads, %d hits",
        (int)st.offloads, (int)st.pinned_hits);
  kvc_offloader_free(pinned);

  /* An arena of about one value: the others go down to `lower` as they are evicted. `lower` is a
   * host store, or a tiered store whose host tier holds about one value and sends the rest on to
   * tier_below. */
  {
    kvc_store* host = NULL;
    CHECK(kvc_host_store_create(tier_below ? 6 * block_bytes(format) : 64 << 20, &host) == KVC_OK, "host store: %s",
          kvc_last_error());
    if (!host) return;
    lower = host;
    if (tier_below) {
      kvc_store* tiers[2];
      tiers[0] = host;
      tiers[1] = tier_below;
      CHECK(kvc_tiered_store_create(tiers, 2, 1 << 20, &lower) == KVC_OK, "tiered store: %s", kvc_last_error());
      if (!lower) return;
    }
    cfg.lower = lower;
    cfg.pinned_bytes = 6 * block_bytes(format);
    CHECK(kvc_offloader_create(c, &cfg, &off) == KVC_OK, "create over a lower store: %s", kvc_last_error());
    if (!off) return;
    for (i = 0; i < NSEQ; ++i) {
      kvc_store_key k = key_of(c, i);
      CHECK(kvc_offloader_offload(off, seqs[i], &k, &ok) == KVC_OK && ok == 1, "offload %d: %s", i, kvc_last_error());
    }
    CHECK(kvc_offloader_flush(off) == KVC_OK && kvc_store_flush(lower) == KVC_OK, "flush: %s", kvc_last_error());
    for (i = 0; i < NSEQ; ++i) kvc_paged_seq_erase(c, seqs[i]);
    for (round = 0; round < 2; ++round) /* the second round finds promoted values in pinned memory */
      for (i = 0; i < NSEQ; ++i) {
        kvc_store_key k = key_of(c, i);
        int32_t in = 0;
        dirty_free_blocks(c, 90u + (unsigned)i);
        CHECK(kvc_offloader_contains(off, &k, &in) == KVC_OK && in == 1, "contains %d", i);
        CHECK(kvc_offloader_load(off, &k, NULL, &got, &hit) == KVC_OK && hit == 1, "load %d round %d: %s", i, round,
              kvc_last_error());
        read_seq(c, got, &got_read);
        CHECK(same_read(&got_read, &want[i]), "format %d mode %d: value %d round %d differs", format, rope_mode, i,
              round);
        kvc_paged_seq_erase(c, got);
      }
    offload_stats(off, &st);
    CHECK(st.offloads == 3 && st.demoted >= 2 && st.lower_hits >= 2 && st.pinned_hits + st.lower_hits == 6,
          "stats: %d demoted, %d lower hits, %d pinned hits", (int)st.demoted, (int)st.lower_hits, (int)st.pinned_hits);
    kvc_offloader_free(off);
    if (lower != host) kvc_store_free(lower); /* a tiered store before its tiers */
    kvc_store_free(host);
  }
  kvc_paged_free(c);
}

static void misses_and_refusals(void) {
  kvc_paged_cache* c = make_cache(KVC_FORMAT_BF16, KVC_ROPE_ON_READ, 16);
  kvc_store *lower = NULL, *disk = NULL, *bad_tiered = NULL;
  kvc_store* tiers[2];
  kvc_offloader *off = NULL, *other = NULL, *bad = NULL;
  kvc_offload_config cfg;
  kvc_offload_stats st;
  kvc_store_stats ss;
  kvc_store_key k, wrong;
  int64_t s = -1, filler = -1, got = -1;
  int32_t ok = -1, hit = -1, free_before;
  if (!c) return;
  kvc_paged_seq_create(c, &s);
  append(c, s, 0, 30, 4);
  CHECK(kvc_host_store_create(1 << 20, &lower) == KVC_OK, "host store: %s", kvc_last_error());
  k = key_of(c, 0);

  /* bad configs and stores: refused, naming the argument, no handle */
  kvc_offload_config_init(&cfg);
  cfg.pinned_bytes = 0;
  CHECK(kvc_offloader_create(c, &cfg, &bad) == KVC_E_INVALID_ARGUMENT && bad == NULL, "pinned_bytes 0 accepted");
  CHECK(strstr(kvc_last_error(), "pinned_bytes") != NULL, "message: %s", kvc_last_error());
  kvc_offload_config_init(&cfg);
  cfg.max_queue_bytes = -1;
  CHECK(kvc_offloader_create(c, &cfg, &bad) == KVC_E_INVALID_ARGUMENT, "max_queue_bytes -1 accepted");
  CHECK(strstr(kvc_last_error(), "max_queue_bytes") != NULL, "message: %s", kvc_last_error());
  cfg.struct_size = 0;
  CHECK(kvc_offloader_create(c, &cfg, &bad) == KVC_E_INVALID_ARGUMENT && bad == NULL, "struct_size 0 accepted");
  CHECK(strstr(kvc_last_error(), "struct_size") != NULL, "message: %s", kvc_last_error());
  CHECK(kvc_offloader_create(NULL, &cfg, &bad) == KVC_E_INVALID_ARGUMENT, "a NULL cache accepted");
  CHECK(strstr(kvc_last_error(), "cache") != NULL, "message: %s", kvc_last_error());
  CHECK(kvc_offloader_create(c, NULL, &bad) == KVC_E_INVALID_ARGUMENT, "a NULL cfg accepted");
  CHECK(kvc_host_store_create(0, &disk) == KVC_E_INVALID_ARGUMENT && disk == NULL, "a 0-byte host store");
  CHECK(kvc_disk_store_create(NULL, 1 << 20, 0, &disk) == KVC_E_INVALID_ARGUMENT, "a NULL dir accepted");
  CHECK(kvc_disk_store_create("capi_offload_test_store", 1 << 22, 0, &disk) == KVC_OK, "disk store: %s",
        kvc_last_error());
  tiers[0] = disk;
  tiers[1] = lower;
  CHECK(kvc_tiered_store_create(tiers, 2, 1 << 20, &bad_tiered) == KVC_E_INVALID_ARGUMENT && bad_tiered == NULL,
        "a disk first tier accepted");
  CHECK(strstr(kvc_last_error(), "first tier") != NULL, "message: %s", kvc_last_error());
  tiers[0] = lower;
  tiers[1] = NULL;
  CHECK(kvc_tiered_store_create(tiers, 2, 1 << 20, &bad_tiered) == KVC_E_INVALID_ARGUMENT, "a NULL tier accepted");
  CHECK(strstr(kvc_last_error(), "tiers[1]") != NULL, "message: %s", kvc_last_error());
  CHECK(kvc_tiered_store_create(tiers, 0, 1 << 20, &bad_tiered) == KVC_E_INVALID_ARGUMENT, "no tiers accepted");

  /* an older caller's shorter struct: the fields it lacks keep their defaults */
  kvc_offload_config_init(&cfg);
  cfg.pinned_bytes = 8 << 20;
  cfg.lower = lower;
  cfg.model_id = "model-x";
  cfg.struct_size = (uint32_t)offsetof(kvc_offload_config, max_queue_bytes);
  CHECK(kvc_offloader_create(c, &cfg, &off) == KVC_OK, "create: %s", kvc_last_error());
  if (!off) return;

  /* bad calls: refused, nothing changed */
  free_before = blocks_free(c);
  wrong = k;
  wrong.layout ^= 1;
  CHECK(kvc_offloader_offload(off, s, &wrong, &ok) == KVC_E_INVALID_ARGUMENT, "a key of another layout offloaded");
  CHECK(strstr(kvc_last_error(), "layout") != NULL, "message: %s", kvc_last_error());
  CHECK(kvc_offloader_load(off, &wrong, NULL, &got, &hit) == KVC_E_INVALID_ARGUMENT, "a key of another layout loaded");
  CHECK(kvc_offloader_offload(off, s + 1000, &k, &ok) == KVC_E_INVALID_ARGUMENT, "an unknown sequence offloaded");
  CHECK(kvc_offloader_offload(off, s, NULL, &ok) == KVC_E_INVALID_ARGUMENT, "a NULL key accepted");
  CHECK(strstr(kvc_last_error(), "key") != NULL, "message: %s", kvc_last_error());
  CHECK(kvc_offloader_offload(NULL, s, &k, &ok) == KVC_E_INVALID_ARGUMENT, "a NULL offloader accepted");
  CHECK(kvc_offloader_load(off, &k, NULL, NULL, &hit) == KVC_E_INVALID_ARGUMENT, "a NULL out_seq accepted");
  CHECK(kvc_store_key_for_tokens(c, NULL, 3, "", 0, &k) == KVC_E_INVALID_ARGUMENT, "NULL tokens accepted");
  CHECK(blocks_free(c) == free_before, "a refused call took blocks");
  offload_stats(off, &st);
  CHECK(st.offloads == 0 && st.entries == 0, "a refused call offloaded");
  st.struct_size = 0;
  CHECK(kvc_offloader_stats_get(off, &st) == KVC_E_INVALID_ARGUMENT, "stats with struct_size 0");

  /* too few free blocks: KVC_E_OUT_OF_MEMORY, the cache as it was, the value kept */
  k = key_of(c, 0);
  CHECK(kvc_offloader_offload(off, s, &k, &ok) == KVC_OK && ok == 1, "offload: %s", kvc_last_error());
  kvc_paged_seq_create(c, &filler);
  append_long(c, filler, blocks_free(c) * BLOCK - 3, 8);
  free_before = blocks_free(c);
  CHECK(kvc_offloader_load(off, &k, NULL, &got, &hit) == KVC_E_OUT_OF_MEMORY, "a load into a full cache: %s",
        kvc_last_error());
  CHECK(blocks_free(c) == free_before, "a refused load took blocks");
  kvc_paged_seq_erase(c, filler);
  CHECK(kvc_offloader_load(off, &k, NULL, &got, &hit) == KVC_OK && hit == 1, "load after freeing: %s",
        kvc_last_error());
  kvc_paged_seq_erase(c, got);

  /* other model id: a miss, nothing changed; a key of no value: a miss */
  CHECK(kvc_offloader_offload(off, s, &k, &ok) == KVC_OK, "offload: %s", kvc_last_error());
  kvc_offloader_free(off); /* waits for demotions; values still in the arena are dropped */
  off = NULL;
  cfg.pinned_bytes = 1; /* every offload refused: only `lower` can hit */
  cfg.model_id = "model-y";
  CHECK(kvc_offloader_create(c, &cfg, &other) == KVC_OK, "create: %s", kvc_last_error());
  if (!other) return;
  {
    /* put the value into `lower` through an offloader whose arena holds one value at a time */
    kvc_offloader* writer = NULL;
    kvc_store_key k2 = key_of(c, 1);
    int64_t s2 = -1;
    kvc_offload_config w;
    int32_t in = 0;
    kvc_offload_config_init(&w);
    w.pinned_bytes = 6 * block_bytes(KVC_FORMAT_BF16);
    w.lower = lower;
    w.model_id = "model-x";
    CHECK(kvc_offloader_create(c, &w, &writer) == KVC_OK, "writer: %s", kvc_last_error());
    kvc_paged_seq_create(c, &s2);
    append(c, s2, 0, 20, 9);
    CHECK(kvc_offloader_offload(writer, s, &k, &ok) == KVC_OK && ok, "writer offload: %s", kvc_last_error());
    CHECK(kvc_offloader_offload(writer, s2, &k2, &ok) == KVC_OK && ok, "writer offload: %s", kvc_last_error());
    CHECK(kvc_offloader_flush(writer) == KVC_OK, "flush");
    CHECK(kvc_store_contains(lower, &k, &in) == KVC_OK && in == 1, "the value did not reach the lower store");
    kvc_offloader_free(writer);
    kvc_paged_seq_erase(c, s2);
  }
  free_before = blocks_free(c);
  CHECK(kvc_offloader_load(other, &k, NULL, &got, &hit) == KVC_OK && hit == 0 && got == -1,
        "another model id loaded: hit %d (%s)", (int)hit, kvc_last_error());
  CHECK(blocks_free(c) == free_before, "a miss took blocks");
  offload_stats(other, &st);
  CHECK(st.misses == 1 && st.lower_hits == 0, "stats: %d misses", (int)st.misses);
  memset(&ss, 0, sizeof ss);
  ss.struct_size = sizeof ss;
  CHECK(kvc_store_stats_get(lower, &ss) == KVC_OK && ss.puts >= 1 && ss.items >= 1, "store stats: %d puts",
        (int)ss.puts);
  kvc_offloader_free(other);
  kvc_store_free(disk);
  kvc_store_free(lower);
  kvc_paged_free(c);
}

int main(void) {
  kvc_store* disk = NULL;
  CHECK(kvc_disk_store_create("capi_offload_test_store", 64 << 20, 0, &disk) == KVC_OK, "disk store: %s",
        kvc_last_error());
  round_trips(KVC_FORMAT_F16, KVC_ROPE_STORED, disk);
  round_trips(KVC_FORMAT_F16, KVC_ROPE_ON_READ, NULL);
  round_trips(KVC_FORMAT_FP8, KVC_ROPE_STORED, NULL);
  round_trips(KVC_FORMAT_FP8, KVC_ROPE_ON_READ, disk);
  kvc_store_free(disk);
  misses_and_refusals();
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("capi_offload: all checks passed\n");
  return failures ? 1 : 0;
}
