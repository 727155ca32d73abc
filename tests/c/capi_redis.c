/* C99 checks of the C API's Redis store (kvc_redis_*) against a redis-server the test starts itself
 * (a free loopback port, requirepass, no persistence; a test that cannot start it fails):
 *   - bad configs are refused naming the field, no handle made;
 *   - an offloader whose arena holds about one value, over the Redis store and over a tiered store
 *     (host, then Redis): values demoted to the server load back bit for bit (f16 and FP8);
 *   - a wrong or missing password: kvc_redis_store_ping is KVC_E_UNAVAILABLE naming the AUTH / NOAUTH
 *     reply; as a lower store it fails its puts and misses, the offloader goes on;
 *   - the server killed: a value only it held is a miss (nothing changed), demotions fail, ping says
 *     the server cannot be reached.
 * Where libkvcore.so was built without hiredis: every kvc_redis_store_* call is KVC_E_NOT_SUPPORTED
 * saying so. Exit status 0 = pass. */
#define _POSIX_C_SOURCE 200809L
#include <kvcore/kvcore.h>

#include "check.h"
#include "offload_fixture.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char* const PASSWORD = "kvcore-c-test-pw";

/* ---- the server ---------------------------------------------------------------------------- */
typedef struct {
  pid_t pid;
  int port;
  char dir[64];
} server;

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

static int free_port(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int port = -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr*)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr*)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static kvc_store* redis_store(int port, const char* password, const char* prefix) {
  kvc_redis_config cfg;
  kvc_store* s = NULL;
  kvc_redis_config_init(&cfg);
  cfg.port = port;
  cfg.password = password;
  cfg.key_prefix = prefix;
  cfg.backoff_initial_ms = 1; /* retry at once: the test changes the server under the store */
  cfg.backoff_max_ms = 1;
  CHECK(kvc_redis_store_create(&cfg, &s) == KVC_OK && s, "redis store: %s", kvc_last_error());
  return s;
}

/* Starts redis-server on a free port (three tries: another process may take the port first) and
 * waits until it answers an AUTHed PING. */
static int start_server(server* s) {
  int attempt;
  strcpy(s->dir, "/tmp/kvcore_capi_redis_XXXXXX");
  if (!mkdtemp(s->dir)) return 0;
  for (attempt = 0; attempt < 3; ++attempt) {
    char port[16];
    kvc_store* probe;
    int waited, up = 0;
    s->port = free_port();
    if (s->port <= 0) continue;
    snprintf(port, sizeof port, "%d", s->port);
    s->pid = fork();
    if (s->pid == 0) {
      const int null = open("/dev/null", O_WRONLY);
      if (null >= 0) {
        dup2(null, 1);
        dup2(null, 2);
      }
      execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--requirepass", PASSWORD, "--dir",
             s->dir, "--save", "", "--appendonly", "no", "--daemonize", "no", (char*)NULL);
      _exit(127);
    }
    if (s->pid < 0) return 0;
    probe = redis_store(s->port, PASSWORD, "kvc:probe:");
    for (waited = 0; probe && waited < 10000 && waitpid(s->pid, NULL, WNOHANG) == 0; waited += 20) {
      if (kvc_redis_store_ping(probe) == KVC_OK) {
        up = 1;
        break;
      }
      sleep_ms(20);
    }
    kvc_store_free(probe);
    if (up) return 1;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
  }
  return 0;
}

static void stop_server(server* s) {
  if (s->pid <= 0) return;
  kill(s->pid, SIGKILL);
  waitpid(s->pid, NULL, 0);
  s->pid = 0;
  rmdir(s->dir);
}

/* ---- caches and values ---------------------------------------------------------------------- */
static void store_stats(kvc_store* s, kvc_store_stats* st) {
  memset(st, 0, sizeof *st);
  st->struct_size = sizeof *st;
  CHECK(kvc_store_stats_get(s, st) == KVC_OK, "store stats: %s", kvc_last_error());
}

/* An offloader over `lower` whose arena holds about one value of `format`. */
static kvc_offloader* small_offloader(kvc_paged_cache* c, int32_t format, kvc_store* lower) {
  kvc_offload_config cfg;
  kvc_offloader* off = NULL;
  kvc_offload_config_init(&cfg);
  cfg.pinned_bytes = 6 * block_bytes(format);
  cfg.lower = lower;
  cfg.model_id = "model-x";
  CHECK(kvc_offloader_create(c, &cfg, &off) == KVC_OK && off, "offloader: %s", kvc_last_error());
  return off;
}

static seq_read want[NSEQ], got_read;

/* Three sequences offloaded, erased and loaded back through `lower` (Redis, or tiered over it). */
static void round_trip(int32_t format, kvc_store* lower, kvc_store* redis) {
  kvc_paged_cache* c = make_cache(format, KVC_ROPE_STORED, NBLOCKS);
  kvc_offloader* off;
  kvc_offload_stats st;
  kvc_store_stats rs;
  int64_t seqs[NSEQ], got = -1;
  int32_t ok = 0, hit = 0, in_redis = 0, in;
  int i;
  if (!c) return;
  for (i = 0; i < NSEQ; ++i) {
    kvc_paged_seq_create(c, &seqs[i]);
    append(c, seqs[i], 0, 20 + 7 * i, 11u * (unsigned)(i + 1) + (unsigned)format);
    read_seq(c, seqs[i], &want[i]);
  }
  off = small_offloader(c, format, lower);
  if (!off) return;
  for (i = 0; i < NSEQ; ++i) {
    kvc_store_key k = key_of(c, i);
    CHECK(kvc_offloader_offload(off, seqs[i], &k, &ok) == KVC_OK && ok == 1, "offload %d: %s", i, kvc_last_error());
  }
  CHECK(kvc_offloader_flush(off) == KVC_OK && kvc_store_flush(lower) == KVC_OK, "flush: %s", kvc_last_error());
  for (i = 0; i < NSEQ; ++i) {
    kvc_store_key k = key_of(c, i);
    in = 0;
    CHECK(kvc_store_contains(redis, &k, &in) == KVC_OK, "contains: %s", kvc_last_error());
    in_redis += in;
    kvc_paged_seq_erase(c, seqs[i]);
  }
  CHECK(in_redis >= 2, "format %d: %d values reached the server", format, (int)in_redis);
  for (i = 0; i < NSEQ; ++i) {
    kvc_store_key k = key_of(c, i);
    CHECK(kvc_offloader_load(off, &k, NULL, &got, &hit) == KVC_OK && hit == 1, "load %d: %s", i, kvc_last_error());
    if (!hit) continue;
    read_seq(c, got, &got_read);
    CHECK(memcmp(&got_read, &want[i], sizeof got_read) == 0, "format %d: value %d differs after Redis", format, i);
    kvc_paged_seq_erase(c, got);
  }
  offload_stats(off, &st);
  CHECK(st.demoted >= 2 && st.lower_hits >= 2 && st.misses == 0, "offload stats: %d demoted, %d lower hits, %d misses",
        (int)st.demoted, (int)st.lower_hits, (int)st.misses);
  store_stats(redis, &rs);
  CHECK(rs.puts >= 2 && rs.hits >= 2 && rs.down == 0, "redis stats: %d puts, %d hits, down %d", (int)rs.puts,
        (int)rs.hits, (int)rs.down);
  kvc_offloader_free(off);
  kvc_paged_free(c);
}

/* A lower store that refuses every put and misses every get: the offloader goes on. */
static void refusing_lower(kvc_store* bad, const char* what) {
  kvc_paged_cache* c = make_cache(KVC_FORMAT_F16, KVC_ROPE_STORED, NBLOCKS);
  kvc_offloader* off;
  kvc_offload_stats st;
  kvc_store_stats before, bs;
  int64_t seqs[NSEQ], got = -1;
  int32_t ok = 0, hit = -1;
  int i;
  if (!c) return;
  store_stats(bad, &before);
  off = small_offloader(c, KVC_FORMAT_F16, bad);
  if (!off) return;
  for (i = 0; i < NSEQ; ++i) {
    kvc_store_key k = key_of(c, i);
    kvc_paged_seq_create(c, &seqs[i]);
    append(c, seqs[i], 0, 30, 7u + (unsigned)i);
    CHECK(kvc_offloader_offload(off, seqs[i], &k, &ok) == KVC_OK && ok == 1, "%s: offload %d: %s", what, i,
          kvc_last_error());
  }
  CHECK(kvc_offloader_flush(off) == KVC_OK, "%s: flush: %s", what, kvc_last_error());
  offload_stats(off, &st);
  CHECK(st.demoted == 0 && st.demote_failures >= 2, "%s: %d demoted, %d failed", what, (int)st.demoted,
        (int)st.demote_failures);
  {
    kvc_store_key k = key_of(c, 0); /* demoted first: only the refusing store could have it */
    CHECK(kvc_offloader_load(off, &k, NULL, &got, &hit) == KVC_OK && hit == 0 && got == -1, "%s: hit %d (%s)", what,
          (int)hit, kvc_last_error());
  }
  store_stats(bad, &bs);
  CHECK(bs.puts == before.puts && bs.put_failures >= before.put_failures + 2, "%s: %d puts, %d failures", what,
        (int)(bs.puts - before.puts), (int)(bs.put_failures - before.put_failures));
  kvc_offloader_free(off);
  kvc_paged_free(c);
}

static void bad_configs(void) {
  kvc_redis_config cfg;
  kvc_store *s = NULL, *host = NULL;
  struct {
    const char* field;
    int which;
  } cases[] = {{"port", 0}, {"port", 1}, {"timeouts", 2}, {"timeouts", 3}, {"max_value_bytes", 4},
               {"backoff", 5}, {"backoff", 6}, {"ttl_seconds", 7}, {"host", 8}};
  size_t i;
  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    kvc_redis_config_init(&cfg);
    switch (cases[i].which) {
      case 0: cfg.port = 0; break;
      case 1: cfg.port = 70000; break;
      case 2: cfg.connect_timeout_ms = 0; break;
      case 3: cfg.io_timeout_ms = -5; break;
      case 4: cfg.max_value_bytes = 0; break;
      case 5: cfg.backoff_initial_ms = 0; break;
      case 6: cfg.backoff_max_ms = cfg.backoff_initial_ms - 1; break;
      case 7: cfg.ttl_seconds = -1; break;
      default: cfg.host = ""; break;
    }
    CHECK(kvc_redis_store_create(&cfg, &s) == KVC_E_INVALID_ARGUMENT && s == NULL, "case %d accepted", cases[i].which);
    CHECK(strstr(kvc_last_error(), cases[i].field) != NULL, "case %d: message '%s' does not name %s", cases[i].which,
          kvc_last_error(), cases[i].field);
  }
  kvc_redis_config_init(&cfg);
  CHECK(kvc_redis_store_create(NULL, &s) == KVC_E_INVALID_ARGUMENT && s == NULL, "a NULL cfg accepted");
  CHECK(kvc_redis_store_create(&cfg, NULL) == KVC_E_INVALID_ARGUMENT, "a NULL out accepted");
  cfg.struct_size = 0;
  CHECK(kvc_redis_store_create(&cfg, &s) == KVC_E_INVALID_ARGUMENT && s == NULL, "struct_size 0 accepted");
  CHECK(strstr(kvc_last_error(), "struct_size") != NULL, "message: %s", kvc_last_error());
  CHECK(kvc_redis_store_ping(NULL) == KVC_E_INVALID_ARGUMENT, "ping of NULL accepted");
  CHECK(kvc_host_store_create(1 << 20, &host) == KVC_OK, "host store: %s", kvc_last_error());
  CHECK(kvc_redis_store_ping(host) == KVC_E_INVALID_ARGUMENT, "ping of a host store accepted");
  CHECK(strstr(kvc_last_error(), "not a Redis store") != NULL, "message: %s", kvc_last_error());
  kvc_store_free(host);
}

static int without_redis(void) {
  kvc_redis_config cfg;
  kvc_store* s = NULL;
  kvc_redis_config_init(&cfg);
  CHECK(kvc_redis_store_create(&cfg, &s) == KVC_E_NOT_SUPPORTED && s == NULL, "create without Redis: %s",
        kvc_last_error());
  CHECK(strstr(kvc_last_error(), "built without Redis") != NULL, "message: %s", kvc_last_error());
  CHECK(kvc_redis_store_ping(NULL) == KVC_E_NOT_SUPPORTED, "ping without Redis");
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("capi_redis: libkvcore.so built without Redis; the calls say so\n");
  return failures ? 1 : 0;
}

int main(void) {
  server srv;
  kvc_store *redis, *wrong, *none, *host = NULL, *tiered = NULL, *tiers[2];
  kvc_store_stats rs;
  if (!kvc_redis_compiled()) return without_redis();
  bad_configs();
  memset(&srv, 0, sizeof srv);
  if (!start_server(&srv)) {
    fprintf(stderr, "FAIL: could not start redis-server (Debian: redis-server; scripts/deps.sh installs it)\n");
    return 1;
  }
  redis = redis_store(srv.port, PASSWORD, "kvc:ctest:");
  if (!redis) {
    stop_server(&srv);
    return 1;
  }
  round_trip(KVC_FORMAT_F16, redis, redis);
  round_trip(KVC_FORMAT_FP8, redis, redis);
  /* a tiered store whose host tier holds about one value sends the rest on to Redis */
  CHECK(kvc_host_store_create(6 * block_bytes(KVC_FORMAT_F16), &host) == KVC_OK, "host: %s", kvc_last_error());
  tiers[0] = host;
  tiers[1] = redis;
  CHECK(kvc_tiered_store_create(tiers, 2, 1 << 20, &tiered) == KVC_OK, "tiered: %s", kvc_last_error());
  if (tiered) round_trip(KVC_FORMAT_F16, tiered, redis);
  kvc_store_free(tiered);
  kvc_store_free(host);

  /* a wrong password and none: a clear refusal from ping; as a lower store, failed puts and misses */
  wrong = redis_store(srv.port, "wrong-password", "kvc:ctest:");
  none = redis_store(srv.port, NULL, "kvc:ctest:");
  if (wrong && none) {
    CHECK(kvc_redis_store_ping(wrong) == KVC_E_UNAVAILABLE, "a wrong password: ping passed");
    CHECK(strstr(kvc_last_error(), "AUTH") != NULL, "wrong password: message '%s'", kvc_last_error());
    CHECK(kvc_redis_store_ping(none) == KVC_E_UNAVAILABLE, "no password: ping passed");
    CHECK(strstr(kvc_last_error(), "NOAUTH") != NULL, "no password: message '%s'", kvc_last_error());
    refusing_lower(wrong, "wrong password");
    store_stats(wrong, &rs);
    CHECK(rs.down == 1, "a wrong password: store not down");
  }
  kvc_store_free(wrong);
  kvc_store_free(none);

  /* the server killed: misses, failed demotions, and ping says the server cannot be reached */
  CHECK(kvc_redis_store_ping(redis) == KVC_OK, "ping before the kill: %s", kvc_last_error());
  stop_server(&srv);
  {
    kvc_paged_cache* c = make_cache(KVC_FORMAT_F16, KVC_ROPE_STORED, NBLOCKS);
    kvc_offloader* off = c ? small_offloader(c, KVC_FORMAT_F16, redis) : NULL;
    kvc_store_key k = c ? key_of(c, 0) : (kvc_store_key){0, 0, 0};
    int64_t got = -1;
    int32_t hit = -1;
    if (off) {
      CHECK(kvc_offloader_load(off, &k, NULL, &got, &hit) == KVC_OK && hit == 0 && got == -1,
            "a killed server: hit %d (%s)", (int)hit, kvc_last_error());
      kvc_offloader_free(off);
    }
    kvc_paged_free(c);
  }
  refusing_lower(redis, "killed server");
  CHECK(kvc_redis_store_ping(redis) == KVC_E_UNAVAILABLE, "ping of a killed server passed");
  CHECK(strstr(kvc_last_error(), "127.0.0.1") != NULL, "killed server: message '%s'", kvc_last_error());
  store_stats(redis, &rs);
  CHECK(rs.down == 1, "a killed server: store not down");
  kvc_store_free(redis);
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("capi_redis: all checks passed\n");
  return failures ? 1 : 0;
}
