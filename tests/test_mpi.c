/* fdmpi_run across the ranks of MPI_COMM_WORLD (tests/test_mpi.sh runs np 1, 2,
   3, 4) against the double-precision reference over every key (each rank builds
   the whole cache from the seed): causal, full and mask modes, uneven shards (a
   rank with no key of a row, in the middle of the key order), rows whose
   cur_pos falls in the first shard, shards in reverse rank order, all-empty
   rows, NaN in every cache slot a rank holds no key in (it must not leak), both combine strategies, the result on one root and on all ranks
   (bit-identical everywhere); the gather strategy bit-identical to fd_run per
   shard and fd_merge_states in one process; and each bad input refused on every
   rank with the same code and message, outputs untouched; in trusted mode (no
   validation collectives) a local failure on one rank fails the receivers with
   FDMPI_EREMOTE and writes nothing, no rank hanging. The model features
   across shards: ALiBi (the standard slopes; a shard's keys sit key_offset
   further, so its lse is shifted back to the global positions), learned sink
   logits (gpt-oss: one of them -inf, one 12 that dominates; they must enter
   the merged softmax once, not once per rank) and the logit softcap, against
   the reference with the bias in its mask and the sinks in its denominator.
   Sliding windows and sink tokens counted from the global position (the
   reference masks every key outside the window and the sinks): windows of 1,
   5, 16 and 1000 keys (wider than the sequence), 0 to 9 sink tokens (more
   than the window), a window start inside a shard that ends before cur_pos,
   shard boundaries inside the sinks and the window, ranks with no visible
   key, with ALiBi, sink logits, softcap, f32/f16/bf16 and fp8 KV with per-row
   scales that vary by key (a view of the shard must move them with K and V);
   and a sweep of every cur_pos of a small case under 8 (window, sinks) pairs;
   FD_PAGED with a window refused with FD_EUNSUPPORTED naming shard.shape.layout.
   Every rank prints its own "N passed, N failed"; the script sums them. */
#include "flashdecode_mpi.h"
#include "fdmpi_data.h"
#include "problem.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXR = 4, MAXB = 4, MAXH = 8, SEED = 1234 };
static const float SENTINEL = 7.0f;
static int rank, np;
static fd_ctx *ctx;

/* A case: the shape (kv_len is each rank's capacity cap[r]) and, per row and rank, the keys held. */
typedef struct tcase {
  const char *name;
  fd_shape shape;
  int64_t cap[MAXR];
  int64_t count[MAXB][MAXR];   /* keys of row b on rank r; -1: the rank's capacity */
  int reversed[MAXB];          /* row b's keys in reverse rank order (the last rank holds the first keys) */
  int32_t pos[MAXB];           /* causal: row b's global cur_pos; -1: its last key */
} tcase;

/* The shards of a case on np ranks: offsets, counts, row totals and cur_pos. */
typedef struct layout { int64_t off[MAXR][MAXB], n[MAXR][MAXB], total[MAXB]; int32_t pos[MAXB]; } layout;

/* One rank's shard of a case: its shape, plan, inputs and outputs. */
typedef struct shard_data {
  fd_shape shape;
  fd_plan *plan;
  void *q, *k, *v;
  float *mask, *out, *lse;
  float *k_scale, *v_scale;    /* int8/fp8 KV: per-row scales (else NULL) */
  float *slopes, *logits;      /* [Hq]: ALiBi slopes, learned sink logits (used when the features say) */
  int32_t pos[MAXB];
  int64_t off[MAXB], n[MAXB];
  int64_t rows;
} shard_data;

static const tcase CASES[] = {
  { "causal bf16 BHSD G=4", { .batch = 4, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 64, .q_dtype = FD_BF16,
      .kv_dtype = FD_BF16, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = FD_BHSD },
    { 48, 40, 56, 32 }, { { -1, -1, -1, -1 }, { -1, -1, -1, -1 }, { 30, 0, 25, 10 }, { -1, -1, -1, -1 } },
    { 0, 0, 0, 1 }, { -1, 20, -1, 100 } },
  { "full f32 BSHD MHA", { .batch = 3, .n_q_heads = 4, .n_kv_heads = 4, .head_dim = 32, .q_dtype = FD_F32,
      .kv_dtype = FD_F32, .out_dtype = FD_F32, .mask_mode = FD_FULL, .layout = FD_BSHD },
    { 24, 16, 20, 8 }, { { -1, -1, -1, -1 }, { -1, 0, -1, 0 }, { 0, 0, 0, 0 } }, { 0, 1, 0 }, { 0 } },
  { "mask f16 BHSD MQA", { .batch = 3, .n_q_heads = 4, .n_kv_heads = 1, .head_dim = 16, .q_dtype = FD_F16,
      .kv_dtype = FD_F16, .out_dtype = FD_F32, .mask_mode = FD_MASK, .layout = FD_BHSD },
    { 12, 28, 20, 16 }, { { -1, -1, -1, -1 }, { -1, -1, 0, -1 }, { -1, -1, -1, -1 } }, { 0 }, { 0 } },
  { "causal f32 BHSD ALiBi + sink logits", { .batch = 4, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 32,
      .q_dtype = FD_F32, .kv_dtype = FD_F32, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = FD_BHSD,
      .features = FD_ALIBI | FD_SINK_LOGITS },
    { 48, 40, 56, 32 }, { { -1, -1, -1, -1 }, { -1, -1, -1, -1 }, { 30, 0, 25, 10 }, { -1, -1, -1, -1 } },
    { 0, 1, 0, 1 }, { -1, 20, -1, 100 } },
  { "causal bf16 BSHD MQA ALiBi softcap 30", { .batch = 3, .n_q_heads = 4, .n_kv_heads = 1, .head_dim = 64,
      .q_dtype = FD_BF16, .kv_dtype = FD_BF16, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = FD_BSHD,
      .softcap = 30, .features = FD_ALIBI },
    { 24, 40, 16, 32 }, { { -1, -1, -1, -1 }, { 5, -1, 0, -1 }, { -1, -1, -1, -1 } }, { 1, 0, 0 }, { -1, 3, 60 } },
  { "full f16 BHSD sink logits softcap 50", { .batch = 3, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32,
      .q_dtype = FD_F16, .kv_dtype = FD_F16, .out_dtype = FD_F32, .mask_mode = FD_FULL, .layout = FD_BHSD,
      .softcap = 50, .features = FD_SINK_LOGITS },
    { 24, 16, 20, 8 }, { { -1, -1, -1, -1 }, { -1, 0, -1, 0 }, { 0, -1, 0, 0 } }, { 0, 1, 0 }, { 0 } },
  { "mask f32 BSHD sink logits", { .batch = 2, .n_q_heads = 8, .n_kv_heads = 4, .head_dim = 16, .q_dtype = FD_F32,
      .kv_dtype = FD_F32, .out_dtype = FD_F32, .mask_mode = FD_MASK, .layout = FD_BSHD, .features = FD_SINK_LOGITS },
    { 12, 28, 20, 16 }, { { -1, -1, -1, -1 }, { -1, 0, -1, -1 } }, { 0, 1 }, { 0 } },
  /* Sliding windows (at np 4; fewer ranks see a prefix of the same shards). Row 0: window 41..56, rank 1
     (32..51) cut by its start and ending before cur_pos, rank 2 holding it, the sinks on rank 0, rank 3
     past it. Row 1: the sinks split over ranks 0 (0..2) and 1 (3..4), rank 2 (5..32) cut by the window
     25..40. Row 2: reversed, the window 49..64 starting inside the rank that holds cur_pos (35..64),
     the sinks on the last rank. Row 3: cur_pos 2, inside the sinks. */
  { "causal bf16 BHSD window 16 sinks 4", { .batch = 4, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 64,
      .q_dtype = FD_BF16, .kv_dtype = FD_BF16, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = FD_BHSD,
      .window = 16, .sink_tokens = 4 },
    { 32, 20, 28, 16 }, { { -1, -1, -1, -1 }, { 3, 2, -1, -1 }, { 30, 0, 25, 10 }, { -1, -1, -1, -1 } },
    { 0, 0, 1, 0 }, { 56, 40, -1, 2 } },
  /* Window 2 with 2 sinks split over ranks 0 and 1 (row 1), ALiBi and sink logits. */
  { "causal f32 BSHD window 2 sinks 2 ALiBi + sink logits", { .batch = 3, .n_q_heads = 8, .n_kv_heads = 2,
      .head_dim = 32, .q_dtype = FD_F32, .kv_dtype = FD_F32, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL,
      .layout = FD_BSHD, .window = 2, .sink_tokens = 2, .features = FD_ALIBI | FD_SINK_LOGITS },
    { 12, 10, 14, 8 }, { { -1, -1, -1, -1 }, { 1, 1, -1, -1 }, { -1, -1, -1, -1 } }, { 0, 0, 1 }, { -1, 20, 11 } },
  /* A window wider than the whole sequence: every key up to cur_pos. */
  { "causal f16 BHSD window 1000 sinks 3 softcap 30", { .batch = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32,
      .q_dtype = FD_F16, .kv_dtype = FD_F16, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = FD_BHSD,
      .window = 1000, .sink_tokens = 3, .softcap = 30 },
    { 16, 12, 20, 8 }, { { -1, -1, -1, -1 }, { 2, -1, 0, -1 } }, { 0, 1 }, { -1, 25 } },
  /* As many sinks (9) as the window (9), over several shards; fp8 KV with per-row scales; ALiBi, sink
     logits, softcap 50. Row 1: ranks 0..4 hold 0..3, 4..6, 7..10, 11..: sinks and window join on rank 2. */
  { "causal fp8 BSHD MQA window 9 sinks 9 ALiBi sink logits softcap 50", { .batch = 3, .n_q_heads = 4,
      .n_kv_heads = 1, .head_dim = 64, .q_dtype = FD_BF16, .kv_dtype = FD_FP8_E4M3, .out_dtype = FD_F32,
      .mask_mode = FD_CAUSAL, .layout = FD_BSHD, .window = 9, .sink_tokens = 9, .softcap = 50,
      .features = FD_ALIBI | FD_SINK_LOGITS },
    { 6, 7, 20, 9 }, { { -1, -1, -1, -1 }, { 4, 3, 4, -1 }, { -1, -1, -1, -1 } }, { 0, 0, 1 }, { -1, 12, 3 } },
  /* fp8 KV, BHSD, window 7 without sinks: window starts inside shards that end before cur_pos. */
  { "causal fp8 BHSD window 7", { .batch = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32, .q_dtype = FD_F32,
      .kv_dtype = FD_FP8_E4M3, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = FD_BHSD, .window = 7 },
    { 10, 9, 12, 8 }, { { -1, -1, -1, -1 }, { 5, 4, 6, -1 } }, { 0, 1 }, { 12, 13 } },
};

/* The ALiBi slopes of Hq heads (the ALiBi paper's 2^(-8(h+1)/Hq)) and learned sink
   logits: -inf (no sink) for head 1, 12 (it dominates) for head 2, small otherwise. */
static void head_params(int Hq, float *slopes, float *logits) {
  for (int h = 0; h < Hq; h++) {
    slopes[h] = (float)exp2(-8.0 * (h + 1) / Hq);
    logits[h] = h == 1 ? -INFINITY : h == 2 ? 12.0f : (float)(h % 5) * 0.75f - 1.0f;
  }
}

/* Whether a KV dtype carries per-row scales (int8, fp8). */
static int quantized(fd_dtype kv) { return kv == FD_I8 || kv == FD_FP8_E4M3 || kv == FD_FP8_E5M2; }

/* Per-row scales of row b's global keys key0[b] .. key0[b] + n[b] - 1 (K when which is 0, V when 1) into
   slots 0 .. n[b] - 1 laid out as K without D: 0.25 .. 1.75 by key, so a shifted view that misses its
   scales gives wrong results. */
static void fill_scales(const fd_shape *s, const int64_t *key0, const int64_t *n, int which, float *scale) {
  ref_problem geo = { .B = s->batch, .Hkv = s->n_kv_heads, .D = 1, .S = s->kv_len, .layout = s->layout };
  for (int b = 0; b < s->batch; b++)
    for (int j = 0; j < s->n_kv_heads; j++)
      for (int64_t i = 0; i < n[b]; i++)
        scale[ref_kv_offset(&geo, b, j, i)] = 0.25f + (float)(((key0[b] + i) * 5 + j * 3 + b + which * 7) % 13) / 8.0f;
}

/* The shards of case t on np ranks (rows in rank order, or reversed). */
static void make_layout(const tcase *t, layout *L) {
  memset(L, 0, sizeof *L);
  for (int b = 0; b < t->shape.batch; b++) {
    int64_t next = 0;
    for (int i = 0; i < np; i++) {
      int r = t->reversed[b] ? np - 1 - i : i;
      int64_t n = t->count[b][r] < 0 ? t->cap[r] : t->count[b][r];
      L->off[r][b] = next;
      L->n[r][b] = n;
      next += n;
    }
    L->total[b] = next;
    int32_t p = t->pos[b] < 0 || t->pos[b] >= next ? (int32_t)next - 1 : t->pos[b];
    L->pos[b] = p < 0 ? 0 : p;
  }
}

/* Build rank r's shard of case t: plan (capacity cap[r], one thread, one split), inputs from the seed. */
static int shard_init(const tcase *t, const layout *L, int r, shard_data *d) {
  memset(d, 0, sizeof *d);
  d->shape = t->shape;
  d->shape.kv_len = t->cap[r];
  const fd_shape *s = &d->shape;
  d->rows = (int64_t)s->batch * s->n_q_heads;
  size_t kv = (size_t)s->batch * s->n_kv_heads * s->kv_len * s->head_dim * t_dtype_size(s->kv_dtype);
  d->q = calloc((size_t)d->rows * s->head_dim, 4);
  d->k = calloc(kv, 1);
  d->v = calloc(kv, 1);
  d->mask = calloc((size_t)d->rows * s->kv_len, 4);
  d->out = malloc(sizeof(float) * (size_t)d->rows * s->head_dim);
  d->lse = malloc(sizeof(float) * (size_t)d->rows);
  d->slopes = malloc(sizeof(float) * (size_t)s->n_q_heads);
  d->logits = malloc(sizeof(float) * (size_t)s->n_q_heads);
  head_params(s->n_q_heads, d->slopes, d->logits);
  for (int b = 0; b < s->batch; b++) { d->off[b] = L->off[r][b]; d->n[b] = L->n[r][b]; d->pos[b] = L->pos[b]; }
  for (size_t i = 0; i < kv / t_dtype_size(s->kv_dtype); i++) {   /* slots no key fills hold NaN */
    t_store(s->kv_dtype, d->k, i, NAN);
    t_store(s->kv_dtype, d->v, i, NAN);
  }
  fdd_fill_q(s, SEED, d->q, NULL);
  fdd_fill_kv(s, SEED, d->off, d->n, d->k, d->v, NULL, NULL);
  if (quantized(s->kv_dtype)) {                 /* scales of slots no key fills: NaN */
    size_t rows = kv / t_dtype_size(s->kv_dtype) / (size_t)s->head_dim;
    d->k_scale = malloc(sizeof(float) * rows);
    d->v_scale = malloc(sizeof(float) * rows);
    for (size_t i = 0; i < rows; i++) d->k_scale[i] = d->v_scale[i] = NAN;
    fill_scales(s, d->off, d->n, 0, d->k_scale);
    fill_scales(s, d->off, d->n, 1, d->v_scale);
  }
  fdd_fill_mask(s, SEED, d->off, d->n, d->mask);
  fd_plan_opts o = { .threads = 1, .splits = 1 };
  int rc = fd_plan_create_opts(ctx, s, &o, &d->plan);
  t_check(rc == 0, "%s: rank %d plan: %s", t->name, r, fd_errmsg(ctx));
  return rc;
}

/* Free a shard. */
static void shard_free(shard_data *d) {
  fd_plan_destroy(d->plan);
  free(d->q); free(d->k); free(d->v); free(d->mask); free(d->out); free(d->lse); free(d->slopes); free(d->logits);
  free(d->k_scale); free(d->v_scale);
}

/* The fd_args of a shard (cur_pos global). */
static fd_args shard_args(shard_data *d) {
  return (fd_args){ .q = d->q, .k = d->k, .v = d->v, .cur_pos = d->pos, .mask = d->mask, .out = d->out, .lse = d->lse,
                    .k_scale = d->k_scale, .v_scale = d->v_scale, .alibi_slopes = d->slopes, .sink_logits = d->logits };
}

/* The fdmpi_shard descriptor of a shard. */
static fdmpi_shard shard_desc(shard_data *d, int combine, fdmpi_stats *st, int trusted) {
  return (fdmpi_shard){ .shape = &d->shape, .ctx = ctx, .key_offset = d->off, .n_keys = d->n,
                        .combine = (fdmpi_combine)combine, .stats = st, .trusted = trusted };
}

/* Fill the outputs with the sentinel. */
static void poison(shard_data *d) {
  for (int64_t i = 0; i < d->rows * d->shape.head_dim; i++) d->out[i] = SENTINEL;
  for (int64_t i = 0; i < d->rows; i++) d->lse[i] = SENTINEL;
}

/* Whether the outputs still hold the sentinel everywhere. */
static int untouched(const shard_data *d) {
  int ok = 1;
  for (int64_t i = 0; i < d->rows * d->shape.head_dim; i++) ok &= d->out[i] == SENTINEL;
  for (int64_t i = 0; i < d->rows; i++) ok &= d->lse[i] == SENTINEL;
  return ok;
}

/* fd_run over the whole cache in one process (out f32): causal with the global cur_pos, else in mask mode
   with the mask given (rows shorter than the longest masked past their end). */
static void one_process(const fd_shape *g, const void *q, const void *k, const void *v, const float *ks,
                        const float *vs, const int32_t *pos, const float *mask, float *out) {
  fd_shape s = *g;
  if (s.mask_mode == FD_FULL) s.mask_mode = FD_MASK;
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, &s, &(fd_plan_opts){ .threads = 1 }, &plan);
  float slopes[MAXH], logits[MAXH];
  head_params(s.n_q_heads, slopes, logits);
  fd_args a = { .q = q, .k = k, .v = v, .cur_pos = pos, .mask = mask, .out = out, .k_scale = ks, .v_scale = vs };
  a.alibi_slopes = slopes;
  a.sink_logits = logits;
  if (!rc) rc = fd_run(plan, &a);
  t_check(rc == 0, "fd_run over the whole cache: %s", fd_errmsg(ctx));
  fd_plan_destroy(plan);
}

/* The causal mask over S keys of the window, the sinks and ALiBi: -inf past cur_pos and outside the
   window and the sinks (window: keys p - window + 1 .. p and 0 .. sink_tokens - 1), else slope x (key -
   cur_pos) rounded to float as the kernels round it, or 0 (the reference then runs in mask mode). */
static float *position_mask(const fd_shape *g, int64_t S, const int32_t *pos) {
  float slopes[MAXH], logits[MAXH], *m = malloc(sizeof(float) * (size_t)(g->batch * g->n_q_heads * S));
  head_params(g->n_q_heads, slopes, logits);
  for (int b = 0; b < g->batch; b++)
    for (int h = 0; h < g->n_q_heads; h++)
      for (int64_t i = 0; i < S; i++) {
        int seen = i <= pos[b] && (!g->window || i > pos[b] - g->window || i < g->sink_tokens);
        float bias = (g->features & FD_ALIBI) ? (float)((double)slopes[h] * (double)(i - pos[b])) : 0.0f;
        m[((int64_t)b * g->n_q_heads + h) * S + i] = seen ? bias : -INFINITY;
      }
  return m;
}

/* The learned sink logits in the reference's denominator, once per head: out x e^lse / (e^lse + e^sink),
   lse = log(e^lse + e^sink). */
static void ref_sinks(const fd_shape *g, double *rout, double *rlse) {
  float slopes[MAXH], logits[MAXH];
  head_params(g->n_q_heads, slopes, logits);
  for (int64_t r = 0; r < (int64_t)g->batch * g->n_q_heads; r++) {
    double l = rlse[r], s = logits[r % g->n_q_heads], top = l > s ? l : s;
    double all = top == -INFINITY ? -INFINITY : top + log(exp(l - top) + exp(s - top));
    for (int d = 0; d < g->head_dim; d++) rout[r * g->head_dim + d] *= all == -INFINITY ? 0.0 : exp(l - all);
    rlse[r] = all;
  }
}

/* The double-precision reference over every key of every row, the whole cache rebuilt from the seed
   (rows shorter than the longest are masked past their end); and fd_run over it in one process into
   single (when not NULL). */
static void reference(const tcase *t, const layout *L, double *rout, double *rlse, float *single) {
  fd_shape g = t->shape;
  int64_t S = 1, zero[MAXB] = { 0 };
  for (int b = 0; b < g.batch; b++) S = L->total[b] > S ? L->total[b] : S;
  g.kv_len = S;
  size_t nkv = (size_t)g.batch * g.n_kv_heads * S * g.head_dim, nq = (size_t)g.batch * g.n_q_heads * g.head_dim;
  float *qf = malloc(nq * 4), *kf = calloc(nkv, 4), *vf = calloc(nkv, 4);
  float *mask = calloc((size_t)g.batch * g.n_q_heads * S, 4);
  void *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4);
  fdd_fill_q(&g, SEED, q, qf);
  fdd_fill_kv(&g, SEED, zero, L->total, k, v, kf, vf);
  float *ks = NULL, *vs = NULL;
  if (quantized(g.kv_dtype)) {                  /* the reference's K and V: the stored codes times their scale */
    size_t rows = nkv / (size_t)g.head_dim;
    ks = calloc(rows, 4);
    vs = calloc(rows, 4);
    fill_scales(&g, zero, L->total, 0, ks);
    fill_scales(&g, zero, L->total, 1, vs);
    for (size_t i = 0; i < nkv; i++) { kf[i] *= ks[i / (size_t)g.head_dim]; vf[i] *= vs[i / (size_t)g.head_dim]; }
  }
  if (g.mask_mode == FD_MASK) fdd_fill_mask(&g, SEED, zero, L->total, mask);
  for (int b = 0; b < g.batch; b++)
    for (int h = 0; h < g.n_q_heads; h++)
      for (int64_t i = L->total[b]; i < S; i++) mask[((int64_t)b * g.n_q_heads + h) * S + i] = -INFINITY;
  ref_problem p = { g.batch, g.n_q_heads, g.n_kv_heads, g.head_dim, S, g.mask_mode == FD_CAUSAL ? 0 : 1, g.layout,
                    qf, kf, vf, L->pos, mask, 1.0 / sqrt((double)g.head_dim) };
  p.softcap = g.softcap;
  float *bias = (g.features & FD_ALIBI) || g.window ? position_mask(&g, S, L->pos) : NULL;
  if (bias) { p.mask = bias; p.mask_mode = 1; }
  ref_attention(&p, rout, rlse);
  if (g.features & FD_SINK_LOGITS) ref_sinks(&g, rout, rlse);
  if (single) one_process(&g, q, k, v, ks, vs, L->pos, mask, single);
  free(qf); free(kf); free(vf); free(mask); free(q); free(k); free(v); free(bias); free(ks); free(vs);
}

/* fd_run on every rank's shard in this process, then fd_merge_states in rank order: what the gather
   strategy computes, with the same split structure (rows without an attended key: out 0, lse -inf). */
static void emulate(const tcase *t, const layout *L, float *out, float *lse) {
  const float *outs[MAXR], *lses[MAXR];
  shard_data d[MAXR];
  for (int r = 0; r < np; r++) {
    shard_init(t, L, r, &d[r]);
    int32_t lp[MAXB];
    int64_t G = t->shape.n_q_heads, D = t->shape.head_dim, vis[MAXB];
    for (int b = 0; b < t->shape.batch; b++) {       /* keys attended: up to cur_pos (causal) or all held */
      int64_t v = t->shape.mask_mode == FD_CAUSAL ? L->pos[b] - d[r].off[b] + 1 : d[r].n[b];
      vis[b] = v < 0 ? 0 : v > d[r].n[b] ? d[r].n[b] : v;
      lp[b] = (int32_t)(vis[b] ? vis[b] - 1 : 0);
    }
    fd_args a = shard_args(&d[r]);
    a.cur_pos = lp;
    t_check(fd_run(d[r].plan, &a) == 0, "%s: emulated rank %d fd_run: %s", t->name, r, fd_errmsg(ctx));
    for (int b = 0; b < t->shape.batch; b++) {
      if (vis[b] > 0) continue;
      memset(d[r].out + b * G * D, 0, sizeof(float) * (size_t)(G * D));
      for (int h = 0; h < G; h++) d[r].lse[b * G + h] = -INFINITY;
    }
    outs[r] = d[r].out;
    lses[r] = d[r].lse;
  }
  fd_merge_states(np, outs, lses, d[0].rows, t->shape.head_dim, out, lse);
  for (int r = 0; r < np; r++) shard_free(&d[r]);
}

/* Rank 0 gathers every rank's out and lse and checks they are bit-identical to its own. */
static void check_same_everywhere(const char *name, const shard_data *d) {
  int64_t n = d->rows * (d->shape.head_dim + 1);
  float *mine = malloc(sizeof(float) * (size_t)n), *all = rank == 0 ? malloc(sizeof(float) * (size_t)(n * np)) : NULL;
  memcpy(mine, d->out, sizeof(float) * (size_t)(d->rows * d->shape.head_dim));
  memcpy(mine + d->rows * d->shape.head_dim, d->lse, sizeof(float) * (size_t)d->rows);
  MPI_Gather(mine, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    int same = 1;
    for (int r = 1; r < np; r++) same &= !memcmp(all, all + r * n, sizeof(float) * (size_t)n);
    t_check(same, "%s: the result differs between ranks", name);
  }
  free(mine);
  free(all);
}

/* The result on a receiving rank against the reference: within tolerance, no NaN, -inf rows alike. */
static double check_result(const tcase *t, const char *name, const shard_data *d, const double *rout,
                           const double *rlse) {
  kproblem kp = { .ref = { .B = t->shape.batch, .Hq = t->shape.n_q_heads, .D = t->shape.head_dim },
                  .q_dtype = t->shape.q_dtype, .kv_dtype = t->shape.kv_dtype, .out_dtype = FD_F32 };
  kp_error e = kp_errors(&kp, d->out, d->lse, rout, rlse);
  t_check(kp_error_ok(&kp, &e, 1), "%s: rank %d: out error %.3g, lse error %.3g, NaN %d, -inf rows differ %d", name,
          rank, e.out, e.lse, e.nan, e.lse_inf);
  double worst = 0;
  for (int64_t i = 0; i < d->rows * t->shape.head_dim; i++) worst = fmax(worst, fabs(d->out[i] - rout[i]));
  return worst;
}

/* One run of a case: a strategy, a root, validated or trusted, checked on every rank. */
static void run_one(const tcase *t, shard_data *d, int combine, int root, int trusted, const double *rout,
                    const double *rlse, const float *emu, const float *single) {
  char name[160];
  snprintf(name, sizeof name, "%s, np %d, %s, root %s%s", t->name, np, combine == FDMPI_COMBINE_REDUCE ? "reduce" : "gather",
           root == FDMPI_ALL ? "all" : root == 0 ? "0" : "last", trusted ? ", trusted" : "");
  poison(d);
  fdmpi_stats st = { 0 };
  fd_args a = shard_args(d);
  fdmpi_shard sh = shard_desc(d, combine, &st, trusted);
  int rc = fdmpi_run(d->plan, &a, &sh, MPI_COMM_WORLD, root);
  if (!t_check(rc == 0, "%s: rank %d: rc %d: %s", name, rank, rc, fdmpi_errmsg())) return;
  t_check(st.combine == combine && st.state_bytes == 4 * d->rows * (t->shape.head_dim + 1),
          "%s: stats say strategy %d, %lld bytes", name, st.combine, (long long)st.state_bytes);
  if (root != FDMPI_ALL && rank != root) t_check(untouched(d), "%s: rank %d is not the root but out changed", name, rank);
  if (root == FDMPI_ALL || rank == root) {
    double err = check_result(t, name, d, rout, rlse), one = 0;
    for (int64_t i = 0; single && rank == 0 && i < d->rows * t->shape.head_dim; i++) one = fmax(one, fabs(d->out[i] - single[i]));
    if (single && rank == 0) t_check(one <= 1e-6, "%s: %.3g from fd_run over the whole cache in one process", name, one);
    char vs_one[64] = "";
    if (single && rank == 0) snprintf(vs_one, sizeof vs_one, ", %.3g vs one process", one);
    if (rank == (root == FDMPI_ALL ? 0 : root))
      printf("info - %s: max abs error %.3g vs the double reference%s\n", name, err, vs_one);
    if (emu && rank == 0)
      t_check(!memcmp(emu, d->out, sizeof(float) * (size_t)(d->rows * t->shape.head_dim)) &&
              !memcmp(emu + d->rows * t->shape.head_dim, d->lse, sizeof(float) * (size_t)d->rows),
              "%s: not bit-identical to fd_run per shard + fd_merge_states in one process", name);
  }
  if (root == FDMPI_ALL) check_same_everywhere(name, d);
}

/* Every strategy and root of a case. */
static void run_case(const tcase *t) {
  layout L;
  make_layout(t, &L);
  shard_data d;
  if (shard_init(t, &L, rank, &d)) return;
  double *rout = malloc(sizeof(double) * (size_t)(d.rows * t->shape.head_dim)), *rlse = malloc(sizeof(double) * (size_t)d.rows);
  float *emu = NULL, *single = NULL;
  /* the combine corrects each rank's state, or a rank merges passes of its own (a window) */
  int per_rank = (t->shape.features & (FD_ALIBI | FD_SINK_LOGITS)) != 0 || t->shape.window;
  if (rank == 0 && !per_rank) {
    emu = malloc(sizeof(float) * (size_t)(d.rows * (t->shape.head_dim + 1)));
    single = malloc(sizeof(float) * (size_t)(d.rows * t->shape.head_dim));
    emulate(t, &L, emu, emu + d.rows * t->shape.head_dim);
  }
  if (rank == 0 && per_rank) single = malloc(sizeof(float) * (size_t)(d.rows * t->shape.head_dim));
  reference(t, &L, rout, rlse, single);
  int roots[] = { 0, np - 1, FDMPI_ALL };
  for (int c = FDMPI_COMBINE_REDUCE; c <= FDMPI_COMBINE_GATHER; c++)
    for (int i = 0; i < 4; i++)                  /* roots 0, last, all; then all, trusted */
      if (i != 1 || np > 1)
        run_one(t, &d, c, roots[i < 3 ? i : 2], i == 3, rout, rlse, c == FDMPI_COMBINE_GATHER ? emu : NULL, single);
  free(rout); free(rlse); free(emu); free(single);
  shard_free(&d);
}

/* A refusal seen on this rank: the code, a message with want, outputs untouched; rank 0 checks that
   every rank has the same message. */
static void expect_refusal(const char *name, int rc, int want_rc, const char *want, const shard_data *d) {
  char msg[512] = "", *all = rank == 0 ? calloc((size_t)np, sizeof msg) : NULL;
  snprintf(msg, sizeof msg, "%s", fdmpi_errmsg());
  t_check(rc == want_rc && strstr(msg, want) && untouched(d), "%s: rank %d: rc %d (want %d), message '%s' (want '%s'), "
          "out untouched %d", name, rank, rc, want_rc, msg, want, untouched(d));
  MPI_Gather(msg, sizeof msg, MPI_CHAR, all, sizeof msg, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    int same = 1;
    for (int r = 1; r < np; r++) same &= !strcmp(all, all + r * sizeof msg);
    t_check(same, "%s: ranks report different messages ('%s' on rank 0)", name, all);
    if (getenv("FD_VERBOSE")) printf("info - %s: %s\n", name, all);
  }
  free(all);
}

/* What a bad-input case changes on this rank before the call (d is a fresh copy of the good shard). */
typedef struct bad_case {
  const char *name;
  int min_np;                          /* run only with at least this many ranks */
  void (*edit)(shard_data *d, fd_shape *shape, int *root, MPI_Comm *comm, char *want);
  int code;                            /* the code every rank returns; 0: FD_EINVAL */
} bad_case;

/* The layout the bad cases edit (the first case's on np ranks). */
static layout bad_layout;

/* Rank 1 starts row 0 one key early: it overlaps rank 0. */
static void bad_overlap(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)s; (void)root; (void)c;
  if (rank == 1) d->off[0] -= 1;
  snprintf(want, 128, "shards overlap in row 0: rank 0 holds keys 0..47 and rank 1 holds keys 47..");
}
/* The last rank starts row 0 one key late (with one rank: at key 1): a gap. */
static void bad_gap(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)s; (void)root; (void)c;
  if (rank == np - 1) d->off[0] += 1;
  long long g = (long long)bad_layout.off[np - 1][0];
  snprintf(want, 128, "gap in row 0: keys %lld..%lld are on no rank", g, g);
}
/* The last rank's shape has half the query heads. */
static void bad_shape(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)root; (void)c;
  if (rank == np - 1) s->n_q_heads = 4;
  snprintf(want, 128, "shard.shape differs across ranks: rank 0 has b4.hq8.hkv2.d64.qbf16.kvbf16.of32.causal.bhsd, "
           "rank %d has b4.hq4.", np - 1);
}
/* MPI_COMM_NULL on every rank: refused without a collective. */
static void bad_comm(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)s; (void)root;
  *c = MPI_COMM_NULL;
  snprintf(want, 128, "fdmpi_run: comm is MPI_COMM_NULL");
}
/* A negative key count on the last rank only: every rank reports it. */
static void bad_count(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)s; (void)root; (void)c;
  if (rank == np - 1) d->n[1] = -1;
  snprintf(want, 128, "fdmpi_run: rank %d: shard.n_keys[1] is -1, outside 0..", np - 1);
}
/* A bf16 out dtype everywhere: refused locally on every rank, reported as rank 0's. */
static void bad_out_dtype(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)root; (void)c;
  s->out_dtype = FD_BF16;
  snprintf(want, 128, "fdmpi_run: rank 0: shard.shape.out_dtype is FD_BF16; fdmpi_run needs FD_F32");
}
/* Rank 1 disagrees on row 0's cur_pos. */
static void bad_cur_pos(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)s; (void)root; (void)c;
  if (rank == 1) d->pos[0] -= 1;
  snprintf(want, 128, "args.cur_pos[0] differs across ranks: rank 0 has %d, rank 1 has %d", d->pos[0] + (rank == 1),
           d->pos[0] - (rank != 1));
}
/* Row 0's cur_pos one past its last key on every rank. */
static void bad_reach(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)s; (void)root; (void)c;
  d->pos[0] += 1;
  snprintf(want, 128, "row 0: args.cur_pos[0] is %d but the shards end at key %d", d->pos[0], d->pos[0] - 1);
}
/* The last rank names another root. */
static void bad_root(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)s; (void)c;
  if (rank == np - 1) *root = 0;
  snprintf(want, 128, "root differs across ranks: rank 0 passed -1, rank %d passed 0", np - 1);
}
/* Rank 1 holds other queries. */
static void bad_q(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)s; (void)root; (void)c;
  if (rank == 1) ((uint16_t *)d->q)[5] ^= 1;
  snprintf(want, 128, "args.q differs across ranks (rank 0 and rank 1");
}
/* A root outside the communicator on every rank. */
static void bad_root_range(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)s; (void)c;
  *root = np;
  snprintf(want, 128, "fdmpi_run: rank 0: root is %d; it must be FDMPI_ALL or a rank 0..%d", np, np - 1);
}

/* A sliding window over a paged cache on every rank: refused, not served (flashdecode_mpi.h says why). */
static void bad_window(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)root; (void)c;
  s->window = 16;
  s->layout = FD_PAGED;
  s->page_size = 16;
  s->pool_pages = 64;
  snprintf(want, 128, "fdmpi_run: rank 0: shard.shape.layout is FD_PAGED with window 16; fdmpi_run attends");
}
/* FD_NEW_KV on every rank: refused (each rank's fd_run would attend the new key). */
static void bad_new_kv(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)root; (void)c;
  s->features |= FD_NEW_KV;
  snprintf(want, 128, "fdmpi_run: rank 0: shard.shape.features sets FD_NEW_KV; fdmpi_run does not serve it yet");
}
/* FD_BEAMS on every rank: refused. */
static void bad_beams(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)root; (void)c;
  s->features |= FD_BEAMS;
  snprintf(want, 128, "fdmpi_run: rank 0: shard.shape.features sets FD_BEAMS; fdmpi_run does not serve it yet");
}
/* FD_K_PER_CHANNEL on every rank: refused. */
static void bad_kpc(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)d; (void)root; (void)c;
  s->features |= FD_K_PER_CHANNEL;
  snprintf(want, 128, "fdmpi_run: rank 0: shard.shape.features sets FD_K_PER_CHANNEL; fdmpi_run does not serve it");
}
/* FD_SINK_LOGITS without args.sink_logits on the last rank. */
static void bad_sinks(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)root; (void)c;
  s->features |= FD_SINK_LOGITS;
  if (rank == np - 1) d->logits = NULL;
  snprintf(want, 128, "fdmpi_run: rank %d: args.sink_logits is NULL but the shape's features set FD_SINK_LOGITS", np - 1);
}
/* Rank 1 holds other sink logits. */
static void bad_sink_values(shard_data *d, fd_shape *s, int *root, MPI_Comm *c, char *want) {
  (void)root; (void)c;
  s->features |= FD_SINK_LOGITS;
  if (rank == 1) d->logits = d->slopes;
  snprintf(want, 128, "args.alibi_slopes or args.sink_logits differ across ranks (rank 0 and rank 1");
}

static const bad_case BAD[] = {
  { "a sliding window over a paged cache", 1, bad_window, FD_EUNSUPPORTED },
  { "FD_NEW_KV", 1, bad_new_kv, FD_EUNSUPPORTED }, { "FD_BEAMS", 1, bad_beams, FD_EUNSUPPORTED },
  { "FD_K_PER_CHANNEL", 1, bad_kpc, FD_EUNSUPPORTED }, { "sink logits NULL on one rank", 1, bad_sinks, 0 },
  { "sink logits differ across ranks", 2, bad_sink_values, 0 },
  { "overlapping shards", 2, bad_overlap }, { "a gap between shards", 1, bad_gap },
  { "shapes differ across ranks", 2, bad_shape }, { "MPI_COMM_NULL", 1, bad_comm },
  { "a bad key count on one rank", 1, bad_count }, { "out_dtype bf16", 1, bad_out_dtype },
  { "cur_pos differs across ranks", 2, bad_cur_pos }, { "shards end before cur_pos", 1, bad_reach },
  { "root differs across ranks", 2, bad_root }, { "q differs across ranks", 2, bad_q },
  { "root out of range", 1, bad_root_range },
};

/* Each bad input on the first case's shards, then one good call (nothing left stuck). */
static void refusals(void) {
  const tcase *t = &CASES[0];
  make_layout(t, &bad_layout);
  shard_data d;
  if (shard_init(t, &bad_layout, rank, &d)) return;
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    if (np < BAD[i].min_np) continue;
    shard_data e = d;                  /* offsets, counts, cur_pos and shape are copies; q is shared */
    uint16_t q5 = ((uint16_t *)d.q)[5];
    int root = FDMPI_ALL;
    MPI_Comm comm = MPI_COMM_WORLD;
    char want[128];
    BAD[i].edit(&e, &e.shape, &root, &comm, want);
    fd_plan *other = NULL;
    if (e.shape.n_q_heads != d.shape.n_q_heads)
      fd_plan_create_opts(ctx, &e.shape, &(fd_plan_opts){ .threads = 1, .splits = 1 }, &other);
    poison(&d);
    fd_args a = shard_args(&e);
    fdmpi_shard sh = shard_desc(&e, 0, NULL, 0);
    int rc = fdmpi_run(other ? other : e.plan, &a, &sh, comm, root);
    fd_plan_destroy(other);
    char name[96];
    snprintf(name, sizeof name, "refused, np %d: %s", np, BAD[i].name);
    expect_refusal(name, rc, BAD[i].code ? BAD[i].code : FD_EINVAL, want, &d);
    ((uint16_t *)d.q)[5] = q5;
    fd_args g = shard_args(&d);
    fdmpi_shard gs = shard_desc(&d, 0, NULL, 0);
    int grc = fdmpi_run(d.plan, &g, &gs, MPI_COMM_WORLD, FDMPI_ALL);
    t_check(grc == 0, "np %d: a good call after '%s': rc %d %s", np, BAD[i].name, grc, fdmpi_errmsg());
  }
  shard_free(&d);
}

/* Trusted mode, a bad key count on the last rank: it returns its own message, the receivers FDMPI_EREMOTE,
   no rank writes its outputs or hangs; then a good trusted call. */
static void trusted_failure(void) {
  const tcase *t = &CASES[0];
  layout L;
  make_layout(t, &L);
  shard_data d;
  if (shard_init(t, &L, rank, &d)) return;
  int roots[] = { FDMPI_ALL, FDMPI_ALL, 0 }, combines[] = { FDMPI_COMBINE_REDUCE, FDMPI_COMBINE_GATHER, FDMPI_COMBINE_GATHER };
  for (int i = 0; i < 3; i++) {
    int bad = rank == np - 1, receives = roots[i] == FDMPI_ALL || rank == roots[i];
    int64_t keep = d.n[1];
    if (bad) d.n[1] = -1;
    poison(&d);
    fd_args a = shard_args(&d);
    fdmpi_shard sh = shard_desc(&d, combines[i], NULL, 1);
    int rc = fdmpi_run(d.plan, &a, &sh, MPI_COMM_WORLD, roots[i]);
    d.n[1] = keep;
    int want = bad ? FD_EINVAL : receives ? FDMPI_EREMOTE : 0;
    const char *msg = bad ? "shard.n_keys[1] is -1" : !receives ? "" : combines[i] == FDMPI_COMBINE_GATHER ? "failed (shard.trusted"
                                                                                                           : "a rank failed (shard.trusted";
    t_check(rc == want && strstr(fdmpi_errmsg(), msg) && untouched(&d), "trusted, np %d, %s, root %s, a bad rank %d: "
            "rank %d rc %d (want %d), message '%s' (want '%s'), out untouched %d", np, combines[i] == 1 ? "reduce" : "gather",
            roots[i] == 0 ? "0" : "all", np - 1, rank, rc, want, fdmpi_errmsg(), msg, untouched(&d));
  }
  fd_args a = shard_args(&d);
  fdmpi_stats st = { 0 };
  fdmpi_shard sh = shard_desc(&d, 0, &st, 1);
  int rc = fdmpi_run(d.plan, &a, &sh, MPI_COMM_WORLD, FDMPI_ALL);
  int64_t others = (np - 1) * (4 * d.rows * (d.shape.head_dim + 1) + 4);
  int want = others <= FDMPI_GATHER_MAX_BYTES ? FDMPI_COMBINE_GATHER : FDMPI_COMBINE_REDUCE;
  t_check(rc == 0 && st.combine == want, "np %d: a good trusted call after the failures: rc %d %s, default strategy %d "
          "(want %d)", np, rc, fdmpi_errmsg(), st.combine, want);
  shard_free(&d);
}

/* Every cur_pos of a small case under windows of 1 to 30 keys with 0 to 7 sinks: rows 5 positions
   apart (rows 1 and 3 in reverse rank order), shards of 5, 3, 6 and 4 keys, so that the window's start,
   its end and the sinks' end fall on every key and every shard boundary; the result on every rank
   against the reference. */
static void window_sweep(void) {
  static const int WT[][2] = { { 1, 0 }, { 2, 2 }, { 3, 0 }, { 4, 4 }, { 4, 1 }, { 6, 2 }, { 7, 2 }, { 30, 3 } };
  tcase t = { "window sweep", { .batch = 4, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 16, .q_dtype = FD_F32,
              .kv_dtype = FD_F32, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = FD_BHSD },
              { 5, 3, 6, 4 }, { { -1, -1, -1, -1 }, { -1, -1, -1, -1 }, { -1, -1, -1, -1 }, { -1, -1, -1, -1 } },
              { 0, 1, 0, 1 }, { 0 } };
  int64_t total = 0;
  for (int r = 0; r < np; r++) total += t.cap[r];
  int runs = 0;
  double worst = 0;
  for (size_t w = 0; w < sizeof WT / sizeof WT[0]; w++)
    for (int64_t p = 0; p < total; p++) {
      t.shape.window = WT[w][0];
      t.shape.sink_tokens = WT[w][1];
      for (int b = 0; b < 4; b++) t.pos[b] = (int32_t)((p + 5 * b) % total);
      layout L;
      make_layout(&t, &L);
      shard_data d;
      if (shard_init(&t, &L, rank, &d)) return;
      double rout[4 * 4 * 16], rlse[4 * 4];
      reference(&t, &L, rout, rlse, NULL);
      fd_args a = shard_args(&d);
      fdmpi_shard sh = shard_desc(&d, 0, NULL, 0);
      char name[96];
      snprintf(name, sizeof name, "window sweep, np %d, window %d sinks %d, cur_pos %lld..", np, WT[w][0], WT[w][1],
               (long long)p);
      int rc = fdmpi_run(d.plan, &a, &sh, MPI_COMM_WORLD, FDMPI_ALL);
      if (t_check(rc == 0, "%s: rank %d: rc %d: %s", name, rank, rc, fdmpi_errmsg()))
        worst = fmax(worst, check_result(&t, name, &d, rout, rlse));
      runs++;
      shard_free(&d);
    }
  if (rank == 0) printf("info - window sweep, np %d: %d runs, max abs error %.3g vs the double reference\n", np, runs,
                        worst);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  if (np > MAXR) {
    if (rank == 0) printf("FAIL - test_mpi supports at most %d ranks, got %d\n", MAXR, np);
    MPI_Finalize();
    return 1;
  }
  int rc = fdmpi_run(NULL, NULL, NULL, MPI_COMM_NULL, 0);
  t_check(rc == FD_EINVAL && strstr(fdmpi_errmsg(), "comm is MPI_COMM_NULL"), "NULL comm before any context: rc %d '%s'",
          rc, fdmpi_errmsg());
  ctx = fd_create(&(fd_config){ .threads = 1 });
  if (!t_check(ctx != NULL, "fd_create: %s", fd_errmsg(NULL))) { MPI_Finalize(); return t_done(); }
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i]);
  window_sweep();
  refusals();
  trusted_failure();
  fd_destroy(ctx);
  printf("rank %d of %d: ", rank, np);
  rc = t_done();
  MPI_Finalize();
  return rc;
}
