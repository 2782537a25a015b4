/* The cost model's evaluation (runtime/model.h): the candidates the planner
   may take, scored by the linear model the tuned table carries. The candidate
   order and bounds are tuner/model.lua candidates', so both rank alike. */
#include "model.h"
#include "internal.h"
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

/* Rank the candidates: isa, chunk (powers of two from 32 within the model's
   limits and FD_MAX_CHUNK), tile (divisors of G up to 16 and the isa's
   max_tile), splits (1 to the bound; more than one only within the model's
   items_max split items per thread), threads (1 to the bound). */
int fd_model_rank(const fd_model *m, const fd_shape *s, int64_t len, int max_isa, int threads, fd_model_pick *out, int k) {
  if (!m || !m->present || k < 1) return 0;
  int G = s->n_q_heads / s->n_kv_heads, n = 0;
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
  for (int isa = 0; isa <= max_isa; isa++)
    for (int chunk = 32; chunk <= FD_MAX_CHUNK; chunk *= 2) {
      if (chunk < m->limit[FD_MODEL_CHUNK_MIN] || chunk > m->limit[FD_MODEL_CHUNK_MAX]) continue;
      for (int tile = 1; tile <= G && tile <= MODEL_MAX_TILE && tile <= fd_isa_table[isa].max_tile; tile++) {
        if (G % tile) continue;
        for (int sp = 1; sp <= smax; sp++)
          for (int th = 1; th <= tmax; th++) {
            if (sp > 1 && (double)rows * sp > m->limit[FD_MODEL_ITEMS_MAX] * th) continue;   /* beyond the evidence */
            fd_model_pick c = { chunk, tile, isa, sp, th, 0 };
            c.score = fd_model_score(m, s, len, &c);
            keep_best(out, &n, k, &c);
          }
      }
    }
  return n;
}
