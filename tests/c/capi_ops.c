/* C99 checks of the C API's op entry points: the FP8 codecs (pack + unpack equals the round
 * trip), shift_dense on a dense f32 cache against a float64 rotation, a DeepSeek-V4 cache's
 * life cycle and refused shift, and the error contract for bad tensors. Exit status 0 = pass. */
#include <kvcore/kvcore.h>

#include "check.h"
#include <math.h>
#include <stdio.h>
#include <string.h>


static float unit(unsigned i) { return (float)sin(0.7 * i + 0.3) * (float)(1 + i % 5); }

static void codecs(void) {
  enum { ROWS = 4, COLS = 192, NROT = 64, NOPE = COLS - NROT };
  static float src[ROWS][COLS], round[ROWS][COLS], back[ROWS][COLS];
  static uint8_t codes[ROWS][NOPE], scales[ROWS][NOPE / 64];
  static uint16_t tail[ROWS][NROT];
  int64_t s_src[2] = {ROWS, COLS}, s_codes[2] = {ROWS, NOPE}, s_scales[2] = {ROWS, NOPE / 64}, s_tail[2] = {ROWS, NROT};
  DLTensor t_src = host_tensor(src, kDLFloat, 32, 2, s_src), t_round = host_tensor(round, kDLFloat, 32, 2, s_src);
  DLTensor t_back = host_tensor(back, kDLFloat, 32, 2, s_src), t_codes = host_tensor(codes, kDLUInt, 8, 2, s_codes);
  DLTensor t_scales = host_tensor(scales, kDLUInt, 8, 2, s_scales), t_tail = host_tensor(tail, kDLFloat, 16, 2, s_tail);
  DLTensor t_bad = host_tensor(codes, kDLInt, 16, 2, s_codes);
  int r, c, same = 1, moved = 0;
  for (r = 0; r < ROWS; ++r)
    for (c = 0; c < COLS; ++c) src[r][c] = unit((unsigned)(r * COLS + c));
  CHECK(kvc_fp8_round_trip_rows(&t_src, &t_round, NROT, NULL) == KVC_OK, "round trip: %s", kvc_last_error());
  CHECK(kvc_fp8_pack_rows(&t_src, &t_codes, &t_scales, &t_tail, NULL) == KVC_OK, "pack: %s", kvc_last_error());
  CHECK(kvc_fp8_unpack_rows(&t_codes, &t_scales, &t_tail, &t_back, NULL) == KVC_OK, "unpack: %s", kvc_last_error());
  for (r = 0; r < ROWS; ++r)
    for (c = 0; c < NOPE; ++c) {
      same &= memcmp(&round[r][c], &back[r][c], 4) == 0;
      moved |= round[r][c] != src[r][c];
    }
  CHECK(same, "unpack(pack(x)) differs from the round trip on the FP8 dims");
  CHECK(moved, "the round trip changed nothing: FP8 rounding did not happen");
  for (r = 0; r < ROWS; ++r)
    for (c = NOPE; c < COLS; ++c) CHECK(fabsf(back[r][c] - src[r][c]) <= 1e-3f * fabsf(src[r][c]) + 1e-6f, "tail");
  memcpy(back, round, sizeof back);
  CHECK(kvc_fp8_pack_rows(&t_src, &t_bad, &t_scales, &t_tail, NULL) == KVC_E_NOT_SUPPORTED,
        "an int16 codes tensor was accepted (%s)", kvc_last_error());
  CHECK(kvc_fp8_unpack_rows(&t_codes, &t_scales, &t_tail, NULL, NULL) == KVC_E_INVALID_ARGUMENT, "NULL dst accepted");
  CHECK(strstr(kvc_last_error(), "dst") != NULL, "message '%s' does not name dst", kvc_last_error());
}

static void shift(void) {
  enum { CAP = 12, HEADS = 2, DIM = 32, LEN = 10, KEEP = 2, DISCARD = 3 };
  static float k[CAP][HEADS][DIM], v[CAP][HEADS][DIM], k0[CAP][HEADS][DIM], v0[CAP][HEADS][DIM];
  int64_t shape[3] = {CAP, HEADS, DIM};
  DLTensor tk = host_tensor(k, kDLFloat, 32, 3, shape), tv = host_tensor(v, kDLFloat, 32, 3, shape);
  kvc_rope_spec rope;
  kvc_shift_layer layer;
  int j, h, i;
  double worst = 0;
  for (j = 0; j < CAP; ++j)
    for (h = 0; h < HEADS; ++h)
      for (i = 0; i < DIM; ++i) {
        k[j][h][i] = unit((unsigned)((j * HEADS + h) * DIM + i));
        v[j][h][i] = unit((unsigned)((j * HEADS + h) * DIM + i + 7));
      }
  memcpy(k0, k, sizeof k);
  memcpy(v0, v, sizeof v);
  kvc_rope_spec_init(&rope, DIM, 10000.0);
  kvc_shift_layer_init(&layer);
  layer.k = &tk;
  layer.v = &tv;
  layer.rope = &rope;
  CHECK(kvc_shift_dense(&layer, 1, LEN, KEEP, LEN, NULL) == KVC_E_INVALID_ARGUMENT, "n_keep + n_discard > length");
  CHECK(memcmp(k, k0, sizeof k) == 0 && memcmp(v, v0, sizeof v) == 0, "a refused shift changed the cache");
  CHECK(kvc_shift_dense(&layer, 1, LEN, KEEP, DISCARD, NULL) == KVC_OK, "shift_dense: %s", kvc_last_error());
  for (j = 0; j < LEN - DISCARD; ++j) {
    const int from = j < KEEP ? j : j + DISCARD;
    const double delta = j < KEEP ? 0.0 : -(double)DISCARD;
    for (h = 0; h < HEADS; ++h) {
      CHECK(memcmp(v[j][h], v0[from][h], sizeof v[j][h]) == 0, "V row %d moved wrong", j);
      for (i = 0; i < DIM / 2; ++i) { /* NeoX pair (i, i + DIM/2) rotated by delta * freq */
        const double w = pow(10000.0, -2.0 * i / DIM), c = cos(delta * w), s = sin(delta * w);
        const double a = k0[from][h][i], b = k0[from][h][i + DIM / 2];
        const double ea = fabs(a * c - b * s - k[j][h][i]), eb = fabs(a * s + b * c - k[j][h][i + DIM / 2]);
        if (ea > worst) worst = ea;
        if (eb > worst) worst = eb;
      }
    }
  }
  CHECK(worst < 1e-5, "shifted keys differ from the float64 rotation by %g", worst);
}

static void dsv4(void) {
  kvc_dsv4_config cfg;
  kvc_dsv4_cache* cache = NULL;
  kvc_device cpu = {KVC_DEVICE_CPU, 0};
  int32_t len = -1;
  int64_t seq = -1;
  int32_t kinds[2] = {KVC_DSV4_WINDOW, KVC_DSV4_WINDOW};
  static float kv[512], window[128 * 512];
  int64_t shape[2] = {1, 512};
  DLTensor t = host_tensor(kv, kDLFloat, 32, 2, shape);
  size_t n = 0;
  int i;
  kvc_dsv4_config_v4_flash(&cfg, 1024, 1);
  CHECK(cfg.n_layers == 43, "v4_flash has %d layers", cfg.n_layers);
  cfg.layer_kinds = kinds; /* two window layers: no weights needed */
  cfg.n_layers = 2;
  CHECK(kvc_dsv4_create(&cfg, cpu, &cache) == KVC_OK, "dsv4 create: %s", kvc_last_error());
  if (!cache) return;
  CHECK(kvc_dsv4_seq_create(cache, &seq) == KVC_OK, "seq create: %s", kvc_last_error());
  for (i = 0; i < 512; ++i) kv[i] = unit((unsigned)i) * 0.1f;
  CHECK(kvc_dsv4_append(cache, seq, 0, 0, &t, NULL, NULL, NULL, NULL) == KVC_OK, "append: %s", kvc_last_error());
  CHECK(kvc_dsv4_append(cache, seq, 1, 0, &t, NULL, NULL, NULL, NULL) == KVC_OK, "append: %s", kvc_last_error());
  CHECK(kvc_dsv4_length(cache, seq, 1, &len) == KVC_OK && len == 1, "length %d", (int)len);
  CHECK(kvc_dsv4_read(cache, seq, 1, 0, window, sizeof window / sizeof window[0], &n) == KVC_OK && n == 512,
        "read %lu floats", (unsigned long)n);
  CHECK(kvc_dsv4_shift(cache, seq, 1, 0) == KVC_OK, "a shift that discards nothing failed (%s)", kvc_last_error());
  CHECK(kvc_dsv4_shift(cache, seq, 0, 2) == KVC_E_INVALID_ARGUMENT, "a shift past the length was not refused");
  CHECK(kvc_dsv4_append(cache, seq, 1, 5, &t, NULL, NULL, NULL, NULL) == KVC_E_INVALID_ARGUMENT,
        "a gap in positions was accepted");
  CHECK(kvc_dsv4_length(cache, seq, 1, &len) == KVC_OK && len == 1, "a refused append changed the length");
  CHECK(kvc_dsv4_seq_truncate(cache, seq, 0) == KVC_OK && kvc_dsv4_length(cache, seq, 1, &len) == KVC_OK && len == 0,
        "truncate to 0 left %d tokens", (int)len);
  CHECK(kvc_dsv4_seq_erase(cache, seq) == KVC_OK, "erase: %s", kvc_last_error());
  kvc_dsv4_free(cache);
}

/* kvc_paged_store_layers writes what kvc_paged_store writes layer by layer (FP8 K rotated at its
 * positions, f16 V): both caches read back the same floats; a k of the wrong layer count is refused. */
static void store_layers(void) {
  enum { L = 3, H = 2, D = 64, N = 3 };
  static float k[L][N][H][D], v[L][N][H][D], rk[2][N * H * D], rv[2][N * H * D];
  int64_t shape4[4] = {L, N, H, D}, short4[4] = {L - 1, N, H, D}, shape3[3] = {N, H, D};
  const int32_t counts[2] = {1, 2}, positions[N] = {5, 7, 9};
  int32_t rpos[N], n_live = 0;
  kvc_device cpu = {KVC_DEVICE_CPU, 0};
  kvc_rope_spec rope;
  kvc_paged_config cfg;
  kvc_paged_cache* cache[2] = {NULL, NULL};
  kvc_ticket* ticket[2] = {NULL, NULL};
  int64_t seqs[2][2];
  unsigned i;
  int c, l, s;
  DLTensor tk, tv;
  for (i = 0; i < (unsigned)(L * N * H * D); ++i) {
    (&k[0][0][0][0])[i] = unit(i);
    (&v[0][0][0][0])[i] = unit(i + 7);
  }
  kvc_rope_spec_init(&rope, D, 10000.0);
  kvc_paged_config_init(&cfg);
  cfg.n_layers = L;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.v_head_dim = D;
  cfg.block_size = 8;
  cfg.num_blocks = 8;
  cfg.k_format = KVC_FORMAT_FP8;
  cfg.v_format = KVC_FORMAT_F16;
  cfg.kvcore_attention = 0; /* mixed K / V formats: pages an engine reads itself */
  cfg.rope_mode = KVC_ROPE_STORED;
  cfg.rope = &rope;
  cfg.n_rope = 1;
  for (c = 0; c < 2; ++c) {
    CHECK(kvc_paged_create(&cfg, cpu, &cache[c]) == KVC_OK, "create: %s", kvc_last_error());
    CHECK(kvc_ticket_create(&ticket[c]) == KVC_OK, "ticket: %s", kvc_last_error());
    for (s = 0; s < 2; ++s) CHECK(kvc_paged_seq_create(cache[c], &seqs[c][s]) == KVC_OK, "seq: %s", kvc_last_error());
    CHECK(kvc_paged_reserve(cache[c], seqs[c], counts, 2, positions, ticket[c]) == KVC_OK, "reserve: %s", kvc_last_error());
  }
  for (l = 0; l < L; ++l) {
    tk = host_tensor(&k[l][0][0][0], kDLFloat, 32, 3, shape3);
    tv = host_tensor(&v[l][0][0][0], kDLFloat, 32, 3, shape3);
    CHECK(kvc_paged_store(cache[0], ticket[0], l, &tk, &tv) == KVC_OK, "store: %s", kvc_last_error());
  }
  tk = host_tensor(&k[0][0][0][0], kDLFloat, 32, 4, short4);
  tv = host_tensor(&v[0][0][0][0], kDLFloat, 32, 4, shape4);
  CHECK(kvc_paged_store_layers(cache[1], ticket[1], &tk, &tv) == KVC_E_INVALID_ARGUMENT, "a short k accepted");
  CHECK(strstr(kvc_last_error(), "k") != NULL, "message '%s' does not name k", kvc_last_error());
  tk = host_tensor(&k[0][0][0][0], kDLFloat, 32, 4, shape4);
  CHECK(kvc_paged_store_layers(cache[1], ticket[1], &tk, &tv) == KVC_OK, "store_layers: %s", kvc_last_error());
  for (l = 0; l < L; ++l)
    for (s = 0; s < 2; ++s) {
      for (c = 0; c < 2; ++c)
        CHECK(kvc_paged_read(cache[c], seqs[c][s], l, rpos, rk[c], rv[c], N, &n_live) == KVC_OK, "read: %s",
              kvc_last_error());
      CHECK(memcmp(rk[0], rk[1], sizeof(float) * (size_t)(n_live * H * D)) == 0, "layer %d seq %d: K differs", l, s);
      CHECK(memcmp(rv[0], rv[1], sizeof(float) * (size_t)(n_live * H * D)) == 0, "layer %d seq %d: V differs", l, s);
    }
  for (c = 0; c < 2; ++c) {
    kvc_ticket_free(ticket[c]);
    kvc_paged_free(cache[c]);
  }
}

/* MLA's shared layout through the C API: cfg.v_from_k_latent = 1 lists no V pool, stores take K only
 * (a V given is refused, naming the field), and read() returns V as the first v_head_dim dims of K. */
static void mla_shared_v(void) {
  enum { D = 576, DV = 512, N = 2 };
  static float k[N][D], rk[N * D], rv[N * DV];
  int64_t shape3[3] = {N, 1, D}, vshape3[3] = {N, 1, DV};
  const int32_t positions[N] = {3, 4}, one = N;
  int32_t rpos[N], n_live = 0;
  kvc_device cpu = {KVC_DEVICE_CPU, 0};
  kvc_rope_spec rope;
  kvc_paged_config cfg;
  kvc_pool_spec specs[4];
  size_t n = 0;
  kvc_paged_cache* cache = NULL;
  kvc_ticket* ticket = NULL;
  int64_t seq = 0;
  unsigned i;
  DLTensor tk, tv;
  for (i = 0; i < (unsigned)(N * D); ++i) (&k[0][0])[i] = unit(i);
  kvc_rope_spec_init(&rope, 64, 10000.0);
  rope.slice = KVC_ROPE_SLICE_TAIL;
  rope.pairing = KVC_ROPE_PAIRING_INTERLEAVED;
  kvc_paged_config_init(&cfg);
  CHECK(cfg.v_from_k_latent == 0, "v_from_k_latent defaults to %d", (int)cfg.v_from_k_latent);
  cfg.n_layers = 1;
  cfg.head_dim = D;
  cfg.v_head_dim = DV;
  cfg.block_size = 4;
  cfg.num_blocks = 4;
  cfg.k_format = cfg.v_format = KVC_FORMAT_F32;
  cfg.rope = &rope;
  cfg.n_rope = 1;
  cfg.v_from_k_latent = 1;
  for (i = 0; i < 4; ++i) kvc_pool_spec_init(&specs[i]);
  CHECK(kvc_paged_pool_specs(&cfg, specs, 4, &n) == KVC_OK && n == 1, "shared V: %d pool arrays (%s)", (int)n,
        kvc_last_error());
  CHECK(kvc_paged_create(&cfg, cpu, &cache) == KVC_OK, "create: %s", kvc_last_error());
  CHECK(kvc_ticket_create(&ticket) == KVC_OK, "ticket: %s", kvc_last_error());
  CHECK(kvc_paged_seq_create(cache, &seq) == KVC_OK, "seq: %s", kvc_last_error());
  CHECK(kvc_paged_reserve(cache, &seq, &one, 1, positions, ticket) == KVC_OK, "reserve: %s", kvc_last_error());
  tk = host_tensor(&k[0][0], kDLFloat, 32, 3, shape3);
  tv = host_tensor(&k[0][0], kDLFloat, 32, 3, vshape3);
  CHECK(kvc_paged_store(cache, ticket, 0, &tk, &tv) == KVC_E_INVALID_ARGUMENT, "a V given to a shared-V cache accepted");
  CHECK(strstr(kvc_last_error(), "v_from_k_latent") != NULL, "message '%s' does not name v_from_k_latent",
        kvc_last_error());
  CHECK(kvc_paged_store(cache, ticket, 0, &tk, NULL) == KVC_OK, "store K only: %s", kvc_last_error());
  CHECK(kvc_paged_read(cache, seq, 0, rpos, rk, rv, N, &n_live) == KVC_OK && n_live == N, "read: %s", kvc_last_error());
  for (i = 0; i < (unsigned)N; ++i)
    CHECK(memcmp(&rv[i * DV], &rk[i * D], sizeof(float) * DV) == 0, "token %u: V is not K's first 512 dims", i);
  kvc_ticket_free(ticket);
  kvc_paged_free(cache);
}

int main(void) {
  codecs();
  shift();
  dsv4();
  store_layers();
  mla_shared_v();
  printf("capi_ops: %d failures\n", failures);
  return failures ? 1 : 0;
}
