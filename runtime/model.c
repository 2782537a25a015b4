/* The cost model's evaluation (runtime/model.h): the candidates the planner
   may take, scored by the linear model the tuned table carries. The candidate
   order and bounds are tuner/model.lua candidates', so both rank alike. */
#include "model.h"
#include "internal.h"
#include "cpu.h"
#include <math.h>
#include <string.h>

#define MODEL_MAX_TILE 16     /* the largest group tile a candidate takes (gen/space.lua MAX_TILE) */
#define MODEL_MAX_SPLITS 16   /* the most splits a candidate takes */

/* The model inputs (gen/facts.lua MODEL_VARS) of shape s at len keys for configuration c. */
static fd_model_vars vars_of(const fd_shape *s, int64_t len, const fd_model_pick *c) {
  fd_model_vars v = { .G = (double)(s->n_q_heads / s->n_kv_heads), .D = s->head_dim, .kvb = (double)fd_dtype_block_bytes[s->kv_dtype] / fd_dtype_block[s->kv_dtype],
                      .rows = (double)s->batch * s->n_kv_heads, .len = (double)len, .q = s->q_len > 1 ? s->q_len : 1,
                      .paged = s->layout == FD_PAGED, .chunk = c->chunk, .tile = c->tile, .isa = c->isa,
                      .splits = c->splits, .threads = c->threads };
  return v;
}

/* The score of c: the coefficients dotted with its features, in feature order. */
double fd_model_score(const fd_model *m, const fd_shape *s, int64_t len, const fd_model_pick *c) {
  fd_model_vars v = vars_of(s, len, c);
  double f[FD_MODEL_NFEATURES], sum = 0;
  fd_model_features(&v, f);
  for (int i = 0; i < FD_MODEL_NFEATURES; i++) sum += m->coef[i] * f[i];
  return sum;
}

/* Insert c into the sorted top-k list out[0..*n) (strictly better only: ties keep the earlier). */
static void keep_best(fd_model_pick *out, int *n, int k, const fd_model_pick *c) {
  int i = *n;
  while (i > 0 && c->score < out[i - 1].score) i--;
  if (i >= k) return;
  int last = *n < k ? *n : k - 1;
  memmove(out + i + 1, out + i, (size_t)(last - i) * sizeof *out);
  out[i] = *c;
  if (*n < k) (*n)++;
}

/* The margin a move from h to c must beat (tuner/model.lua margin): the
   sum of margin_kernel, margin_splits, margin_threads over the classes it
   moves (kernel: chunk, tile or isa); 0 for h itself. */
static double move_margin(const fd_model *m, const fd_model_pick *c, const fd_model_pick *h) {
  double g = 0;
  if (c->chunk != h->chunk || c->tile != h->tile || c->isa != h->isa) g += m->limit[FD_MODEL_MARGIN_KERNEL];
  if (c->splits != h->splits) g += m->limit[FD_MODEL_MARGIN_SPLITS];
  if (c->threads != h->threads) g += m->limit[FD_MODEL_MARGIN_THREADS];
  return g;
}

/* The candidates' bounds for s at len: the most splits and threads. */
static void candidate_bounds(const fd_model *m, const fd_shape *s, int64_t len, int threads, int64_t *smax_out, int *tmax_out) {
  int64_t rows = (int64_t)s->batch * s->n_kv_heads;
  int64_t smax = MODEL_MAX_SPLITS;
  if (m->limit[FD_MODEL_SPLITS_MAX] < smax) smax = (int64_t)m->limit[FD_MODEL_SPLITS_MAX];
  if (len < smax) smax = len;
  int64_t by_items = rows >= FD_MAX_SPLIT_ITEMS ? 1 : FD_MAX_SPLIT_ITEMS / rows;
  if (by_items < smax) smax = by_items;
  if (smax < 1) smax = 1;
  int tmax = threads < m->limit[FD_MODEL_THREADS_MAX] ? threads : (int)m->limit[FD_MODEL_THREADS_MAX];
  if (tmax > FD_MAX_THREADS) tmax = FD_MAX_THREADS;
  if (tmax < 1) tmax = 1;
  *smax_out = smax;
  *tmax_out = tmax;
}

/* Visit every candidate in tuner/model.lua candidates' order: isa, chunk
   (powers of two from 32 within the model's limits and FD_MAX_CHUNK), tile
   (divisors of G up to 16 and the isa's max_tile), splits (1 to the bound;
   more than one only within the model's items_max split items per thread),
   threads (1 to the bound); visit(c, arg) gets each scored. */
static void each_candidate(const fd_model *m, const fd_shape *s, int64_t len, int max_isa, int threads,
                           void (*visit)(const fd_model_pick *, void *), void *arg) {
  int G = s->n_q_heads / s->n_kv_heads;
  int64_t rows = (int64_t)s->batch * s->n_kv_heads, smax;
  int tmax;
  candidate_bounds(m, s, len, threads, &smax, &tmax);
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) {
    if (!fd_isa_within(isa, max_isa)) continue;
    for (int chunk = 32; chunk <= FD_MAX_CHUNK; chunk *= 2) {
      if (chunk < m->limit[FD_MODEL_CHUNK_MIN] || chunk > m->limit[FD_MODEL_CHUNK_MAX]) continue;
      for (int tile = 1; tile <= G && tile <= MODEL_MAX_TILE && tile <= fd_isa_table[isa].max_tile; tile++) {
        if (G % tile) continue;
        for (int sp = 1; sp <= smax; sp++)
          for (int th = 1; th <= tmax; th++) {
            if (sp > 1 && (double)rows * sp > m->limit[FD_MODEL_ITEMS_MAX] * th) continue;   /* beyond the evidence */
            fd_model_pick c = { chunk, tile, isa, sp, th, 0 };
            c.score = fd_model_score(m, s, len, &c);
            visit(&c, arg);
          }
      }
    }
  }
}

/* fd_model_rank's state: the top-k list. */
typedef struct { fd_model_pick *out; int n, k; } rank_state;

/* Keep c in the top-k list. */
static void rank_visit(const fd_model_pick *c, void *arg) {
  rank_state *r = arg;
  keep_best(r->out, &r->n, r->k, c);
}

/* Rank the candidates by score (each_candidate's order breaks ties). */
int fd_model_rank(const fd_model *m, const fd_shape *s, int64_t len, int max_isa, int threads, fd_model_pick *out, int k) {
  if (!m || !m->present || k < 1) return 0;
  rank_state r = { out, 0, k };
  each_candidate(m, s, len, max_isa, threads, rank_visit, &r);
  return r.n;
}

/* fd_model_decide's state: the heuristic's configuration, the best so far and its penalized score. */
typedef struct { const fd_model *m; const fd_model_pick *h; int64_t len; fd_model_pick best; double bp; int any; } decide_state;

/* Keep c when its score plus its margin from h is the lowest so far (within
   splits_up x h's splits up to splits_up_len keys, h's splits beyond). */
static void decide_visit(const fd_model_pick *c, void *arg) {
  decide_state *d = arg;
  double up = d->len <= d->m->limit[FD_MODEL_SPLITS_UP_LEN] ? d->m->limit[FD_MODEL_SPLITS_UP] : 1;
  if (c->splits > d->h->splits * up) return;
  double p = c->score + move_margin(d->m, c, d->h);
  if (!d->any || p < d->bp) { d->best = *c; d->bp = p; d->any = 1; }
}

/* Whether s at len lies inside the model's measured range (tuner/model.lua covers). */
static int covers(const fd_model *m, const fd_shape *s, int64_t len) {
  fd_model_pick any = { 1, 1, 0, 1, 1, 0 };
  fd_model_vars v = vars_of(s, len, &any);
  const double *L = m->limit;
  if (!(((int64_t)L[FD_MODEL_KV_DTYPES] >> s->kv_dtype) & 1)) return 0;   /* a KV dtype the fit never measured */
  return len <= L[FD_MODEL_LEN_MAX] && v.G >= L[FD_MODEL_G_MIN] && v.G <= L[FD_MODEL_G_MAX] && v.D >= L[FD_MODEL_D_MIN] &&
         v.D <= L[FD_MODEL_D_MAX] && v.kvb >= L[FD_MODEL_KVB_MIN] && v.kvb <= L[FD_MODEL_KVB_MAX] &&
         v.rows >= L[FD_MODEL_ROWS_MIN] && v.rows <= L[FD_MODEL_ROWS_MAX] && v.q >= L[FD_MODEL_Q_MIN] && v.q <= L[FD_MODEL_Q_MAX];
}

/* The planner's decision (tuner/model.lua decide). */
int fd_model_decide(const fd_model *m, const fd_shape *s, int64_t len, int max_isa, int threads, const fd_model_pick *h,
                    fd_model_pick *out) {
  if (!m || !m->present || !covers(m, s, len)) return 0;   /* beyond the measured shapes and lengths: h */
  decide_state d = { m, h, len, { 0 }, 0, 0 };
  each_candidate(m, s, len, max_isa, threads, decide_visit, &d);
  if (!d.any || !(d.bp < fd_model_score(m, s, len, h) - FD_MODEL_MARGIN)) return 0;
  *out = d.best;
  return 1;
}
