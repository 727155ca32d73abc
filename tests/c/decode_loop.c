/* A C99 engine loop over the C API: two sequences (the second forked from the first) decode
 * past the cache's capacity with context shifts, a speculative draft is forked, extended and
 * rolled back, and every attention output is compared with a float64 recomputation from the
 * keys and values this program wrote. Also checks the error contract (status, message, nothing
 * changed) and stale plans. Exit status 0 = pass. */
#include <kvcore/kvcore.h>

#include "check.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 2
#define KV_HEADS 2
#define Q_HEADS 4
#define DIM 64
#define BLOCK 16
#define CAPACITY 40 /* tokens a sequence may hold before the loop shifts */
#define N_KEEP 4
#define N_DISCARD 12
#define STEPS 90
#define FORK_AT 20
#define MAX_TOKENS 64

#define OK(call)                                                                      \
  do {                                                                                \
    kvc_status st_ = (call);                                                          \
    if (st_ != KVC_OK) {                                                              \
      fprintf(stderr, "FAIL %s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call, (int)st_, \
              kvc_last_error());                                                      \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

/* What the program wrote for one sequence: unrotated K and V per live token and layer. */
typedef struct {
  int64_t id;
  int n;
  float k[LAYERS][MAX_TOKENS][KV_HEADS * DIM];
  float v[LAYERS][MAX_TOKENS][KV_HEADS * DIM];
} ref_seq;

static uint64_t rng_state = 88172645463325252ull;
static float rnd(void) { /* xorshift64 -> [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static double freq[DIM / 2];

/* NeoX RoPE in float64: pairs (i, i + DIM/2) rotated by pos * freq[i]. */
static void rotate(double* x, int heads, double pos) {
  int h, i;
  for (h = 0; h < heads; ++h)
    for (i = 0; i < DIM / 2; ++i) {
      double* a = x + h * DIM + i;
      double* b = x + h * DIM + i + DIM / 2;
      double c = cos(pos * freq[i]), s = sin(pos * freq[i]);
      double a0 = *a, b0 = *b;
      *a = a0 * c - b0 * s;
      *b = a0 * s + b0 * c;
    }
}

/* float64 attention of q (unrotated, at position n - 1) over the sequence's live tokens, whose
 * positions are 0..n-1 after every shift (llama.cpp semantics). */
static double max_error(const ref_seq* r, int layer, const float* q, const float* out) {
  static double qd[Q_HEADS * DIM], kr[MAX_TOKENS][KV_HEADS * DIM], sc[MAX_TOKENS];
  const double scale = 1.0 / sqrt((double)DIM);
  double worst = 0;
  int j, h, e;
  for (e = 0; e < Q_HEADS * DIM; ++e) qd[e] = q[e];
  rotate(qd, Q_HEADS, r->n - 1);
  for (j = 0; j < r->n; ++j) {
    for (e = 0; e < KV_HEADS * DIM; ++e) kr[j][e] = r->k[layer][j][e];
    rotate(kr[j], KV_HEADS, j);
  }
  for (h = 0; h < Q_HEADS; ++h) {
    const int kh = h / (Q_HEADS / KV_HEADS);
    double mx = -1e300, sum = 0;
    for (j = 0; j < r->n; ++j) {
      double d = 0;
      for (e = 0; e < DIM; ++e) d += qd[h * DIM + e] * kr[j][kh * DIM + e];
      sc[j] = d * scale;
      if (sc[j] > mx) mx = sc[j];
    }
    for (j = 0; j < r->n; ++j) sum += (sc[j] = exp(sc[j] - mx));
    for (e = 0; e < DIM; ++e) {
      double o = 0, err;
      for (j = 0; j < r->n; ++j) o += sc[j] * r->v[layer][j][kh * DIM + e];
      err = fabs(o / sum - out[h * DIM + e]);
      if (err > worst) worst = err;
    }
  }
  return worst;
}

static DLTensor f32_tensor(float* data, int ndim, int64_t* shape) {
  return host_tensor(data, kDLFloat, 32, ndim, shape);
}

static void shift_ref(ref_seq* r) {
  int l;
  for (l = 0; l < LAYERS; ++l) {
    memmove(r->k[l][N_KEEP], r->k[l][N_KEEP + N_DISCARD], sizeof(r->k[l][0]) * (size_t)(r->n - N_KEEP - N_DISCARD));
    memmove(r->v[l][N_KEEP], r->v[l][N_KEEP + N_DISCARD], sizeof(r->v[l][0]) * (size_t)(r->n - N_KEEP - N_DISCARD));
  }
  r->n -= N_DISCARD;
}

static ref_seq seqs[2];

int main(void) {
  kvc_rope_spec rope;
  kvc_paged_config cfg;
  kvc_paged_cache* cache = NULL;
  kvc_ticket* ticket = NULL;
  kvc_device cpu = {KVC_DEVICE_CPU, 0};
  static float k[2][KV_HEADS * DIM], v[2][KV_HEADS * DIM], q[2][Q_HEADS * DIM], out[2][Q_HEADS * DIM];
  int64_t kv_shape[3] = {2, KV_HEADS, DIM}, q_shape[3] = {2, Q_HEADS, DIM};
  int n_seqs = 1, step, b, l, i, shifts = 0;
  double worst = 0;

  for (i = 0; i < DIM / 2; ++i) freq[i] = pow(10000.0, -2.0 * i / DIM);
  CHECK(kvc_api_version() == KVC_API_VERSION, "api version %u", kvc_api_version());
  kvc_rope_spec_init(&rope, DIM, 10000.0);
  kvc_paged_config_init(&cfg);
  cfg.n_layers = LAYERS;
  cfg.n_kv_heads = KV_HEADS;
  cfg.head_dim = DIM;
  cfg.v_head_dim = DIM;
  cfg.block_size = BLOCK;
  cfg.num_blocks = 32;
  cfg.k_format = KVC_FORMAT_F32;
  cfg.v_format = KVC_FORMAT_F32;
  cfg.rope_mode = KVC_ROPE_ON_READ;
  cfg.rope = &rope;
  cfg.n_rope = 1;

  /* a config error: nothing created, a message naming the field */
  cfg.block_size = 0;
  CHECK(kvc_paged_create(&cfg, cpu, &cache) == KVC_E_INVALID_ARGUMENT && cache == NULL, "bad block_size accepted");
  CHECK(strstr(kvc_last_error(), "block_size") != NULL, "message '%s' does not name block_size", kvc_last_error());
  cfg.block_size = BLOCK;
  OK(kvc_paged_create(&cfg, cpu, &cache));
  CHECK(kvc_last_error()[0] == '\0', "last error not cleared by a success");
  OK(kvc_ticket_create(&ticket));
  OK(kvc_paged_seq_create(cache, &seqs[0].id));

  for (step = 0; step < STEPS; ++step) {
    int64_t ids[2];
    int32_t counts[2] = {1, 1}, pos[2];
    kvc_attention_plan* plan = NULL;
    if (step == FORK_AT) { /* the second sequence shares the first one's blocks */
      OK(kvc_paged_seq_fork(cache, seqs[0].id, &seqs[1].id));
      i = (int)seqs[1].id;
      memcpy(&seqs[1], &seqs[0], sizeof seqs[0]);
      seqs[1].id = i;
      n_seqs = 2;
    }
    for (b = 0; b < n_seqs; ++b) {
      kvc_seq_info info;
      info.struct_size = sizeof info;
      if (seqs[b].n == CAPACITY) {
        OK(kvc_paged_seq_shift(cache, seqs[b].id, N_KEEP, N_DISCARD));
        shift_ref(&seqs[b]);
        ++shifts;
      }
      OK(kvc_paged_seq_info(cache, seqs[b].id, &info));
      CHECK(info.n_live == seqs[b].n, "seq %d: %d live tokens, expected %d", b, info.n_live, seqs[b].n);
      ids[b] = seqs[b].id;
      pos[b] = info.last_position + 1;
    }
    OK(kvc_paged_reserve(cache, ids, counts, (size_t)n_seqs, pos, ticket));
    OK(kvc_paged_plan(cache, ticket, NULL, &plan));
    kv_shape[0] = n_seqs;
    q_shape[0] = n_seqs;
    for (l = 0; l < LAYERS; ++l) {
      DLTensor tk = f32_tensor(&k[0][0], 3, kv_shape), tv = f32_tensor(&v[0][0], 3, kv_shape);
      DLTensor tq = f32_tensor(&q[0][0], 3, q_shape), to = f32_tensor(&out[0][0], 3, q_shape);
      for (b = 0; b < n_seqs; ++b) {
        for (i = 0; i < KV_HEADS * DIM; ++i) {
          k[b][i] = seqs[b].k[l][seqs[b].n][i] = rnd();
          v[b][i] = seqs[b].v[l][seqs[b].n][i] = rnd();
        }
        for (i = 0; i < Q_HEADS * DIM; ++i) q[b][i] = rnd();
      }
      OK(kvc_paged_store(cache, ticket, l, &tk, &tv));
      OK(kvc_attention_run(plan, l, &tq, &to, NULL));
      for (b = 0; b < n_seqs; ++b) {
        double e;
        seqs[b].n += 1; /* for the reference: this token is live now */
        e = max_error(&seqs[b], l, q[b], out[b]);
        seqs[b].n -= 1;
        if (e > worst) worst = e;
        CHECK(e < 1e-4, "step %d layer %d seq %d: max error %g", step, l, b, e);
      }
    }
    for (b = 0; b < n_seqs; ++b) seqs[b].n += 1;
    kvc_attention_plan_free(plan);

    if (step == FORK_AT + 5) { /* a draft of 3 tokens on sequence 0, rolled back */
      int64_t draft;
      int32_t three = 3, dpos[3];
      kvc_seq_info before, after;
      before.struct_size = after.struct_size = sizeof before;
      OK(kvc_paged_seq_info(cache, seqs[0].id, &before));
      OK(kvc_paged_seq_fork(cache, seqs[0].id, &draft));
      for (i = 0; i < 3; ++i) dpos[i] = before.last_position + 1 + i;
      OK(kvc_paged_reserve(cache, &draft, &three, 1, dpos, ticket));
      OK(kvc_paged_seq_truncate(cache, draft, before.n_live + 1));
      OK(kvc_paged_seq_info(cache, draft, &after));
      CHECK(after.n_live == before.n_live + 1, "draft holds %d tokens after truncate", after.n_live);
      OK(kvc_paged_seq_erase(cache, draft));
      OK(kvc_paged_seq_info(cache, seqs[0].id, &after));
      CHECK(after.n_live == before.n_live, "the draft changed its parent");
    }
  }
  CHECK(shifts >= 4, "only %d shifts", shifts);

  { /* bad input: status, message naming the argument, nothing changed */
    kvc_seq_info a, c;
    int32_t read_pos[MAX_TOKENS], n_live = 0;
    a.struct_size = c.struct_size = sizeof a;
    OK(kvc_paged_seq_info(cache, seqs[0].id, &a));
    CHECK(kvc_paged_seq_shift(cache, seqs[0].id, 2, 1000) == KVC_E_INVALID_ARGUMENT, "oversized shift accepted");
    CHECK(strstr(kvc_last_error(), "n_discard") != NULL || strstr(kvc_last_error(), "n_keep") != NULL,
          "message '%s'", kvc_last_error());
    OK(kvc_paged_seq_info(cache, seqs[0].id, &c));
    CHECK(memcmp(&a, &c, sizeof a) == 0, "a failed shift changed the sequence");
    CHECK(kvc_paged_seq_truncate(cache, 12345, 1) == KVC_E_INVALID_ARGUMENT, "unknown sequence accepted");
    CHECK(kvc_paged_seq_shift(NULL, 0, 0, 0) == KVC_E_INVALID_ARGUMENT, "NULL cache accepted");
    OK(kvc_paged_read(cache, seqs[0].id, 0, read_pos, NULL, NULL, MAX_TOKENS, &n_live));
    CHECK(n_live == seqs[0].n, "read %d tokens, expected %d", n_live, seqs[0].n);
    for (i = 0; i < n_live; ++i) CHECK(read_pos[i] == i, "position %d reads %d", i, read_pos[i]);
  }
  { /* position edits: drop positions [1, 3) of the second sequence, close the gap */
    kvc_seq_info before, after;
    int32_t fits = -1, big = 100000, small = 1;
    before.struct_size = after.struct_size = sizeof before;
    OK(kvc_paged_seq_info(cache, seqs[1].id, &before));
    OK(kvc_paged_remove_positions(cache, seqs[1].id, 1, 3));
    OK(kvc_paged_add_positions(cache, seqs[1].id, 3, KVC_POS_END, -2));
    OK(kvc_paged_seq_info(cache, seqs[1].id, &after));
    CHECK(after.n_live == before.n_live - 2 && after.last_position == before.last_position - 2,
          "position edits: %d live, last %d", after.n_live, after.last_position);
    OK(kvc_paged_can_fit(cache, &seqs[0].id, &small, 1, &fits));
    CHECK(fits == 1, "one token does not fit");
    OK(kvc_paged_can_fit(cache, &seqs[0].id, &big, 1, &fits));
    CHECK(fits == 0, "100000 tokens fit");
  }
  { /* a plan goes stale once the cache changes */
    kvc_attention_plan* plan = NULL;
    int64_t s0 = seqs[0].id;
    int32_t one = 1, p = seqs[0].n;
    DLTensor tq = f32_tensor(&q[0][0], 3, q_shape), to = f32_tensor(&out[0][0], 3, q_shape);
    q_shape[0] = 1;
    OK(kvc_paged_plan_seqs(cache, &s0, 1, NULL, NULL, &plan));
    OK(kvc_attention_run(plan, 0, &tq, &to, NULL));
    OK(kvc_paged_reserve(cache, &s0, &one, 1, &p, ticket));
    CHECK(kvc_attention_run(plan, 0, &tq, &to, NULL) == KVC_E_INVALID_ARGUMENT, "a stale plan ran");
    kvc_attention_plan_free(plan);
  }
  kvc_ticket_free(ticket);
  kvc_paged_free(cache);
  kvc_paged_free(NULL);
  printf("decode_loop: %d steps, %d shifts, max error %.3g, %d failures\n", STEPS, shifts, worst, failures);
  return failures ? 1 : 0;
}
